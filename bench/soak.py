"""Soak: Sluice as a subprocess under steady mixed load for a long while; are its memory and descriptors flat?

``python -m bench.soak [--minutes 10] [--interval-s 60] [--rate 300] [--upstream HOST:PORT]``

One rig broker (or ``--upstream``, whose node 1 must be its bootstrap), one Sluice subprocess in front of it
(``python -m proxy run``, access log off) with a configuration that puts each kind of client on another path:
the confluent-kafka consumer's fetches in ``[sessions] mode = "terminate"`` (Sluice runs its upstream fetch
session), the kafka-python consumer's under a ``[size_limit]`` budget (responses decoded, held, re-encoded, with
``global_max_bytes``), the rest relayed. Through Sluice, at bounded rates, for the whole run:

- two producers, ``--rate`` records/s each (1 KiB values, 6 partitions): confluent-kafka (idempotent, acks=all)
  and kafka-python (acks=1);
- two consumers in their own groups reading everything: confluent-kafka and kafka-python;
- connection churn: 10 short-lived raw connections a second (connect, ApiVersions, Metadata, close), so a leak
  per connection would show.

Every ``--interval-s`` (a minute by default) one JSON line: Sluice's RSS (psutil), open fds, p99 request
latency over that interval (from the per-interval deltas of the buckets of Sluice's
``sluice_request_latency_seconds`` histogram, interpolated within a bucket as Prometheus' histogram_quantile
does), separately for Produce and for everything but Fetch (a Fetch's latency is mostly the broker's long-poll
wait, so it is reported apart), CPU seconds (user + system) per GiB Sluice wrote (``sluice_bytes_total``
proxy_to_client + proxy_to_upstream), the records produced and consumed, and per second the milliseconds Sluice's
loop thread ran and waited for a core (``loop_run_ms_per_s``, ``loop_runq_wait_ms_per_s``: Linux's schedstat),
the machine's share of a wait at Sluice.

Each line also carries p999 (all but Fetch, and Produce) and ``tail_by_api``: per API, its requests in the interval,
its p99 and how many took longer than the goal (5 ms): which requests make the tail. Sluice's histogram times a
request from its last byte read to its response handed over, the broker's time included, so ``probe`` separates the
two: 20 times a second one Metadata request through Sluice, the same through the bare relay (rig/bare_relay.py, the
least a Python relay does: bytes in, bytes out, on the same event loop) and straight to the broker, in turn, timed
by the client, a process of its own; per path p50/p99/p999, ``added_*_ms``, what the Sluice path adds, and
``bare_added_*_ms``, what any relay's two extra hops add on this machine at that moment (:class:`Probe`); and under
``probe.produce`` the same figures for a Produce (acks=all, one 1 KiB record to the load's topic, which the consumers'
check leaves out) sent the same way, so a minute whose p99 misses the goal shows whether the broker's Produce time
alone (``direct_p99_ms``) does.
``--profile DIR``: py-spy samples Sluice for the whole run (bench/support/profiling.py: ``DIR/soak.raw``,
``DIR/soak.json``, one ``profile`` line).

After the run the producers stop, the consumers drain, and one line reports per consumer, record by record
(partition, offset and key, as the producers' acknowledgements gave them), the acknowledged records it never got
(``lost``), those it got twice (``duplicated``), those that arrived after a later one of their partition
(``out_of_order``) and any never acknowledged (``unexpected``). The last line is
``{"summary": "soak", "rss_growth_mb": ..., "fd_growth": ..., "p99_ms_last_minute": ..., "p99_ms_max_after_first":
..., "p999_ms_max_after_first": ..., "probe_added_p99_ms_max_after_first": ...,
"probe_bare_added_p99_ms_max_after_first": ..., "probe_produce_direct_p99_ms_max_after_first": ...,
"probe_produce_added_p99_ms_max_after_first": ..., "cpu_s_per_gib": ..., "goals", "met", "lost", "duplicated",
"out_of_order", "unexpected", "errors", "correct"}`` (bench/support/verdict.py): growth from the end of the first
interval (warm-up) to the end of the last, the last interval's p99 (all but Fetch), the highest p99 and p999 of the
intervals after the first, the highest p99 the probe's Sluice path added after the first and, beside it (no goal),
the bare relay's path's, the probe's Produce: the highest p99 straight to the broker and the highest Sluice added
(no goals), CPU per GiB over every interval after the first; the check over both consumers, and
``errors``: a producer's failures, the churn's or the probe's. The exit status is 1 when the check fails or
anything failed. Goals (``met``; ``--check`` exits 1 when one is missed): p99 <= 5 ms every minute after the first,
the probe's added p99 <= 0.5 ms every minute after the first, RSS and fds flat after the warm-up (RSS within 1 MB).
``--smoke``: 12 s in three intervals, 50 records/s per producer.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import math
import multiprocessing
import socket
import struct
import tempfile
import threading
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, KafkaError, Producer
from confluent_kafka import Message as CkMessage
from kafka import KafkaConsumer, KafkaProducer
from prometheus_client.parser import text_string_to_metric_families

from bench.passthrough import BareRelay
from bench.support import verdict
from bench.support.profiling import Profile
from bench.support.verdict import Delivery, at_most, delivery, emit
from proxy.wire import records as wire_records
from proxy.wire.messages import decode_response, encode_request, request_codec
from proxy.wire.model import Message
from rig.kafka import KafkaBroker, free_ports
from rig.kafka_python_group import wait_partitions_known
from rig.raw import recv_exact
from rig.sluice_process import SluiceProcess
from rig.topics import create_topic

GIB = float(1 << 30)
MIB = float(1 << 20)
PARTITIONS = 6
VALUE_BYTES = 1024
CHURN_PER_S = 10
PROBE_EVERY_S = 0.05  # 20 probes a second per path: ~1200 a minute, enough for a p99 (a p999 is a few samples)
PROBE_PRODUCE_VERSION = 10
#: the probe's Produce goes every 4th round (5 a second per path, ~300 a minute): the ones through Sluice count in the
#: p99 the goal judges, and more would dilute the load's ~4,200 a minute
PRODUCE_EVERY = 4
PROBE_KEY = b"soak-probe"  # the key of the probe's records, which the consumers' check leaves out
LATENCY = "sluice_request_latency_seconds"
#: what Sluice wrote: to clients and to brokers
WRITTEN = ("proxy_to_client", "proxy_to_upstream")
#: the size budget of the kafka-python consumer (client.id soak-kp*), and the bound on response bytes held
CONFIG_TOML = """
[sessions]
mode = "passthrough"
[[sessions.clients]]
client_id = "soak-ck*"
mode = "terminate"

