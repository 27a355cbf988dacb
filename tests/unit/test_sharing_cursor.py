"""The read-ahead cursor (proxy/policies/sharing/cursor.py), sans-IO: the gaps a member's fetches start past, a
client connection's fetches moved past them in and out of fetch sessions (KIP-227), the request sent again after an
answer with nothing for the member, and the high watermark of a slice read to its end."""

from __future__ import annotations

import pytest

from proxy.policies.sharing.cursor import GAPS_MAX, ClientFetches, Gaps, slice_end
from proxy.policies.terminate.sessions import FetchMetadata, UpstreamPlan
from proxy.wire.fetch_fast import FetchPartition
from proxy.wire.fetch_layout import INT32_MAX, PartitionKey
from proxy.wire.fetch_request_fast import FetchEdit, FetchParams, FetchRequestView, decode_fetch_request
from proxy.wire.messages import encode_request, request_codec
from proxy.wire.model import Message
from rig.fetch_oracle import apply_plan

P0: PartitionKey = ("t", 0)
P1: PartitionKey = ("t", 1)
OTHER: PartitionKey = ("u", 0)


def edit(parts: dict[PartitionKey, FetchParams], session: int = 0, epoch: int = -1, version: int = 12,
         forget: list[PartitionKey] | None = None, max_wait_ms: int = 500) -> FetchEdit:
    """A client's Fetch request as the chain hands it to the policies."""
    body = request_codec(1, version).default().replace(replica_id=-1, max_wait_ms=max_wait_ms, min_bytes=1,
                                                       max_bytes=1 << 20)
    if version >= 7:
        body = apply_plan(body, version, UpstreamPlan(FetchMetadata(session, epoch), dict(parts),
                                                      list(forget or []), dict(parts)))
    else:  # before KIP-227: no session fields, no forgotten topics
        body = body.replace(topics=[Message(topic=t, partitions=[Message(
            partition=n, fetch_offset=f.fetch_offset, partition_max_bytes=f.partition_max_bytes,
            **({"log_start_offset": -1} if version >= 5 else {}))]) for (t, n), f in parts.items()])
    header = Message(request_api_key=1, request_api_version=version, correlation_id=3, client_id="c")
    return FetchEdit(decode_fetch_request(encode_request(header, body)))


def sent_on(e: FetchEdit) -> FetchRequestView:
    """The request as it goes to the next hop."""
    return decode_fetch_request(e.encode())


def gaps(*ranges: tuple[int, int, int]) -> Gaps:
    g = Gaps()
    g.note(ranges)
    return g


# ------------------------------------------------------------------------------------------------------ Gaps


def test_gaps_join_what_they_touch_and_keep_the_epoch_of_their_end() -> None:
    g = gaps((10, 12, 1), (20, 25, 2), (12, 14, 1), (30, 31, 3))
    assert g.after(10) == (14, 1) and g.after(13) == (14, 1) and g.after(14) == (14, -1)
    g.note([(13, 22, 2)])  # reaches into [20, 25): one gap to 25
    assert g.after(11) == (25, 2) and len(g) == 2
    g.note([(5, 40, 4)])  # covers everything
    assert g.after(5) == (40, 4) and g.after(4) == (4, -1) and len(g) == 1
    g.note([(40, 41, -1)])  # adjacent, epoch unknown at its end
    assert g.after(39) == (41, -1)


def test_a_commit_inside_a_gap_is_its_end_and_the_gaps_below_are_forgotten() -> None:
    g = gaps((10, 12, 1), (15, 20, 1), (30, 35, 2))
    assert g.position(15) == 20 and g.position(17) == 20  # "last record + 1" clients commit where a gap starts
    assert g.position(25) == 25  # no gap there: the client's own
    assert len(g) == 1 and g.after(10) == (10, -1) and g.after(31) == (35, 2)  # those wholly below 25 forgotten


def test_gaps_are_bounded_the_lowest_forgotten() -> None:
    g = Gaps()
    g.note((2 * i, 2 * i + 1, 0) for i in range(GAPS_MAX + 10))
    assert len(g) == GAPS_MAX and g.after(0) == (0, -1) and g.after(2 * (GAPS_MAX + 9)) == (2 * GAPS_MAX + 19, 0)


# ------------------------------------------------------------------------------------- session-less clients


