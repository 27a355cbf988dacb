"""Sans-IO security pieces: the SASL principal reader, the PROXY protocol parser, admission counting, client
selectors, and the connection core's in-flight bound and idle timeout (fake port and clock, no sockets)."""

from __future__ import annotations

import base64
import json
import struct
from collections.abc import Iterator, MutableMapping
from typing import Any

import pytest
from structlog.testing import capture_logs

from proxy.core.admission import Admission
from proxy.core.connection import Limits
from proxy.core.proxy_protocol import V2_SIGNATURE, NeedMore, ProxyHeader, ProxyProtocolError, parse
from proxy.core.sasl_principal import SaslExchange, oauthbearer_principal, plain_principal, scram_principal
from proxy.core.selectors import ClientSelector
from rig.core_rig import CoreRig, request, response, sized

SECRET = "s3cr3t-pw"


@pytest.fixture(autouse=True)
def logs() -> Iterator[list[MutableMapping[str, Any]]]:
    with capture_logs() as events:
        yield events


# ------------------------------------------------------------------------------------------- SASL names


def jwt(claims: dict[str, Any]) -> str:
    def part(obj: dict[str, Any]) -> str:
        return base64.urlsafe_b64encode(json.dumps(obj).encode()).rstrip(b"=").decode()

    return f"{part({'alg': 'none'})}.{part(claims)}."


def test_plain_names_the_authcid_or_the_authzid_never_the_password() -> None:
    assert plain_principal(f"\0alice\0{SECRET}".encode()) == "alice"
    assert plain_principal(f"admin\0alice\0{SECRET}".encode()) == "admin"  # RFC 4616: authzid acts as
    assert plain_principal(b"alice") is None  # not PLAIN's form
    assert plain_principal(f"\0\0{SECRET}".encode()) is None  # no user
    assert plain_principal(f"\0al\x01ice\0{SECRET}".encode()) is None  # control characters are no name


def test_scram_reads_the_n_attribute_with_its_escapes() -> None:
    assert scram_principal(b"n,,n=bob,r=fyko+d2lbbFgONRv9qkxdawL") == "bob"
    assert scram_principal(b"n,,n=b=2Co=3Db,r=abc") == "b,o=b"  # RFC 5802 5.1 saslname escapes
    assert scram_principal(b"y,a=admin,n=bob,r=abc") == "admin"
    assert scram_principal(b"n,,n=b=xyob,r=abc") is None  # a bad escape
    assert scram_principal(b"c=biws,r=abc,p=proof") is None  # a client-final-message carries no name
    assert scram_principal(b"\xff\xfe") is None


def test_oauthbearer_reads_the_sub_claim_of_the_unverified_token() -> None:
    token = jwt({"sub": "carol", "exp": 2_000_000_000})
    assert oauthbearer_principal(f"n,,\x01auth=Bearer {token}\x01\x01".encode()) == "carol"
    assert oauthbearer_principal(f"n,a=carol,\x01host=h\x01auth=Bearer {token}\x01\x01".encode()) == "carol"
    assert oauthbearer_principal(f"n,,\x01auth=Bearer {jwt({'iss': 'x'})}\x01\x01".encode()) is None
    assert oauthbearer_principal(b"n,,\x01auth=Bearer not-a-jwt\x01\x01") is None
    assert oauthbearer_principal(b"\x01") is None  # the KIP-255 error acknowledgement


