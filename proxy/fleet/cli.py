"""``sluice fleet status``: the fleet as its instances report it (the status topic) against the fleet's settings
(the control topic), one row per instance: up, lagging (a section's revision below the fleet's) or silent (no
status for 3 intervals: killed, partitioned, or a lost host; a cleanly stopped instance leaves the table).

    sluice fleet status [--config FILE] [--fleet NAME] [--bootstrap HOST:PORT,...] [--json]

The fleet, its topics and how to reach the control cluster come from the same settings as ``sluice run``
(``--config``, default $SLUICE_CONFIG, and SLUICE_* variables); ``--fleet`` and ``--bootstrap`` override them.
Exit code 0 when every instance is up, 1 when one lags or is silent (or the topics cannot be read), 2 for an
invalid configuration.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from datetime import UTC, datetime
from typing import Any

from ..app import load_settings
from ..config import ConfigError
from .kafka_config import client_config
from .records import FleetState, Skipped
from .status import StatusRecord, fleet_table

__all__ = ["add_arguments", "run"]

_COLUMNS = ("instance", "state", "revisions", "last_seen_s", "version", "host", "control", "started_at")


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    q = sub.add_parser("status", help="the fleet's instances: up, lagging, silent")
    q.add_argument("--config", "-c", metavar="FILE", default=os.environ.get("SLUICE_CONFIG"),
                   help="TOML settings file (default: $SLUICE_CONFIG)")
    q.add_argument("--fleet", metavar="NAME", help="the fleet's name (default: [fleet] name)")
    q.add_argument("--bootstrap", metavar="HOST:PORT,...", help="the control cluster (default: as `sluice run`)")
    q.add_argument("--timeout", type=float, default=15.0, help="seconds to read each topic (default 15)")
    q.add_argument("--json", action="store_true", help="one JSON object per instance instead of the table")


def run(args: argparse.Namespace) -> int:
    from confluent_kafka import KafkaException

    from .control import read_to_end

    try:
        settings = load_settings(args.config, os.environ)
        over: dict[str, Any] = {"fleet.enabled": True}
        if args.fleet:
            over["fleet.name"] = args.fleet
        if args.bootstrap:
            over["fleet.bootstrap_servers"] = [s.strip() for s in args.bootstrap.split(",") if s.strip()]
        settings = settings.with_overrides(over)
    except ConfigError as exc:
        print(f"config error: {exc}", file=sys.stderr)
        return 2
    fleet = settings.fleet
    conf = client_config(fleet, settings.upstream, f"sluice-fleet-{fleet.name}-status")
    state = FleetState(fleet.name, tuple(settings.dynamic_sections),
                       lambda section, values: getattr(settings.with_overrides({section: values}), section))
    latest: dict[bytes, StatusRecord] = {}
    try:
        for key, value in read_to_end(conf, fleet.control, args.timeout):
            try:
                state.offer(key, value)
            except Skipped:
                pass
        for key, value in read_to_end(conf, fleet.status, args.timeout):
            if key is None:
                continue
            record = StatusRecord.decode(value) if value is not None else None
            if record is None or record.fleet != fleet.name:
                latest.pop(key, None)  # a tombstone: stopped cleanly
            else:
                latest[key] = record
    except KafkaException as exc:
        print(f"error: cannot read the fleet's topics ({fleet.control}, {fleet.status}): {exc.args[0]}",
              file=sys.stderr)
        return 1
    current = {s: r for s, r in state.revisions().items() if r}
    rows = fleet_table(latest.values(), current, datetime.now(UTC), fleet.status_interval_s)
    if args.json:
        for row in rows:
            print(json.dumps(row))
    else:
        print(f"fleet {fleet.name}: {len(rows)} instance(s); fleet revisions: "
              + (", ".join(f"{s}={r}" for s, r in sorted(current.items())) or "none set"))
        table = [[str(row[c]) for c in _COLUMNS] for row in rows]
        widths = [max([len(c)] + [len(r[i]) for r in table]) for i, c in enumerate(_COLUMNS)]
        print("  ".join(c.upper().ljust(w) for c, w in zip(_COLUMNS, widths, strict=True)).rstrip())
        for r in table:
            print("  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip())
    return 0 if all(row["state"] == "up" for row in rows) else 1
