"""Untrusted bytes into the security parsers: a PROXY header or any prefix of one, SASL client messages. Each
answers with a result or its own error, never another exception, and never returns more than it was given."""

from __future__ import annotations

import struct

from hypothesis import given
from hypothesis import strategies as st

from proxy.core.proxy_protocol import V2_SIGNATURE, NeedMore, ProxyHeader, ProxyProtocolError, parse
from proxy.core.sasl_principal import MAX_NAME, SaslExchange, oauthbearer_principal, plain_principal, scram_principal

v1_lines = st.builds(lambda a, b, p, q, rest: f"PROXY TCP4 {a} {b} {p} {q}\r\n".encode() + rest,
                     st.ip_addresses(v=4), st.ip_addresses(v=4), st.integers(0, 65535), st.integers(0, 65535),
                     st.binary(max_size=20))
v2_headers = st.builds(lambda body, rest: V2_SIGNATURE + b"\x21\x11" + struct.pack(">H", len(body)) + body + rest,
                       st.binary(min_size=12, max_size=40), st.binary(max_size=20))


@given(st.one_of(st.binary(max_size=300), v1_lines, v2_headers), st.sampled_from(["v1", "v2", "any"]))
def test_proxy_header_parse_is_total(data: bytes, versions: str) -> None:
    try:
        result = parse(data, versions)  # type: ignore[arg-type]
    except ProxyProtocolError:
        return
    if isinstance(result, ProxyHeader):
        assert 0 < result.length <= len(data)
    else:
        assert isinstance(result, NeedMore) and result.total > len(data)


@given(st.one_of(v1_lines, v2_headers))
def test_every_prefix_of_a_header_needs_more(data: bytes) -> None:
    whole = parse(data)
    assert isinstance(whole, ProxyHeader)
    for cut in range(whole.length):
        assert isinstance(parse(data[:cut]), NeedMore)


@given(st.binary(max_size=400))
def test_sasl_readers_are_total_and_keep_only_names(data: bytes) -> None:
    for read in (plain_principal, scram_principal, oauthbearer_principal):
        name = read(data)
        assert name is None or (0 < len(name) <= MAX_NAME and "\0" not in name)
    ex = SaslExchange()
    ex.handshake("SCRAM-SHA-256")
    ex.request(data)
    ex.response(0, data)
