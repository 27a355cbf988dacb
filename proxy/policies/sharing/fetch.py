"""Fetch responses for a member that shares partitions: the records outside its key slice, and those an earlier
slice already committed, are removed from each batch (:mod:`proxy.wire.record_filter`), and a bounded cache of
decoded batches serves the other members of the same partition in this Sluice (a batch filtered once serves the
other fetches that fall into its range from memory instead of a repeated fetch; ``sharing.cache_max_bytes``).

What is kept as it came: control batches (transaction markers: their consumers must see them), message format
v0/v1 entries (not decodable here; Kafka 4 writes none, KIP-724), a batch that cannot be decoded (the client then
reports what the broker sent), and every batch of a whole partition below which nothing is committed. A
transactional batch is filtered like any other: its producer id and epoch stay, and the aborted-transaction
list of the partition names producer ids and first offsets, which filtering does not move, so a read_committed
consumer still skips aborted records. A truncated trailing batch (the broker's byte slice cut at max_bytes) is
dropped, as clients drop it. A batch left without records is never sent (see :func:`filter_records`); the offsets
read that hold nothing for the member are noted (:attr:`Filtered.gaps`) for the read-ahead cursor (:mod:`.cursor`).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

from ...wire.errors import CodecError
from ...wire.record_filter import ParsedBatch, keep_records, parse_batch, record_at
from ...wire.records import COMPRESSION_MASK, CONTROL_MASK, MAGIC_V2, BatchHeader, extend_batch, iter_batches
from .frontier import DoneTable
from .keys import Slice, positive_hash

#: (topic name or id, partition, base offset, CRC): a batch's identity in the cache
BatchKey = tuple[str | bytes, int, int, int]
#: a batch with any of these attributes is not read in place: compressed, or a transaction marker
_NOT_IN_PLACE = COMPRESSION_MASK | CONTROL_MASK
#: distinct keys whose hash is remembered (records of a partition mostly repeat their keys)
_HASH_MEMO_MAX = 1 << 16
#: a batch of one uncompressed record read once: its base offset -> (its CRC, its record's offset, its key's hash)
Singles = dict[int, tuple[int, int, int]]
#: what a one-record batch's entry in :class:`Singles` holds, about (the tuple, its ints, its share of the dict)
_SINGLE_SIZE = 200


@dataclass(slots=True)
class Decoded:
    #: the batch with its records located
    batch: ParsedBatch
    offsets: list[int]
    hashes: list[int | None]
    size: int


class BatchCache:
    """Decoded batches (with their records' key hashes), least recently used evicted past ``max_bytes``, and per
    partition what the batches of one uncompressed record read hold (:class:`Singles`: a batch's identity, as an
    entry's, is its base offset and CRC), let go all at once past ``max_bytes``.

    ``on_change`` (the bytes held) and ``on_lookup`` (hits, misses) are told once per record set filtered
    (:meth:`report`), not per batch: a low-rate topic's record sets hold a batch per record, and a metric's update
    costs more than a look-up."""

    def __init__(self, max_bytes: int, on_change: Callable[[int], None] | None = None,
                 on_lookup: Callable[[int, int], None] | None = None) -> None:
        self.max_bytes = max_bytes
        self.bytes = 0
        self._entries: OrderedDict[BatchKey, Decoded] = OrderedDict()
        self._singles: dict[tuple[str | bytes, int], Singles] = {}
        self._singles_held = 0
        #: key -> its hash, remembered (:meth:`hash_of`)
        self.hashes: dict[bytes, int] = {}
        self._on_change = on_change
        self._on_lookup = on_lookup
        #: look-ups since the last report, and whether an entry came or went
        self._hits = self._misses = 0
        self._changed = False

    def __len__(self) -> int:
        return len(self._entries)

    def decoded(self, key: BatchKey, records: memoryview, header: BatchHeader) -> Decoded:
        """The batch ``header`` locates in ``records`` decoded, from the cache or now (CodecError if it cannot be)."""
        entries = self._entries
        entry = entries.get(key)
        if entry is not None:
            entries.move_to_end(key)
            self._hits += 1
            return entry
        self._misses += 1
        batch = parse_batch(records[header.start : header.end])
        entry = Decoded(batch, batch.offsets, [self.hash_of(k) for k in batch.keys], batch.size)
        if self.max_bytes and entry.size <= self.max_bytes:
            entries[key] = entry
            self.bytes += entry.size
            while self.bytes > self.max_bytes and entries:
                _, old = entries.popitem(last=False)
                self.bytes -= old.size
            self._changed = True
        return entry

    def singles(self, topic: str | bytes, partition: int) -> Singles:
        """The partition's one-record batches read (a member's own, not kept, when the cache keeps nothing); the
        caller adds those it reads and tells :meth:`report` how many."""
        if not self.max_bytes:
            return {}
        return self._singles.setdefault((topic, partition), {})

    def report(self, hits: int = 0, misses: int = 0) -> None:
        """Tell the callbacks what changed since the last report, with ``hits`` and ``misses`` of :meth:`singles`
        (each miss an entry added)."""
        self._hits += hits
        self._misses += misses
        if misses and self.max_bytes:
            self._singles_held += misses
            self.bytes += misses * _SINGLE_SIZE
            self._changed = True
            if self.bytes > self.max_bytes:
                self.bytes -= self._singles_held * _SINGLE_SIZE
                self._singles_held = 0
                self._singles.clear()
        if (self._hits or self._misses) and self._on_lookup is not None:
            self._on_lookup(self._hits, self._misses)
        self._hits = self._misses = 0
        if self._changed and self._on_change is not None:
            self._on_change(self.bytes)
        self._changed = False

    def hash_of(self, key: bytes | None) -> int | None:
        """``key``'s hash (None for a null key), remembered: a partition's records mostly repeat their keys."""
        return None if key is None else self.hash_of_key(key)

    def hash_of_key(self, key: bytes) -> int:
        """:meth:`hash_of` a key that is not null."""
        memo = self.hashes
        h = memo.get(key, -1)
        if h == -1:
            if len(memo) >= _HASH_MEMO_MAX:
                memo.clear()
            h = memo[key] = positive_hash(key)
        return h


@dataclass(slots=True)
class Filtered:
    """One partition's records after filtering, and how many were removed, by reason."""

    records: bytes | memoryview
    other_slice: int = 0
    committed: int = 0
    undecodable: int = 0
    changed: bool = False
    #: (a, b, epoch): offsets a..b-1 hold no record of the slice the member has yet to be handed (the batches
    #: there were read whole, and every record in them was of another slice or committed work), and ``epoch`` is
    #: the partition leader epoch of the batch holding offset b - 1 (-1: not known): see :mod:`.cursor`
    gaps: list[tuple[int, int, int]] = field(default_factory=list)


def filter_records(records: memoryview, s: Slice, table: DoneTable | None, cache: BatchCache,
                   topic: str | bytes, partition: int) -> Filtered:
    """``records`` (a partition's record set) for the member holding slice ``s`` with committed-work filter
    ``table``.

    A batch of one uncompressed record (a low-rate topic's: a batch per record) takes a path of its own, as it is
    most of the work where it occurs: its key is read in place (:func:`record_at`), its hash found in the cache's
    memo, the two kept for the partition's next member in a plain dict by base offset (:meth:`BatchCache.singles`:
    no decoded entry, no LRU upkeep), and a batch kept goes out as the bytes it came as: consecutive batches kept
    whole are one slice of ``records``, not a piece each."""
    out = Filtered(records)
    pieces: list[bytes | memoryview] = []
    #: the batches kept whole since the last piece: records[run_start:run_end], the last of them from last_start
    #: (-1: the last batch kept is pieces[-1], a batch written again)
    run_start = run_end = last_start = 0
    #: whether the last batch kept is a data batch that keeps records (one whose last offset may be moved)
    last_data = False
    #: the end of the batches left with no record since the last batch kept (see below), 0: none
    dropped = 0
    end = 0
    index, count = s.index, s.count
    whole_partition = count == 1
    ceiling = -1 if table is None else table.ceiling
    #: a whole partition's batches at or above the committed work go as they came: none is read
    in_place_below = ceiling if whole_partition else 1 << 63
    decoded = cache.decoded
    memo = cache.hashes
    hash_of_key = cache.hash_of_key
    seen = cache.singles(topic, partition)
    hits = misses = 0
    gaps = out.gaps
    other_slice = 0
    #: one past the last record handed to the member (None: not known, e.g. after a legacy entry)
    cursor: int | None = None
    last_next = -1
    #: the leader epochs of the current batch and of the one before it
    last_epoch = before = -1
    for h in iter_batches(records):
        start, next_end, base, _, epoch, magic, crc, attributes, last_delta, _, _, _, _, _, n = h
        if end:
            before = last_epoch
        elif magic >= MAGIC_V2:
            cursor = base
        end = next_end
        last_epoch = epoch
        last_next = base + last_delta + 1
        if n == 1 and not attributes & _NOT_IN_PLACE and base < in_place_below:  # (a legacy entry's count is -1)
            single = seen.get(base)
            if single is None or single[0] != crc:
                try:
                    offset, k = record_at(records, start, end, base, crc)
                except CodecError:
                    single = None
                else:
                    # a null key as hash 0: its slice is 0 (keys.py), as hash 0's is in every layout, and the
                    # committed-work filter reads it as 0 (DoneTable.done)
                    if k is None:
                        kh = 0
                    else:
                        kh = memo.get(k, -1)
                        if kh == -1:
                            kh = hash_of_key(k)
                    single = seen[base] = (crc, offset, kh)
                    misses += 1
            else:
                hits += 1
            if single is None:
                out.undecodable += 1
                data = False
                cursor = None
            else:
                _, offset, kh = single
                if (kh * count) >> 31 != index:
                    other_slice += 1
                    dropped = last_next
                    continue
                if table is not None and table.done(offset, kh):
                    out.committed += 1
                    dropped = last_next
                    continue
                if cursor is not None and offset > cursor:
                    gaps.append((cursor, offset, epoch if offset > base else before))
                cursor = offset + 1
                data = True
        elif magic >= MAGIC_V2 and attributes & CONTROL_MASK:
            data = False  # a transaction marker is no record a client is handed: the run goes on past it
        elif magic < MAGIC_V2 or (whole_partition and base >= ceiling):
            data = magic >= MAGIC_V2
            if cursor is not None and base > cursor:
                gaps.append((cursor, base, before))
            cursor = last_next if data else None
        else:
            data = True
            try:
                entry = decoded((topic, partition, base, crc), records, h)
            except CodecError:
                out.undecodable += 1
                data = False
                cursor = None
            else:
                offsets, hashes = entry.offsets, entry.hashes
                kept: list[int] = []
                for i, hv in enumerate(hashes):
                    if count > 1 and (index != 0 if hv is None else (hv * count) >> 31 != index):
                        other_slice += 1
                    elif table is not None and table.done(offsets[i], hv):
                        out.committed += 1
                    else:
                        kept.append(i)
                        if cursor is not None and offsets[i] > cursor:
                            gaps.append((cursor, offsets[i], epoch if offsets[i] > base else before))
                        cursor = offsets[i] + 1
                if not kept:
                    dropped = last_next
                    continue
                if len(kept) != len(hashes):
                    # written again with the records kept: the run so far, then this batch, is a piece each
                    if run_end > run_start:
                        pieces.append(records[run_start:run_end])
                    pieces.append(keep_records(entry.batch, kept))
                    run_start = run_end = end
                    last_start = -1
                    last_data = True
                    dropped = 0
                    continue
        # kept whole, as it came
        if start != run_end:  # a batch was left out before this one: the run so far is a piece
            if run_end > run_start:
                pieces.append(records[run_start:run_end])
            run_start = start
        run_end = end
        last_start = start
        last_data = data
        dropped = 0
    out.other_slice = other_slice
    if run_end > run_start:
        pieces.append(records[run_start:run_end])
    if dropped and pieces and last_data:
        # A batch left with no record is never sent: no client reads one as Kafka means it (kafka-go reads a record
        # from every batch whatever its count and jumps to an offset of its own, librdkafka finding no message in
        # a partition's records reports it too large to fetch). The last batch that keeps records is stretched
        # over the ones left out after it (its offset range only: the records stay), the shape compaction leaves,
        # from which every client fetches on past them; with no such batch before them, they are simply left out
        # and the member's next fetch starts past them (the read-ahead cursor, :mod:`.cursor`).
        if last_start < 0:
            pieces[-1] = extend_batch(pieces[-1], dropped)  # as filtered: its own record count
        else:
            last = extend_batch(records[last_start:run_end], dropped)
            if last_start > run_start:
                pieces[-1] = records[run_start:last_start]
                pieces.append(last)
            else:
                pieces[-1] = last
    if cursor is not None and last_next > cursor:
        # the filtered tail: the client fetches from the last batch's end next
        gaps.append((cursor, last_next, last_epoch))
    if other_slice or out.committed or end != len(records):
        # records left out (or a truncated trailing batch, dropped as clients drop it)
        out.changed = True
        out.records = pieces[0] if len(pieces) == 1 else b"".join(pieces)
    cache.report(hits, misses)
    return out