@pytest.mark.parametrize(("mechanism", "first", "responses", "name"), [
    ("PLAIN", f"\0alice\0{SECRET}".encode(), [(0, b"")], "alice"),
    ("SCRAM-SHA-512", b"n,,n=bob,r=nonce", [(0, b"r=nonce2,s=salt,i=4096"), (0, b"v=signature")], "bob"),
    ("OAUTHBEARER", f"n,,\x01auth=Bearer {jwt({'sub': 'carol'})}\x01\x01".encode(), [(0, b"")], "carol"),
])
def test_the_name_is_adopted_only_when_the_broker_accepts(mechanism: str, first: bytes,
                                                          responses: list[tuple[int, bytes]], name: str) -> None:
    ex = SaslExchange()
    ex.handshake(mechanism)
    ex.request(first)
    for i, (code, data) in enumerate(responses):
        assert ex.principal is None
        done = ex.response(code, data)
        assert done == (i == len(responses) - 1)
        if not done:
            ex.request(b"c=biws,r=nonce2,p=proof")
    assert ex.principal == name
    # KIP-368 re-authentication: a new exchange; a failed one keeps the name the connection had
    ex.handshake(mechanism)
    ex.request(first)
    assert not ex.response(58, b"")
    assert ex.principal == name


def test_failures_name_nobody() -> None:
    ex = SaslExchange()
    ex.handshake("SCRAM-SHA-256")
    ex.request(b"n,,n=bob,r=nonce")
    ex.response(0, b"r=nonce2,s=salt,i=4096")
    ex.request(b"c=biws,r=nonce2,p=wrong")
    assert not ex.response(58, b"")  # SASL_AUTHENTICATION_FAILED
    ex2 = SaslExchange()
    ex2.handshake("OAUTHBEARER")
    ex2.request(f"n,,\x01auth=Bearer {jwt({'sub': 'carol'})}\x01\x01".encode())
    assert not ex2.response(0, b'{"status":"invalid_token"}')  # the KIP-255 error challenge
    ex3 = SaslExchange()
    ex3.handshake("GSSAPI")  # no name Sluice can read
    ex3.request(b"\x60\x82")
    assert not ex3.response(0, b"") and ex3.principal is None
    assert ex.principal is None and ex2.principal is None


# ------------------------------------------------------------------------------------------------- PROXY


def v2(family: int, addresses: bytes, command: int = 1, tlvs: bytes = b"") -> bytes:
    body = addresses + tlvs
    return V2_SIGNATURE + bytes([0x20 | command, family << 4 | 1]) + struct.pack(">H", len(body)) + body


def test_proxy_v1_tcp4_tcp6_and_unknown() -> None:
    line = b"PROXY TCP4 203.0.113.7 10.0.0.1 51234 19092\r\n"
    assert parse(line + b"\x16\x03\x01") == ProxyHeader(1, len(line), ("203.0.113.7", 51234), ("10.0.0.1", 19092))
    line6 = b"PROXY TCP6 2001:db8::7 2001:db8::1 4000 19092\r\n"
    assert parse(line6).source == ("2001:db8::7", 4000)  # type: ignore[union-attr]
    assert parse(b"PROXY UNKNOWN ffff\r\n") == ProxyHeader(1, 20)
    assert parse(line[:20]) == NeedMore(21)
    assert parse(b"PRO") == NeedMore(4)


@pytest.mark.parametrize("garbage", [
    b"\x00\x00\x00\x10\x00\x12\x00\x03",  # a Kafka request where the header should be
    b"PROXY TCP4 203.0.113.7 10.0.0.1 51234\r\n",  # a field missing
    b"PROXY TCP4 2001:db8::7 10.0.0.1 1 2\r\n",  # family mismatch
    b"PROXY TCP4 203.0.113.7 10.0.0.1 051234 1\r\n",  # leading zero
    b"PROXY TCP4 203.0.113.7 10.0.0.1 70000 1\r\n",  # port out of range
    b"PROXY " + b"x" * 120,  # no CRLF within 107 bytes
    b"\r\n\r\n\x00\r\nQUIX\n\x21\x11\x00\x0c",  # a wrong signature
    V2_SIGNATURE + b"\x31\x11\x00\x00",  # version 3
    V2_SIGNATURE + b"\x2f\x11\x00\x00",  # command 15
    V2_SIGNATURE + b"\x21\x11\x00\x04" + b"\x00" * 4,  # AF_INET shorter than its addresses
])
def test_proxy_garbage_is_an_error(garbage: bytes) -> None:
    with pytest.raises(ProxyProtocolError):
        parse(garbage)


