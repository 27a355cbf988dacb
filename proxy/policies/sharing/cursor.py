"""The read-ahead cursor of a member sharing a partition: how far Sluice has read the partition for it and found
nothing it has yet to be handed, so that its fetches go upstream from there instead of from its own offset.

Why: records produced one per batch (a producer with a small linger on a topic of modest rate) leave most of a
member's batches holding other slices' records only. Sluice leaves those batches out (no client reads a batch
emptied of its records as Kafka means it: :mod:`.fetch`), so a response may hold nothing for the member, and the
client, at its own offset still, would fetch the same batches again. What every client accepts instead: a
response whose first batch starts past its fetch offset (compacted topics have gaps; Java's CompletedFetch,
librdkafka's msgset reader, franz-go, kafka-go and the Python clients skip only what lies below it), and a
partition with no records, after which it fetches again. So Sluice remembers, per member and partition, the
offsets it read that hold nothing for the member (:class:`Gaps`: content, not history, so they hold for any
fetch of that member, a seek back included) and moves each fetch offset past them:

- a session-less fetch (librdkafka, aiokafka, kafka-go: every request lists every partition with the client's
  offset) has each shared partition's offset moved on;
- a client with its own fetch session (KIP-227: the Java client, kafka-python, franz-go) lists only partitions
  whose offset changed since it last listed them; one whose fetch returned nothing keeps its offset, and the next
  hop (the broker, or Sluice's session server in terminate mode) fetches it from the offset last *sent*
  (FetchSession's CachedPartition). So Sluice keeps each session partition's parameters as the client listed
  them (:class:`ClientFetches`), and lists a partition itself, as an altered one, whenever the offset it would
  send differs from the one it sent last: past a gap, or back to the client's own once the gaps are gone (a
  slice that changed starts with none).

A moved partition's LastFetchedEpoch (v12+, KIP-320) is the leader epoch of the batch before the new offset, as
the client itself would send after reading that batch: the broker checks the fetch offset against the end of
that epoch (Partition.fetchRecords, lastFetchedEpoch), and the client's older epoch could read as a divergence.

When a fetch answered within the client's MaxWaitMs holds nothing for the member (the broker answered because
other slices' records came, after holding it a while: a slow partition's shape), the request goes upstream again
from the cursor for the time the client has left (the ``resend`` effect, :meth:`ClientFetches.again`): the
client's long poll still means "wait for my records". A fetch the broker answered at once (records keep coming) is
the client's to send again, as soon as Sluice would (the policy's ``_AGAIN_IF_HELD``).
A request sent again in the client's fetch session is one more request of that session: its epoch is the next one
(FetchMetadata.nextEpoch), and the client's later requests are numbered on after it (:attr:`ClientFetches.shift`).

:func:`slice_end`: a partition whose response holds nothing for the member, read by Sluice up to the high
watermark, is answered with the high watermark at the member's own fetch offset: nothing of its slice lies
between (its lag is 0), and kafka-go reads a partition with no records below the high watermark as a broken
connection (Conn.ReadBatchWith: a message set reader over no bytes, io.ErrUnexpectedEOF, the connection closed
and dialled again after a backoff), while at the high watermark it simply fetches again.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from ...wire.fetch_fast import FetchPartition
from ...wire.fetch_layout import (
    FINAL_EPOCH,
    FIRST_SESSION,
    INT32_MAX,
    INVALID_SESSION_ID,
    PartitionKey,
    next_epoch,
)
from ...wire.fetch_request_fast import FetchEdit, FetchParams, encode_fetch_request

#: gaps remembered per partition a member holds, the lowest forgotten first (forgetting one only costs a fetch
#: of batches read before)
GAPS_MAX = 1024


class Gaps:
    """The offsets of one partition holding nothing a member has yet to be handed (other slices' records, work an
    earlier slice committed, compacted offsets), as disjoint ranges [start, end), each with the leader epoch of the
    batch holding offset end - 1 (-1: not known)."""

    __slots__ = ("_ends", "_epochs", "_starts")

    def __init__(self) -> None:
        self._starts: list[int] = []
        self._ends: list[int] = []
        self._epochs: list[int] = []

    def __len__(self) -> int:
        return len(self._starts)

    def __repr__(self) -> str:
        return f"Gaps({list(zip(self._starts, self._ends, strict=True))})"

    def note(self, gaps: Iterable[tuple[int, int, int]]) -> None:
        """Add ranges ``(start, end, epoch)`` (a fetch's :attr:`~.fetch.Filtered.gaps`), joining those they touch."""
        starts, ends, epochs = self._starts, self._ends, self._epochs
        for start, end, epoch in gaps:
            if end <= start:
                continue
            i = bisect_right(starts, start)
            if i and ends[i - 1] >= start:  # touches the one before: grow it
                i -= 1
                start = starts[i]
            j = i
            while j < len(starts) and starts[j] <= end:  # swallow the ones it reaches
                if ends[j] > end or (ends[j] == end and epoch < 0):
                    end, epoch = ends[j], epochs[j]
                j += 1
            starts[i:j], ends[i:j], epochs[i:j] = [start], [end], [epoch]
        if len(starts) > GAPS_MAX:
            del starts[: len(starts) - GAPS_MAX], ends[: len(ends) - GAPS_MAX], epochs[: len(epochs) - GAPS_MAX]

    def after(self, offset: int) -> tuple[int, int]:
        """Where a fetch from ``offset`` may start: past the gap holding it, with that gap's epoch; else
        ``offset`` itself and -1."""
        i = bisect_right(self._starts, offset) - 1
        if i >= 0 and offset < self._ends[i]:
            return self._ends[i], self._epochs[i]
        return offset, -1

    def position(self, offset: int) -> int:
        """The slice's position for a commit of ``offset``: moved past the gap holding it. Clients that commit
        "last record received + 1" (librdkafka, franz-go, kafka-go) would otherwise leave their slice's position
        before the other slices' records that follow their last one, and the stable offset (the minimum over the
        slices) short of the partition's end; a gap holds no record the member has yet to be handed, so nothing
        is skipped that it had to consume (the same reason Java's position, its next fetch offset, moves past
        it). Gaps wholly below ``offset`` are forgotten: the member's fetches start at or past what it commits."""
        i = bisect_right(self._ends, offset)
        if i:
            del self._starts[:i], self._ends[:i], self._epochs[:i]
        return self.after(offset)[0]

    def clear(self) -> None:
        self._starts.clear()
        self._ends.clear()
        self._epochs.clear()


def _shifted(epoch: int, by: int) -> int:
    """Session epoch ``epoch`` (>= 1) ``by`` requests on (FetchMetadata.nextEpoch ``by`` times: 1 after INT32_MAX)."""
    return (epoch - 1 + by) % INT32_MAX + 1


def _moved(params: FetchParams, offset: int, epoch: int) -> FetchParams:
    """``params`` fetching from ``offset`` instead; LastFetchedEpoch the epoch before it (kept -1 when the client
    sends none: the broker then checks nothing)."""
    return params._replace(fetch_offset=offset, last_fetched_epoch=epoch if params.last_fetched_epoch >= 0 else -1)


@dataclass(slots=True)
class Sent:
    """What one attempt of a client's Fetch asked of the member's shared partitions."""

    #: the client's own parameters of each shared partition the request covers (listed, or kept in its session)
    client: dict[PartitionKey, FetchParams] = field(default_factory=dict)
    #: the offset sent instead of the client's, where it differs
    moved: dict[PartitionKey, int] = field(default_factory=dict)
    #: the request runs in the client's fetch session (not session-less, not closing it)
    session: bool = False


@dataclass(slots=True)
class ClientFetches:
    """One client connection's Fetch requests as Sluice sends them on: the client's fetch session as Sluice keeps
    it (one per connection: Kafka's clients run one session per broker connection, and a new full request starts
    a new one), and what Sluice changed in it."""

    #: the client's session (from the answer to its full request) and the epoch of the last request sent in it
    session_id: int = 0
    epoch: int = FINAL_EPOCH
    #: requests Sluice sent in the client's session itself (fetches sent again): the client's epochs are moved on
    #: by this many, the next hop having counted them
    shift: int = 0
    #: each partition of the client's session, with its parameters as the client last listed them
    listed: dict[PartitionKey, FetchParams] = field(default_factory=dict)
    #: the partitions of the session whose offset Sluice moved: the offset the next hop holds for them
    sent: dict[PartitionKey, int] = field(default_factory=dict)
    #: the topic ids its requests named (v13+), by name: a member's partitions are known by name
    ids: dict[str, bytes] = field(default_factory=dict)

    @property
    def idle(self) -> bool:
        """Nothing kept: no client session, no offset moved (what :meth:`reset` leaves, and a session-less fetch of
        partitions none of which is held changes nothing of)."""
        return not (self.listed or self.sent or self.shift or self.session_id) and self.epoch == FINAL_EPOCH

    def reset(self) -> None:
        self.session_id, self.epoch, self.shift = 0, FINAL_EPOCH, 0
        self.listed.clear()
        self.sent.clear()

    def plan(self, edit: FetchEdit, held: Mapping[PartitionKey, Gaps]) -> Sent:
        """Move the fetch offsets of ``edit`` (a client's request as the earlier policies left it) past the gaps
        of the member's shared partitions (``held``: their gaps by key), keeping the client's session in step."""
        view = edit.view
        parts = edit.partitions
        out = Sent()
        if view.version < FIRST_SESSION or view.session_epoch == FINAL_EPOCH:
            # session-less, or closing the session (KIP-227: then a session-less fetch)
            self.reset()
            for key in held.keys() & parts.keys():
                params = out.client[key] = parts[key]
                target, epoch = held[key].after(params.fetch_offset)
                if target != params.fetch_offset:
                    parts[key] = _moved(params, target, epoch)
                    out.moved[key] = target
                    edit.changed = True
            return out
        out.session = True
        if view.session_epoch == 0:  # a full request: a new session, of these partitions
            self.reset()
            self.epoch = 0
        else:
            for key in view.forgotten():
                self.listed.pop(key, None)
                self.sent.pop(key, None)
            if self.shift:
                edit.session_epoch = _shifted(view.session_epoch, self.shift)
                edit.changed = True
            self.epoch = edit.session_epoch
            self.session_id = view.session_id
        self.listed.update(parts)
        for key in (held.keys() & self.listed.keys()) | self.sent.keys():
            params = out.client[key] = self.listed[key]
            gaps = held.get(key)
            target, epoch = gaps.after(params.fetch_offset) if gaps is not None else (params.fetch_offset, -1)
            # what the next hop holds for it unless listed now: the last offset sent
            holds = self.sent.get(key, params.fetch_offset) if key not in parts else params.fetch_offset
            if target != params.fetch_offset:
                out.moved[key] = self.sent[key] = target
            else:
                self.sent.pop(key, None)
            if target != holds:
                parts[key] = _moved(params, target, epoch) if target != params.fetch_offset else params
                edit.changed = True
        return out

    def again(self, edit: FetchEdit, sent: Sent, held: Mapping[PartitionKey, Gaps], session_id: int,
              max_wait_ms: int) -> bytes | None:
        """The request to send upstream again after an answer that held nothing for the member, from where the
        cursor is now, waiting ``max_wait_ms`` at most; None when no partition's cursor moved past what this
        attempt fetched (nothing new to wait for there). ``sent`` is updated to the new attempt; ``session_id``
        is the session the answer named (a full request's answer names the new one)."""
        moved: dict[PartitionKey, FetchParams] = {}
        for key, params in sent.client.items():
            gaps = held.get(key)
            if gaps is None:
                continue
            target, epoch = gaps.after(params.fetch_offset)
            if target > sent.moved.get(key, params.fetch_offset):
                moved[key] = _moved(params, target, epoch)
        if not moved:
            return None
        view = edit.view
        if not sent.session:
            edit.partitions.update(moved)
            sent.moved.update((key, params.fetch_offset) for key, params in moved.items())
            return encode_fetch_request(view, INVALID_SESSION_ID, FINAL_EPOCH, edit.partitions, [],
                                        max_bytes=edit.max_bytes, max_wait_ms=max_wait_ms)
        if session_id == INVALID_SESSION_ID:
            return None  # the broker kept no session for the client (its sessions are all taken)
        for key, params in moved.items():
            sent.moved[key] = self.sent[key] = params.fetch_offset
        self.epoch = next_epoch(self.epoch)
        self.session_id = session_id
        self.shift += 1
        return encode_fetch_request(view, session_id, self.epoch, moved, [], max_bytes=edit.max_bytes,
                                    max_wait_ms=max_wait_ms)


def slice_end(part: FetchPartition, client: int, gaps: Gaps) -> None:
    """A partition answered with no record for the member: when Sluice has read it up to its high watermark with
    nothing for the member from ``client`` (its fetch offset) on, the high watermark (and the last stable offset
    past it) the member sees is ``client``: the end of its slice (see the module docstring)."""
    if part.error_code or part.high_watermark <= client or part.log_start_offset > client:
        return
    if gaps.after(client)[0] < part.high_watermark:
        return
    part.high_watermark = client
    if part.last_stable_offset > client:
        part.last_stable_offset = client
