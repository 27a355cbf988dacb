"""proxy.admin over a real aiohttp server on a free port: /metrics, /healthz, /readyz, who may call (tokens, their
principals, client certificates)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

from proxy import admin as admin_module
from proxy import metrics
from proxy.admin import AdminServer, require_principal
from proxy.config import AdminSettings
from proxy.metrics import Metrics

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


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
        yield session


def url(server: AdminServer, path: str) -> str:
    return f"http://127.0.0.1:{server.port}{path}"


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Parsed exposition: (sample name, sorted labels) -> value. The parser raises on malformed text."""
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


async def test_metrics_parse_and_show_precreated_children(http: aiohttp.ClientSession) -> None:
    server = await started(Ready())
    try:
        async with http.get(url(server, "/metrics")) as resp:
            assert resp.status == 200
            assert resp.headers["Content-Type"].startswith("text/plain")
            text = await resp.text()
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


async def test_metrics_reflect_observations(http: aiohttp.ClientSession) -> None:
    server = await started(Ready())
    key_count = ("sluice_requests_total", (("api", "Fetch"), ("version", "17")))
    key_hist = ("sluice_request_latency_seconds_count", (("api", "Fetch"),))
    key_bucket = ("sluice_request_latency_seconds_bucket", (("api", "Fetch"), ("le", "0.0025")))
    key_bytes = ("sluice_bytes_total", (("direction", "proxy_to_client"),))
    try:
        async with http.get(url(server, "/metrics")) as resp:
            before = samples(await resp.text())
        METRICS.requests.observe("Fetch", 17, 0.002)
        METRICS.bytes_proxy_to_client.inc(1234)
        async with http.get(url(server, "/metrics")) as resp:
            after = samples(await resp.text())
    finally:
        await server.stop()
    assert after[key_count] - before.get(key_count, 0.0) == 1
    assert after[key_hist] - before.get(key_hist, 0.0) == 1
    assert after[key_bucket] - before.get(key_bucket, 0.0) == 1  # 2 ms falls in the 2.5 ms bucket
    assert after[key_bytes] - before[key_bytes] == 1234


async def test_healthz(http: aiohttp.ClientSession) -> None:
    ready = Ready()
    ready.value = False  # liveness does not depend on readiness
    server = await started(ready)
    try:
        async with http.get(url(server, "/healthz")) as resp:
            assert (resp.status, await resp.text()) == (200, "ok\n")
    finally:
        await server.stop()
    assert ready.calls == 0


async def test_readyz_follows_readiness(http: aiohttp.ClientSession) -> None:
    ready = Ready()
    server = await started(ready)
    try:
        async with http.get(url(server, "/readyz")) as resp:
            assert resp.status == 200
        ready.value = False
        async with http.get(url(server, "/readyz")) as resp:
            assert resp.status == 503
        ready.value = True
        async with http.get(url(server, "/readyz")) as resp:
            assert resp.status == 200
    finally:
        await server.stop()
    assert ready.calls == 3


async def test_readyz_is_503_when_check_raises_or_hangs(
    http: aiohttp.ClientSession, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def broken() -> bool:
        raise ConnectionRefusedError("upstream down")

    async def hangs() -> bool:
        await asyncio.sleep(3600)
        return True

    monkeypatch.setattr(admin_module, "READINESS_TIMEOUT_S", 0.05)
    for check in (broken, hangs):
        server = await started(check)
        try:
            async with http.get(url(server, "/readyz")) as resp:
                assert resp.status == 503
        finally:
            await server.stop()


async def ok_handler(request: web.Request) -> web.Response:
    return web.Response(text="changed\n")


async def test_mutating_route_requires_configured_token(http: aiohttp.ClientSession) -> None:
    server = AdminServer(AdminSettings(port=0, token="s3cret"), Ready(), METRICS)
    server.add_route("PUT", "/throttles", ok_handler, mutating=True)
    await server.start()
    try:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic s3cret"}):
            async with http.put(url(server, "/throttles"), headers=headers) as resp:
                assert resp.status == 401, headers
                assert resp.headers["WWW-Authenticate"].startswith("Bearer")
        async with http.put(url(server, "/throttles"), headers={"Authorization": "Bearer s3cret"}) as resp:
            assert (resp.status, await resp.text()) == (200, "changed\n")
        # Read-only endpoints stay open: Prometheus and probes carry no token.
        async with http.get(url(server, "/metrics")) as resp:
            assert resp.status == 200
    finally:
        await server.stop()


async def test_no_token_configured_means_no_check(http: aiohttp.ClientSession) -> None:
    server = AdminServer(AdminSettings(port=0), Ready(), METRICS)
    server.add_route("PUT", "/throttles", ok_handler, mutating=True)
    await server.start()
    try:
        async with http.put(url(server, "/throttles")) as resp:
            assert resp.status == 200
    finally:
        await server.stop()


async def test_require_principal_helper_inside_a_handler(http: aiohttp.ClientSession) -> None:
    async def mixed(request: web.Request) -> web.Response:
        if request.query.get("write"):
            require_principal(request)
        return web.Response(text="fine\n")

    server = AdminServer(AdminSettings(port=0, token="t"), Ready(), METRICS)
    server.add_route("GET", "/mixed", mixed)
    await server.start()
    try:
        async with http.get(url(server, "/mixed")) as resp:
            assert resp.status == 200
        async with http.get(url(server, "/mixed?write=1")) as resp:
            assert resp.status == 401
        async with http.get(url(server, "/mixed?write=1"), headers={"Authorization": "Bearer t"}) as resp:
            assert resp.status == 200
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


async def test_token_file_auth_reads_and_https(http: aiohttp.ClientSession, tmp_path: Path) -> None:
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
            async with http.request(method, base + path, ssl=tls) as resp:
                assert resp.status == 401, (method, path)
            async with http.request(method, base + path, ssl=tls, headers=good) as resp:
                assert resp.status == 200, (method, path)
        for probe in ("/healthz", "/readyz"):  # probes carry no credentials
            async with http.get(base + probe, ssl=tls) as resp:
                assert resp.status == 200
        with pytest.raises(aiohttp.ClientError):  # plain HTTP is not served
            async with http.get(f"http://127.0.0.1:{server.port}/healthz") as resp:
                await resp.read()
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


async def whoami(request: web.Request) -> web.Response:
    return web.Response(text=require_principal(request))


async def test_each_token_and_client_certificate_is_its_principal(http: aiohttp.ClientSession,
                                                                  tmp_path: Path) -> None:
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
                             principals=[{"name": n, "token_file": str(f)} for n, f in tokens.items()])  # type: ignore[misc]
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
            async with http.put(base, ssl=tls(), headers={"Authorization": f"Bearer {token}"}) as resp:
                assert (resp.status, await resp.text()) == (200, principal)
        async with http.put(base, ssl=tls(clients.issue("carol", client=True, hosts=()))) as resp:
            assert (resp.status, await resp.text()) == (200, "carol")
        async with http.put(base, ssl=tls()) as resp:
            assert resp.status == 401
        with pytest.raises(aiohttp.ClientError):
            async with http.put(base, ssl=tls(strangers.issue("mallory", client=True, hosts=()))) as resp:
                await resp.read()
    finally:
        await server.stop()