def test_proxy_v2_inet_inet6_local_unspec_and_tlvs() -> None:
    inet = bytes([198, 51, 100, 9, 10, 0, 0, 1]) + struct.pack(">HH", 40000, 19092)
    header = v2(1, inet, tlvs=b"\x04\x00\x01\x00")  # a NOOP TLV is skipped
    assert parse(header + b"\x16\x03") == ProxyHeader(2, len(header), ("198.51.100.9", 40000), ("10.0.0.1", 19092))
    inet6 = bytes(15) + b"\x07" + bytes(15) + b"\x01" + struct.pack(">HH", 1, 2)
    assert parse(v2(2, inet6)).source == ("::7", 1)  # type: ignore[union-attr]
    assert parse(v2(1, inet, command=0)) == ProxyHeader(2, 16 + len(inet))  # LOCAL: health check, own address
    assert parse(v2(0, b"")) == ProxyHeader(2, 16)
    assert parse(header[:10]) == NeedMore(16)
    assert parse(header[:20]) == NeedMore(len(header))


def test_proxy_versions_a_listener_accepts() -> None:
    with pytest.raises(ProxyProtocolError, match="v1 only"):
        parse(v2(0, b""), "v1")
    with pytest.raises(ProxyProtocolError, match="v2 only"):
        parse(b"PROXY UNKNOWN\r\n", "v2")


# ------------------------------------------------------------------------------- admission, selectors


def test_admission_at_its_edges() -> None:
    a = Admission(max_total=3, max_per_address=2)
    assert a.admit("10.0.0.1") is None and a.admit("10.0.0.1") is None
    assert a.admit("10.0.0.1") == "max_connections_per_address"  # the third from one address
    assert a.admit("10.0.0.2") is None
    assert a.admit("10.0.0.3") == "max_connections"  # the fourth in total
    a.release("10.0.0.1")
    assert a.admit("10.0.0.1") is None  # room again after a close
    a.release("10.0.0.9")  # never admitted: no effect
    assert (a.total, a.count("10.0.0.1")) == (3, 2)
    unbounded = Admission()
    assert all(unbounded.admit("h") is None for _ in range(1000))


def test_selectors_match_all_they_name() -> None:
    s = ClientSelector(client_id="etl-*", principal="alice", network="10.1.0.0/16")
    assert s.matches("etl-1", "alice", "10.1.2.3")
    assert not s.matches("etl-1", None, "10.1.2.3")  # no SASL: no principal to match
    assert not s.matches("etl-1", "bob", "10.1.2.3")
    assert not s.matches("web", "alice", "10.1.2.3")
    assert not s.matches("etl-1", "alice", "10.2.0.1")
    assert not s.matches("etl-1", "alice", "")
    assert ClientSelector(principal="team-*").matches(None, "team-a", "")
    assert ClientSelector(network="2001:db8::/32").matches(None, None, "2001:db8::5")


def test_a_selector_answers_the_same_when_asked_again_and_past_its_memory() -> None:
    # answers are remembered (a selector is asked on every request); client.ids are the clients' to choose, so the
    # memory is bounded and starts over when full: every answer stays the glob's, asked once or many times
    s = ClientSelector(client_id="etl-*", network="10.0.0.0/8")
    clients = [(f"etl-{i}" if i % 3 else f"web-{i}", f"10.0.{i % 250}.1" if i % 5 else "11.0.0.1")
               for i in range(10_000)]
    for _ in range(2):
        for client_id, host in clients:
            assert s.matches(client_id, None, host) == (client_id.startswith("etl-") and host.startswith("10.")), \
                (client_id, host)
    assert s == ClientSelector(client_id="etl-*", network="10.0.0.0/8")  # what it remembers is not what it is


# ----------------------------------------------------------------------------- the core: in-flight, idle

LIST_OFFSETS = 2


