"""Client quota accuracy seen by the client: the byte rate producers and consumers achieve through Sluice's
client quotas (proxy/policies/quota, KIP-13 enforced as KIP-219), per second and per 11 s window, per client kind.

``python -m bench.quota [--seconds 33] [--rate 5] [--mib 600] [--producers confluent,kafka-python]
[--consumers kafka-python,java,confluent,java-share] [--no-unquoted] [--fleet N] [--smoke] [--check]
[--upstream HOST:PORT]``

Goal: every 11 s window after the first within +/-5% of the quota (``worst_window_error`` <= 0.05), for every
client; with ``--fleet N``, the entity's total over its N instances within +/-10% in every window
(``fleet_total_worst_window_error`` <= 0.10). The summary's ``goals`` and ``met`` say which; its ``check`` is what
the clients observed: every acknowledged record stored once (the topics' end offsets), every consumer's records
each once, in offset order per partition (``out_of_order``: a gap, a repeat or a step back), no client without
records. Exit code 1 when the check fails, and with ``--check`` also when a goal is not met.

Setup: one rig broker (real Kafka 4.x, KRaft). Each run has a fresh Sluice subprocess (rig/sluice_process.py)
with one ``[[quota.entries]]`` entry selecting ``client_id = "bench-quota-*"`` with ``produce_rate_bytes`` and
``fetch_rate_bytes`` = ``--rate`` MB/s, per client, and one client with client.id ``bench-quota-<kind>-<client>``:

- producers (``confluent``: librdkafka, ``kafka-python``), each into a topic of its own (4 partitions), 16 KiB
  records (no key) as fast as its queue takes them; a record counts when its acknowledgement reaches the
  application (the delivery callback), with its value's bytes. Afterwards the topic's end offsets must add up to
  the records acknowledged (idempotent producers: nothing lost, nothing twice), else the bench exits 1.
- consumers (bench/throttle.py's clients: ``kafka-python`` and ``java`` with incremental fetch sessions,
  ``confluent`` session-less, ``java-share`` a Java share consumer, KIP-932, alone in its share group) read a
  backlog of ``--mib`` MiB of 16 KiB records, produced once directly to the broker, from the beginning; a record
  counts when it is handed to the application, with its key + value bytes. The share consumer is held on the
  request side (MaxBytes, muting within its acquisition lock): a record cut from its response would stay acquired.

Time 0 of a run is the first record acknowledged or received (client start-up is not the quota's doing); the run
lasts ``--seconds`` after it. Figures as in bench/throttle.py: bytes per whole second, windows of 11 s after the
first (the quota's warm-up), sliding by 1 s; ``mean_bytes_s`` over seconds 11 to the end, ``ratio`` to the quota,
``worst_window_error`` = max over the windows of |window bytes / 11 s / quota - 1|. The client counts record bytes,
Sluice meters request and response frames (batch and record headers, ~0.4% more for 16 KiB records).

A request (or a response) is the quota's unit, as in Kafka: its bytes are counted at once and the throttle time
follows it, so a window can be off by about one request's bytes. The consumers read with their clients' defaults
(up to 1 MB per partition: a 4-partition response of ~4 MB is most of a second at 5 MB/s, ~7% of a window); the
producers use batches of 64 KiB (librdkafka's default, 1 MB per partition, would make 4 MB requests too).

Unquoted clients alongside (``--no-unquoted`` skips it): a confluent producer no entry selects runs through one
Sluice alone, beside a quoted producer, and beside a producer no entry selects that paces itself at the quota's
rate (the same load without a quota), in ABBA order; ``ratio`` = its rate beside the quoted one / alone, and
``ratio_vs_same_load`` = beside the quoted one / beside the self-paced one (goal: within 5%). The first counts
what no quota governs on a shared 2-core machine (the second producer's CPU, the broker's); the second is what
the quota itself costs the clients it does not select.

The Java producer is left out: its perf tool reports 5 s averages, not the records' acknowledgement times.

``--fleet N``: one entity over a fleet instead (proxy/policies/quota/shares.py): N Sluice processes, one fleet
(its control and usage topics on the broker), one ``scope = "fleet"`` entry of ``--rate`` MB/s for the client.id
``bench-quota-fleet``, and a confluent producer of that client.id on each instance, each into a topic of its own,
as fast as the quota lets it. At a third of the run the last instance's producer stops and one starts on the
first instance (its clients moved); at two thirds it moves back. The figure is the entity's total: the bytes
acknowledged to all its producers per second, its windows as above (``fleet_total_worst_window_error``); each
producer's own rate is in its line. Its check: every acknowledged record stored once.

JSON lines on stdout (logs on stderr): per run and second ``{"bench": "quota", "side", "client", "second",
"target_bytes_s", "measured_bytes_s"}``; per run ``{"bench": "quota", "side", "client", "target_bytes_s",
"mean_bytes_s", "ratio", "worst_window_error", "windows", ...}``; last line ``{"summary": "quota",
"worst_window_error": <max over every run>, "by_side": {side: {client: {...}}}, "unquoted_alongside_vs_alone",
"unquoted_alongside_vs_same_load", "out_of_order", "goals", "met", "each_partition_once_in_order", "errors",
"correct"}``
(bench/support/verdict.py: the goals above, met or not; the check: each consumer read each partition's records
once, in order, the topics hold the records acknowledged (else ``errors`` says what was lost), no client failed;
exit 1 when it fails, and with ``--check`` when a goal is missed); the unquoted runs' line
``{"bench": "quota", "side": "unquoted", "alone_bytes_s", "alongside_bytes_s", "beside_same_load_bytes_s",
"quoted_alongside_bytes_s", "paced_alongside_bytes_s", "ratio", "ratio_vs_same_load"}``; with ``--fleet``, per
second of the total ``{"bench": "quota", "side": "fleet_total", "second", ...}`` and ``{"bench": "quota", "side":
"fleet_total", "instances", "moves", "worst_window_error", ...}``. ``--smoke``: 3 s runs with one producer and one
consumer (with ``--fleet``: two instances), a 16 MiB backlog, for a quick check that it runs (no window is counted).
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from confluent_kafka import KafkaError, Producer
from kafka import KafkaProducer

from bench.support import verdict
from bench.support.verdict import Goal, at_least, at_most
from bench.throttle import (
    CLIENTS,
    GOAL,
    MB,
    PARTITIONS,
    RECORD,
    START_TIMEOUT_S,
    WINDOW,
    Arrivals,
    analyse,
    consume,
    emit,
    names_arg,
)
from bench.throttle import produce as produce_backlog
from rig.fleet import fleet_env, start_fleet
from rig.kafka import KafkaBroker, end_offsets
from rig.sluice_process import SluiceProcess
from rig.topics import create_topic

PRODUCERS = ("confluent", "kafka-python")
CLIENT_ID_PREFIX = "bench-quota-"
OUTSTANDING = 256  # records a producer has unacknowledged at most: 4 MiB, as for librdkafka's queue below
FLEET_GOAL = 0.10  # the fleet's total: every counted window within +/-10% of the quota
FLEET_CLIENT_ID = f"{CLIENT_ID_PREFIX}fleet"


def log(message: str) -> None:
    print(f"bench.quota: {message}", file=sys.stderr, flush=True)


def sluice_config(rate: int) -> str:
    return (f'[[quota.entries]]\nname = "bench"\nclient_id = "{CLIENT_ID_PREFIX}*"\n'
            f"produce_rate_bytes = {rate}\nfetch_rate_bytes = {rate}\n")


class Acks:
    """Acknowledged records: (monotonic time the application learnt it, value bytes); failures."""

    def __init__(self) -> None:
        self.samples: list[tuple[float, int]] = []
        self.failed: list[str] = []
        self._lock = threading.Lock()  # kafka-python calls back on its sender thread

    def ok(self, size: int) -> None:
        now = time.monotonic()
        with self._lock:
            self.samples.append((now, size))

    def fail(self, error: object) -> None:
        with self._lock:
            self.failed.append(str(error))

    @property
    def first(self) -> float | None:
        return self.samples[0][0] if self.samples else None


def produce_confluent(bootstrap: str, topic: str, client_id: str, acks: Acks, seconds: int,
                      pace_bytes_s: int = 0, stop: threading.Event | None = None) -> None:
    """As fast as the queue takes records, or at most ``pace_bytes_s`` (0: no pace) from the first record on;
    ``seconds`` after the first acknowledgement, or when ``stop`` is set."""
    # batch.size as kafka-python's order of magnitude (librdkafka's default is 1 MB per partition): a request is
    # the quota's unit, and one of 4 MB is most of a second at 5 MB/s (see the module docstring)
    producer = Producer({"bootstrap.servers": bootstrap, "client.id": client_id, "enable.idempotence": True,
                         "linger.ms": 5, "queue.buffering.max.kbytes": 4096, "batch.size": 65536})
    value = b"q" * RECORD

    def delivered(err: KafkaError | None, _msg: object) -> None:
        if err is not None:
            acks.fail(err)
        else:
            acks.ok(RECORD)

    deadline = time.monotonic() + START_TIMEOUT_S
    i = 0
    while stop is None or not stop.is_set():
        first = acks.first
        now = time.monotonic()
        if (first is not None and now >= first + seconds) or (first is None and now > deadline):
            break
        if pace_bytes_s and first is not None and i * RECORD > (now - first + 1) * pace_bytes_s:
            producer.poll(0.01)  # ahead of its pace (one second's bytes of slack): wait, serving callbacks
            continue
        try:
            producer.produce(topic, value=value, partition=i % PARTITIONS, on_delivery=delivered)
            i += 1
            producer.poll(0)
        except BufferError:
            producer.poll(0.05)  # the queue is full until acknowledgements come back: the quota's pace
    if producer.flush(120):
        acks.fail("records left unsent after 120 s")


def produce_kafka_python(bootstrap: str, topic: str, client_id: str, acks: Acks, seconds: int) -> None:
    producer = KafkaProducer(bootstrap_servers=bootstrap, client_id=client_id, enable_idempotence=True,
                             linger_ms=5, max_block_ms=120_000)
    value = b"q" * RECORD
    deadline = time.monotonic() + START_TIMEOUT_S
    # kafka-python's send() queues without bound: at most OUTSTANDING records unacknowledged, as librdkafka's
    # queue.buffering.max.kbytes bounds the other producer (a queue hours long would expire records instead)
    room = threading.Semaphore(OUTSTANDING)

    def ok(_md: object) -> None:
        acks.ok(RECORD)
        room.release()

    def failed(error: object) -> None:
        acks.fail(error)
        room.release()

    i = 0
    try:
        while True:
            first = acks.first
            if (first is not None and time.monotonic() >= first + seconds) \
                    or (first is None and time.monotonic() > deadline):
                break
            if not room.acquire(timeout=0.1):
                continue
            future = producer.send(topic, value=value, partition=i % PARTITIONS)
            future.add_callback(ok)
            future.add_errback(failed)
            i += 1
        producer.flush(timeout=120)
    finally:
        producer.close(timeout=10)


PRODUCE = {"confluent": produce_confluent, "kafka-python": produce_kafka_python}


def result(side: str, name: str, samples: list[tuple[float, int]], first: float | None, target: int,
           seconds: int) -> dict[str, Any]:
    """Emit the run's per-second lines; its figures (the caller adds to them and emits them)."""
    base: dict[str, Any] = {"bench": "quota", "side": side, "client": name, "target_bytes_s": target}
    if first is None:
        return {**base, "mean_bytes_s": 0, "ratio": 0.0, "worst_window_error": 1.0, "windows": 0,
                "error": f"no record within {START_TIMEOUT_S:.0f} s"}
    stats = analyse([(t - first, n) for t, n in samples], seconds, target)
    for i, n in enumerate(stats.per_second):
        emit({**base, "second": i, "measured_bytes_s": n})
    return {**base, "mean_bytes_s": round(stats.mean_bytes_s), "ratio": round(stats.mean_bytes_s / target, 4),
            "worst_window_error": round(stats.worst_window_error, 4), "windows": stats.windows,
            "basis": stats.basis, "records": len(samples)}


