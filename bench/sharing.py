"""Cooperative consumption's speed-up (proxy/policies/sharing/): a consumer group whose per-record work
is the bottleneck, 6 consumers of 3 partitions sharing them through Sluice against the same 6 consumers without
sharing (through Sluice, the topic not shared) and straight to the broker, in one run, on a real broker.

``python -m bench.sharing [--records 24000] [--keys 6000] [--work-ms 1] [--client confluent]
[--batch-records N] [--protocol classic|consumer] [--commit-interval-s 1] [--upstream H:P] [--compare REV [--pairs 3]]
[--check] [--smoke]``

Goal: ``speedup_vs_no_sharing`` >= 1.8; also Sluice's CPU per MiB of record bytes it filtered.

Setup: one rig broker (real Kafka 4.x, KRaft) and one Sluice subprocess (rig/sluice_process.py) with ``[sharing]
enabled`` for the topics named ``bench-sharing-*``. Three configurations of 6 consumers: ``direct`` (to the broker),
``no-sharing`` (through Sluice, a topic sharing does not cover: what the 6 do without it, 3 of them idle, as
consumers that outnumber partitions are), ``sharing`` (through Sluice, a shared topic). For each, a fresh topic of
3 partitions and a fresh group: the consumers (``python -m rig.group_consumer``, confluent-kafka by
default, each its own client.id, range assignor, polls of at most 100 records, a synchronous commit at most every
``--commit-interval-s``) start and join with their partitions paused (``--paused-until``: in the group, fetching
nothing); once every consumer reports its assignment paused and the group has settled (the assignments are stable
for 3 s), ``--records`` records of ``--keys`` keys (200-byte values) are produced, in
batches of the producers' making (three at once, ``linger.ms`` 20) or, with ``--batch-records N``, of at most N
records
(``batch.num.messages``; 1: a batch per record, a low-rate topic's shape, where most of a member's batches hold
only the other slice's records and Sluice reads ahead past them, proxy/policies/sharing/cursor.py), and then every
consumer resumes: the group works through a backlog, as consumers behind do, at the pace of their work. (Produced
while the group consumed, the records came no faster than the producers sent them, which on 2 shared cores was at
times slower than six consumers work: such a run timed the producers, not the group.) Keys
spread over partitions and slices by their hash, so how evenly the work splits depends on how many there are: 6,000
keys of 4 records each give slices within a few percent of each other; a few hundred keys make the largest slice,
which sets the pace, markedly larger than the average (a property of key hashing, not of Sluice). Each record costs
``--work-ms`` of "work" in the consumer: a wait, as an I/O-bound job's call to a database would be, so the 2 cores
do not cap the consumers. Without sharing three consumers each hold a whole partition and three hold none; with
sharing two share each partition, one key-hash slice each. A commit of a shared partition costs more than a plain
one (Sluice reads the slices' positions, then the client commits the stable offset, then Sluice the slice's
position: two round trips to the coordinator in turn before the client's answer), so committing after every poll
(``--commit-interval-s 0``) lowers the sharing consumers' rate more than the others'.

Measured: the longest of the consumers' spans, each from the first record handed to it to its last (the time the
group takes over the backlog once each consumer is going: a paused client fetches again at a time of its own after
``resume()``, librdkafka up to a second later; each one's delay to its first record is ``first_record_s``), the
records/s over it, and Sluice's CPU time (rig/cpu.py) from the backlog's production to its end against the record
bytes it filtered (``sluice_sharing_filtered_bytes_total``: the shared partitions' record sets as fetched, before
filtering). The check, from what the consumers reported, record by record: every record produced arrives
(``lost``), once (``duplicated``), and each consumer gets each key's records in offset order (``out_of_order``).
Benches here share 2 cores with everything else on the machine: figures are noisy; compare configurations within
one run.

``--compare REV``: the shared configuration runs ``--pairs`` times through this checkout's Sluice and as often
through REV's (its ``proxy`` package, bench/support/revision.py), alternated, against the same unshared and direct
runs; the summary is this checkout's median run, with each pair's two speed-ups (before, after).

``--protocol consumer``: the consumers use KIP-848's protocol (``group.protocol=consumer``, confluent-kafka): the
broker assigns, Sluice lays slices over its assignment at each member's heartbeat (the broker's heartbeat interval:
5 s by default, 1 s on the rig's broker), so a group is taken as settled once no assignment changed for three
heartbeat intervals.

JSON lines on stdout: per configuration ``{"bench": "sharing", "path", "client", "batch_records", "consumers",
"records", "seconds", "records_per_s", "sluice_cpu_s", "filtered_mib", "commits", "commit_ms_p50", "commit_ms_max"
(each consumer's synchronous commits, from its call to its answer), "lost", "duplicated", "out_of_order",
"unexpected", ...}``; last line ``{"summary": "sharing", "client", "batch_records", "speedup_vs_no_sharing",
"speedup_vs_direct", "cpu_s_per_filtered_mib", "goals", "met", "lost", "duplicated", "out_of_order", "unexpected",
"correct", ...}`` (bench/support/verdict.py): the check over every configuration, key by key (each record once,
each key's records in the order produced). The exit status is 1 when the check fails, and with ``--check`` also
when a goal is unmet. ``--smoke``: 1,200 records of 300 keys (the whole path and its check, in seconds).
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.support.revision import extract_revision
from bench.support.verdict import Delivery, add_options, at_least, delivery, emit, exit_status, summary
from rig.group_consumer import ConsumerProcess, latest, stop_all
from rig.kafka import KIP848_SETTLE_S, KafkaBroker
from rig.sluice_process import SluiceProcess
from rig.topics import create_topic

PARTITIONS = 3
CONSUMERS = 6
#: producers sending the records at once
PRODUCERS = 3
#: configuration -> the topic's prefix (sharing covers ``bench-sharing-*`` only) and whether through Sluice
PATHS = {"direct": ("bench-direct", False), "no-sharing": ("bench-plain", True), "sharing": ("bench-sharing", True)}
#: the group has settled when no consumer's assignment changed for this long (per group protocol: a KIP-848
#: group's slices change at its members' heartbeats: rig/kafka.py KIP848_SETTLE_S)
SETTLE_S = {"classic": 3.0, "consumer": KIP848_SETTLE_S}
#: what the summary is judged by
GOALS = {"speedup_vs_no_sharing": at_least(1.8)}
#: --smoke's size
SMOKE = {"records": 1200, "keys": 300}
#: how long the consumers are still watched once every record arrived (a late duplicate is counted)
LATE_S = 2.0


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def wait_until(condition: Any, timeout: float, what: str | Callable[[], str]) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise RuntimeError(f"not within {timeout:.0f} s: {what() if callable(what) else what}")
        time.sleep(0.1)  # polling a real condition, bounded by the deadline


def produce(bootstrap: str, topic: str, records: int, keys: int, batch_records: int | None) -> None:
    """``records`` records of ``keys`` keys, by :data:`PRODUCERS` producers at once, each producing every
    :data:`PRODUCERS`-th key (so each key's records in order): one producer sends ~4,600 one-record batches a second
    here, and the backlog is made before the group consumes it (not timed), so sooner by three."""
    from confluent_kafka import Producer

    batching = {"batch.num.messages": batch_records} if batch_records else {}
    producers = [Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "acks": "all", **batching})
                 for _ in range(PRODUCERS)]
    failed: list[int] = []

    def send(j: int) -> None:
        producer = producers[j]
        for i in range(records):
            if i % keys % PRODUCERS == j:
                producer.produce(topic, key=f"key-{i % keys}".encode(), value=f"{i:08d}".encode() + b"v" * 192)
                if i % 1000 < PRODUCERS:
                    producer.poll(0)
        failed.append(producer.flush(60))

    threads = [threading.Thread(target=send, args=(j,)) for j in range(PRODUCERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if any(failed):
        raise RuntimeError("records not acknowledged")


def paused_as_assigned(events: list[dict[str, Any]]) -> bool:
    """Whether a consumer that reported ``events`` holds paused what it was last assigned (``--paused-until``): it
    consumes nothing of the backlog until the gate opens."""
    assigned = latest(events, "assigned")
    return assigned is None or sorted(map(tuple, assigned)) == sorted(map(tuple, latest(events, "paused") or []))


def check_keys(records: int, keys: int, received: list[list[tuple[float, list[Any]]]]) -> Delivery:
    """What the consumers got of the records :func:`produce` wrote, key by key: each record once, and each key's
    records in the order they were produced (a key is in one slice of one partition, so one consumer reads it in
    offset order). ``received``: each consumer's (time, [partition, offset, key, value]) in order."""
    sent: dict[str, list[str]] = {}
    for i in range(records):
        sent.setdefault(f"key-{i % keys}", []).append(f"{i:08d}")
    got: dict[str, list[str]] = {}
    for _, r in sorted((x for rs in received for x in rs), key=lambda x: x[0]):
        got.setdefault(r[2], []).append(r[3][:8])
    return delivery(sent, got)


def run(args: argparse.Namespace, bootstrap: str, sluice: SluiceProcess, path: str,
        label: dict[str, Any] | None = None, consumers: int = CONSUMERS) -> dict[str, Any]:
    prefix, through_sluice = PATHS[path]
    topic = f"{prefix}-{consumers}-{uuid.uuid4().hex[:6]}"
    create_topic(bootstrap, topic, partitions=PARTITIONS)
    group = f"g-{topic}"
    commit = ["--commit-interval-s", str(args.commit_interval_s)]
    if args.protocol != "classic":
        commit += ["--group-protocol", args.protocol]
    gate = Path(args.gate_dir) / f"{topic}.go"
    members = [ConsumerProcess.spawn(args.client, sluice.bootstrap if through_sluice else bootstrap, topic, group,
                                     f"bench-{path}-{i}", "--work-ms", str(args.work_ms), *commit,
                                     "--paused-until", str(gate))
               for i in range(consumers)]
    try:
        def settled() -> bool:
            assigned = [m.assignments() for m in members]
            if not all(paused_as_assigned(m.reported()) for m in members):
                return False
            # a KIP-848 member the broker gives nothing may never be told so (librdkafka calls no rebalance
            # callback for an empty assignment it already had)
            if not all(assigned) if args.protocol == "classic" else not any(assigned):
                return False
            last = max(a[-1][0] for a in assigned if a)
            held = sum(len(a[-1][1]) for a in assigned if a)
            shared = path == "sharing"
            return held >= (min(consumers, 2 * PARTITIONS) if shared else PARTITIONS) \
                and time.monotonic() - last > SETTLE_S[args.protocol]
        def unsettled() -> str:
            """Where each member stands, for a group that never settled: its last assignment and how long ago it
            came (of how many), and what it holds paused."""
            now = time.monotonic()
            out = []
            for m in members:
                assigned = m.assignments()
                last = f"{assigned[-1][1]} {now - assigned[-1][0]:.1f} s ago" if assigned else "nothing"
                out.append(f"{m.name}: assigned {last} ({len(assigned)} in all), "
                           f"paused {m.latest('paused')}")
            return "the group to settle: " + "; ".join(out)
        wait_until(settled, 120, unsettled)
        cpu0, bytes0 = sluice.cpu_seconds(), sluice.metric("sluice_sharing_filtered_bytes_total")
        produce(bootstrap, topic, args.records, args.keys, args.batch_records)
        if any(e for m in members for e in m.timed_records()):
            raise RuntimeError("records consumed before the backlog was whole (a consumer's partitions not paused)")
        gate.touch()
        opened = time.monotonic()

        def received() -> int:
            return len({r[3] for m in members for _, r in m.timed_records()})

        try:
            wait_until(lambda: received() >= args.records, 600, "every record consumed")
        except RuntimeError as e:
            log(f"{path}: {e}: {args.records - received()} missing")  # counted as lost by the check
        # still watched a moment: a record delivered again just after the last one is a duplicate to count
        late = time.monotonic() + LATE_S
        while time.monotonic() < late:
            time.sleep(0.1)
        cpu1, bytes1 = sluice.cpu_seconds(), sluice.metric("sluice_sharing_filtered_bytes_total")
        timed = [m.timed_records() for m in members]
        # Each consumer's span, from its first record to its last: the pause the backlog was produced under ends
        # for each one when its client next fetches (librdkafka: up to a second after resume()), a start that
        # differs from consumer to consumer and says nothing of the path; how long each took to its first record
        # after the gate opened is reported beside (first_record_s)
        spans = [(rs[0][0], rs[-1][0]) for rs in timed if rs]
        seconds = max(last - first for first, last in spans)
        line = {"bench": "sharing", "path": path, **(label or {}), "client": args.client, "protocol": args.protocol,
                "batch_records": args.batch_records, "consumers": consumers, "partitions": PARTITIONS,
                "records": args.records, "keys": args.keys, "work_ms": args.work_ms, "seconds": round(seconds, 3),
                "commit_interval_s": args.commit_interval_s, "records_per_s": round(args.records / seconds, 1),
                "per_consumer": [len(rs) for rs in timed],
                "first_record_s": [round(first - opened, 3) for first, _ in spans],
                "sluice_cpu_s": round(cpu1 - cpu0, 3), "filtered_mib": round((bytes1 - bytes0) / 2**20, 3),
                **commit_times(members), **check_keys(args.records, args.keys, timed).fields()}
        emit(line)
        return line
    finally:
        stop_all(members)


def commit_times(members: list[ConsumerProcess]) -> dict[str, Any]:
    """The consumers' synchronous commits as they felt them: from each ``committing`` to its ``commit`` (or
    ``commit_failed``), as reported, median and largest in ms over every consumer's commits."""
    took = []
    for m in members:
        start = None
        for t, e in m.timed_events():
            if "committing" in e:
                start = t
            elif start is not None and ("commit" in e or "commit_failed" in e):
                took.append((t - start) * 1000)
                start = None
    return {"commits": len(took), "commit_ms_p50": round(statistics.median(took), 1) if took else None,
            "commit_ms_max": round(max(took), 1) if took else None}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.sharing", description=__doc__.split("\n\n")[0])
    p.add_argument("--records", type=int, default=24000)
    p.add_argument("--keys", type=int, default=6000)
    p.add_argument("--work-ms", type=float, default=1.0)
    p.add_argument("--client", default="confluent", choices=("confluent", "kafka-python", "aiokafka", "franz-go"))
    p.add_argument("--commit-interval-s", type=float, default=1.0,
                   help="each consumer commits at most this often (0: after every poll)")
    p.add_argument("--protocol", default="classic", choices=("classic", "consumer"),
                   help="the consumers' group.protocol (consumer: KIP-848; confluent only)")
    p.add_argument("--batch-records", type=int, default=None, metavar="N",
                   help="records per produced batch at most (batch.num.messages; 1: one record per batch); default: "
                        "the producer's own batching (linger.ms 20)")
    p.add_argument("--upstream", help="host:port of a running broker (default: start one)")
    p.add_argument("--compare", metavar="REV",
                   help="also run the shared configuration through REV's Sluice (before), alternated with this "
                        "checkout's (after), --pairs times, against the same unshared run")
    p.add_argument("--pairs", type=int, default=3, help="with --compare: before/after pairs (default 3)")
    add_options(p, f"{SMOKE['records']} records of {SMOKE['keys']} keys")
    args = p.parse_args(argv)
    if args.smoke:
        args.records, args.keys = SMOKE["records"], SMOKE["keys"]
    if args.protocol == "consumer" and args.client != "confluent":
        p.error("--protocol consumer: only --client confluent speaks KIP-848 here")
    if args.batch_records is not None and args.batch_records < 1:
        p.error("--batch-records: at least 1")
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        args.gate_dir = tmp
        config = Path(tmp) / "sluice.toml"
        config.write_text('[sharing]\nenabled = true\n[[sharing.topics]]\ntopic = "bench-sharing-*"\n')
        bootstrap = args.upstream or stack.enter_context(KafkaBroker()).bootstrap
        env = {"SLUICE_CONFIG": str(config)}
        sluice = stack.enter_context(SluiceProcess(bootstrap, env))
        runs = {path: run(args, bootstrap, sluice, path) for path in PATHS if path != "sharing"}
        shared: list[dict[str, Any]] = []
        before: list[dict[str, Any]] = []
        if args.compare:
            code = Path(tmp) / "before"
            revision = extract_revision(args.compare, code, ("proxy", "pyproject.toml"))
            other = stack.enter_context(SluiceProcess(bootstrap, env, code=code))
            for pair in range(args.pairs):
                # alternated, so neither side always runs on the broker's older state
                for side in ("before", "after") if pair % 2 == 0 else ("after", "before"):
                    label = {"pair": pair, "side": side, "revision": revision[:12] if side == "before" else "this"}
                    (before if side == "before" else shared).append(
                        run(args, bootstrap, other if side == "before" else sluice, "sharing", label))
        else:
            shared.append(run(args, bootstrap, sluice, "sharing"))
    no_sharing = runs["no-sharing"]["records_per_s"]
    # with --compare, this checkout's median run is the summary's (each pair's speed-ups beside it)
    after = sorted(shared, key=lambda r: r["records_per_s"])[len(shared) // 2]
    mib = after["filtered_mib"]
    compared = {"compare": args.compare, "speedup_vs_no_sharing_pairs": [
        [round(b["records_per_s"] / no_sharing, 3), round(a["records_per_s"] / no_sharing, 3)]
        for b, a in zip(before, shared, strict=True)]} if before else {}
    line = summary("sharing", {
        "client": args.client, "protocol": args.protocol,
        "batch_records": args.batch_records or "producer's (linger.ms 20)", "consumers": CONSUMERS,
        "speedup_vs_no_sharing": round(after["records_per_s"] / no_sharing, 3),
        "speedup_vs_direct": round(after["records_per_s"] / runs["direct"]["records_per_s"], 3),
        "cpu_s_per_filtered_mib": round(after["sluice_cpu_s"] / mib, 4) if mib else None,
        **{f"records_per_s_{path}": r["records_per_s"] for path, r in runs.items()},
        "records_per_s_sharing": after["records_per_s"], **compared},
        GOALS, check=sum((Delivery(**{k: r[k] for k in Delivery().fields()})
                          for r in [*runs.values(), *shared, *before]), Delivery()))
    emit(line)
    return exit_status(line, args.check)

if __name__ == "__main__":
    sys.exit(main())
