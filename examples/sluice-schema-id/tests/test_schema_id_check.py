"""The record check alone (sluice_schema_id.check): Confluent's wire format read from batches as producers write
them, compressed or not, and what a refused partition's answer says (KIP-467)."""

from __future__ import annotations

import pytest
from sluice_schema_id.check import CORRUPT_MESSAGE, INVALID_RECORD, Rule, refusal

from proxy.wire.records import (
    ATTRIBUTES_OFFSET,
    COMPRESSION_GZIP,
    COMPRESSION_LZ4,
    COMPRESSION_NONE,
    COMPRESSION_SNAPPY,
    COMPRESSION_ZSTD,
    CRC_OFFSET,
    Record,
    batch_crc,
    encode_batch,
    new_batch,
)

ANY = Rule("orders", keys=False, schema_ids=frozenset())


def framed(schema_id: int, payload: bytes = b"{}") -> bytes:
    """A key or value as Schema Registry's serializers write it: magic byte 0, the 4-byte id, the data."""
    return b"\x00" + schema_id.to_bytes(4, "big") + payload


def batch(*records: tuple[bytes | None, bytes | None], compression: int = COMPRESSION_NONE) -> bytes:
    """One v2 batch of (key, value) records."""
    return encode_batch(new_batch([Record(offset_delta=i, key=k, value=v) for i, (k, v) in enumerate(records)],
                                  compression=compression))


@pytest.mark.parametrize("compression", [COMPRESSION_NONE, COMPRESSION_GZIP, COMPRESSION_SNAPPY, COMPRESSION_LZ4,
                                         COMPRESSION_ZSTD])
def test_records_are_read_whatever_the_compression(compression: int) -> None:
    good = batch((b"k", framed(1)), (None, framed(2)), compression=compression)
    assert refusal(good, ANY) is None
    bad = batch((b"k", framed(1)), (b"k", b'{"no": "id"}'), (b"k", framed(3)), (b"k", b"\x00\x00"),
                compression=compression)
    why = refusal(bad, ANY)
    assert why is not None
    assert (why.error_code, why.records) == (INVALID_RECORD, 4)
    assert why.record_errors == ((1, "the value does not start with a schema id (magic byte 0, 4-byte id)"),
                                 (3, "the value does not start with a schema id (magic byte 0, 4-byte id)"))
    assert why.message == ("2 record(s) without a schema id the topic accepts (the value does not start with a "
                           "schema id (magic byte 0, 4-byte id); Sluice [schema_id] 'orders'): the batch is refused")


def test_tombstones_and_missing_records_pass() -> None:
    assert refusal(batch((b"plain-key", None)), ANY) is None
    assert refusal(batch((framed(1), None), (None, None)), Rule("t", keys=True, schema_ids=frozenset({1}))) is None
    assert refusal(None, ANY) is None
    assert refusal(b"", ANY) is None


def test_keys_are_checked_only_when_asked_and_null_keys_pass() -> None:
    records = batch((b"plain-key", framed(1)), (None, framed(1)), (framed(1), framed(1)))
    assert refusal(records, ANY) is None
    why = refusal(records, Rule("t", keys=True, schema_ids=frozenset()))
    assert why is not None and why.record_errors == (
        (0, "the key does not start with a schema id (magic byte 0, 4-byte id)"),)


def test_only_the_accepted_ids_pass() -> None:
    rule = Rule("t", keys=True, schema_ids=frozenset({7, 8}))
    assert refusal(batch((framed(8), framed(7))), rule) is None
    why = refusal(batch((framed(7), framed(9)), (framed(1), framed(8))), rule)
    assert why is not None and why.record_errors == (
        (0, "the value's schema id 9 is not one the topic accepts"),
        (1, "the key's schema id 1 is not one the topic accepts"))


def test_a_batch_that_cannot_be_read_is_refused_not_let_through() -> None:
    damaged = bytearray(batch((None, framed(1)), compression=COMPRESSION_GZIP))
    damaged[CRC_OFFSET] ^= 0xFF  # what the broker answers CORRUPT_MESSAGE (retriable: damaged on the way)
    why = refusal(bytes(damaged), ANY)
    assert why is not None and (why.error_code, why.records, why.record_errors) == (CORRUPT_MESSAGE, 1, ())
    # marked gzip, its records plain, its CRC right: nothing can read it, so nothing is checked and it is refused
    forged = bytearray(batch((None, framed(1))))
    forged[ATTRIBUTES_OFFSET + 1] |= COMPRESSION_GZIP
    forged[CRC_OFFSET : CRC_OFFSET + 4] = batch_crc(forged).to_bytes(4, "big")
    why = refusal(bytes(forged), ANY)
    assert why is not None and (why.error_code, why.records, why.record_errors) == (INVALID_RECORD, 1, ())
    assert why.message.startswith("the records could not be read, so not checked: ")
