"""Chain.relay, the shortest path of a request relayed unread: it reads a whole request as Chain.classify does, or
leaves it to classify (None), for every shape of header and Produce body, well-formed or not."""

from __future__ import annotations

import struct

from hypothesis import example, given, settings
from hypothesis import strategies as st

from proxy.core.chain import Chain
from proxy.core.exchange import Rejected, Relayed
from proxy.wire.api_keys import ApiKey
from proxy.wire.messages import request_header_version
from rig.chain_rig import SansIOProxy

#: an API no policy reads under the default settings (every version relayed unread)
HEARTBEAT = 12


def uvarint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def request(key: int, version: int, client_id: bytes | None, tags: bytes, body: bytes, corr: int = 7) -> bytes:
    """A request as read: size prefix, header v1 (v2 with ``tags``: its tag section), ``body``."""
    head = struct.pack(">hhi", key, version, corr)
    head += struct.pack(">h", -1) if client_id is None else struct.pack(">h", len(client_id)) + client_id
    if request_header_version(key, version) == 2:
        head += tags
    frame = head + body
    return len(frame).to_bytes(4, "big") + frame


def produce_body(version: int, transactional_id: bytes | None, acks: int) -> bytes:
    """A Produce body up to Acks (ProduceRequest.json), then bytes neither reader looks at."""
    if version >= 9:
        txn = uvarint(0 if transactional_id is None else len(transactional_id) + 1) + (transactional_id or b"")
    elif version >= 3:
        txn = struct.pack(">h", -1) if transactional_id is None else \
            struct.pack(">h", len(transactional_id)) + transactional_id
    else:
        txn = b""
    # then TimeoutMs (here 0x01007530: its first byte not 0, so a reader one byte off reads other Acks)
    return txn + struct.pack(">h", acks) + b"\x01\x00\x75\x30rest"


def classified(chain: Chain, wire: bytes) -> Relayed | Rejected | None:
    """What classify makes of ``wire`` with nothing ahead of it: a Relayed, a refusal, or None (an Exchange)."""
    try:
        ex = chain.classify(wire[4:], 1.0, None, True)
    except Rejected as e:
        return e
    return ex if isinstance(ex, Relayed) else None


def same(a: Relayed, b: Relayed) -> bool:
    return (a.header, a.api, a.frame, a.started, a.expects_response, a.check, a.streamer, a.readers, a.log) == \
        (b.header, b.api, b.frame, b.started, b.expects_response, b.check, b.streamer, b.readers, b.log)


client_ids = st.one_of(st.none(), st.binary(max_size=40), st.text(max_size=20).map(str.encode))
tag_sections = st.one_of(st.just(b"\x00"), st.just(b"\x01\x00\x02ab"), st.binary(max_size=4))
transactional_ids = st.one_of(st.none(), st.binary(max_size=3), st.binary(min_size=120, max_size=200))


@settings(max_examples=400, deadline=None)
# the shapes each reading step decides on, always tried: a null, a short and a 150-byte transactional id (its
# length a two-byte varint; zeros, so Acks read from inside it would differ), a header tag section, a null client id, a
# non-flexible Produce (v8: its transactional id's length an int16), a client id that overruns its frame, a frame
# shorter than a request header (3 bytes)
@example(key_version=(0, 11), client_id=b"c", tags=b"\x00", transactional_id=None, acks=1, cut=250)
@example(key_version=(0, 11), client_id=b"c", tags=b"\x00", transactional_id=b"t", acks=0, cut=250)
@example(key_version=(0, 11), client_id=b"c", tags=b"\x00", transactional_id=b"\x00" * 150, acks=1, cut=250)
@example(key_version=(0, 11), client_id=b"c", tags=b"\x01\x00\x02ab", transactional_id=None, acks=1, cut=250)
@example(key_version=(0, 11), client_id=None, tags=b"\x00", transactional_id=None, acks=1, cut=250)
@example(key_version=(0, 8), client_id=b"c", tags=b"", transactional_id=b"", acks=1, cut=250)
@example(key_version=(12, 4), client_id=b"abcdef", tags=b"\x00", transactional_id=None, acks=1, cut=199)
@example(key_version=(12, 4), client_id=b"c", tags=b"\x00", transactional_id=None, acks=1, cut=21)
@given(key_version=st.one_of(st.tuples(st.just(int(ApiKey.PRODUCE)), st.integers(0, 13)),
                             st.tuples(st.just(HEARTBEAT), st.integers(0, 4))),
       client_id=client_ids, tags=tag_sections, transactional_id=transactional_ids,
       acks=st.sampled_from([-1, 0, 1]), cut=st.integers(0, 300))
