"""Fuzz targets for everything Sluice parses, shared by the bounded suite (tests/property/test_fuzz_*.py) and the
unbounded run (``python -m bench.fuzz``).

Each target is a function of a hypothesis ``st.DataObject``: it draws its input (valid frames from the specs and
the golden captures, mutated, cut into chunks, or random event sequences) and checks its invariants with plain
asserts. The suite runs each with a few hundred examples (CI replays them derandomized); bench.fuzz runs them
with a time budget each. An exception the invariants do not allow fails the target and hypothesis shrinks it to
a minimal example, which becomes an explicit regression test.

Targets:

- ``frame_reader_client`` / ``frame_reader_upstream``: the connection core (proxy/core/connection.py) fed byte
  streams (request frames valid, mutated or random, size prefixes huge or negative; responses to the requests
  in flight, valid, mutated or random), split at arbitrary points, with the clock moving between chunks. Either
  every whole frame is handled (relayed, answered or waiting) or the connection is closed with exactly one
  ``sluice_frames_rejected_total{reason}``; responses reach the client in request order; after the close the
  response memory held is 0 and nothing is sent.
- ``fetch_streamer_valid`` / ``fetch_streamer_mutated``: :class:`~proxy.wire.fetch_stream.FetchStreamer` on
  Fetch v16+ responses cut into random chunks: byte for byte the input except the rewritten tag section at the
  end; on mutated or truncated input, CodecError only, and never more bytes out than in.
- ``decode_requests`` / ``decode_responses``: every (api, version) Sluice decodes (the codecs manifest), valid
  encodings mutated: decode raises CodecError or succeeds, and what decodes re-encodes (and decodes again to
  the same encoding); the views policies read (request_view, response_view, MetadataHead, the Produce peeks) too.
- ``fetch_request_fast`` / ``fetch_baseline`` / ``fetch_response_fast``: the Fetch fast paths (request decode
  and re-encode, ``Baseline.read`` against random second frames, response decode, ``encode_partition``) raise
  nothing but CodecError (or return None) and agree with the construct codec whenever both decode.
- ``connection_events``: random sequences of events (client requests, upstream responses in pieces, write
  pauses and resumes, timers, topic-name lookups, losses, closes) on two connections of a CoreRig with the
  policies on (KIP-74 budgets and the global memory bound, KIP-73 throttles with muting, KIP-227 terminate
  mode): responses to each client only in its request order, response memory never negative and 0 once every
  connection is closed, nothing sent after a close, no exception.
"""

from __future__ import annotations

import random
import re
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from hypothesis import strategies as st

from proxy.core.connection import Connection, Limits
from proxy.core.exchange import ConnectionInfo, Exchange, Relayed
from proxy.metrics import REJECT_REASONS
from proxy.wire import fetch_fast
from proxy.wire.errors import CodecError
from proxy.wire.fetch_fast import (
    AbortedTransaction,
    FetchPartition,
    FetchResponseView,
    FetchTopic,
    NodeEndpoint,
    encode_partition,
    top_head,
    top_tail,
    topic_head,
    topic_tail,
)
from proxy.wire.fetch_request_fast import (
    Baseline,
    FetchEdit,
    FetchParams,
    PartitionKey,
    TopicKey,
    decode_fetch_request,
    encode_fetch_request,
)
from proxy.wire.fetch_stream import FetchStreamer
from proxy.wire.messages import (
    api_name,
    decode_request,
    decode_response,
    decoded_versions,
    encode_request,
    encode_response,
    known_api,
    peek_request_header,
    request_codec,
    request_spec,
    response_codec,
    response_spec,
)
from proxy.wire.model import Message
from proxy.wire.produce import produce_acks
from proxy.wire.records import Record, encode_batch, new_batch
from proxy.wire.views import MessageResponse, MetadataHead, request_view, response_view
from rig.core_rig import CoreRig, FakePort, request
from rig.fetch_oracle import forgotten_partitions, request_partitions, to_message
from rig.specgen import all_cases, message_strategy

Target = Callable[[st.DataObject], None]

# ============================================================================================ inputs

#: values that make a length/count field absurd: int32/int16 extremes and a 5-byte uvarint of 2**32-1
HUGE = [b"\x7f\xff\xff\xff", b"\xff\xff\xff\xff", b"\x80\x00\x00\x00", b"\x7f\xff", b"\xff\xfe",
        b"\xff\xff\xff\xff\x0f", b"\xfe\xff\xff\xff\x0f", b"\x80"]


@st.composite
def mutated(draw: Any, frame: bytes, max_mutations: int = 3, start: int = 0) -> bytes:
    """``frame`` with 1 to ``max_mutations`` mutations at or after ``start``: bit flips, truncation, insertion,
    deletion, a length or count field set huge, an interesting byte."""
    buf = bytearray(frame)
    for _ in range(draw(st.integers(1, max_mutations))):
        kind = draw(st.sampled_from(["flip", "truncate", "insert", "delete", "huge", "byte"]))
        pos = draw(st.integers(min(start, len(buf)), len(buf)))
        if kind == "flip" and pos < len(buf):
            buf[pos] ^= 1 << draw(st.integers(0, 7))
        elif kind == "truncate":
            del buf[pos:]
        elif kind == "insert":
            buf[pos:pos] = draw(st.binary(min_size=1, max_size=8))
        elif kind == "delete":
            del buf[pos : pos + draw(st.integers(1, 8))]
        elif kind == "huge":
            value = draw(st.sampled_from(HUGE))
            buf[pos : pos + len(value)] = value
        elif kind == "byte" and pos < len(buf):
            buf[pos] = draw(st.sampled_from([0x00, 0x01, 0x7F, 0x80, 0xFF]))
    return bytes(buf)


def chunks(data: st.DataObject, stream: bytes, max_cuts: int = 8) -> list[bytes]:
    """``stream`` cut at arbitrary points (empty pieces included: a read of nothing must be harmless)."""
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=max_cuts), label="cuts"))
    out, prev = [], 0
    for cut in [*cuts, len(stream)]:
        out.append(stream[prev:cut])
        prev = cut
    return out


def sized(*frames: bytes) -> bytes:
    return b"".join(len(f).to_bytes(4, "big") + f for f in frames)


def with_corr(frame: bytes, corr: int, request: bool) -> bytes:
    """A frame (no size prefix) with its correlation id replaced."""
    at = 4 if request else 0
    return frame[:at] + corr.to_bytes(4, "big", signed=True) + frame[at + 4 :]


