"""The sans-IO connection core (proxy/core/connection.py), driven directly: events in, port actions out.

Each test builds the chain a proxy builds from its settings (rig/chain_rig.py), a Connection on a fake Port
that records every action, and timers on a fake clock (rig/core_rig.py): no event loop, no sockets,
no sleeps. What is checked is what each side receives (in order), the metrics, the access-log lines and the port
actions (pause/resume reading, close, timers).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, MutableMapping
from typing import Any

import pytest
from structlog.testing import capture_logs

from bench.pipeline_cpu import request_frame, response_frame
from proxy.core.chain import Chain
from proxy.core.connection import Connection, Limits, State
from proxy.core.exchange import ConnectionInfo, Exchange, Signal
from proxy.core.policy import Policy, reads
from proxy.metrics import Tally
from proxy.policies.terminate.sessions import LEGACY, PartitionKey
from proxy.wire.fetch_fast import FetchPartition, FetchResponseView, FetchTopic, NodeEndpoint, decode_frame
from proxy.wire.fetch_request_fast import decode_fetch_request
from proxy.wire.messages import decode_response, request_codec, response_codec
from proxy.wire.model import Message
from proxy.wire.records import Record, encode_batch, new_batch
from rig.core_rig import CoreRig, FakePort, request, response, sized

LIST_OFFSETS, METADATA, API_VERSIONS, PRODUCE, SHARE_FETCH = 2, 3, 18, 0, 78
KEYS: list[PartitionKey] = [("t", 0), ("t", 1), ("t", 2)]
TID = bytes(range(16))  # a topic id (Fetch v13+)
CLIENT = "bench-client"  # bench/pipeline_cpu.py's fetches

_RIGS: list[CoreRig] = []
Logs = list[MutableMapping[str, Any]]


@pytest.fixture(autouse=True)
def logs() -> Iterator[list[MutableMapping[str, Any]]]:
    """The operational log events of the test (kept, not printed). After the test: no connection sent anything
    or started a timer once it was closed."""
    _RIGS.clear()
    with capture_logs() as events:
        yield events
    late = [(i, port.late) for rig in _RIGS for i, port in enumerate(rig.ports) if port.late]
    _RIGS.clear()
    assert not late, f"actions after close: {late}"


def make_rig(overrides: dict[str, Any] | None = None, **kwargs: Any) -> CoreRig:
    rig = CoreRig(overrides, **kwargs)
    _RIGS.append(rig)
    return rig


# --------------------------------------------------------------------------------------------- helpers


def list_offsets(corr: int) -> bytes:
    """A request no policy declares: relayed as bytes, its response too."""
    return request(LIST_OFFSETS, 7, corr)


def list_offsets_response(corr: int) -> bytes:
    return response(LIST_OFFSETS, 7, corr)


def api_versions_unsupported(corr: int) -> bytes:
    """ApiVersions v99: Sluice answers it itself (error 35 in the v0 layout), it never goes upstream."""
    return bytes.fromhex("0012 0063".replace(" ", "")) + corr.to_bytes(4, "big") + bytes.fromhex("0001 74")


def produce(corr: int, acks: int) -> bytes:
    return request(PRODUCE, 9, corr, request_codec(PRODUCE, 9).default().replace(acks=acks))


def fetch(corr: int, version: int = 12, keys: list[PartitionKey] | None = None) -> bytes:
    """A session-less consumer Fetch (client id ``bench-client``) for ``keys`` at offset 0."""
    return request_frame(version, corr, dict.fromkeys(keys if keys is not None else KEYS, 0), LEGACY)


def fetch_response(corr: int, version: int = 12, keys: list[PartitionKey] | None = None, hw: int = 0,
                   session_id: int = 0) -> bytes:
    return response_frame(version, corr, keys if keys is not None else KEYS, hw, session_id)


def view_frame(view: FetchResponseView, corr: int) -> bytes:
    """A Fetch response view as a frame (no size prefix)."""
    buffers, _ = view.encode_frame(corr)
    return b"".join(bytes(b) for b in buffers)[4:]


def batch(value_size: int = 100, base_offset: int = 0) -> bytes:
    return encode_batch(new_batch([Record(offset_delta=0, value=b"x" * value_size)], base_offset=base_offset))


def frames(data: bytes) -> list[bytes]:
    """A byte stream cut into its frames (without size prefixes); every byte must belong to a whole frame."""
    out: list[bytes] = []
    pos = 0
    while pos < len(data):
        size = int.from_bytes(data[pos : pos + 4], "big")
        assert pos + 4 + size <= len(data), "incomplete frame"
        out.append(data[pos + 4 : pos + 4 + size])
        pos += 4 + size
    return out


def correlation_ids(data: bytes, request_side: bool = False) -> list[int]:
    """The correlation ids of the frames in a byte stream (requests: after api key and version)."""
    at = 4 if request_side else 0
    return [int.from_bytes(f[at : at + 4], "big") for f in frames(data)]


def feed(fn: Any, data: bytes, step: int) -> None:
    for i in range(0, len(data), step):
        fn(data[i : i + step])


def rejected_events(logs: Logs) -> list[str]:
    return [e["reason"] for e in logs if e["event"] == "frame_rejected"]


# ------------------------------------------------------------------------------------- pipelining, order


def test_pipelined_requests_in_one_chunk_are_answered_in_order() -> None:
    rig = make_rig()
    conn, port = rig.connect()
    requests = [list_offsets(c) for c in (1, 2, 3)]
    conn.client_data(sized(*requests))
    assert port.take_upstream() == sized(*requests)  # relayed as they are, in order, at once
    assert len(conn.inflight) == 3 and port.client == b""
    answers = [list_offsets_response(c) for c in (1, 2, 3)]
    conn.upstream_data(sized(*answers))
    assert port.take_client() == sized(*answers)
    assert not conn.busy and not conn.closed
    lines = rig.lines()
    assert [(ln["api"], ln["correlation_id"]) for ln in lines] == [("ListOffsets", 1), ("ListOffsets", 2),
                                                                   ("ListOffsets", 3)]
    assert all(ln["bytes_client_to_proxy"] == ln["bytes_proxy_to_upstream"] == len(requests[0]) + 4 for ln in lines)
    assert all(ln["bytes_upstream_to_proxy"] == ln["bytes_proxy_to_client"] == len(answers[0]) + 4 for ln in lines)
    assert all(ln["upstream"] == "broker:9092" and ln["listener"] == "bootstrap" and not ln["decoded"]
               for ln in lines)
    m = rig.metrics
    assert m.total("sluice_requests_total", api="ListOffsets", version="7") == 3
    assert m.total("sluice_bytes_total", direction="client_to_proxy") == len(sized(*requests))
    assert m.total("sluice_bytes_total", direction="proxy_to_upstream") == len(sized(*requests))
    assert m.total("sluice_bytes_total", direction="upstream_to_proxy") == len(sized(*answers))
    assert m.total("sluice_bytes_total", direction="proxy_to_client") == len(sized(*answers))


@pytest.mark.parametrize("step", [1, 2, 5, 13])
def test_requests_and_responses_split_into_small_chunks(step: int) -> None:
    rig = make_rig()
    conn, port = rig.connect()
    requests = sized(*(list_offsets(c) for c in (1, 2, 3)))
    feed(conn.client_data, requests, step)
    assert port.take_upstream() == requests
    # each request goes upstream as soon as its last byte is in, not before
    sends = port.named("send_upstream")
    assert [correlation_ids(data, request_side=True) for _, data in sends] == [[1], [2], [3]]
    answers = sized(*(list_offsets_response(c) for c in (1, 2, 3)))
    feed(conn.upstream_data, answers, step)
    assert port.take_client() == answers  # relayed as it streams, chunk by chunk
    assert [ln["correlation_id"] for ln in rig.lines()] == [1, 2, 3]
    assert not conn.busy


def test_frames_split_anywhere_are_reassembled() -> None:
    requests = sized(list_offsets(1), list_offsets(2))
    answers = sized(list_offsets_response(1), list_offsets_response(2))
    for cut in range(1, len(requests)):
        rig = make_rig()
        conn, port = rig.connect()
        conn.client_data(requests[:cut])
        conn.client_data(requests[cut:])
        assert port.take_upstream() == requests, cut
    for cut in range(1, len(answers)):
        rig = make_rig()
        conn, port = rig.connect()
        conn.client_data(requests)
        conn.upstream_data(answers[:cut])
        conn.upstream_data(answers[cut:])
        assert port.take_client() == answers, cut
        assert [ln["correlation_id"] for ln in rig.lines()] == [1, 2]


def test_a_local_answer_waits_for_the_responses_before_it() -> None:
    rig = make_rig()
    conn, port = rig.connect()
    conn.client_data(sized(list_offsets(1), api_versions_unsupported(2), list_offsets(3)))
    assert correlation_ids(port.take_upstream(), request_side=True) == [1, 3]  # the answer never goes upstream
    assert port.client == b""  # answer 2 waits for response 1
    conn.upstream_data(sized(list_offsets_response(1)))
    got = frames(port.take_client())
    assert [int.from_bytes(f[:4], "big") for f in got] == [1, 2]
    header, body = decode_response(API_VERSIONS, 0, got[1])
    assert header.correlation_id == 2 and body.error_code == 35  # UNSUPPORTED_VERSION
    conn.upstream_data(sized(list_offsets_response(3)))
    assert correlation_ids(port.take_client()) == [3]
    lines = rig.lines()
    assert [ln["correlation_id"] for ln in lines] == [1, 2, 3]
    local = lines[1]
    assert (local["api"], local["bytes_proxy_to_upstream"], local["bytes_upstream_to_proxy"]) == ("ApiVersions", 0, 0)
    assert local["bytes_proxy_to_client"] == len(got[1]) + 4


def test_a_local_answer_with_nothing_before_it_goes_out_at_once() -> None:
    rig = make_rig()
    conn, port = rig.connect()
    conn.client_data(sized(api_versions_unsupported(9)))
    assert correlation_ids(port.take_client()) == [9] and port.upstream == b""
    assert [ln["correlation_id"] for ln in rig.lines()] == [9] and not conn.busy


def test_a_draining_connection_answers_what_it_read_and_reads_nothing_more() -> None:
    """Shutdown (server.stop): a request in flight still gets its response; one the client sends after the drain
    began is never taken (it would keep the connection busy until the drain timeout, then be abandoned)."""
    rig = make_rig()
    conn, port = rig.connect()
    conn.client_data(sized(list_offsets(1)))
    assert correlation_ids(port.take_upstream(), request_side=True) == [1]
    conn.drain()
    assert port.client_paused
    conn.client_data(sized(list_offsets(2)))  # already on its way when reading stopped
    assert port.upstream == b""
    conn.upstream_data(sized(list_offsets_response(1)))
    assert correlation_ids(port.take_client()) == [1] and not conn.busy
    assert port.upstream == b"" and port.client_paused
    conn.close()


def test_requests_before_the_upstream_is_up_are_queued_and_bounded() -> None:
    rig = make_rig(limits=Limits(write_high_water_bytes=50))
    conn, port = rig.connect(ready=False)
    conn.client_data(sized(list_offsets(1), list_offsets(2)))  # 2 x 23 bytes: under the bound
    assert port.upstream == b"" and not port.client_paused
    conn.client_data(sized(list_offsets(3)))  # 69 bytes queued: stop reading the client
    assert port.client_paused and port.named("pause_client") == [("pause_client", None)]
    conn.upstream_ready("broker:9092")
    assert port.named("send_upstream") == [("send_upstream", sized(*(list_offsets(c) for c in (1, 2, 3))))]
    assert not port.client_paused
    conn.upstream_data(sized(*(list_offsets_response(c) for c in (1, 2, 3))))
    assert correlation_ids(port.take_client()) == [1, 2, 3]
    assert {ln["upstream"] for ln in rig.lines()} == {"broker:9092"}


def test_upstream_connect_failure_closes_the_connection() -> None:
    rig = make_rig()
    conn, port = rig.connect(ready=False)
    conn.client_data(sized(list_offsets(1)))
    conn.upstream_failed("connection refused")
    assert conn.closed and port.closed is False and port.client == port.upstream == b""


def test_upstream_lost_with_requests_awaiting_is_counted() -> None:
    rig = make_rig()
    conn, port = rig.connect()
    conn.client_data(sized(list_offsets(1)))
    conn.upstream_lost("reset by peer")
    assert conn.closed and port.closed is False
    assert rig.rejected("upstream_closed") == 1 and rig.lines() == []


def test_upstream_lost_in_the_middle_of_the_last_response_is_counted() -> None:
    """The broker goes away with a response half sent: nothing awaits a response any more, but the client's
    was cut off; that is counted and the client's connection closed."""
    rig = make_rig()
    conn, port = rig.connect()
    conn.client_data(sized(list_offsets(1)))
    answer = sized(list_offsets_response(1))
    conn.upstream_data(answer[:9])
    assert not conn.awaiting
    conn.upstream_lost("reset by peer")
    assert conn.closed and port.take_client() == answer[:9]
    assert rig.rejected("upstream_closed") == 1 and rig.lines() == []