def run_producer(bootstrap: str, name: str, target: int, seconds: int, tmp: Path) -> dict[str, Any]:
    topic = f"bench-quota-{name}-{int(time.time() * 1000)}"
    create_topic(bootstrap, topic, partitions=PARTITIONS)
    config = tmp / f"sluice-produce-{name}.toml"
    config.write_text(sluice_config(target))
    acks = Acks()
    log(f"producer {name}: {seconds} s at {target / MB:g} MB/s")
    with SluiceProcess(bootstrap, extra_env={"SLUICE_CONFIG": str(config)}) as sluice:
        PRODUCE[name](sluice.bootstrap, topic, f"{CLIENT_ID_PREFIX}p-{name}", acks, seconds)
    line = result("produce", name, acks.samples, acks.first, target, seconds)
    check_stored(bootstrap, topic, acks, line)
    emit(line)
    return line


def check_stored(bootstrap: str, topic: str, acks: Acks, line: dict[str, Any]) -> None:
    """The topic holds exactly the records acknowledged (idempotent producers), else the line says what was lost."""
    stored = sum(end_offsets(bootstrap, topic).values())
    line["acknowledged"], line["stored"] = len(acks.samples), stored
    if acks.failed or stored != len(acks.samples):
        line["lost"] = f"{len(acks.samples)} acknowledged, {stored} stored, {len(acks.failed)} failed: " \
                       f"{acks.failed[:3]}"


