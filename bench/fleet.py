"""A fleet's changes seen by its instances: the time from a change's write to the control topic to its application
on every instance of the fleet (proxy/fleet/).

``python -m bench.fleet [--instances 20] [--changes 10] [--timeout 30] [--smoke] [--check]``

Goals: apply p99 <= 1 s and max <= 2 s over every (change, instance) pair (``--instances 50`` is the fleet size
they are set for).

Setup: one rig broker (real Kafka 4.x, KRaft) as both the upstream and the control cluster; ``--instances``
Sluice processes (rig/sluice_process.py, each its own ports), one fleet. Then ``--changes`` times, one after the
other: a ``PUT /throttles`` (a new ``leader_rate_bytes``, based on the revision the instance's GET showed, as
``sluice config set`` does) on the instances in turn, and a wait, bounded by ``--timeout``, until every instance
applied it.

What is measured, from the instances' own operational logs (one host, one clock): the write is the writer's
``fleet_committing`` event (logged just before the transaction's commit: no instance can read the record
earlier, so the time counted includes the commit itself), an application is each instance's ``fleet_applied``
event of that revision. Per change a line with the instances' ``apply_s`` (application - write) p50/max and the
PUT's own latency (``put_s``: fencing, reading the topic to its end, writing the control and history records,
committing, and the writer's own application); the last line:

``{"summary": "fleet", "instances", "changes", "apply_p50_s", "apply_p99_s", "apply_max_s", "put_p50_s",
"missed", "goals", "met", "every_change_applied_everywhere", "revisions_increasing", "every_instance_at_the_last",
"errors", "correct"}`` (bench/support/verdict.py).

The correctness check, from what the instances show: every change applied by every instance within
``--timeout`` (``missed`` counts the (change, instance) pairs that were not), the revisions increasing, and every
instance's ``GET /throttles`` at the end showing the last change's revision and settings. Exit code 1 when the
check fails; with ``--check``, also when a goal is not met. ``--smoke``: 3 instances, 2 changes.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import uuid
from datetime import datetime
from typing import Any

from bench.support import verdict
from rig.fleet import admin_json, fleet_env, start_fleet
from rig.kafka import KafkaBroker
from rig.sluice_process import SluiceProcess

GOALS = {"apply_p99_s": verdict.at_most(1.0), "apply_max_s": verdict.at_most(2.0)}


def emit(line: dict[str, Any]) -> None:
    print(json.dumps(line), flush=True)


def log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in [0, 100]) of ``values`` (non-empty)."""
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * q // 100))
    return ordered[int(rank) - 1]


def _ts(event: dict[str, Any]) -> float:
    return datetime.fromisoformat(str(event["ts"]).replace("Z", "+00:00")).timestamp()


def _event(proc: SluiceProcess, name: str, revision: int) -> dict[str, Any] | None:
    for event in proc.log_events():
        if event.get("event") == name and event.get("section") == "throttle" and event.get("revision") == revision:
            return event
    return None


def change(fleet: list[SluiceProcess], writer: SluiceProcess, rate: int, timeout: float) -> dict[str, Any]:
    status, body = admin_json(writer.admin_url, "/throttles")
    body.pop("status", None)
    t0 = time.monotonic()
    status, body = admin_json(writer.admin_url, "/throttles", "PUT", {**body, "leader_rate_bytes": rate})
    put_s = time.monotonic() - t0
    if status != 200:
        return {"bench": "fleet", "error": f"PUT answered {status}: {body}"}
    revision = int(body["revision"])
    written = None
    applied: dict[int, float] = {}
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and len(applied) < len(fleet):
        if written is None:
            written = _event(writer, "fleet_committing", revision)
        for i, proc in enumerate(fleet):
            if i not in applied and (event := _event(proc, "fleet_applied", revision)) is not None:
                applied[i] = _ts(event)
        # Bounded poll of the instances' logs (the times measured are the logs' own), not too often: reading 50
        # logs is CPU the instances share on this host
        time.sleep(0.25)
    if written is None:
        written = _event(writer, "fleet_committing", revision)
    assert written is not None, "the writer did not log its write"
    apply_s = [t - _ts(written) for t in applied.values()]
    return {"bench": "fleet", "revision": revision, "rate": rate, "writer": fleet.index(writer),
            "put_s": round(put_s, 3),
            "applied": len(applied), "missed": len(fleet) - len(applied), "apply_s": [round(x, 4) for x in apply_s],
            "apply_p50_s": round(percentile(apply_s, 50), 4) if apply_s else None,
            "apply_max_s": round(max(apply_s), 4) if apply_s else None}


