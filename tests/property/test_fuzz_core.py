"""Fuzzing the connection core (proxy/core/connection.py) as a whole: the frame reader on the client and upstream
sides fed arbitrary byte streams split anywhere, and random event sequences on two connections with the policies
on. The targets and their invariants are in rig/fuzz_targets.py (``python -m bench.fuzz`` runs them unbounded);
here each runs a bounded number of examples (CI replays them derandomized).

Below them, every crash the fuzzing found, as an explicit regression test at the connection level.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from structlog.testing import capture_logs

from bench.pipeline_cpu import request_frame, response_frame
from proxy.policies.terminate.sessions import LEGACY
from proxy.wire.fetch_fast import FetchResponseView, NodeEndpoint
from proxy.wire.fetch_layout import PartitionKey
from proxy.wire.fetch_request_fast import FetchParams
from rig.core_rig import CoreRig, sized
from rig.fuzz_targets import TARGETS, check_closed_cleanly, fetch_request


def bounded(examples: int) -> settings:
    return settings(max_examples=examples, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.filter_too_much])


def run(name: str, data: st.DataObject) -> None:
    with capture_logs():  # every rejected frame logs an event: kept in memory, not rendered
        TARGETS[name](data)


@bounded(120)
@given(st.data())
def test_fuzz_frame_reader_client(data: st.DataObject) -> None:
    run("frame_reader_client", data)


@bounded(200)
@given(st.data())
def test_fuzz_frame_reader_upstream(data: st.DataObject) -> None:
    run("frame_reader_upstream", data)


@bounded(80)
@given(st.data())
def test_fuzz_connection_events(data: st.DataObject) -> None:
    run("connection_events", data)


# ------------------------------------------------------------------------------- regressions (found by fuzzing)

TID = bytes(range(16))


def test_a_sessionless_fetch_naming_a_topic_that_is_not_utf8_closes_the_connection() -> None:
    """bench.fuzz (fetch_baseline): in terminate mode a session-less client's next Fetch is read against its
    previous one (Baseline.read), which let the UnicodeDecodeError of a topic name that is not UTF-8 escape the
    core. Now the request is decoded whole instead, and refused as malformed."""
    rig = CoreRig({"sessions.mode": "terminate"})
    conn, port = rig.connect()
    keys: dict[PartitionKey, int] = {("t", 0): 0, ("t", 1): 0}
    conn.client_data(sized(request_frame(12, 1, keys, LEGACY)))
    conn.upstream_data(sized(response_frame(12, 1, list(keys), 0, 42)))
    assert not conn.closed
    second = request_frame(12, 2, keys, LEGACY).replace(b"\x02t", b"\x02\xff")  # compact string "t" -> "\xff"
    with capture_logs():
        conn.client_data(sized(second))
    assert conn.closed and port.closed is True and rig.rejected("malformed") == 1
    check_closed_cleanly(rig, [port], [conn])


def test_a_streamed_fetch_with_a_host_that_is_not_utf8_closes_the_connection() -> None:
    """bench.fuzz (fetch_streamer_mutated): a Fetch v16+ response's NodeEndpoints with a host that is not UTF-8
    raised UnicodeDecodeError out of FetchStreamer, through the core. Now a CodecError: the connection is closed
    and counted, and the client got nothing of the tag section."""
    rig = CoreRig()
    conn, port = rig.connect()
    conn.client_data(sized(request_frame(16, 1, {(TID, 0): 0}, LEGACY)))
    view = FetchResponseView(16, node_endpoints=[NodeEndpoint(1, "broker-1.internal", 9092, None)])
    frame = b"".join(bytes(b) for b in view.encode_frame(1)[0])[4:].replace(b"broker-1", b"\xffroker-1")
    with capture_logs():
        conn.upstream_data(sized(frame))
    assert conn.closed and rig.rejected("malformed") == 1
    assert b"roker-1" not in bytes(port.client)
    check_closed_cleanly(rig, [port], [conn])


def test_a_fetch_with_a_negative_max_bytes_keeps_the_memory_bound() -> None:
    """bench.fuzz (connection_events): with a global memory bound, a budgeted Fetch reserved its MaxBytes as the
    client sent it, so a MaxBytes of -501 took the response bytes held below zero, and let the other connections
    past the bound. It now reserves 1 byte (the broker still sends a first batch), adjusted to the response."""
    rig = CoreRig({"size_limit.budgets": [{"client_id": "*", "fetch_max_bytes": 1000}],
                   "size_limit.global_max_bytes": 1000})
    a, port_a = rig.connect()
    b, port_b = rig.connect()
    a.client_data(sized(fetch_request(4, 1, {("t", 0): FetchParams(0)}, max_bytes=-501)))
    assert rig.memory.held == 1
    b.client_data(sized(fetch_request(4, 1, {("t", 0): FetchParams(0)}, max_bytes=1000)))
    assert port_b.upstream == b"" and rig.memory.waiting == 1  # 1 + 1000 is past the bound: b waits
    a.upstream_data(sized(response_frame(4, 1, [("t", 0)], 0, 0)))
    assert port_b.upstream != b"" and rig.memory.held == 1000
    b.upstream_data(sized(response_frame(4, 1, [("t", 0)], 0, 0)))
    assert rig.memory.held == 0
    check_closed_cleanly(rig, [port_a, port_b], [a, b])
