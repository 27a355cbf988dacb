"""TLS on both sides, mTLS, certificate reload, the PROXY protocol and the connection limits, against the real
broker (rig/secure_broker.py: SSL listener with client certificates required) and real clients (confluent-kafka,
Python's ssl as a TLS client that reports exactly why a handshake failed)."""

from __future__ import annotations

import socket
import ssl
import struct
import time
import uuid
from collections.abc import Iterator, MutableMapping
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from structlog.testing import capture_logs

from proxy.core.proxy_protocol import V2_SIGNATURE
from rig.pki import CA, Issued
from rig.proxy_thread import ProxyThread
from rig.raw import recv_exact
from rig.secure_broker import SecureBroker
from tests.support.consume import consume_values

RECORDS = 200

pytestmark = pytest.mark.broker


@pytest.fixture
def logs() -> Iterator[list[MutableMapping[str, Any]]]:
    with capture_logs() as events:
        yield events


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Sluice's own CA and certificates, and a second CA nobody trusts."""
    d = tmp_path_factory.mktemp("sluice-pki")
    ca, other = CA(d, "sluice"), CA(d, "other")
    return {"ca": ca, "server": ca.issue("server"), "client": ca.issue("client", client=True, hosts=()),
            "other": other, "stranger": other.issue("stranger", client=True, hosts=()),
            "expired": ca.issue("expired", expired=True),
            "wrong_host": ca.issue("wrong-host", hosts=("other.example",))}


def api_versions_frame(corr: int = 1) -> bytes:
    body = struct.pack(">hhih", 18, 0, corr, 4) + b"test"
    return struct.pack(">i", len(body)) + body


def round_trip(sock: socket.socket, corr: int = 1) -> int:
    """One ApiVersions v0 request; the response's (correlation id) once it is whole."""
    sock.sendall(api_versions_frame(corr))
    head = recv_exact(sock, 4)
    data = recv_exact(sock, struct.unpack(">i", head)[0])
    return int(struct.unpack(">i", data[:4])[0])


def closed_by_peer(sock: socket.socket, timeout: float = 10.0) -> bool:
    sock.settimeout(timeout)
    try:
        return sock.recv(1) == b""
    except (ConnectionResetError, ssl.SSLError):
        return True


def tls_client(ca: Path, client: Issued | None = None, host: str = "127.0.0.1") -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(ca))
    if client is not None:
        ctx.load_cert_chain(client.cert, client.key)
    return ctx


def listen_tls(pki: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"listen.tls.enabled": True, "listen.tls.cert_file": str(pki["server"].cert),
            "listen.tls.key_file": str(pki["server"].key), **extra}


def upstream_tls(broker: SecureBroker, **extra: Any) -> dict[str, Any]:
    return {"upstream.tls.enabled": True, "upstream.tls.ca_file": str(broker.ca.cert),
            "upstream.tls.cert_file": str(broker.client.cert), "upstream.tls.key_file": str(broker.client.key),
            **extra}


def client_config(bootstrap: str, pki: dict[str, Any] | None) -> dict[str, Any]:
    conf: dict[str, Any] = {"bootstrap.servers": bootstrap}
    if pki is not None:
        conf.update({"security.protocol": "SSL", "ssl.ca.location": str(pki["ca"].cert)})
    return conf


def produce_and_consume(conf: dict[str, Any], topic: str) -> list[bytes]:
    producer = Producer({**conf, "linger.ms": 5, "log_level": 0})
    for i in range(RECORDS):
        producer.produce(topic, f"record-{i:04d}".encode() + b"x" * 100)
    assert producer.flush(30) == 0
    return consume_values(conf, topic)


EXPECTED = [f"record-{i:04d}".encode() + b"x" * 100 for i in range(RECORDS)]


@pytest.mark.parametrize(("client_tls", "broker_tls"), [(False, False), (True, False), (False, True), (True, True)],
                         ids=["plain-plain", "tls-plain", "plain-tls", "tls-tls"])
def test_four_combinations_carry_every_record_once_in_order(secure_broker: SecureBroker, pki: dict[str, Any],
                                                            client_tls: bool, broker_tls: bool) -> None:
    overrides: dict[str, Any] = {}
    if client_tls:
        overrides.update(listen_tls(pki))
    if broker_tls:
        overrides.update(upstream_tls(secure_broker))
    upstream = secure_broker.ssl if broker_tls else secure_broker.plaintext
    topic = f"tls-{client_tls:d}{broker_tls:d}-{uuid.uuid4().hex[:8]}"
    with ProxyThread(upstream, **overrides) as sluice:
        got = produce_and_consume(client_config(sluice.bootstrap, pki if client_tls else None), topic)
        assert got == EXPECTED
        assert sluice.total("sluice_connections_refused_total") == 0


