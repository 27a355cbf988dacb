"""Fuzzing every parser below the connection core: the streaming Fetch walker (FetchStreamer), every decoded
request and response (the codecs manifest's (api, version)s) and the views policies read, and the Fetch fast
paths (request decode, Baseline.read, response decode, encode_partition) against the construct codec. The targets
and their invariants are in rig/fuzz_targets.py (``python -m bench.fuzz`` runs them unbounded); here each runs
a bounded number of examples (CI replays them derandomized).

Below them, every crash the fuzzing found, as an explicit regression test with its minimal input.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy.core.routing import Router
from proxy.wire import fetch_fast
from proxy.wire.errors import CodecError
from proxy.wire.fetch_fast import FetchPartition, FetchResponseView, FetchTopic, build_tags, top_head, topic_head
from proxy.wire.fetch_layout import PartitionKey
from proxy.wire.fetch_request_fast import Baseline, FetchParams, decode_fetch_request, encode_fetch_request
from proxy.wire.fetch_stream import FetchStreamer
from proxy.wire.messages import decode_request, encode_request, request_codec, response_codec
from proxy.wire.model import Message
from rig.fetch_oracle import to_message
from rig.fuzz_targets import TARGETS


def bounded(examples: int) -> settings:
    return settings(max_examples=examples, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.filter_too_much])


@bounded(100)
@given(st.data())
def test_fuzz_fetch_streamer_valid(data: st.DataObject) -> None:
    TARGETS["fetch_streamer_valid"](data)


@bounded(200)
@given(st.data())
def test_fuzz_fetch_streamer_mutated(data: st.DataObject) -> None:
    TARGETS["fetch_streamer_mutated"](data)


@bounded(300)
@given(st.data())
def test_fuzz_decode_requests(data: st.DataObject) -> None:
    TARGETS["decode_requests"](data)


@bounded(300)
@given(st.data())
def test_fuzz_decode_responses(data: st.DataObject) -> None:
    TARGETS["decode_responses"](data)


@bounded(150)
@given(st.data())
def test_fuzz_fetch_request_fast(data: st.DataObject) -> None:
    TARGETS["fetch_request_fast"](data)


@bounded(150)
@given(st.data())
def test_fuzz_fetch_baseline(data: st.DataObject) -> None:
    TARGETS["fetch_baseline"](data)


@bounded(120)
@given(st.data())
def test_fuzz_fetch_response_fast(data: st.DataObject) -> None:
    TARGETS["fetch_response_fast"](data)


# ------------------------------------------------------------------------------- regressions (found by fuzzing)


def _fetch(version: int, parts: dict[tuple[str | bytes, int], FetchParams], corr: int = 1) -> bytes:
    header = Message(request_api_key=1, request_api_version=version, correlation_id=corr, client_id="c")
    body = request_codec(1, version).default().replace(max_wait_ms=500, min_bytes=1, max_bytes=1 << 20)
    base = decode_fetch_request(encode_request(header, body))
    return encode_fetch_request(base, 0, -1, parts, [])


@pytest.mark.parametrize(("version", "name"), [(4, b"\x00\x01a"), (12, b"\x02a")], ids=["v4", "v12"])
def test_baseline_read_of_a_topic_name_that_is_not_utf8_is_none(version: int, name: bytes) -> None:
    """bench.fuzz (fetch_baseline): Baseline.read let UnicodeDecodeError out of a topic name that is not UTF-8
    (_string16 for v4-11, _compact_string for v12). A request it cannot read is now None: decode it whole (which
    refuses it)."""
    parts: dict[PartitionKey, FetchParams] = {("a", 0): FetchParams(0, 0, 0, 0, 0)}
    first = _fetch(version, parts)
    second = _fetch(version, parts, corr=2).replace(name, name[:-1] + b"\x80")
    assert Baseline(decode_fetch_request(first), first).read(second) is None
    with pytest.raises(CodecError):
        decode_fetch_request(second)


def _v16_body(tags: bytes) -> bytes:
    """A Fetch v16 response stream as FetchStreamer sees it (header tag section, body) ending with ``tags``."""
    return b"\x00" + FetchResponseView(16).to_bytes()[:-1] + tags


@pytest.mark.parametrize("case", ["host not utf-8", "truncated entry", "port past int32"])
def test_streamed_node_endpoints_that_cannot_be_read_or_rewritten_are_codec_errors(case: str) -> None:
    """bench.fuzz (fetch_streamer_mutated): FetchStreamer decoded and re-encoded NodeEndpoints outside
    codec_errors, so a host that is not UTF-8 (UnicodeDecodeError), an entry cut short (struct.error) or a node
    whose listener port (base + node id) does not fit Port's int32 (struct.error) escaped the connection core."""
    router = Router("proxy.example", 20000)
    if case == "host not utf-8":
        # one entry: node 1, host "\xff", port 9092, rack null, no tags
        value = b"\x02" + (1).to_bytes(4, "big") + b"\x02\xff" + (9092).to_bytes(4, "big") + b"\x00\x00"
    elif case == "truncated entry":
        value = b"\x02\x00\x00"
    else:
        value = b"\x02" + (2**31 - 1).to_bytes(4, "big") + b"\x02h" + (9092).to_bytes(4, "big") + b"\x00\x00"
    stream = _v16_body(build_tags({0: value}) or b"")
    streamer = FetchStreamer(16, len(stream), router.rewrite_nodes)
    with pytest.raises(CodecError):
        streamer.feed(stream)