[size_limit]
global_max_bytes = 33554432
[[size_limit.budgets]]
client_id = "soak-kp*"
fetch_max_bytes = 262144
partition_max_bytes = 65536
"""


# ------------------------------------------------------------------------------------------ the analysis


Buckets = dict[float, float]  # upper bound (le) -> cumulative count


def latency_buckets(metrics_text: str, exclude: Iterable[str] = (), only: Iterable[str] = ()) -> Buckets:
    """The cumulative buckets of ``sluice_request_latency_seconds`` summed over its ``api`` label values
    (all of them but ``exclude``, or just ``only``)."""
    skip, keep = set(exclude), set(only)
    out: Buckets = {}
    for family in text_string_to_metric_families(metrics_text):
        if family.name != LATENCY:
            continue
        for sample in family.samples:
            if sample.name != LATENCY + "_bucket":
                continue
            api = sample.labels.get("api", "")
            if api in skip or (keep and api not in keep):
                continue
            le = float(sample.labels["le"])
            out[le] = out.get(le, 0.0) + float(sample.value)
    return out


def delta(after: Buckets, before: Buckets) -> Buckets:
    return {le: after[le] - before.get(le, 0.0) for le in after}


def quantile(q: float, buckets: Buckets) -> float | None:
    """The q-quantile (seconds) of a cumulative histogram, as Prometheus' histogram_quantile computes it: linear
    interpolation within the bucket holding the rank; the highest finite bound when the rank falls in +Inf; None
    without observations."""
    bounds = sorted(buckets)
    if not bounds or buckets[bounds[-1]] <= 0:
        return None
    total = buckets[bounds[-1]]
    rank = q * total
    prev_le, prev_count = 0.0, 0.0
    for le in bounds:
        count = buckets[le]
        if count >= rank:
            if math.isinf(le):
                return prev_le
            if count == prev_count:
                return le
            return prev_le + (le - prev_le) * (rank - prev_count) / (count - prev_count)
        prev_le, prev_count = le, count
    return prev_le


@dataclass
class Sample:
    """Sluice as seen at the end of an interval."""

    t: float
    rss: int
    fds: int
    cpu_s: float
    written: float
    requests: float
    all_but_fetch: Buckets
    produce: Buckets
    fetch: Buckets
    #: per API, its own buckets: which requests make the tail
    by_api: dict[str, Buckets] = field(default_factory=dict)
    #: the probe's figures for the interval ending here (Probe.take)
    probe: dict[str, Any] = field(default_factory=dict)
    produced: int = 0
    consumed: dict[str, int] = field(default_factory=dict)
    #: Sluice's loop thread (its main thread): nanoseconds on a core and waiting for one (:func:`loop_schedstat`)
    loop_sched: tuple[int, int] | None = None


def loop_schedstat(pid: int) -> tuple[int, int] | None:
    """(ns run, ns waiting on a run queue) of process ``pid``'s main thread, from Linux's /proc/PID/schedstat
    (Documentation/scheduler/sched-stats.rst); None where there is none."""
    try:
        run_ns, wait_ns, _slices = Path(f"/proc/{pid}/schedstat").read_text().split()
    except (OSError, ValueError):
        return None
    return int(run_ns), int(wait_ns)


def sample_of(t: float, rss: int, fds: int, cpu_s: float, metrics_text: str) -> Sample:
    written = 0.0
    requests = 0.0
    apis: set[str] = set()
    for family in text_string_to_metric_families(metrics_text):
        for s in family.samples:
            if s.name == "sluice_bytes_total" and s.labels.get("direction") in WRITTEN:
                written += float(s.value)
            elif s.name == "sluice_requests_total":
                requests += float(s.value)
                apis.add(s.labels["api"])
    return Sample(t, rss, fds, cpu_s, written, requests,
                  latency_buckets(metrics_text, exclude=("Fetch",)),
                  latency_buckets(metrics_text, only=("Produce",)),
                  latency_buckets(metrics_text, only=("Fetch",)),
                  {api: latency_buckets(metrics_text, only=(api,)) for api in sorted(apis)})


#: the soak's latency goal for every request but Fetch: p99 at most this, every minute after the first
P99_GOAL_S = 0.005


def over(bound: float, buckets: Buckets) -> int:
    """Observations above ``bound`` (one of the histogram's bucket bounds)."""
    if not buckets:
        return 0
    return int(max(buckets.values()) - buckets.get(bound, 0.0))


def tail_by_api(prev: Sample, cur: Sample) -> dict[str, dict[str, Any]]:
    """Per API (but Fetch) with requests in the interval: count, p99, and how many took over the goal."""
    out: dict[str, dict[str, Any]] = {}
    for api, buckets in cur.by_api.items():
        if api == "Fetch":
            continue
        d = delta(buckets, prev.by_api.get(api, {}))
        n = int(max(d.values())) if d else 0
        if n:
            out[api] = {"requests": n, "p99_ms": _ms(quantile(0.99, d)), "over_goal": over(P99_GOAL_S, d)}
    return out


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000.0, 3)