def test_inflight_bound_stops_reading_until_a_response_goes_out(logs: list[MutableMapping[str, Any]]) -> None:
    rig = CoreRig(limits=Limits(max_inflight_requests=2))
    conn, port = rig.connect()
    conn.client_data(sized(*(request(LIST_OFFSETS, 7, c) for c in (1, 2, 3, 4))))
    # two go upstream; the client is not read; the others wait in the buffer, none is refused
    assert [int.from_bytes(f[8:12], "big") for f in _frames(port.take_upstream())] == [1, 2]
    assert port.client_paused and not conn.closed
    conn.upstream_data(sized(response(LIST_OFFSETS, 7, 1)))
    assert [int.from_bytes(f[8:12], "big") for f in _frames(port.take_upstream())] == [3]
    assert port.client_paused  # 2 and 3 owed: still at the bound
    conn.upstream_data(sized(response(LIST_OFFSETS, 7, 2), response(LIST_OFFSETS, 7, 3)))
    assert [int.from_bytes(f[8:12], "big") for f in _frames(port.take_upstream())] == [4]
    assert not port.client_paused  # 4 alone is owed: below the bound, reading again
    conn.upstream_data(sized(response(LIST_OFFSETS, 7, 4)))
    assert [ln["correlation_id"] for ln in rig.lines()] == [1, 2, 3, 4]
    assert rig.metrics.total("sluice_inflight_limited_total") == 3  # at 1+2, 2+3, 3+4
    assert [e["event"] for e in logs].count("inflight_limit") == 1  # once per connection


def _frames(data: bytes) -> list[bytes]:
    out, pos = [], 0
    while pos < len(data):
        size = int.from_bytes(data[pos : pos + 4], "big")
        out.append(data[pos : pos + 4 + size])
        pos += 4 + size
    return out


def test_idle_connections_close_at_the_timeout_and_busy_ones_do_not(logs: list[MutableMapping[str, Any]]) -> None:
    rig = CoreRig(limits=Limits(idle_timeout_s=600.0))
    idle, idle_port = rig.connect()
    busy, busy_port = rig.connect()
    busy.client_data(sized(request(LIST_OFFSETS, 7, 1)))  # owed a response for the whole time
    rig.advance(599.9)
    assert idle_port.closed is None
    rig.advance(0.2)
    assert idle_port.closed is False and idle.closed  # closed at 600 s, gracefully
    assert busy_port.closed is None  # a request in flight is not idleness
    busy.upstream_data(sized(response(LIST_OFFSETS, 7, 1)))
    rig.advance(599.0)
    assert busy_port.closed is None  # the response restarted its clock
    rig.advance(1.1)
    assert busy_port.closed is False
    assert rig.metrics.total("sluice_connections_closed_total", reason="idle") == 2
    assert [e["event"] for e in logs].count("idle_closed") == 2


def test_inflight_bound_with_requests_that_get_no_response() -> None:
    """Produce acks=0 completes as it is sent: the bound is lifted while the frames after it are being read, and
    each request still goes upstream exactly once, in order."""
    from proxy.wire.messages import request_codec

    rig = CoreRig(limits=Limits(max_inflight_requests=1))
    conn, port = rig.connect()
    no_ack = [request(0, 9, c, request_codec(0, 9).default().replace(acks=0)) for c in (1, 2, 3)]
    conn.client_data(sized(*no_ack, request(LIST_OFFSETS, 7, 4), request(LIST_OFFSETS, 7, 5)))
    assert [int.from_bytes(f[8:12], "big") for f in _frames(port.take_upstream())] == [1, 2, 3, 4]
    conn.upstream_data(sized(response(LIST_OFFSETS, 7, 4)))
    assert [int.from_bytes(f[8:12], "big") for f in _frames(port.take_upstream())] == [5]


# ------------------------------------------------------------------ SASL through the core (fake broker side)


def handshake(version: int, corr: int, mechanism: str) -> bytes:
    from proxy.wire.model import Message

    return request(17, version, corr, Message(mechanism=mechanism))


def handshake_ok(version: int, corr: int, mechanism: str) -> bytes:
    from proxy.wire.model import Message

    return response(17, version, corr, Message(error_code=0, mechanisms=[mechanism]))


