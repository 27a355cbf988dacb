"""``sluice config``: every run-time changeable section of a running Sluice, through its admin API: that instance's
own, or its fleet's when it is one of a fleet ([fleet] enabled: the change reaches every instance).

    sluice config get   SECTION --admin URL
    sluice config set   SECTION [KEY=VALUE]... [--file JSON] [--force] [--dry-run] --admin URL
    sluice config clear SECTION [--force] [--dry-run] --admin URL

SECTION is one the policies register as changeable at run time (``dynamic=True`` in proxy/policies/__init__.py:
throttle, size_limit, quota, ...), found from the registrations, never from a list here.

``set`` reads the section in force (GET), sets each KEY to VALUE (JSON when it parses as JSON, e.g. ``5000000``,
``true``, ``'[{"topic": "a"}]'``; else the text), and PUTs the whole section back with the revision it read;
``--file`` PUTs a JSON file as the whole section instead, with the revision read just before. ``clear`` PUTs the
section's defaults. Every write is revision-checked: refused (409) when the section changed since it was read;
``--force`` writes whatever changed meanwhile. ``--dry-run``: validated as a write would be (a fleet's: the
section's validation every instance folds it with) and its revision checked; nothing is written.

The answer is printed as JSON; where the section is kept (``store``: this instance, or the fleet) goes to stderr.
Authentication and TLS to the admin API: proxy/cli_admin.py.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from proxy.cli_admin import add_admin_arguments, call

__all__ = ["add_arguments", "add_write_arguments", "put_section", "run", "section_paths"]

#: what GET answers besides the section's settings (PUT back as is, they are left out)
_ANSWER_KEYS = ("status", "revision", "store", "dry_run")


def section_paths() -> dict[str, str]:
    """Each run-time changeable section -> its admin API path, as the policies register them (installed ones
    included)."""
    from proxy.app import REGISTRY

    return {r.section: r.admin_path for r in REGISTRY if r.dynamic}


def add_write_arguments(q: argparse.ArgumentParser) -> None:
    q.add_argument("--force", action="store_true",
                   help="write even if the section changed since it was read (no revision check)")
    q.add_argument("--dry-run", action="store_true", help="validate and check the revision; write nothing")


def put_section(args: argparse.Namespace, path: str, body: dict[str, Any], based_on: int | None) -> int:
    """PUT ``body`` as the whole section at ``path``, checked against revision ``based_on`` unless ``--force``;
    prints the answer. The exit code."""
    body = {k: v for k, v in body.items() if k not in _ANSWER_KEYS}
    if not args.force and based_on is not None:
        body["revision"] = based_on
    answer = call(args, "PUT", path, body, dry_run=args.dry_run)
    if answer.get("dry_run"):
        print(f"dry run: valid, based on revision {answer.get('revision')}; nothing written", file=sys.stderr)
    print(json.dumps(answer, indent=2))
    return 0


def _path(section: str) -> str:
    paths = section_paths()
    if section not in paths:
        raise SystemExit(f"error: [{section}] is not changeable at run time; these are: {', '.join(sorted(paths))}")
    return paths[section]


def _value(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def _get(args: argparse.Namespace) -> int:
    answer = call(args, "GET", _path(args.section))
    print(f"[{args.section}] of {answer.get('store', 'this instance')}, revision {answer.get('revision')}",
          file=sys.stderr)
    print(json.dumps(answer, indent=2))
    return 0


def _set(args: argparse.Namespace) -> int:
    path = _path(args.section)
    if bool(args.file) == bool(args.pairs):
        raise SystemExit("error: give KEY=VALUE pairs or --file, one of them")
    current = call(args, "GET", path)
    if args.file:
        with open(args.file, encoding="utf-8") as f:
            body = json.load(f)
        if not isinstance(body, dict):
            raise SystemExit(f"error: --file {args.file}: not a JSON object")
    else:
        body = dict(current)
        for pair in args.pairs:
            key, sep, value = pair.partition("=")
            if not sep or not key:
                raise SystemExit(f"error: {pair!r}: expected KEY=VALUE")
            body[key] = _value(value)
    return put_section(args, path, body, current.get("revision"))


def _clear(args: argparse.Namespace) -> int:
    path = _path(args.section)
    return put_section(args, path, {}, call(args, "GET", path).get("revision"))


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    q = sub.add_parser("get", help="a section as configured, its revision and where it is kept")
    q.add_argument("section", metavar="SECTION")
    add_admin_arguments(q)
    q.set_defaults(_action=_get)
    q = sub.add_parser("set", help="change a section (KEY=VALUE pairs, or --file)")
    q.add_argument("section", metavar="SECTION")
    q.add_argument("pairs", nargs="*", metavar="KEY=VALUE", help="VALUE is JSON if it parses as JSON, else text")
    q.add_argument("--file", metavar="JSON", help="PUT this JSON file as the whole section")
    add_admin_arguments(q)
    add_write_arguments(q)
    q.set_defaults(_action=_set)
    q = sub.add_parser("clear", help="the section's defaults")
    q.add_argument("section", metavar="SECTION")
    add_admin_arguments(q)
    add_write_arguments(q)
    q.set_defaults(_action=_clear)


def run(args: argparse.Namespace) -> int:
    return int(args._action(args))