@pytest.mark.parametrize("broker_tls", [False, True], ids=["plain", "tls"])
def test_collected_fetch_responses_carry_every_record_once_in_order(secure_broker: SecureBroker,
                                                                    broker_tls: bool) -> None:
    """A size limit reads every Fetch response, so each is collected whole; here they are hundreds of KB, and
    the reads after the first go straight into the response's buffer (proxy/io/transports.py ReadInto), through
    the broker's TLS too: every record arrives once, in order, unchanged."""
    overrides: dict[str, Any] = {"size_limit.budgets": [{"client_id": "*", "fetch_max_bytes": 64 << 20}]}
    if broker_tls:
        overrides.update(upstream_tls(secure_broker))
    upstream = secure_broker.ssl if broker_tls else secure_broker.plaintext
    topic = f"collected-{broker_tls:d}-{uuid.uuid4().hex[:8]}"
    values = [f"record-{i:05d}".encode() + bytes([i % 251]) * 1000 for i in range(3000)]
    with ProxyThread(upstream, **overrides) as sluice:
        conf = client_config(sluice.bootstrap, None)
        producer = Producer({**conf, "linger.ms": 20, "log_level": 0})
        for value in values:
            producer.produce(topic, value)
        assert producer.flush(30) == 0
        assert consume_values(conf, topic) == values


def test_mtls_and_handshake_failures_are_clear_on_the_right_side(secure_broker: SecureBroker, pki: dict[str, Any],
                                                                 logs: list[MutableMapping[str, Any]]) -> None:
    ca = pki["ca"].cert
    with ProxyThread(secure_broker.plaintext, **listen_tls(pki, **{
            "listen.tls.client_auth": "required", "listen.tls.ca_file": str(ca)})) as sluice:
        port = sluice.proxy.bootstrap_port
        good = tls_client(ca, pki["client"]).wrap_socket(socket.create_connection(("127.0.0.1", port)),
                                                         server_hostname="127.0.0.1")
        assert round_trip(good, 7) == 7

        # A client without a certificate under mTLS: TLS 1.3 completes the client's side of the handshake, then
        # Sluice refuses it (its side names the cause, below) and the client finds the connection closed (or the
        # alert, if it arrives before the close).
        bare = tls_client(ca).wrap_socket(socket.create_connection(("127.0.0.1", port)), server_hostname="127.0.0.1")
        with pytest.raises((ssl.SSLError, ConnectionError)):
            round_trip(bare)
        # A client certificate from a CA Sluice does not trust: likewise.
        stranger = tls_client(ca, pki["stranger"]).wrap_socket(socket.create_connection(("127.0.0.1", port)),
                                                               server_hostname="127.0.0.1")
        with pytest.raises((ssl.SSLError, ConnectionError)):
            round_trip(stranger)
        # A client that trusts another CA refuses Sluice's certificate itself.
        with pytest.raises(ssl.SSLCertVerificationError, match="certificate verify failed"):
            tls_client(pki["other"].cert).wrap_socket(socket.create_connection(("127.0.0.1", port)),
                                                      server_hostname="127.0.0.1")
        refused = [e for e in logs if e["event"] == "connection_refused"]
        deadline = time.monotonic() + 10
        while len(refused) < 3 and time.monotonic() < deadline:
            time.sleep(0.02)  # bounded poll: the proxy's thread logs each refusal
            refused = [e for e in logs if e["event"] == "connection_refused"]
        errors = sorted(e["error"] for e in refused)
        assert len(refused) == 3 and all(e["reason"] == "tls_handshake" for e in refused), refused
        assert any("PEER_DID_NOT_RETURN_A_CERTIFICATE" in e for e in errors)
        assert any("CERTIFICATE_VERIFY_FAILED" in e for e in errors)  # the stranger's certificate
        assert any("UNKNOWN_CA" in e for e in errors)  # the client that refused Sluice's
        assert sluice.total("sluice_connections_refused_total", reason="tls_handshake") == 3
        assert round_trip(good, 8) == 8  # the good connection never noticed
        good.close()


@pytest.mark.parametrize("which", ["expired", "wrong_host"])
def test_a_bad_sluice_certificate_is_refused_by_the_client(secure_broker: SecureBroker, pki: dict[str, Any],
                                                           which: str) -> None:
    cert: Issued = pki[which]
    with ProxyThread(secure_broker.plaintext, **{"listen.tls.enabled": True, "listen.tls.cert_file": str(cert.cert),
                                                  "listen.tls.key_file": str(cert.key)}) as sluice:
        match = "certificate has expired" if which == "expired" else "mismatch, certificate is not valid"
        with pytest.raises(ssl.SSLCertVerificationError, match=match):
            address = ("127.0.0.1", sluice.proxy.bootstrap_port)
            tls_client(pki["ca"].cert).wrap_socket(socket.create_connection(address), server_hostname="127.0.0.1")


