"""``sluice quota``: look at and change a running Sluice's client quotas (``[quota]``, proxy/policies/quota).

    sluice quota status --admin URL [--json]     GET /quotas: each entry's quotas, each entity's rate now
    sluice quota set    --admin URL --entry NAME [--principal P] [--client-id C] [--client-address A]
                        [--produce-rate R] [--fetch-rate R] [--request-rate N] [--shared | --not-shared]
                        [--scope instance|fleet|section]
    sluice quota set    --admin URL --file JSON   PUT a JSON file as the whole [quota] section
    sluice quota clear  --admin URL [--entry NAME]...   remove those entries (default: every entry)

``set`` and ``clear`` read the section in force, change what their options name and PUT it back checked against the
revision they read, as ``sluice config set quota`` does (proxy/cli_config.py): a change made meanwhile is refused
with 409 (read it again and retry, or ``--force``); ``--dry-run`` validates and writes nothing. ``set`` changes the
entry called NAME where it stands, or appends it (then it needs one of --principal, --client-id, --client-address);
an entity part given as "" is removed from the entry. A rate is a number (bytes/s with the units of ``sluice
throttle``: 5MB, 20MiB/s), ``exempt`` (0: no quota of that kind for this entity, whatever a less specific entry
says) or ``unset`` (the next entry's applies). The admin API's token and TLS: proxy/cli_admin.py.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from proxy.cli_admin import add_admin_arguments, call
from proxy.cli_config import add_write_arguments, put_section
from proxy.cli_throttle import human, parse_size

_PATH = "/quotas"
#: option -> the entry's key, and how a value is read
_RATES = {"produce_rate": ("produce_rate_bytes", parse_size), "fetch_rate": ("fetch_rate_bytes", parse_size),
          "request_rate": ("request_rate", float)}
_PARTS = {"principal": "principal", "client_id": "client_id", "client_address": "client_address"}
_UNSET = "unset"


def _rate_arg(read: Any) -> Any:
    def parse(text: str) -> Any:
        if text in ("exempt", _UNSET):
            return 0 if text == "exempt" else _UNSET
        try:
            value = read(text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(f'{e} (or "exempt", "unset")') from None
        if value <= 0:
            raise argparse.ArgumentTypeError('a rate is positive; "exempt" for none')
        return value
    return parse


def _entity(entry: dict[str, Any]) -> str:
    parts = [f"{k}={entry[k]}" for k in _PARTS.values() if entry.get(k) is not None]
    return " ".join(parts) or "-"


def _quota(kind: str, value: Any) -> str:
    if value is None:
        return "-"
    if value == 0:
        return "exempt"
    return f"{value:g}/s" if kind == "request" else f"{human(value)}/s"


def table(body: dict[str, Any]) -> list[str]:
    """What ``status`` prints: the entries as configured, then the entities measured (busiest first)."""
    lines = []
    status = body.get("status") or {}
    head = f"quotas: window {body.get('samples')} x {body.get('window_s')} s, scope {body.get('scope')}"
    if "revision" in body:
        head += f", fleet revision {body['revision']}"
    fleet = status.get("fleet")
    if fleet:
        head += (f"; fleet usage topic {fleet['usage_topic']}, {fleet['live_instances']} live instance(s), this one "
                 f"{fleet['instance'] or '?'}")
    lines.append(head)
    rows: list[tuple[str, ...]] = [("ENTRY", "ENTITY", "PRODUCE", "FETCH", "REQUESTS", "SCOPE", "SHARED")]
    for i, e in enumerate(body.get("entries") or []):
        rows.append((e.get("name") or f"entries[{i}]", _entity(e), _quota("produce", e.get("produce_rate_bytes")),
                     _quota("fetch", e.get("fetch_rate_bytes")), _quota("request", e.get("request_rate")),
                     e.get("scope") or body.get("scope", ""), "yes" if e.get("shared") else "no"))
    lines += _columns(rows)
    measured = status.get("entities") or []
    if measured:
        lines.append("")
        rows = [("ENTRY", "KIND", "ENTITY", "RATE", "BOUND")]  # a table of its own
        for m in measured:
            rows.append((m["entry"], m["kind"], _entity(m), _quota(m["kind"], m["rate"]) if m["rate"] else "0",
                         _quota(m["kind"], m["bound"])))
        lines += _columns(rows)
        if status.get("more_entities"):
            lines.append(f"... and {status['more_entities']} more")
    return lines


def _columns(rows: list[tuple[str, ...]]) -> list[str]:
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]


def _status(args: argparse.Namespace) -> int:
    body = call(args, "GET", _PATH)
    print(json.dumps(body, indent=2) if args.json else "\n".join(table(body)))
    return 0


def _section(args: argparse.Namespace) -> dict[str, Any]:
    """The section in force, as PUT takes it back (its revision kept: the write is checked against it)."""
    return dict(call(args, "GET", _PATH))


def _clear(args: argparse.Namespace) -> int:
    body = _section(args)
    entries = body.get("entries") or []
    names = [e.get("name") or f"entries[{i}]" for i, e in enumerate(entries)]
    unknown = [n for n in args.entry or [] if n not in names]
    if unknown:
        raise SystemExit(f"error: no entry called {', '.join(unknown)} (entries: {', '.join(names) or 'none'})")
    body["entries"] = [e for e, n in zip(entries, names, strict=True) if args.entry and n not in args.entry]
    return put_section(args, _PATH, body, body.get("revision"))


def _set(args: argparse.Namespace) -> int:
    if args.file:
        with open(args.file, encoding="utf-8") as f:
            body = json.load(f)
        return put_section(args, _PATH, body, None if args.force else _section(args).get("revision"))
    if not args.entry:
        raise SystemExit("error: sluice quota set: --entry NAME (or --file) is needed")
    body = _section(args)
    entries = body.setdefault("entries", [])
    at = next((i for i, e in enumerate(entries) if (e.get("name") or f"entries[{i}]") == args.entry), None)
    entry = dict(entries[at]) if at is not None else {"name": args.entry}
    for option, key in _PARTS.items():
        value = getattr(args, option)
        if value is not None:
            entry[key] = value or None
    for option, (key, _) in _RATES.items():
        value = getattr(args, option)
        if value is not None:
            entry[key] = None if value == _UNSET else value
    if args.shared is not None:
        entry["shared"] = args.shared
    if args.scope is not None:
        entry["scope"] = None if args.scope == "section" else args.scope
    if at is None:
        entries.append(entry)
    else:
        entries[at] = entry
    return put_section(args, _PATH, body, body.get("revision"))


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    q = sub.add_parser("status", help="each entry's quotas and each entity's measured rate")
    add_admin_arguments(q)
    q.add_argument("--json", action="store_true", help="print GET /quotas as it answers")
    q.set_defaults(_action=_status)
    q = sub.add_parser("clear", help="remove entries (default: every entry)")
    add_admin_arguments(q)
    q.add_argument("--entry", action="append", metavar="NAME", help="the entry to remove; repeatable")
    add_write_arguments(q)
    q.set_defaults(_action=_clear)
    q = sub.add_parser("set", help="change or add one entry")
    add_admin_arguments(q)
    q.add_argument("--entry", metavar="NAME", help="the entry's name (changed where it stands, or appended)")
    q.add_argument("--principal", metavar="P", help='SASL principal: a name, a glob or "<default>" ("": none)')
    q.add_argument("--client-id", metavar="C", help='client.id: a name, a glob or "<default>" ("": none)')
    q.add_argument("--client-address", metavar="A", help='address, CIDR network or "<default>" ("": none)')
    for option, (_, read) in _RATES.items():
        q.add_argument(f"--{option.replace('_', '-')}", type=_rate_arg(read), metavar="RATE",
                       help=("requests/s" if option == "request_rate" else "bytes/s, e.g. 5MB")
                       + ', "exempt" or "unset"')
    q.add_argument("--shared", dest="shared", action="store_true", default=None,
                   help="one quota for every client the entry selects")
    q.add_argument("--not-shared", dest="shared", action="store_false", help="one quota per entity (the default)")
    q.add_argument("--scope", choices=("instance", "fleet", "section"),
                   help='"fleet": one quota for the whole fleet; "section": [quota] scope')
    q.add_argument("--file", metavar="JSON", help="PUT this JSON file as the whole [quota] section")
    add_write_arguments(q)
    q.set_defaults(_action=_set)


def run(args: argparse.Namespace) -> int:
    return int(args._action(args))
