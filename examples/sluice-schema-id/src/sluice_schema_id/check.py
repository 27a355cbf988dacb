"""Whether one partition's records in a Produce request carry Schema Registry schema ids: a pure function of the
record bytes and the topic's rule.

Confluent's wire format: a serialized key or value starts with the magic byte 0 and the schema id as a 4-byte
big-endian int (Schema Registry's "Wire format"). What fails, and what the answer says, follow Kafka's broker-side
validation (KIP-467): a record that fails makes its whole batch fail (nothing of it is written), the answer names
each such record by its index in the batch (``RecordErrors``) and sums them up (``ErrorMessage``). A null key or
value (a tombstone) passes, as Confluent's schema ID validation lets it.

The batches are read with Sluice's own reader (:func:`proxy.wire.records.decode_batches`: every compression Kafka
has). A batch whose CRC does not match is answered ``CORRUPT_MESSAGE``, the broker's answer for it (KIP-467: CRC
failures keep that retriable code); one that cannot be read otherwise (records or compression malformed, over the
decompression bound) is refused rather than let through unchecked.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from proxy.wire.errors import CodecError
from proxy.wire.records import MAGIC_V2, batch_crc, decode_batch, iter_batches

#: Kafka's error codes (clients' Errors.java): the batch failed the broker's validation (KIP-467); its CRC does not
#: match (retriable: the bytes may have been damaged on the way)
INVALID_RECORD, CORRUPT_MESSAGE = 87, 2

#: Schema Registry's wire format: magic byte 0, then the schema id (int32, big-endian)
MAGIC_BYTE = 0
_PREFIX = struct.Struct(">bi")


@dataclass(frozen=True, slots=True)
class Rule:
    """A ``[[schema_id.topics]]`` entry as the check uses it."""

    #: the entry's topic as configured (a name or a glob): the metric's label, so its values are bounded by the
    #: configuration, not by the topics a glob matches
    entry: str
    keys: bool
    #: the ids accepted; empty = any
    schema_ids: frozenset[int]


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why one partition's records are refused: what its ProduceResponse partition says."""

    error_code: int
    #: records the partition's batches hold (none of them is written)
    records: int
    #: (index in the batch, why) of each record that made its batch fail
    record_errors: tuple[tuple[int, str], ...]
    message: str


def _problem(part: str, data: bytes | None, accepted: frozenset[int]) -> str | None:
    if data is None:
        return None
    if len(data) < _PREFIX.size or data[0] != MAGIC_BYTE:
        return f"the {part} does not start with a schema id (magic byte 0, 4-byte id)"
    schema_id = _PREFIX.unpack_from(data)[1]
    if accepted and schema_id not in accepted:
        return f"the {part}'s schema id {schema_id} is not one the topic accepts"
    return None


def refusal(records: bytes | None, rule: Rule) -> Refusal | None:
    """None if every record of ``records`` (a partition's record set; None = no records) carries an accepted
    schema id, else why the partition is refused."""
    if not records:
        return None
    view = memoryview(records)
    errors: list[tuple[int, str]] = []
    count = 0
    try:
        batches = list(iter_batches(view))
        count = sum(max(b.records_count, 0) for b in batches)  # -1 for a legacy (magic 0/1) entry: unknown
        for header in batches:
            batch = view[header.start : header.end]
            if header.magic == MAGIC_V2 and batch_crc(batch) != header.crc:
                return Refusal(CORRUPT_MESSAGE, count, (), "a record batch's CRC does not match its bytes")
            for index, record in enumerate(decode_batch(batch, verify_crc=False).records):
                problem = _problem("value", record.value, rule.schema_ids)
                if problem is None and rule.keys:
                    problem = _problem("key", record.key, rule.schema_ids)
                if problem is not None:
                    errors.append((index, problem))
    except CodecError as e:
        return Refusal(INVALID_RECORD, count, (), f"the records could not be read, so not checked: {e}")
    if not errors:
        return None
    return Refusal(INVALID_RECORD, count, tuple(errors),
                   f"{len(errors)} record(s) without a schema id the topic accepts ({errors[0][1]}; Sluice "
                   f"[schema_id] {rule.entry!r}): the batch is refused")