# ------------------------------------------------------------------------------------ partial frames, timeout


def test_an_incomplete_frame_times_out(logs: Logs) -> None:
    rig = make_rig(limits=Limits(request_timeout_s=30.0))
    conn, port = rig.connect()
    data = sized(list_offsets(1))
    conn.client_data(data[:10])
    assert port.named("call_later") == [("call_later", 30.0)]
    rig.advance(29.999)
    assert not conn.closed
    rig.advance(0.001)
    assert conn.closed and port.closed is True  # aborted
    assert rig.rejected("request_timeout") == 1 and rejected_events(logs) == ["request_timeout"]
    assert port.upstream == b"" and rig.timers.pending == []


def test_a_completed_frame_stops_the_clock() -> None:
    rig = make_rig(limits=Limits(request_timeout_s=30.0))
    conn, port = rig.connect()
    data = sized(list_offsets(1))
    conn.client_data(data[:10])
    rig.advance(20)
    conn.client_data(data[10:])
    assert port.take_upstream() == data
    rig.advance(100)
    assert not conn.closed and rig.rejected("request_timeout") == 0


def test_the_timeout_counts_from_the_first_byte_of_the_incomplete_frame() -> None:
    """A client streaming frames back to back on a slow link, each chunk ending one frame and starting the next:
    no frame is incomplete for long, so none times out (the clock restarts with each frame's first byte)."""
    rig = make_rig(limits=Limits(request_timeout_s=30.0))
    conn, port = rig.connect()
    data = sized(*(list_offsets(c) for c in range(1, 9)))
    one = len(data) // 8  # the frames are all this long
    conn.client_data(data[:10])
    pos = 10
    for _ in range(7):
        rig.advance(20)  # each chunk completes a frame and starts the next, 20 s apart
        conn.client_data(data[pos : pos + one])
        pos += one
        assert not conn.closed, rig.clock.now
    assert not conn.closed and rig.rejected("request_timeout") == 0
    conn.client_data(data[pos:])
    assert correlation_ids(port.take_upstream(), request_side=True) == list(range(1, 9))


def test_time_not_reading_the_client_does_not_count() -> None:
    rig = make_rig(limits=Limits(request_timeout_s=30.0))
    conn, port = rig.connect()
    data = sized(list_offsets(1))
    conn.client_data(data[:10])
    rig.advance(5)
    conn.upstream_write_paused()  # Sluice stops reading the client
    assert port.client_paused
    rig.advance(35)  # the timer fires meanwhile: not the client's fault
    assert not conn.closed
    conn.upstream_write_resumed()
    assert not port.client_paused
    rig.advance(29.9)  # counted afresh from when reading resumed
    assert not conn.closed
    rig.advance(0.1)
    assert conn.closed and rig.rejected("request_timeout") == 1


# ---------------------------------------------------------------------------------------------- bad frames


BAD_FRAMES = {
    "too_large": (1001).to_bytes(4, "big"),  # refused on the length alone, before any body byte
    "negative_length": (-1).to_bytes(4, "big", signed=True),
    "unknown_api": sized(bytes.fromhex("03e8 0000 00000009 ffff".replace(" ", ""))),
    "short_header": sized(bytes.fromhex("0003")),
    "client_id_beyond_frame": sized(bytes.fromhex("0003 000c 00000009 0009 6162".replace(" ", ""))),
    "unsupported_version": sized(bytes.fromhex("0003 0063 00000009 ffff".replace(" ", ""))),  # Metadata v99
}
REASONS = {"too_large": "too_large", "negative_length": "malformed", "unknown_api": "unknown_api",
           "short_header": "malformed", "client_id_beyond_frame": "malformed",
           "unsupported_version": "unsupported_version"}


