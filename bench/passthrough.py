"""Passthrough benchmark: what does putting Sluice between clients and a broker cost?

``python -m bench.passthrough [--mib 400] [--latency-records 2000]``

One run, one rig broker (started and stopped here), one Sluice subprocess (``python -m proxy run``, access log
off) in front of it. Measured against the same broker and the same data:

- consume throughput, direct vs through Sluice: Kafka's Java ConsumerPerformance (Fetch v17, fetch sessions)
  and confluent-kafka (librdkafka, Python), over ``--mib`` MiB of 1 KiB records produced once, directly, by the
  Java ProducerPerformance. Runs are ordered ABBA (direct, Sluice, Sluice, direct), twice, so drift cancels;
  the figure per path is the mean of its runs, after one unmeasured warm-up run per path;
- produce latency, direct vs through Sluice and each relay: confluent-kafka sending small records one at a time
  (acks=1, linger 0, each awaited with flush()); the paths take turns record by record, in an order shuffled each
  send (seeded), so each path follows each other one equally often (a proxy leaves work after each response that
  overlaps the next send on two cores: in a fixed cyclic order the path after Sluice would pay for it); p50/p99;
- Sluice's CPU seconds per GiB relayed (user + system time of the Sluice process, rig/cpu.py, across the proxied
  consume runs, divided by the bytes it wrote to clients, from its own sluice_bytes_total), and its minor page
  faults per GiB the same way (``minor_faults_per_gib``: pages its heap returned to the kernel and faulted in
  again);
- the same for two Kafka-blind relays, each in front of a listener of the broker's own advertised at the relay's
  port (:func:`relayed_broker`: clients that bootstrap through a relay stay on it): the bare relay
  (rig/bare_relay.py: bytes in, bytes out, on the same event loop, Protocols and backpressure marks as Sluice, no
  Kafka parsing: the least a Python proxy can do) and HAProxy in ``mode tcp`` (Debian's package, from PATH or
  /usr/sbin, its defaults: what a relay written in C costs on the same machine). The Java consumer through each,
  their CPU per GiB of records, produce latency through each and their CPU per produce round trip over the same
  sends. The Java runs are ordered direct, bare, HAProxy, Sluice, Sluice, HAProxy, bare, direct.

Prints one JSON line per measurement; the last line is ``{"summary": "passthrough", <figures>, "goals", "met",
"lost", "duplicated", "out_of_order", "unexpected", "errors", "correct"}`` (bench/support/verdict.py). Its figures,
for Sluice and each relay: the consume ratio (``consume_ratio``: Sluice's MB/s of the Java consumer over direct's;
``bare_relay_ratio``, ``haproxy_ratio``), the added p50 and p99 per produce round trip (``added_p50_ms``,
``bare_added_p50_ms``, ``haproxy_added_p50_ms``, ``added_p99_ms``, ...: through it minus direct), the CPU per produce
round trip (``sluice_cpu_us_per_send``, ``bare_cpu_us_per_send``, ``haproxy_cpu_us_per_send``) and the CPU per GiB
of records (``sluice_cpu_s_per_gib_records``, ``bare_...``, ``haproxy_...``; ``cpu_vs_bare_relay`` Sluice's over the
bare relay's; ``cpu_s_per_gib``, Sluice's per GiB it wrote to clients). The goals (:data:`GOALS`):
``added_p50_over_bare_ms`` <= 0.020 (Sluice's added p50 at most 20 us over the bare relay's),
``cpu_per_send_vs_bare`` <= 1.3 (Sluice's CPU per produce round trip over the bare relay's), ``consume_vs_bare``
>= 1 (Sluice's consume ratio over the bare relay's). The check, record by record: every confluent-kafka read
(direct and through Sluice) got each partition's records once, in order, to the topic's end offsets
(ConsumerPerformance only counts: it measures), and the latency topic holds exactly the sends acknowledged over
all paths, by offset and key. The exit status is 1 when the check fails; with ``--check``, also when a goal is
missed. Sized for a 2-core machine: about 7 minutes end to end.

``--smoke``: the whole path, check included, in about a minute: 8 MiB, each path read once without warm-up, 200
sends per path; its figures decide nothing.

``python -m bench.passthrough --policies all``: the same, with every policy switched on in Sluice as operators run
it (:data:`ALL_POLICIES`: a KIP-74 budget for every client sized not to bind, ``[sessions] mode = "terminate"``,
a KIP-73 throttle on every topic for every consumer at a rate far above the traffic's, a client quota for every
client above it too, sharing on for other groups' clients, the access log written to a file), against direct and
against Sluice without policies in the same rounds (``passthrough``: a second Sluice process; the relays then take
part in the produce round trips only). The last line carries ``"policies": "all"``, ``passthrough_ratio``,
``passthrough_added_p50_ms`` and ``passthrough_cpu_us_per_send``; goals (:data:`GOALS_ALL_POLICIES`):
``consume_vs_passthrough`` >= 0.95, ``cpu_per_send_vs_passthrough`` <= 1.5.

``--policies streamed``: the same goals for every policy of ``all`` but terminate (:data:`STREAMED_POLICIES`: its
client and upstream sessions list partitions differently, so it rebuilds, i.e. collects, every Fetch response),
where the size limit, the throttle and the quota read each Fetch response as it streams; ``all`` runs in the same
rounds (a third Sluice process) and the last line adds its figures as ``all_ratio``, ``all_vs_passthrough``,
``all_cpu_us_per_send``, ``all_cpu_per_send_vs_passthrough``.

``--batch-size BYTES``: the producer's ``batch.size`` for the consumed data (default 256 KiB, so producing it takes
seconds: a ~1 MiB fetch then holds ~4 batches per partition). ``--batch-size 16384`` is the Java producer's own
default: ~64 batches per MiB, and the size limit and the throttle read each batch's header, so with ``--policies
all`` it shows what the batch walk costs a consumer of default producers. With ``--tls`` too. The last line carries
``"batch_size"``.

``--profile DIR``: py-spy samples Sluice (non-blocking) from its start to its stop; ``DIR/sluice.raw`` holds the
collapsed stacks (flamegraph.pl, speedscope.app), ``DIR/sluice.json`` and one ``"measure": "profile"`` line
the CPU per request by part of Sluice (framing, header parse, chain, policies, codecs, access log, metrics,
writes, the event loop) and the top functions (bench/support/profiling.py). Figures measured with the profiler attached
are not the bench's figures: run it again without for those.

``python -m bench.passthrough --tls [--mib 200]``: TLS on both sides. A broker with an SSL listener (client
certificates required: rig/secure_broker.py) and Sluice with ``[listen.tls]`` and ``[upstream.tls]`` (its own
client certificate), against the Java ConsumerPerformance over TLS straight to that listener, in the same run,
ABBA as above; a plaintext Sluice in front of the broker's PLAINTEXT listener runs in the same rounds, so the CPU
TLS adds to Sluice shows next to what relaying costs it. The last line is ``{"summary": "passthrough_tls",
"consume_ratio": ..., "cpu_s_per_gib": ..., "plain_cpu_s_per_gib": ..., "goals", "met", ...}`` (goal,
:data:`GOALS_TLS`: consume_ratio >= 0.9; Sluice terminates and originates TLS in Python's ssl module, OpenSSL
underneath, through uvloop's transports); its check: a confluent-kafka read through the TLS Sluice gets every
record once, in order. ``--tls --compare REV``: REV's TLS Sluice (its ``proxy`` package, bench/support/revision.py)
in the same rounds, next to this checkout's; the last line adds ``compare``, ``baseline_ratio`` (its consume ratio to
direct) and ``baseline_cpu_s_per_gib``.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import random
import shutil
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import psutil
from confluent_kafka import Consumer, Message, Producer, TopicPartition

from bench.support.profiling import Profile
from bench.support.verdict import Delivery, add_options, at_least, at_most, delivery, emit, exit_status, summary
from rig.cpu import cpu_seconds
from rig.java_tools import JavaTools
from rig.kafka import KafkaBroker, end_offsets, free_ports, read_topic
from rig.sluice_process import SluiceProcess
from rig.topics import create_topic

RECORD_SIZE = 1024
PARTITIONS = 3
#: the producer's batch.size: large batches, so producing the bench's data takes seconds (``--batch-size``)
BATCH_SIZE = 262144
GIB = float(1 << 30)
ROUNDS = 2  # ABBA rounds per client: 2 x 2 measured runs per path
BUDGET_S = 420.0  # the whole bench stays near 7 minutes
HAPROXY_START_S = 120.0
#: without policies: Sluice's producer round trip adds at most 20 us over the bare Python relay's at p50 and costs at
#: most 1.3x its CPU; consumers read at least as fast through Sluice as through the bare relay
GOALS = {"added_p50_over_bare_ms": at_most(0.020), "cpu_per_send_vs_bare": at_most(1.3),
         "consume_vs_bare": at_least(1.0)}
#: every policy on: consumers at 0.95x of Sluice without policies (same run) or better; a producer's round trip at
#: most 1.5x its CPU
GOALS_ALL_POLICIES = {"consume_vs_passthrough": at_least(0.95), "cpu_per_send_vs_passthrough": at_most(1.5)}
#: TLS on both sides: consumers at 0.9x of TLS straight to the broker or better
GOALS_TLS = {"consume_ratio": at_least(0.9)}


#: ``--policies streamed``: every policy of :data:`ALL_POLICIES` but terminate (which rebuilds every Fetch response:
#: collected by design), so the size limit, the throttle and the quota read Fetch responses as they stream
STREAMED_POLICIES = """
[size_limit]
global_max_bytes = 1073741824
[[size_limit.budgets]]
client_id = "*"
fetch_max_bytes = 104857600

