"""A fleet's changes seen by its instances: the time from a change's write to the control topic to its application
on every instance of the fleet (proxy/fleet/).

``python -m bench.fleet [--instances 20] [--changes 10] [--timeout 30]``

Goal: p99 <= 2 s over every (change, instance) pair, and no instance missing a change.

Setup: one rig broker (real Kafka 4.x, KRaft) as both the upstream and the control cluster; ``--instances``
Sluice processes (rig/sluice_process.py, each its own ports), one fleet. Then ``--changes`` times, one after the
other: a ``PUT /throttles`` (a new ``leader_rate_bytes``, based on the revision the instance's GET showed, as
``sluice throttle set`` does) on the instances in turn, and a wait, bounded by ``--timeout``, until every instance
applied it.

What is measured, from the instances' own operational logs (one host, one clock): the write is the writer's
``fleet_committing`` event (logged just before the transaction's commit: no instance can read the record
earlier, so the time counted includes the commit itself), an application is each instance's ``fleet_applied``
event of that revision. Per change a line with the instances'
``apply_s`` (application - write) p50/max and the PUT's own latency (``put_s``: fencing, reading the topic to its
end, committing, and the writer's own application); the last line:

``{"summary": "fleet", "instances", "changes", "apply_p50_s", "apply_p99_s", "apply_max_s", "put_p50_s",
"missed", "goals", "met", "every_change_applied_everywhere", "errors", "correct"}`` (bench/support/verdict.py):
``missed`` counts (change, instance) pairs never applied within ``--timeout``, the check; the exit code is 1 when any
was missed or a change failed, and with ``--check`` also when p99 is above the goal. ``--smoke``: 3 instances, 2
changes.
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

GOAL_P99_S = 2.0


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
        time.sleep(0.05)  # bounded poll of the instances' logs; the times measured are the logs' own
    if written is None:
        written = _event(writer, "fleet_committing", revision)
    assert written is not None, "the writer did not log its write"
    apply_s = [t - _ts(written) for t in applied.values()]
    return {"bench": "fleet", "revision": revision, "writer": fleet.index(writer), "put_s": round(put_s, 3),
            "applied": len(applied), "missed": len(fleet) - len(applied), "apply_s": [round(x, 4) for x in apply_s],
            "apply_p50_s": round(percentile(apply_s, 50), 4) if apply_s else None,
            "apply_max_s": round(max(apply_s), 4) if apply_s else None}


def summary(lines: list[dict[str, Any]], instances: int) -> dict[str, Any]:
    apply_s = [x for line in lines for x in line.get("apply_s", [])]
    missed = sum(line.get("missed", instances) for line in lines)
    return verdict.summary("fleet", {
        "instances": instances, "changes": len(lines),
        "apply_p50_s": round(percentile(apply_s, 50), 4) if apply_s else None,
        "apply_p99_s": round(percentile(apply_s, 99), 4) if apply_s else None,
        "apply_max_s": round(max(apply_s), 4) if apply_s else None,
        "put_p50_s": round(percentile([x["put_s"] for x in lines if "put_s" in x], 50), 3)
        if any("put_s" in x for x in lines) else None,
        "missed": missed}, {"apply_p99_s": verdict.at_most(GOAL_P99_S)},
        checks={"every_change_applied_everywhere": missed == 0},
        errors=[line["error"] for line in lines if "error" in line])


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
        fleet = start_fleet([broker.bootstrap] * args.instances,
                            fleet_env(f"bench-{uuid.uuid4().hex[:8]}", status_interval_s="5"))
        try:
            log(f"{len(fleet)} instances started in {time.monotonic() - t0:.1f} s")
            for n in range(args.changes):
                line = change(fleet, fleet[n % len(fleet)], 1_000_000 + n, args.timeout)
                emit(line)
                lines.append(line)
        finally:
            for proc in fleet:
                proc.close()
    result = summary(lines, args.instances)
    emit(result)
    return verdict.exit_status(result, args.check)


if __name__ == "__main__":
    sys.exit(main())