GOLDEN_DIR = Path(__file__).resolve().parents[1] / "tests" / "data" / "golden"
_GOLDEN_NAME = re.compile(r"(?P<api>\w+)-v(?P<version>\d+)-(?P<direction>request|response)-(?P<n>\d+)\.bin")


@dataclass(frozen=True)
class Golden:
    api_key: int
    version: int
    request: bytes | None
    response: bytes | None


@cache
def golden() -> list[Golden]:
    """The captured frames of real clients and a real broker (tests/data/golden), by (api, version, n)."""
    keys = {api_name(k): k for k in range(100) if known_api(k)}
    found: dict[tuple[int, int, str], dict[str, bytes]] = {}
    for path in sorted(GOLDEN_DIR.glob("*.bin")):
        m = _GOLDEN_NAME.fullmatch(path.name)
        assert m is not None, path
        found.setdefault((keys[m["api"]], int(m["version"]), m["n"]), {})[m["direction"]] = path.read_bytes()
    return [Golden(k, v, d.get("request"), d.get("response")) for (k, v, _), d in sorted(found.items())]


def golden_pairs() -> list[Golden]:
    return [g for g in golden() if g.request is not None and g.response is not None]


@cache
def _cases() -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    cases = all_cases()
    requests = [(spec.api_key, v) for _, spec, v in cases if spec.kind == "request" and spec.api_key is not None]
    responses = [(spec.api_key, v) for _, spec, v in cases if spec.kind == "response" and spec.api_key is not None]
    return requests, responses


def request_cases() -> list[tuple[int, int]]:
    """Every (api key, version) of a request Sluice decodes."""
    return _cases()[0]


def response_cases() -> list[tuple[int, int]]:
    """Every (api key, version) of a response Sluice decodes."""
    return _cases()[1]


def spec_request(data: st.DataObject, corr: int = 1, api_key: int | None = None) -> bytes:
    """A request frame of any (api, version) Sluice decodes (of ``api_key`` if given), its body generated from
    the spec."""
    cases = [c for c in request_cases() if api_key is None or c[0] == api_key]
    key, version = data.draw(st.sampled_from(cases), label="request (api, version)")
    body = data.draw(message_strategy(request_spec(key), version), label="body")
    header = Message(request_api_key=key, request_api_version=version, correlation_id=corr,
                     client_id=data.draw(st.one_of(st.none(), st.text(max_size=5)), label="client id"))
    return encode_request(header, body)


# ============================================================================================ checks


def core_closed(port: FakePort) -> bool:
    """The core closed the connection itself (the test's client_lost leaves ``port.closed`` None)."""
    return port.closed is not None


def response_corrs(stream: bytes) -> tuple[list[int], int]:
    """The correlation ids of the whole response frames in a byte stream, and the bytes of a last, partial one."""
    corrs: list[int] = []
    pos = 0
    while len(stream) - pos >= 8:
        size = int.from_bytes(stream[pos : pos + 4], "big", signed=True)
        assert size >= 4, f"the client was sent a response frame of {size} bytes"
        if pos + 4 + size > len(stream):
            break
        corrs.append(int.from_bytes(stream[pos + 4 : pos + 8], "big", signed=True))
        pos += 4 + size
    return corrs, len(stream) - pos


def sent_client(port: FakePort) -> bytes:
    """Every byte the client was sent, in order."""
    return b"".join(arg for name, arg in port.actions if name == "send_client")


def check_closed_cleanly(rig: CoreRig, ports: list[FakePort], conns: list[Connection]) -> None:
    """After every connection is gone: no memory held or waited for, no name lookup waited for, no timer left,
    and nothing was sent (or timed) after a close."""
    for conn, port in zip(conns, ports, strict=True):
        if not conn.closed:
            port.gone()
            conn.client_lost()
        # events after the close are ignored
        conn.client_data(sized(b"\x00\x12\x00\x03\x00\x00\x00\x01\xff\xff\x00"))
        conn.upstream_data(b"\x00\x00\x00\x04\x00\x00\x00\x01")
        conn.client_write_resumed()
        conn.upstream_write_resumed()
    assert not rig.timers.pending, f"timers left after every close: {rig.timers.pending}"
    rig.advance(3600)
    assert rig.memory.held == 0, f"{rig.memory.held} response bytes still held after every close"
    assert rig.memory.waiting == 0
    assert rig.metrics.total("sluice_response_bytes_held") == 0
    assert not rig.names.waiting, "a closed connection still waits for topic names"
    late = [port.late for port in ports if port.late]
    assert not late, f"actions after close: {late}"


def rejected_total(rig: CoreRig) -> float:
    return rig.metrics.total("sluice_frames_rejected_total")


def check_reasons(rig: CoreRig) -> None:
    known = sum(rig.rejected(r) for r in REJECT_REASONS)
    assert known == rejected_total(rig), "a rejection under a reason that is not a RejectReason"


# =============================================================================== 1. the frame reader

#: the policies on: KIP-74 budgets for every client and replica fetchers, a global response-memory bound,
#: KIP-73 throttles on every topic (consumers too), client quotas on every client (throttle_time_ms written,
#: the client muted), KIP-227 terminate mode
POLICIES: dict[str, Any] = {
    "size_limit.budgets": [{"client_id": "*", "fetch_max_bytes": 3000, "partition_max_bytes": 700},
                           {"replicas": True, "fetch_max_bytes": 5000}],
    "size_limit.global_max_bytes": 6000,
    "throttle.leader_rate_bytes": 2000,
    "throttle.follower_rate_bytes": 2000,
    "throttle.topics": [{"topic": "t"}, {"topic": "u*"}],
    "throttle.consumers": [{"client_id": "*"}],
    "quota.entries": [{"client_id": "*", "produce_rate_bytes": 200, "fetch_rate_bytes": 2000, "request_rate": 50}],
    "sessions.mode": "terminate",
}
CONFIGS: dict[str, dict[str, Any]] = {
    "default": {},
    "policies": POLICIES,
    "policies_passthrough": {k: v for k, v in POLICIES.items() if k != "sessions.mode"},
    # terminate mode alone: no earlier policy decodes a session-less client's Fetch, so it is read against the
    # client's previous one (Baseline) and answered from the kept full response (FullResponse)
    "terminate": {"sessions.mode": "terminate"},
}


def _draw_rig(data: st.DataObject, limits: Limits | None = None) -> CoreRig:
    config = data.draw(st.sampled_from(sorted(CONFIGS)), label="config")
    return CoreRig(CONFIGS[config], limits=limits)