def test_relay_reads_what_classify_reads(key_version: tuple[int, int], client_id: bytes | None, tags: bytes,
                                         transactional_id: bytes | None, acks: int, cut: int) -> None:
    key, version = key_version
    chain = SansIOProxy().chain
    body = produce_body(version, transactional_id, acks) if key == ApiKey.PRODUCE else b"\x00" * 12
    # a well-formed request of the same version first: classify learns its route
    assert isinstance(classified(chain, request(key, version, b"c", b"\x00", produce_body(version, None, 1)
                                                if key == ApiKey.PRODUCE else body)), Relayed)
    whole = request(key, version, client_id, tags, body)
    # truncated as a frame, its size prefix still right (a frame that ends early, down to none at all)
    frame = whole[4:][: max(0, len(whole) - 4 - cut)] if cut < 200 else whole[4:]
    wire = len(frame).to_bytes(4, "big") + frame
    relayed = chain.relay(wire, 1.0)
    expected = classified(chain, wire)
    if relayed is not None:
        # never relays what classify refuses or reads, and when it relays, relays alike
        assert isinstance(expected, Relayed), expected
        assert same(relayed, expected)


def test_relay_leaves_an_api_version_to_classify_until_classify_relayed_one() -> None:
    chain = SansIOProxy().chain
    wire = request(HEARTBEAT, 4, b"c", b"\x00", b"\x00" * 12)
    assert chain.relay(wire, 1.0) is None
    assert isinstance(classified(chain, wire), Relayed)
    relayed = chain.relay(wire, 2.0)
    assert relayed is not None and relayed.header.client_id == "c" and relayed.started == 2.0
    # a version not yet seen is still classify's
    assert chain.relay(request(HEARTBEAT, 3, b"c", b"\x00", b"\x00" * 12), 1.0) is None


def test_relay_reads_acks_zero_as_no_response_owed() -> None:
    chain = SansIOProxy().chain
    classified(chain, request(ApiKey.PRODUCE, 11, b"c", b"\x00", produce_body(11, None, 1)))
    relayed = chain.relay(request(ApiKey.PRODUCE, 11, b"c", b"\x00", produce_body(11, b"txn", 0)), 1.0)
    assert relayed is not None and not relayed.expects_response
    relayed = chain.relay(request(ApiKey.PRODUCE, 11, b"c", b"\x00", produce_body(11, None, -1)), 1.0)
    assert relayed is not None and relayed.expects_response


def test_a_reconfiguration_forgets_what_relay_learnt() -> None:
    p = SansIOProxy()
    wire = request(ApiKey.PRODUCE, 11, b"c", b"\x00", produce_body(11, None, 1))
    classified(p.chain, wire)
    assert p.chain.relay(wire, 1.0) is not None
    p.apply_dynamic(p.settings)
    assert p.chain.relay(wire, 1.0) is None


def test_relay_never_takes_requests_a_policy_counts_on_arrival() -> None:
    # a quota on produce bytes counts every Produce as it arrives (quota/policy.py unread: Relay(arrival=...))
    p = SansIOProxy({"quota.entries": [{"client_id": "other", "produce_rate_bytes": 1000000}]})
    wire = request(ApiKey.PRODUCE, 11, b"c", b"\x00", produce_body(11, None, 1))
    assert isinstance(classified(p.chain, wire), Relayed)
    assert p.chain.relay(wire, 1.0) is None
