"""The policy in Sluice's chain (rig/chain_rig.py: the chain a proxy builds, no sockets), composed with Sluice's own
policies as its entry point composes it: what goes upstream, what the client is answered, per partition as Kafka
answers (KIP-467), and that installed without topics it changes nothing."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sluice_schema_id import REGISTRATION
from sluice_schema_id.check import INVALID_RECORD

from proxy.app import chain_of, load_settings
from proxy.config import ConfigError, compose
from proxy.core.exchange import Exchange, Rejected, Relayed
from proxy.core.policy import versions_read
from proxy.wire.api_keys import ApiKey
from proxy.wire.errors import CodecError
from proxy.wire.messages import (
    decode_request,
    decode_response,
    encode_response,
    request_codec,
    request_spec,
    response_codec,
    response_spec,
)
from proxy.wire.model import Message
from proxy.wire.records import Record, encode_batch, new_batch
from rig.chain_rig import SansIOProxy
from rig.core_rig import request, response
from rig.specgen import message_strategy
from tests.support.legacy_produce import produce_v0_2_frame

Settings = compose(chain_of((REGISTRATION,)))  # the registry with the package installed
PRODUCE = ApiKey.PRODUCE
TOPICS = [{"topic": "orders"}, {"topic": "orders-*", "keys": True}]
NO_ID = "the value does not start with a schema id (magic byte 0, 4-byte id)"


def proxy(topics: list[dict[str, object]] | None = None) -> SansIOProxy:
    return SansIOProxy({"schema_id.topics": TOPICS if topics is None else topics}, model=Settings)


def records(*values: bytes) -> bytes:
    return encode_batch(new_batch([Record(offset_delta=i, key=b"\x00\x00\x00\x00\x02k", value=v)
                                   for i, v in enumerate(values)]))


GOOD, BAD = records(b"\x00\x00\x00\x00\x01{}"), records(b"\x00\x00\x00\x00\x01{}", b"{}")


def produce(version: int, topics: dict[str, dict[int, bytes]], acks: int = -1) -> bytes:
    body = request_codec(PRODUCE, version).default().replace(acks=acks, timeout_ms=30_000, topic_data=[
        Message(name=name, partition_data=[Message(index=i, records=r) for i, r in parts.items()])
        for name, parts in topics.items()])
    return request(PRODUCE, version, 41, body)


def answered(ex: Exchange) -> dict[tuple[str, int], Message]:
    """Sluice's own answer to ``ex``, by partition."""
    assert ex.answer is not None
    _, body = decode_response(PRODUCE, ex.header.api_version, ex.answer[4:])
    return {(t.name, p.index): p for t in body.responses for p in t.partition_responses}


def refused(partition: int, batch_index: int = 1) -> Message:
    return Message(index=partition, error_code=INVALID_RECORD, base_offset=-1, log_append_time_ms=-1,
                   log_start_offset=-1, record_errors=[Message(batch_index=batch_index,
                                                               batch_index_error_message=NO_ID)])


def test_installed_without_topics_it_changes_nothing() -> None:
    off, plain = SansIOProxy(model=Settings), SansIOProxy()
    assert off.policy("schema_id").apis == {}
    assert versions_read(off.chain.policies) == versions_read(plain.chain.policies)  # what clients are offered
    frame = produce(9, {"orders": {0: BAD}})
    assert isinstance(off.chain.classify(frame, 0.0, off.conn.info, relayable=True), Relayed)


def test_switched_on_clients_are_offered_the_versions_that_name_topics() -> None:
    p = proxy()
    assert versions_read(p.chain.policies)[PRODUCE].high == 12  # v13 names topics by id only (KIP-516)
    assert versions_read(p.chain.policies)[PRODUCE].low == 0  # v0 stays offered (KAFKA-18659)
    # v0-2 (legacy message sets) are relayed as they come: a Kafka 4 broker closes the connection on them
    assert isinstance(p.chain.classify(produce_v0_2_frame(2, -1, topic="orders"), 0.0, p.conn.info, True), Relayed)


def test_a_request_whose_partitions_all_pass_goes_upstream_untouched() -> None:
    p = proxy()
    frame = produce(9, {"orders": {0: GOOD, 1: records(b"\x00\x00\x00\x00\x07[]", None)}, "audit": {0: BAD}})
    ex = p.request(frame)
    assert ex.answer is None and ex.frame == frame and ex.log == {}
    assert p.metrics.total("sluice_schema_id_refused_records_total") == 0


def test_a_request_whose_partitions_all_fail_is_answered_by_sluice() -> None:
    p = proxy()
    ex = p.request(produce(9, {"orders": {0: BAD, 2: BAD}, "orders-eu": {1: records(b"x")}}))
    message = ("1 record(s) without a schema id the topic accepts (" + NO_ID + "; Sluice [schema_id] '{}'): the "
               "batch is refused")
    assert answered(ex) == {
        ("orders", 0): refused(0).replace(error_message=message.format("orders")),
        ("orders", 2): refused(2).replace(error_message=message.format("orders")),
        ("orders-eu", 1): refused(1, batch_index=0).replace(error_message=message.format("orders-*"))}
    assert ex.log == {"schema_id_refused": 5}
    assert p.metrics.total("sluice_schema_id_refused_records_total", topic="orders") == 4
    assert p.metrics.total("sluice_schema_id_refused_records_total", topic="orders-*") == 1