def _client_item(data: st.DataObject, max_frame: int) -> bytes:
    """One piece of a client's byte stream: a request frame (golden or generated, maybe mutated) with its size
    prefix (maybe wrong), or raw bytes."""
    kind = data.draw(st.sampled_from(["golden", "golden", "spec", "mutated", "mutated", "prefix", "raw"]),
                     label="item")
    if kind == "raw":
        return data.draw(st.binary(max_size=40), label="raw")
    if data.draw(st.booleans(), label="from golden"):
        requests = [g.request for g in golden() if g.request is not None]
        frame = data.draw(st.sampled_from(requests), label="golden request")
    else:
        frame = spec_request(data, corr=data.draw(st.integers(0, 9), label="corr"))
    if kind == "golden" or kind == "spec":
        return sized(frame)
    if kind == "mutated":
        return sized(data.draw(mutated(frame), label="mutated"))
    # the size prefix is what is wrong: too large, negative, or off by a little
    size = data.draw(st.sampled_from([max_frame + 1, 2**31 - 1, -1, -(2**31), len(frame) - 1, len(frame) + 1, 0]),
                     label="size")
    return size.to_bytes(4, "big", signed=True) + frame


def _whole_frames(stream: bytes, max_frame: int) -> tuple[int, bool]:
    """How the core must frame ``stream``: the whole frames before the first bad size prefix, and whether there
    is one (negative or above ``max_frame``)."""
    pos = n = 0
    while len(stream) - pos >= 4:
        size = int.from_bytes(stream[pos : pos + 4], "big", signed=True)
        if size < 0 or size > max_frame:
            return n, True
        if len(stream) < pos + 4 + size:
            break
        pos += 4 + size
        n += 1
    return n, False


def frame_reader_client(data: st.DataObject) -> None:
    """Arbitrary byte streams from a client, split anywhere, the clock moving between chunks."""
    max_frame = data.draw(st.sampled_from([64, 1000, 1 << 20]), label="max_frame_bytes")
    rig = _draw_rig(data, Limits(max_frame_bytes=max_frame, request_timeout_s=30.0))
    conn, port = rig.connect(ready=data.draw(st.booleans(), label="upstream ready"))
    classified: list[Exchange | Relayed] = []
    _record_classified(rig, lambda: classified)
    stream = b"".join(_client_item(data, max_frame) for _ in range(data.draw(st.integers(1, 4), label="items")))
    for piece in chunks(data, stream):
        conn.client_data(piece)
        if data.draw(st.integers(0, 4), label="advance?") == 0:
            rig.advance(data.draw(st.sampled_from([0.5, 10.0, 29.9, 30.0, 45.0]), label="seconds"))
    if not conn.closed and data.draw(st.booleans(), label="ready later"):
        conn.upstream_ready("broker:9092")
    n, bad = _whole_frames(stream, max_frame)
    check_reasons(rig)
    if core_closed(port):
        assert rejected_total(rig) == 1, "a connection closed by the core counts exactly one rejection"
        assert not conn.busy
    else:
        assert rejected_total(rig) == 0
        assert not bad, "a bad size prefix must close the connection"
        # every whole frame was handled: answered or relayed (complete), or owed a response, or waiting
        done = rig.metrics.total("sluice_requests_total")
        assert done + len(conn.inflight) + conn.queued == n == len(classified)
    check_closed_cleanly(rig, [port], [conn])


def _record_classified(rig: CoreRig, current: Callable[[], list[Exchange | Relayed]]) -> None:
    """Record every request the chain classifies (exchanges and relayed requests) or relays by its shortest path
    (Chain.relay), in order, in the list ``current()`` gives at that moment."""
    chain = rig.proxy.chain
    classify, relay = chain.classify, chain.relay

    def recording(frame: bytes, now: float, info: ConnectionInfo | None = None,
                  relayable: bool = False) -> Exchange | Relayed:
        ex = classify(frame, now, info, relayable)
        current().append(ex)
        return ex

    def relaying(wire: bytes, now: float) -> Relayed | None:
        r = relay(wire, now)
        if r is not None:
            current().append(r)
        return r

    chain.classify = recording  # type: ignore[method-assign, assignment]
    chain.relay = relaying  # type: ignore[method-assign]


def _upstream_answer(data: st.DataObject, ex: Exchange | Relayed, pair: Golden | None) -> bytes:
    """The upstream's bytes for ``ex``: its response (golden, or the spec's default) with its correlation id,
    mutated or not, its size prefix right or not; or raw bytes."""
    corr = ex.header.correlation_id
    if pair is not None and pair.response is not None:
        frame = with_corr(pair.response, corr, request=False)
    else:
        frame = encode_response(ex.header.api_key, ex.header.api_version, Message(correlation_id=corr),
                                response_codec(ex.header.api_key, ex.header.api_version).default())
    kind = data.draw(st.sampled_from(["valid", "valid", "valid", "mutated", "prefix", "raw"]), label="answer")
    if kind == "valid":
        return sized(frame)
    if kind == "mutated":
        return sized(data.draw(mutated(frame), label="mutated answer"))
    if kind == "prefix":
        size = data.draw(st.sampled_from([2**31 - 1, -1, 0, 3, len(frame) - 1, len(frame) + 1]), label="size")
        return size.to_bytes(4, "big", signed=True) + frame
    return data.draw(st.binary(max_size=24), label="raw answer")


def frame_reader_upstream(data: st.DataObject) -> None:
    """The upstream side: answers to the requests in flight (real responses from the golden captures, mutated or
    not, or bytes), split anywhere, the client's writes pausing and resuming meanwhile."""
    rig = _draw_rig(data, Limits(max_frame_bytes=1 << 20))
    conn, port = rig.connect()
    classified: list[Exchange | Relayed] = []
    _record_classified(rig, lambda: classified)
    pairs = data.draw(st.lists(st.sampled_from(golden_pairs()), min_size=1, max_size=4), label="pairs")
    by_corr: dict[int, Golden] = {}
    frames = []
    for corr, pair in enumerate(pairs, start=1):
        assert pair.request is not None
        frames.append(with_corr(pair.request, corr, request=True))
        by_corr[corr] = pair
    conn.client_data(sized(*frames))
    ids = rig.names.take()  # Fetch v13+ waits for its topic names (throttles read them): some are found
    if ids:
        rig.names.settle({i: "t" for i in sorted(ids)[:1]}, sorted(ids)[1:])
    if core_closed(port):  # a golden request a policy refuses (a version outside what Sluice decodes)
        assert rejected_total(rig) == 1
        check_closed_cleanly(rig, [port], [conn])
        return
    stream = b"".join(_upstream_answer(data, ex, by_corr.get(ex.header.correlation_id)) for ex in list(conn.awaiting))
    for piece in chunks(data, stream):
        if data.draw(st.integers(0, 5), label="pause?") == 0:
            conn.client_write_paused()
        conn.upstream_data(piece)
        if data.draw(st.integers(0, 3), label="resume?") == 0:
            conn.client_write_resumed()
        assert rig.memory.held >= 0
    owed = [ex.header.correlation_id for ex in classified if ex.expects_response]
    corrs, _ = response_corrs(sent_client(port))
    assert corrs == owed[: len(corrs)], f"responses out of order: {corrs} for requests {owed}"
    check_reasons(rig)
    assert rejected_total(rig) == (1 if core_closed(port) else 0)
    check_closed_cleanly(rig, [port], [conn])


