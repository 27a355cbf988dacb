"""The generated skim (proxy/wire/skim.py) against the codec, for every flexible response (spec, version) Sluice
decodes: it finds the top-level tag section exactly where the encoding puts it (the section runs to the end of the
body, and it is empty exactly when nothing tagged is written at the top level); a body cut short is a CodecError,
never a position taken from bytes that are not there."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy.wire.compiler import compiled_for, skip_tags
from proxy.wire.errors import CodecError
from proxy.wire.messages import header_v1_body_offset
from proxy.wire.model import Message
from proxy.wire.schema import MessageSpec
from proxy.wire.skim import MAX_POSITIONS, shape_memo, top_level_tags_empty, top_level_tags_locator
from rig.specgen import all_cases, message_strategy

CASES = [(name, spec, v) for name, spec, v in all_cases() if name.endswith("Response") and v in spec.flexible]
#: a response frame's first bytes before its body: correlation id 7, response header v1's empty tag section
HEADER = b"\x00\x00\x00\x07\x00"
SETTINGS = settings(max_examples=40, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def _top_untagged(spec: MessageSpec, version: int, msg: Message) -> Message:
    """``msg`` with its top-level tagged fields left out (encoded at their defaults: not written) and no unknown
    top-level tags."""
    tagged = {f.name for f in spec.fields if version in f.versions and version in f.tagged}
    return Message(**{k: v for k, v in msg.fields().items() if k not in tagged and k != "unknown_tags"})


def test_every_flexible_response_is_covered() -> None:
    names = {(name, v) for name, _, v in CASES}
    assert ("ProduceResponse", 10) in names and ("ConsumerGroupHeartbeatResponse", 0) in names


@pytest.mark.parametrize(("name", "spec", "version"), CASES, ids=[f"{n}-v{v}" for n, _, v in CASES])
def test_the_top_level_tag_section_is_found(name: str, spec: MessageSpec, version: int) -> None:
    codec = compiled_for(spec, version)
    locate = top_level_tags_locator(spec, version)
    # half the examples without unknown tags, so that empty top-level sections are common
    quiet = message_strategy(spec, version, unknown=False)

    @SETTINGS
    @given(st.one_of(message_strategy(spec, version), quiet), st.data())
    def run(msg: Message, data: st.DataObject) -> None:
        body = codec.encode(msg)
        view = memoryview(body)
        at = locate(view, 0)
        assert skip_tags(view, at) == len(body)
        untagged = codec.encode(_top_untagged(spec, version, msg))
        assert (body[at] == 0) is (untagged == body)
        cut = data.draw(st.integers(0, at))
        with pytest.raises(CodecError):
            locate(view[:cut], 0)

    run()


def test_a_produce_response_with_and_without_node_endpoints() -> None:
    """ProduceResponse v10 (KIP-951): a partition's CurrentLeader (a nested tagged field) is stepped over;
    NodeEndpoints makes the top-level section non-empty."""
    spec, version = next((s, v) for n, s, v in CASES if n == "ProduceResponse" and v == 10)
    codec, locate = compiled_for(spec, version), top_level_tags_locator(spec, version)

    def body(partition: dict[str, Any], **top: Any) -> memoryview:
        p = Message(index=0, error_code=6, base_offset=7, log_append_time_ms=-1, log_start_offset=0,
                    record_errors=[], error_message=None, **partition)
        return memoryview(codec.encode(Message(responses=[Message(name="t", partition_responses=[p])],
                                               throttle_time_ms=0, **top)))

    leader = {"current_leader": Message(leader_id=2, leader_epoch=5)}
    assert body({})[locate(body({}), 0)] == 0
    assert body(leader)[locate(body(leader), 0)] == 0
    moved = body(leader, node_endpoints=[Message(node_id=2, host="b2", port=9092, rack=None)])
    assert moved[locate(moved, 0)] != 0


def _outcome(skim: Callable[[bytes], bool], frame: bytes) -> bool | str:
    try:
        return skim(frame)
    except CodecError:
        return "malformed"


@pytest.mark.parametrize(("name", "spec", "version"), CASES, ids=[f"{n}-v{v}" for n, _, v in CASES])
def test_the_shape_memo_answers_as_the_skim(name: str, spec: MessageSpec, version: int) -> None:
    """shape_memo (what every producer's round trip runs) against the skim itself, over frames of one length:
    the same frame again (answered from its kept shape), then the frame with a byte changed (a count, a length or
    a tag marker: another shape or a malformed frame; an offset or a time: the same shape), then cut short. Every
    answer, and every CodecError, is the skim's."""
    codec = compiled_for(spec, version)
    skim = top_level_tags_empty(spec, version, partial(header_v1_body_offset, 0, version))
    quiet = message_strategy(spec, version, unknown=False)

    @SETTINGS
    @given(st.one_of(message_strategy(spec, version), quiet), st.data())
    def run(msg: Message, data: st.DataObject) -> None:
        frame = HEADER + codec.encode(msg)
        memo = shape_memo(skim)
        frames = [frame, frame, frame]
        for _ in range(6):
            changed = bytearray(frame)
            at = data.draw(st.integers(0, len(frame) - 1))
            changed[at] = data.draw(st.integers(0, 255))
            frames += [bytes(changed), bytes(changed), frame]
        frames.append(frame[: data.draw(st.integers(0, len(frame) - 1))])
        for f in frames:
            assert _outcome(memo, f) == _outcome(skim, f)

    run()


PRODUCE_V11 = next((s, v) for n, s, v in CASES if n == "ProduceResponse" and v == 11)


def _produce_response(partitions: int, offset: int = 0) -> bytes:
    """A ProduceResponse v11 frame (no size prefix) of ``partitions`` partitions of one topic, none in error."""
    spec, version = PRODUCE_V11
    parts = [Message(index=i, error_code=0, base_offset=offset, log_append_time_ms=-1, log_start_offset=0,
                     record_errors=[], error_message=None) for i in range(partitions)]
    return HEADER + compiled_for(spec, version).encode(
        Message(responses=[Message(name="t", partition_responses=parts)], throttle_time_ms=0))


def _counted_memo() -> tuple[Callable[[bytes], bool], list[int]]:
    """ProduceResponse v11's skim behind shape_memo, and the lengths of the frames the skim itself was run on."""
    spec, version = PRODUCE_V11
    skim = top_level_tags_empty(spec, version, partial(header_v1_body_offset, 0, version))
    skimmed: list[int] = []

    def counted(frame: bytes | bytearray | memoryview) -> bool:
        skimmed.append(len(frame))
        return skim(frame)

    return shape_memo(counted), skimmed


def test_the_shape_memo_keeps_a_shape_it_has_seen_twice() -> None:
    """The memo's point: a Produce response of a shape seen before is answered without skimming it again."""
    memo, skimmed = _counted_memo()
    assert [memo(_produce_response(1, offset=o)) for o in range(10)] == [True] * 10
    # the first frame skimmed; the second skimmed again and its shape noted; the other eight answered from it
    assert len(skimmed) == 3


def test_a_shape_too_large_to_keep_is_noted_once() -> None:
    """A response of more partitions than a shape keeps (MAX_POSITIONS) is skimmed as without the memo: its shape
    is noted once, not at every response of its length."""
    memo, skimmed = _counted_memo()
    frame = _produce_response(MAX_POSITIONS)
    assert [memo(frame) for _ in range(5)] == [True] * 5
    # skimmed once, then again with its reads noted (too many: not kept), then once a frame
    assert len(skimmed) == 6
