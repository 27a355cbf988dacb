"""proxy.admin over its real HTTP server on a free port: /metrics, /healthz, /readyz, who may call (tokens, their
principals, client certificates), and what the server does with requests HTTP does not allow."""

from __future__ import annotations

import asyncio
import http.client
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
from prometheus_client import CONTENT_TYPE_LATEST
from prometheus_client.parser import text_string_to_metric_families
from structlog.testing import capture_logs

from proxy import admin as admin_module
from proxy import metrics
from proxy.admin import AdminServer, require_principal
from proxy.config import AdminSettings
from proxy.config.sections import AdminPrincipalSettings
from proxy.http_routes import Request, Response, text_response
from proxy.io import http_server
from proxy.metrics import Metrics
from tests.support.admin import call

Readiness = Callable[[], Awaitable[bool]]


class Ready:
    """A readiness check the test flips; counts calls so the test knows /readyz really asked it."""

    def __init__(self) -> None:
        self.value = True
        self.calls = 0

    async def __call__(self) -> bool:
        self.calls += 1
        return self.value


#: the registry the admin servers under test serve
METRICS = Metrics()


async def started(readiness: Readiness, **settings: object) -> AdminServer:
    server = AdminServer(AdminSettings(port=0, **settings), readiness, METRICS)  # type: ignore[arg-type]
    await server.start()
    return server


