"""``sluice throttle``: look at and change a running Sluice's replication throttles (KIP-73), and plan one.

    sluice throttle status --admin URL      GET /throttles: configuration and measured rates
    sluice throttle set    --admin URL [--leader-rate R] [--follower-rate R] [--topic T[=REPLICAS]]...
                           [--consumer GLOB]... [--window-s S] [--samples N] [--file JSON] [--force] [--dry-run]
    sluice throttle clear  --admin URL [--force] [--dry-run]   PUT the defaults: no throttle
    sluice throttle plan   --bytes B --inbound-rate IN --throttle T [--network N] [--replication-factor R]

``set`` and ``clear`` are KIP-73's front to ``sluice config set|clear throttle`` (proxy/cli_config.py): the same
revision-checked write (``--force``, ``--dry-run``), the same authentication (proxy/cli_admin.py). ``set`` reads
the configuration in force, changes what its options name, and PUTs the whole section back; ``--file`` PUTs a
JSON file as is (checked against the revision it carries, else the one read just before). ``--topic`` replaces
the entry whose topic is exactly TOPIC (a name or a glob such as ``'orders-*'``) where it stands, or appends one;
REPLICAS defaults to ``*``, and ``TOPIC=`` lists none. ``status`` and ``set`` print the entries as configured
(globs as written, in order: an exact name wins over globs, among globs the first matching one).

``plan`` is KIP-73's sizing: a move of B bytes with inbound (produce) traffic IN on the busiest broker
takes B / (T - IN) at throttle T, since the throttle carries both catch-up and keep-up traffic; and the safe
range on a network of throughput N with replication factor R is ``IN < T < N - IN/R``. Exit code 0 when T is in
the safe range (or N is not given and T > IN), 1 with a warning otherwise.

Sizes and rates accept B, KB/MB/GB (10^3), KiB/MiB/GiB (2^10), an optional ``/s``: ``5MB``, ``20MiB/s``.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys

from proxy.cli_admin import TOKEN_ENV, add_admin_arguments, admin_token, call
from proxy.cli_config import add_write_arguments, put_section
from proxy.policies.throttle.sizing import move_time_s, safe_range

# TOKEN_ENV and admin_token live in proxy/cli_admin.py (every command's admin API calls); named here too for the
# commands that took them from this module
__all__ = ["TOKEN_ENV", "add_arguments", "admin_token", "human", "parse_size", "plan", "run"]

_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}
_SIZE = re.compile(r"\s*([0-9]+(?:\.[0-9]*)?)\s*([a-zA-Z]*)\s*(?:/s)?\s*")


def parse_size(text: str) -> int:
    """``"5MB"`` -> 5000000, ``"2MiB/s"`` -> 2097152, ``"100"`` -> 100. ValueError otherwise."""
    m = _SIZE.fullmatch(text)
    if not m or m.group(2).lower() not in _UNITS:
        raise ValueError(f"{text!r} is not a size (e.g. 500KB, 5MB, 20MiB, 1GB; an optional /s)")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


def _size_arg(text: str) -> int:
    try:
        return parse_size(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def human(n: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n:.0f} B"


def duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


# ------------------------------------------------------------------------------------------------- plan


def plan(move_bytes: int, inbound: int, throttle: int, network: int | None = None,
         replication_factor: int = 3) -> tuple[float | None, list[str]]:
    """(move time in seconds or None when it never finishes, warnings). KIP-73's sizing formulas."""
    warnings: list[str] = []
    seconds: float | None = None
    time_s = move_time_s(move_bytes, throttle, inbound)
    if math.isinf(time_s):
        warnings.append(
            f"the move never finishes: the throttle ({human(throttle)}/s) must exceed the inbound rate "
            f"({human(inbound)}/s), which it also has to carry to keep up; raise it above {human(inbound)}/s")
    else:
        seconds = time_s
    if network is not None:
        _, upper = safe_range(inbound, network, replication_factor)
        if throttle >= upper:
            warnings.append(
                f"the throttle is above the safe bound N - IN/R = {human(upper)}/s (N {human(network)}/s, "
                f"IN {human(inbound)}/s, R {replication_factor}): moving data may starve live traffic")
    return seconds, warnings


