"""Footprint benchmark: what one Sluice costs a machine that runs one beside every application (a sidecar fleet).

``python -m bench.footprint [--runs 5] [--mib 64] [--connections 1000] [--compare REV] [--smoke] [--check]``

One rig broker (started and stopped here); Sluice as a user starts it (``python -m proxy run``, no configuration
but the upstream and its ports, access log off), with its bytecode compiled once beforehand as an installed
package has it (an unmeasured first start writes it into the cache, ``PYTHONPYCACHEPREFIX``). Measured:

- ``ready_s``: from the exec of ``python -m proxy run`` to ready (/readyz 200 and the bootstrap port accepting),
  polled every 5 ms; the median of ``--runs`` starts (``ready_s_max``: the slowest); ``ready_cpu_s``: the CPU
  seconds (user + system) Sluice spent until then, the median: about what ``ready_s`` is on an idle core, which
  the wall clock of a shared machine is not;
- ``startup_peak_mib``: the most memory resident at any moment of a start (the kernel's VmHWM), the largest of the
  runs: a pod's memory limit must hold the peak, not the average;
- ``idle_rss_mib``: resident (VmRSS) after ``IDLE_S`` seconds ready with no client, the largest of the runs;
- ``passthrough_rss_mib``: the most resident (VmRSS sampled every 20 ms, and VmHWM) while a confluent-kafka consumer
  reads ``--mib`` MiB of 1 KiB records through Sluice; ``all_policies_rss_mib``: the same with every policy on
  (bench.passthrough's ``ALL_POLICIES``, the access log written to a file);
- ``per_connection_kib``: resident memory per client connection, over ``--connections`` connections that each
  sent an ApiVersions request (so Sluice holds its upstream connection too) and then stay idle.

One JSON line per measurement; the last line is ``{"summary": "footprint", ...}`` with each figure, ``"goals"``
(start-up peak <= 64 MiB, idle <= 40 MiB, ready <= 0.5 s) and ``"met"`` beside them, and the check of what was
measured, from observed data (bench/support/verdict.py): every start became ready, every record stored was consumed
through Sluice once, in order, offset by offset to the log's end (``lost``, ``duplicated``, ``out_of_order``), every
connection got its ApiVersions answer. Exit code 1 when
the check fails; with ``--check`` also when a goal is not met. ``--smoke``: 2 starts, 8 MiB, 200 connections.
``--compare REV``: git revision REV's ``proxy`` (extracted, bench/support/revision.py) is started too, in turn with
this tree's (REV first, so neither side always starts on a cache the other warmed); its start-up lines say
``"side": "rev"`` and the summary adds ``"compare"``: REV's start-up figures beside this tree's.
Timing moves with the machine's load: figures from a shared machine are noisy (the memory ones much less).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import struct
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, Producer, TopicPartition

from bench.support import verdict
from bench.support.revision import extract_revision, short_revision
from bench.support.verdict import at_most
from rig.kafka import KafkaBroker, cache_root, end_offsets
from rig.sluice_process import SluiceProcess
from rig.topics import create_topic

from .passthrough import ALL_POLICIES

#: the goals a sidecar per application needs (a 128 MiB pod limit with room for load; a fleet's idle cost)
GOALS = {"startup_peak_mib": 64.0, "idle_rss_mib": 40.0, "ready_s": 0.5}
IDLE_S = 3.0
RECORD_SIZE = 1024
PARTITIONS = 3
SAMPLE_S = 0.02


def emit(line: Mapping[str, Any]) -> None:
    print(json.dumps(line), flush=True)


def mib(kib: int) -> float:
    return round(kib / 1024, 1)


#: every Sluice here reads its bytecode from a cache outside the tree, as an installed package has its .pyc files
BYTECODE = {"PYTHONPYCACHEPREFIX": str(cache_root() / "pycache")}


@contextmanager
def sluice(upstream: str, env: Mapping[str, str], access_log: Path | None = None,
           code: Path | None = None) -> Iterator[SluiceProcess]:
    # PYTHONDONTWRITEBYTECODE (set to anything) would keep the bytecode from being written: not in the child's
    # environment, which SluiceProcess takes from ours
    saved = os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    try:
        proc = SluiceProcess(upstream, extra_env={**BYTECODE, **env}, access_log=access_log, poll_s=0.005, code=code)
    finally:
        if saved is not None:
            os.environ["PYTHONDONTWRITEBYTECODE"] = saved
    with proc:
        yield proc


# ------------------------------------------------------------------------------------------------- start-up


def startups(broker: KafkaBroker, env: Mapping[str, str], runs: int,
             sides: Mapping[str, Path | None]) -> dict[str, list[dict[str, Any]]]:
    """``runs`` measured starts of each side (name -> its checkout, None = this one), taken in turn."""
    for code in sides.values():
        with sluice(broker.bootstrap, env, code=code):  # unmeasured: compiles the bytecode the measured starts read
            pass
    out: dict[str, list[dict[str, Any]]] = {side: [] for side in sides}
    for run in range(runs):
        for side, code in sides.items():
            with sluice(broker.bootstrap, env, code=code) as proc:
                ready_s = proc.ready_s
                ready_cpu_s = proc.cpu_seconds()
                at_ready = proc.vm_kib()
                time.sleep(IDLE_S)  # the idle period measured, not a synchronisation
                idle = proc.vm_kib()
                exit_code = proc.stop()
            line = {"measure": "startup", **({"side": side} if len(sides) > 1 else {}), "run": run,
                    "ready_s": round(ready_s, 3), "ready_cpu_s": round(ready_cpu_s, 3),
                    "rss_at_ready_mib": mib(at_ready["VmRSS"]), "startup_peak_mib": mib(idle["VmHWM"]),
                    "idle_rss_mib": mib(idle["VmRSS"]), "exit_code": exit_code}
            emit(line)
            out[side].append(line)
    return out


# ----------------------------------------------------------------------------------------------- under load


def produce(bootstrap: str, topic: str, records: int) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "batch.size": 256 * 1024,
                         "compression.type": "none", "acks": "all"})
    value = b"x" * RECORD_SIZE
    failed: list[str] = []

    def report(err: Any, _msg: Any) -> None:
        if err is not None:
            failed.append(str(err))

    for i in range(records):
        while True:
            try:
                producer.produce(topic, value=value, key=b"%d" % i, partition=i % PARTITIONS, on_delivery=report)
                break
            except BufferError:
                producer.poll(0.05)
    if producer.flush(120) or failed:
        raise SystemExit(f"bench.footprint: producing failed ({failed[:3]})")


class Sampler:
    """The most memory a process holds resident while something runs: VmRSS every ``SAMPLE_S``, and VmHWM."""

    def __init__(self, proc: SluiceProcess) -> None:
        self.proc = proc
        self.max_rss = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.max_rss = max(self.max_rss, self.proc.vm_kib()["VmRSS"])
            self._stop.wait(SAMPLE_S)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.max_rss = max(self.max_rss, self.proc.vm_kib()["VmHWM"])


def consume_through(proc: SluiceProcess, topic: str, ends: Mapping[int, int]) -> dict[str, Any]:
    """Every record of ``topic`` read through Sluice, by offset until each partition reaches its end offset (never a
    count a duplicate could reach early); what arrived, checked offset by offset against what the log holds."""
    consumer = Consumer({"bootstrap.servers": proc.bootstrap, "group.id": f"footprint-{uuid.uuid4().hex[:6]}",
                         "client.id": "bench-footprint", "auto.offset.reset": "earliest",
                         "enable.auto.commit": False, "fetch.max.bytes": 8 * 1024 * 1024})
    consumer.assign([TopicPartition(topic, p, 0) for p in ends])
    received: dict[int, list[int]] = {p: [] for p in ends}
    next_offset = dict.fromkeys(ends, 0)
    t0 = time.monotonic()
    deadline = t0 + 300
    try:
        while any(next_offset[p] < end for p, end in ends.items()) and time.monotonic() < deadline:
            for msg in consumer.consume(1000, timeout=1.0):
                partition, offset = msg.partition(), msg.offset()
                if msg.error() or partition is None or offset is None:
                    continue
                received[partition].append(offset)
                next_offset[partition] = max(next_offset[partition], offset + 1)
    finally:
        consumer.close()
    check = verdict.delivery({p: list(range(end)) for p, end in ends.items()}, received)
    return {"consumed": sum(len(r) for r in received.values()), **check.fields(), "delivery": check,
            "seconds": round(time.monotonic() - t0, 2)}


def under_load(broker: KafkaBroker, env: Mapping[str, str], work: Path, topic: str, records: int,
               ends: Mapping[int, int], policies: bool) -> dict[str, Any]:
    extra = dict(env)
    access_log = None
    if policies:
        (work / "sluice.toml").write_text(ALL_POLICIES)
        extra["SLUICE_CONFIG"] = str(work / "sluice.toml")
        access_log = work / "access.log"
    with sluice(broker.bootstrap, extra, access_log) as proc:
        before = proc.vm_kib()["VmRSS"]
        with Sampler(proc) as sampler:
            result = consume_through(proc, topic, ends)
        after = proc.vm_kib()["VmRSS"]
    line = {"measure": "all_policies" if policies else "passthrough", "mib": round(records * RECORD_SIZE / 2**20),
            "rss_before_mib": mib(before), "rss_max_mib": mib(sampler.max_rss), "rss_after_mib": mib(after), **result}
    emit({k: v for k, v in line.items() if k != "delivery"})
    return line


# ----------------------------------------------------------------------------------------------- connections


def api_versions_request(correlation_id: int) -> bytes:
    """ApiVersions v0 (request header v1): every Kafka broker answers it, it needs nothing negotiated."""
    client_id = b"bench-footprint"
    body = struct.pack(">hhih", 18, 0, correlation_id, len(client_id)) + client_id
    return struct.pack(">i", len(body)) + body


def read_frame(sock: socket.socket) -> bytes:
    def exactly(n: int) -> bytes:
        buf = b""
        while len(buf) < n:
            chunk = sock.recv(n - len(buf))
            if not chunk:
                raise ConnectionError("closed before the response")
            buf += chunk
        return buf

    return exactly(struct.unpack(">i", exactly(4))[0])


def connections(broker: KafkaBroker, env: Mapping[str, str], count: int) -> dict[str, Any]:
    with sluice(broker.bootstrap, env) as proc:
        before = proc.vm_kib()["VmRSS"]
        socks: list[socket.socket] = []
        answered = 0
        try:
            for i in range(count):
                sock = socket.create_connection(("127.0.0.1", proc.bootstrap_port), timeout=30)
                socks.append(sock)
                sock.sendall(api_versions_request(i))
                frame = read_frame(sock)
                correlation_id, error_code = struct.unpack(">ih", frame[:6])
                answered += correlation_id == i and error_code == 0
            after = proc.vm_kib()["VmRSS"]
        finally:
            for sock in socks:
                sock.close()
    line = {"measure": "connections", "connections": count, "answered": answered, "rss_before_mib": mib(before),
            "rss_after_mib": mib(after), "per_connection_kib": round((after - before) / count, 1)}
    emit(line)
    return line


# ------------------------------------------------------------------------------------------------------ main


def start_figures(starts: list[dict[str, Any]]) -> dict[str, Any]:
    """The start-up figures of one side's starts: the goals' three, then the slowest start and the CPU to ready."""
    return {
        "ready_s": round(statistics.median(s["ready_s"] for s in starts), 3),
        "startup_peak_mib": max(s["startup_peak_mib"] for s in starts),
        "idle_rss_mib": max(s["idle_rss_mib"] for s in starts),
        "ready_s_max": max(s["ready_s"] for s in starts),
        # the CPU Sluice spent to get ready: what ready_s would be on an idle core, whatever else the machine runs
        "ready_cpu_s": round(statistics.median(s["ready_cpu_s"] for s in starts), 3),
    }


def summary(starts: Mapping[str, list[dict[str, Any]]], plain: dict[str, Any], every: dict[str, Any],
            conns: dict[str, Any], compare: str | None = None) -> dict[str, Any]:
    """This tree's figures (``starts["tree"]``), and with ``compare`` (REV's label) REV's start-up figures."""
    tree = starts["tree"]
    return verdict.summary("footprint", {
        **start_figures(tree),
        "passthrough_rss_mib": plain["rss_max_mib"],
        "all_policies_rss_mib": every["rss_max_mib"],
        "per_connection_kib": conns["per_connection_kib"],
        "runs": len(tree),
        "python": sys.version.split()[0],
        **({"compare": {"revision": compare, **start_figures(starts["rev"])}} if compare is not None else {}),
    }, {name: at_most(goal) for name, goal in GOALS.items()},
        check=plain["delivery"] + every["delivery"],
        checks={"starts_ready": all(s["exit_code"] == 0 for side in starts.values() for s in side),
                "connections_answered": conns["answered"] == conns["connections"]})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.footprint", description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5, help="measured starts (default 5)")
    parser.add_argument("--mib", type=int, default=64, help="MiB consumed through Sluice under load (default 64)")
    parser.add_argument("--connections", type=int, default=1000, help="idle client connections (default 1000)")
    parser.add_argument("--compare", metavar="REV",
                        help="also start git revision REV's Sluice, in turn with this tree's (start-up figures)")
    verdict.add_options(parser, "2 starts, 8 MiB, 200 connections")
    args = parser.parse_args(argv)
    if args.smoke:
        args.runs, args.mib, args.connections = 2, 8, 200
    records = args.mib * 2**20 // RECORD_SIZE
    with tempfile.TemporaryDirectory(prefix="bench-footprint-") as tmp, KafkaBroker() as broker:
        work = Path(tmp)
        env: dict[str, str] = {}
        sides: dict[str, Path | None] = {"tree": None}
        if args.compare:
            (work / "rev").mkdir()
            extract_revision(args.compare, work / "rev")
            sides = {"rev": work / "rev", **sides}
        starts = startups(broker, env, args.runs, sides)
        topic = f"footprint-{uuid.uuid4().hex[:8]}"
        create_topic(broker.bootstrap, topic, partitions=PARTITIONS)
        produce(broker.bootstrap, topic, records)
        ends = end_offsets(broker.bootstrap, topic)
        plain = under_load(broker, env, work, topic, records, ends, policies=False)
        every = under_load(broker, env, work, topic, records, ends, policies=True)
        conns = connections(broker, env, args.connections)
    line = summary(starts, plain, every, conns, short_revision(args.compare) if args.compare else None)
    verdict.emit(line)
    return verdict.exit_status(line, args.check)


if __name__ == "__main__":
    sys.exit(main())