def loop_share(prev: Sample, cur: Sample) -> dict[str, float | None]:
    """Per second of the interval, the milliseconds Sluice's loop thread ran and waited for a core while it could
    run: time a request through Sluice waits that is the machine's (other processes on the cores), not the loop's
    work."""
    if prev.loop_sched is None or cur.loop_sched is None or cur.t <= prev.t:
        return {"loop_run_ms_per_s": None, "loop_runq_wait_ms_per_s": None}
    seconds = cur.t - prev.t
    return {"loop_run_ms_per_s": round((cur.loop_sched[0] - prev.loop_sched[0]) / 1e6 / seconds, 1),
            "loop_runq_wait_ms_per_s": round((cur.loop_sched[1] - prev.loop_sched[1]) / 1e6 / seconds, 1)}


def interval_line(n: int, prev: Sample, cur: Sample) -> dict[str, Any]:
    """One interval's figures (the per-minute line)."""
    cpu = cur.cpu_s - prev.cpu_s
    gib = (cur.written - prev.written) / GIB
    return {
        "bench": "soak", "interval": n, "minute": round(cur.t / 60.0, 2),
        "rss_mb": round(cur.rss / MIB, 2), "fds": cur.fds,
        "p99_ms": _ms(quantile(0.99, delta(cur.all_but_fetch, prev.all_but_fetch))),
        "p999_ms": _ms(quantile(0.999, delta(cur.all_but_fetch, prev.all_but_fetch))),
        "produce_p99_ms": _ms(quantile(0.99, delta(cur.produce, prev.produce))),
        "produce_p999_ms": _ms(quantile(0.999, delta(cur.produce, prev.produce))),
        "fetch_p99_ms": _ms(quantile(0.99, delta(cur.fetch, prev.fetch))),
        **loop_share(prev, cur),
        "tail_by_api": tail_by_api(prev, cur),
        "probe": cur.probe,
        "requests": int(cur.requests - prev.requests),
        "mib_written": round((cur.written - prev.written) / MIB, 2),
        "cpu_s": round(cpu, 3),
        "cpu_s_per_gib": round(cpu / gib, 2) if gib > 0 else None,
        "records_produced": cur.produced - prev.produced,
        "records_consumed": {k: v - prev.consumed.get(k, 0) for k, v in cur.consumed.items()},
    }


