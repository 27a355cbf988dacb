"""The admin HTTP server (aiohttp): /metrics, /healthz, /readyz, and the routes others add (proxy/reconfigure.py:
GET/PUT of each run-time changeable section).

============  ======  ==================================================================================
route         method  answer
============  ======  ==================================================================================
/metrics      GET     prometheus_client text exposition of the proxy's registry (``proxy.metrics.Metrics``)
/healthz      GET     200 ``ok`` while the process runs (liveness: only "is the loop alive")
/readyz       GET     200 ``ready`` if ``await readiness()`` is true, else 503 ``not ready`` (also when
                      readiness raises or takes longer than 5 s: a probe must answer, not hang)
============  ======  ==================================================================================

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
takes well under a millisecond).
"""

from __future__ import annotations

import asyncio
import hmac
import ssl
from collections.abc import Awaitable, Callable

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST

from proxy.accesslog import get_logger
from proxy.config import AdminSettings
from proxy.metrics import Metrics

__all__ = ["READINESS_TIMEOUT_S", "AdminServer", "Handler", "require_principal"]

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

# Kubernetes' default probe timeout is 1 s and Docker's 30 s; 5 s bounds a hung readiness check either way.
READINESS_TIMEOUT_S = 5.0

log = get_logger("sluice.admin")


class _Auth:
    """Who may call: the tokens in force (token -> principal), and whether anyone is checked at all."""

    def __init__(self, settings: AdminSettings) -> None:
        self.tokens = settings.tokens()
        self.required = settings.authenticates


_AUTH_KEY = web.AppKey("sluice_admin_auth", _Auth)


def _certificate_cn(request: web.Request) -> str | None:
    transport = request.transport
    cert = transport.get_extra_info("peercert") if transport is not None else None
    if not cert:
        return None
    for rdn in cert.get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                return str(value)
    return None


def require_principal(request: web.Request) -> str:
    """Who calls (see the module docstring); 401 when the admin API authenticates and the request says no one
    it knows (asked again for the same request, the answer is the same). Tokens are compared in constant time,
    so response timing does not reveal how much of a guessed token was right."""
    auth = request.app[_AUTH_KEY]
    principal = _certificate_cn(request)
    if principal is None:
        scheme, _, supplied = request.headers.get("Authorization", "").partition(" ")
        if scheme.lower() == "bearer":
            given = supplied.strip().encode()
            for token, name in auth.tokens.items():
                if hmac.compare_digest(given, token.encode()):
                    principal = name
    if principal is None and not auth.required:
        principal = f"anonymous ({request.remote})"
    if principal is None:
        log.warning("admin_unauthorized", method=request.method, path=request.path, client=request.remote)
        raise web.HTTPUnauthorized(
            text="missing or wrong bearer token (or client certificate)\n",
            headers={"WWW-Authenticate": 'Bearer realm="sluice-admin"'},
        )
    return principal


def _guarded(handler: Handler) -> Handler:
    async def guarded(request: web.Request) -> web.StreamResponse:
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
        self._app = web.Application()
        self._app[_AUTH_KEY] = _Auth(settings)
        self._auth_reads = settings.auth_reads
        self._app.router.add_get("/metrics", _guarded(self._metrics) if settings.auth_reads else self._metrics)
        self._app.router.add_get("/healthz", self._healthz)
        self._app.router.add_get("/readyz", self._readyz)
        self._runner: web.AppRunner | None = None
        self._port: int | None = None

    # ----------------------------------------------------------------------------------- extension point

    def add_route(self, method: str, path: str, handler: Handler, *, mutating: bool = False) -> None:
        """Add a route before :meth:`start` (aiohttp freezes the router then). ``mutating=True`` requires a
        principal (:func:`require_principal`) before ``handler`` runs."""
        if self._runner is not None:
            raise RuntimeError("add routes before AdminServer.start()")
        guard = mutating or (self._auth_reads and method.upper() in ("GET", "HEAD"))
        self._app.router.add_route(method, path, _guarded(handler) if guard else handler)

    # ------------------------------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        if not self._settings.enabled or self._runner is not None:
            return
        # access_log=None: a 1 s Prometheus scrape would otherwise write a log line every second.
        # shutdown_timeout: stop() waits this long for in-flight admin requests, not aiohttp's 60 s default.
        runner = web.AppRunner(self._app, access_log=None, handle_signals=False, shutdown_timeout=2.0)
        await runner.setup()
        tls = None
        if self._settings.tls_cert_file:
            tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            tls.minimum_version = ssl.TLSVersion.TLSv1_2
            tls.load_cert_chain(self._settings.tls_cert_file, self._settings.tls_key_file)
            if self._settings.client_ca_file:
                tls.load_verify_locations(self._settings.client_ca_file)
                tls.verify_mode = ssl.CERT_OPTIONAL  # verified when given; probes give none
        site = web.TCPSite(runner, self._settings.host, self._settings.port, ssl_context=tls)
        try:
            await site.start()
        except BaseException:
            await runner.cleanup()
            raise
        self._runner = runner
        self._port = int(runner.addresses[0][1])

    async def stop(self) -> None:
        runner, self._runner = self._runner, None
        self._port = None
        if runner is not None:
            await runner.cleanup()

    @property
    def port(self) -> int:
        """The bound port (useful when ``settings.port`` is 0). RuntimeError if the server is not running."""
        if self._port is None:
            raise RuntimeError("admin server is not running")
        return self._port

    # -------------------------------------------------------------------------------------------- handlers

    async def _metrics(self, _request: web.Request) -> web.Response:
        # CONTENT_TYPE_LATEST carries version and charset parameters, which aiohttp's content_type= argument
        # rejects; set the header verbatim instead.
        return web.Response(body=self._metrics_source.exposition(), headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def _healthz(self, _request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def _readyz(self, _request: web.Request) -> web.Response:
        try:
            ready = await asyncio.wait_for(self._readiness(), READINESS_TIMEOUT_S)
        except TimeoutError:
            log.warning("readiness_timeout", timeout_s=READINESS_TIMEOUT_S)
            ready = False
        except Exception as exc:  # a failing check means "not ready", never a 500 with a traceback
            log.warning("readiness_error", error=repr(exc))
            ready = False
        if ready:
            return web.Response(text="ready\n")
        return web.Response(status=503, text="not ready\n")
