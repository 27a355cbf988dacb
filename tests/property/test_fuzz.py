"""Fuzzing: valid frames, mutated (bit flips, truncation, insertion, deletion, length fields set huge), fed to
every decoder. Only CodecError may escape — never IndexError, struct.error, MemoryError, UnicodeError — and
nothing hangs. Seeds are spec-generated frames for every request/response (api, version) Sluice decodes, Fetch
response bodies for the fast path, and record batches in every compression.

Golden frames captured from real clients and a real broker (tests/data/golden) are mutated too. Bounded: a
fixed number of examples per target (the whole file runs in well under 30 s).
"""

from __future__ import annotations

import re
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy.wire import fetch_fast
from proxy.wire.errors import CodecError
from proxy.wire.messages import (
    api_name,
    decode_request,
    decode_response,
    encode_request,
    encode_response,
    known_api,
    response_codec,
    response_spec,
)
from proxy.wire.model import Message
from proxy.wire.records import (
    CONTROL_MASK,
    TRANSACTIONAL_MASK,
    Record,
    decode_batches,
    encode_batch,
    new_batch,
    walk_batches,
)
from rig.fetch_oracle import to_message
from rig.fuzz_targets import mutated
from rig.specgen import all_cases, message_strategy

FUZZ = settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
)

_CASES = all_cases()
REQUESTS = [(spec, v) for name, spec, v in _CASES if spec.kind == "request"]
RESPONSES = [(spec, v) for name, spec, v in _CASES if spec.kind == "response"]

def _request_frame(data: st.DataObject) -> bytes:
    spec, version = data.draw(st.sampled_from(REQUESTS))
    body = data.draw(message_strategy(spec, version))
    header = Message(request_api_key=spec.api_key, request_api_version=version, correlation_id=1,
                     client_id=data.draw(st.one_of(st.none(), st.text(max_size=5))))
    return encode_request(header, body)


@FUZZ
@given(st.data())
def test_fuzz_requests(data: st.DataObject) -> None:
    frame = data.draw(mutated(_request_frame(data)))
    try:
        decode_request(frame)
    except CodecError:
        pass


@FUZZ
@given(st.data())
def test_fuzz_responses(data: st.DataObject) -> None:
    spec, version = data.draw(st.sampled_from(RESPONSES))
    assert spec.api_key is not None
    body = data.draw(message_strategy(spec, version))
    frame = data.draw(mutated(encode_response(spec.api_key, version, Message(correlation_id=1), body)))
    try:
        decode_response(spec.api_key, version, frame)
    except CodecError:
        pass


@FUZZ
@given(st.data())
def test_fuzz_fetch_fast_path(data: st.DataObject) -> None:
    version = data.draw(st.integers(4, 18))
    body = response_codec(1, version).encode(data.draw(message_strategy(response_spec(1), version)))
    fuzzed = data.draw(mutated(body))
    try:
        view = fetch_fast.decode(fuzzed, version)
    except CodecError:
        return
    # what decodes must also re-encode, and convert, without anything but CodecError
    try:
        view.encode()
        to_message(view)
    except CodecError:
        pass
    try:
        fetch_fast.decode_frame(fuzzed, version)
    except CodecError:
        pass


def _record_set(data: st.DataObject) -> bytes:
    out = b""
    for i in range(data.draw(st.integers(1, 3))):
        records = [Record(j, j, data.draw(st.one_of(st.none(), st.binary(max_size=6))),
                          data.draw(st.binary(max_size=40)), [("h", b"v")] if j % 2 else [])
                   for j in range(data.draw(st.integers(0, 4)))]
        attrs = data.draw(st.sampled_from([0, TRANSACTIONAL_MASK, CONTROL_MASK | TRANSACTIONAL_MASK]))
        out += encode_batch(new_batch(records, base_offset=i * 10, compression=data.draw(st.integers(0, 4)),
                                      attributes=attrs))
    return out


@FUZZ
@given(st.data())
def test_fuzz_records(data: st.DataObject) -> None:
    fuzzed = data.draw(mutated(_record_set(data)))
    for verify in (True, False):  # without the CRC check the mutation reaches decompression and records
        try:
            walk_batches(fuzzed)
            decode_batches(fuzzed, verify_crc=verify, max_decompressed=1 << 20)
        except CodecError:
            pass


GOLDEN = sorted((Path(__file__).resolve().parents[1] / "data" / "golden").glob("*.bin"))
_NAME = re.compile(r"(?P<api>\w+)-v(?P<version>\d+)-(?P<direction>request|response)-\d+\.bin")
_KEYS = {api_name(k): k for k in range(100) if known_api(k)}


@FUZZ
@given(st.data())
def test_fuzz_golden_frames(data: st.DataObject) -> None:
    """Frames captured from real clients and a real broker (tests/data/golden), mutated."""
    path = data.draw(st.sampled_from(GOLDEN))
    m = _NAME.fullmatch(path.name)
    assert m is not None
    key, version = _KEYS[m["api"]], int(m["version"])
    frame = data.draw(mutated(path.read_bytes()))
    try:
        if m["direction"] == "request":
            decode_request(frame)
        else:
            decode_response(key, version, frame)
    except CodecError:
        pass
    if key == 1 and m["direction"] == "response":
        try:
            _, _, view = fetch_fast.decode_frame(frame, version)
            for _, p in view.partitions():
                if p.records is not None:
                    decode_batches(p.records, verify_crc=False, max_decompressed=1 << 20)
        except CodecError:
            pass