def run_unquoted(bootstrap: str, target: int, seconds: int, tmp: Path) -> dict[str, Any]:
    """A producer no entry selects (client.id ``bench-free-*``), as fast as it can, through one Sluice: alone;
    beside a quoted producer (held at ``target``); and beside a producer no entry selects that paces itself at
    ``target`` (the same load, no quota), in ABBA order (alone, quoted, paced, paced, quoted, alone).

    ``ratio`` = beside the quoted one / alone: what the user of the unquoted client sees. On a shared 2-core machine
    it also counts the CPU the second producer, its Sluice connections and the broker take, which no quota governs;
    ``ratio_vs_same_load`` = beside the quoted one / beside the self-paced one isolates what the quota itself costs
    the clients it does not select (goal: within 5%)."""
    stamp = int(time.time() * 1000)
    order = ("alone", "quoted", "paced", "paced", "quoted", "alone")
    topics = [f"bench-quota-free-{stamp}-{i}" for i in range(2 * len(order))]
    for topic in topics:
        create_topic(bootstrap, topic, partitions=PARTITIONS)
    config = tmp / "sluice-unquoted.toml"
    config.write_text(sluice_config(target))
    free: dict[str, list[Acks]] = {side: [] for side in order}
    second: dict[str, list[Acks]] = {side: [] for side in order}
    written: list[tuple[str, Acks]] = []  # (topic, its producer's acknowledgements), for the stored check
    log(f"unquoted producer: {seconds} s per run, {' '.join(order)}")
    with SluiceProcess(bootstrap, extra_env={"SLUICE_CONFIG": str(config)}) as sluice:
        for i, side in enumerate(order):
            mine, other = Acks(), Acks()
            free[side].append(mine)
            written.append((topics[2 * i], mine))
            beside: threading.Thread | None = None
            if side != "alone":
                second[side].append(other)
                written.append((topics[2 * i + 1], other))
                # the quoted one is held by Sluice; the paced one, which no entry selects, holds itself
                client_id = f"{CLIENT_ID_PREFIX}p-beside" if side == "quoted" else "bench-free-paced"
                beside = threading.Thread(target=produce_confluent, name=f"{side}-producer",
                                          args=(sluice.bootstrap, topics[2 * i + 1], client_id, other, seconds),
                                          kwargs={"pace_bytes_s": target if side == "paced" else 0})
                beside.start()
            try:
                produce_confluent(sluice.bootstrap, topics[2 * i], f"bench-free-{side}", mine, seconds)
            finally:
                if beside is not None:
                    beside.join()

    def mean(runs: list[Acks]) -> float:
        rates = [analyse([(t - acks.first, n) for t, n in acks.samples], seconds, target).mean_bytes_s
                 for acks in runs if acks.first is not None]
        return sum(rates) / len(runs) if runs else 0.0

    alone, quoted, paced = mean(free["alone"]), mean(free["quoted"]), mean(free["paced"])
    line: dict[str, Any] = {"bench": "quota", "side": "unquoted", "client": "confluent", "order": list(order),
                            "alone_bytes_s": round(alone), "alongside_bytes_s": round(quoted),
                            "beside_same_load_bytes_s": round(paced),
                            "quoted_alongside_bytes_s": round(mean(second["quoted"])),
                            "paced_alongside_bytes_s": round(mean(second["paced"]))}
    line["ratio"] = round(quoted / alone, 4) if alone else 0.0
    line["ratio_vs_same_load"] = round(quoted / paced, 4) if paced else 0.0
    lost: list[str] = []
    for topic, acks in written:
        check: dict[str, Any] = {}
        check_stored(bootstrap, topic, acks, check)
        line["acknowledged"] = line.get("acknowledged", 0) + check["acknowledged"]
        line["stored"] = line.get("stored", 0) + check["stored"]
        if "lost" in check:
            lost.append(f"{topic}: {check['lost']}")
    if lost:
        line["lost"] = "; ".join(lost)
    emit(line)
    return line


