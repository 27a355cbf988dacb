"""Sluice's admin routes (GET/PUT /throttles, /size-limits) on a free port over a Proxy that is not started: the
admin API and its effect on the configuration in force, without listeners or a broker; and :func:`call`, an HTTP
client for tests on the admin server's own event loop (the standard library's, in a thread: a client independent of
the server's HTTP code)."""

from __future__ import annotations

import asyncio
import json
import ssl
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from email.message import Message
from typing import Any

from proxy import reconfigure
from proxy.admin import AdminServer
from proxy.app import Settings
from proxy.server import Proxy


async def _ready() -> bool:
    return True


@asynccontextmanager
async def admin_over(settings: Settings) -> AsyncIterator[tuple[Proxy, str]]:
    """(the Proxy, the admin base URL) while the admin server runs on a free 127.0.0.1 port."""
    proxy = Proxy(settings)
    admin = AdminServer(settings.admin.model_copy(update={"enabled": True, "host": "127.0.0.1", "port": 0}),
                        _ready, proxy.metrics)
    reconfigure.add_routes(admin, proxy)
    await admin.start()
    try:
        yield proxy, f"http://127.0.0.1:{admin.port}"
    finally:
        await admin.stop()


@dataclass(frozen=True)
class Answer:
    status: int
    headers: Message
    body: bytes

    @property
    def text(self) -> str:
        return self.body.decode()

    def json(self) -> Any:
        return json.loads(self.body)


def _call(method: str, url: str, body: Any, headers: Mapping[str, str], tls: ssl.SSLContext | None) -> Answer:
    data = None if body is None else json.dumps(body).encode()
    sent = {**({} if data is None else {"Content-Type": "application/json"}), **headers}
    req = urllib.request.Request(url, data=data, method=method, headers=sent)
    try:
        with urllib.request.urlopen(req, timeout=10, context=tls) as resp:
            return Answer(resp.status, resp.headers, resp.read())
    except urllib.error.HTTPError as e:  # a status >= 400 is an answer too
        return Answer(e.code, e.headers, e.read())


async def call(method: str, url: str, body: Any = None, headers: Mapping[str, str] | None = None,
               tls: ssl.SSLContext | None = None) -> Answer:
    """``method url`` with ``body`` as JSON (when given): its answer, whatever the status. A connection or TLS
    failure raises (OSError, http.client.HTTPException)."""
    return await asyncio.to_thread(_call, method, url, body, headers or {}, tls)
