"""The commands' side of the admin API (``sluice config``, ``sluice throttle``, ``sluice quota``, ``sluice fleet
rollback``): its arguments and its calls.

Who calls is what the admin API authenticates (proxy/admin.py): a bearer token from ``--token-file`` or
``SLUICE_ADMIN__TOKEN`` (never from the command line, where every user on the host sees it: ``ps``), or a client
certificate (``--cert``/``--key``) with an ``https://`` admin URL. An ``https://`` URL is verified against
``--cacert`` (else the system's CAs). An HTTP error is one line naming the call and the server's reason, and exit
code 1.
"""

from __future__ import annotations

import argparse
import json
import os
import ssl
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

__all__ = ["TOKEN_ENV", "add_admin_arguments", "admin_token", "call"]

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
    q.add_argument("--cert", metavar="FILE", help="client certificate (PEM) for an admin API that takes them")
    q.add_argument("--key", metavar="FILE", help="its private key (PEM)")
    q.add_argument("--timeout", type=float, default=30.0, help="HTTP timeout, seconds (default 30)")


def call(args: argparse.Namespace, method: str, path: str, body: Any = None, *, dry_run: bool = False) -> Any:
    """The JSON answer of ``method path`` on ``args.admin``; SystemExit with the server's reason otherwise."""
    url = args.admin.rstrip("/") + path + ("?" + urllib.parse.urlencode({"dry_run": 1}) if dry_run else "")
    headers = {"Content-Type": "application/json"}
    token = admin_token(args.token_file)
    if token:
        headers["Authorization"] = f"Bearer {token}"
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method, headers=headers)
    context = None
    if url.startswith("https:"):
        context = ssl.create_default_context(cafile=args.cacert)
        if args.cert:
            context.load_cert_chain(args.cert, args.key)
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