def run_consumer(bootstrap: str, topic: str, ends: dict[int, int], name: str, target: int, seconds: int,
                 tmp: Path) -> dict[str, Any]:
    config = tmp / f"sluice-fetch-{name}.toml"
    config.write_text(sluice_config(target))
    arrivals = Arrivals(ends)
    log(f"consumer {name}: {seconds} s at {target / MB:g} MB/s")
    with SluiceProcess(bootstrap, extra_env={"SLUICE_CONFIG": str(config)}) as sluice:
        client = CLIENTS[name].make(sluice.bootstrap, topic, f"{CLIENT_ID_PREFIX}c-{name}", ends, tmp)
        try:
            consume(client, arrivals, seconds)
        finally:
            client.close()
    line = result("fetch", name, arrivals.samples, arrivals.first, target, seconds)
    line["out_of_order"] = arrivals.out_of_order  # every offset once, in order per partition
    if arrivals.exhausted_at is not None:
        line["note"] = "reached the end of the backlog: the quota did not hold it"
    emit(line)
    return line


def run_fleet(bootstrap: str, instances: int, target: int, seconds: int, tmp: Path) -> list[dict[str, Any]]:
    """One entity's producers over a fleet of ``instances`` (see the module docstring); its lines."""
    name = f"bench-quota-{int(time.time() * 1000)}"
    config = tmp / "sluice-fleet.toml"
    config.write_text(f'[quota]\nscope = "fleet"\n[[quota.entries]]\nname = "bench"\n'
                      f'client_id = "{FLEET_CLIENT_ID}"\nproduce_rate_bytes = {target}\n')
    env = {**fleet_env(name, status_interval_s="1"), "SLUICE_CONFIG": str(config)}
    log(f"fleet of {instances}: {seconds} s at {target / MB:g} MB/s for the whole fleet")
    fleet = start_fleet([bootstrap] * instances, env, together=True)
    # (instance, when it starts, when it stops: fractions of the run): one client per instance, the last one's
    # moved to the first at a third, and back at two thirds
    plan = [(i, 0.0, 1.0) for i in range(instances - 1)]
    plan += [(instances - 1, 0.0, 1 / 3), (0, 1 / 3, 2 / 3), (instances - 1, 2 / 3, 1.0)] if instances > 1 else []
    runs: list[tuple[int, str, Acks, threading.Event, threading.Thread | None]] = []
    stamp = int(time.time() * 1000)
    try:
        for n, (i, _, _) in enumerate(plan):
            topic = f"bench-quota-fleet-{stamp}-{n}"
            create_topic(bootstrap, topic, partitions=PARTITIONS)
            runs.append((i, topic, Acks(), threading.Event(), None))
        started = time.monotonic()
        for step in sorted({at for _, at, _ in plan} | {until for _, _, until in plan}):
            wait = started + step * seconds - time.monotonic() if step else 0.0
            if wait > 0:
                time.sleep(wait)  # the run's schedule: clients move at fixed points of it
            for n, (i, at, until) in enumerate(plan):
                instance, topic, acks, stop, thread = runs[n]
                if at == step and thread is None:
                    thread = threading.Thread(target=produce_confluent, name=f"fleet-{n}", daemon=True, args=(
                        fleet[i].bootstrap, topic, FLEET_CLIENT_ID, acks, 10 * seconds),
                        kwargs={"stop": stop})
                    thread.start()
                    runs[n] = (instance, topic, acks, stop, thread)
                if until == step:
                    stop.set()
        for _, _, _, _, thread in runs:
            if thread is not None:
                thread.join(180)
    finally:
        for process in fleet:
            process.close()
    lines: list[dict[str, Any]] = []
    every = [sample for _, _, acks, _, _ in runs for sample in acks.samples]
    first = min((t for t, _ in every), default=None)
    for n, (i, topic, acks, _, _) in enumerate(runs):
        line = result("fleet", f"instance-{i + 1}/{n}", acks.samples, first, target, seconds)
        line.pop("error", None)  # one client's run is part of the whole; the total's is the figure
        check_stored(bootstrap, topic, acks, line)
        emit(line)
        lines.append(line)
    total = result("fleet_total", FLEET_CLIENT_ID, sorted(every), first, target, seconds)
    total.update({"instances": instances, "moves": [f"instance-{instances} -> instance-1 at 1/3",
                                                    f"instance-1 -> instance-{instances} at 2/3"]})
    total["acknowledged"] = sum(x["acknowledged"] for x in lines)
    total["stored"] = sum(x["stored"] for x in lines)
    emit(total)
    return [*lines, total]