def test_before_kip_467_the_answer_is_the_error_code_alone() -> None:
    ex = proxy().request(produce(7, {"orders": {0: BAD}}))
    assert answered(ex) == {("orders", 0): Message(index=0, error_code=INVALID_RECORD, base_offset=-1,
                                                   log_append_time_ms=-1, log_start_offset=-1)}


def test_the_passing_partitions_go_upstream_and_the_refused_ones_are_added_to_the_response() -> None:
    p = proxy()
    ex = p.request(produce(12, {"orders": {0: GOOD, 1: BAD}, "orders-eu": {0: BAD}, "audit": {3: BAD}}))
    assert ex.answer is None and ex.collect and ex.relay_if is None  # read whole, whatever its tags say
    _, sent = decode_request(ex.frame)
    assert [(t.name, [q.index for q in t.partition_data]) for t in sent.topic_data] == [("orders", [0]),
                                                                                        ("audit", [3])]
    broker = response_codec(PRODUCE, 12).default().replace(responses=[
        Message(name="audit", partition_responses=[Message(index=3, error_code=0, base_offset=70)]),
        Message(name="orders", partition_responses=[Message(index=0, error_code=0, base_offset=12)])],
        throttle_time_ms=5)
    reply = p.respond(ex, response(PRODUCE, 12, 41, broker))
    _, body = decode_response(PRODUCE, 12, reply[4:])
    assert body.throttle_time_ms == 5
    got = {(t.name, q.index): (q.error_code, q.base_offset) for t in body.responses for q in t.partition_responses}
    assert got == {("audit", 3): (0, 70), ("orders", 0): (0, 12), ("orders", 1): (INVALID_RECORD, -1),
                   ("orders-eu", 0): (INVALID_RECORD, -1)}


def test_acks_0_has_no_response_to_refuse_in_so_the_connection_closes() -> None:
    p = proxy()
    with pytest.raises(Rejected) as e:
        p.request(produce(9, {"orders": {0: GOOD, 1: BAD}}, acks=0))
    assert e.value.reason == "refused"
    assert p.metrics.total("sluice_schema_id_refused_records_total", topic="orders") == 2
    ex = p.request(produce(9, {"orders": {0: GOOD}}, acks=0))
    assert not ex.expects_response and ex.answer is None


def test_the_section_names_its_keys_in_errors(tmp_path: Path) -> None:
    toml = tmp_path / "sluice.toml"
    toml.write_text('[[schema_id.topics]]\ntopic = "orders"\nschema_ids = [1, 2]\n')
    assert load_settings(toml, env={}, model=Settings).schema_id.topics[0].schema_ids == [1, 2]
    for text, error in [
        ('[[schema_id.topics]]\ntopic = "orders!"\n', "schema_id.topics[0].topic: 'orders!' is neither"),
        ('[[schema_id.topics]]\ntopic = "a"\n[[schema_id.topics]]\ntopic = "a"\n',
         "schema_id.topics[1].topic: 'a' is already schema_id.topics[0]"),
        ('[[schema_id.topics]]\ntopic = "a"\nschema_ids = [-1]\n',
         "schema_id.topics[0].schema_ids[0]: must be at least 0"),
        ('[schema_id]\ntopic = "a"\n', "schema_id.topic: unknown key (did you mean 'topics'?)")]:
        toml.write_text(text)
        with pytest.raises(ConfigError) as e:
            load_settings(toml, env={}, model=Settings)
        assert str(e.value).startswith(error), str(e.value)


#: each layout of Produce the policy reads: v3 (the baseline), v8 (KIP-467's RecordErrors), v9 (flexible), v10
#: (KIP-951's tagged fields), v12 (the last that names topics)
LAYOUTS = (3, 8, 9, 10, 12)


@pytest.mark.parametrize("version", LAYOUTS)
@settings(max_examples=8, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data())
def test_any_produce_request_has_a_defined_outcome(version: int, data: st.DataObject) -> None:
    """Requests generated from Kafka's spec (checked topics or not, records good, bad, garbage or none) and any
    response to what went upstream: answered, sent on, or refused (Rejected, a malformed response's CodecError),
    never a failure of the policy's own (PolicyFailed)."""
    p = proxy()
    body = data.draw(message_strategy(request_spec(PRODUCE), version, overrides={
        "name": st.sampled_from(["orders", "orders-eu", "audit"]),
        "records": st.sampled_from([GOOD, BAD, None]) | st.binary(max_size=80)}), label="request")
    try:
        ex = p.request(request(PRODUCE, version, 3, body))
        if ex.answer is not None:
            assert all(q.error_code for q in answered(ex).values())
        elif ex.expects_response:
            broker = data.draw(message_strategy(response_spec(PRODUCE), version), label="response")
            p.respond(ex, encode_response(PRODUCE, version, Message(correlation_id=3), broker))
    except (Rejected, CodecError):
        pass