#: the soak's goals: p99 (all but Fetch) at most 5 ms every minute after the first; what Sluice adds to the probe's
#: p99 (the same Metadata request through Sluice and straight to the broker, in the same minute) at most 0.5 ms
#: every minute after the first, which the broker's Produce times cannot decide; RSS and fds flat after the
#: warm-up (RSS within 1 MB: the allocator's arenas settle by a fraction of that over ten minutes)
GOALS = {"p99_ms_max_after_first": at_most(P99_GOAL_S * 1000.0),
         "probe_added_p99_ms_max_after_first": at_most(0.5), "rss_growth_mb": at_most(1.0),
         "fd_growth": at_most(0)}


def summary(samples: list[Sample], check: Delivery, errors: Sequence[str] = ()) -> dict[str, Any]:
    """Growth from the end of the first interval (warm-up) to the end of the last; the last interval's p99 (all but
    Fetch); CPU per GiB over the intervals after the first; the goals; the check, what the consumers got of the
    records acknowledged (``check``), and what failed along the way (``errors``: a producer's failure, the churn's
    or the probe's). ``samples[0]`` is the state before the first interval."""
    if len(samples) < 2:
        raise ValueError("a soak needs at least one interval")
    warm = samples[1] if len(samples) > 2 else samples[0]
    last = samples[-1]
    gib = (last.written - warm.written) / GIB
    # the minutes after the first (warm-up); a one-interval soak has only that one
    after_first = list(itertools.pairwise(samples[1:])) or [(samples[0], samples[1])]
    p99s = [quantile(0.99, delta(b.all_but_fetch, a.all_but_fetch)) for a, b in after_first]
    p999s = [quantile(0.999, delta(b.all_but_fetch, a.all_but_fetch)) for a, b in after_first]
    return verdict.summary("soak", {
        "minutes": round((last.t - samples[0].t) / 60.0, 2),
        "rss_growth_mb": round((last.rss - warm.rss) / MIB, 2),
        "fd_growth": last.fds - warm.fds,
        "p99_ms_last_minute": _ms(quantile(0.99, delta(last.all_but_fetch, samples[-2].all_but_fetch))),
        # an interval without an observation has no p99, and cannot meet the goal
        "p99_ms_max_after_first": None if None in p99s else _ms(max(p for p in p99s if p is not None)),
        "p999_ms_max_after_first": _ms(max((p for p in p999s if p is not None), default=None)),
        # likewise a minute without the probe's figures cannot meet its goal
        "probe_added_p99_ms_max_after_first": _probe_max(after_first, "added_p99_ms"),
        # beside it, no goal: what the bare relay's path added in the same minutes (the machine's part of a relay's)
        "probe_bare_added_p99_ms_max_after_first": _probe_max(after_first, "bare_added_p99_ms"),
        # and no goal: the broker's own Produce tail (straight to it) and what Sluice added to it, in those minutes
        "probe_produce_direct_p99_ms_max_after_first": _probe_max(after_first, "direct_p99_ms", "produce"),
        "probe_produce_added_p99_ms_max_after_first": _probe_max(after_first, "added_p99_ms", "produce"),
        "cpu_s_per_gib": round((last.cpu_s - warm.cpu_s) / gib, 2) if gib > 0 else None,
    }, GOALS, check=check, errors=errors)


def _probe_max(minutes: Sequence[tuple[Sample, Sample]], figure: str, request: str | None = None) -> float | None:
    """The highest of a probe's figure (of its Metadata requests, or of ``request``'s under that key) over the
    minutes, each ``(before, after)``; None when a minute lacks it."""
    figures = [(b.probe if request is None else b.probe.get(request, {})).get(figure) for _, b in minutes]
    return None if None in figures else max(f for f in figures if f is not None)


# ------------------------------------------------------------------------------------------ the load