@pytest.mark.parametrize("case", sorted(BAD_FRAMES))
def test_a_bad_frame_closes_the_connection(case: str, logs: Logs) -> None:
    rig = make_rig(limits=Limits(max_frame_bytes=1000))
    conn, port = rig.connect()
    conn.client_data(sized(list_offsets(1)))
    conn.upstream_data(sized(list_offsets_response(1)))
    assert port.take_upstream() == sized(list_offsets(1))
    # a good request and the bad frame in one chunk: the good one still goes upstream, nothing after it
    conn.client_data(sized(list_offsets(2)) + BAD_FRAMES[case] + sized(list_offsets(3)))
    assert conn.closed and port.closed is True
    assert port.take_upstream() == sized(list_offsets(2))
    assert port.take_client() == sized(list_offsets_response(1))  # what was sent stays; nothing more
    reason = REASONS[case]
    assert rig.rejected(reason) == 1 and rejected_events(logs) == [reason]
    assert rig.metrics.total("sluice_frames_rejected_total") == 1
    conn.upstream_data(sized(list_offsets_response(2)))  # after the close: ignored
    conn.client_data(sized(list_offsets(4)))
    assert port.client == port.upstream == b""
    assert [ln["correlation_id"] for ln in rig.lines()] == [1]


UPSTREAM_ERRORS = {
    "unsolicited": (None, sized(list_offsets_response(2))),
    "correlation_mismatch": (2, sized(list_offsets_response(3))),
    "too_large": (2, (1001).to_bytes(4, "big") + (2).to_bytes(4, "big")),
    "shorter_than_a_correlation_id": (2, (2).to_bytes(4, "big") + (2).to_bytes(4, "big")),
}


@pytest.mark.parametrize("case", sorted(UPSTREAM_ERRORS))
def test_an_upstream_protocol_error_closes_the_connection(case: str, logs: Logs) -> None:
    rig = make_rig(limits=Limits(max_frame_bytes=1000))
    conn, port = rig.connect()
    conn.client_data(sized(list_offsets(1)))
    conn.upstream_data(sized(list_offsets_response(1)))
    corr, data = UPSTREAM_ERRORS[case]
    if corr is not None:
        conn.client_data(sized(list_offsets(corr)))
    port.take_client()
    conn.upstream_data(data)
    assert conn.closed and port.closed is True and port.client == b""
    assert rig.rejected("malformed") == 1
    assert [e["event"] for e in logs] == ["upstream_protocol_error"]
    assert [ln["correlation_id"] for ln in rig.lines()] == [1]


def test_an_undecodable_collected_response_closes_the_connection() -> None:
    """A response the policies must read (ApiVersions: capped) that Sluice cannot decode is not relayed."""
    rig = make_rig()
    conn, port = rig.connect()
    conn.client_data(sized(request(API_VERSIONS, 3, 1)))
    conn.upstream_data(sized((1).to_bytes(4, "big") + b"\x00\x07"))
    assert conn.closed and port.client == b"" and rig.rejected("malformed") == 1


def test_nothing_is_read_after_a_response_that_closed_the_connection(logs: Logs) -> None:
    """An empty collected response (correlation id only) that cannot be decoded closes the connection while the
    rest of the chunk is still unread: the rest is dropped, not handed on (no second count, no exception)."""
    rig = make_rig()
    conn, port = rig.connect()
    conn.client_data(sized(request(API_VERSIONS, 3, 1), list_offsets(2)))
    conn.upstream_data(sized((1).to_bytes(4, "big"), list_offsets_response(2)))
    assert conn.closed and port.client == b""
    assert rig.rejected("malformed") == 1 and [e["event"] for e in logs] == ["upstream_protocol_error"]
    assert rig.lines() == []


# ------------------------------------------------------------------------------------------- produce acks=0


def test_produce_with_acks_0_awaits_nothing() -> None:
    rig = make_rig()
    conn, port = rig.connect()
    conn.client_data(sized(list_offsets(1), produce(2, acks=0), list_offsets(3)))
    assert correlation_ids(port.take_upstream(), request_side=True) == [1, 2, 3]
    lines = rig.lines()  # the acks=0 produce is complete as soon as it went upstream
    assert [(ln["api"], ln["correlation_id"]) for ln in lines] == [("Produce", 2)]
    assert lines[0]["bytes_upstream_to_proxy"] == lines[0]["bytes_proxy_to_client"] == 0
    assert lines[0]["bytes_proxy_to_upstream"] == len(produce(2, acks=0)) + 4
    assert [ex.header.correlation_id for ex in conn.awaiting] == [1, 3]
    conn.upstream_data(sized(list_offsets_response(1), list_offsets_response(3)))
    assert correlation_ids(port.take_client()) == [1, 3]
    assert [ln["correlation_id"] for ln in rig.lines()] == [2, 1, 3] and not conn.busy


def test_produce_with_acks_1_awaits_its_response() -> None:
    rig = make_rig()
    conn = rig.connect()[0]
    conn.client_data(sized(produce(1, acks=1)))
    assert rig.lines() == [] and [ex.header.correlation_id for ex in conn.awaiting] == [1]


# -------------------------------------------- Produce v10+ responses: unread without NodeEndpoints (KIP-951)


def produce_v10(corr: int) -> bytes:
    return request(PRODUCE, 10, corr, request_codec(PRODUCE, 10).default().replace(acks=1))


def produce_v10_response(corr: int, error: int = 0, endpoints: tuple[Message, ...] = ()) -> bytes:
    partition = Message(index=0, error_code=error, base_offset=7, log_append_time_ms=-1, log_start_offset=0,
                        record_errors=[], error_message=None)
    return response(PRODUCE, 10, corr, response_codec(PRODUCE, 10).default().replace(
        responses=[Message(name="t", partition_responses=[partition])], node_endpoints=list(endpoints)))


def test_a_produce_response_without_node_endpoints_is_relayed_unread() -> None:
    """No top-level tagged field (KIP-951's NodeEndpoints come only after a leader moved): the bytes as the broker
    sent them, an error included, logged as not decoded."""
    rig = make_rig()
    conn, port = rig.connect()
    conn.client_data(sized(produce_v10(1), produce_v10(2)))
    frames = [produce_v10_response(1), produce_v10_response(2, error=6)]  # 6: NOT_LEADER_OR_FOLLOWER
    conn.upstream_data(sized(*frames))
    assert port.take_client() == sized(*frames)
    assert [(ln["correlation_id"], ln["decoded"]) for ln in rig.lines()] == [(1, False), (2, False)]
    assert not conn.busy


def test_a_produce_response_with_node_endpoints_is_read_and_rewritten() -> None:
    rig = make_rig()
    conn, port = rig.connect()
    conn.client_data(sized(produce_v10(1)))
    conn.upstream_data(sized(produce_v10_response(
        1, error=6, endpoints=(Message(node_id=2, host="b2", port=9092, rack=None),))))
    _, body = decode_response(PRODUCE, 10, port.take_client()[4:])
    assert [(e.node_id, e.host != "b2") for e in body.node_endpoints] == [(2, True)]
    assert [(ln["decoded"], ln["error_codes"]) for ln in rig.lines()] == [(True, [6])]


def test_a_produce_response_split_across_reads_is_collected() -> None:
    """Not whole in one read: collected as before (the skim needs the whole body)."""
    rig = make_rig()
    conn, port = rig.connect()
    conn.client_data(sized(produce_v10(1)))
    wire = sized(produce_v10_response(1))
    conn.upstream_data(wire[:12])
    conn.upstream_data(wire[12:])
    assert port.take_client() == wire
    assert [(ln["decoded"], ln["error_codes"]) for ln in rig.lines()] == [(True, [])]


class _ReadsProduce(Policy):
    """A second policy reading Produce responses (as client quotas do)."""

    name = "reads-produce"
    apis = reads(PRODUCE)

    def on_request(self, ex: Exchange, conn: Any) -> Any:
        ex.collect = True
        return "read"

    def on_response(self, ex: Exchange, response: Any, conn: Any, state: Any) -> None:
        self.seen = response.body.responses[0].partition_responses[0].base_offset


def test_a_produce_response_another_policy_reads_is_collected() -> None:
    rig = make_rig()
    reader = _ReadsProduce()
    addresses = [p for p in rig.proxy.chain.policies if p.name == "addresses"]
    rig.proxy.chain = Chain([*addresses, reader], rig.metrics, rig.names, rig.access_log)
    conn, port = rig.connect()
    conn.client_data(sized(produce_v10(1)))
    conn.upstream_data(sized(produce_v10_response(1)))
    assert port.take_client() == sized(produce_v10_response(1)) and reader.seen == 7
    assert [ln["decoded"] for ln in rig.lines()] == [True]


# ------------------------------------------------- requests no policy reads: relayed without an Exchange


class _Counts(Policy):
    """Declares Produce and ListOffsets, leaves them alone or not as told (Policy.unread), counts its calls."""

    name = "counts"

    def __init__(self, leaves: bool) -> None:
        self.apis = reads(PRODUCE, LIST_OFFSETS)
        self.leaves = leaves
        self.requests = 0

    def unread(self, api_key: int, version: int) -> bool:
        return self.leaves

    def on_request(self, ex: Exchange, conn: Any) -> Any:
        self.requests += 1
        return None