# ========================================================================== 2. the streaming Fetch walker


@cache
def _router() -> Any:
    from proxy.core.routing import Router

    return Router("proxy.example", 0)


def _fetch_msg(data: st.DataObject, version: int) -> Message:
    return data.draw(message_strategy(response_spec(1), version), label="fetch response")


def _fetch_body(data: st.DataObject, version: int) -> bytes:
    return response_codec(1, version).encode(_fetch_msg(data, version))


def _stream(streamer: FetchStreamer, pieces: list[bytes]) -> bytes:
    out = bytearray()
    fed = 0
    for piece in pieces:
        fed += len(piece)
        for buf in streamer.feed(piece):
            out += buf
        assert len(out) <= fed, f"{len(out)} bytes out for {fed} in"
    return bytes(out)


def fetch_streamer_valid(data: st.DataObject) -> None:
    """A valid Fetch v16+ response cut into random chunks goes out byte for byte, except its top-level tag section
    (NodeEndpoints rewritten or hidden, within the same length)."""
    version = data.draw(st.integers(16, 18), label="version")
    body = _fetch_body(data, version)
    header_tags = data.draw(st.sampled_from([b"\x00", b"\x01\x05\x02ab", b"\x02\x00\x00\x07\x01z"]), label="hdr")
    stream = header_tags + body
    streamer = FetchStreamer(version, len(stream), _router().rewrite_nodes)
    out = _stream(streamer, chunks(data, stream))
    assert len(out) == len(stream)
    view = fetch_fast.decode(body, version)
    tail = len(top_tail(view))
    assert out[: len(stream) - tail] == stream[: len(stream) - tail], "a byte before the tag section changed"
    if not view.node_endpoints:
        assert out == stream and not streamer.changed
    after = fetch_fast.decode(out[len(header_tags) :], version)
    assert after.topics == view.topics and after.session_id == view.session_id
    assert len(after.node_endpoints) in (0, len(view.node_endpoints))


def fetch_streamer_mutated(data: st.DataObject) -> None:
    """Mutated, truncated or padded Fetch v16+ responses (also golden ones), declared sizes right or wrong: only
    CodecError, and never more bytes out than in."""
    version = data.draw(st.integers(16, 18), label="version")
    if data.draw(st.booleans(), label="golden"):
        frames = [g.response[4:] for g in golden() if g.api_key == 1 and g.version >= 16 and g.response]
        stream = data.draw(st.sampled_from(frames), label="golden fetch")
    else:
        stream = b"\x00" + _fetch_body(data, version)
    stream = data.draw(mutated(stream), label="mutated")
    size = len(stream) + data.draw(st.sampled_from([0, 0, 0, -1, 1, 100]), label="size off by")
    if size < 0:
        return
    streamer = FetchStreamer(version, size, _router().rewrite_nodes)
    try:
        out = _stream(streamer, chunks(data, stream))
    except CodecError:
        return
    assert size >= len(stream), "bytes beyond the declared size were accepted"
    assert len(out) <= len(stream)
    if size == len(stream):
        assert len(out) == len(stream), "a complete response must go out whole"


# ====================================================================== 3. decoders, views, fast paths


def _reencodes_request(header: Message, body: Message) -> None:
    again = encode_request(header, body)  # what decodes must encode (a CodecError here is a bug)
    h2, b2 = decode_request(again)
    assert encode_request(h2, b2) == again, "decode(encode(m)) re-encodes differently"


def decode_requests(data: st.DataObject) -> None:
    """Mutated requests of every (api, version) Sluice decodes: CodecError or a message that re-encodes; the
    header peek, Produce's acks peek and the request view agree."""
    if data.draw(st.integers(0, 3), label="golden?") == 0:
        frame = data.draw(st.sampled_from([g.request for g in golden() if g.request]), label="golden request")
    else:
        frame = spec_request(data)
    frame = data.draw(mutated(frame), label="mutated")
    try:
        peek = peek_request_header(frame)
    except CodecError:
        peek = None
    try:
        header, body = decode_request(frame)
    except CodecError:
        header = None
    if header is not None:
        assert peek is not None and (peek.api_key, peek.api_version) == (header.request_api_key,
                                                                          header.request_api_version)
        _reencodes_request(header, body)
    if peek is None or not known_api(peek.api_key):
        return
    if peek.api_key == 0:
        try:
            acks = produce_acks(frame, peek)
        except CodecError:
            acks = None
        if header is not None and peek.api_version >= 3:
            assert acks == body.acks
    versions = decoded_versions(peek.api_key)
    if versions is None or peek.api_version not in versions:
        return
    try:
        view = request_view(peek.api_key, frame)
        if isinstance(view, FetchEdit):
            view.encode()
        else:
            view.header  # noqa: B018
    except CodecError:
        if peek.api_key != 1:
            assert header is None, "the request view fails where decode_request does not"


def decode_responses(data: st.DataObject) -> None:
    """Mutated responses of every (api, version) Sluice decodes: CodecError or a message that re-encodes; the
    views the policies read (MetadataHead, MessageResponse, Produce's tag skim, FetchResponse) raise nothing
    else."""
    if data.draw(st.integers(0, 3), label="golden?") == 0:
        pair = data.draw(st.sampled_from([g for g in golden() if g.response]), label="golden response")
        assert pair.response is not None
        key, version, frame = pair.api_key, pair.version, pair.response
    else:
        key, version = data.draw(st.sampled_from(response_cases()), label="response (api, version)")
        body = data.draw(message_strategy(response_spec(key), version), label="body")
        frame = encode_response(key, version, Message(correlation_id=1), body)
    frame = data.draw(mutated(frame), label="mutated")
    try:
        header, decoded = decode_response(key, version, frame)
    except CodecError:
        decoded = None
    if decoded is not None:
        again = encode_response(key, version, header, decoded)
        h2, b2 = decode_response(key, version, again)
        assert encode_response(key, version, h2, b2) == again, "decode(encode(m)) re-encodes differently"
    try:
        view = response_view(key, version, frame)
        if isinstance(view, MetadataHead):
            view.changed = True
            view.encode()
        elif isinstance(view, MessageResponse):
            if key == 0 and version >= 10:
                view.top_level_tags_empty()
            view.body  # noqa: B018
            view.changed = True
            view.encode()
        else:
            view.changed = True
            view.encode()
    except CodecError:
        return
    if decoded is not None and key == 1:
        assert to_message(view.view) == decoded  # type: ignore[union-attr]


