"""Topic names for connections that never send Metadata (proxy/core/topic_names.py): Fetch v13+ names topics by
id only (KIP-516) and a replica fetcher never asks for Metadata, so Sluice looks the ids up itself
(``Proxy._lookup_topic_names``) before a policy that reads names runs, and for the access log.

The fetching client here is a raw one (rig/raw.py) that sends nothing but Fetch through Sluice: the
topic id it fetches by comes from a Metadata v12 request sent straight to the broker, so Sluice never sees a
Metadata response naming the topic.
"""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path

import pytest

from proxy.wire.records import walk_batches
from rig.java_tools import JavaTools
from rig.kafka import KafkaBroker
from rig.proxy_thread import ProxyThread
from rig.raw import RawClient
from tests.support.topics import create_topic, produce_values

pytestmark = pytest.mark.broker

VALUE = 4 * 1024
PER_BATCH = 5
UNKNOWN_TOPIC_ID = 100  # Errors.java


def backlog(broker: KafkaBroker, topic: str, batches: int = 2) -> tuple[bytes, int]:
    """A one-partition topic holding ``batches`` separately flushed batches; (its id as the broker gives it,
    the number of records)."""
    create_topic(broker.bootstrap, topic)
    for b in range(batches):
        produce_values(broker.bootstrap, topic,
                       ((0, f"{b}-{i}".encode(), bytes([b * PER_BATCH + i]) * VALUE) for i in range(PER_BATCH)),
                       linger_ms=0, acks="all")
    with RawClient(broker.host, broker.port) as direct:  # to the broker, not through Sluice
        return direct.topic_ids([topic])[topic], batches * PER_BATCH


def throttled(broker: KafkaBroker, topic: str, **more: object) -> ProxyThread:
    """1 byte/s on ``topic``'s replicas for consumers whose client.id matches ``backfill-*``."""
    return ProxyThread(broker.bootstrap, **{"throttle.leader_rate_bytes": 1,
                                            "throttle.topics": [{"topic": topic, "replicas": "*"}],
                                            "throttle.consumers": [{"client_id": "backfill-*"}], **more})


@pytest.mark.parametrize("version", [13, 17])
def test_throttle_applies_to_a_fetch_by_topic_id_without_metadata(kafka_broker: KafkaBroker, unique_topic: str,
                                                                  version: int) -> None:
    topic_id, records = backlog(kafka_broker, unique_topic)
    with throttled(kafka_broker, unique_topic) as sluice, \
            RawClient("127.0.0.1", sluice.proxy.bootstrap_port, client_id="backfill-raw") as c:
        assert sluice.total("sluice_topic_name_lookups_total") == 0
        # The first fetch finds the quota not yet exceeded; partition_max_bytes=1 lets only the first batch
        # through (KIP-74), so a backlog remains behind it.
        first = c.fetch(version, unique_topic, {0: 0}, partition_max_bytes=1, max_wait_ms=100, topic_id=topic_id)
        [(t, p)] = list(first.partitions())
        assert (bytes(t.topic_id), p.error_code, p.high_watermark) == (topic_id, 0, records)
        batches = walk_batches(p.records or b"").batches
        offset = batches[-1].next_offset if batches else 0
        assert offset < records
        # Whatever it carried, the bytes now counted exceed 1 byte/s for the rest of the window: the
        # following fetches keep the partition (error 0, the real high watermark) with its records left out.
        for _ in range(3):
            view = c.fetch(version, unique_topic, {0: offset}, partition_max_bytes=1, max_wait_ms=100,
                           topic_id=topic_id)
            [(t, p)] = list(view.partitions())
            assert (bytes(t.topic_id), p.partition_index, p.error_code, p.high_watermark, p.records_size) == \
                (topic_id, 0, 0, records, 0), f"records not held back at offset {offset} of {records}"
        # Sluice learnt the name with a lookup of its own, once: the name is kept for the proxy's life.
        assert sluice.total("sluice_topic_name_lookups_total", outcome="resolved") == 1
        assert sluice.total("sluice_topic_name_lookups_total") == 1
        assert sluice.total("sluice_throttle_left_out_partitions_total") >= 3


def test_unknown_topic_id_gets_the_brokers_error(kafka_broker: KafkaBroker, unique_topic: str) -> None:
    backlog(kafka_broker, unique_topic, batches=1)
    unknown = uuid.uuid4().bytes
    with throttled(kafka_broker, unique_topic) as sluice, \
            RawClient("127.0.0.1", sluice.proxy.bootstrap_port, client_id="backfill-raw", timeout=30) as c:
        # The lookup finds no such topic; the fetch then goes upstream and the client gets the broker's answer
        # (a socket timeout, not a hang, if it never came).
        view = c.fetch(13, "unknown", {0: 0}, max_wait_ms=100, topic_id=unknown)
        codes = {view.error_code} | {t_p[1].error_code for t_p in view.partitions()}
        assert UNKNOWN_TOPIC_ID in codes, view
        assert [bytes(t.topic_id) for t in view.topics] in ([unknown], [])
        assert sluice.total("sluice_topic_name_lookups_total", outcome="unknown") == 1
        assert sluice.total("sluice_topic_name_lookups_total", outcome="resolved") == 0
        # The connection still serves: an unknown id is not waited for again (retry_after_s), the broker
        # answers again.
        again = c.fetch(13, "unknown", {0: 0}, max_wait_ms=100, topic_id=unknown)
        assert UNKNOWN_TOPIC_ID in {again.error_code} | {t_p[1].error_code for t_p in again.partitions()}
        assert sluice.total("sluice_topic_name_lookups_total") == 1


def fetch_lines(path: Path) -> list[dict[str, object]]:
    """The access log's decoded Fetch lines (the ones with a ``partitions`` field)."""
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    return [line for line in lines if line["api"] == "Fetch" and "partitions" in line]


def test_access_log_names_topics_fetched_by_id_with_only_a_size_limit(kafka_broker: KafkaBroker,
                                                                      unique_topic: str, tmp_path: Path,
                                                                      java_tools: JavaTools) -> None:
    topic_id, records = backlog(kafka_broker, unique_topic)
    path = tmp_path / "access.jsonl"
    with ProxyThread(kafka_broker.bootstrap, **{
            "logging.access_log": str(path),
            "size_limit.budgets": [{"client_id": "*", "fetch_max_bytes": 1 << 20}]}) as sluice:
        # a raw client that never sends Metadata, fetching by id (v13 and the Java client's v17)
        with RawClient("127.0.0.1", sluice.proxy.bootstrap_port, client_id="raw-by-id") as c:
            for version in (13, 17):
                view = c.fetch(version, unique_topic, {0: 0}, max_wait_ms=100, topic_id=topic_id)
                assert [p.high_watermark for _, p in view.partitions()] == [records]
        # the Java console consumer (Metadata, then Fetch v17 with sessions)
        lines = java_tools.console_consume(sluice.bootstrap, unique_topic, max_messages=records,
                                           group=f"java-{time.time()}", timeout=120)
        assert len(lines) == records
    # stopping the proxy closed (and flushed) the access log
    decoded = fetch_lines(path)
    clients = {line["client_id"] for line in decoded}
    assert "raw-by-id" in clients and len(clients) >= 2, clients
    topics = {(line["client_id"], entry["topic"]) for line in decoded
              for entry in line["partitions"]}  # type: ignore[attr-defined]
    assert {t for _, t in topics} == {unique_topic}, f"topics not named in the access log: {sorted(topics)}"
