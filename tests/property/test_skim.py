"""The generated skim (proxy/wire/skim.py) against the codec, for every flexible response (spec, version) Sluice
decodes: it finds the top-level tag section exactly where the encoding puts it (the section runs to the end of the
body, and it is empty exactly when nothing tagged is written at the top level); a body cut short is a CodecError,
never a position taken from bytes that are not there."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy.wire.compiler import compiled_for, skip_tags
from proxy.wire.errors import CodecError
from proxy.wire.model import Message
from proxy.wire.schema import MessageSpec
from proxy.wire.skim import top_level_tags_locator
from rig.specgen import all_cases, message_strategy

CASES = [(name, spec, v) for name, spec, v in all_cases() if name.endswith("Response") and v in spec.flexible]
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
