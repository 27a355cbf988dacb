"""The admin HTTP server: /metrics, /healthz, /readyz, and the routes others add (proxy/reconfigure.py:
GET/PUT of each run-time changeable section).

============  ======  ==================================================================================
route         method  answer
============  ======  ==================================================================================
/metrics      GET     prometheus_client text exposition of the proxy's registry (``proxy.metrics.Metrics``)
/healthz      GET     200 ``ok`` while the process runs (liveness: only "is the loop alive")
/readyz       GET     200 ``ready`` if ``await readiness()`` is true, else 503 ``not ready`` (also when
                      readiness raises or takes longer than 5 s: a probe must answer, not hang)
============  ======  ==================================================================================

Every GET route answers HEAD too; a path no route has is 404, a method its path lacks 405 (proxy/http_routes.py).

Extension point for mutating routes: before :meth:`AdminServer.start`, call
``admin.add_route("PUT", path, handler, mutating=True)``; ``mutating=True`` wraps the handler in
:func:`require_principal`, so authentication is enforced in one place; the handler asks it again for who called
(a fleet's history records it). A handler that needs the check for only some requests (GET
open, PUT guarded on one path) calls ``require_principal(request)`` itself.

Authentication: who calls is a *principal*, from (first match) the client certificate (``client_ca_file``: mTLS,
the certificate verified against that CA; the principal is its subject's CN), a bearer token of
``[[admin.principals]]`` (its ``name``), or the token of ``[admin] token``/``token_file`` (principal ``admin``).
With none of them configured every caller is let through as ``anonymous (<address>)``. Client certificates are
asked for, not required, at the TLS handshake: probes (/healthz, /readyz) carry none.

Security: tokens come from files or SLUICE_ADMIN__TOKEN, never from a command line (visible to every user in
``ps``); with ``auth_reads`` the GET endpoints need a principal too (except /healthz and /readyz); with
``tls_cert_file``/``tls_key_file`` the server speaks HTTPS. It binds 127.0.0.1 unless ``[admin] host`` says
otherwise. A refused request is logged (path, method, client) without the header it carried.

It runs on the proxy's event loop: handlers must not block (generate_latest() of Sluice's few collectors
takes well under a millisecond). What to answer is decided here and in :mod:`proxy.http_routes` (sans-IO: a
:class:`~proxy.http_routes.Request` in, a :class:`~proxy.http_routes.Response` out); the sockets, HTTP/1.1 (h11),
TLS, keep-alive and limits are :mod:`proxy.io.http_server`'s.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hmac
import ssl
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST

from proxy.accesslog import get_logger
from proxy.config import AdminSettings
from proxy.http_routes import Handler, HTTPError, Request, Response, Routes, text_response
from proxy.io.http_server import HttpServer
from proxy.metrics import Metrics

__all__ = ["READINESS_TIMEOUT_S", "SHUTDOWN_GRACE_S", "AdminServer", "Handler", "require_principal"]

# Kubernetes' default probe timeout is 1 s and Docker's 30 s; 5 s bounds a hung readiness check either way.
READINESS_TIMEOUT_S = 5.0
#: how long stop() lets the requests in flight finish before it closes their connections
SHUTDOWN_GRACE_S = 2.0

log = get_logger("sluice.admin")


class _Auth:
    """Who may call: the tokens in force (token -> principal), and whether anyone is checked at all."""

    def __init__(self, settings: AdminSettings) -> None:
        self.tokens = settings.tokens()
        self.required = settings.authenticates


def _certificate_cn(certificate: Mapping[str, Any] | None) -> str | None:
    for rdn in (certificate or {}).get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                return str(value)
    return None


def require_principal(request: Request) -> str:
    """Who calls (see the module docstring); 401 when the admin API authenticates and the request says no one
    it knows (asked again for the same request, the answer is the same). Tokens are compared in constant time,
    so response timing does not reveal how much of a guessed token was right."""
    auth = request.auth
    if not isinstance(auth, _Auth):
        raise TypeError("require_principal() needs a request the AdminServer received")
    principal = _certificate_cn(request.certificate)
    if principal is None:
        scheme, _, supplied = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() == "bearer":
            given = supplied.strip().encode()
            for token, name in auth.tokens.items():
                if hmac.compare_digest(given, token.encode()):
                    principal = name
    if principal is None and not auth.required:
        principal = f"anonymous ({request.client})"
    if principal is None:
        log.warning("admin_unauthorized", method=request.method, path=request.path, client=request.client)
        raise HTTPError(text_response("missing or wrong bearer token (or client certificate)\n", 401,
                                      {"WWW-Authenticate": 'Bearer realm="sluice-admin"'}))
    return principal


def _guarded(handler: Handler) -> Handler:
    async def guarded(request: Request) -> Response:
        require_principal(request)
        return await handler(request)

    return guarded


class AdminServer:
    """The admin HTTP server. ``start()`` binds ``settings.host:settings.port`` (0 = a free port, see
    :attr:`port`); ``stop()`` closes it. When ``settings.enabled`` is false, start/stop do nothing."""

    def __init__(self, settings: AdminSettings, readiness: Callable[[], Awaitable[bool]],
                 metrics: Metrics) -> None:
        self._settings = settings
        self._readiness = readiness
        self._metrics_source = metrics
        self._auth = _Auth(settings)
        self._auth_reads = settings.auth_reads
        self._routes = Routes()
        self._routes.add("GET", "/metrics", _guarded(self._metrics) if settings.auth_reads else self._metrics)
        self._routes.add("GET", "/healthz", self._healthz)
        self._routes.add("GET", "/readyz", self._readyz)
        self._server: HttpServer | None = None

    # ----------------------------------------------------------------------------------- extension point

    def add_route(self, method: str, path: str, handler: Handler, *, mutating: bool = False) -> None:
        """Add a route before :meth:`start`. ``mutating=True`` requires a principal (:func:`require_principal`)
        before ``handler`` runs; a GET route answers HEAD too."""
        if self._server is not None:
            raise RuntimeError("add routes before AdminServer.start()")
        guard = mutating or (self._auth_reads and method.upper() in ("GET", "HEAD"))
        self._routes.add(method, path, _guarded(handler) if guard else handler)

    async def answer(self, request: Request) -> Response:
        """The answer to ``request`` (what :class:`~proxy.io.http_server.HttpServer` calls for each)."""
        return await self._routes.answer(dataclasses.replace(request, auth=self._auth))

    # ------------------------------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        if not self._settings.enabled or self._server is not None:
            return
        tls = None
        if self._settings.tls_cert_file:
            tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            tls.minimum_version = ssl.TLSVersion.TLSv1_2
            tls.load_cert_chain(self._settings.tls_cert_file, self._settings.tls_key_file)
            if self._settings.client_ca_file:
                tls.load_verify_locations(self._settings.client_ca_file)
                tls.verify_mode = ssl.CERT_OPTIONAL  # verified when given; probes give none
        self._server = await HttpServer.start(self.answer, self._settings.host, self._settings.port, tls)

    async def stop(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            await server.stop(SHUTDOWN_GRACE_S)

    @property
    def port(self) -> int:
        """The bound port (useful when ``settings.port`` is 0). RuntimeError if the server is not running."""
        if self._server is None:
            raise RuntimeError("admin server is not running")
        return self._server.port

    # -------------------------------------------------------------------------------------------- handlers

    async def _metrics(self, _request: Request) -> Response:
        return Response(body=self._metrics_source.exposition(), content_type=CONTENT_TYPE_LATEST)

    async def _healthz(self, _request: Request) -> Response:
        return text_response("ok\n")

    async def _readyz(self, _request: Request) -> Response:
        try:
            ready = await asyncio.wait_for(self._readiness(), READINESS_TIMEOUT_S)
        except TimeoutError:
            log.warning("readiness_timeout", timeout_s=READINESS_TIMEOUT_S)
            ready = False
        except Exception as exc:  # a failing check means "not ready", never a 500 with a traceback
            log.warning("readiness_error", error=repr(exc))
            ready = False
        if ready:
            return text_response("ready\n")
        return text_response("not ready\n", 503)