@pytest.mark.parametrize(("version", "tag", "value"), [(17, 0, b"\x01\x02\x03"), (17, 0, bytes(17)),
                                                       (18, 1, b"\x01")],
                         ids=["uuid-of-3-bytes", "uuid-of-17-bytes", "int64-of-1-byte"])
def test_partition_tags_of_the_wrong_size_fail_like_construct(version: int, tag: int, value: bytes) -> None:
    """bench.fuzz (fetch_request_fast): the Fetch request fast path kept a partition's tag section raw without
    checking its known fields, so a ReplicaDirectoryId (uuid, v17+) or HighWatermark (int64, v18+) of the wrong
    length decoded (and went upstream) where the construct codec refuses the request."""
    tags = bytes([1, tag, len(value)]) + value
    frame = _fetch(version, {(b"\x01" * 16, 0): FetchParams(0, tags=tags)})
    with pytest.raises(CodecError):
        decode_request(frame)
    with pytest.raises(CodecError):
        decode_fetch_request(frame)


@pytest.mark.parametrize("version", [12, 18])
def test_a_null_aborted_transactions_spelled_long_is_null_like_construct(version: int) -> None:
    """bench.fuzz (fetch_response_fast, atheris): a flexible AbortedTransactions count of 0 (null) written as the
    two-byte varint 0x80 0x00 decoded as an empty list in the fast path and as null in the construct codec (the
    fast path read the count's first byte only to tell null apart). Located by the single-byte mutations of the
    golden Fetch responses: the one disagreement left."""
    key = ("t", bytes(16)) if version < 13 else ("", b"\x01" * 16)
    view = FetchResponseView(version, topics=[FetchTopic(*key, partitions=[FetchPartition(0, records=None)])])
    body = view.to_bytes()
    at = len(top_head(view, 1)) + len(topic_head(version, key[0] or key[1], 1)) + 30  # after LogStartOffset
    assert body[at] == 0  # AbortedTransactions: null
    longer = body[:at] + b"\x80\x00" + body[at + 1 :]
    fast = fetch_fast.decode(longer, version)
    assert fast.topics[0].partitions[0].aborted_transactions is None
    assert to_message(fast) == response_codec(1, version).decode(longer)
    assert fast.to_bytes() == body
