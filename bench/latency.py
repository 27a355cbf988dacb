"""A producer's round trip through Sluice at two revisions, against direct and a bare relay, in one run.

``python -m bench.latency [--compare REV] [--sends 6000] [--reps 4] [--consumers]``

What a client feels of Sluice per request, before and after a change: a confluent-kafka producer sends one 100-byte
record at a time (acks=1, each send awaited: ``bench.passthrough.produce_latency``) straight to the broker, through
the bare relay (rig/bare_relay.py, the least a Python proxy can do), through Sluice at ``REV`` (its ``proxy``
package extracted beside this checkout, bench/support/revision.py) and through Sluice as this checkout has it, the paths
taken in turn send by send. Each side's figure is its p50 over direct's p50 in the same rep, and the CPU its
process spent per send (user + system, rig/cpu.py).

Why reps, with the processes started afresh and their start order swapped each time: on the 2-core machine two
Sluice processes running the same code measured up to ~8 us apart per round trip, and by a different amount each
time they were started (where the scheduler puts each process relative to the client and the broker, not Sluice's
doing). One pair of processes would carry that into the before/after difference; fresh processes each rep, the
start order alternating, average it out on both sides alike.

``--consumers``: a producer beside consumers on the same Sluice (a sidecar's usual load). Each Sluice has a
librdkafka consumer of the topic of its own (``rig.group_consumer``, a group each), its fetches in terminate mode
(``[sessions]``: each response decoded, edited and encoded again), long-polling, so each record produced, by any path,
completes one waiting fetch on each Sluice: that response reaches a Sluice just before the Produce's own when the
Produce went through it. The consumers run in every rep, for both sides alike; each Sluice's CPU per send then counts
its consumer's fetches and commits too.

Prints one JSON line per rep, then ``{"summary": "latency", "rev": ..., "before": {...}, "after": {...},
"delta_added_p50_us": ..., "sends": N, "consumers": ..., "goals", "met", "lost", "duplicated", "out_of_order",
"unexpected", "correct"}`` (bench/support/verdict.py): per side ``added_p50_us`` (over direct),
``added_p50_over_bare_us`` and ``cpu_us_per_send``, means over the reps, and the bare relay's. The check: every send was
acknowledged (else it exits 1 at once), and the topic holds exactly the records acknowledged over all paths and reps, by
offset and key (each send's key is its own: a Produce relayed twice, or a record lost or changed, shows); exit 1
otherwise. Goal: after.added_p50_over_bare_us <= 30 (``--check`` exits 1 when it is missed). ``--smoke``: 2 reps of 200
sends, the second with ``--consumers``' consumers (so both ways run in CI).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from bench.passthrough import BareRelay, Budget, Sent, check_stored, produce_latency, relayed_broker
from bench.support.revision import extract_revision, short_revision
from bench.support.verdict import add_options, at_most, emit, exit_status, summary
from rig.cpu import cpu_seconds
from rig.group_consumer import ConsumerProcess, stop_all
from rig.sluice_process import SluiceProcess
from rig.topics import create_topic

WARMUP = 300
#: ``--consumers``: each Sluice's consumer (client.id latency-consumer) has its fetches in terminate mode
CONSUMER_CONFIG = """
[sessions]
mode = "passthrough"
[[sessions.clients]]
client_id = "latency-consumer*"
mode = "terminate"
"""
#: seconds a consumer may take to join its group and report its assignment
ASSIGN_TIMEOUT_S = 60.0


def rep(broker_bootstrap: str, bare: BareRelay, topic: str, codes: dict[str, Path], first: str, sends: int,
        warmup: int, budget: Budget, acked: list[Sent], config: Path | None = None) -> dict[str, Any]:
    """One rep: both Sluices started (``first``'s first), the paths measured in turn, both stopped; ``acked`` gets
    every record the broker acknowledged. With ``config`` (``--consumers``), the Sluices run it and a consumer waits
    on the topic through each."""
    order = [first, *(side for side in codes if side != first)]
    started: dict[str, SluiceProcess] = {}
    consumers: list[ConsumerProcess] = []
    env = {"SLUICE_CONFIG": str(config)} if config is not None else None
    try:
        for side in order:
            started[side] = SluiceProcess(broker_bootstrap, env, code=codes[side])
        if config is not None:
            consumers = [ConsumerProcess.spawn("confluent", started[side].bootstrap, topic, f"{topic}-{side}",
                                               f"latency-consumer-{side}") for side in order]
            _wait_assigned(consumers)
        paths = {"direct": broker_bootstrap, **{side: started[side].bootstrap for side in codes},
                 "bare": bare.bootstrap}
        pids = {side: started[side].pid for side in codes} | {"bare": bare.ps.pid}
        produce_latency(paths, topic, warmup, 0, budget, acked)
        cpu0 = {name: cpu_seconds(pid) for name, pid in pids.items()}
        lat = produce_latency(paths, topic, sends, 0, budget, acked)
        cpu = {name: (cpu_seconds(pid) - cpu0[name]) / sends * 1e6 for name, pid in pids.items()}
        for consumer in consumers:
            consumer.check_alive()
    finally:
        stop_all(consumers)
        for sluice in started.values():
            sluice.stop()
    direct = lat["direct"]["p50_ms"]
    return {name: {"added_p50_us": round((lat[name]["p50_ms"] - direct) * 1000, 1),
                   "cpu_us_per_send": round(cpu[name], 1)} for name in pids} | {"direct_p50_ms": direct}


def _wait_assigned(consumers: list[ConsumerProcess]) -> None:
    """Until every consumer reports its partition assigned (bounded: past it, the bench stops, naming the consumer)."""
    deadline = time.monotonic() + ASSIGN_TIMEOUT_S
    for consumer in consumers:
        while not consumer.assignment:
            consumer.check_alive()
            if time.monotonic() > deadline:
                raise SystemExit(f"bench.latency: no assignment in {ASSIGN_TIMEOUT_S:.0f} s:\n{consumer.describe()}")
            time.sleep(0.1)


#: the smoke run's time guard (seconds): under the bench runner's 1,200 s, so this bench says what it was doing
SMOKE_BUDGET_S = 900.0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.latency", description=__doc__.split("\n\n")[0])
    ap.add_argument("--compare", metavar="REV", default="HEAD",
                    help="the revision measured as 'before' (default HEAD: the last commit against the working "
                         "tree; with no change between them, the spread of two identical sides)")
    ap.add_argument("--sends", type=int, default=6000, help="measured sends per path per rep (default 6000)")
    ap.add_argument("--reps", type=int, default=4, help="reps, the start order swapped each time (default 4)")
    ap.add_argument("--consumers", action="store_true",
                    help="a consumer waits on the topic through each Sluice, its fetches in terminate mode")
    add_options(ap, "2 reps of 200 sends per path after 50")
    args = ap.parse_args(argv)
    warmup = WARMUP
    if args.smoke:
        args.sends, args.reps, warmup = 200, 2, 50
    # A smoke run's guard is the bench runner's (bench/__main__.py SMOKE_TIMEOUT_S) more than this formula's: CI runs
    # the smokes at the lowest CPU priority beside its test sessions (load 16-24 on 2 cores), where this one's two
    # reps took 273 s on 1 Dec 2026, past the 242 s the formula gives them
    budget = Budget(SMOKE_BUDGET_S if args.smoke else 120.0 + args.reps * (60.0 + args.sends * 0.004),
                    "bench.latency")
    label = short_revision(args.compare)
    broker, ((listener, relay_port),) = relayed_broker(1)
    runs: list[dict[str, Any]] = []
    acked: list[Sent] = []
    with broker, tempfile.TemporaryDirectory(prefix="bench-latency-") as tmp:
        extract_revision(args.compare, Path(tmp), ("proxy", "pyproject.toml"))
        codes = {"before": Path(tmp), "after": Path(__file__).resolve().parent.parent}
        topic = f"latency-{uuid.uuid4().hex[:8]}"
        # in-process (rig.topics), not kafka-topics.sh: at the lowest priority beside CI's sessions, that tool's
        # JVM start alone went past 60 s (a CI-like run, 1 Dec 2026)
        create_topic(broker.bootstrap, topic)
        config = Path(tmp) / "consumers.toml"
        config.write_text(CONSUMER_CONFIG)
        bare = BareRelay(relay_port, f"127.0.0.1:{listener}")
        try:
            for r in range(args.reps):
                first = "before" if r % 2 == 0 else "after"
                consumers = args.consumers or (args.smoke and r == 1)
                line = rep(broker.bootstrap, bare, topic, codes, first, args.sends, warmup, budget, acked,
                           config if consumers else None)
                runs.append(line)
                emit({"bench": "latency", "rep": r, "started_first": first, **line})
        finally:
            bare.stop()
        check = check_stored(broker.bootstrap, topic, acked)

    def mean(name: str, key: str) -> float:
        return round(statistics.fmean(r[name][key] for r in runs), 1)

    sides = {name: {"added_p50_us": mean(name, "added_p50_us"), "cpu_us_per_send": mean(name, "cpu_us_per_send")}
             for name in ("before", "after", "bare")}
    for name in ("before", "after"):
        sides[name]["added_p50_over_bare_us"] = round(sides[name]["added_p50_us"] - sides["bare"]["added_p50_us"], 1)
    line = summary("latency", {
        "rev": label, **sides,
        "delta_added_p50_us": round(sides["after"]["added_p50_us"] - sides["before"]["added_p50_us"], 1),
        "delta_cpu_us_per_send": round(sides["after"]["cpu_us_per_send"] - sides["before"]["cpu_us_per_send"], 1),
        "sends": args.sends, "reps": args.reps, "order": "alternating",
        "consumers": "second rep" if args.smoke and not args.consumers else args.consumers,
        "records_acknowledged": len(acked)},
        # what Sluice adds to a round trip, over the bare relay's (the figure of bench.passthrough's first goal)
        {"after.added_p50_over_bare_us": at_most(30.0)}, check=check)
    emit(line)
    return exit_status(line, args.check)


if __name__ == "__main__":
    sys.exit(main())