def _plan(args: argparse.Namespace) -> int:
    seconds, warnings = plan(args.bytes, args.inbound_rate, args.throttle, args.network, args.replication_factor)
    print(f"bytes to move      {human(args.bytes)}")
    print(f"inbound rate (IN)  {human(args.inbound_rate)}/s")
    print(f"throttle (T)       {human(args.throttle)}/s")
    if seconds is not None:
        print(f"move time          {duration(seconds)}  (bytes / (T - IN) = {seconds:.1f} s)")
    else:
        print("move time          never (T <= IN)")
    low = f"{human(args.inbound_rate)}/s"
    if args.network is not None:
        high = f"{human(args.network - args.inbound_rate / args.replication_factor)}/s"
        print(f"safe range         {low} < T < {high}  (IN < T < N - IN/R)")
    else:
        print(f"safe range         T > {low}  (give --network for the upper bound N - IN/R)")
    for w in warnings:
        print(f"warning: {w}", file=sys.stderr)
    print("watch sluice_throttle_sum_lag_offsets: if it stops falling before the move completes, raise the "
          "throttle a little")
    return 1 if warnings else 0


# ----------------------------------------------------------------------------------------- admin API

_PATH = "/throttles"


def _status(args: argparse.Namespace) -> int:
    print(json.dumps(call(args, "GET", _PATH), indent=2))
    return 0


def _clear(args: argparse.Namespace) -> int:
    return put_section(args, _PATH, {}, call(args, "GET", _PATH).get("revision"))


def _set(args: argparse.Namespace) -> int:
    current = call(args, "GET", _PATH)
    if args.file:
        with open(args.file, encoding="utf-8") as f:
            body = json.load(f)
    else:
        body = dict(current)
        if args.leader_rate is not None:
            body["leader_rate_bytes"] = args.leader_rate
        if args.follower_rate is not None:
            body["follower_rate_bytes"] = args.follower_rate
        if args.window_s is not None:
            body["window_s"] = args.window_s
        if args.samples is not None:
            body["samples"] = args.samples
        for spec in args.topic or []:
            name, sep, replicas = spec.partition("=")
            entry = {"topic": name, "replicas": replicas if sep else "*"}  # "TOPIC=": none (exempt from a glob)
            topics = body.setdefault("topics", [])
            # Replaced where it stands: among globs the first match wins, so an entry's place is configuration.
            at = next((i for i, t in enumerate(topics) if t.get("topic") == name), None)
            if at is None:
                topics.append(entry)
            else:
                topics[at] = entry
        for glob in args.consumer or []:
            if not any(c.get("client_id") == glob for c in body.get("consumers", [])):
                body.setdefault("consumers", []).append({"client_id": glob})
    # A file that carries a revision (what GET answered, edited) is checked against it, as GET's own would be
    based_on = body.get("revision", current.get("revision")) if isinstance(body, dict) else None
    return put_section(args, _PATH, body, based_on)


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="action", required=True, metavar="ACTION")

    q = sub.add_parser("status", help="show the throttle configuration and measured rates")
    add_admin_arguments(q)
    q.set_defaults(_action=_status)
    q = sub.add_parser("clear", help="remove every throttle (the defaults)")
    add_admin_arguments(q)
    add_write_arguments(q)
    q.set_defaults(_action=_clear)
    q = sub.add_parser("set", help="change the throttle configuration")
    add_admin_arguments(q)
    add_write_arguments(q)
    q.add_argument("--leader-rate", type=_size_arg, metavar="RATE", help="bytes/s to fetchers, e.g. 5MB")
    q.add_argument("--follower-rate", type=_size_arg, metavar="RATE", help="bytes/s fetched upstream")
    q.add_argument("--topic", action="append", metavar="TOPIC[=REPLICAS]",
                   help='throttled topic name or glob ("orders-*": quote it); REPLICAS "*" (the default), '
                        '"partition:broker,..." or empty ("TOPIC=": none, e.g. to exempt a topic from a glob); '
                        'repeatable')
    q.add_argument("--consumer", action="append", metavar="GLOB", help="client.id glob to throttle; repeatable")
    q.add_argument("--window-s", type=float, help="sample window, seconds")
    q.add_argument("--samples", type=int, help="samples in the quota window")
    q.add_argument("--file", metavar="JSON", help="PUT this JSON file as the whole [throttle] section")
    q.set_defaults(_action=_set)
    q = sub.add_parser("plan", help="move time and safe throttle range (KIP-73's sizing formulas)")
    q.add_argument("--bytes", type=_size_arg, required=True, help="bytes to move, e.g. 500GB")
    q.add_argument("--inbound-rate", type=_size_arg, required=True, metavar="IN",
                   help="max inbound (produce) bytes/s on the busiest broker")
    q.add_argument("--throttle", type=_size_arg, required=True, metavar="T", help="throttle, bytes/s")
    q.add_argument("--network", type=_size_arg, metavar="N", help="network throughput, bytes/s")
    q.add_argument("--replication-factor", type=int, default=3, metavar="R", help="replication factor (default 3)")
    q.set_defaults(_action=_plan)


def run(args: argparse.Namespace) -> int:
    return int(args._action(args))
