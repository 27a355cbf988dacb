"""aiokafka (asyncio, sessionless fetches, ApiVersions v0) through Sluice."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from rig.kafka import KafkaBroker
from rig.proxy_thread import ProxyThread
from tests.support.records import Rec, assert_same_records, make_records

pytestmark = pytest.mark.broker


@pytest.fixture(scope="module")
def sluice(kafka_broker: KafkaBroker) -> Iterator[ProxyThread]:
    with ProxyThread(kafka_broker.bootstrap) as p:
        yield p


@pytest.mark.parametrize("compression", [None, "gzip", "lz4", "zstd"])
async def test_produce_consume_three_partitions(sluice: ProxyThread, unique_topic: str,
                                                compression: str | None) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=sluice.bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(unique_topic, num_partitions=3, replication_factor=1)])
    finally:
        await admin.close()
    records = make_records(150, 3, tag=str(compression))
    producer = AIOKafkaProducer(bootstrap_servers=sluice.bootstrap, compression_type=compression, linger_ms=5)
    await producer.start()
    try:
        batch = [producer.send(unique_topic, value=r.value, key=r.key, partition=r.partition,
                               timestamp_ms=r.timestamp_ms, headers=list(r.headers)) for r in records]
        await asyncio.gather(*[await f for f in batch])
    finally:
        await producer.stop()
    consumer = AIOKafkaConsumer(unique_topic, bootstrap_servers=sluice.bootstrap, group_id=f"g-{unique_topic}",
                                auto_offset_reset="earliest", enable_auto_commit=False)
    await consumer.start()
    got: list[Rec] = []
    try:
        async with asyncio.timeout(60):
            while len(got) < len(records):
                for _tp, msgs in (await consumer.getmany(timeout_ms=500)).items():
                    got += [Rec(m.partition, m.key, m.value, tuple(m.headers), m.timestamp) for m in msgs]
    finally:
        await consumer.stop()
    assert_same_records(records, got, stored_in=(sluice.bootstrap, unique_topic))
