"""confluent-kafka (librdkafka: sessionless fetches, ApiVersions v3 first, its own compression) through Sluice."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient

from proxy.wire.messages import decoded_versions
from proxy.wire.model import Message
from proxy.wire.records import (
    COMPRESSION_GZIP,
    COMPRESSION_LZ4,
    COMPRESSION_MASK,
    COMPRESSION_SNAPPY,
    COMPRESSION_ZSTD,
    decode_batches,
    iter_batches,
)
from rig.kafka import KafkaBroker
from rig.proxy_thread import ProxyThread
from rig.raw import RawClient
from rig.topics import create_topic
from tests.support.consume import consume
from tests.support.records import Rec, assert_same_records, make_records, rec_of

pytestmark = pytest.mark.broker


@pytest.fixture(scope="module")
def sluice(kafka_broker: KafkaBroker) -> Iterator[ProxyThread]:
    with ProxyThread(kafka_broker.bootstrap) as p:
        yield p


def produce(bootstrap: str, topic: str, records: list[Rec], **config: str) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "acks": "all", **config})
    errors: list[object] = []
    for r in records:
        producer.produce(topic, value=r.value, key=r.key, partition=r.partition, timestamp=r.timestamp_ms,
                         headers=list(r.headers), on_delivery=lambda err, _m: errors.append(err) if err else None)
        producer.poll(0)
    assert producer.flush(60) == 0
    assert not errors


@pytest.mark.parametrize("compression", ["none", "gzip", "snappy", "lz4", "zstd"])
def test_produce_consume_three_partitions(sluice: ProxyThread, unique_topic: str, compression: str) -> None:
    create_topic(sluice.bootstrap, unique_topic, 3)
    records = make_records(150, 3, tag=compression)
    produce(sluice.bootstrap, unique_topic, records, **{"compression.type": compression})
    got = [rec_of(m) for m in consume({"bootstrap.servers": sluice.bootstrap}, unique_topic)]
    assert_same_records(records, got)


def test_admin_lists_topics_and_brokers_through_sluice(sluice: ProxyThread, unique_topic: str,
                                                       kafka_broker: KafkaBroker) -> None:
    create_topic(sluice.bootstrap, unique_topic, 2)
    md = AdminClient({"bootstrap.servers": sluice.bootstrap}).list_topics(timeout=30)
    assert unique_topic in md.topics and len(md.topics[unique_topic].partitions) == 2
    # The client only ever learns Sluice's listeners, never the broker's real port.
    ports = {b.port for b in md.brokers.values()}
    assert kafka_broker.port not in ports
    assert ports == {sluice.proxy.router.port_for(kafka_broker.node_id)}



def stored_batches(host: str, port: int, topic: str, partition: int) -> list[tuple[int, list[Rec]]]:
    """Every batch the broker stored in ``topic``/``partition``, as (attributes, records), read with raw Fetch
    v12 requests straight from the broker: what reached the log, whatever Sluice relayed."""
    out: list[tuple[int, list[Rec]]] = []
    offset = 0
    with RawClient(host, port, client_id="stored-batches") as raw:
        while True:
            view = raw.fetch(12, topic, {partition: offset}, max_wait_ms=0)
            ((_, part),) = view.partitions()
            assert part.error_code == 0, part
            if offset >= part.high_watermark:
                return out
            records = part.records or b""
            headers, batches = list(iter_batches(records)), decode_batches(records)
            assert batches, f"no batch at offset {offset}, below the high watermark {part.high_watermark}"
            for header, batch in zip(headers, batches, strict=True):
                out.append((header.attributes, [
                    Rec(partition, r.key, r.value, tuple((k, v) for k, v in r.headers if v is not None),
                        batch.base_timestamp + r.timestamp_delta)
                    for r in batch.records]))
                offset = batch.last_offset + 1


CODECS = {"gzip": COMPRESSION_GZIP, "snappy": COMPRESSION_SNAPPY, "lz4": COMPRESSION_LZ4, "zstd": COMPRESSION_ZSTD}


@pytest.mark.parametrize("compression", list(CODECS))
def test_compressed_batches_stored_as_produced(sluice: ProxyThread, kafka_broker: KafkaBroker, unique_topic: str,
                                               compression: str) -> None:
    """librdkafka before 2.11.1 turns compression off when the ApiVersions it reads lacks Produce v0
    (librdkafka #4956; why Kafka 4.x still advertises Produce v0, KAFKA-18659, ProduceRequest.json). Through
    Sluice, every batch the broker stores carries the producer's codec, and every record is stored once, in
    order, unchanged."""
    create_topic(kafka_broker.bootstrap, unique_topic, 1)
    records = make_records(200, 1, tag=compression)  # repetitive values: compression pays, so librdkafka keeps it
    produce(sluice.bootstrap, unique_topic, records, **{"compression.type": compression})
    stored = stored_batches(kafka_broker.host, kafka_broker.port, unique_topic, 0)
    assert [attributes & COMPRESSION_MASK for attributes, _ in stored] == [CODECS[compression]] * len(stored)
    assert_same_records(records, [r for _, batch in stored for r in batch])


def test_api_versions_keep_the_broker_produce_min(sluice: ProxyThread, kafka_broker: KafkaBroker) -> None:
    """The Produce range a client reads through Sluice starts where the broker's own does (v0 on Kafka 4.x,
    KAFKA-18659), and ends where Sluice's codecs do if the broker goes further."""
    body = Message(client_software_name="sluice-test", client_software_version="1")

    def produce_range(port: int) -> tuple[int, int]:
        with RawClient("127.0.0.1", port) as raw:
            response = raw.request(18, 3, body)
        assert response.error_code == 0
        (produce,) = [k for k in response.api_keys if k.api_key == 0]
        return produce.min_version, produce.max_version

    direct = produce_range(kafka_broker.port)
    through = produce_range(sluice.proxy.bootstrap_port)
    decoded = decoded_versions(0)
    assert decoded is not None
    assert through == (direct[0], min(direct[1], decoded.high))