def _fetch_request_frame(data: st.DataObject) -> bytes:
    if data.draw(st.integers(0, 3), label="golden?") == 0:
        return data.draw(st.sampled_from([g.request for g in golden() if g.api_key == 1 and g.request]),
                         label="golden fetch request")
    return spec_request(data, api_key=1)


def _same_request(view: Any, frame: bytes) -> None:
    """The fast path's view of ``frame`` says what the construct decode of it says."""
    header, ref = decode_request(frame)
    version = view.version
    assert view.correlation_id == header.correlation_id
    assert {k: tuple(p[:5]) for k, p in view.partitions().items()} == {
        k: tuple(p[:5]) for k, p in request_partitions(ref, version).items()}
    assert list(view.partitions()) == list(request_partitions(ref, version))
    assert view.forgotten() == forgotten_partitions(ref, version)
    assert (view.max_wait_ms, view.min_bytes, view.max_bytes, view.isolation_level) == (
        ref.max_wait_ms, ref.min_bytes, ref.max_bytes, ref.isolation_level)
    assert (view.session_id, view.session_epoch) == (ref.get("session_id", 0), ref.get("session_epoch", -1))
    assert view.rack_id == ref.get("rack_id", "") and view.cluster_id == ref.get("cluster_id")


def fetch_request_fast(data: st.DataObject) -> None:
    """The Fetch request fast path on mutated requests: CodecError exactly where the construct codec fails, the
    same partitions and fields where both decode, and a re-encoding that decodes to the same."""
    frame = data.draw(mutated(_fetch_request_frame(data)), label="mutated")
    try:
        view = decode_fetch_request(frame)
    except CodecError:
        view = None
    try:
        header, _ = decode_request(frame)
        construct_ok = header.request_api_key == 1
    except CodecError:
        construct_ok = False
    assert (view is not None) == construct_ok, "the fast path and construct disagree on whether it decodes"
    if view is None:
        return
    _same_request(view, frame)
    again = encode_fetch_request(view, view.session_id, view.session_epoch, view.partitions(), view.forgotten())
    _same_request(decode_fetch_request(again), again)
    assert decode_fetch_request(again).partitions() == view.partitions()


_IDS = [bytes([i]) * 16 for i in range(1, 4)]
_NAMES = ["a", "b", "topic-ü"]
_I32 = st.integers(-(2**31), 2**31 - 1)
_PARAMS = st.builds(FetchParams, st.integers(-1, 2**40), st.integers(-1, 10), _I32, st.integers(-1, 5),
                    st.integers(-1, 5), tags=st.none())


def fetch_request(version: int, corr: int, parts: dict[PartitionKey, FetchParams], max_bytes: int = 1 << 20,
                 client_id: str | None = "c", session: tuple[int, int] = (0, -1),
                 forgotten: list[PartitionKey] | None = None, replica_id: int = -1) -> bytes:
    """A Fetch request frame (fixed-layout partitions, consecutive ones of a topic in one entry)."""
    body = request_codec(1, version).default().replace(max_wait_ms=500, min_bytes=1, max_bytes=max_bytes)
    if version < 15:
        body = body.replace(replica_id=replica_id)
    elif replica_id >= 0:
        body = body.replace(replica_state=body.replica_state.replace(replica_id=replica_id, replica_epoch=1))
    header = Message(request_api_key=1, request_api_version=version, correlation_id=corr, client_id=client_id)
    base = decode_fetch_request(encode_request(header, body))
    return encode_fetch_request(base, session[0], session[1], parts, forgotten or [])


def fetch_baseline(data: st.DataObject) -> None:
    """``Baseline.read`` of random second frames (the baseline's partitions rotated and edited, re-encoded with
    other fields, mutated, or another request altogether) against a session-less request: None, or exactly the
    partitions a full decode says differ, never an exception."""
    version = data.draw(st.integers(4, 18), label="version")
    topics: list[TopicKey] = list(_IDS) if version >= 13 else list(_NAMES)
    keys = st.tuples(st.sampled_from(topics), st.integers(0, 40))
    parts: dict[PartitionKey, FetchParams] = data.draw(st.dictionaries(keys, _PARAMS, min_size=1, max_size=12),
                                                       label="parts")
    first = fetch_request(version, 1, parts)
    baseline = Baseline(decode_fetch_request(first), first)
    kind = data.draw(st.sampled_from(["edited", "mutated", "edited+mutated", "other"]), label="second")
    if kind == "other":
        second = data.draw(mutated(_fetch_request_frame(data)), label="other frame")
    else:
        keys_ = list(parts)
        turn = data.draw(st.integers(0, len(keys_) - 1), label="rotation")
        edited = {k: parts[k] for k in keys_[turn:] + keys_[:turn]}
        for key in data.draw(st.lists(st.sampled_from(keys_), max_size=4), label="edited keys"):
            edited[key] = data.draw(_PARAMS, label="params")
        second = fetch_request(version, data.draw(_I32, label="corr"), edited,
                              max_bytes=data.draw(st.sampled_from([1 << 20, 7]), label="max_bytes"))
        if kind != "edited":  # mostly past the header: a header that differs is refused at once
            start = data.draw(st.sampled_from([0, len(baseline.view.header)]), label="from")
            second = data.draw(mutated(second, start=start), label="mutated second")
    result = baseline.read(second)
    if result is None:
        return
    view, changed = result
    full = decode_fetch_request(second)  # what reads against the baseline is a valid request
    _same_request(full, second)
    got = full.partitions()
    assert set(got) == set(parts), "read against the baseline with other partitions"
    base = baseline.view.partitions()
    for key, params in got.items():
        if key in changed:
            assert changed[key] == params
        else:
            assert _written(params, version) == _written(base[key], version), f"{key} changed unnoticed"
    assert view.correlation_id == full.correlation_id and view.header == full.header
    out = encode_fetch_request(view, view.session_id, view.session_epoch, got, view.forgotten())
    assert decode_fetch_request(out).partitions() == got