def summary(lines: list[dict[str, Any]], args: argparse.Namespace, target: int) -> dict[str, Any]:
    by_side: dict[str, dict[str, Any]] = {}
    quoted = [x for x in lines if x["side"] not in ("unquoted", "fleet", "fleet_total")]
    for x in quoted:
        by_side.setdefault(x["side"], {})[x["client"]] = {"ratio": x["ratio"],
                                                         "worst_window_error": x["worst_window_error"]}
    worst = max((x["worst_window_error"] for x in quoted), default=None)  # None: no quoted run
    unquoted = [x for x in lines if x["side"] == "unquoted"]
    fleet = [x for x in lines if x["side"] == "fleet_total"]
    fleet_worst = fleet[0]["worst_window_error"] if fleet else None
    goals: dict[str, Goal] = {}
    if quoted or not fleet:
        goals["worst_window_error"] = at_most(GOAL)
    if fleet:  # one entity's clients over the fleet: its total per window
        goals["fleet_total_worst_window_error"] = at_most(FLEET_GOAL)
    if unquoted:  # what the quota costs the clients it does not select: within 5%
        goals["unquoted_alongside_vs_same_load"] = at_least(1 - GOAL)
    # the check: the consumers read each partition's records once, in order (a gap, a repeat or a step back
    # is out of order); the topics hold what the producers' acknowledgements say; no client failed
    out_of_order = sum(x.get("out_of_order", 0) for x in lines)
    return verdict.summary("quota", {
        "worst_window_error": worst, "fleet_total_worst_window_error": fleet_worst, "target_bytes_s": target,
        "seconds": args.seconds, "by_side": by_side,
        "unquoted_alongside_vs_alone": unquoted[0]["ratio"] if unquoted else None,
        "unquoted_alongside_vs_same_load": unquoted[0]["ratio_vs_same_load"] if unquoted else None,
        "out_of_order": out_of_order},
        goals, checks={"each_partition_once_in_order": out_of_order == 0},
        errors=[f"{x['side']}/{x['client']}: lost: {x['lost']}" for x in lines if "lost" in x]
        + [f"{x['side']}/{x['client']}: {x['error']}" for x in lines if "error" in x])


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m bench.quota", description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--seconds", type=int, default=3 * WINDOW,
                    help=f"measured seconds per run after the first record (default {3 * WINDOW}; at least "
                         f"{2 * WINDOW})")
    ap.add_argument("--rate", type=float, default=5.0, help="produce and fetch quota, MB/s (default 5)")
    ap.add_argument("--mib", type=int, default=600, help="MiB of records the consumers read from (default 600)")
    ap.add_argument("--producers", default=",".join(PRODUCERS), help=f"of: {', '.join(PRODUCERS)}")
    ap.add_argument("--consumers", default=",".join(CLIENTS), help=f"of: {', '.join(CLIENTS)}")
    ap.add_argument("--no-unquoted", dest="unquoted", action="store_false",
                    help="skip the unquoted producer's runs (alone, then beside a quoted one)")
    ap.add_argument("--fleet", type=int, default=0, metavar="N",
                    help="instead: one entity's producers over a fleet of N instances, one quota for the fleet")
    ap.add_argument("--upstream", default="", help="a running broker's bootstrap (default: start one from rig/)")
    verdict.add_options(ap, "3 s runs, one producer and one consumer, 16 MiB")
    args = ap.parse_args(argv)
    if args.smoke:
        args.seconds, args.mib, args.producers, args.consumers = 3, 16, "confluent", "confluent"
        args.unquoted = False
        args.fleet = min(args.fleet, 2)
    elif args.seconds < 2 * WINDOW:
        ap.error(f"--seconds must be at least {2 * WINDOW}: a warm-up window and one counted window")
    if args.rate <= 0:
        ap.error("--rate must be positive")
    if args.fleet < 0 or args.fleet == 1:
        ap.error("--fleet: at least 2 instances")
    args.producers = names_arg(args.producers, PRODUCERS, "producers", ap, allow_empty=True)
    args.consumers = names_arg(args.consumers, list(CLIENTS), "consumers", ap, allow_empty=True)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    target = int(args.rate * MB)
    lines: list[dict[str, Any]] = []
    with contextlib.ExitStack() as stack:
        bootstrap = args.upstream or stack.enter_context(KafkaBroker()).bootstrap
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-quota-")))
        if args.fleet:
            lines += run_fleet(bootstrap, args.fleet, target, args.seconds, tmp)
        else:
            for name in args.producers:
                lines.append(run_producer(bootstrap, name, target, args.seconds, tmp))
            if args.unquoted:
                lines.append(run_unquoted(bootstrap, target, args.seconds, tmp))
            if args.consumers:
                topic = f"bench-quota-backlog-{int(time.time() * 1000)}"
                ends = produce_backlog(bootstrap, topic, args.mib)
                for name in args.consumers:
                    lines.append(run_consumer(bootstrap, topic, ends, name, target, args.seconds, tmp))
    out = summary(lines, args, target)
    emit(out)
    return verdict.exit_status(out, args.check)


if __name__ == "__main__":
    sys.exit(main())