def url(server: AdminServer, path: str) -> str:
    return f"http://127.0.0.1:{server.port}{path}"


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Parsed exposition: (sample name, sorted labels) -> value. The parser raises on malformed text."""
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


async def test_metrics_parse_and_show_precreated_children() -> None:
    server = await started(Ready())
    try:
        resp = await call("GET", url(server, "/metrics"))
        assert resp.status == 200
        assert resp.headers["Content-Type"] == CONTENT_TYPE_LATEST  # Prometheus reads the format version from it
        text = resp.text
    finally:
        await server.stop()
    got = samples(text)
    for direction in metrics.DIRECTIONS:
        assert ("sluice_bytes_total", (("direction", direction),)) in got
    for side in metrics.SIDES:
        assert ("sluice_connections_open", (("side", side),)) in got
        assert ("sluice_connections_total", (("side", side),)) in got
    for reason in metrics.REJECT_REASONS:
        assert ("sluice_frames_rejected_total", (("reason", reason),)) in got
    assert ("sluice_listeners", ()) in got
    assert ("sluice_upstream_connect_errors_total", ()) in got
    build = [labels for (name, labels) in got if name == "sluice_build_info"]
    assert build and dict(build[0])["version"] == metrics.sluice_version()


async def test_metrics_reflect_observations() -> None:
    server = await started(Ready())
    key_count = ("sluice_requests_total", (("api", "Fetch"), ("version", "17")))
    key_hist = ("sluice_request_latency_seconds_count", (("api", "Fetch"),))
    key_bucket = ("sluice_request_latency_seconds_bucket", (("api", "Fetch"), ("le", "0.0025")))
    key_bytes = ("sluice_bytes_total", (("direction", "proxy_to_client"),))
    try:
        before = samples((await call("GET", url(server, "/metrics"))).text)
        METRICS.requests.observe("Fetch", 17, 0.002)
        METRICS.bytes_proxy_to_client.inc(1234)
        after = samples((await call("GET", url(server, "/metrics"))).text)
    finally:
        await server.stop()
    assert after[key_count] - before.get(key_count, 0.0) == 1
    assert after[key_hist] - before.get(key_hist, 0.0) == 1
    assert after[key_bucket] - before.get(key_bucket, 0.0) == 1  # 2 ms falls in the 2.5 ms bucket
    assert after[key_bytes] - before[key_bytes] == 1234


async def test_healthz() -> None:
    ready = Ready()
    ready.value = False  # liveness does not depend on readiness
    server = await started(ready)
    try:
        resp = await call("GET", url(server, "/healthz"))
        assert (resp.status, resp.text) == (200, "ok\n")
    finally:
        await server.stop()
    assert ready.calls == 0


async def test_readyz_follows_readiness() -> None:
    ready = Ready()
    server = await started(ready)
    try:
        assert (await call("GET", url(server, "/readyz"))).status == 200
        ready.value = False
        assert (await call("GET", url(server, "/readyz"))).status == 503
        ready.value = True
        assert (await call("GET", url(server, "/readyz"))).status == 200
    finally:
        await server.stop()
    assert ready.calls == 3


async def test_readyz_is_503_when_check_raises_or_hangs(monkeypatch: pytest.MonkeyPatch) -> None:
    async def broken() -> bool:
        raise ConnectionRefusedError("upstream down")

    async def hangs() -> bool:
        await asyncio.sleep(3600)
        return True

    monkeypatch.setattr(admin_module, "READINESS_TIMEOUT_S", 0.05)
    for check in (broken, hangs):
        server = await started(check)
        try:
            assert (await call("GET", url(server, "/readyz"))).status == 503
        finally:
            await server.stop()


async def ok_handler(request: Request) -> Response:
    return text_response("changed\n")


async def test_mutating_route_requires_configured_token() -> None:
    server = AdminServer(AdminSettings(port=0, token="s3cret"), Ready(), METRICS)
    server.add_route("PUT", "/throttles", ok_handler, mutating=True)
    await server.start()
    try:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic s3cret"}):
            resp = await call("PUT", url(server, "/throttles"), headers=headers)
            assert resp.status == 401, headers
            assert resp.headers["WWW-Authenticate"].startswith("Bearer")
        resp = await call("PUT", url(server, "/throttles"), headers={"Authorization": "Bearer s3cret"})
        assert (resp.status, resp.text) == (200, "changed\n")
        # Read-only endpoints stay open: Prometheus and probes carry no token.
        assert (await call("GET", url(server, "/metrics"))).status == 200
    finally:
        await server.stop()


async def test_no_token_configured_means_no_check() -> None:
    server = AdminServer(AdminSettings(port=0), Ready(), METRICS)
    server.add_route("PUT", "/throttles", ok_handler, mutating=True)
    await server.start()
    try:
        assert (await call("PUT", url(server, "/throttles"))).status == 200
    finally:
        await server.stop()


async def test_require_principal_helper_inside_a_handler() -> None:
    async def mixed(request: Request) -> Response:
        if request.query.get("write"):
            require_principal(request)
        return text_response("fine\n")

    server = AdminServer(AdminSettings(port=0, token="t"), Ready(), METRICS)
    server.add_route("GET", "/mixed", mixed)
    await server.start()
    try:
        assert (await call("GET", url(server, "/mixed"))).status == 200
        assert (await call("GET", url(server, "/mixed?write=1"))).status == 401
        assert (await call("GET", url(server, "/mixed?write=1"), headers={"Authorization": "Bearer t"})).status == 200
    finally:
        await server.stop()


async def test_port_lifecycle_and_disabled() -> None:
    server = AdminServer(AdminSettings(port=0), Ready(), METRICS)
    with pytest.raises(RuntimeError):
        _ = server.port
    await server.start()
    port = server.port
    assert port > 0
    with pytest.raises(RuntimeError):
        server.add_route("GET", "/late", ok_handler)
    await server.stop()
    with pytest.raises(RuntimeError):
        _ = server.port
    await server.stop()  # idempotent
    with pytest.raises(OSError):  # the port is really closed
        await asyncio.open_connection("127.0.0.1", port)

    disabled = AdminServer(AdminSettings(enabled=False, port=0), Ready(), METRICS)
    await disabled.start()
    with pytest.raises(RuntimeError):
        _ = disabled.port
    await disabled.stop()


async def test_token_file_auth_reads_and_https(tmp_path: Path) -> None:
    """The token from a file, required for reads too (auth_reads) except the probes, over HTTPS only."""
    import ssl

    from rig.pki import CA

    ca = CA(tmp_path, "admin")
    cert = ca.issue("admin")
    token_file = tmp_path / "token"
    token_file.write_text("f1le-t0ken\n")
    server = AdminServer(AdminSettings(port=0, token_file=str(token_file), auth_reads=True,
                                       tls_cert_file=str(cert.cert), tls_key_file=str(cert.key)), Ready(), METRICS)
    server.add_route("GET", "/throttles", ok_handler)
    server.add_route("PUT", "/throttles", ok_handler, mutating=True)
    await server.start()
    tls = ssl.create_default_context(cafile=str(ca.cert))
    base = f"https://127.0.0.1:{server.port}"
    good = {"Authorization": "Bearer f1le-t0ken"}
    try:
        for method, path in (("GET", "/metrics"), ("GET", "/throttles"), ("PUT", "/throttles")):
            assert (await call(method, base + path, tls=tls)).status == 401, (method, path)
            assert (await call(method, base + path, tls=tls, headers=good)).status == 200, (method, path)
        for probe in ("/healthz", "/readyz"):  # probes carry no credentials
            assert (await call("GET", base + probe, tls=tls)).status == 200
        with pytest.raises((OSError, http.client.HTTPException)):  # plain HTTP is not served
            await call("GET", f"http://127.0.0.1:{server.port}/healthz")
    finally:
        await server.stop()


def test_token_sources_are_validated(tmp_path: Path) -> None:
    from proxy.app import load_settings
    from proxy.config import ConfigError

    empty = tmp_path / "empty"
    empty.write_text("\n")
    both = tmp_path / "both.toml"
    both.write_text(f'[admin]\ntoken = "a"\ntoken_file = "{empty}"\n')
    with pytest.raises(ConfigError) as e:
        load_settings(both, env={})
    assert e.value.key == "admin.token_file" and "not both" in str(e.value)
    bad = tmp_path / "bad.toml"
    bad.write_text(f'[admin]\ntoken_file = "{empty}"\n')
    with pytest.raises(ConfigError) as e:
        load_settings(bad, env={})
    assert e.value.key == "admin.token_file"


async def whoami(request: Request) -> Response:
    return text_response(require_principal(request))


async def test_each_token_and_client_certificate_is_its_principal(tmp_path: Path) -> None:
    """[[admin.principals]]: a token per operator, its name the principal; the [admin] token is "admin"; a client
    certificate signed by client_ca_file is its CN, and a certificate of another CA fails the handshake; with
    none of them, the mutating route is refused (401)."""
    import ssl

    from rig.pki import CA

    ca, clients, strangers = CA(tmp_path / "server", "admin"), CA(tmp_path / "clients", "ops"), CA(tmp_path / "x")
    cert = ca.issue("admin")
    tokens = {}
    for name in ("alice", "bob"):
        tokens[name] = tmp_path / f"{name}.token"
        tokens[name].write_text(f"{name}-t0ken\n")
    settings = AdminSettings(port=0, token="legacy", tls_cert_file=str(cert.cert), tls_key_file=str(cert.key),
                             client_ca_file=str(clients.cert),
                             principals=[AdminPrincipalSettings(name=n, token_file=str(f)) for n, f in tokens.items()])
    server = AdminServer(settings, Ready(), METRICS)
    server.add_route("PUT", "/whoami", whoami, mutating=True)
    await server.start()
    base = f"https://127.0.0.1:{server.port}/whoami"

    def tls(issued: object | None = None) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=str(ca.cert))
        if issued is not None:
            context.load_cert_chain(str(issued.cert), str(issued.key))  # type: ignore[attr-defined]
        return context

    try:
        for token, principal in (("alice-t0ken", "alice"), ("bob-t0ken", "bob"), ("legacy", "admin")):
            resp = await call("PUT", base, tls=tls(), headers={"Authorization": f"Bearer {token}"})
            assert (resp.status, resp.text) == (200, principal)
        resp = await call("PUT", base, tls=tls(clients.issue("carol", client=True, hosts=())))
        assert (resp.status, resp.text) == (200, "carol")
        assert (await call("PUT", base, tls=tls())).status == 401
        with pytest.raises((OSError, http.client.HTTPException)):
            await call("PUT", base, tls=tls(strangers.issue("mallory", client=True, hosts=())))
    finally:
        await server.stop()


async def exchange(port: int, raw: bytes) -> bytes:
    """What the server sends back to ``raw`` until it closes the connection."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(raw)
        await writer.drain()
        return await asyncio.wait_for(reader.read(), 10)
    finally:
        writer.close()