def _written(p: FetchParams, version: int) -> tuple[int, ...]:
    return (p.fetch_offset, p.partition_max_bytes, p.log_start_offset if version >= 5 else -1,
            p.current_leader_epoch if version >= 9 else -1, p.last_fetched_epoch if version >= 12 else -1)


def fetch_response_fast(data: st.DataObject) -> None:
    """The Fetch response fast path on mutated responses (generated and golden): CodecError only, the construct
    codec's message wherever both decode, and encode_partition writing what the full encoder writes."""
    if data.draw(st.integers(0, 3), label="golden?") == 0:
        pair = data.draw(st.sampled_from([g for g in golden() if g.api_key == 1 and g.response]), label="golden")
        assert pair.response is not None
        version, frame = pair.version, pair.response
    else:
        version = data.draw(st.integers(4, 18), label="version")
        frame = encode_response(1, version, Message(correlation_id=1), _fetch_msg(data, version))
    frame = data.draw(mutated(frame), label="mutated")
    try:
        _, _, view = fetch_fast.decode_frame(frame, version)
    except CodecError:
        view = None
    try:
        _, ref = decode_response(1, version, frame)
    except CodecError:
        ref = None
    if view is None:
        return
    if ref is not None:
        assert to_message(view) == ref, "the fast path and construct decode differently"
    body = view.to_bytes()
    again = fetch_fast.decode(body, version)
    assert again == view
    pieces: list[Any] = []
    for t in view.topics:
        pieces.append(topic_head(version, t.topic_id if version >= 13 else t.topic, len(t.partitions)))
        for p in t.partitions:
            pieces.extend(encode_partition(version, p))
        pieces.append(topic_tail(version, t.tags))
    assert top_head(view, len(view.topics)) + b"".join(pieces) + top_tail(view) == body


# ================================================================================ 4. connection events

TOPIC_IDS = {b"\x01" * 16: "t", b"\x02" * 16: "u"}
UNKNOWN_ID = b"\x03" * 16
SESSION_ERRORS = [70, 71, 1, -1, 0]


@dataclass
class _Side:
    conn: Connection
    port: FakePort
    classified: list[Exchange | Relayed] = field(default_factory=list)
    corr: int = 0
    #: upstream request frames sent and not answered yet, in order
    owed: deque[bytes] = field(default_factory=deque)
    #: upstream bytes made and not yet delivered
    pending: bytearray = field(default_factory=bytearray)
    closed_by_test: bool = False
    #: the client's own fetch session, as Sluice's responses told it: (session id, next epoch)
    session: tuple[int, int] | None = None
    #: the client's last session-less fetch (version, partitions, client id), which it may send again
    last_fetch: tuple[int, dict[PartitionKey, FetchParams], str | None] | None = None
    #: bytes of the client's stream already read for sessions
    seen: int = 0


def _fetch_keys(version: int) -> list[PartitionKey]:
    topics: list[Any] = [*TOPIC_IDS, UNKNOWN_ID] if version >= 13 else ["t", "u", "v"]
    return [(t, p) for t in topics for p in range(12)]


def _client_request(data: st.DataObject, side: _Side, kind: str | None = None) -> bytes:
    side.corr += 1
    corr = side.corr
    if kind is None:
        kind = data.draw(st.sampled_from(REQUESTS), label="request")
    params = st.builds(FetchParams, st.integers(0, 50), st.just(-1), st.sampled_from([100, 700, 1 << 20]),
                       st.just(-1), st.just(-1), st.none())
    if kind == "fetch_again" and side.last_fetch is not None:
        # a session-less client fetching the same partitions again, some of them further on (librdkafka)
        version, parts, client_id = side.last_fetch
        parts = dict(parts)
        for key in data.draw(st.lists(st.sampled_from(list(parts)), max_size=2), label="moved") if parts else ():
            parts[key] = parts[key]._replace(fetch_offset=parts[key].fetch_offset + 1)
        side.last_fetch = (version, parts, client_id)
        return fetch_request(version, corr, parts, client_id=client_id)
    if kind in ("fetch", "fetch_again"):
        version = data.draw(st.sampled_from([4, 7, 11, 12, 13, 15, 16, 17, 18]), label="fetch version")
        keys = _fetch_keys(version)
        parts = data.draw(st.dictionaries(st.sampled_from(keys), params, max_size=12), label="partitions")
        choices = [(0, -1), (0, -1), (0, 0), (1, 1), (1, -1), "mine", "mine"]
        session = data.draw(st.sampled_from(choices), label="session")
        if session == "mine":
            session = side.session or (0, 0)  # the client's own session, else a new one
            if session[1] > 0:
                side.session = (session[0], session[1] + 1)
        assert isinstance(session, tuple)
        forgotten = data.draw(st.lists(st.sampled_from(keys), max_size=2), label="forgotten") if session[1] > 0 else []
        client_id = data.draw(st.sampled_from(["c", "bench-client", None]), label="client")
        replica_id = data.draw(st.sampled_from([-1, -1, -1, 1]), label="replica")
        max_bytes = data.draw(st.sampled_from([1 << 20, 500]), label="max_bytes")
        if session == (0, -1) and replica_id < 0 and parts and max_bytes == 1 << 20:
            side.last_fetch = (version, parts, client_id)  # a consumer's fetch, which it may send again
        return fetch_request(version, corr, parts, max_bytes=max_bytes, client_id=client_id, session=session,
                             forgotten=forgotten, replica_id=replica_id)
    if kind == "list_offsets":
        return request(2, 7, corr)
    if kind == "api_versions":
        return request(18, 3, corr)
    if kind == "api_versions_99":
        return bytes.fromhex("00120063") + corr.to_bytes(4, "big") + bytes.fromhex("000174")
    if kind == "metadata":
        return request(3, data.draw(st.sampled_from([5, 12, 13]), label="metadata version"), corr)
    if kind in ("produce0", "produce1"):
        return request(0, 9, corr, request_codec(0, 9).default().replace(acks=0 if kind == "produce0" else 1))
    if kind == "produce10":
        return request(0, 10, corr, request_codec(0, 10).default().replace(acks=-1))
    if kind == "golden":
        frames = [g.request for g in golden() if g.request]
        return with_corr(data.draw(st.sampled_from(frames), label="golden request"), corr, request=True)
    frame = spec_request(data, corr)
    if kind == "mutated":
        frame = data.draw(mutated(frame, max_mutations=1), label="mutated request")
    return frame