def authenticate(corr: int, token: bytes) -> bytes:
    from proxy.wire.model import Message

    return request(36, 2, corr, Message(auth_bytes=token))


def authenticated(corr: int, code: int = 0, token: bytes = b"") -> bytes:
    from proxy.wire.model import Message

    return response(36, 2, corr, Message(error_code=code, error_message=None, auth_bytes=token,
                                         session_lifetime_ms=0))


def test_sasl_v1_names_the_connection_once_the_broker_accepts(logs: list[MutableMapping[str, Any]]) -> None:
    rig = CoreRig()
    conn, _port = rig.connect()
    conn.client_data(sized(handshake(1, 1, "SCRAM-SHA-512"), authenticate(2, b"n,,n=bob,r=abc")))
    conn.upstream_data(sized(handshake_ok(1, 1, "SCRAM-SHA-512"), authenticated(2, token=b"r=abcdef,s=c2Fs,i=4096")))
    assert conn.info.principal is None  # the exchange is not over
    conn.client_data(sized(authenticate(3, f"c=biws,r=abcdef,p={SECRET}".encode())))
    conn.upstream_data(sized(authenticated(3, token=b"v=c2lnbmF0dXJl")))
    assert conn.info.principal == "bob"
    conn.client_data(sized(request(LIST_OFFSETS, 7, 4)))
    conn.upstream_data(sized(response(LIST_OFFSETS, 7, 4)))
    # the SaslAuthenticate that completed the exchange is the first line with the name
    assert [ln.get("principal") for ln in rig.lines()] == [None, None, "bob", "bob"]
    assert rig.metrics.total("sluice_sasl_authentications_total") == 1
    assert [e["principal"] for e in logs if e["event"] == "sasl_authenticated"] == ["bob"]
    assert SECRET not in repr(logs) and SECRET not in rig.log.getvalue()


def test_sasl_v0_bare_tokens_are_relayed_and_followed() -> None:
    """SaslHandshake v0: the tokens after it are bare frames both ways; the core relays them as they are, the
    answer to each is read without a correlation id (PLAIN's is empty), and Kafka requests follow again."""
    rig = CoreRig()
    conn, port = rig.connect()
    conn.client_data(sized(handshake(0, 1, "PLAIN")))
    conn.upstream_data(sized(handshake_ok(0, 1, "PLAIN")))
    port.take_upstream()
    port.take_client()
    token = f"\0alice\0{SECRET}".encode()
    conn.client_data(sized(token))  # a bare frame: not a Kafka request
    assert port.take_upstream() == sized(token)
    conn.upstream_data(b"\x00\x00")  # the empty answer, split
    assert conn.info.principal is None
    conn.upstream_data(b"\x00\x00")
    assert port.take_client() == b"\x00\x00\x00\x00" and conn.info.principal == "alice"
    conn.client_data(sized(request(LIST_OFFSETS, 7, 2)))
    assert port.take_upstream() == sized(request(LIST_OFFSETS, 7, 2))
    conn.upstream_data(sized(response(LIST_OFFSETS, 7, 2)))
    assert [(ln["api"], ln.get("principal")) for ln in rig.lines()] == [("SaslHandshake", None),
                                                                      ("ListOffsets", "alice")]
    assert not conn.closed


def test_sasl_v0_with_a_mechanism_sluice_cannot_follow_is_refused(logs: list[MutableMapping[str, Any]]) -> None:
    rig = CoreRig()
    conn, port = rig.connect()
    conn.client_data(sized(handshake(0, 1, "GSSAPI")))
    assert port.take_upstream() == b""  # never reaches the broker
    [(size, answer)] = [(int.from_bytes(port.client[:4], "big"), bytes(port.client[4:]))]
    assert size == len(answer) and int.from_bytes(answer[4:6], "big") == 35  # UNSUPPORTED_VERSION
    assert [e["event"] for e in logs].count("sasl_handshake_v0_refused") == 1