@pytest.mark.parametrize("case", ["wrong_ca", "hostname", "no_client_cert"])
def test_broker_side_failures_name_the_cause_once(secure_broker: SecureBroker, pki: dict[str, Any], case: str,
                                                  logs: list[MutableMapping[str, Any]]) -> None:
    tls = upstream_tls(secure_broker)
    upstream = secure_broker.ssl
    if case == "wrong_ca":
        tls["upstream.tls.ca_file"] = str(pki["other"].cert)
    elif case == "hostname":
        upstream = f"127.0.0.1:{secure_broker.ssl_port}"  # the broker's certificate names localhost only
    else:
        del tls["upstream.tls.cert_file"], tls["upstream.tls.key_file"]
    with ProxyThread(upstream, **tls) as sluice:
        errors: list[Any] = []
        producer = Producer({"bootstrap.servers": sluice.bootstrap, "socket.timeout.ms": 3000, "log_level": 0,
                             "message.timeout.ms": 3000, "reconnect.backoff.max.ms": 500})
        producer.produce("never", b"x", on_delivery=lambda err, _msg: errors.append(err))
        producer.flush(15)
        del producer
        assert len(errors) == 1 and errors[0] is not None  # not delivered: the client sees the failure
        if case == "no_client_cert":
            # TLS 1.3: the broker checks the certificate after Sluice's side of the handshake; its refusal comes
            # back on the first read, and the client's requests find the upstream closed.
            assert sluice.total("sluice_frames_rejected_total", reason="upstream_closed") >= 1
        else:
            failed = [e for e in logs if e["event"] == "upstream_connect_failed"]
            assert failed and "CERTIFICATE_VERIFY_FAILED" in failed[0]["error"]
            if case == "hostname":
                assert "mismatch, certificate is not valid for '127.0.0.1'" in failed[0]["error"]
            assert len(failed) == 1  # retries are counted, not logged again within the interval


def test_certificate_reload_new_connections_get_the_new_one_open_ones_continue(
        secure_broker: SecureBroker, pki: dict[str, Any], tmp_path: Path) -> None:
    ca: CA = pki["ca"]
    first = ca.issue("reload-first", file_stem=str(tmp_path / "live"))
    with ProxyThread(secure_broker.plaintext, **{"listen.tls.enabled": True, "listen.tls.cert_file": str(first.cert),
                                                  "listen.tls.key_file": str(first.key),
                                                  "listen.tls.reload_interval_s": 0.1}) as sluice:
        ctx = tls_client(ca.cert)
        port = sluice.proxy.bootstrap_port
        old = ctx.wrap_socket(socket.create_connection(("127.0.0.1", port)), server_hostname="127.0.0.1")
        assert _common_name(old) == "reload-first"
        ca.issue("reload-second", file_stem=str(tmp_path / "live"))  # the same files, rewritten
        deadline = time.monotonic() + 10
        name = ""
        while time.monotonic() < deadline:
            with ctx.wrap_socket(socket.create_connection(("127.0.0.1", port)), server_hostname="127.0.0.1") as new:
                name = _common_name(new)
            if name == "reload-second":
                break
            time.sleep(0.05)  # bounded poll: the files are checked every 0.1 s
        assert name == "reload-second"
        assert round_trip(old, 3) == 3 and _common_name(old) == "reload-first"  # the open one continues
        old.close()
        assert sluice.total("sluice_tls_reloads_total", outcome="reloaded") >= 1
        # SIGHUP's path (reconfigure.reload_file -> Proxy.reload_tls) reloads whatever the files say
        sluice.loop.call_soon_threadsafe(sluice.proxy.reload_tls)
        deadline = time.monotonic() + 10
        while sluice.total("sluice_tls_reloads_total", outcome="reloaded") < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert sluice.total("sluice_tls_reloads_total", outcome="reloaded") >= 2


def _common_name(sock: ssl.SSLSocket) -> str:
    cert = sock.getpeercert()
    assert cert is not None
    # ((("commonName", "x"),), ...): a tuple of RDNs, each a tuple of pairs (typeshed types an RDN as one pair)
    subject: Any = cert["subject"]
    return str(dict(rdn[0] for rdn in subject)["commonName"])


# ------------------------------------------------------------------------------------------------ PROXY


