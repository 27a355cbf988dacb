"""Connection storm: many clients connecting at once, as kafka-go does (one connection per partition reader).

``python -m bench.storm [--clients 200] [--rounds 3] [--partitions 50] [--upstream HOST:PORT]``

One run, one rig broker (or ``--upstream``), one Sluice subprocess in front of it (``python -m proxy run``, with
its access log: Sluice's own latency of each request). A storm is ``--clients`` connections opened in the same
instant from one event loop (uvloop, raw sockets); each then sends, one after the other, ApiVersions v3, Metadata
v12 (the storm's topic) and ListOffsets v7 (its partition, latest), as a partition reader starting up does. Every
figure is the time from the storm's start to that request's answer, per client, as percentiles over the clients
of all rounds:

- ``cold``: connect and the three requests, direct to the broker's listener and through Sluice's listener for
  the broker (node 1), in the same run, ABBA order per round (direct, Sluice, Sluice, direct) so drift cancels;
- ``warm``: the same requests on connections opened beforehand (through Sluice: once Sluice's upstream
  connections are all up, ``sluice_connections_open{side="upstream"}``), so no connection is set up during the
  storm;
- what the upstream connection set-up can account for in a cold storm through Sluice (``upstream_setup``): the
  wait for it is bounded by the latency Sluice's access log gives each connection's first request (request read
  -> response written: the wait for the upstream connect, the broker's answer, Sluice's work), next to the
  client's time to that answer; and Sluice's CPU per client (rig/cpu.py), cold against warm split into setting
  the connections up and serving the requests;
- the kernel's counters (/proc/net/netstat, whole machine) across each storm: ``ListenOverflows`` /
  ``ListenDrops`` (a listen backlog full: the SYN or the handshake's last ACK dropped, and the client's or
  server's retransmission 1 s later) and ``TCPSynRetrans``.

Prints one JSON line per storm and per (mode, path); the last line is ``{"summary": "storm", "clients": ...,
"unanswered": ..., "cold_direct_api_versions_ms": {...}, "cold_sluice_api_versions_ms": {...}, ...,
"upstream_wait_bound_ms": {...}, "upstream_wait_share_bound": {...}, "sluice_cpu_ms_per_client": {...},
"connection_setup_cpu_share": ..., "sluice_listen_overflows": ..., "goals", "met", "every_request_answered",
"correct"}`` (bench/support/verdict.py). The check: every client of every storm got an answer to each of its
requests, in order (by correlation id; ``unanswered`` counts those that did not); exit 1 otherwise. Goal: no SYN
dropped by Sluice's accept queue (``sluice_listen_overflows`` = 0; ``--check`` exits 1 when it is missed).
``--smoke``: 20 clients, 1 round, 4 partitions.
Sized for a 2-core machine: under a minute with the defaults (plus the broker's start).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import tempfile
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import uvloop

from bench.support.verdict import add_options, at_most, emit, exit_status, summary
from proxy.wire.messages import encode_request, request_codec
from proxy.wire.model import Message
from rig.kafka import KafkaBroker
from rig.sluice_process import SluiceProcess
from rig.topics import create_topic

REQUESTS = ("api_versions", "metadata", "list_offsets")
PERCENTILES = (50, 90, 99, 100)
NETSTAT = ("ListenOverflows", "ListenDrops", "TCPSynRetrans")


# ------------------------------------------------------------------------------------------------ requests


def _frame(api_key: int, version: int, correlation_id: int, body: Message) -> bytes:
    header = Message(request_api_key=api_key, request_api_version=version, correlation_id=correlation_id,
                     client_id="bench-storm")
    frame = encode_request(header, body)
    return len(frame).to_bytes(4, "big") + frame


def frames(topic: str, partition: int) -> list[bytes]:
    """ApiVersions v3, Metadata v12 of ``topic``, ListOffsets v7 of ``partition`` (latest), correlation ids 1-3."""
    api = request_codec(18, 3).default().replace(client_software_name="bench-storm",
                                                 client_software_version="1")
    meta = request_codec(3, 12).default().replace(topics=[Message(topic_id=bytes(16), name=topic)],
                                                  allow_auto_topic_creation=False,
                                                  include_topic_authorized_operations=False)
    offsets = request_codec(2, 7).default().replace(
        replica_id=-1, isolation_level=0,
        topics=[Message(name=topic, partitions=[Message(partition_index=partition, current_leader_epoch=-1,
                                                        timestamp=-1)])])
    return [_frame(18, 3, 1, api), _frame(3, 12, 2, meta), _frame(2, 7, 3, offsets)]


# ------------------------------------------------------------------------------------------------ a storm


def percentiles(values: Sequence[float]) -> dict[str, float]:
    """p50/p90/p99/max (nearest rank) of ``values``, in ms, rounded to 0.01."""
    ordered = sorted(values)
    if not ordered:
        return {}
    out = {}
    for p in PERCENTILES:
        rank = max(1, -(-p * len(ordered) // 100))  # ceil(p/100 * n), nearest-rank definition
        out["max" if p == 100 else f"p{p}"] = round(ordered[rank - 1], 2)
    return out


def netstat() -> dict[str, int]:
    """TcpExt counters of the whole machine (the storm is on loopback; other traffic here is negligible)."""
    lines = [ln.split() for ln in Path("/proc/net/netstat").read_text().splitlines() if ln.startswith("TcpExt:")]
    names, values = lines[0][1:], lines[1][1:]
    table = dict(zip(names, values, strict=True))
    return {k: int(table.get(k, 0)) for k in NETSTAT}


async def _read_frame(reader: asyncio.StreamReader) -> bytes:
    size = int.from_bytes(await reader.readexactly(4), "big")
    return await reader.readexactly(size)


class Client:
    """One storm client: its connection and the times (s, from the storm's start) of each step."""

    def __init__(self, port: int, requests: list[bytes]) -> None:
        self.port, self.requests = port, requests
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None
        self.times: dict[str, float] = {}

    async def connect(self) -> None:
        self.reader, self.writer = await asyncio.open_connection("127.0.0.1", self.port)

    async def run(self, start: float, connect: bool) -> None:
        """Each request in turn, timed; stops at the first answer that is not the next request's (by correlation
        id) or a connection that fails: :attr:`answered` says how far it got."""
        try:
            if connect:
                await self.connect()
                self.times["connect"] = time.perf_counter() - start
            assert self.reader is not None and self.writer is not None
            for name, frame in zip(REQUESTS, self.requests, strict=True):
                self.writer.write(frame)
                answer = await _read_frame(self.reader)
                if int.from_bytes(answer[:4], "big") != REQUESTS.index(name) + 1:
                    return
                self.times[name] = time.perf_counter() - start
        except (OSError, asyncio.IncompleteReadError):
            return

    @property
    def answered(self) -> bool:
        """Every request answered, in order."""
        return all(name in self.times for name in REQUESTS)

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            try:
                await self.writer.wait_closed()
            except OSError:
                pass


@dataclass
class Storm:
    """What one storm measured: per client the times (ms from the storm's start) of its steps; the kernel's
    counters across it; Sluice's CPU seconds during it, and (warm storms) while the connections were opened; the
    clients that did not get every answer, in order."""

    times: list[dict[str, float]]
    kernel: dict[str, int]
    cpu_s: float = 0.0
    connect_cpu_s: float = 0.0
    unanswered: int = 0


async def storm(port: int, topic: str, partitions: int, clients: int, warm: bool,
                sluice: SluiceProcess | None) -> Storm:
    group = [Client(port, frames(topic, i % partitions)) for i in range(clients)]
    cpu = sluice.cpu_seconds if sluice is not None else (lambda: 0.0)
    try:
        connect_cpu = 0.0
        if warm:
            cpu0 = cpu()
            await asyncio.gather(*(c.connect() for c in group))
            if sluice is not None:
                await _until(lambda: sluice.metric("sluice_connections_open", {"side": "upstream"}) >= clients,
                             "Sluice's upstream connections up")
            connect_cpu = cpu() - cpu0  # includes the few /metrics scrapes of the poll above
        before, cpu0 = netstat(), cpu()
        start = time.perf_counter()
        await asyncio.gather(*(c.run(start, connect=not warm) for c in group))
        after, cpu1 = netstat(), cpu()
    finally:
        await asyncio.gather(*(c.close() for c in group))
    if sluice is not None:
        await _until(lambda: sluice.metric("sluice_connections_open", {"side": "client"}) == 0,
                     "Sluice's client connections closed")
    times = [{k: v * 1000.0 for k, v in c.times.items()} for c in group]
    return Storm(times, {k: after[k] - before[k] for k in NETSTAT}, cpu1 - cpu0, connect_cpu,
                 sum(not c.answered for c in group))


async def _until(condition: Any, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not await asyncio.to_thread(condition):
        if time.monotonic() > deadline:
            raise SystemExit(f"bench.storm: {what}: not within {timeout:.0f} s")
        await asyncio.sleep(0.05)  # bounded poll of a real condition


# ------------------------------------------------------------------------------------------------ the run


def summarise(per_path: dict[str, list[dict[str, float]]]) -> dict[str, dict[str, float]]:
    out = {}
    for path, times in per_path.items():
        for step in ("connect", *REQUESTS):
            values = [t[step] for t in times if step in t]
            if values:
                out[f"{path}_{step}_ms"] = percentiles(values)
    return out


class AccessLog:
    """Sluice's access log, read as it grows: the latency Sluice itself saw for each request (request read ->
    response written), which for a connection's first request includes waiting for its upstream connect."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0

    def take(self, api: str, count: int) -> list[float]:
        """The latencies (ms) of the next ``count`` ``api`` requests logged (waits, bounded, for the lines)."""
        got: list[float] = []
        deadline = time.monotonic() + 30
        while len(got) < count:
            with open(self.path, "rb") as fh:
                fh.seek(self.offset)
                data = fh.read()
            end = data.rfind(b"\n") + 1
            self.offset += end
            for line in data[:end].splitlines():
                event = json.loads(line)
                if event.get("api") == api:
                    got.append(float(event["latency_ms"]))
            if len(got) < count:
                if time.monotonic() > deadline:
                    raise SystemExit(f"bench.storm: {len(got)} of {count} {api} lines in the access log")
                time.sleep(0.05)  # bounded poll: the access log is written by a background sink
        return got


def upstream_setup(cold_clients: list[dict[str, float]], cold_in_sluice: list[float],
                   cpu_ms_per_client: dict[str, float]) -> dict[str, Any]:
    """How much of a cold storm through Sluice the upstream connection set-up can account for.

    - Waiting for it: a connection's first request waits in Sluice until the upstream connection Sluice started at
      accept is up, and the access log's latency of that request (request read -> response written) includes the
      wait, plus the broker's answer and Sluice's own work. So per percentile it bounds the wait from above:
      ``upstream_wait_bound_ms``, and ``upstream_wait_share_bound`` = that / the client's time to its ApiVersions
      answer (storm start -> answer), the most a pool of ready upstream connections could have saved.
    - Working for it: Sluice's CPU per client, cold (accept, upstream connect, three requests) against warm
      (``connect``: accept and upstream connect while the connections were opened before the storm;
      ``requests``: the three requests), and the set-up's share of the cold CPU."""
    wait = percentiles(cold_in_sluice)
    client = percentiles([t["api_versions"] for t in cold_clients])
    setup_cpu = cpu_ms_per_client["warm_connect"]
    return {
        "upstream_wait_bound_ms": wait,
        "upstream_wait_share_bound": {k: round(wait[k] / client[k], 3) for k in wait if client.get(k)},
        "sluice_cpu_ms_per_client": cpu_ms_per_client,
        "connection_setup_cpu_share": round(setup_cpu / (setup_cpu + cpu_ms_per_client["warm_requests"]), 3)
        if setup_cpu + cpu_ms_per_client["warm_requests"] > 0 else None,
    }


async def run(direct_port: int, sluice: SluiceProcess, access_log: AccessLog, topic: str, partitions: int,
              clients: int, rounds: int) -> dict[str, Any]:
    ports = {"direct": direct_port, "sluice": sluice.broker_port()}
    results: dict[str, dict[str, list[dict[str, float]]]] = {}
    in_sluice: dict[str, list[float]] = {}  # ApiVersions latency as Sluice saw it, per mode
    kernel: dict[str, dict[str, dict[str, int]]] = {}
    cpu = {"cold": 0.0, "warm_connect": 0.0, "warm_requests": 0.0}
    # one unmeasured storm per path: the broker's and Sluice's first connections (JIT, caches, listeners)
    unanswered = 0
    for path in ports:
        warm_up = await storm(ports[path], topic, partitions, clients, False, sluice if path == "sluice" else None)
        unanswered += warm_up.unanswered
        if path == "sluice":
            access_log.take("ApiVersions", clients - warm_up.unanswered)
    for mode in ("cold", "warm"):
        results[mode] = {"direct": [], "sluice": []}
        in_sluice[mode] = []
        kernel[mode] = {p: dict.fromkeys(NETSTAT, 0) for p in ports}
        for r in range(rounds):
            for path in ("direct", "sluice", "sluice", "direct"):
                one = await storm(ports[path], topic, partitions, clients, mode == "warm",
                                  sluice if path == "sluice" else None)
                results[mode][path] += one.times
                unanswered += one.unanswered
                for k, v in one.kernel.items():
                    kernel[mode][path][k] += v
                line: dict[str, Any] = {"bench": "storm", "mode": mode, "path": path, "round": r + 1,
                                        "clients": clients, **summarise({"t": one.times}), **one.kernel}
                if path == "sluice":
                    seen = access_log.take("ApiVersions", clients - one.unanswered)
                    in_sluice[mode] += seen
                    line["t_api_versions_in_sluice_ms"] = percentiles(seen)
                    line["sluice_cpu_ms_per_client"] = round(1000.0 * one.cpu_s / clients, 3)
                    if mode == "cold":
                        cpu["cold"] += one.cpu_s
                    else:
                        cpu["warm_requests"] += one.cpu_s
                        cpu["warm_connect"] += one.connect_cpu_s
                        line["sluice_connect_cpu_ms_per_client"] = round(1000.0 * one.connect_cpu_s / clients, 3)
                emit(line)
        for path in ports:
            emit({"bench": "storm", "mode": mode, "path": path, "clients": clients, "storms": 2 * rounds,
                  **summarise({"t": results[mode][path]}), **kernel[mode][path]})
    summary: dict[str, Any] = {"clients": clients, "storms_per_path": 2 * rounds,
                               "unanswered": unanswered}  # clients of every storm without every answer, in order
    for mode in ("cold", "warm"):
        for key, value in summarise(results[mode]).items():
            summary[f"{mode}_{key}"] = value
        summary[f"{mode}_sluice_api_versions_in_sluice_ms"] = percentiles(in_sluice[mode])
    per_client = {k: round(1000.0 * v / (2 * rounds * clients), 3) for k, v in cpu.items()}
    summary.update(upstream_setup(results["cold"]["sluice"], in_sluice["cold"], per_client))
    summary["listen_overflows"] = {f"{m}_{p}": kernel[m][p]["ListenOverflows"] for m in kernel for p in ports}
    summary["sluice_listen_overflows"] = sum(kernel[m]["sluice"]["ListenOverflows"] for m in kernel)
    return summary


def raise_nofile(wanted: int) -> None:
    """Enough descriptors for the storm (clients here, their connections in Sluice), bounded by the hard limit."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = min(hard, max(soft, wanted)) if hard != resource.RLIM_INFINITY else max(soft, wanted)
    if target > soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.storm", description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=200, help="connections per storm (default 200)")
    parser.add_argument("--rounds", type=int, default=3, help="ABBA rounds per mode (default 3: 6 storms per path)")
    parser.add_argument("--partitions", type=int, default=50, help="partitions of the storm's topic (default 50)")
    parser.add_argument("--upstream", help="an existing broker (host:port, node 1) instead of a rig broker")
    add_options(parser, "20 clients, 1 round, 4 partitions")
    args = parser.parse_args(argv)
    if args.smoke:
        args.clients, args.rounds, args.partitions = 20, 1, 4
    if args.clients < 1 or args.rounds < 1 or args.partitions < 1:
        parser.error("--clients, --rounds and --partitions must be positive")
    raise_nofile(4 * args.clients + 256)
    broker = None if args.upstream else KafkaBroker().start()
    upstream = args.upstream or (broker.bootstrap if broker else "")
    log_dir = Path(tempfile.mkdtemp(prefix="bench-storm-"))
    try:
        topic = f"storm-{uuid.uuid4().hex[:8]}"
        create_topic(upstream, topic, partitions=args.partitions)
        access = log_dir / "access.log"
        with SluiceProcess(upstream, access_log=access) as sluice:
            figures = uvloop.run(run(int(upstream.rpartition(":")[2]), sluice, AccessLog(access), topic,
                                     args.partitions, args.clients, args.rounds))
            figures["sluice_listen_backlog"] = _listen_backlog(sluice)
    finally:
        if broker is not None:
            broker.close()
        shutil.rmtree(log_dir, ignore_errors=True)
    # the goal: a storm of this size fits Sluice's accept queue (a SYN dropped costs its client a 1 s retry)
    line = summary("storm", figures, {"sluice_listen_overflows": at_most(0)},
                   checks={"every_request_answered": figures["unanswered"] == 0})
    emit(line)
    return exit_status(line, args.check)


def _listen_backlog(sluice: SluiceProcess) -> dict[str, int]:
    """The accept queue size (ss's Send-Q of a listening socket) of Sluice's listeners, for the report."""
    import subprocess

    out: dict[str, int] = {}
    try:
        text = subprocess.run(["ss", "-ltnH"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return out
    for line in text.splitlines():
        cols = line.split()
        if len(cols) >= 4:
            port = int(cols[3].rpartition(":")[2])
            if port == sluice.bootstrap_port:
                out["bootstrap"] = int(cols[2])
            elif port == sluice.broker_port():
                out["broker"] = int(cols[2])
    return out


if __name__ == "__main__":
    raise SystemExit(main())