class Load:
    """The producers, consumers and connection churn, each in a thread; paced, bounded, stopped by ``stop()``."""

    def __init__(self, bootstrap: str, topic: str, rate: int) -> None:
        self.bootstrap, self.topic, self.rate = bootstrap, topic, rate
        self._lock = threading.Lock()
        #: the records acknowledged to either producer, and each consumer's in the order it got them: (partition,
        #: offset, key)
        self.acked: list[Record] = []
        self.received: dict[str, list[Record]] = {"ck": [], "kp": []}
        self.errors: list[str] = []
        self.churned = 0
        self._producing = threading.Event()
        self._producing.set()
        self._consuming = threading.Event()
        self._consuming.set()
        roles = (("soak-ck-producer", self._ck_produce), ("soak-kp-producer", self._kp_produce),
                 ("soak-ck-consumer", self._ck_consume), ("soak-kp-consumer", self._kp_consume),
                 ("soak-churn", self._churn))
        self._threads = [threading.Thread(target=self._guard, args=(fn,), name=name, daemon=True)
                         for name, fn in roles]
        for t in self._threads:
            t.start()

    @property
    def produced(self) -> int:
        return len(self.acked)

    def consumed(self) -> dict[str, int]:
        return {k: len(v) for k, v in self.received.items()}

    def _guard(self, fn: Any) -> None:
        try:
            fn()
        except BaseException as e:  # reported in the final line
            with self._lock:
                self.errors.append(f"{threading.current_thread().name}: {e!r}")

    def _paced(self, send: Any) -> None:
        """``send(seq)`` at ``rate`` per second, in ticks of 100 ms, until the producers stop."""
        start = time.monotonic()
        seq = 0
        tick = 0
        while self._producing.is_set():
            tick += 1
            due = tick * self.rate // 10
            while seq < due:
                send(seq)
                seq += 1
            # pacing (a rate), not a synchronisation: the next tick is due 100 ms after the previous one
            time.sleep(max(0.0, start + tick * 0.1 - time.monotonic()))

    def _value(self, key: str) -> bytes:
        return (key.encode() + b"|") * (VALUE_BYTES // (len(key) + 1)) + b"."

    def _ck_produce(self) -> None:
        producer = Producer({"bootstrap.servers": self.bootstrap, "client.id": "soak-producer-ck",
                             "enable.idempotence": True, "acks": "all", "linger.ms": 5})

        def delivered(err: KafkaError | None, msg: CkMessage) -> None:
            if err is not None:
                self.errors.append(f"ck producer: {err}")
            else:
                key, partition, offset = msg.key(), msg.partition(), msg.offset()
                assert key is not None and partition is not None and offset is not None
                self.acked.append((partition, offset, key.decode()))

        def send(seq: int) -> None:
            key = f"ck-{seq}"
            producer.produce(self.topic, key=key.encode(), value=self._value(key), on_delivery=delivered)
            producer.poll(0)

        self._paced(send)
        if left := producer.flush(60):
            self.errors.append(f"ck producer: {left} records unacknowledged")

    def _kp_produce(self) -> None:
        producer = KafkaProducer(bootstrap_servers=self.bootstrap, client_id="soak-producer-kp", acks=1,
                                 linger_ms=5)

        def send(seq: int) -> None:
            key = f"kp-{seq}"
            future = producer.send(self.topic, key=key.encode(), value=self._value(key))
            future.add_callback(lambda md, k=key: self.acked.append((md.partition, md.offset, k)))
            future.add_errback(lambda e: self.errors.append(f"kp producer: {e!r}"))

        try:
            self._paced(send)
            producer.flush(60)
        finally:
            producer.close(10)

    def _record(self, kind: str, key: bytes | None, partition: int, offset: int) -> None:
        if key == PROBE_KEY:
            return  # the probe's Produce: no producer of the load acknowledged it (Probe)
        self.received[kind].append((partition, offset, (key or b"").decode()))

    def _ck_consume(self) -> None:
        consumer = Consumer({"bootstrap.servers": self.bootstrap, "client.id": "soak-ck-consumer",
                             "group.id": f"soak-ck-{self.topic}", "auto.offset.reset": "earliest",
                             "enable.auto.commit": True, "fetch.wait.max.ms": 200})
        consumer.subscribe([self.topic])
        try:
            while self._consuming.is_set():
                for m in consumer.consume(num_messages=1000, timeout=0.5):
                    partition, offset = m.partition(), m.offset()
                    if m.error() is None and partition is not None and offset is not None:
                        self._record("ck", m.key(), partition, offset)
        finally:
            consumer.close()

    def _kp_consume(self) -> None:
        consumer = KafkaConsumer(self.topic, bootstrap_servers=self.bootstrap, client_id="soak-kp-consumer",
                                 group_id=f"soak-kp-{self.topic}", auto_offset_reset="earliest",
                                 enable_auto_commit=True, fetch_max_wait_ms=200)
        try:
            wait_partitions_known(consumer, self.topic, PARTITIONS)  # kafka-python's join bug: see the helper
            while self._consuming.is_set():
                for msgs in consumer.poll(timeout_ms=500).values():
                    for m in msgs:
                        self._record("kp", m.key, m.partition, m.offset)
        finally:
            consumer.close()

    def _churn(self) -> None:
        host, _, port = self.bootstrap.rpartition(":")
        frames = _churn_frames(self.topic)
        start = time.monotonic()
        n = 0
        while self._producing.is_set():
            for _ in range(CHURN_PER_S):
                with socket.create_connection((host, int(port)), timeout=30) as s:
                    for correlation_id, frame in enumerate(frames, start=1):
                        s.sendall(frame)
                        size = struct.unpack(">i", recv_exact(s, 4))[0]
                        if struct.unpack(">i", recv_exact(s, size)[:4])[0] != correlation_id:
                            raise RuntimeError("churn: answer out of order")
                self.churned += 1
            n += 1
            time.sleep(max(0.0, start + n - time.monotonic()))  # pacing: CHURN_PER_S connections a second

    def stop_producing(self) -> None:
        self._producing.clear()
        for t in self._threads[:2] + self._threads[4:]:
            t.join(90)

    def drain(self, timeout: float) -> None:
        """Until each consumer has seen every acknowledged record (bounded), then stop the consumers."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not all(set(self.acked) <= set(r) for r in self.received.values()):
            time.sleep(0.2)  # bounded poll of a real condition (the consumers catching up)
        self._consuming.clear()
        for t in self._threads[2:4]:
            t.join(60)

    def check(self) -> dict[str, Delivery]:
        """Per consumer, what it got of the records acknowledged to either producer, partition by partition in
        offset order."""
        return {k: delivery(by_partition(sorted(self.acked)), by_partition(r)) for k, r in self.received.items()}

    def outcome(self) -> dict[str, Any]:
        return {"bench": "soak", "records_acknowledged": len(self.acked), "connections_churned": self.churned,
                **{f"{k}_consumer": {"consumed": len(self.received[k]), **d.fields()}
                   for k, d in self.check().items()},
                "errors": self.errors[:10]}


#: a record as the producers' acknowledgements and the consumers give it: (partition, offset, key)
Record = tuple[int, int, str]


def by_partition(records: Iterable[Record]) -> dict[int, list[tuple[int, str]]]:
    """(offset, key) per partition, in the order given."""
    out: dict[int, list[tuple[int, str]]] = {}
    for partition, offset, key in records:
        out.setdefault(partition, []).append((offset, key))
    return out


def _churn_frames(topic: str) -> list[bytes]:
    out = []
    for correlation_id, (key, version, body) in enumerate((
            (18, 3, request_codec(18, 3).default().replace(client_software_name="soak",
                                                          client_software_version="1")),
            (3, 12, request_codec(3, 12).default().replace(topics=[Message(topic_id=bytes(16), name=topic)],
                                                           allow_auto_topic_creation=False,
                                                           include_topic_authorized_operations=False))), start=1):
        header = Message(request_api_key=key, request_api_version=version, correlation_id=correlation_id,
                         client_id="soak-churn")
        frame = encode_request(header, body)
        out.append(struct.pack(">i", len(frame)) + frame)
    return out


def _probe_produce_frame(topic: str) -> bytes:
    """The probe's Produce, size prefix and all: v10 (the KIP-951 skim's path through Sluice), acks=all as the
    idempotent producer's, one record of the load's size (key ``PROBE_KEY``) to partition 0 of ``topic``; sent again
    each time (no producer id: each is appended anew)."""
    batch = wire_records.encode_batch(wire_records.new_batch([wire_records.Record(key=PROBE_KEY,
                                                                                  value=b"p" * VALUE_BYTES)]))
    body = request_codec(0, PROBE_PRODUCE_VERSION).default().replace(acks=-1, timeout_ms=30000, topic_data=[
        Message(name=topic, partition_data=[Message(index=0, records=batch)])])
    frame = encode_request(Message(request_api_key=0, request_api_version=PROBE_PRODUCE_VERSION,
                                   correlation_id=3, client_id="soak-probe"), body)
    return struct.pack(">i", len(frame)) + frame


def _produce_refused(answer: bytes) -> str | None:
    """What a probe's Produce answer refused, if it did (an error code other than NONE)."""
    _header, body = decode_response(0, PROBE_PRODUCE_VERSION, answer)
    codes = [p.error_code for t in body.responses for p in t.partition_responses]
    return None if codes == [0] else f"Produce answered error codes {codes}"