async def test_malformed_and_oversized_requests_are_answered_and_closed_the_server_carries_on() -> None:
    server = await started(Ready())
    try:
        with capture_logs() as logs:
            for raw, status in ((b"GARBAGE\r\n\r\n", b"400"),
                                (b"GET /healthz HTTP/1.1\r\nHost x\r\n\r\n", b"400"),  # a header without ':'
                                (b"PUT /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 2000000\r\n\r\n", b"413")):
                answer = await exchange(server.port, raw)  # read() returned: the server closed the connection
                assert answer.startswith(b"HTTP/1.1 " + status), answer
                assert b"connection: close" in answer.lower()
        assert (await call("GET", url(server, "/healthz"))).status == 200
    finally:
        await server.stop()
    # one event for the two malformed requests: logged once per client per interval
    assert [(e["event"], e["client"], e["not_logged"]) for e in logs] == [("admin_bad_request", "127.0.0.1", 0)]


async def test_routes_methods_head_and_keep_alive() -> None:
    server = AdminServer(AdminSettings(port=0), Ready(), METRICS)
    server.add_route("PUT", "/throttles", ok_handler)
    await server.start()
    try:
        assert (await call("GET", url(server, "/nowhere"))).status == 404
        refused = await call("DELETE", url(server, "/throttles"))
        assert refused.status == 405 and refused.headers["Allow"] == "PUT"
        assert (await call("PUT", url(server, "/healthz"))).headers["Allow"] == "GET, HEAD"
        head = await call("HEAD", url(server, "/healthz"))
        assert (head.status, head.headers["Content-Length"], head.body) == (200, "3", b"")
        # two requests on one connection, the second sent before the first was answered (pipelined)
        request = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
        answer = await exchange(server.port, request + request[:-2] + b"Connection: close\r\n\r\n")
        assert answer.count(b"HTTP/1.1 200 OK\r\n") == 2 and answer.endswith(b"ok\n")
    finally:
        await server.stop()