def v1(src: str, sport: int) -> bytes:
    return f"PROXY TCP4 {src} 127.0.0.1 {sport} 19092\r\n".encode()


def v2(src: str, sport: int) -> bytes:
    addrs = socket.inet_aton(src) + socket.inet_aton("127.0.0.1") + struct.pack(">HH", sport, 19092)
    return V2_SIGNATURE + b"\x21\x11" + struct.pack(">H", len(addrs)) + addrs


def test_proxy_protocol_v1_v2_before_tls_and_garbage(secure_broker: SecureBroker, pki: dict[str, Any],
                                                      tmp_path: Path, logs: list[MutableMapping[str, Any]]) -> None:
    access = tmp_path / "access.log"
    with ProxyThread(secure_broker.plaintext, **{"listen.proxy_protocol": "any", "logging.access_log": str(access),
                                                  "limits.max_connections_per_address": 1}) as sluice:
        port = sluice.proxy.bootstrap_port
        with socket.create_connection(("127.0.0.1", port)) as s:
            s.sendall(v1("203.0.113.7", 40001))
            assert round_trip(s, 1) == 1
            # the same client address (per the header) is over max_connections_per_address: closed at accept
            with socket.create_connection(("127.0.0.1", port)) as s2:
                s2.sendall(v2("203.0.113.7", 40002))
                assert closed_by_peer(s2)
        with socket.create_connection(("127.0.0.1", port)) as s:
            s.sendall(v2("198.51.100.9", 40003))
            assert round_trip(s, 2) == 2
        with socket.create_connection(("127.0.0.1", port)) as s:
            s.sendall(api_versions_frame(3))  # a Kafka request where the header should be
            assert closed_by_peer(s)
        sluice.proxy.access_log.flush()
        lines = [ln for ln in access.read_text().splitlines() if ln]
        assert ['"client_address":"203.0.113.7"' in lines[0], '"client_address":"198.51.100.9"' in lines[1]] == \
            [True, True]
        assert sluice.total("sluice_connections_refused_total", reason="proxy_protocol") == 1
        assert sluice.total("sluice_connections_refused_total", reason="max_connections_per_address") == 1
        events = [e for e in logs if e["event"] == "connection_refused"]
        assert sorted(e["reason"] for e in events) == ["max_connections_per_address", "proxy_protocol"]
    # The header precedes TLS (as load balancers send it): v2 then a TLS handshake on the same connection.
    with ProxyThread(secure_broker.plaintext, **listen_tls(pki, **{"listen.proxy_protocol": "v2"})) as sluice:
        raw = socket.create_connection(("127.0.0.1", sluice.proxy.bootstrap_port))
        raw.sendall(v2("192.0.2.5", 1234))
        with tls_client(pki["ca"].cert).wrap_socket(raw, server_hostname="127.0.0.1") as s:
            assert round_trip(s, 4) == 4
            [info] = [c.info for c in sluice.proxy.connections]
            assert (info.client_host, info.client_port) == ("192.0.2.5", 1234)


# ----------------------------------------------------------------------------------------------- limits


def test_connection_limits_at_their_edges(secure_broker: SecureBroker) -> None:
    with ProxyThread(secure_broker.plaintext, **{"limits.max_connections": 2, "limits.idle_timeout_s": 1.0,
                                                  "limits.max_inflight_requests": 1}) as sluice:
        port = sluice.proxy.bootstrap_port
        a = socket.create_connection(("127.0.0.1", port))
        b = socket.create_connection(("127.0.0.1", port))
        assert round_trip(a, 1) == 1 and round_trip(b, 2) == 2  # two: at the bound, served
        c = socket.create_connection(("127.0.0.1", port))
        assert closed_by_peer(c)  # the third: closed at accept, as Kafka's max.connections
        c.close()
        # in-flight bound 1: three pipelined requests are all answered, in order; none is refused
        a.sendall(api_versions_frame(10) + api_versions_frame(11) + api_versions_frame(12))
        corrs = []
        for _ in range(3):
            size = struct.unpack(">i", recv_exact(a, 4))[0]
            corrs.append(struct.unpack(">i", recv_exact(a, size)[:4])[0])
        assert corrs == [10, 11, 12]
        assert sluice.total("sluice_inflight_limited_total") >= 2
        # idle timeout 1 s: both connections are closed by Sluice, which makes room for a new one
        assert closed_by_peer(a, 15) and closed_by_peer(b, 15)
        a.close()
        b.close()
        assert sluice.total("sluice_connections_closed_total", reason="idle") == 2
        with socket.create_connection(("127.0.0.1", port)) as d:
            assert round_trip(d, 5) == 5
        assert sluice.total("sluice_connections_refused_total", reason="max_connections") == 1