def _probe_process(conn: Connection, addresses: dict[str, str], requests: dict[str, tuple[bytes, int]]) -> None:
    """The probe's own process: every ``PROBE_EVERY_S`` each request due (``requests``: by name, size prefix and all,
    and every how many rounds it goes) on each path's connection, the order of the paths turning each round, each
    timed (send to whole answer), until told ``"stop"``; each ``"take"`` answered with the samples (seconds, per
    request and path) since the last one and the error that ended the rounds, if one did (a Produce refused ends
    them too: its time is not the broker's append)."""
    def fresh() -> dict[str, dict[str, list[float]]]:
        return {r: {p: [] for p in addresses} for r in requests}

    samples = fresh()
    error: str | None = None
    stopped = False

    def answer(block: bool) -> None:
        nonlocal samples, stopped
        while not stopped and (block or conn.poll()):
            if conn.recv() != "take":
                stopped = True
                return
            conn.send((samples, error))
            samples = fresh()

    socks: dict[str, socket.socket] = {}
    try:
        for path, address in addresses.items():
            host, _, port = address.rpartition(":")
            socks[path] = socket.create_connection((host, int(port)), timeout=30)
            socks[path].setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        paths = tuple(addresses)
        n = 0
        start = time.monotonic()
        while not stopped and error is None:
            turn = n % len(paths)
            for request, (frame, every) in requests.items():
                if n % every:
                    continue
                for path in paths[turn:] + paths[:turn]:  # each path first, middle and last in turn
                    s = socks[path]
                    t0 = time.perf_counter()
                    s.sendall(frame)
                    size = struct.unpack(">i", recv_exact(s, 4))[0]
                    reply = recv_exact(s, size)
                    samples[request][path].append(time.perf_counter() - t0)
                    if request == "produce":
                        error = error or _produce_refused(reply)
            n += 1
            time.sleep(max(0.0, start + n * PROBE_EVERY_S - time.monotonic()))  # pacing
            answer(block=False)
    except OSError as e:
        error = f"{type(e).__name__}: {e}"
    finally:
        for s in socks.values():
            s.close()
    answer(block=True)  # the rounds ended on an error: each take still answered, until told to stop


