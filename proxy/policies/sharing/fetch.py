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
dropped, as clients drop it.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from ...wire.errors import CodecError
from ...wire.record_filter import ParsedBatch, keep_records, parse_batch
from ...wire.records import iter_batches
from .frontier import DoneTable
from .keys import Slice, key_hash

#: (topic name or id, partition, base offset, CRC): a batch's identity in the cache
BatchKey = tuple[str | bytes, int, int, int]
#: distinct keys whose hash is remembered (records of a partition mostly repeat their keys)
_HASH_MEMO_MAX = 1 << 16


@dataclass(slots=True)
class Decoded:
    batch: ParsedBatch
    hashes: list[int | None]
    size: int


class BatchCache:
    """Decoded batches (with their records' key hashes), least recently used evicted past ``max_bytes``."""

    def __init__(self, max_bytes: int, on_change: Callable[[int], None] | None = None,
                 on_lookup: Callable[[bool], None] | None = None) -> None:
        self.max_bytes = max_bytes
        self.bytes = 0
        self._entries: OrderedDict[BatchKey, Decoded] = OrderedDict()
        self._hashes: dict[bytes, int | None] = {}
        self._on_change = on_change
        self._on_lookup = on_lookup

    def __len__(self) -> int:
        return len(self._entries)

    def decoded(self, key: BatchKey, view: memoryview) -> Decoded:
        """The batch at ``view`` decoded, from the cache or now (CodecError if it cannot be)."""
        entry = self._entries.get(key)
        if entry is not None:
            self._entries.move_to_end(key)
            if self._on_lookup is not None:
                self._on_lookup(True)
            return entry
        if self._on_lookup is not None:
            self._on_lookup(False)
        batch = parse_batch(view)
        entry = Decoded(batch, [self._hash(k) for k in batch.keys], batch.size)
        if self.max_bytes and entry.size <= self.max_bytes:
            self._entries[key] = entry
            self.bytes += entry.size
            while self.bytes > self.max_bytes:
                _, old = self._entries.popitem(last=False)
                self.bytes -= old.size
            if self._on_change is not None:
                self._on_change(self.bytes)
        return entry

    def _hash(self, key: bytes | None) -> int | None:
        if key is None:
            return None
        memo = self._hashes
        h = memo.get(key, -1)
        if h == -1:
            if len(memo) >= _HASH_MEMO_MAX:
                memo.clear()
            h = memo[key] = key_hash(key)
        return h


@dataclass(slots=True)
class Filtered:
    """One partition's records after filtering, and how many were removed, by reason."""

    records: bytes | memoryview
    other_slice: int = 0
    committed: int = 0
    undecodable: int = 0
    changed: bool = False


def filter_records(records: memoryview, s: Slice, table: DoneTable | None, cache: BatchCache,
                   topic: str | bytes, partition: int) -> Filtered:
    """``records`` (a partition's record set) for the member holding slice ``s`` with committed-work filter
    ``table``."""
    out = Filtered(records)
    pieces: list[bytes | memoryview] = []
    end = 0
    index, count = s.index, s.count
    for h in iter_batches(records):
        end = h.end
        view = records[h.start : h.end]
        if h.is_legacy or h.is_control or (count == 1 and (table is None or h.base_offset >= table.ceiling)):
            pieces.append(view)
            continue
        try:
            entry = cache.decoded((topic, partition, h.base_offset, h.crc), view)
        except CodecError:
            out.undecodable += 1
            pieces.append(view)
            continue
        offsets, hashes = entry.batch.offsets, entry.hashes
        kept: list[int] = []
        for i, hv in enumerate(hashes):
            if count > 1 and (index != 0 if hv is None else (hv * count) >> 31 != index):
                out.other_slice += 1
            elif table is not None and table.done(offsets[i], hv):
                out.committed += 1
            else:
                kept.append(i)
        if len(kept) == len(hashes):
            pieces.append(view)
        else:
            pieces.append(keep_records(entry.batch, kept))
            out.changed = True
    if end != len(records):
        out.changed = True  # a truncated trailing batch: dropped, as clients drop it
    if out.changed:
        out.records = b"".join(pieces)
    return out
