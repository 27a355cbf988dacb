"""Malformed input: every failure is one CodecError that says what, where and which api/version, and declared
lengths/counts are checked against the bytes left before anything is allocated (Kafka's "Tried to allocate a
collection of size N, but there are only M bytes remaining")."""

from __future__ import annotations

import struct

import pytest

from proxy.wire import fetch_fast
from proxy.wire.errors import CodecError
from proxy.wire.messages import (
    decode_request,
    decode_response,
    encode_request,
    encode_response,
    peek_request_header,
    request_codec,
    response_codec,
)
from proxy.wire.model import Message

INT32_MAX = 2**31 - 1


def header(api_key: int, version: int, client_id: str | None = "c") -> Message:
    return Message(request_api_key=api_key, request_api_version=version, correlation_id=7,
                   client_id=client_id)


def metadata_request(version: int, topics: list[str]) -> bytes:
    codec = request_codec(3, version)
    body = codec.default()
    body.topics = [Message(**{**codec.default_of("topics").fields(), "name": t}) for t in topics]
    return encode_request(header(3, version), body)


def fixed_header(api_key: int, version: int, client_id: bytes = b"c") -> bytes:
    """Request header v1 (the fixed part shared with v2)."""
    return struct.pack(">hhih", api_key, version, 7, len(client_id)) + client_id


# --------------------------------------------------------------------------------------------- api / version


def test_unknown_api() -> None:
    frame = fixed_header(9999, 0) + b"\x00\x00"
    with pytest.raises(CodecError) as e:
        decode_request(frame)
    assert e.value.api == 9999 and e.value.version == 0
    assert "unknown api key 9999" in str(e.value)
    with pytest.raises(CodecError, match="unknown api key"):
        decode_response(9999, 0, b"\x00\x00\x00\x07")
    peek = peek_request_header(frame)  # the header of an unknown API is still readable (to forward it)
    assert peek.api_key == 9999 and peek.body_offset is None


def test_version_outside_the_spec() -> None:
    frame = fixed_header(1, 3) + b"\x00" * 40  # Fetch v0-3 were removed in Kafka 4.0
    with pytest.raises(CodecError) as e:
        decode_request(frame)
    assert e.value.api == "FetchRequest" and e.value.version == 3
    with pytest.raises(CodecError) as e:
        fetch_fast.decode(b"\x00" * 16, 19)
    assert e.value.api == "FetchResponse" and e.value.version == 19


# --------------------------------------------------------------------------------------------- truncation


@pytest.mark.parametrize("version", [4, 9, 12])
def test_every_truncated_request_is_a_codec_error(version: int) -> None:
    frame = metadata_request(version, ["alpha", "beta"])
    assert decode_request(frame)[1].topics[1].name == "beta"
    for cut in range(len(frame)):
        with pytest.raises(CodecError) as e:
            decode_request(frame[:cut])
        if cut >= 10:  # past the fixed header: the API is known
            assert e.value.api is not None


@pytest.mark.parametrize("version", [4, 11, 12, 16])
def test_every_truncated_fetch_response_is_a_codec_error(version: int) -> None:
    codec = response_codec(1, version)
    msg = codec.default()
    topic = {"topic": "t"} if version < 13 else {"topic_id": b"\x01" * 16}
    part = codec.default_of("responses", "partitions")
    part.records = b"r" * 200
    part.aborted_transactions = [Message(producer_id=1, first_offset=2)]
    msg.responses = [Message(**topic, partitions=[part, part])]
    body = codec.encode(msg)
    frame = encode_response(1, version, Message(correlation_id=1), msg)
    for cut in range(len(body)):
        with pytest.raises(CodecError):
            codec.decode(body[:cut])
        with pytest.raises(CodecError) as e:
            fetch_fast.decode(memoryview(body)[:cut], version)
        assert e.value.api == "FetchResponse" and e.value.version == version
    for cut in range(len(frame)):
        with pytest.raises(CodecError):
            decode_response(1, version, frame[:cut])
        with pytest.raises(CodecError):
            fetch_fast.decode_frame(frame[:cut], version)


def test_trailing_bytes() -> None:
    frame = metadata_request(12, ["a"])
    with pytest.raises(CodecError, match="trailing"):
        decode_request(frame + b"\x00")
    body = response_codec(1, 12).encode(response_codec(1, 12).default())
    with pytest.raises(CodecError, match="trailing"):
        fetch_fast.decode(body + b"\x00", 12)


# --------------------------------------------------------------------------------------------- huge
# declarations


def test_int32_array_count_rejected_before_allocation() -> None:
    # Metadata v4 (not flexible): Topics is an int32-counted nullable array, then AllowAutoTopicCreation
    frame = fixed_header(3, 4) + struct.pack(">i", INT32_MAX) + b"\x01"
    with pytest.raises(CodecError) as e:
        decode_request(frame)
    assert "array count 2147483647 exceeds" in str(e.value)
    assert e.value.api == "MetadataRequest" and e.value.version == 4


def test_compact_array_count_rejected_before_allocation() -> None:
    # Metadata v12 (flexible): header v2 = fixed part + empty tag section; Topics is a compact array
    frame = fixed_header(3, 12) + b"\x00" + b"\xff\xff\xff\xff\x07"  # uvarint 2**31-1 -> count 2**31-2
    with pytest.raises(CodecError, match="array count 2147483646 exceeds"):
        decode_request(frame)