def _fetch_answer(data: st.DataObject, frame: bytes) -> bytes:
    """A broker's answer to an upstream Fetch: some of its partitions (and now and then one it did not ask for),
    records or not, a session (a new one for a full session request), errors now and then."""
    request = decode_fetch_request(frame)
    version = request.version
    keys = list(request.partitions())
    if data.draw(st.integers(0, 9), label="more keys?") == 0:
        keys += data.draw(st.lists(st.sampled_from(_fetch_keys(version)), max_size=2), label="extra keys")
    chosen = data.draw(st.lists(st.sampled_from(keys), unique=True, max_size=len(keys)), label="answered") \
        if keys and request.session_epoch > 0 else keys
    topics: list[FetchTopic] = []
    for topic, index in chosen:
        params = request.partitions().get((topic, index))
        offset = params.fetch_offset if params is not None else 0
        records = b""
        if data.draw(st.integers(0, 2), label="records?") == 0:
            count = data.draw(st.integers(1, 3), label="records")
            records = encode_batch(new_batch([Record(offset_delta=i, value=b"v" * 200) for i in range(count)],
                                             base_offset=offset))
        hw = offset + data.draw(st.integers(0, 5), label="hw")
        p = FetchPartition(index, data.draw(st.sampled_from([0, 0, 0, 1, 6]), label="error"), hw, hw, 0,
                           [AbortedTransaction(1, offset)] if data.draw(st.integers(0, 9), label="txn?") == 0
                           else None, -1, records)
        if not topics or (topics[-1].topic_id if version >= 13 else topics[-1].topic) != topic:
            topics.append(FetchTopic(topic, bytes(16), []) if isinstance(topic, str) else FetchTopic("", topic, []))
        topics[-1].partitions.append(p)
    if request.session_epoch == 0:
        session_id = data.draw(st.integers(1, 3), label="new session")
    elif request.session_epoch > 0:
        session_id = request.session_id
    else:
        session_id = 0
    error = data.draw(st.sampled_from(SESSION_ERRORS), label="top error") \
        if version >= 7 and data.draw(st.integers(0, 9), label="error?") == 0 else 0
    endpoints = [NodeEndpoint(1, "broker-1", 9092, None)] \
        if version >= 16 and data.draw(st.integers(0, 3), label="endpoints?") == 0 else None
    view = FetchResponseView(version, 0, error, 0 if error else session_id, [] if error else topics, endpoints)
    buffers, _ = view.encode_frame(request.correlation_id)
    return b"".join(bytes(b) for b in buffers)[4:]


def _answer(data: st.DataObject, frame: bytes) -> bytes:
    """The upstream's whole answer (size prefix included) to the upstream request ``frame``."""
    head = peek_request_header(frame)
    key, version, corr = head.api_key, head.api_version, head.correlation_id
    pairs = [g for g in golden_pairs() if (g.api_key, g.version) == (key, version)]
    body = b""
    if key == 1:
        try:
            body = _fetch_answer(data, frame)
        except CodecError:  # a request Sluice relayed unread: answered with the spec's default
            pass
    use_golden: bool = data.draw(st.booleans(), label="golden answer") if pairs else False
    if body:
        pass
    elif use_golden:
        response = data.draw(st.sampled_from(pairs), label="golden pair").response
        assert response is not None
        body = with_corr(response, corr, request=False)
    else:
        try:
            body = encode_response(key, version, Message(correlation_id=corr), response_codec(key, version).default())
        except CodecError:  # a version the specs no longer have (Produce v0-2)
            body = corr.to_bytes(4, "big", signed=True)
    kind = data.draw(st.sampled_from(["valid"] * 23 + ["mutated", "prefix"]), label="answer kind")
    if kind == "mutated":
        return sized(data.draw(mutated(body, max_mutations=1), label="mutated answer"))
    if kind == "prefix":
        size = data.draw(st.sampled_from([2**31 - 1, -1, 0, 3, len(body) - 1, len(body) + 1]), label="size")
        return size.to_bytes(4, "big", signed=True) + body
    return sized(body)


def _expects_response(frame: bytes) -> bool:
    head = peek_request_header(frame)
    if head.api_key == 0:
        return produce_acks(frame, head) != 0
    return True


def _collect_upstream(side: _Side) -> None:
    stream = side.port.take_upstream()
    pos = 0
    while pos < len(stream):
        size = int.from_bytes(stream[pos : pos + 4], "big")
        frame = stream[pos + 4 : pos + 4 + size]
        assert len(frame) == size, "a partial frame went upstream"
        if _expects_response(frame):
            side.owed.append(frame)
        pos += 4 + size


def _learn_session(side: _Side) -> None:
    """Read the client's new whole responses: a Fetch response naming a session is the client's session now
    (its next request is epoch 1), an error ends it."""
    stream = sent_client(side.port)
    by_corr = {ex.header.correlation_id: ex for ex in side.classified}
    pos = side.seen
    while len(stream) - pos >= 8:
        size = int.from_bytes(stream[pos : pos + 4], "big")
        if pos + 4 + size > len(stream):
            break
        frame = stream[pos + 4 : pos + 4 + size]
        pos += 4 + size
        ex = by_corr.get(int.from_bytes(frame[:4], "big", signed=True))
        if ex is None or ex.header.api_key != 1 or ex.header.api_version < 7:
            continue
        try:
            _, _, view = fetch_fast.decode_frame(frame, ex.header.api_version)
        except CodecError:
            continue
        if view.error_code:
            side.session = None
        elif view.session_id and (side.session is None or side.session[0] != view.session_id):
            side.session = (view.session_id, 1)
    side.seen = pos


def _deliver(data: st.DataObject, side: _Side) -> None:
    """Deliver what the upstream has made for this connection: all of it, or a piece."""
    n = len(side.pending)
    if data.draw(st.booleans(), label="a piece?"):
        n = data.draw(st.integers(1, max(1, n)), label="deliver bytes")
    piece = bytes(side.pending[:n])
    del side.pending[:n]
    side.conn.upstream_data(piece)


#: the client's requests, weighted: mostly Fetch (session-less, repeated, in sessions), now and then a request
#: relayed as bytes, collected, answered by Sluice, without a response, or a random or mutated one
REQUESTS = ["fetch"] * 6 + ["fetch_again"] * 8 + ["list_offsets", "api_versions", "api_versions_99", "metadata",
                                                   "produce0", "produce1", "produce10", "golden", "spec", "mutated"]
#: the events, weighted; the ones that end a connection are drawn apart, rarely (a connection lives for a while)
EVENTS = (["request"] * 4 + ["roundtrip"] * 6 + ["consume"] * 3 + ["respond"] * 5 + ["respond_all"] * 3
          + ["deliver"] * 3 + ["names"] * 3 + ["advance"] * 2 + ["turn"] * 2
          + ["client_paused", "client_resumed", "client_resumed", "upstream_paused", "upstream_resumed",
             "upstream_resumed", "ready", "garbage"])