class Probe:
    """Sluice's own share of the tail, measured beside the broker's: every ``PROBE_EVERY_S`` one Metadata request
    (the churn's, decoded and rewritten by Sluice) on a connection through Sluice, the same on one through the bare
    relay and on one straight to the broker, the order turning each round, each timed by the client (send to whole
    answer). The three see the same broker, machine and moment, so what the Sluice path adds is Sluice's (and its
    loop's), and what the bare relay's adds is what any relay's two more hops cost here then: a process woken
    twice more per request, on cores the broker and the clients share. A Produce (:func:`_probe_produce_frame`) goes
    the three ways every ``PRODUCE_EVERY`` rounds, after the Metadata requests, to the load's topic: appending there
    completes the consumers' fetches waiting in the broker's purgatory on the Produce's own request thread, as the
    load's Produce requests do (the consumers leave its records out), so its time straight to the broker is the
    broker's own Produce tail, which Sluice's histogram counts in the soak's p99.

    The client is a process of its own that does nothing else (:func:`_probe_process`). A thread of the bench's
    process waited for the GIL behind the kafka-python clients' threads whenever an answer arrived (up to the 5 ms
    switch interval, sys.getswitchinterval), more often the longer it had waited, so more on the Sluice path: side
    by side over twelve minutes its added p50 was 0.36-3.06 ms against this process's 0.43-1.14, its added p99 the
    higher in nine, the bench's time counted as Sluice's."""

    PATHS = ("sluice", "bare", "direct")

    def __init__(self, via: str, bare: str, direct: str, topic: str) -> None:
        # correlation ids 2 and 3, reused: one request at a time on each connection
        requests = {"metadata": (_churn_frames(topic)[1], 1), "produce": (_probe_produce_frame(topic), PRODUCE_EVERY)}
        context = multiprocessing.get_context("spawn")  # not fork: the bench's process has threads
        self._conn, child = context.Pipe()
        paths = {"sluice": via, "bare": bare, "direct": direct}
        self._process = context.Process(target=_probe_process, args=(child, paths, requests), name="soak-probe",
                                        daemon=True)
        self._process.start()
        self.error: str | None = None

    def take(self) -> dict[str, Any]:
        """The interval's figures (ms): per path p50/p99/p999 and what the Sluice path adds at each, the Metadata
        requests' at the top, the Produce's under ``"produce"``."""
        self._conn.send("take")
        samples, error = self._conn.recv()
        self.error = self.error or error
        return {**probe_figures(samples["metadata"], self.error), "produce": probe_figures(samples["produce"])}

    def stop(self) -> None:
        self._conn.send("stop")
        self._process.join(30)