async def test_stop_answers_the_request_in_flight_and_closes_idle_connections() -> None:
    entered, release = asyncio.Event(), asyncio.Event()

    async def slow(_request: Request) -> Response:
        entered.set()
        await release.wait()
        return text_response("done\n")

    server = AdminServer(AdminSettings(port=0), Ready(), METRICS)
    server.add_route("GET", "/slow", slow)
    await server.start()
    idle_reader, idle_writer = await asyncio.open_connection("127.0.0.1", server.port)
    in_flight = asyncio.ensure_future(exchange(server.port, b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\n"))
    await entered.wait()
    stopping = asyncio.ensure_future(server.stop())
    assert await asyncio.wait_for(idle_reader.read(), 10) == b""  # the idle connection: closed at once
    idle_writer.close()
    release.set()
    answer = await in_flight
    await stopping
    assert answer.startswith(b"HTTP/1.1 200 OK\r\n") and b"connection: close" in answer.lower()
    assert answer.endswith(b"done\n")


async def test_a_request_too_slow_is_408_and_a_silent_connection_is_closed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(http_server, "REQUEST_TIMEOUT_S", 0.1)
    monkeypatch.setattr(http_server, "KEEP_ALIVE_S", 0.1)
    server = await started(Ready())
    try:
        answer = await exchange(server.port, b"GET /healthz HTTP/1.1\r\nHost: x\r\n")  # the blank line never comes
        assert answer.startswith(b"HTTP/1.1 408 ") and b"connection: close" in answer.lower()
        assert await exchange(server.port, b"") == b""  # nothing sent: closed, nothing answered
        assert (await call("GET", url(server, "/healthz"))).status == 200
    finally:
        await server.stop()