def test_a_session_less_fetch_starts_past_the_gap_with_its_epoch() -> None:
    e = edit({P0: FetchParams(100, last_fetched_epoch=3), P1: FetchParams(7), OTHER: FetchParams(100)})
    sent = ClientFetches().plan(e, {P0: gaps((100, 140, 5)), P1: gaps((1, 5, 1))})
    assert sent.moved == {P0: 140} and sent.client[P0].fetch_offset == 100 and not sent.session
    out = sent_on(e).partitions()
    assert out[P0] == FetchParams(140, last_fetched_epoch=5) and out[P1] == FetchParams(7)
    assert out[OTHER] == FetchParams(100)  # not the member's shared partition


def test_a_client_sending_no_epoch_gets_none() -> None:
    e = edit({P0: FetchParams(100)})
    ClientFetches().plan(e, {P0: gaps((90, 140, 5))})
    assert sent_on(e).partitions()[P0] == FetchParams(140)  # LastFetchedEpoch -1: the broker checks nothing


def test_a_fetch_answered_with_nothing_goes_again_from_the_cursor_for_the_time_left() -> None:
    fetches, held = ClientFetches(), {P0: gaps()}
    e = edit({P0: FetchParams(100), P1: FetchParams(3)})
    sent = fetches.plan(e, held)
    assert not sent.moved and not e.changed
    assert fetches.again(e, sent, held, 0, 350) is None  # nothing read past it: nothing new to wait for
    held[P0].note([(100, 120, 2)])  # the answer held only other slices' records
    frame = fetches.again(e, sent, held, 0, 350)
    assert frame is not None
    again = decode_fetch_request(frame)
    assert again.max_wait_ms == 350 and again.correlation_id == 3 and (again.session_id, again.session_epoch) == (0, -1)
    assert again.partitions() == {P0: FetchParams(120), P1: FetchParams(3)}
    assert sent.moved == {P0: 120} and fetches.again(e, sent, held, 0, 300) is None  # nothing more read


# ------------------------------------------------------------------------------- clients with fetch sessions


def test_a_session_partition_the_client_does_not_list_is_listed_when_its_cursor_moves() -> None:
    """The Java client lists only partitions whose offset changed: one whose fetch got nothing keeps its offset,
    and the next hop fetches it from the offset sent last. Sluice lists it itself, as an altered partition."""
    fetches, g = ClientFetches(), gaps()
    full = edit({P0: FetchParams(100), P1: FetchParams(50)}, session=0, epoch=0)
    sent = fetches.plan(full, {P0: g})
    assert sent.session and not full.changed and sent.client == {P0: FetchParams(100)}
    g.note([(100, 130, 1)])  # its answer: other slices' records only
    inc = edit({}, session=9, epoch=1)
    sent = fetches.plan(inc, {P0: g})
    assert sent_on(inc).partitions() == {P0: FetchParams(130)} and sent.moved == {P0: 130}
    inc = edit({P1: FetchParams(60)}, session=9, epoch=2)  # the next hop holds 130 for P0: nothing to add
    fetches.plan(inc, {P0: g})
    assert sent_on(inc).partitions() == {P1: FetchParams(60)}
    g.clear()  # a new slice starts with no gaps: back to the client's own offset
    inc = edit({}, session=9, epoch=3)
    sent = fetches.plan(inc, {P0: g})
    assert sent_on(inc).partitions() == {P0: FetchParams(100)} and not sent.moved and not fetches.sent


def test_a_partition_moved_and_no_longer_shared_goes_back_to_the_clients_offset() -> None:
    fetches = ClientFetches()
    fetches.plan(edit({P0: FetchParams(100)}, session=0, epoch=0), {P0: gaps((100, 130, 1))})
    inc = edit({}, session=9, epoch=1)
    fetches.plan(inc, {})  # the member lost its slice (or is not known any more)
    assert sent_on(inc).partitions() == {P0: FetchParams(100)}


def test_forgotten_partitions_are_forgotten() -> None:
    fetches = ClientFetches()
    fetches.plan(edit({P0: FetchParams(100)}, session=0, epoch=0), {P0: gaps((100, 130, 1))})
    inc = edit({}, session=9, epoch=1, forget=[P0])
    fetches.plan(inc, {P0: gaps((100, 150, 1))})
    assert sent_on(inc).partitions() == {} and not fetches.listed and not fetches.sent