[throttle]
leader_rate_bytes = 100000000000
[[throttle.topics]]
topic = "*"
[[throttle.consumers]]
client_id = "*"

[quota]
[[quota.entries]]
name = "everyone"
client_id = "*"
produce_rate_bytes = 100000000000
fetch_rate_bytes = 100000000000
request_rate = 10000000

[sharing]
enabled = true
clients = ["shared-*"]
[[sharing.topics]]
topic = "*"
"""
#: ``--policies all``: each policy on, none binding (budgets, throttle and quotas far above what the bench moves:
#: the bench's consumers read at most a few hundred MB/s on this machine), sharing on for clients of other names
ALL_POLICIES = """
[sessions]
mode = "terminate"
""" + STREAMED_POLICIES


class Budget:
    """A bench's time guard: past it, the bench stops before its next step, saying whose budget it was."""

    def __init__(self, seconds: float, bench: str = "bench.passthrough") -> None:
        self.seconds, self.bench = seconds, bench
        self.deadline = time.monotonic() + seconds

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def check(self, what: str) -> None:
        if self.left() <= 0:
            raise SystemExit(f"{self.bench}: over its {self.seconds:.0f} s budget before {what}")


def minor_faults(pid: int) -> int:
    """The process's minor page faults so far (/proc/PID/stat field 10, minflt; psutil does not read it): a page
    the heap handed back to the kernel and took again is one per 4 KiB (proxy/heap.py)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat[stat.rindex(")") + 2 :].split()[7])  # fields after "(comm)" start at field 3


class CpuMeter:
    """Sluice's CPU seconds, minor page faults and client-bound bytes across the measured (proxied) runs."""

    def __init__(self, sluice: SluiceProcess) -> None:
        self.sluice = sluice
        self.proc = psutil.Process(sluice.pid)
        self.cpu_s = 0.0
        self.faults = 0
        self.bytes = 0.0
        self.mib = 0.0  # of records, as the consumer counted them

    def _bytes(self) -> float:
        return self.sluice.metric("sluice_bytes_total", {"direction": "proxy_to_client"})

    def measure(self, fn: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        # the /metrics scrapes outside the CPU interval: the bench's own reads are not Sluice relaying
        b0 = self._bytes()
        cpu0, faults0 = cpu_seconds(self.proc.pid), minor_faults(self.proc.pid)
        result = fn()
        cpu1, faults1 = cpu_seconds(self.proc.pid), minor_faults(self.proc.pid)
        b1 = self._bytes()
        self.cpu_s += cpu1 - cpu0
        self.faults += faults1 - faults0
        self.bytes += b1 - b0
        self.mib += float(result.get("mb") or 0.0)
        result["sluice_cpu_s"] = round(cpu1 - cpu0, 3)
        result["sluice_bytes_to_client"] = int(b1 - b0)
        if b1 > b0:
            result["sluice_cpu_s_per_gib"] = round((cpu1 - cpu0) / ((b1 - b0) / GIB), 3)
        return result


# -------------------------------------------------------------------------------------------- consumers


def java_consume(tools: JavaTools, bootstrap: str, topic: str, records: int,
                 props: Mapping[str, object] | None = None) -> dict[str, Any]:
    """ConsumerPerformance until it has ``records`` records (a count: it measures; the confluent-kafka reads of
    the same topic check the records themselves)."""
    r = tools.consumer_perf(bootstrap, topic, messages=records, group=f"perf-{uuid.uuid4().hex[:8]}",
                            consumer_props=props, timeout=120)
    if r.records < records:
        raise SystemExit(f"ConsumerPerformance read {r.records} of {records} records:\n{r.stderr[-2000:]}")
    # fetch.MB.sec excludes the group join (rebalance) time: the figure that is about moving bytes.
    return {"mb_per_s": r.metrics.get("fetch_MB_sec", r.mb_per_sec), "total_mb_per_s": r.mb_per_sec,
            "records": r.records, "mb": r.metrics.get("data_consumed_in_MB")}


def confluent_consume(bootstrap: str, topic: str, ends: dict[int, int], deadline_s: float,
                      checks: list[Delivery], config: Mapping[str, object] | None = None) -> dict[str, Any]:
    """Read every record from the beginning with explicit assignment (no group: nothing but fetching), until each
    partition reaches its end offset (``ends``: the topic as produced) or the deadline passes; ``checks`` gets what
    the read got of the records, by offset (each once, in order, none missing)."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-{uuid.uuid4().hex[:8]}",
                  "enable.auto.commit": False, "fetch.wait.max.ms": 100, **(config or {})})
    c.assign([TopicPartition(topic, p, 0) for p in ends])
    offsets: dict[int, list[int]] = {p: [] for p in ends}
    position = dict.fromkeys(ends, 0)
    nbytes = 0
    start: float | None = None
    deadline = time.monotonic() + deadline_s
    try:
        while any(position[p] < end for p, end in ends.items()) and time.monotonic() < deadline:
            for m in c.consume(num_messages=10_000, timeout=1.0):
                partition, offset = m.partition(), m.offset()
                if m.error() is not None or partition is None or offset is None:
                    continue
                if start is None:
                    start = time.perf_counter()
                offsets[partition].append(offset)
                position[partition] = max(position[partition], offset + 1)
                nbytes += len(m.value() or b"")
        end = time.perf_counter()
    finally:
        c.close()
    checks.append(delivery({p: range(end) for p, end in ends.items()}, offsets))
    if start is None:
        raise SystemExit(f"confluent-kafka read nothing in {deadline_s:.0f} s")
    # From the first record to the last: connection and metadata set-up are not throughput.
    return {"mb_per_s": nbytes / (1 << 20) / (end - start), "records": sum(map(len, offsets.values())),
            "mb": nbytes / (1 << 20)}


def abba(paths: dict[str, Callable[[], dict[str, Any]]], client: str, budget: Budget,
         smoke: bool = False) -> dict[str, float]:
    """One unmeasured warm-up run per path (JIT, page cache, connections), then ROUNDS x the paths in order and
    back (direct, ..., ..., direct); emit each; return the mean MB/s per path. ``smoke``: each path once."""
    figures: dict[str, list[float]] = {path: [] for path in paths}
    for path, fn in paths.items() if not smoke else ():
        budget.check(f"{client} warm-up")
        result = fn()
        emit({"bench": "passthrough", "measure": "warmup", "client": client, "path": path,
              "mb_per_s": round(result["mb_per_s"], 3)})
    order = list(paths)
    for run, path in enumerate(order if smoke else (order + order[::-1]) * ROUNDS, start=1):
        budget.check(f"{client} consume run {run}")
        result = paths[path]()
        figures[path].append(result["mb_per_s"])
        emit({"bench": "passthrough", "measure": "consume", "client": client, "path": path, "run": run,
              **{k: round(v, 3) if isinstance(v, float) else v for k, v in result.items()}})
    means = {path: statistics.fmean(xs) for path, xs in figures.items()}
    emit({"bench": "passthrough", "measure": "consume", "client": client,
          **{f"{path}_mb_per_s": round(m, 2) for path, m in means.items()},
          **{f"{path}_ratio": round(m / means["direct"], 3) for path, m in means.items() if path != "direct"}})
    return means


class Relay:
    """A Kafka-blind relay as a subprocess in front of one of the broker's listeners, with its CPU per GiB of
    records consumed through it (:meth:`measure`)."""

    def __init__(self, port: int, cmd: list[str]) -> None:
        import subprocess

        self.port = port
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.ps = psutil.Process(self.proc.pid)
        self.cpu_s = 0.0
        self.mib = 0.0

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def measure(self, fn: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        t0 = cpu_seconds(self.ps.pid)
        result = fn()
        cpu = cpu_seconds(self.ps.pid) - t0
        self.cpu_s += cpu
        self.mib += float(result.get("mb") or 0.0)
        result["relay_cpu_s"] = round(cpu, 3)
        return result

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


class BareRelay(Relay):
    """rig/bare_relay.py: the least a Python proxy can do (bytes in, bytes out, Sluice's event loop and Protocols)."""

    def __init__(self, port: int, upstream: str) -> None:
        import sys

        super().__init__(port, [sys.executable, "-m", "rig.bare_relay", str(port), upstream])
        assert self.proc.stdout is not None
        if "listening" not in self.proc.stdout.readline():
            self.stop()
            raise SystemExit("bare relay did not start")


#: HAProxy as it ships (Debian's package), relaying TCP: nothing but its defaults and the two addresses
HAPROXY_CONFIG = """\
global
    maxconn 4096
defaults
    mode tcp
    timeout connect 10s
    timeout client 1h
    timeout server 1h
listen kafka
    bind 127.0.0.1:{port}
    server broker {upstream}
"""


class HAProxyRelay(Relay):
    """HAProxy in ``mode tcp`` (C, Kafka-blind, in the foreground: ``-db``): what a relay written in C costs on the
    same machine, beside the bare Python relay. From PATH, else /usr/sbin (where Debian installs it: a user's PATH
    may not hold it)."""

    def __init__(self, port: int, upstream: str, work: Path) -> None:
        import shutil
        import socket

        exe = shutil.which("haproxy") or "/usr/sbin/haproxy"
        config = work / "haproxy.cfg"
        config.write_text(HAPROXY_CONFIG.format(port=port, upstream=upstream))
        super().__init__(port, [exe, "-db", "-f", str(config)])
        # a hang guard, not a measure: at the lowest CPU priority beside CI's test sessions, HAProxy's start went
        # past 10 s (a CI-like run, 1 Dec 2026)
        deadline = time.monotonic() + HAPROXY_START_S
        while True:  # up once its listener accepts (it says nothing when it starts)
            if self.proc.poll() is not None:
                raise SystemExit(f"haproxy exited with {self.proc.returncode}: {self.proc.communicate()[1][-2000:]}")
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    self.stop()
                    raise SystemExit(f"haproxy did not listen within {HAPROXY_START_S:.0f} s") from None
                time.sleep(0.05)


def relayed_broker(relays: int) -> tuple[KafkaBroker, list[tuple[int, int]]]:
    """A broker with a listener per relay, each advertised at its relay's port: clients that bootstrap through a
    relay are told to connect to it, so all their traffic goes through it; direct clients use the first listener.
    Returns the broker and, per relay, (its listener's port, the relay's port)."""
    port, controller, *pairs = free_ports(2 + 2 * relays)
    relayed = [(pairs[2 * i], pairs[2 * i + 1]) for i in range(relays)]
    listeners = "".join(f",RELAYED{i}://127.0.0.1:{inner}" for i, (inner, _) in enumerate(relayed))
    advertised = "".join(f",RELAYED{i}://127.0.0.1:{outer}" for i, (_, outer) in enumerate(relayed))
    protocols = "".join(f",RELAYED{i}:PLAINTEXT" for i in range(relays))
    broker = KafkaBroker(port=port, controller_port=controller, overrides={
        "listeners": f"PLAINTEXT://127.0.0.1:{port}{listeners},CONTROLLER://127.0.0.1:{controller}",
        "advertised.listeners": f"PLAINTEXT://127.0.0.1:{port}{advertised}",
        "listener.security.protocol.map": f"PLAINTEXT:PLAINTEXT{protocols},CONTROLLER:PLAINTEXT",
    })
    return broker, relayed


def per_gib(cpu_s: float, mib: float) -> float:
    """CPU seconds per GiB of records (``mib``: as the consumers counted them); NaN when none were counted."""
    return cpu_s / (mib / 1024) if mib else float("nan")


def ratio(a: float | None, b: float | None, digits: int = 3) -> float | None:
    """a / b rounded; None when either is missing or NaN, or b is 0 (a figure a run could not take; a goal whose
    figure is None is not met)."""
    if a is None or b is None or math.isnan(a) or math.isnan(b) or b == 0:
        return None
    return round(a / b, digits)


# ---------------------------------------------------------------------------------------- produce latency


def send_orders(paths: list[str], seed: int = 0) -> Iterator[list[str]]:
    """The order of the paths for each send: shuffled each time (seeded, so every run sends alike), so that each path
    follows each other one equally often on average. A send through a proxy leaves it (and the broker) work that
    overlaps the next send on two cores; in one fixed cyclic order (rotated each send) the path after a Sluice always
    paid for it (``bench.latency`` with the same code on both sides measured its "after" side +21.6 us at p50)."""
    order = list(paths)
    shuffle = random.Random(seed).shuffle
    while True:
        shuffle(order)
        yield list(order)


def produce_latency(bootstraps: dict[str, str], topic: str, records: int, warmup: int,
                    budget: Budget, acked: list[Sent] | None = None) -> dict[str, dict[str, float]]:
    """Alternate synchronous sends over the paths, in :func:`send_orders`; latency percentiles (ms) per path. Each
    record's key is its own (path, this call, its number); ``acked`` gets (partition, offset, key) of each, as the
    broker acknowledged it (:func:`check_stored` compares them with the topic)."""
    config = {"acks": "1", "linger.ms": 0, "batch.num.messages": 1, "enable.idempotence": False}
    producers = {path: Producer({"bootstrap.servers": b, **config}) for path, b in bootstraps.items()}
    samples: dict[str, list[float]] = {path: [] for path in bootstraps}
    orders = send_orders(list(bootstraps))
    value = b"v" * 100
    errors: list[object] = []
    call = uuid.uuid4().hex[:8]

    def on_delivery(err: object, msg: Message) -> None:
        partition, offset, key = msg.partition(), msg.offset(), msg.key()
        if err is not None or partition is None or offset is None or key is None:
            errors.append(err)
        elif acked is not None:
            acked.append((partition, offset, key))

    for i in range(warmup + records):
        if i % 200 == 0:
            budget.check("produce latency")
        for path in next(orders):
            p = producers[path]
            t0 = time.perf_counter()
            p.produce(topic, value=value, key=f"{path}-{call}-{i}".encode(), partition=0, on_delivery=on_delivery)
            if p.flush(10) != 0:
                raise SystemExit(f"{path} producer: record {i} not delivered within 10 s")
            if i >= warmup:
                samples[path].append((time.perf_counter() - t0) * 1000.0)
    if errors:
        raise SystemExit(f"delivery errors: {errors[:5]}")

    def pct(xs: list[float]) -> dict[str, float]:
        q = statistics.quantiles(xs, n=100, method="inclusive")
        return {"p50_ms": round(statistics.median(xs), 4), "p99_ms": round(q[98], 4),
                "mean_ms": round(statistics.fmean(xs), 4), "records": len(xs)}

    return {path: pct(xs) for path, xs in samples.items()}


#: a record sent, as its acknowledgement gave it: (partition, offset, key)
Sent = tuple[int, int, bytes]


def check_stored(bootstrap: str, topic: str, acked: list[Sent]) -> Delivery:
    """The topic holds exactly the records acknowledged, each once, in offset order (by offset and key: a Produce
    sent twice, a record lost or changed on the way shows)."""
    sent: dict[int, list[tuple[int, bytes | None]]] = {}
    for partition, offset, key in sorted(acked):
        sent.setdefault(partition, []).append((offset, key))
    stored = {p: [(offset, key) for offset, key, _ in records] for p, records in read_topic(bootstrap, topic).items()}
    return delivery(sent, stored)


# ------------------------------------------------------------------------------------------------- main


def sluice_api_counts(sluice: SluiceProcess) -> dict[str, Any]:
    """Fetch/Produce request counts by version and rewritten-response counts, from Sluice's /metrics."""
    from prometheus_client.parser import text_string_to_metric_families

    requests: dict[str, int] = {}
    rewritten: dict[str, int] = {}
    for family in text_string_to_metric_families(sluice.metrics_text()):
        for sample in family.samples:
            api = sample.labels.get("api")
            if sample.name == "sluice_requests_total" and api in ("Fetch", "Produce"):
                requests[f"{api} v{sample.labels['version']}"] = int(sample.value)
            elif sample.name == "sluice_responses_rewritten_total" and api in ("Fetch", "Produce"):
                rewritten[api] = int(sample.value)
    return {"requests": requests, "rewritten": rewritten}



def sluice_total(sluice: SluiceProcess, name: str) -> float:
    """A counter of Sluice's summed over its labels (every API and version)."""
    from prometheus_client.parser import text_string_to_metric_families

    return sum(s.value for family in text_string_to_metric_families(sluice.metrics_text())
               for s in family.samples if s.name == name)


def stop_checked(sluice: SluiceProcess) -> None:
    code = sluice.stop()
    if code != 0:
        raise SystemExit(f"sluice exited with {code}:\n{sluice.stderr_text()[-3000:]}")


def main_tls(mib: int, batch_size: int = BATCH_SIZE, smoke: bool = False, check_goals: bool = False,
             compare: str | None = None) -> int:
    """TLS client -> Sluice -> TLS broker vs TLS straight to the broker (module docstring); ``compare``: a revision
    whose TLS Sluice runs in the same rounds too."""
    from pathlib import Path

    from bench.support.revision import extract_revision
    from rig.kafka import THROUGHPUT_BROKER_JVM_OPTS
    from rig.pki import CA
    from rig.secure_broker import SecureBroker

    budget = Budget(BUDGET_S)
    records = mib * (1 << 20) // RECORD_SIZE
    t_start = time.monotonic()
    tools = JavaTools()
    work = Path(tempfile.mkdtemp(prefix="bench-tls-"))
    secure = SecureBroker.start(work / "broker", jvm_opts=THROUGHPUT_BROKER_JVM_OPTS)
    try:
        emit({"bench": "passthrough_tls", "event": "broker_started", "ssl": secure.ssl})
        topic = f"bench-tls-{uuid.uuid4().hex[:8]}"
        create_topic(secure.plaintext, topic, partitions=PARTITIONS)
        produced = tools.producer_perf(secure.plaintext, topic, num_records=records, record_size=RECORD_SIZE,
                                       producer_props={"acks": 1, "linger.ms": 20, "batch.size": batch_size,
                                                       "compression.type": "none"}, timeout=150)
        emit({"bench": "passthrough_tls", "event": "produced", "records": produced.records, "mib": mib,
              "batch_size": batch_size})
        ca = CA(work / "sluice", "sluice")
        server = ca.issue("sluice")
        env = {"SLUICE_LISTEN__TLS__ENABLED": "true", "SLUICE_LISTEN__TLS__CERT_FILE": str(server.cert),
               "SLUICE_LISTEN__TLS__KEY_FILE": str(server.key),
               "SLUICE_UPSTREAM__TLS__ENABLED": "true", "SLUICE_UPSTREAM__TLS__CA_FILE": str(secure.ca.cert),
               "SLUICE_UPSTREAM__TLS__CERT_FILE": str(secure.client.cert),
               "SLUICE_UPSTREAM__TLS__KEY_FILE": str(secure.client.key)}
        direct_props = {"security.protocol": "SSL", "ssl.truststore.type": "PEM",
                        "ssl.truststore.location": str(secure.ca.cert), "ssl.keystore.type": "PEM",
                        "ssl.keystore.location": str(secure.client.pem)}
        sluice_props = {"security.protocol": "SSL", "ssl.truststore.type": "PEM",
                        "ssl.truststore.location": str(ca.cert)}
        ends = end_offsets(secure.plaintext, topic)
        checks: list[Delivery] = []

        def consume(bootstrap: str, props: Mapping[str, object]) -> dict[str, Any]:
            return java_consume(tools, bootstrap, topic, records, props)

        baseline_code = work / "baseline"
        revision = extract_revision(compare, baseline_code) if compare else None
        with contextlib.ExitStack() as stack:
            sluice = stack.enter_context(SluiceProcess(secure.ssl, extra_env=env))
            plain = stack.enter_context(SluiceProcess(secure.plaintext))
            meter, plain_meter = CpuMeter(sluice), CpuMeter(plain)
            paths = {
                "direct": lambda: consume(secure.ssl, direct_props),
                "sluice": lambda: meter.measure(lambda: consume(sluice.bootstrap, sluice_props)),
            }
            if revision is not None:  # next to Sluice in each round's order
                base = stack.enter_context(SluiceProcess(secure.ssl, extra_env=env, code=baseline_code))
                base_meter = CpuMeter(base)
                paths["baseline"] = lambda: base_meter.measure(lambda: consume(base.bootstrap, sluice_props))
            paths["sluice_plaintext"] = lambda: plain_meter.measure(lambda: consume(plain.bootstrap, {}))
            java = abba(paths, "java-consumer-perf-tls", budget, smoke)
            # the check: every record read once, in order, through the TLS Sluice (by offset)
            confluent_consume(sluice.bootstrap, topic, ends, max(30.0, budget.left()), checks,
                              {"security.protocol": "SSL", "ssl.ca.location": str(ca.cert)})
            cpu_s_per_gib = meter.cpu_s / (meter.bytes / GIB) if meter.bytes else float("nan")
            plain_cpu = plain_meter.cpu_s / (plain_meter.bytes / GIB) if plain_meter.bytes else float("nan")
            emit({"bench": "passthrough_tls", "measure": "sluice_cpu", "cpu_s": round(meter.cpu_s, 3),
                  "gib_relayed": round(meter.bytes / GIB, 3), "cpu_s_per_gib": round(cpu_s_per_gib, 3),
                  "plain_cpu_s_per_gib": round(plain_cpu, 3)})
            figures: dict[str, Any] = {
                "batch_size": batch_size, "consume_ratio": round(java["sluice"] / java["direct"], 3),
                "cpu_s_per_gib": round(cpu_s_per_gib, 3), "plain_cpu_s_per_gib": round(plain_cpu, 3)}
            if revision is not None:
                figures.update(compare=revision[:12], baseline_ratio=round(java["baseline"] / java["direct"], 3),
                               baseline_cpu_s_per_gib=round(base_meter.cpu_s / (base_meter.bytes / GIB), 3))
                stop_checked(base)
            stop_checked(sluice)
            stop_checked(plain)
    finally:
        secure.close()
        tools.close()
        shutil.rmtree(work, ignore_errors=True)
    emit({"bench": "passthrough_tls", "event": "done", "elapsed_s": round(time.monotonic() - t_start, 1)})
    line = summary("passthrough_tls", figures, GOALS_TLS, check=sum(checks, Delivery()))
    emit(line)
    return exit_status(line, check_goals)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.passthrough", description=__doc__.split("\n\n")[0])
    ap.add_argument("--mib", type=int, default=None, help="MiB of 1 KiB records to consume per run (default 400; "
                                                         "200 with --tls)")
    ap.add_argument("--latency-records", type=int, default=2000, help="measured sends per path (default 2000)")
    ap.add_argument("--tls", action="store_true", help="TLS on both sides vs a TLS listener direct")
    ap.add_argument("--policies", choices=("none", "all", "streamed"), default="none",
                    help="all: every policy on in Sluice, none binding, access log to a file; streamed: all but "
                         "terminate, with all in the same rounds (module docstring)")
    ap.add_argument("--profile", metavar="DIR", type=Path, default=None,
                    help="sample Sluice with py-spy into DIR (sluice.raw collapsed stacks, sluice.json summary)")
    ap.add_argument("--batch-size", type=int, default=BATCH_SIZE,
                    help=f"the producer's batch.size in bytes (default {BATCH_SIZE}; 16384 is the Java producer's own "
                         "default, whose consumers get ~64 batches per MiB fetched: the size limit and the throttle "
                         "walk each one)")
    ap.add_argument("--compare", metavar="REV", default=None,
                    help="with --tls: a TLS Sluice of this git revision in the same rounds too (baseline_ratio)")
    add_options(ap, "8 MiB, each path read once without warm-up, 200 sends per path")
    args = ap.parse_args(argv)
    if args.smoke:
        args.mib, args.latency_records = args.mib or 8, 200
    if args.tls:
        return main_tls(args.mib or 200, args.batch_size, args.smoke, args.check, args.compare)
    if args.compare:
        ap.error("--compare is for --tls only")
    args.mib = args.mib or 400
    every = args.policies != "none"
    streamed = args.policies == "streamed"
    budget = Budget(BUDGET_S)
    records = args.mib * (1 << 20) // RECORD_SIZE
    t_start = time.monotonic()

    tools = JavaTools()
    broker, (bare_ports, haproxy_ports) = relayed_broker(2)
    with broker:
        emit({"bench": "passthrough", "event": "broker_started", "bootstrap": broker.bootstrap,
              "start_s": round(broker.last_start_seconds or 0.0, 2)})
        topic = f"bench-{uuid.uuid4().hex[:8]}"
        create_topic(broker.bootstrap, topic, partitions=PARTITIONS)
        produced = tools.producer_perf(broker.bootstrap, topic, num_records=records, record_size=RECORD_SIZE,
                                       producer_props={"acks": 1, "linger.ms": 20, "batch.size": args.batch_size,
                                                       "compression.type": "none"}, timeout=150)
        emit({"bench": "passthrough", "event": "produced", "records": produced.records,
              "mb_per_s": produced.mb_per_sec, "mib": args.mib, "batch_size": args.batch_size})
        ends = end_offsets(broker.bootstrap, topic)
        checks: list[Delivery] = []
        acked: list[Sent] = []

        work = Path(tempfile.mkdtemp(prefix="bench-passthrough-"))
        env: dict[str, str] = {}
        access_log: Path | None = None
        if every:
            (work / "sluice.toml").write_text(STREAMED_POLICIES if streamed else ALL_POLICIES)
            env["SLUICE_CONFIG"] = str(work / "sluice.toml")
            access_log = work / "access.log"
            (work / "all.toml").write_text(ALL_POLICIES)
        with contextlib.ExitStack() as stack:
            stack.callback(shutil.rmtree, work, ignore_errors=True)  # last: after every process using it stopped
            bare = BareRelay(bare_ports[1], f"127.0.0.1:{bare_ports[0]}")
            stack.callback(bare.stop)
            haproxy = HAProxyRelay(haproxy_ports[1], f"127.0.0.1:{haproxy_ports[0]}", work)
            stack.callback(haproxy.stop)
            sluice = stack.enter_context(SluiceProcess(broker.bootstrap, extra_env=env, access_log=access_log))
            # every policy on: Sluice without them in the same rounds, the baseline of its goals
            plain = stack.enter_context(SluiceProcess(broker.bootstrap)) if every else None
            # streamed: Sluice with every policy (terminate too) in the same rounds, what streaming is compared with
            every_sluice = stack.enter_context(SluiceProcess(
                broker.bootstrap, extra_env={"SLUICE_CONFIG": str(work / "all.toml")},
                access_log=work / "access-all.log")) if streamed else None
            meter = CpuMeter(sluice)
            plain_meter = CpuMeter(plain) if plain is not None else None
            all_meter = CpuMeter(every_sluice) if every_sluice is not None else None
            profile = Profile(sluice.pid, args.profile, "sluice") if args.profile else None
            paths: dict[str, Callable[[], dict[str, Any]]] = {
                "direct": lambda: java_consume(tools, broker.bootstrap, topic, records)}
            if plain is not None and plain_meter is not None:
                paths["passthrough"] = lambda: plain_meter.measure(
                    lambda: java_consume(tools, plain.bootstrap, topic, records))
            else:  # the relays' consume runs where Sluice's goals are theirs
                paths["bare"] = lambda: bare.measure(lambda: java_consume(tools, bare.bootstrap, topic, records))
                paths["haproxy"] = lambda: haproxy.measure(
                    lambda: java_consume(tools, haproxy.bootstrap, topic, records))
            if every_sluice is not None and all_meter is not None:
                paths["all"] = lambda: all_meter.measure(
                    lambda: java_consume(tools, every_sluice.bootstrap, topic, records))
            paths["sluice"] = lambda: meter.measure(lambda: java_consume(tools, sluice.bootstrap, topic, records))
            java = abba(paths, "java-consumer-perf", budget, args.smoke)
            # CPU per GiB of records, as the consumer counted them, for Sluice and the relays
            per_gib_records = {"sluice": per_gib(meter.cpu_s, meter.mib)}
            if plain_meter is not None:
                per_gib_records["passthrough"] = per_gib(plain_meter.cpu_s, plain_meter.mib)
                if all_meter is not None:
                    per_gib_records["all"] = per_gib(all_meter.cpu_s, all_meter.mib)
            else:  # the relays consumed only without policies
                per_gib_records |= {"bare": per_gib(bare.cpu_s, bare.mib),
                                    "haproxy": per_gib(haproxy.cpu_s, haproxy.mib)}
            emit({"bench": "passthrough", "measure": "cpu_per_gib_records", "client": "java-consumer-perf",
                  **{path: round(x, 3) for path, x in per_gib_records.items()}})
            left = max(10.0, budget.left() / 3)
            abba({
                "direct": lambda: confluent_consume(broker.bootstrap, topic, ends, left, checks),
                "sluice": lambda: meter.measure(lambda: confluent_consume(sluice.bootstrap, topic, ends, left,
                                                                          checks)),
            }, "confluent-kafka", budget, args.smoke)
            cpu_s_per_gib = meter.cpu_s / (meter.bytes / GIB) if meter.bytes else float("nan")
            faults_per_gib = meter.faults / (meter.bytes / GIB) if meter.bytes else float("nan")
            emit({"bench": "passthrough", "measure": "sluice_cpu", "cpu_s": round(meter.cpu_s, 3),
                  "gib_relayed": round(meter.bytes / GIB, 3), "cpu_s_per_gib": round(cpu_s_per_gib, 3),
                  "minor_faults_per_gib": round(faults_per_gib)})

            lat_topic = f"bench-lat-{uuid.uuid4().hex[:8]}"
            create_topic(broker.bootstrap, lat_topic)
            # CPU per round trip of each relay over the same sends (user + system, rig/cpu.py)
            pids = {"sluice": meter.proc.pid, "bare": bare.ps.pid, "haproxy": haproxy.ps.pid}
            bootstraps = {"direct": broker.bootstrap, "sluice": sluice.bootstrap, "bare": bare.bootstrap,
                          "haproxy": haproxy.bootstrap}
            if plain is not None and plain_meter is not None:
                pids["passthrough"] = plain_meter.proc.pid
                bootstraps["passthrough"] = plain.bootstrap
            if every_sluice is not None and all_meter is not None:
                pids["all"] = all_meter.proc.pid
                bootstraps["all"] = every_sluice.bootstrap
            cpu0 = {path: cpu_seconds(pid) for path, pid in pids.items()}
            latency = produce_latency(bootstraps, lat_topic, args.latency_records, warmup=200, budget=budget,
                                      acked=acked)
            sends = args.latency_records + 200
            cpu_us = {path: round((cpu_seconds(pid) - cpu0[path]) / sends * 1e6, 1) for path, pid in pids.items()}
            for path, percentiles in latency.items():
                emit({"bench": "passthrough", "measure": "produce_latency", "client": "confluent-kafka",
                      "path": path, **percentiles})
            added = {path: round(latency[path]["p50_ms"] - latency["direct"]["p50_ms"], 4)
                     for path in latency if path != "direct"}
            added_p99 = {path: round(latency[path]["p99_ms"] - latency["direct"]["p99_ms"], 4)
                         for path in latency if path != "direct"}
            emit({"bench": "passthrough", "measure": "produce_latency", "added_p50_ms": added,
                  "added_p99_ms": added_p99, "cpu_us_per_send": cpu_us})
            counts = sluice_api_counts(sluice)
            emit({"bench": "passthrough", "measure": "sluice_requests", "note": "APIs/versions the clients "
                  "used; rewritten = responses Sluice decoded and re-encoded instead of streaming", **counts})
            if profile is not None:
                emit({"bench": "passthrough", "measure": "profile", "policies": args.policies,
                      "note": "CPU per request served, by part of Sluice (py-spy attached: not the bench's "
                              "figures)", **profile.stop(sluice_total(sluice, "sluice_requests_total"))})
            if access_log is not None:
                with access_log.open() as f:
                    logged = sum(1 for _ in f)
                emit({"bench": "passthrough", "measure": "access_log", "lines": logged})
            stop_checked(sluice)
            if plain is not None:
                stop_checked(plain)
            if every_sluice is not None:
                stop_checked(every_sluice)
        stored = check_stored(broker.bootstrap, lat_topic, acked)
    tools.close()
    emit({"bench": "passthrough", "event": "done", "elapsed_s": round(time.monotonic() - t_start, 1)})
    consume = {path: round(mb / java["direct"], 3) for path, mb in java.items() if path != "direct"}
    figures: dict[str, Any] = {
        "policies": args.policies, "batch_size": args.batch_size,
        "consume_ratio": consume["sluice"], "added_p50_ms": added["sluice"], "added_p99_ms": added_p99["sluice"],
        "sluice_cpu_us_per_send": cpu_us["sluice"],
        "bare_added_p50_ms": added["bare"], "bare_added_p99_ms": added_p99["bare"],
        "bare_cpu_us_per_send": cpu_us["bare"],
        "haproxy_added_p50_ms": added["haproxy"], "haproxy_added_p99_ms": added_p99["haproxy"],
        "haproxy_cpu_us_per_send": cpu_us["haproxy"],
        "added_p50_over_bare_ms": round(added["sluice"] - added["bare"], 4),
        "cpu_per_send_vs_bare": ratio(cpu_us["sluice"], cpu_us["bare"]),
        "cpu_s_per_gib": round(cpu_s_per_gib, 3), "minor_faults_per_gib": round(faults_per_gib),
        "sluice_cpu_s_per_gib_records": round(per_gib_records["sluice"], 3)}
    if every:
        figures |= {
            "passthrough_ratio": consume["passthrough"],
            "consume_vs_passthrough": ratio(consume["sluice"], consume["passthrough"]),
            "passthrough_added_p50_ms": added["passthrough"], "passthrough_cpu_us_per_send": cpu_us["passthrough"],
            "cpu_per_send_vs_passthrough": ratio(cpu_us["sluice"], cpu_us["passthrough"]),
            "passthrough_cpu_s_per_gib_records": round(per_gib_records["passthrough"], 3)}
        if streamed:  # every policy, terminate included (collected), in the same rounds
            figures |= {
                "all_ratio": consume["all"], "all_vs_passthrough": ratio(consume["all"], consume["passthrough"]),
                "all_added_p50_ms": added["all"], "all_cpu_us_per_send": cpu_us["all"],
                "all_cpu_per_send_vs_passthrough": ratio(cpu_us["all"], cpu_us["passthrough"]),
                "all_cpu_s_per_gib_records": round(per_gib_records["all"], 3)}
    else:
        figures |= {
            "bare_relay_ratio": consume["bare"], "haproxy_ratio": consume["haproxy"],
            "consume_vs_bare": ratio(consume["sluice"], consume["bare"]),
            "bare_cpu_s_per_gib_records": round(per_gib_records["bare"], 3),
            "haproxy_cpu_s_per_gib_records": round(per_gib_records["haproxy"], 3),
            "cpu_vs_bare_relay": ratio(per_gib_records["sluice"], per_gib_records["bare"])}
    line = summary("passthrough", figures, GOALS_ALL_POLICIES if every else GOALS, check=sum(checks, stored))
    emit(line)
    return exit_status(line, args.check)


if __name__ == "__main__":
    raise SystemExit(main())