def probe_figures(samples: Mapping[str, list[float]], error: str | None = None) -> dict[str, Any]:
    """Per path p50/p99/p999 (ms) of the samples (seconds), and at each what the Sluice path adds to the direct
    one (``added_*``) and what the bare relay's adds (``bare_added_*``, when it was probed); only the count (and
    the error) with fewer than 10 on a path."""
    out: dict[str, Any] = {"probes": len(samples["sluice"])}
    if error is not None:
        out["error"] = error
    if min(len(v) for v in samples.values()) < 10:
        return out
    for path, xs in samples.items():
        xs = sorted(xs)
        for name, q in (("p50", 0.5), ("p99", 0.99), ("p999", 0.999)):
            out[f"{path}_{name}_ms"] = round(xs[min(len(xs) - 1, int(q * len(xs)))] * 1000.0, 3)
    for name in ("p50", "p99", "p999"):
        out[f"added_{name}_ms"] = round(out[f"sluice_{name}_ms"] - out[f"direct_{name}_ms"], 3)
        if "bare" in samples:
            out[f"bare_added_{name}_ms"] = round(out[f"bare_{name}_ms"] - out[f"direct_{name}_ms"], 3)
    return out


# ------------------------------------------------------------------------------------------ the run


def take_sample(sluice: SluiceProcess, t0: float, load: Load) -> Sample:
    s = sample_of(time.monotonic() - t0, sluice.rss_bytes(), sluice.num_fds(), sluice.cpu_seconds(),
                  sluice.metrics_text())
    s.produced, s.consumed = load.produced, load.consumed()
    s.loop_sched = loop_schedstat(sluice.pid)
    return s


def soak(upstream: str, minutes: float, interval_s: float, rate: int, env: Mapping[str, str],
         profile_dir: Path | None = None) -> tuple[list[Sample], Delivery, list[str]]:
    """The samples, what the consumers got of the records (each consumer's, added up) and what failed."""
    intervals = max(1, math.ceil(minutes * 60.0 / interval_s))
    topic = f"soak-{uuid.uuid4().hex[:8]}"
    create_topic(upstream, topic, partitions=PARTITIONS)
    with contextlib.ExitStack() as stack:
        bare = BareRelay(free_ports(1)[0], upstream)  # the probe's third path
        stack.callback(bare.stop)
        sluice = stack.enter_context(SluiceProcess(upstream, env))
        profile = Profile(sluice.pid, profile_dir, "soak") if profile_dir is not None else None
        t0 = time.monotonic()
        load = Load(sluice.bootstrap, topic, rate)
        probe = Probe(sluice.bootstrap, bare.bootstrap, upstream, topic)
        samples = [take_sample(sluice, t0, load)]
        try:
            for n in range(1, intervals + 1):
                # the reporting interval: pacing of the samples, not a synchronisation
                time.sleep(max(0.0, t0 + n * interval_s - time.monotonic()))
                samples.append(take_sample(sluice, t0, load))
                samples[-1].probe = probe.take()
                emit(interval_line(n, samples[-2], samples[-1]))
        finally:
            probe.stop()
            load.stop_producing()
            load.drain(120)
        emit(load.outcome())
        if profile is not None:
            emit({"bench": "soak", "measure": "profile", **profile.stop(samples[-1].requests - samples[0].requests)})
    errors = load.errors + ([f"probe: {probe.error}"] if probe.error else [])
    return samples, sum(load.check().values(), Delivery()), errors


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.soak", description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0, help="how long (default 10)")
    parser.add_argument("--interval-s", type=float, default=60.0, help="seconds per reported line (default 60)")
    parser.add_argument("--rate", type=int, default=300, help="records/s per producer (default 300)")
    parser.add_argument("--upstream", help="an existing broker (host:port) instead of a rig broker")
    parser.add_argument("--profile", metavar="DIR", type=Path, default=None,
                        help="sample Sluice with py-spy into DIR (soak.raw collapsed stacks, soak.json summary)")
    verdict.add_options(parser, "12 s in 3 intervals, 50 records/s per producer")
    args = parser.parse_args(argv)
    if args.smoke:
        args.minutes, args.interval_s, args.rate = 0.2, 4.0, 50
    if args.minutes <= 0 or args.interval_s <= 0 or args.rate <= 0:
        parser.error("--minutes, --interval-s and --rate must be positive")
    with tempfile.TemporaryDirectory(prefix="bench-soak-") as tmp:
        config = Path(tmp) / "sluice.toml"
        config.write_text(CONFIG_TOML)
        env = {"SLUICE_CONFIG": str(config)}
        if args.upstream:
            samples, check, errors = soak(args.upstream, args.minutes, args.interval_s, args.rate, env,
                                          args.profile)
        else:
            with KafkaBroker() as broker:
                samples, check, errors = soak(broker.bootstrap, args.minutes, args.interval_s, args.rate, env,
                                              args.profile)
    line = summary(samples, check, errors)
    emit(line)
    return verdict.exit_status(line, args.check)


if __name__ == "__main__":
    raise SystemExit(main())
