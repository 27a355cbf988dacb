"""``sluice fleet``: the fleet as its topics have it, and a rollback.

    sluice fleet status   [--config FILE] [--fleet NAME] [--bootstrap HOST:PORT,...] [--json]
    sluice fleet history  [SECTION] [--config FILE] [--fleet NAME] [--bootstrap HOST:PORT,...] [--json]
    sluice fleet rollback SECTION REVISION --admin URL [--force] [--dry-run]

``status``: the instances as they report themselves (the status topic) against the fleet's settings (the control
topic), one row each: ``up``; ``lagging`` (a section's revision below the fleet's); ``drift`` (at the fleet's
revision, other settings: another Sluice version validating the record otherwise, say); ``silent`` (no status for
3 intervals: killed, partitioned, a lost host; ``since`` its last status; left out once older than ``[fleet]
forget_silent_after_s``; a cleanly stopped instance leaves the table at once). Exit code 0 when no live instance
lags or drifts, 1 otherwise (or when the topics cannot be read), 2 for an invalid configuration.

``history``: every change made through Sluice (the history topic), oldest first: its revision, when, the
principal the admin API authenticated, and what changed.

``status`` and ``history`` read Kafka with the settings of ``sluice run`` (``--config``, default $SLUICE_CONFIG,
and SLUICE_* variables; ``--fleet`` and ``--bootstrap`` override them): the ``reader`` ACLs of
proxy/kafka_acls.py. ``rollback`` asks an instance's admin API (proxy/fleet/routes.py) to write the section's
settings at REVISION again, as a new change (revision-checked against the section's revision now, unless
``--force``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from datetime import UTC, datetime
from typing import Any

from ..app import Settings, load_settings
from ..cli_admin import add_admin_arguments, call
from ..cli_config import add_write_arguments, section_paths
from ..config import ConfigError
from ..kafka_acls import AclReporter, principal_name
from .history import Entry, history_rows
from .kafka_config import client_config
from .records import FleetState, Skipped
from .status import FAILING, StatusRecord, fleet_table

__all__ = ["add_arguments", "run"]

_STATUS_COLUMNS = ("instance", "state", "revisions", "drift", "last_seen_s", "since", "version", "host", "control",
                   "started_at")
_HISTORY_COLUMNS = ("revision", "section", "at", "principal", "action", "change")


def _kafka_arguments(q: argparse.ArgumentParser) -> None:
    q.add_argument("--config", "-c", metavar="FILE", default=os.environ.get("SLUICE_CONFIG"),
                   help="TOML settings file (default: $SLUICE_CONFIG)")
    q.add_argument("--fleet", metavar="NAME", help="the fleet's name (default: [fleet] name)")
    q.add_argument("--bootstrap", metavar="HOST:PORT,...", help="the control cluster (default: as `sluice run`)")
    q.add_argument("--timeout", type=float, default=15.0, help="seconds to read each topic (default 15)")
    q.add_argument("--json", action="store_true", help="one JSON object per row instead of the table")


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    q = sub.add_parser("status", help="the fleet's instances: up, lagging, drift, silent")
    _kafka_arguments(q)
    q.set_defaults(_action=_status)
    q = sub.add_parser("history", help="every change made, with who made it")
    q.add_argument("section", nargs="?", metavar="SECTION", help="this section's changes only")
    _kafka_arguments(q)
    q.set_defaults(_action=_history)
    q = sub.add_parser("rollback", help="write a section's settings at an earlier revision again")
    q.add_argument("section", metavar="SECTION")
    q.add_argument("revision", type=int, metavar="REVISION", help="as `sluice fleet history` shows it")
    add_admin_arguments(q)
    add_write_arguments(q)
    q.set_defaults(_action=_rollback)


def run(args: argparse.Namespace) -> int:
    return int(args._action(args))


# ---------------------------------------------------------------------------------------------- reading


class _Reader:
    """The fleet's topics read as ``sluice run``'s settings say; a missing permission is one line on stderr."""

    def __init__(self, settings: Settings, timeout: float) -> None:
        fleet = self.fleet = settings.fleet
        self.settings, self.timeout = settings, timeout
        self.conf = client_config(fleet, settings.upstream, f"sluice-fleet-{fleet.name}-cli")
        tls, sasl = (settings.upstream.tls, settings.upstream.sasl) if fleet.credentials == "upstream" else (
            fleet.tls, fleet.sasl)
        self.acls = AclReporter(principal_name(sasl.username if sasl.mechanism else "", tls.cert_file), _warn)

    def records(self, topic: str) -> list[tuple[bytes | None, bytes | None, int]]:
        from .topics import read_to_end

        return read_to_end(self.conf, topic, self.fleet.transactional_id, self.timeout,
                           lambda d: self.acls.missing(d.resource, d.name, d.operation, "reading the fleet", d.error))

    def control(self) -> FleetState:
        settings = self.settings
        state = FleetState(self.fleet.name, tuple(settings.dynamic_sections),
                           lambda section, values: getattr(settings.with_overrides({section: values}), section))
        for key, value, offset in self.records(self.fleet.control):
            try:
                state.offer(key, value, offset)
            except Skipped:
                pass
        return state

    def topic_id(self) -> str:
        from confluent_kafka import KafkaException
        from confluent_kafka.admin import AdminClient

        from .topics import Denied, topic_id

        try:
            return topic_id(AdminClient(self.conf), self.fleet.control, self.timeout)
        except (KafkaException, Denied):
            return ""


def _warn(_event: str, **fields: Any) -> None:
    print(f"warning: {fields['principal']} may not {fields['operation']} {fields['resource']} "
          f"({fields['needed_by']}): {fields['grant']}", file=sys.stderr)


def _settings(args: argparse.Namespace) -> Settings:
    settings = load_settings(args.config, os.environ)
    over: dict[str, Any] = {"fleet.enabled": True}
    if args.fleet:
        over["fleet.name"] = args.fleet
    if args.bootstrap:
        over["fleet.bootstrap_servers"] = [s.strip() for s in args.bootstrap.split(",") if s.strip()]
    return settings.with_overrides(over)


def _reading(args: argparse.Namespace, body: Any) -> int:
    """Run ``body(reader)``; the exit code it returns, or 1 when Kafka refuses, 2 for a bad configuration."""
    from confluent_kafka import KafkaException

    from .topics import Denied

    try:
        reader = _Reader(_settings(args), args.timeout)
    except ConfigError as exc:
        print(f"config error: {exc}", file=sys.stderr)
        return 2
    try:
        return int(body(reader))
    except Denied as denied:
        text = reader.acls.missing(denied.resource, denied.name, denied.operation, "reading the fleet", denied.error)
        print(f"error: {text}", file=sys.stderr)
    except KafkaException as exc:
        print(f"error: cannot read the fleet's topics: {exc.args[0] if exc.args else exc}", file=sys.stderr)
    return 1


def _print(rows: list[dict[str, Any]], columns: tuple[str, ...], as_json: bool) -> None:
    if as_json:
        for row in rows:
            print(json.dumps(row))
        return
    table = [[str(row[c]) for c in columns] for row in rows]
    widths = [max([len(c)] + [len(r[i]) for r in table]) for i, c in enumerate(columns)]
    print("  ".join(c.upper().ljust(w) for c, w in zip(columns, widths, strict=True)).rstrip())
    for r in table:
        print("  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip())


# ---------------------------------------------------------------------------------------------- status


def _status(args: argparse.Namespace) -> int:
    def body(reader: _Reader) -> int:
        fleet = reader.fleet
        state = reader.control()
        revisions = {s: r for s, r in state.revisions().items() if r}
        # the settings the fleet runs, as this Sluice validates them: only where its latest record is the one
        # applied (a record this Sluice finds invalid says nothing about what instances should run)
        hashes = {s: h for s, h in state.hashes().items() if state.applied[s][0].revision == revisions.get(s)}
        latest: dict[bytes, StatusRecord] = {}
        for key, value, _ in reader.records(fleet.status):
            if key is None:
                continue
            record = StatusRecord.decode(value) if value is not None else None
            if record is None or record.fleet != fleet.name:
                latest.pop(key, None)  # a tombstone: stopped cleanly
            else:
                latest[key] = record
        rows = fleet_table(latest.values(), revisions, hashes, datetime.now(UTC), fleet.status_interval_s,
                           fleet.forget_silent_after_s, reader.topic_id())
        if not args.json:
            print(f"fleet {fleet.name}: {len(rows)} instance(s); fleet revisions: "
                  + (", ".join(f"{s}={r}" for s, r in sorted(revisions.items())) or "none set"))
        _print(rows, _STATUS_COLUMNS, args.json)
        return 1 if any(row["state"] in FAILING for row in rows) else 0

    return _reading(args, body)


# --------------------------------------------------------------------------------------------- history


def _history(args: argparse.Namespace) -> int:
    from confluent_kafka import KafkaError, KafkaException

    def body(reader: _Reader) -> int:
        try:
            records = reader.records(reader.fleet.history)
        except KafkaException as exc:
            if not (exc.args and isinstance(exc.args[0], KafkaError)
                    and exc.args[0].code() == KafkaError.UNKNOWN_TOPIC_OR_PART):
                raise
            records = []  # no change made through Sluice yet: the topic is created by the first
        entries = [e for _, value, _ in records if (e := Entry.decode(value)) is not None]
        _print(history_rows(entries, reader.fleet.name, args.section), _HISTORY_COLUMNS, args.json)
        return 0

    return _reading(args, body)


# -------------------------------------------------------------------------------------------- rollback


def _rollback(args: argparse.Namespace) -> int:
    paths = section_paths()
    if args.section not in paths:
        raise SystemExit(f"error: [{args.section}] is not changeable at run time; these are: "
                         f"{', '.join(sorted(paths))}")
    body: dict[str, Any] = {"section": args.section, "revision": args.revision}
    if not args.force:
        body["based_on"] = call(args, "GET", paths[args.section]).get("revision")
    answer = call(args, "POST", "/fleet/rollback", body, dry_run=args.dry_run)
    if answer.get("dry_run"):
        print(f"dry run: revision {args.revision} is valid here, based on revision {answer.get('revision')}; "
              "nothing written", file=sys.stderr)
    print(json.dumps(answer, indent=2))
    return 0