ENDINGS = ["client_lost", "upstream_lost", "close", "upstream_failed"]
#: events after which a connection the core closed must have counted a rejection
DATA_EVENTS = set(EVENTS)


def connection_events(data: st.DataObject) -> None:
    """Random event sequences on two connections sharing a CoreRig (and its response-memory bound)."""
    config = data.draw(st.sampled_from(["policies", "terminate", "policies", "terminate", "policies_passthrough",
                                        "default"]), label="config")
    rig = CoreRig(CONFIGS[config], limits=Limits(max_frame_bytes=1 << 20, request_timeout_s=30.0,
                                                 write_high_water_bytes=300),
                  put_off=data.draw(st.booleans(), label="decodes put off to the next turn"))
    if "sessions.mode" in CONFIGS[config]:  # the session ids Sluice hands out: the same in every run of an example
        rig.proxy.policy("terminate").server.cache.rng = random.Random(0)
    sides = []
    for _ in range(2):
        conn, port = rig.connect(ready=data.draw(st.booleans(), label="ready"))
        sides.append(_Side(conn, port))
    current: list[list[Exchange | Relayed]] = [sides[0].classified]
    _record_classified(rig, lambda: current[0])
    for _ in range(data.draw(st.integers(1, 60), label="events")):
        if data.draw(st.integers(0, 29), label="ending?") == 0:
            event = data.draw(st.sampled_from(ENDINGS), label="ending")
        else:
            event = data.draw(st.sampled_from(EVENTS), label="event")
        side = sides[data.draw(st.integers(0, len(sides) - 1), label="side")]
        conn, port = side.conn, side.port
        current[0] = side.classified
        before = {id(s): s.conn.closed for s in sides}
        rejected = rejected_total(rig)
        if event == "request":
            pipelined = data.draw(st.sampled_from([1, 1, 2, 3]), label="pipelined")
            frames = [_client_request(data, side) for _ in range(pipelined)]
            for piece in chunks(data, sized(*frames), max_cuts=3):
                conn.client_data(piece)
        elif event in ("roundtrip", "consume"):
            # one request and the upstream answers at once; or a consumer's fetch loop: the same partitions
            # fetched again and again, some further on each time (a session-less client in terminate mode is
            # then read against its previous request and answered from its kept full response)
            rounds = data.draw(st.integers(2, 5), label="rounds") if event == "consume" else 1
            if event == "consume" and data.draw(st.booleans(), label="new consumer?"):
                # many partitions (a change or two does not make Sluice decode the request again), v7-12
                # (topic names: nothing to look up, so no earlier step decodes it)
                version = data.draw(st.sampled_from([7, 11, 12]), label="consumer version")
                count = data.draw(st.integers(8, 20), label="consumer partitions")
                side.last_fetch = (version, {k: FetchParams(0) for k in _fetch_keys(version)[:count]}, "c")
            for _ in range(rounds):
                conn.client_data(sized(_client_request(data, side, "fetch_again" if event == "consume" else None)))
                _collect_upstream(side)
                while side.owed:
                    side.pending += _answer(data, side.owed.popleft())
                conn.upstream_data(bytes(side.pending))
                side.pending.clear()
        elif event == "garbage":
            conn.client_data(data.draw(st.binary(max_size=12), label="garbage"))
        elif event == "respond":
            if side.owed:
                side.pending += _answer(data, side.owed.popleft())
            if side.pending:
                _deliver(data, side)
        elif event == "respond_all":  # the upstream answers everything it owes, at once
            while side.owed:
                side.pending += _answer(data, side.owed.popleft())
            if side.pending:
                conn.upstream_data(bytes(side.pending))
                side.pending.clear()
        elif event == "deliver":
            if side.pending:
                _deliver(data, side)
        elif event == "client_paused":
            conn.client_write_paused()
        elif event == "client_resumed":
            conn.client_write_resumed()
        elif event == "upstream_paused":
            conn.upstream_write_paused()
        elif event == "upstream_resumed":
            conn.upstream_write_resumed()
        elif event == "turn":
            rig.turn()
        elif event == "advance":
            rig.advance(data.draw(st.sampled_from([0.001, 0.1, 0.5, 1.0, 31.0]), label="seconds"))
        elif event == "names":
            ids = rig.names.take()
            known = {i: TOPIC_IDS[i] for i in ids if i in TOPIC_IDS and data.draw(st.booleans(), label="known")}
            rig.names.settle(known, [i for i in ids if i not in known])
        elif event == "ready":
            conn.upstream_ready("broker:9092")
        elif event == "client_lost":
            port.gone()
            conn.client_lost()
            side.closed_by_test = True
        elif event == "upstream_lost":
            conn.upstream_lost(None)
            side.closed_by_test = True
        elif event == "close":
            conn.close(abort=data.draw(st.booleans(), label="abort"))
            side.closed_by_test = True
        elif event == "upstream_failed":
            conn.upstream_failed("refused")
            side.closed_by_test = True
        for s in sides:
            _collect_upstream(s)
            _learn_session(s)
        assert rig.memory.held >= 0, f"response memory held went negative: {rig.memory.held}"
        if event in DATA_EVENTS:
            newly = [s for s in sides if s.conn.closed and not before[id(s)]]
            assert all(core_closed(s.port) for s in newly)
            assert rejected_total(rig) - rejected == len(newly), "a close by the core without one rejection"
        for s in sides:
            owed = [ex.header.correlation_id for ex in s.classified if ex.expects_response]
            corrs, _ = response_corrs(sent_client(s.port))
            assert corrs == owed[: len(corrs)], f"responses out of order: {corrs} for requests {owed}"
    check_reasons(rig)
    check_closed_cleanly(rig, [s.port for s in sides], [s.conn for s in sides])


# ================================================================================================ registry

TARGETS: dict[str, Target] = {
    "frame_reader_client": frame_reader_client,
    "frame_reader_upstream": frame_reader_upstream,
    "fetch_streamer_valid": fetch_streamer_valid,
    "fetch_streamer_mutated": fetch_streamer_mutated,
    "decode_requests": decode_requests,
    "decode_responses": decode_responses,
    "fetch_request_fast": fetch_request_fast,
    "fetch_baseline": fetch_baseline,
    "fetch_response_fast": fetch_response_fast,
    "connection_events": connection_events,
}

__all__ = ["CONFIGS", "HUGE", "POLICIES", "TARGETS", "Target", "check_closed_cleanly", "chunks", "fetch_request",
           "golden", "mutated", "sized"]