def test_a_request_sent_again_in_the_session_numbers_the_clients_next_ones_after_it() -> None:
    """KIP-227: every request of a session has the next epoch; Sluice's own request in the client's session is
    one, so the client's later requests go on one epoch further."""
    fetches, g = ClientFetches(), gaps()
    full = edit({P0: FetchParams(100), P1: FetchParams(50)}, session=0, epoch=0)
    sent = fetches.plan(full, {P0: g})
    g.note([(100, 110, 4)])
    frame = fetches.again(full, sent, {P0: g}, 77, 200)  # the full request's answer named session 77
    assert frame is not None
    again = decode_fetch_request(frame)
    assert (again.session_id, again.session_epoch, again.max_wait_ms) == (77, 1, 200)
    assert again.partitions() == {P0: FetchParams(110)} and again.forgotten() == []
    inc = edit({P1: FetchParams(55)}, session=77, epoch=1)
    fetches.plan(inc, {P0: g})
    out = sent_on(inc)
    assert out.session_epoch == 2 and out.partitions() == {P1: FetchParams(55)}  # P0: the next hop has 110
    assert edit({}, session=77, epoch=1).request().session_epoch == 1  # the client's own, untouched
    full = edit({P0: FetchParams(100)}, session=77, epoch=0)  # a new session: numbered as the client does
    fetches.plan(full, {P0: g})
    assert sent_on(full).session_epoch == 0 and fetches.shift == 0


def test_epochs_moved_on_wrap_as_kafkas_do() -> None:
    fetches, g = ClientFetches(), gaps()
    sent = fetches.plan(edit({P0: FetchParams(1)}, session=5, epoch=INT32_MAX), {P0: g})
    g.note([(1, 9, 0)])
    again = fetches.again(edit({P0: FetchParams(1)}, session=5, epoch=INT32_MAX), sent, {P0: g}, 5, 100)
    assert again is not None and decode_fetch_request(again).session_epoch == 1
    inc = edit({}, session=5, epoch=1)
    fetches.plan(inc, {P0: g})
    assert sent_on(inc).session_epoch == 2


def test_no_request_is_added_to_a_session_the_broker_did_not_keep() -> None:
    fetches, g = ClientFetches(), gaps()
    full = edit({P0: FetchParams(100)}, session=0, epoch=0)
    sent = fetches.plan(full, {P0: g})
    g.note([(100, 110, 4)])
    assert fetches.again(full, sent, {P0: g}, 0, 200) is None  # answered session 0: its sessions are all taken


@pytest.mark.parametrize("version", [4, 7, 12, 13, 18])
def test_every_version_moves_its_offsets(version: int) -> None:
    key: PartitionKey = (bytes(range(16)), 0) if version >= 13 else P0
    e = edit({key: FetchParams(100)}, version=version)
    ClientFetches().plan(e, {key: gaps((90, 120, 2))})
    assert sent_on(e).partitions()[key].fetch_offset == 120


# -------------------------------------------------------------------------------------------------- slice_end


def partition(hw: int, lso: int | None = None, log_start: int = 0, error: int = 0) -> FetchPartition:
    return FetchPartition(0, error, hw, hw if lso is None else lso, log_start, None, -1, b"")


def test_a_slice_read_to_the_high_watermark_ends_at_the_members_offset() -> None:
    """kafka-go reads a partition with no records below the high watermark as a broken connection; at it, it just
    fetches again. Nothing of the member's slice lies between: its lag is 0."""
    p = partition(150)
    slice_end(p, 100, gaps((100, 150, 3)))
    assert (p.high_watermark, p.last_stable_offset, p.log_start_offset) == (100, 100, 0)


@pytest.mark.parametrize(("p", "g"), [
    (partition(150), gaps((100, 140, 3))),  # not read to the end: something of the slice may be there
    (partition(150, error=1), gaps((100, 150, 3))),  # an error: the broker's answer
    (partition(150, log_start=120), gaps((100, 150, 3))),  # the log starts past the member's offset
    (partition(150, lso=130), gaps((100, 130, 3))),  # read_committed: read to the stable offset only
])
def test_a_slice_not_read_to_its_end_keeps_the_brokers_high_watermark(p: FetchPartition, g: Gaps) -> None:
    hw = p.high_watermark
    slice_end(p, 100, g)
    assert p.high_watermark == hw