@pytest.mark.parametrize("leaves", [True, False])
def test_a_request_every_policy_leaves_alone_reaches_none_of_them(leaves: bool) -> None:
    """Relayed as it came, answered as the broker answered, counted and logged alike either way; only a policy
    that does not leave the API alone is called."""
    rig = make_rig()
    counts = _Counts(leaves)
    rig.proxy.chain = Chain([counts], rig.metrics, rig.names, rig.access_log)
    conn, port = rig.connect()
    requests = sized(produce_v10(1), list_offsets(2))
    conn.client_data(requests)
    assert port.take_upstream() == requests
    answers = sized(produce_v10_response(1), list_offsets_response(2))
    conn.upstream_data(answers)
    assert port.take_client() == answers and not conn.busy
    assert counts.requests == (0 if leaves else 2)
    assert [(ln["api"], ln["correlation_id"], ln["decoded"]) for ln in rig.lines()] == [
        ("Produce", 1, False), ("ListOffsets", 2, False)]
    assert rig.metrics.total("sluice_requests_total", api="Produce", version="10") == 1


def metadata_response(corr: int) -> bytes:
    return response(METADATA, 12, corr, response_codec(METADATA, 12).default().replace(
        brokers=[Message(node_id=1, host="10.0.0.1", port=9092, rack=None)]))


def test_relayed_and_read_requests_pipelined_keep_their_order() -> None:
    """Produce (relayed), Metadata (read: its brokers rewritten), Produce (relayed, but its response carries
    NodeEndpoints: read after all) and ListOffsets (relayed) in one read each way: every answer in order, every
    broker address rewritten."""
    rig = make_rig()
    conn, port = rig.connect()
    conn.client_data(sized(produce_v10(1), request(METADATA, 12, 2), produce_v10(3), list_offsets(4)))
    assert correlation_ids(port.take_upstream(), request_side=True) == [1, 2, 3, 4]
    moved = produce_v10_response(3, error=6, endpoints=(Message(node_id=2, host="b2", port=9092, rack=None),))
    conn.upstream_data(sized(produce_v10_response(1), metadata_response(2), moved, list_offsets_response(4)))
    out = frames(port.take_client())
    assert [int.from_bytes(f[:4], "big") for f in out] == [1, 2, 3, 4]
    assert out[0] == produce_v10_response(1) and out[3] == list_offsets_response(4)
    assert [b.host for b in decode_response(METADATA, 12, out[1])[1].brokers] == ["proxy.example"]
    assert [e.host for e in decode_response(PRODUCE, 10, out[2])[1].node_endpoints] == ["proxy.example"]
    assert [ln["decoded"] for ln in rig.lines()] == [False, True, True, False] and not conn.busy