def summary(lines: list[dict[str, Any]], instances: int, final: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """The summary line: figures, goals, which are met, and the check (``final``: each instance's GET at the
    end)."""
    apply_s = [x for line in lines for x in line.get("apply_s", [])]
    missed = sum(line.get("missed", instances) for line in lines)
    puts = [x["put_s"] for x in lines if "put_s" in x]
    revisions = [x["revision"] for x in lines if "revision" in x]
    behind: list[int] = []
    if lines and "revision" in lines[-1] and final is not None:
        last = (lines[-1]["revision"], lines[-1]["rate"])
        behind = [i for i, body in enumerate(final) if (body.get("revision"), body.get("leader_rate_bytes")) != last]
    return verdict.summary("fleet", {
        "instances": instances, "changes": len(lines),
        "apply_p50_s": round(percentile(apply_s, 50), 4) if apply_s else None,
        "apply_p99_s": round(percentile(apply_s, 99), 4) if apply_s else None,
        "apply_max_s": round(max(apply_s), 4) if apply_s else None,
        "put_p50_s": round(percentile(puts, 50), 3) if puts else None, "missed": missed,
        "instances_behind": behind}, GOALS,
        checks={"every_change_applied_everywhere": missed == 0 and bool(lines),
                "revisions_increasing": revisions == sorted(set(revisions)),
                "every_instance_at_the_last": not behind},
        errors=[x["error"] for x in lines if "error" in x])


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m bench.fleet", description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--instances", type=int, default=20, help="Sluice processes in the fleet (default 20)")
    ap.add_argument("--changes", type=int, default=10, help="changes written, one after the other (default 10)")
    ap.add_argument("--timeout", type=float, default=30.0, help="seconds a change may take to reach every "
                                                                "instance before it counts as missed (default 30)")
    verdict.add_options(ap, "3 instances, 2 changes")
    args = ap.parse_args(argv)
    if args.smoke:
        args.instances, args.changes = 3, 2
    if not 1 <= args.instances <= 200:
        ap.error("--instances must be 1..200")
    if not 1 <= args.changes <= 1000:
        ap.error("--changes must be 1..1000")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    lines: list[dict[str, Any]] = []
    with KafkaBroker() as broker:
        t0 = time.monotonic()
        # broker_port_base 0: a free port per broker node (base + N is only picked free for N = the node_id)
        fleet = start_fleet([broker.bootstrap] * args.instances,
                            {**fleet_env(f"bench-{uuid.uuid4().hex[:8]}", status_interval_s="5"),
                             "SLUICE_LISTEN__BROKER_PORT_BASE": "0"})
        try:
            log(f"{len(fleet)} instances started in {time.monotonic() - t0:.1f} s")
            for n in range(args.changes):
                line = change(fleet, fleet[n % len(fleet)], 1_000_000 + n, args.timeout)
                emit(line)
                lines.append(line)
            final = [admin_json(proc.admin_url, "/throttles")[1] for proc in fleet]
        finally:
            for proc in fleet:
                proc.close()
    result = summary(lines, args.instances, final)
    emit(result)
    return verdict.exit_status(result, args.check)


if __name__ == "__main__":
    sys.exit(main())
