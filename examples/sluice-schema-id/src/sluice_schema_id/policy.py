"""The policy's hooks: Produce requests to the listed topics are checked partition by partition
(:func:`.check.refusal`), and each refused partition is answered as a broker with schema ID validation answers it.

Kafka handles a Produce request's partitions independently: the broker appends each partition's batch on its own,
and a batch that fails validation fails alone (KIP-467: ``INVALID_RECORD`` for that partition, the other
partitions appended and answered as usual). So does this policy, whatever way the client grouped its batches into
requests:

- no partition refused: the request goes upstream untouched (not even re-encoded);
- every partition refused: Sluice answers the request itself, and nothing of it goes upstream;
- some refused: the request goes upstream without them, and their answers are added to the broker's response.

Refusing the whole request instead would fail the passing partitions' records with an error they did not cause,
depending only on how the client happened to batch them (``INVALID_RECORD`` is not retriable: those records
would be lost to the producer).

With ``acks=0`` there is no response to carry the error: Kafka then closes the connection (KafkaApis
``handleProduceRequest``: a failed acks=0 Produce closes it, so the producer notices and refreshes its metadata),
and so does Sluice, counting ``sluice_frames_rejected_total{reason="refused"}``. Unlike the broker, Sluice sends
none of such a request's partitions upstream: acks=0 promises nothing of delivery.

Versions: Produce v0-2 carry legacy message sets Sluice does not decode; they are relayed, and Kafka 4 refuses
them itself (KIP-896: the broker closes the connection). Produce v13 names topics by id only (KIP-516): while the
policy checks topics, clients are offered Produce up to v12, which names them.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from prometheus_client import CollectorRegistry, Counter

from proxy.core.exchange import Exchange, Rejected
from proxy.core.policy import Policy, Services, reads
from proxy.policies.topic_rules import TopicRules
from proxy.wire.api_keys import ApiKey
from proxy.wire.messages import decoded_versions, response_codec
from proxy.wire.model import Message
from proxy.wire.views import MessageResponse, ResponseView, local_response

from .check import Refusal, Rule, refusal
from .settings import SchemaIdSettings

#: the last Produce version that names topics (ProduceRequest.json: TopicData Name "versions": "0-12")
LAST_BY_NAME = 12
#: ProduceResponse's offsets when a partition failed (ProduceResponse.INVALID_OFFSET)
INVALID_OFFSET = -1


class SchemaIdMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.refused = Counter(
            "sluice_schema_id_refused_records_total",
            "Records of Produce batches [schema_id] refused (never sent upstream), by the [[schema_id.topics]] "
            "entry that applies (a topic name, or the glob that matched it).", ["topic"], registry=registry)


#: per topic name, the answers of the partitions refused from a request that went upstream without them
Refused = Mapping[str, list[Message]]


class SchemaId(Policy):
    name = "schema_id"

    def __init__(self, settings: SchemaIdSettings, services: Services, metrics: SchemaIdMetrics) -> None:
        self.rules = TopicRules({t.topic: Rule(t.topic, t.keys, frozenset(t.schema_ids)) for t in settings.topics})
        self.metrics = metrics
        #: without topics it declares no API: installed, it changes nothing (Produce stays unread, every version
        #: Sluice relays is offered)
        self.apis = reads(ApiKey.PRODUCE, up_to={ApiKey.PRODUCE: LAST_BY_NAME}) if self.rules else MappingProxyType({})
        decoded = decoded_versions(ApiKey.PRODUCE)
        assert decoded is not None
        self.first_decoded = decoded.low
        for entry in self.rules.entries:
            metrics.refused.labels(entry)  # every series from the start, at 0

    def unread(self, api_key: int, version: int) -> bool:
        return not self.rules or version < self.first_decoded

    def on_request(self, ex: Exchange, conn: Any) -> Refused | None:
        if ex.header.api_version < self.first_decoded:
            return None
        body = ex.body
        passing: list[Message] = []  # the topics that go upstream, each with its passing partitions
        refused: dict[str, list[Message]] = {}
        records = 0
        for topic in body.topic_data:
            rule = self.rules.get(topic.name)
            if rule is None:
                passing.append(topic)
                continue
            kept = []
            for partition in topic.partition_data:
                why = refusal(partition.records, rule)
                if why is None:
                    kept.append(partition)
                    continue
                refused.setdefault(topic.name, []).append(_answer(partition.index, why))
                self.metrics.refused.labels(rule.entry).inc(why.records)
                records += why.records
            if len(kept) == len(topic.partition_data):
                passing.append(topic)
            elif kept:
                passing.append(topic.replace(partition_data=kept))
        if not refused:
            return None
        if not ex.expects_response:
            raise Rejected("refused", f"Produce acks=0 with records [schema_id] refuses ({', '.join(refused)}): no "
                                      "response to carry INVALID_RECORD, so the connection closes, as Kafka closes "
                                      "it after a failed acks=0 Produce")
        ex.log["schema_id_refused"] = records
        if not passing:
            h = ex.header
            ex.answer = local_response(ApiKey.PRODUCE, h.api_version, h.correlation_id,
                                       response_codec(ApiKey.PRODUCE, h.api_version).default().replace(
                                           responses=[Message(name=name, partition_responses=answers)
                                                      for name, answers in refused.items()]))
            return None
        ex.body = body.replace(topic_data=passing)
        ex.collect = True  # the broker's response gets the refused partitions' answers
        return refused

    def on_response(self, ex: Exchange, response: ResponseView, conn: Any, state: Refused) -> None:
        assert isinstance(response, MessageResponse)
        body = response.body
        topics = {t.name: t for t in body.responses}
        for name, answers in state.items():
            topic = topics.get(name)
            if topic is None:
                body.responses.append(Message(name=name, partition_responses=answers))
            else:
                topic.partition_responses.extend(answers)
        response.changed = True


def _answer(partition: int, why: Refusal) -> Message:
    """A refused partition's ProduceResponse entry (RecordErrors and ErrorMessage exist from v8, KIP-467: older
    versions are encoded without them)."""
    return Message(index=partition, error_code=why.error_code, base_offset=INVALID_OFFSET,
                   log_append_time_ms=INVALID_OFFSET, log_start_offset=INVALID_OFFSET,
                   record_errors=[Message(batch_index=i, batch_index_error_message=text)
                                  for i, text in why.record_errors],
                   error_message=why.message)