def test_a_metadata_response_is_answered_alike_on_the_shortest_path_and_when_split_across_reads(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A Metadata response whole in one read is rewritten bytes in, bytes out (Relay.rewrite: no Exchange, no
    policy hook), and the same response again is answered from the memo; one split across reads is read as an
    Exchange after all. Each client gets the same bytes, its own correlation id, the brokers' addresses Sluice's."""
    rig = make_rig()
    read_by_the_chain: list[int] = []
    on_response = Chain.on_response

    def spied(chain: Chain, conn: Any, ex: Exchange, frame: Any) -> None:
        read_by_the_chain.append(ex.header.correlation_id)
        on_response(chain, conn, ex, frame)

    monkeypatch.setattr(Chain, "on_response", spied)
    conn, port = rig.connect()
    answers = []
    for corr, split in ((2, False), (3, False), (4, True)):  # whole, whole again (the memo's), split in two reads
        conn.client_data(sized(request(METADATA, 12, corr)))
        port.take_upstream()
        wire = sized(metadata_response(corr))
        for part in (wire[:7], wire[7:]) if split else (wire,):
            conn.upstream_data(part)
        (answer,) = frames(port.take_client())
        assert int.from_bytes(answer[:4], "big") == corr
        answers.append(answer[4:])
    assert read_by_the_chain == [4]  # only the split one
    assert answers[0] == answers[1] == answers[2]
    brokers = decode_response(METADATA, 12, metadata_response(2))[1].brokers
    rewritten = decode_response(METADATA, 12, b"\0\0\0\2" + answers[0])[1].brokers
    assert [(b.host, b.port) for b in brokers] == [("10.0.0.1", 9092)]
    assert [(b.node_id, b.host, b.port) for b in rewritten] == [(1, "proxy.example", rig.proxy.router.port_for(1))]
    assert rig.proxy.router.upstream[1] == ("10.0.0.1", 9092)
    # the access log and the metrics tell the same story on both paths: read (not relayed as bytes), rewritten
    assert [ln["decoded"] for ln in rig.lines()] == [True, True, True] and not conn.busy
    assert rig.metrics.total("sluice_responses_rewritten_total", api="Metadata") == 3


def test_a_policy_switched_on_at_run_time_reads_the_next_requests() -> None:
    """No quota: a Produce passes no policy; once an entry selects its client, the next one is the quota's."""
    rig = make_rig()
    conn, port = rig.connect()
    conn.client_data(sized(produce_v10(1)))
    conn.upstream_data(sized(produce_v10_response(1)))
    settings = rig.proxy.settings.with_overrides({"quota.entries": [{"client_id": "c",
                                                                     "produce_rate_bytes": 1 << 30}]})
    rig.proxy.apply_dynamic(settings)
    conn.client_data(sized(produce_v10(2)))
    conn.upstream_data(sized(produce_v10_response(2)))
    assert port.take_client() == sized(produce_v10_response(1), produce_v10_response(2))
    assert rig.metrics.total("sluice_quota_requests_total", entry="entries[0]", api="Produce") == 1
    assert [ln.get("quota_throttle_time_ms") for ln in rig.lines()] == [None, 0]


# ---------------------------------------------------------------------------------------------- memory waits


BUDGET = 1000
MEMORY = {"size_limit.budgets": [{"client_id": CLIENT, "fetch_max_bytes": BUDGET}],
          "size_limit.global_max_bytes": BUDGET}


def test_a_fetch_waits_for_memory_another_connection_holds() -> None:
    rig = make_rig(MEMORY)
    a, port_a = rig.connect()
    b, port_b = rig.connect()
    a.client_data(sized(fetch(1)))
    assert correlation_ids(port_a.take_upstream(), request_side=True) == [1]
    assert rig.memory.held == BUDGET  # the clamped max_bytes, reserved before it went upstream
    b.client_data(sized(fetch(1)))
    assert port_b.upstream == b"" and port_b.client_paused and rig.memory.waiting == 1
    assert rig.metrics.total("sluice_response_memory_waits_total") == 1
    answer = sized(fetch_response(1))
    a.upstream_data(answer[:20])  # the response's real size replaces the reservation...
    assert rig.memory.held == len(answer) - 4 and port_b.upstream == b""  # ...still no room for b's
    a.upstream_data(answer[20:])
    assert correlation_ids(port_a.take_client()) == [1]
    # a's memory is released: b's fetch goes upstream and b is read again
    assert correlation_ids(port_b.take_upstream(), request_side=True) == [1] and not port_b.client_paused
    assert rig.memory.held == BUDGET and rig.memory.waiting == 0
    b.upstream_data(answer)
    assert correlation_ids(port_b.take_client()) == [1] and rig.memory.held == 0
    assert rig.metrics.total("sluice_response_bytes_held") == 0


def test_requests_behind_a_memory_wait_keep_their_order() -> None:
    rig = make_rig(MEMORY)
    a = rig.connect()[0]
    b, port_b = rig.connect()
    a.client_data(sized(fetch(1)))
    b.client_data(sized(fetch(1), list_offsets(2), api_versions_unsupported(3), list_offsets(4)))
    assert port_b.upstream == b"" and port_b.client == b"" and b.busy
    a.upstream_data(sized(fetch_response(1)))
    assert correlation_ids(port_b.take_upstream(), request_side=True) == [1, 2, 4]
    b.upstream_data(sized(fetch_response(1), list_offsets_response(2), list_offsets_response(4)))
    assert correlation_ids(port_b.take_client()) == [1, 2, 3, 4]
    assert rig.memory.held == 0 and not b.busy


def test_closing_while_waiting_for_memory_gives_the_reservation_back() -> None:
    rig = make_rig(MEMORY)
    a = rig.connect()[0]
    b, port_b = rig.connect()
    c, port_c = rig.connect()
    a.client_data(sized(fetch(1)))
    b.client_data(sized(fetch(1)))
    c.client_data(sized(fetch(1)))
    assert rig.memory.waiting == 2
    port_b.gone()
    b.client_lost()  # b leaves the queue...
    assert rig.memory.waiting == 1 and port_b.closed is None  # (the server closes its transports itself)
    a.upstream_data(sized(fetch_response(1)))
    assert port_b.upstream == b""  # ...and is never granted anything
    assert correlation_ids(port_c.take_upstream(), request_side=True) == [1]  # c is next
    c.upstream_data(sized(fetch_response(1)))
    assert rig.memory.held == 0 and rig.memory.waiting == 0


def test_closing_while_holding_memory_releases_it() -> None:
    rig = make_rig(MEMORY)
    a, port_a = rig.connect()
    b, port_b = rig.connect()
    a.client_data(sized(fetch(1)))
    b.client_data(sized(fetch(1)))
    a.upstream_data(sized(fetch_response(1))[:30])  # a response in the middle of being streamed
    sent = bytes(port_a.client)
    port_a.gone()
    a.client_lost()
    assert correlation_ids(port_b.take_upstream(), request_side=True) == [1]  # b got a's memory
    assert rig.memory.held == BUDGET
    a.upstream_data(sized(fetch_response(1))[30:])  # the rest of a's response: dropped
    b.upstream_data(sized(fetch_response(1)))
    assert rig.memory.held == 0 and port_a.client == sent


def test_memory_is_released_once_when_the_client_drains_after_the_close() -> None:
    """A transport closed gracefully still flushes its buffer and may call resume_writing after the close:
    memory whose release waited for that drain was already given back by the close."""
    rig = make_rig(MEMORY)
    conn = rig.connect()[0]
    conn.client_data(sized(fetch(1)))
    conn.client_write_paused()
    conn.upstream_data(sized(fetch_response(1)))
    assert rig.memory.held == len(fetch_response(1))  # written, but the client has not taken it yet
    conn.close()
    assert rig.memory.held == 0
    conn.client_write_resumed()
    assert rig.memory.held == 0


# ------------------------------------------------------------------- collected responses read into their buffer


#: a partition cap above each partition's records (~200 KB) but below a large response's size: the size limit
#: cannot stream it (SizeLimit.stream_fetch), so it is collected, and nothing is cut from it
UNBOUND = {"size_limit.budgets": [{"client_id": CLIENT, "fetch_max_bytes": 1 << 24, "partition_max_bytes": 300_000}]}


def large_fetch_response(corr: int) -> bytes:
    """A collected Fetch response (a size limit reads it) of ~600 KB: three partitions of four 50 KB batches."""
    records = b"".join(batch(50_000, base_offset=i) for i in range(4))
    return response_frame(12, corr, KEYS, 4, 0, records)


@pytest.mark.parametrize("read", [1000, 65536, 1 << 20])
def test_a_large_collected_response_is_read_into_its_buffer(read: int) -> None:
    """Reads of ``read`` bytes: once more than DIRECT_READ_MIN of the collected response is still to come, the core
    asks the port to read straight into its buffer, and back once the response is whole. The reads never take
    bytes of the next response (relayed as it came), and every byte reaches the client once, in order."""
    rig = make_rig(UNBOUND)
    conn, port = rig.connect()
    conn.client_data(sized(fetch(1), list_offsets(2)))
    wire = sized(large_fetch_response(1), list_offsets_response(2))
    for i in range(0, len(wire), read):
        port.deliver(conn, wire[i : i + read])
    assert port.take_client() == wire
    switches = [on for _, on in port.named("read_upstream_into")]
    assert switches == ([] if read > len(wire) else [True, False])
    assert [ln["correlation_id"] for ln in rig.lines()] == [1, 2]
    assert rig.metrics.total("sluice_bytes_total", direction="upstream_to_proxy") == len(wire)
    assert rig.memory.held == 0


def test_responses_split_anywhere_read_into_their_buffers() -> None:
    """Two large collected responses back to back, cut at every kind of place: each read ends where the chunk
    does, whichever of the two ways the core takes it."""
    rig = make_rig(UNBOUND)
    conn, port = rig.connect()
    conn.client_data(sized(fetch(1), fetch(2)))
    wire = sized(large_fetch_response(1), large_fetch_response(2))
    cuts = [0, 3, 8, 70_000, 70_001, len(wire) // 2 - 1, len(wire) // 2 + 6, len(wire) - 70_000, len(wire)]
    for a, b in itertools.pairwise(cuts):
        port.deliver(conn, wire[a:b])
    assert port.take_client() == wire
    assert [on for _, on in port.named("read_upstream_into")] == [True, False, True, False]
    assert [ln["correlation_id"] for ln in rig.lines()] == [1, 2]


def test_a_port_that_keeps_handing_over_reads_is_served_too() -> None:
    """A port may ignore read_upstream_into and go on calling upstream_data: the same bytes, the same order."""
    rig = make_rig(UNBOUND)
    conn, port = rig.connect()
    conn.client_data(sized(fetch(1), list_offsets(2)))
    wire = sized(large_fetch_response(1), list_offsets_response(2))
    feed(conn.upstream_data, wire, 10_000)
    assert port.take_client() == wire
    assert [on for _, on in port.named("read_upstream_into")] == [True, False]
    assert [ln["correlation_id"] for ln in rig.lines()] == [1, 2]


def test_the_client_gone_while_a_response_is_read_into_its_buffer() -> None:
    rig = make_rig(UNBOUND)
    conn, port = rig.connect()
    conn.client_data(sized(fetch(1)))
    wire = sized(large_fetch_response(1))
    port.deliver(conn, wire[:1000])
    assert port.reading_into
    port.gone()
    conn.client_lost()
    port.deliver(conn, wire[1000:])  # the transport may still hand over what it read: dropped
    assert port.client == b"" and rig.memory.held == 0 and rig.lines() == []


# ------------------------------------------------------------------------------ a collected response's decoding


def test_a_collected_response_is_decoded_on_the_next_turn_after_other_connections_reads() -> None:
    """A collected response is decoded on the event loop's next turn (Port.defer): a response another connection
    has already read (a producer's, woken by the same append) is written first. What the connection read after
    the collected response waits for it: every response, in order, once."""
    rig = make_rig(UNBOUND, put_off=True)
    consumer, port_c = rig.connect()
    producer, port_p = rig.connect()
    consumer.client_data(sized(fetch(1), list_offsets(2)))
    producer.client_data(sized(list_offsets(7)))
    wire = sized(large_fetch_response(1), list_offsets_response(2))
    consumer.upstream_data(wire)
    assert port_c.client == b"" and consumer.busy
    producer.upstream_data(sized(list_offsets_response(7)))
    assert correlation_ids(port_p.take_client()) == [7]  # not behind the consumer's decoding
    rig.turn()
    assert port_c.take_client() == wire
    assert port_c.named("defer", "pause_upstream") == [("defer", None)]  # the turn's reads wait, unpaused
    assert [ln["correlation_id"] for ln in rig.lines()] == [7, 1, 2]
    assert rig.metrics.total("sluice_bytes_total", direction="upstream_to_proxy") == len(wire) + len(
        sized(list_offsets_response(7)))
    assert rig.memory.held == 0 and not consumer.busy


def test_collected_responses_back_to_back_are_decoded_one_turn_each_in_order() -> None:
    """Two collected responses and a relayed one, read in two pieces before the first is decoded: each collected
    one waits for a turn of its own, and they reach the client as they came."""
    rig = make_rig(UNBOUND, put_off=True)
    conn, port = rig.connect()
    conn.client_data(sized(fetch(1), fetch(2), list_offsets(3)))
    wire = sized(large_fetch_response(1), large_fetch_response(2), list_offsets_response(3))
    cut = len(sized(large_fetch_response(1))) + 10
    conn.upstream_data(wire[:cut])
    conn.upstream_data(wire[cut:])  # read in the same turn: kept for after the decode
    assert port.client == b"" and len(port.deferred) == 1
    port.deferred.pop(0)()
    assert correlation_ids(port.take_client()) == [1] and len(port.deferred) == 1
    port.deferred.pop(0)()
    assert port.take_client() == wire[len(sized(large_fetch_response(1))) :] and not port.deferred
    assert [ln["correlation_id"] for ln in rig.lines()] == [1, 2, 3]


def test_a_full_client_pauses_the_upstream_across_a_put_off_decode() -> None:
    """A client that reads slower than the broker sends stops the upstream's reads, decoding put off or not; they
    resume when it drains, and the put-off response still goes out on its turn."""
    rig = make_rig(UNBOUND, put_off=True)
    conn, port = rig.connect()
    conn.client_data(sized(fetch(1), list_offsets(2)))
    conn.upstream_data(sized(large_fetch_response(1)))
    conn.client_write_paused()
    assert port.upstream_paused
    rig.turn()
    assert correlation_ids(port.take_client()) == [1] and port.upstream_paused
    conn.client_write_resumed()
    assert not port.upstream_paused
    conn.upstream_data(sized(list_offsets_response(2)))
    assert correlation_ids(port.take_client()) == [2]


def test_the_client_gone_before_a_put_off_decode() -> None:
    """Nothing is written for a client that went away, and the response's memory goes back."""
    rig = make_rig(UNBOUND, put_off=True)
    conn, port = rig.connect()
    conn.client_data(sized(fetch(1)))
    conn.upstream_data(sized(large_fetch_response(1), list_offsets_response(9)))
    port.gone()
    conn.client_lost()
    rig.turn()
    assert port.client == b"" and rig.memory.held == 0 and rig.lines() == []


def test_the_upstream_gone_after_a_collected_response_still_delivers_it(logs: Logs) -> None:
    """The broker closed its connection after sending a whole response whose decoding was put off: the client
    gets that response, then the connection closes; nothing is counted as cut off."""
    rig = make_rig(UNBOUND, put_off=True)
    conn, port = rig.connect()
    conn.client_data(sized(fetch(1)))
    conn.upstream_data(sized(large_fetch_response(1)))
    conn.upstream_lost(None)
    assert correlation_ids(port.take_client()) == [1] and conn.closed
    assert [ln["correlation_id"] for ln in rig.lines()] == [1]
    assert not [e for e in logs if e["event"] == "upstream_closed"]
    rig.turn()
    assert port.client == b"" and rig.memory.held == 0


def test_an_undecodable_put_off_response_closes_the_connection_on_its_turn(logs: Logs) -> None:
    rig = make_rig(put_off=True)
    conn, port = rig.connect()
    conn.client_data(sized(request(API_VERSIONS, 3, 1), list_offsets(2)))
    conn.upstream_data(sized((1).to_bytes(4, "big") + b"\x00\x07", list_offsets_response(2)))
    assert not conn.closed
    rig.turn()
    assert conn.closed and port.client == b"" and rig.rejected("malformed") == 1
    assert [e["event"] for e in logs] == ["upstream_protocol_error"] and rig.lines() == []


def test_a_bug_in_a_put_off_decode_closes_the_connection_and_is_raised(monkeypatch: pytest.MonkeyPatch) -> None:
    """An error of Sluice's own while the chain reads a put-off response (no policy's: the chain's) closes that
    connection, as one raised in a read's callback closes its transport, and reaches the loop, which logs it: the
    client reconnects rather than waiting for its request timeout. The other connections carry on."""
    rig = make_rig(UNBOUND, put_off=True)
    conn, port = rig.connect()
    other, other_port = rig.connect()
    conn.client_data(sized(fetch(1), list_offsets(2)))
    conn.upstream_data(sized(large_fetch_response(1), list_offsets_response(2)))

    def broken(*args: Any) -> None:
        raise RuntimeError("a bug")

    monkeypatch.setattr(rig.proxy.chain, "on_response", broken)
    with pytest.raises(RuntimeError, match="a bug"):
        rig.turn()
    assert conn.closed is True and port.client == b"" and rig.memory.held == 0
    other.client_data(sized(list_offsets(5)))
    other.upstream_data(sized(list_offsets_response(5)))
    assert correlation_ids(other_port.take_client()) == [5]


# ---------------------------------------------------------------------------------------- topic-name waits


THROTTLED = {"throttle.leader_rate_bytes": 1000, "throttle.topics": [{"topic": "t"}]}


def test_a_fetch_waits_for_the_names_of_its_topic_ids() -> None:
    rig = make_rig(THROTTLED)
    conn, port = rig.connect()
    request_ = fetch(1, version=13, keys=[(TID, 0)])
    conn.client_data(sized(request_, list_offsets(2)))
    assert port.upstream == b"" and port.client_paused and conn.busy  # waits, and so does what follows
    assert rig.names.take() == {TID}  # Sluice looks the id up itself
    rig.names.settle({TID: "t"})
    assert port.take_upstream() == sized(request_, list_offsets(2))  # untouched: no consumer throttle matches
    assert not port.client_paused
    conn.upstream_data(sized(fetch_response(1, version=13, keys=[(TID, 0)]), list_offsets_response(2)))
    assert correlation_ids(port.take_client()) == [1, 2]
    assert rig.names.get(TID) == "t"


def test_a_bug_after_a_names_wait_closes_that_connection_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """An error of Sluice's own as a connection goes on after its wait for names (called back by the lookup every
    connection shares) closes that connection and reaches the loop on a turn of its own: the lookup's other
    waiters are still called, and the lookup itself does not fail."""
    rig = make_rig(THROTTLED)
    conn, port = rig.connect()
    other, other_port = rig.connect()
    request_ = fetch(1, version=13, keys=[(TID, 0)])
    conn.client_data(sized(request_))
    other.client_data(sized(request_))
    assert rig.names.take() == {TID}
    on_request = rig.proxy.chain.on_request

    def broken(policies: Any, ex: Any) -> None:
        if policies is conn.policies:
            raise RuntimeError("a bug")
        on_request(policies, ex)

    monkeypatch.setattr(rig.proxy.chain, "on_request", broken)
    rig.names.settle({TID: "t"})
    assert conn.closed is True and port.upstream == b""
    assert other_port.take_upstream() == sized(request_)
    with pytest.raises(RuntimeError, match="a bug"):
        rig.advance(0)
    other.upstream_data(sized(fetch_response(1, version=13, keys=[(TID, 0)])))
    assert correlation_ids(other_port.take_client()) == [1]


def test_an_id_the_cluster_does_not_know_ends_the_wait_too() -> None:
    rig = make_rig(THROTTLED)
    conn, port = rig.connect()
    conn.client_data(sized(fetch(1, version=13, keys=[(TID, 0)])))
    rig.names.settle({}, rig.names.take())
    assert correlation_ids(port.take_upstream(), request_side=True) == [1] and not port.client_paused


def test_requests_behind_a_names_wait_naming_the_same_ids_do_not_wait_again() -> None:
    rig = make_rig(THROTTLED)
    conn, port = rig.connect()
    conn.client_data(sized(fetch(1, version=13, keys=[(TID, 0)]), fetch(2, version=13, keys=[(TID, 1)])))
    assert rig.names.take() == {TID}
    rig.names.settle({TID: "t"})
    assert correlation_ids(port.take_upstream(), request_side=True) == [1, 2]
    assert not port.client_paused and rig.names.take() == set()  # one lookup, not one per request


def test_closing_while_waiting_for_names_cancels_the_wait() -> None:
    rig = make_rig(THROTTLED)
    conn, port = rig.connect()
    other, other_port = rig.connect()
    conn.client_data(sized(fetch(1, version=13, keys=[(TID, 0)])))
    other.client_data(sized(fetch(1, version=13, keys=[(TID, 0)])))
    ids = rig.names.take()
    assert rig.names.waiting == 2
    port.gone()
    conn.client_lost()
    assert rig.names.waiting == 1  # its wait is forgotten (only the other connection's is left)
    rig.names.settle({TID: "t"}, ())
    assert port.upstream == b"" and not conn.busy
    assert correlation_ids(other_port.take_upstream(), request_side=True) == [1]  # the other one goes on
    assert ids == {TID}


def test_closing_while_a_share_fetch_waits_for_names_cancels_the_lookup_wait() -> None:
    """ShareFetch's throttle plan waits for names itself (a request's ``pending``): a connection closed in that
    wait leaves no waiter behind in the lookup (found by the core fuzz target)."""
    rig = make_rig({**THROTTLED, "throttle.consumers": [{"client_id": "*"}]})
    conn, port = rig.connect()
    body = request_codec(SHARE_FETCH, 1).default().replace(
        topics=[Message(topic_id=TID, partitions=[Message(partition_index=0, acknowledgement_batches=[])])])
    conn.client_data(sized(request(SHARE_FETCH, 1, 1, body)))
    assert port.upstream == b"" and conn.busy and rig.names.waiting == 1
    port.gone()
    conn.client_lost()
    assert rig.names.waiting == 0


# ------------------------------------------------------------------------------ closing mid-response


def test_the_client_gone_mid_relayed_response() -> None:
    rig = make_rig()
    conn, port = rig.connect()
    conn.client_data(sized(list_offsets(1), list_offsets(2)))
    answers = sized(list_offsets_response(1), list_offsets_response(2))
    conn.upstream_data(answers[:9])
    assert port.take_client() == answers[:9]
    port.gone()
    conn.client_lost()
    conn.upstream_data(answers[9:])
    conn.upstream_lost(None)
    assert port.client == b"" and conn.closed and port.closed is None
    assert rig.lines() == [] and rig.metrics.total("sluice_requests_total") == 0
    assert rig.rejected("upstream_closed") == 0  # the client left first: nothing was lost on Sluice's side


def test_a_fetch_v16_streams_through_chunk_by_chunk() -> None:
    rig = make_rig()
    conn, port = rig.connect()
    conn.client_data(sized(fetch(1, version=16, keys=[(TID, 0), (TID, 1)])))
    answer = sized(fetch_response(1, version=16, keys=[(TID, 0), (TID, 1)], hw=7))
    for i, byte in enumerate(answer):
        conn.upstream_data(bytes([byte]))
        if i == 20:
            assert port.client != b""  # streamed, not collected whole
    assert port.take_client() == answer and not conn.busy
    assert rig.lines()[0]["bytes_proxy_to_client"] == len(answer)


def test_a_fetch_v16_with_node_endpoints_streams_through_rewritten() -> None:
    """No policy but the address rewriting reads a Fetch v16 here: relayed without an Exchange, its response walked
    as it streams and its NodeEndpoints (KIP-951) rewritten in place, its size unchanged."""
    rig = make_rig()
    conn, port = rig.connect()
    conn.client_data(sized(fetch(1, version=16, keys=[(TID, 0)])))
    view = FetchResponseView(16, topics=[FetchTopic(topic_id=TID, partitions=[
        FetchPartition(0, 0, 7, 7, 0, None, -1, batch(), None)])],
        node_endpoints=[NodeEndpoint(2, "kafka-2.cluster.internal", 9092)])  # the rewritten form fits in its place
    answer = sized(view_frame(view, 1))
    for i in range(0, len(answer), 7):
        conn.upstream_data(answer[i : i + 7])
    sent = port.take_client()
    assert len(sent) == len(answer) and not conn.busy
    _, _, got = decode_frame(sent[4:], 16)
    assert [(e.node_id, e.host) for e in got.node_endpoints] == [(2, "proxy.example")]
    assert [p.records for t in got.topics for p in t.partitions] == [batch()]
    assert rig.metrics.total("sluice_responses_rewritten_total", api="Fetch") == 1


def test_the_client_gone_mid_streamed_fetch() -> None:
    rig = make_rig()
    conn, port = rig.connect()
    conn.client_data(sized(fetch(1, version=16, keys=[(TID, 0), (TID, 1)])))
    answer = sized(fetch_response(1, version=16, keys=[(TID, 0), (TID, 1)], hw=7))
    half = len(answer) // 2
    conn.upstream_data(answer[:half])
    assert 0 < len(port.take_client()) <= half
    port.gone()
    conn.client_lost()
    conn.upstream_data(answer[half:])
    assert port.client == b"" and rig.lines() == []


# ------------------------------------------------------------------------------ re-send after a session error


SESSION_ERROR = 70  # FETCH_SESSION_ID_NOT_FOUND


def session_error(corr: int) -> bytes:
    return view_frame(FetchResponseView(12, 0, SESSION_ERROR, 0, []), corr)


def terminate_rig() -> tuple[CoreRig, Connection, FakePort]:
    """[sessions] terminate, a session-less client whose first fetch opened Sluice's upstream session 42."""
    rig = make_rig({"sessions.mode": "terminate"})
    conn, port = rig.connect()
    conn.client_data(sized(fetch(1)))
    first = decode_fetch_request(frames(port.take_upstream())[0])
    assert (first.session_id, first.session_epoch) == (0, 0)  # a full session request
    conn.upstream_data(sized(fetch_response(1, session_id=42)))
    assert correlation_ids(port.take_client()) == [1]
    return rig, conn, port


def test_a_session_error_sends_the_request_again() -> None:
    rig, conn, port = terminate_rig()
    conn.client_data(sized(fetch(2)))
    [incremental] = frames(port.take_upstream())
    req = decode_fetch_request(incremental)
    assert (req.session_id, req.session_epoch) == (42, 1) and not req.has_partitions  # nothing changed
    conn.upstream_data(sized(session_error(2)))
    assert port.client == b""  # the client never sees the error...
    [again] = frames(port.take_upstream())  # ...the same fetch goes up again, as a new full session request
    req = decode_fetch_request(again)
    assert (req.session_id, req.session_epoch) == (0, 0) and list(req.partitions()) == KEYS
    assert int.from_bytes(again[4:8], "big") == 2  # the client's correlation id
    conn.upstream_data(sized(fetch_response(2, hw=5, session_id=43)))
    [reply] = frames(port.take_client())
    corr, _, view = decode_frame(reply, 12)
    assert corr == 2 and view.error_code == 0 and view.session_id == 0
    assert [(t.topic, p.partition_index, p.high_watermark) for t, p in view.partitions()] == [
        ("t", 0, 5), ("t", 1, 5), ("t", 2, 5)]
    assert rig.metrics.total("sluice_fetch_session_retries_total") == 1
    line = rig.lines()[-1]
    assert line["correlation_id"] == 2 and line["error_codes"] == []
    # what went upstream for it: both attempts, each as it was sent
    assert line["bytes_proxy_to_upstream"] == len(incremental) + 4 + len(again) + 4
    assert line["bytes_upstream_to_proxy"] == len(session_error(2)) + 4 + len(fetch_response(2, hw=5)) + 4
    assert line["bytes_proxy_to_client"] == len(reply) + 4
    assert not conn.busy


def test_no_resend_with_another_request_in_flight_behind() -> None:
    rig, conn, port = terminate_rig()
    conn.client_data(sized(fetch(2), list_offsets(3)))
    assert correlation_ids(port.take_upstream(), request_side=True) == [2, 3]
    conn.upstream_data(sized(session_error(2)))
    assert port.upstream == b""  # sending it again would put its answer behind request 3's
    [reply] = frames(port.take_client())  # a retriable answer instead: the partitions Sluice knows, no error
    corr, _, view = decode_frame(reply, 12)
    assert corr == 2 and view.error_code == 0
    assert [(t.topic, p.partition_index, len(p.records or b"")) for t, p in view.partitions()] == [
        ("t", 0, 0), ("t", 1, 0), ("t", 2, 0)]
    conn.upstream_data(sized(list_offsets_response(3)))
    assert correlation_ids(port.take_client()) == [3]
    assert rig.metrics.total("sluice_fetch_session_retries_total") == 1


# ---------------------------------------------------------------------------------------------------- mute


MUTING = {**THROTTLED, "throttle.consumers": [{"client_id": CLIENT}]}


def held_back_fetch(rig: CoreRig, conn: Connection, corr: int) -> None:
    """A throttled fetch (leader quota exceeded) whose only partition's records are left out."""
    rig.proxy.policy("throttle").state.leader.record(5000, rig.clock())
    conn.client_data(sized(fetch(corr, keys=[("t", 0)])))
    view = FetchResponseView(12, topics=[FetchTopic("t", partitions=[FetchPartition(
        0, high_watermark=100, last_stable_offset=100, log_start_offset=0, records=memoryview(batch()))])])
    conn.upstream_data(sized(view_frame(view, corr)))


def test_a_fetch_whose_records_are_all_held_back_mutes_the_client() -> None:
    rig = make_rig(MUTING)
    conn, port = rig.connect()
    held_back_fetch(rig, conn, 1)
    [reply] = frames(port.take_client())
    _, _, view = decode_frame(reply, 12)
    assert [len(p.records or b"") for _, p in view.partitions()] == [0]  # left out, partition kept
    assert port.client_paused and port.named("call_later") == [("call_later", pytest.approx(0.5))]  # max_wait
    assert rig.metrics.total("sluice_throttle_left_out_partitions_total", side="leader") == 1
    rig.advance(0.499)
    assert port.client_paused
    rig.advance(0.001)
    assert not port.client_paused and port.named("pause_client", "resume_client") == [
        ("pause_client", None), ("resume_client", None)]
    line = rig.lines()[0]
    assert line["throttle_target_bps"] == 1000 and line["throttled_bytes"] == 0


def test_reading_resumes_only_when_every_pause_reason_is_gone() -> None:
    rig = make_rig(MUTING)
    conn, port = rig.connect()
    held_back_fetch(rig, conn, 1)
    assert port.client_paused
    conn.upstream_write_paused()  # muted AND upstream full
    rig.advance(1)  # the mute ends ...
    assert port.client_paused  # ... but the upstream is still full
    conn.upstream_write_resumed()
    assert not port.client_paused
    # the other way round: upstream full, then muted; the mute ends last
    conn.upstream_write_paused()
    held_back_fetch(rig, conn, 2)
    conn.upstream_write_resumed()
    assert port.client_paused
    rig.advance(1)
    assert not port.client_paused
    assert port.named("pause_client", "resume_client") == [("pause_client", None), ("resume_client", None)] * 2


def test_closing_while_muted_cancels_the_timer() -> None:
    rig = make_rig(MUTING)
    conn, port = rig.connect()
    held_back_fetch(rig, conn, 1)
    assert rig.timers.pending
    conn.close()
    assert rig.timers.pending == [] and port.closed is False
    rig.advance(1)
    assert port.named("resume_client") == []


# ------------------------------------------------------------------------------------------- backpressure


def test_a_full_upstream_pauses_reading_the_client() -> None:
    rig = make_rig()
    conn, port = rig.connect()
    conn.upstream_write_paused()
    conn.upstream_write_paused()
    assert port.named("pause_client") == [("pause_client", None)]
    conn.upstream_write_resumed()
    assert port.named("pause_client", "resume_client") == [("pause_client", None), ("resume_client", None)]
    conn.upstream_write_resumed()  # no reason left: nothing more to resume
    assert len(port.named("resume_client")) == 1


def test_a_full_client_pauses_reading_the_upstream() -> None:
    rig = make_rig()
    conn, port = rig.connect()
    conn.client_data(sized(list_offsets(1)))
    conn.client_write_paused()
    assert port.upstream_paused and not port.client_paused  # requests still flow
    conn.upstream_data(sized(list_offsets_response(1)))  # what was already read still goes out
    assert correlation_ids(port.take_client()) == [1]
    conn.client_write_resumed()
    assert port.named("pause_upstream", "resume_upstream") == [("pause_upstream", None), ("resume_upstream", None)]


def test_response_memory_is_released_when_the_client_drains() -> None:
    rig = make_rig(MEMORY)
    a, port_a = rig.connect()
    b, port_b = rig.connect()
    a.client_data(sized(fetch(1)))
    b.client_data(sized(fetch(1)))
    a.client_write_paused()
    a.upstream_data(sized(fetch_response(1)))
    assert correlation_ids(port_a.take_client()) == [1]  # handed to the transport, not yet to the client
    assert rig.memory.held == len(fetch_response(1)) and port_b.upstream == b""
    a.client_write_resumed()
    assert rig.memory.held == BUDGET and correlation_ids(port_b.take_upstream(), request_side=True) == [1]


# ---------------------------------------------------------------------------------------------- access log


@pytest.mark.parametrize(("seconds", "text"), [(0.00025, "0.250"), (0.0000004, "0.000"), (1.5, "1500.000"),
                                               (0.0123456, "12.346")])
def test_latency_is_the_clock_delta_in_milliseconds(seconds: float, text: str) -> None:
    rig = make_rig()
    conn = rig.connect()[0]
    conn.client_data(sized(list_offsets(1)))
    rig.advance(seconds)
    conn.upstream_data(sized(list_offsets_response(1)))
    assert f'"latency_ms":{text},' in rig.log.getvalue()
    assert rig.lines()[0]["latency_ms"] == float(text)
    assert rig.metrics.total("sluice_request_latency_seconds_sum", api="ListOffsets") == pytest.approx(seconds)


def test_latency_runs_from_the_last_byte_of_the_request() -> None:
    rig = make_rig()
    conn = rig.connect()[0]
    data = sized(list_offsets(1))
    conn.client_data(data[:5])
    rig.advance(2)  # the request is not complete yet: not counted
    conn.client_data(data[5:])
    rig.advance(0.003)
    conn.upstream_data(sized(list_offsets_response(1)))
    assert '"latency_ms":3.000,' in rig.log.getvalue()


def test_no_access_log_line_when_it_is_off() -> None:
    rig = make_rig()
    rig.access_log.enabled = False
    conn = rig.connect()[0]
    conn.client_data(sized(list_offsets(1)))
    conn.upstream_data(sized(list_offsets_response(1)))
    assert rig.log.getvalue() == "" and rig.metrics.total("sluice_requests_total") == 1


# -------------------------------------------------------------------------- waits for Sluice's own work


class _WaitsFirst(Policy):
    """A policy that needs work of Sluice's own before a ListOffsets request goes on (as cooperative
    consumption waits for its group calls), then sends the request as it was; ``signals`` are settled by the
    test."""

    name = "waits-first"
    apis = reads(LIST_OFFSETS)

    def __init__(self) -> None:
        self.signals: list[Signal] = []
        self.resumed: list[int] = []

    def on_request(self, ex: Exchange, conn: Any) -> Any:
        ex.pending = signal = Signal()
        self.signals.append(signal)
        return "asked"

    def on_resume(self, ex: Exchange, conn: Any, state: Any) -> Any:
        self.resumed.append(ex.header.correlation_id)
        return None


def waiting_rig() -> tuple[CoreRig, _WaitsFirst]:
    rig = make_rig()
    policy = _WaitsFirst()
    rig.proxy.chain = Chain([policy], rig.metrics, rig.names, rig.access_log)
    return rig, policy


def test_a_request_waits_for_the_work_a_policy_asked_for_and_those_behind_it_too() -> None:
    rig, policy = waiting_rig()
    conn, port = rig.connect()
    conn.client_data(sized(list_offsets(1), list_offsets(2)))
    assert port.upstream == b"" and port.client_paused and conn.busy and policy.resumed == []
    policy.signals[0].settle()
    assert policy.resumed == [1]
    assert correlation_ids(port.take_upstream(), request_side=True) == [1]  # the second waits for its own
    policy.signals[1].settle()
    assert correlation_ids(port.take_upstream(), request_side=True) == [2] and not port.client_paused
    conn.upstream_data(sized(list_offsets_response(1), list_offsets_response(2)))
    assert correlation_ids(port.take_client()) == [1, 2]


def test_work_already_done_does_not_wait() -> None:
    rig, policy = waiting_rig()
    conn, port = rig.connect()
    original = _WaitsFirst.on_request

    def settled_at_once(self: _WaitsFirst, ex: Exchange, state: Any) -> Any:
        out = original(self, ex, state)
        self.signals[-1].settle()
        return out

    policy.on_request = settled_at_once.__get__(policy)  # type: ignore[method-assign]
    conn.client_data(sized(list_offsets(1)))
    assert correlation_ids(port.take_upstream(), request_side=True) == [1] and policy.resumed == [1]


def test_closing_while_waiting_forgets_the_wait() -> None:
    rig, policy = waiting_rig()
    conn, port = rig.connect()
    conn.client_data(sized(list_offsets(1)))
    conn.client_lost()
    policy.signals[0].settle()  # the work ends after the client left: nothing is sent, nothing resumed
    assert port.upstream == b"" and policy.resumed == []


def test_the_connections_state_is_explicit() -> None:
    """Connecting until the upstream connection is up (requests queued), open, closed; the head request's wait
    and the reasons the client is not read are enums too."""
    rig = make_rig()
    conn, port = rig.connect(ready=False)
    assert conn.state is State.CONNECTING and not conn.closed
    conn.client_data(sized(list_offsets(1)))
    assert port.take_upstream() == b""  # queued while connecting
    conn.upstream_ready("broker:9092")
    assert conn.state is State.OPEN and port.take_upstream() == sized(list_offsets(1))
    conn.drain()
    assert port.named("pause_client") and conn.state is State.OPEN
    conn.close()
    assert conn.state is State.CLOSED and conn.closed


class Recorder:
    """An observer that records the events it is told, and nothing else: the core counts and logs nothing itself."""

    def __init__(self) -> None:
        self.events: list[tuple[str, Any]] = []

    def __getattr__(self, name: str) -> Any:
        return lambda *args: self.events.append((name, args[-1]))


def test_the_core_reports_to_its_observer_and_counts_nothing_itself() -> None:
    rig = make_rig()
    recorder = Recorder()
    port = FakePort(rig.timers)
    conn = Connection(ConnectionInfo(9, "bootstrap"), rig.proxy.chain, port, memory=rig.memory, names=rig.names,
                      observer=recorder, tallies=(Tally(), Tally(), Tally(), Tally()), clock=rig.clock)
    conn.upstream_ready("broker:9092")
    conn.client_data(sized(list_offsets(1)))
    conn.upstream_data(sized(response(2, 7, 1)))
    conn.client_data((-1).to_bytes(4, "big", signed=True))
    assert [name for name, _ in recorder.events] == ["completed", "frame_rejected"]
    assert recorder.events[1][1].startswith("request frame declares a negative length")
    assert rig.metrics.total("sluice_frames_rejected_total") == 0 and rig.lines() == []