def test_string_and_bytes_lengths_rejected_before_allocation() -> None:
    # JoinGroup v5: GroupId string int16 length 32767 with 3 bytes left
    frame = fixed_header(11, 5) + struct.pack(">h", 32767) + b"abc"
    with pytest.raises(CodecError, match="declared length 32767 exceeds"):
        decode_request(frame)
    # Fetch response v4: Records length 2**31-1
    body = struct.pack(">ii", 0, 1) + struct.pack(">h", 1) + b"t" + struct.pack(">i", 1)
    body += struct.pack(">ihqqi", 0, 0, 0, 0, -1) + struct.pack(">i", INT32_MAX) + b"xyz"
    with pytest.raises(CodecError, match="declared length 2147483647 exceeds"):
        response_codec(1, 4).decode(body)
    with pytest.raises(CodecError, match="declared length 2147483647 exceeds"):
        fetch_fast.decode(body, 4)


def test_fast_path_huge_counts() -> None:
    for version in (4, 12):
        top = struct.pack(">ii", 0, INT32_MAX) if version < 7 else None
        if version >= 12:
            top = struct.pack(">ihi", 0, 0, 0) + b"\xff\xff\xff\xff\x07"
        assert top is not None
        with pytest.raises(CodecError, match="array count"):
            fetch_fast.decode(top, version)


def test_tagged_field_size_rejected() -> None:
    # ResponseHeader v1 then a Fetch v12 body whose top-level tag section declares a 1000-byte field
    codec = response_codec(1, 12)
    body = bytearray(codec.encode(codec.default()))
    assert body[-1] == 0
    body[-1:] = b"\x01\x05\xe8\x07abc"  # 1 tagged field, tag 5, size 1000, 3 bytes
    with pytest.raises(CodecError, match="size 1000 exceeds"):
        codec.decode(bytes(body))
    with pytest.raises(CodecError, match="size 1000 exceeds"):
        fetch_fast.decode(bytes(body), 12)


def test_tagged_fields_out_of_order() -> None:
    codec = response_codec(1, 12)
    body = bytearray(codec.encode(codec.default()))
    body[-1:] = b"\x02\x05\x01a\x03\x01b"
    with pytest.raises(CodecError, match="out of order"):
        codec.decode(bytes(body))
    with pytest.raises(CodecError, match="out of order"):
        fetch_fast.decode(bytes(body), 12)


# --------------------------------------------------------------------------------------------- primitives


def test_varint_longer_than_five_bytes() -> None:
    frame = fixed_header(3, 12) + b"\x00" + b"\xff\xff\xff\xff\xff\x01"
    with pytest.raises(CodecError, match="varint longer than 5 bytes"):
        decode_request(frame)
    codec = response_codec(1, 12)
    body = codec.encode(codec.default())[:-2] + b"\xff\xff\xff\xff\xff\x01\x00"
    with pytest.raises(CodecError, match="varint"):
        fetch_fast.decode(body, 12)


def test_truncated_varint() -> None:
    frame = fixed_header(3, 12) + b"\x00" + b"\x80"
    with pytest.raises(CodecError, match="truncated varint"):
        decode_request(frame)


def test_invalid_utf8() -> None:
    with pytest.raises(CodecError, match="UTF-8") as e:
        decode_request(fixed_header(3, 4, client_id=b"\xff\xfe"))
    assert e.value.api == 3
    frame = fixed_header(3, 4) + struct.pack(">ih", 1, 2) + b"\xc3\x28" + b"\x01"
    with pytest.raises(CodecError, match="invalid UTF-8") as e:
        decode_request(frame)
    assert e.value.api == "MetadataRequest"
    body = struct.pack(">ii", 0, 1) + struct.pack(">h", 2) + b"\xc3\x28" + struct.pack(">i", 0)
    with pytest.raises(CodecError, match="UTF-8"):
        fetch_fast.decode(body, 4)


def test_null_where_not_nullable() -> None:
    # JoinGroup v5 GroupId is not nullable
    with pytest.raises(CodecError, match="null not allowed"):
        decode_request(fixed_header(11, 5) + struct.pack(">h", -1))
    # a length below -1 is never valid
    with pytest.raises(CodecError, match="length -2"):
        decode_request(fixed_header(11, 5) + struct.pack(">h", -2))
    with pytest.raises(CodecError, match="null"):
        fetch_fast.decode(struct.pack(">ii", 0, 1) + struct.pack(">h", -1), 4)


def test_encode_errors_are_codec_errors() -> None:
    codec = response_codec(18, 3)
    msg = codec.default()
    msg.error_code = 70000  # int16
    with pytest.raises(CodecError, match="int16") as e:
        codec.encode(msg)
    assert e.value.api == "ApiVersionsResponse" and e.value.version == 3
    msg.error_code = "zero"
    with pytest.raises(CodecError):
        codec.encode(msg)
    view = fetch_fast.FetchResponseView(12, topics=[fetch_fast.FetchTopic("t", partitions=[
        fetch_fast.FetchPartition(2**40)])])
    with pytest.raises(CodecError, match="cannot encode"):
        view.encode()


def test_codec_error_is_a_value_error_with_location() -> None:
    err = CodecError("bad", where=3).located(api="X", version=2)
    assert isinstance(err, ValueError)
    assert (err.what, err.where, err.api, err.version) == ("bad", 3, "X", 2)
    assert str(err) == "bad api=X v2 at 3"
