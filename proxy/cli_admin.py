"""The admin API as the ``sluice`` commands that change a running Sluice call it (``sluice throttle``, ``sluice
quota``): the URL and TLS options, the bearer token, one JSON call with its errors as one line.

The admin API's bearer token comes from ``SLUICE_ADMIN__TOKEN`` (the variable the server reads its token from)
or ``--token-file FILE``, never from the command line, where every user on the host sees it (``ps``). An
``https://`` admin URL is verified against ``--cacert`` (else the system's CAs). Each call says who makes it
(``X-Sluice-Changed-By``: user@host and the command), which a fleet's control record keeps.
"""

from __future__ import annotations

import argparse
import getpass
import json
import os
import socket
import ssl
import urllib.error
import urllib.request
from typing import Any

__all__ = ["TOKEN_ENV", "add_admin_arguments", "admin_call", "admin_token"]

TOKEN_ENV = "SLUICE_ADMIN__TOKEN"


def admin_token(token_file: str | None) -> str:
    """The bearer token: the file's contents (stripped) or $SLUICE_ADMIN__TOKEN; "" when neither is set."""
    if token_file:
        try:
            with open(token_file, encoding="utf-8") as fh:
                return fh.read().strip()
        except OSError as e:
            raise SystemExit(f"error: --token-file {token_file}: {e.strerror or e}") from None
    return os.environ.get(TOKEN_ENV, "").strip()


def add_admin_arguments(q: argparse.ArgumentParser) -> None:
    q.add_argument("--admin", required=True, metavar="URL", help="admin base URL, e.g. http://127.0.0.1:9644")
    q.add_argument("--token-file", metavar="FILE",
                   help=f"file holding the admin bearer token (default: ${TOKEN_ENV}, if set)")
    q.add_argument("--cacert", metavar="FILE", help="CA bundle to verify an https:// admin URL with")
    q.add_argument("--timeout", type=float, default=10.0, help="HTTP timeout, seconds (default 10)")


def _user() -> str:
    try:
        return getpass.getuser()
    except (OSError, KeyError):  # no login name and no passwd entry (a container's arbitrary uid)
        return "?"


def admin_call(args: argparse.Namespace, method: str, path: str, command: str, body: Any = None) -> Any:
    """``method`` ``path`` on ``args.admin`` with a JSON ``body``; the JSON answer. SystemExit with one line
    (the server's error message) on an HTTP error or an unreachable server."""
    url = args.admin.rstrip("/") + path
    # who changed it, in a fleet's control record (proxy/fleet/records.py changed_by)
    headers = {"Content-Type": "application/json",
               "X-Sluice-Changed-By": f"{_user()}@{socket.gethostname()} ({command})"}
    token = admin_token(args.token_file)
    if token:
        headers["Authorization"] = f"Bearer {token}"
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method, headers=headers)
    context = ssl.create_default_context(cafile=args.cacert) if url.startswith("https:") else None
    try:
        with urllib.request.urlopen(req, timeout=args.timeout, context=context) as resp:
            return json.loads(resp.read())
    except urllib.error.HTTPError as e:
        detail = e.read().decode(errors="replace").strip()
        try:
            detail = json.loads(detail).get("error", detail)
        except (json.JSONDecodeError, AttributeError):
            pass
        raise SystemExit(f"error: {method} {url}: HTTP {e.code}: {detail}") from None
    except (urllib.error.URLError, OSError) as e:
        raise SystemExit(f"error: {method} {url}: {getattr(e, 'reason', e)}") from None
