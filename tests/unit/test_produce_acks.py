"""The Acks peek of Produce requests (proxy/wire/produce.py), for every layout: v0-2 (Acks first), v3-8
(int16-length TransactionalId, then Acks), v9+ (compact TransactionalId, then Acks), and truncated frames."""

from __future__ import annotations

import pytest

from proxy.wire.compiler import write_uvarint
from proxy.wire.errors import CodecError
from proxy.wire.messages import encode_request, peek_request_header, request_codec, request_spec
from proxy.wire.model import Message
from proxy.wire.produce import produce_acks
from tests.support.legacy_produce import produce_v0_2_frame

SPEC_VERSIONS = list(request_spec(0).valid)
#: null, empty, short, and long enough for a two-byte compact length (v9+)
TRANSACTIONAL_IDS = [None, "", "txn-1", "t" * 200]
ACKS = [0, 1, -1]


def spec_frame(version: int, acks: int, transactional_id: str | None) -> bytes:
    body = request_codec(0, version).default().replace(transactional_id=transactional_id, acks=acks,
                                                       timeout_ms=30_000)
    header = Message(request_api_key=0, request_api_version=version, correlation_id=3, client_id="c")
    return encode_request(header, body)


def acks_end(version: int, body_offset: int, transactional_id: str | None) -> int:
    """Where Acks ends in the frame, from the layout rules (not from the code under test)."""
    if version < 3:
        return body_offset + 2
    raw = None if transactional_id is None else transactional_id.encode()
    if version >= 9:
        txn = write_uvarint(0 if raw is None else len(raw) + 1) + (raw or b"")
    else:
        txn = b"\xff\xff" if raw is None else len(raw).to_bytes(2, "big") + raw
    return body_offset + len(txn) + 2


@pytest.mark.parametrize("version", SPEC_VERSIONS)
@pytest.mark.parametrize("acks", ACKS)
@pytest.mark.parametrize("transactional_id", TRANSACTIONAL_IDS)
def test_acks_in_every_spec_version(version: int, acks: int, transactional_id: str | None) -> None:
    frame = spec_frame(version, acks, transactional_id)
    assert produce_acks(frame, peek_request_header(frame)) == acks


@pytest.mark.parametrize("version", [0, 1, 2])
@pytest.mark.parametrize("acks", ACKS)
def test_acks_first_in_versions_0_to_2(version: int, acks: int) -> None:
    # TimeoutMs 30000 follows Acks: read with the v3+ layout, acks=-1 would give a null TransactionalId and
    # then acks=0 from the timeout's first two bytes, and the proxy would stop waiting for the response.
    frame = produce_v0_2_frame(version, acks, client_id="legacy")
    header = peek_request_header(frame)
    # located although the spec starts at v3: header v1 is api key, version, correlation id, client id
    assert header.body_offset == 2 + 2 + 4 + 2 + len("legacy")
    assert produce_acks(frame, header) == acks


CASES = [(v, None) for v in (0, 1, 2)] + [(v, t) for v in SPEC_VERSIONS for t in TRANSACTIONAL_IDS]


@pytest.mark.parametrize(("version", "transactional_id"), CASES)
def test_truncated_before_acks_is_a_codec_error(version: int, transactional_id: str | None) -> None:
    frame = produce_v0_2_frame(version, -1) if version < 3 else spec_frame(version, -1, transactional_id)
    header = peek_request_header(frame)
    assert header.body_offset is not None
    end = acks_end(version, header.body_offset, transactional_id)
    for cut in range(header.body_offset, end):
        with pytest.raises(CodecError, match="truncated ProduceRequest"):
            produce_acks(frame[:cut], header)
    assert produce_acks(frame[:end], header) == -1  # Acks complete: nothing after it is read


def test_transactional_id_longer_than_the_frame() -> None:
    frame = bytearray(spec_frame(3, 1, "abc"))
    header = peek_request_header(frame)
    assert header.body_offset is not None
    frame[header.body_offset : header.body_offset + 2] = (1000).to_bytes(2, "big")
    with pytest.raises(CodecError):
        produce_acks(frame, header)


def test_overlong_compact_length() -> None:
    frame = spec_frame(9, 1, None)
    header = peek_request_header(frame)
    assert header.body_offset is not None
    bad = frame[: header.body_offset] + b"\xff" * 5 + frame[header.body_offset + 1 :]
    with pytest.raises(CodecError, match="varint"):
        produce_acks(bad, header)


def test_body_not_located() -> None:
    frame = bytes.fromhex("0000 0063 00000001 ffff 0001".replace(" ", ""))  # Produce v99: layout unknown
    header = peek_request_header(frame)
    assert header.body_offset is None
    with pytest.raises(CodecError):
        produce_acks(frame, header)
