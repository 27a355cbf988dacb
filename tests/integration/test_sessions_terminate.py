"""``[sessions] mode = "terminate"`` against the real broker: Sluice runs a KIP-227 fetch session upstream on
behalf of session-less clients (raw fetches, confluent-kafka, aiokafka).

- a raw session-less fetch loop over 200 partitions (3 with traffic) gets every partition in every response,
  with the right high watermarks and every record, while the upstream link carries a small fraction of the
  client link's bytes;
- confluent-kafka and aiokafka consume every record once, in order, from 3 partitions while a producer keeps
  producing;
- a broker restart in the middle of consumption: the group member continues and nothing is lost; and the broker
  down until the member's group session expired: it rejoins and every partition is read again, to the end.
- a client with its own session moving from Fetch v12 (topic names) to v13 (topic ids): 106 on the old
  session, then a new v13 session that delivers every record once, in order.
- kafka-python (its own session): every Fetch costs the upstream link exactly what it costs the client's link.
- a topic deleted and created again (a new id, three partitions where it had one) under a group member of either
  kind (confluent-kafka, kafka-python): every record of the new topic once, in order, none of the old one's again.
- the access log of a session-less consumer's fetches (Fetch v13+): every partition of each full response, by
  name, with the record bytes sent.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import logging
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer
from confluent_kafka import Consumer, Message, Producer, TopicPartition
from kafka import KafkaConsumer
from kafka import TopicPartition as KafkaTopicPartition

from proxy import metrics
from proxy.policies.terminate.sessions import FetchMetadata
from proxy.wire.records import decode_batches, walk_batches
from rig.kafka import KafkaBroker
from rig.kafka_python_group import wait_partitions_known
from rig.proxy_thread import ProxyThread
from rig.raw import RawClient
from tests.support import topics
from tests.support.faults import wait_until

pytestmark = pytest.mark.broker

TERMINATE = {"sessions.mode": "terminate"}


def link_bytes(sluice: ProxyThread) -> dict[str, float]:
    return {d: sluice.total("sluice_bytes_total", direction=d) for d in metrics.DIRECTIONS}


def create_topic(bootstrap: str, topic: str, partitions: int) -> None:
    """Create ``topic`` and wait (bounded) until the broker serves fetches for every partition."""
    topics.create_topic(bootstrap, topic, partitions)
    host, _, port = bootstrap.rpartition(":")
    deadline = time.monotonic() + 90
    with RawClient(host, int(port)) as raw:
        while time.monotonic() < deadline:
            view = raw.fetch(12, topic, dict.fromkeys(range(partitions), 0), max_wait_ms=10)
            if len(list(view.partitions())) == partitions and all(p.error_code == 0 for _, p in view.partitions()):
                return
            time.sleep(0.05)  # polling a real condition (leaders elected), bounded by the deadline
    raise AssertionError(f"{topic}: partitions not ready")


def new_producer(bootstrap: str) -> Producer:
    return Producer({"bootstrap.servers": bootstrap, "linger.ms": 0, "enable.idempotence": True})


def produce(bootstrap: str, topic: str, records: list[tuple[int, str]], producer: Producer | None = None) -> None:
    """(partition, key) records, value = key, acknowledged before returning (by ``producer``, else a new one)."""
    p = producer or new_producer(bootstrap)
    for partition, key in records:
        p.produce(topic, key=key.encode(), value=key.encode(), partition=partition)
    assert p.flush(60) == 0


class BusyPartitions:
    """Three records with known values ("r<round>-p<partition>-<i>") to each busy partition per round."""

    def __init__(self, bootstrap: str, topic: str, partitions: int, busy: tuple[int, ...]) -> None:
        self.bootstrap, self.topic, self.busy = bootstrap, topic, busy
        self.produced = {p: 0 for p in range(partitions)}  # the high watermark of every partition

    def add(self, round_: int) -> None:
        produce(self.bootstrap, self.topic, [(p, f"r{round_}-p{p}-{i}") for p in self.busy for i in range(3)])
        for p in self.busy:
            self.produced[p] += 3


# ------------------------------------------------------------------------------------- raw fetch loop


def test_raw_sessionless_loop_offloads_upstream(kafka_broker: KafkaBroker, unique_topic: str) -> None:
    parts, busy = 200, (0, 7, 150)
    create_topic(kafka_broker.bootstrap, unique_topic, parts)
    traffic = BusyPartitions(kafka_broker.bootstrap, unique_topic, parts, busy)
    produced, add = traffic.produced, traffic.add
    add(0)
    with ProxyThread(kafka_broker.bootstrap, **TERMINATE) as sluice, \
            RawClient("127.0.0.1", sluice.proxy.bootstrap_port) as client:
        offsets = {p: 0 for p in range(parts)}
        start: dict[str, float] = {}
        for round_ in range(1, 41):
            view = client.fetch(12, unique_topic, offsets, max_wait_ms=20)
            got = {p.partition_index: p for _, p in view.partitions()}
            assert view.error_code == 0 and view.session_id == 0
            assert sorted(got) == list(range(parts)), "every requested partition is in the response"
            for index, part in got.items():
                assert part.error_code == 0
                walk = walk_batches(part.records or b"")
                assert walk.truncated == 0
                if walk.batches:
                    assert walk.batches[0].base_offset <= offsets[index] < walk.batches[0].base_offset + \
                        walk.batches[0].last_offset_delta + 1
                    offsets[index] = walk.batches[-1].base_offset + walk.batches[-1].last_offset_delta + 1
                assert part.high_watermark >= offsets[index]
            if round_ == 1:
                start = link_bytes(sluice)  # the first (full) fetch is excluded from the ratio
            if round_ % 10 == 0 and round_ < 40:
                add(round_)
        # every record arrived; the last responses carry the current high watermark of every partition
        assert offsets == produced
        assert {p.partition_index: p.high_watermark for _, p in view.partitions()} == produced
        end = link_bytes(sluice)
    sent_up = end["proxy_to_upstream"] - start["proxy_to_upstream"]
    from_client = end["client_to_proxy"] - start["client_to_proxy"]
    from_up = end["upstream_to_proxy"] - start["upstream_to_proxy"]
    to_client = end["proxy_to_client"] - start["proxy_to_client"]
    assert sent_up < 0.2 * from_client, f"upstream requests {sent_up} B vs client requests {from_client} B"
    assert from_up < 0.5 * to_client, f"upstream responses {from_up} B vs client responses {to_client} B"
    assert sluice.total("sluice_upstream_fetch_requests_total", kind="full") == 1
    assert sluice.total("sluice_upstream_fetch_requests_total", kind="incremental") == 39
    assert sluice.total("sluice_upstream_fetch_bytes_saved_total") > 0


def test_raw_session_client_is_served_by_sluice(kafka_broker: KafkaBroker, unique_topic: str) -> None:
    """A client with its own fetch session (raw KIP-227 requests, as the Java client sends them): Sluice
    creates the session (its own id, not the broker's), answers incremental requests with exactly the
    partitions that have news, answers session errors itself, and every record arrives once, in order."""
    parts, busy = 60, (0, 7, 50)
    create_topic(kafka_broker.bootstrap, unique_topic, parts)
    traffic = BusyPartitions(kafka_broker.bootstrap, unique_topic, parts, busy)
    produced, add = traffic.produced, traffic.add
    add(0)
    with ProxyThread(kafka_broker.bootstrap, **TERMINATE) as sluice, \
            RawClient("127.0.0.1", sluice.proxy.bootstrap_port) as client:
        offsets = {p: 0 for p in range(parts)}
        told_hw: dict[int, int] = {}
        values: dict[int, list[bytes]] = {p: [] for p in busy}

        def take(view_parts: dict[int, Any]) -> dict[int, int]:
            """Record what arrived; return the partitions whose fetch offset moved (the next request's)."""
            moved = {}
            for index, part in view_parts.items():
                assert part.error_code == 0
                batches = decode_batches(part.records or b"")
                for batch in batches:
                    for record in batch.records:
                        if batch.base_offset + record.offset_delta >= offsets[index]:
                            values[index].append(bytes(record.value or b""))
                if batches:
                    offsets[index] = batches[-1].last_offset + 1
                    moved[index] = offsets[index]
                told_hw[index] = part.high_watermark
            return moved

        view = client.fetch(12, unique_topic, offsets, max_wait_ms=20, session_id=0, session_epoch=0)
        sid = view.session_id
        got = {p.partition_index: p for _, p in view.partitions()}
        assert view.error_code == 0 and sid != 0 and sorted(got) == list(range(parts))
        moved = take(got)
        epoch = 1
        for round_ in range(1, 31):
            if round_ in (10, 20):
                add(round_)
            before_hw = dict(told_hw)
            view = client.fetch(12, unique_topic, moved, max_wait_ms=20, session_id=sid, session_epoch=epoch)
            epoch += 1
            assert (view.error_code, view.session_id) == (0, sid)
            got = {p.partition_index: p for _, p in view.partitions()}
            for index, part in got.items():  # only partitions with news (KIP-227's inclusion rules)
                assert part.records_size > 0 or part.high_watermark != before_hw[index], f"p{index}: no news"
            moved = take(got)
        assert offsets == produced and told_hw == produced
        for p in busy:
            expected = [f"r{r}-p{p}-{i}".encode() for r in (0, 10, 20) for i in range(3)]
            assert values[p] == expected, f"p{p}: {values[p]}"

        async def upstream_session_id() -> int:
            (sessions,) = [s for s in sluice.policy_states("terminate") if s.states]
            return int(sessions.client.next_metadata.session_id)

        assert sluice.call(upstream_session_id()) not in (0, sid)  # two independent sessions
        # session errors are Sluice's own: answered without an upstream request
        up_before = sluice.total("sluice_upstream_fetch_requests_total")
        for session_id, session_epoch, code in ((sid, epoch + 3, 71), (sid ^ 0x5A5A, 1, 70)):
            view = client.fetch(12, unique_topic, {}, session_id=session_id, session_epoch=session_epoch)
            assert (view.error_code, view.session_id, list(view.partitions())) == (code, 0, [])
        assert sluice.total("sluice_upstream_fetch_requests_total") == up_before
        # the session survived its errors
        view = client.fetch(12, unique_topic, {}, max_wait_ms=20, session_id=sid, session_epoch=epoch)
        assert (view.error_code, view.session_id) == (0, sid)
    assert sluice.total("sluice_downstream_fetch_requests_total", kind="full") == 1
    assert sluice.total("sluice_downstream_fetch_requests_total", kind="error") == 2
    assert sluice.total("sluice_fetch_session_errors_total", error="INVALID_FETCH_SESSION_EPOCH") >= 1


def test_session_client_switching_to_topic_ids_starts_a_new_session(kafka_broker: KafkaBroker,
                                                                    unique_topic: str) -> None:
    """A client with its own session moves from Fetch v12 (topic names) to v13 (topic ids, KIP-516), as the
    Java FetchSessionHandler does once every partition has a topic id: its incremental v13 request on the v12
    session gets FETCH_SESSION_TOPIC_ID_ERROR from Sluice (as from Kafka: FetchSession.scala), and its new full
    v13 session works, every record arriving once, in order. (Sluice's upstream session used to carry on
    incrementally with name keys in a v13 request, which the encoder refused: the connection was closed.)"""
    parts, busy = 4, (0, 3)
    create_topic(kafka_broker.bootstrap, unique_topic, parts)
    traffic = BusyPartitions(kafka_broker.bootstrap, unique_topic, parts, busy)
    produced, add = traffic.produced, traffic.add
    host, _, port = kafka_broker.bootstrap.rpartition(":")
    with RawClient(host, int(port)) as direct:
        topic_id = direct.topic_ids([unique_topic])[unique_topic]
    add(0)
    with ProxyThread(kafka_broker.bootstrap, **TERMINATE) as sluice, \
            RawClient("127.0.0.1", sluice.proxy.bootstrap_port) as client:
        offsets = dict.fromkeys(range(parts), 0)
        values: dict[int, list[bytes]] = {p: [] for p in busy}

        def take(view: Any) -> dict[int, int]:
            """Record what arrived (each batch must start at the fetch offset: nothing twice, nothing skipped);
            return the partitions whose fetch offset moved."""
            assert view.error_code == 0
            moved = {}
            for _, part in view.partitions():
                assert part.error_code == 0
                index = part.partition_index
                for batch in decode_batches(part.records or b""):
                    assert batch.base_offset == offsets[index], (index, batch.base_offset, offsets[index])
                    values[index] += [bytes(r.value or b"") for r in batch.records]
                    offsets[index] = moved[index] = batch.last_offset + 1
            return moved

        def fetch(version: int, wanted: dict[int, int], session_id: int, epoch: int) -> Any:
            return client.fetch(version, unique_topic, wanted, max_wait_ms=20, session_id=session_id,
                                session_epoch=epoch, topic_id=topic_id)

        view = fetch(12, offsets, 0, 0)
        sid = view.session_id
        assert sid != 0 and sorted(p.partition_index for _, p in view.partitions()) == list(range(parts))
        moved = take(view)
        add(1)
        epoch = 1
        while offsets != produced and epoch < 20:  # bounded: each fetch returns what the acked produce wrote
            moved = take(fetch(12, moved, sid, epoch))
            epoch += 1
        assert offsets == produced
        add(2)
        errors = sluice.total("sluice_fetch_session_errors_total", error="FETCH_SESSION_TOPIC_ID_ERROR")
        # v13 on the v12 session: 106, session id 0, no partitions; the connection stays open
        view = fetch(13, moved, sid, epoch)
        assert (view.error_code, view.session_id, list(view.partitions())) == (106, 0, [])
        assert sluice.total("sluice_fetch_session_errors_total", error="FETCH_SESSION_TOPIC_ID_ERROR") == errors + 1
        # a new session in v13 (naming the old one closes it, as FetchSessionHandler does after an error)
        view = fetch(13, offsets, sid, 0)
        sid2 = view.session_id
        assert sid2 not in (0, sid) and view.version == 13
        assert {bytes(t.topic_id) for t in view.topics} == {topic_id}
        assert sorted(p.partition_index for _, p in view.partitions()) == list(range(parts))
        moved = take(view)
        add(3)
        epoch = 1
        while offsets != produced and epoch < 20:
            view = fetch(13, moved, sid2, epoch)
            assert view.session_id == sid2
            moved = take(view)
            epoch += 1
        assert offsets == produced
        for p in busy:
            assert values[p] == [f"r{r}-p{p}-{i}".encode() for r in range(4) for i in range(3)], f"p{p}: {values[p]}"
        # the old session is gone: Kafka's answer to an incremental request naming it
        view = fetch(13, {}, sid, epoch)
        assert (view.error_code, view.session_id) == (70, 0)


@pytest.mark.parametrize("error", ["unknown_session", "wrong_epoch"])
def test_refused_session_is_reestablished_without_an_error(kafka_broker: KafkaBroker, unique_topic: str,
                                                           error: str) -> None:
    """The broker answers Sluice's session request with 70 (unknown id) or 71 (wrong epoch): Sluice sends the
    same fetch again as a full session request, and the client gets a normal response."""
    create_topic(kafka_broker.bootstrap, unique_topic, 5)
    produce(kafka_broker.bootstrap, unique_topic, [(0, "a"), (0, "b")])
    with ProxyThread(kafka_broker.bootstrap, **TERMINATE) as sluice, \
            RawClient("127.0.0.1", sluice.proxy.bootstrap_port) as client:
        offsets = dict.fromkeys(range(5), 0)
        view = client.fetch(12, unique_topic, offsets, max_wait_ms=20)
        assert walk_batches(view.topics[0].partitions[0].records or b"").batches
        offsets[0] = 2
        client.fetch(12, unique_topic, offsets, max_wait_ms=20)  # incremental: the session is established

        async def break_session() -> None:
            (sessions,) = [s for s in sluice.policy_states("terminate") if s.states]
            session = sessions.client
            meta = session.next_metadata
            assert meta.session_id != 0 and not meta.is_full
            # an id next to the real one: the broker's session cache is sharded by id range, so a far-off id can
            # hit a shard that does not exist (Kafka 4 answers -1 then, not 70)
            session.next_metadata = (FetchMetadata(meta.session_id ^ 1, meta.epoch) if error == "unknown_session"
                                     else FetchMetadata(meta.session_id, meta.epoch + 5))

        sluice.call(break_session())
        produce(kafka_broker.bootstrap, unique_topic, [(1, "c")])
        retries, full = sluice.total("sluice_fetch_session_retries_total"), \
            sluice.total("sluice_upstream_fetch_requests_total", kind="full")
        view = client.fetch(12, unique_topic, offsets, max_wait_ms=20)
        assert view.error_code == 0
        parts = {p.partition_index: p for _, p in view.partitions()}
        assert sorted(parts) == list(range(5)) and all(p.error_code == 0 for p in parts.values())
        assert [b.base_offset for b in walk_batches(parts[1].records or b"").batches] == [0]
        assert parts[0].high_watermark == 2 and parts[1].high_watermark == 1
        assert sluice.total("sluice_fetch_session_retries_total") == retries + 1
        assert sluice.total("sluice_upstream_fetch_requests_total", kind="full") == full + 1
        # and the new session carries on incrementally
        incr = sluice.total("sluice_upstream_fetch_requests_total", kind="incremental")
        offsets[1] = 1
        view = client.fetch(12, unique_topic, offsets, max_wait_ms=20)
        assert view.error_code == 0 and len(list(view.partitions())) == 5
        assert sluice.total("sluice_upstream_fetch_requests_total", kind="incremental") == incr + 1


def test_session_refused_twice_recovers_with_a_fresh_session(kafka_broker: KafkaBroker, unique_topic: str) -> None:
    """A session id the broker cannot place (Kafka 4 answers -1 for ids beyond its cache shards, to the
    incremental request and to the full request that names the session): the client gets error-free answers
    and, within a few fetches, its records, because Sluice then starts a fresh session."""
    create_topic(kafka_broker.bootstrap, unique_topic, 3)
    with ProxyThread(kafka_broker.bootstrap, **TERMINATE) as sluice, \
            RawClient("127.0.0.1", sluice.proxy.bootstrap_port) as client:
        offsets = dict.fromkeys(range(3), 0)
        client.fetch(12, unique_topic, offsets, max_wait_ms=20)

        async def break_session() -> None:
            (sessions,) = [s for s in sluice.policy_states("terminate") if s.states]
            sessions.client.next_metadata = FetchMetadata(2**31 - 7, 1)

        sluice.call(break_session())
        produce(kafka_broker.bootstrap, unique_topic, [(2, "x")])
        got = 0
        for _ in range(5):
            view = client.fetch(12, unique_topic, offsets, max_wait_ms=20)
            assert view.error_code == 0 and all(p.error_code == 0 for _, p in view.partitions())
            got = len(walk_batches(view.topics[0].partitions[2].records or b"").batches) if view.topics else 0
            if got:
                break
        assert got == 1


def test_with_a_size_limit_budget(kafka_broker: KafkaBroker, unique_topic: str) -> None:
    """terminate + a KIP-74 budget: the budget is enforced on the response built for the client, every
    partition is in every response, and every record arrives."""
    create_topic(kafka_broker.bootstrap, unique_topic, 3)
    per_partition, budget = 20, 25_000
    prod = Producer({"bootstrap.servers": kafka_broker.bootstrap, "linger.ms": 0, "batch.size": 1})
    for _ in range(per_partition):
        for p in range(3):
            prod.produce(unique_topic, value=bytes([65 + p]) * 10_000, partition=p)
            prod.poll(0)
    assert prod.flush(60) == 0
    with ProxyThread(kafka_broker.bootstrap, **TERMINATE,
                     **{"size_limit.budgets": [{"client_id": "*", "fetch_max_bytes": budget}]}) as sluice, \
            RawClient("127.0.0.1", sluice.proxy.bootstrap_port) as client:
        offsets = dict.fromkeys(range(3), 0)
        for _ in range(200):
            if all(o == per_partition for o in offsets.values()):
                break
            view = client.fetch(12, unique_topic, offsets, max_wait_ms=20)
            assert sorted(p.partition_index for _, p in view.partitions()) == [0, 1, 2]
            total, first = 0, 0
            for _, part in view.partitions():
                walk = walk_batches(part.records or b"")
                assert part.error_code == 0 and walk.truncated == 0
                if walk.batches:
                    first = first or walk.batches[0].size
                    assert walk.batches[0].base_offset == offsets[part.partition_index]
                    offsets[part.partition_index] = walk.batches[-1].next_offset
                total += walk.complete_size
            assert total <= max(budget, first)
        assert offsets == dict.fromkeys(range(3), per_partition)


# ---------------------------------------------------------------------------- clients, continuous produce

PARTITIONS = 3
PER_PARTITION = 300


def keys() -> list[tuple[int, str]]:
    return [(p, f"p{p}-{i:05d}") for i in range(PER_PARTITION) for p in range(PARTITIONS)]


def check_once_in_order(got: list[tuple[int, str]]) -> None:
    by_partition: dict[int, list[str]] = {}
    for p, key in got:
        by_partition.setdefault(p, []).append(key)
    for p in range(PARTITIONS):
        assert by_partition.get(p) == [f"p{p}-{i:05d}" for i in range(PER_PARTITION)], \
            f"partition {p}: {len(by_partition.get(p, []))} records"
    assert len(got) == PARTITIONS * PER_PARTITION


class Background:
    """Produce ``records`` in chunks (each acknowledged) in a thread while the test consumes: each chunk by a new
    producer (its start paces the chunks, ~0.5 s), or all by one (``one_producer``: a chunk as soon as the last
    was acknowledged)."""

    def __init__(self, bootstrap: str, topic: str, records: list[tuple[int, str]], chunk: int = 30,
                 one_producer: bool = False) -> None:
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(bootstrap, topic, records, chunk, one_producer),
                                        daemon=True)
        self._thread.start()

    def _run(self, bootstrap: str, topic: str, records: list[tuple[int, str]], chunk: int,
             one_producer: bool) -> None:
        try:
            producer = new_producer(bootstrap) if one_producer else None
            for i in range(0, len(records), chunk):
                produce(bootstrap, topic, records[i : i + chunk], producer)
        except BaseException as e:  # reported by join()
            self.error = e

    def join(self) -> None:
        self._thread.join(120)
        assert not self._thread.is_alive()
        if self.error is not None:
            raise self.error


@pytest.fixture(scope="module")
def sluice(kafka_broker: KafkaBroker) -> Iterator[ProxyThread]:
    with ProxyThread(kafka_broker.bootstrap, **TERMINATE) as p:
        yield p


def partition_and_key(m: Message) -> tuple[int, str]:
    partition, key = m.partition(), m.key()
    assert partition is not None and key is not None, m
    return partition, key.decode()


def consume_confluent(bootstrap: str, topic: str, total: int, timeout: float = 90.0) -> list[tuple[int, str]]:
    """While the records are produced (straight to the broker: a record stored twice would be the harness's, and
    one delivered twice a client drops by offset), until ``total`` have come."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"g-{topic}", "auto.offset.reset": "earliest",
                  "enable.auto.commit": False, "fetch.wait.max.ms": 100})
    c.subscribe([topic])
    got: list[tuple[int, str]] = []
    deadline = time.monotonic() + timeout
    try:
        while len(got) < total and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is not None and not m.error():
                got.append(partition_and_key(m))
    finally:
        c.close()
    return got


def test_confluent_consumes_every_record_once_in_order(kafka_broker: KafkaBroker, sluice: ProxyThread,
                                                       unique_topic: str) -> None:
    create_topic(kafka_broker.bootstrap, unique_topic, PARTITIONS)
    incr_before = sluice.total("sluice_upstream_fetch_requests_total", kind="incremental")
    producer = Background(kafka_broker.bootstrap, unique_topic, keys())
    got = consume_confluent(sluice.bootstrap, unique_topic, PARTITIONS * PER_PARTITION)
    producer.join()
    check_once_in_order(got)
    assert sluice.total("sluice_upstream_fetch_requests_total", kind="incremental") > incr_before


async def test_aiokafka_consumes_every_record_once_in_order(kafka_broker: KafkaBroker, sluice: ProxyThread,
                                                            unique_topic: str) -> None:
    create_topic(kafka_broker.bootstrap, unique_topic, PARTITIONS)
    incr_before = sluice.total("sluice_upstream_fetch_requests_total", kind="incremental")
    producer = Background(kafka_broker.bootstrap, unique_topic, keys())
    consumer = AIOKafkaConsumer(unique_topic, bootstrap_servers=sluice.bootstrap, group_id=f"g-{unique_topic}",
                                auto_offset_reset="earliest", enable_auto_commit=False, fetch_max_wait_ms=100)
    await consumer.start()
    got: list[tuple[int, str]] = []
    try:
        async with asyncio.timeout(90):
            while len(got) < PARTITIONS * PER_PARTITION:
                for tp, msgs in (await consumer.getmany(timeout_ms=500)).items():
                    got += [(tp.partition, m.key.decode()) for m in msgs]
    finally:
        await consumer.stop()
    await asyncio.to_thread(producer.join)
    check_once_in_order(got)
    assert sluice.total("sluice_upstream_fetch_requests_total", kind="incremental") > incr_before


def test_kafka_python_session_costs_upstream_what_it_costs_its_client(kafka_broker: KafkaBroker, unique_topic: str,
                                                                      tmp_path: Path) -> None:
    """kafka-python runs its own fetch session; Sluice serves it and keeps its own upstream. Fetch for fetch, the
    upstream link carries exactly the bytes of the client's link: Sluice's upstream request lists what the
    client's listed (the partitions whose offset moved, KIP-227's incremental request), no more, and the broker's
    answer names the partitions Sluice's answer to the client names (the same inclusion rules, FetchSession.scala,
    on both sessions). So terminate mode costs the broker link what the client's own session would, at whatever
    pace the client fetches (bench.sessions' upstream_over_client_bytes)."""
    parts, busy = 30, (0, 11, 29)
    create_topic(kafka_broker.bootstrap, unique_topic, parts)
    records = [(p, f"p{p}-{i:05d}") for i in range(100) for p in busy]
    path = tmp_path / "access.jsonl"
    with ProxyThread(kafka_broker.bootstrap, **TERMINATE, **{"logging.access_log": str(path)}) as sluice:
        consumer = KafkaConsumer(bootstrap_servers=sluice.bootstrap, client_id="kp-session-bytes", group_id=None,
                                 enable_auto_commit=False, fetch_max_wait_ms=100)
        consumer.assign([KafkaTopicPartition(unique_topic, p) for p in range(parts)])
        consumer.seek_to_beginning()
        producer = Background(kafka_broker.bootstrap, unique_topic, records, chunk=15)
        got: dict[int, list[str]] = {p: [] for p in range(parts)}
        try:
            deadline = time.monotonic() + 90
            while sum(map(len, got.values())) < len(records) and time.monotonic() < deadline:
                for tp, msgs in consumer.poll(timeout_ms=500).items():
                    got[tp.partition] += [m.key.decode() for m in msgs]
        finally:
            consumer.close()
            producer.join()
        incremental = sluice.total("sluice_downstream_fetch_requests_total", kind="incremental")
        upstream_full = sluice.total("sluice_upstream_fetch_requests_total", kind="full")
    assert got == {p: [k for q, k in records if q == p] for p in range(parts)}
    fetches = [line for line in map(json.loads, path.read_text().splitlines()) if line["api"] == "Fetch"]
    assert incremental >= 10 and len(fetches) > incremental, (incremental, len(fetches))
    assert upstream_full == 1  # one session upstream all along
    differing = [(line["bytes_client_to_proxy"], line["bytes_proxy_to_upstream"], line["bytes_upstream_to_proxy"],
                  line["bytes_proxy_to_client"]) for line in fetches
                 if (line["bytes_proxy_to_upstream"], line["bytes_upstream_to_proxy"])
                 != (line["bytes_client_to_proxy"], line["bytes_proxy_to_client"])]
    assert not differing, f"{len(differing)} of {len(fetches)} fetches (client request, upstream request, " \
        f"upstream response, client response): {differing[:10]}"


class _Member:
    """A group member of ``topic`` (confluent-kafka: no fetch session, topic ids; kafka-python: its own session):
    :meth:`poll` returns the (partition, key) records it got; :meth:`assigned`, how many partitions it is assigned.
    Each is told not to create a topic it looks up (the broker's auto-creation would race the test's own);
    kafka-python's Metadata requests ask for it all the same, which :func:`tests.support.topics.created_again`
    allows for."""
    def __init__(self, client: str, bootstrap: str, topic: str, partitions: int) -> None:
        group = f"g-{topic}"
        self._confluent: Consumer | None = None
        self._kafka_python: KafkaConsumer | None = None
        if client == "confluent-kafka":
            self._confluent = Consumer({"bootstrap.servers": bootstrap, "group.id": group,
                                        "auto.offset.reset": "earliest", "enable.auto.commit": False,
                                        "fetch.wait.max.ms": 100, "log_level": 0,
                                        "topic.metadata.refresh.interval.ms": 1000})
            self._confluent.subscribe([topic])
        else:
            self._kafka_python = KafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=group,
                                               auto_offset_reset="earliest", enable_auto_commit=False,
                                               fetch_max_wait_ms=100, metadata_max_age_ms=1000,
                                               allow_auto_create_topics=False)
            # joined before its metadata names the topic, a kafka-python 3.0.12 member can be left unassigned
            # for good (rig/kafka_python_group.py)
            wait_partitions_known(self._kafka_python, topic, partitions)

    def poll(self) -> list[tuple[int, str]]:
        if self._confluent is not None:
            m = self._confluent.poll(0.2)
            return [partition_and_key(m)] if m is not None and not m.error() else []
        assert self._kafka_python is not None
        return [(tp.partition, m.key.decode())
                for tp, msgs in self._kafka_python.poll(timeout_ms=200).items() for m in msgs]

    def assigned(self) -> int:
        if self._confluent is not None:
            return len(self._confluent.assignment())
        assert self._kafka_python is not None
        return len(self._kafka_python.assignment())

    def close(self) -> None:
        if self._confluent is not None:
            self._confluent.close()
        if self._kafka_python is not None:
            self._kafka_python.close()


@pytest.mark.parametrize("client", ["confluent-kafka", "kafka-python"])
def test_a_topic_deleted_and_created_again_is_read_from_its_start(kafka_broker: KafkaBroker, sluice: ProxyThread,
                                                                  unique_topic: str, client: str) -> None:
    """A topic deleted and created again under its name while a group member reads it through terminate mode: the
    new topic has a new id (KIP-516) and three partitions where the old had one. Sluice holds state for the old
    partitions on both sides (the client's fetch session or its last full response, the upstream session, the
    topic's name by id); none of it may stand in the way: the member gets every record of the new topic once, in
    order, and none of the old one's again. Both kinds of client: with a session of its own (kafka-python) and
    without (librdkafka)."""
    from confluent_kafka import TopicCollection
    from confluent_kafka.admin import AdminClient, NewPartitions

    bootstrap = kafka_broker.bootstrap
    create_topic(bootstrap, unique_topic, 1)
    produce(bootstrap, unique_topic, [(0, "old-0")])
    member = _Member(client, sluice.bootstrap, unique_topic, 1)
    got: list[tuple[int, str]] = []

    def received(count: int) -> Callable[[], bool]:
        def enough() -> bool:
            got.extend(member.poll())
            return len(got) >= count
        return enough

    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})
    old_id = None

    def created_again() -> bool:
        got.extend(member.poll())  # the member goes on fetching and heartbeating while the topic is gone
        return topics.created_again(admin, bootstrap, unique_topic, 3, old_id)

    def assigned_three() -> bool:
        got.extend(member.poll())
        return member.assigned() == 3

    new = [(p, f"new-p{p}-{i}") for i in range(3) for p in range(3)]
    try:
        wait_until(received(1), 60, lambda: f"the old topic's record: {got}")
        old_id = topics.topic_id(admin, unique_topic)
        admin.delete_topics([unique_topic])[unique_topic].result(30)
        wait_until(created_again, 60, "the topic created again")
        if len(admin.describe_topics(TopicCollection([unique_topic]))[unique_topic].result(30).partitions) < 3:
            admin.create_partitions([NewPartitions(unique_topic, 3)])[unique_topic].result(30)
        # the member commits nothing, so a rebalance after the records came would read them again, by design:
        # they are produced once its assignment is the new topic's three partitions
        wait_until(assigned_three, 60, "the member assigned the new topic's partitions")
        produce(bootstrap, unique_topic, new)
        wait_until(received(1 + len(new)), 90, lambda: f"the new topic's records: {got}")
        got.extend(member.poll())  # anything more (a record twice) shows in the assertion
    finally:
        member.close()
    assert got[0] == (0, "old-0")
    assert sorted(got[1:]) == sorted(new), got
    for p in range(3):
        assert [key for q, key in got[1:] if q == p] == [key for q, key in new if q == p]


def test_access_log_lists_every_partition_of_a_sessionless_consumers_fetches(kafka_broker: KafkaBroker,
                                                                             unique_topic: str, tmp_path: Path,
                                                                             caplog: pytest.LogCaptureFixture
                                                                             ) -> None:
    """confluent-kafka (session-less; Fetch v13+ names topics by id) in terminate mode with the access log on, on a
    low-rate topic (a record per batch, on half of its partitions): every record once, in order. Each Fetch line
    lists every partition the client asked for once, under the topic's name (the ids' names found without decoding
    the request, which terminate reads against the previous one), with the record bytes Sluice sent: none ever
    on the idle partitions, and on each busy one, over the lines, at least every batch the broker holds (each
    reached the client in some logged response; Sluice builds most of them from kept encodings, and lists them
    from those). Nothing went wrong on the way: no warning or error from Sluice or its event loop (a connection
    closed over an error would be one, and the client's reconnect would hide it)."""
    caplog.set_level(logging.WARNING)
    parts, busy = 6, (0, 2, 3)
    create_topic(kafka_broker.bootstrap, unique_topic, parts)
    records = [(p, f"p{p}-{i:05d}") for i in range(40) for p in busy]
    path = tmp_path / "access.jsonl"
    with ProxyThread(kafka_broker.bootstrap, **TERMINATE, **{"logging.access_log": str(path)}) as sluice:
        c = Consumer({"bootstrap.servers": sluice.bootstrap, "group.id": f"g-{unique_topic}",
                      "enable.auto.commit": False, "fetch.wait.max.ms": 100})
        c.assign([TopicPartition(unique_topic, p, 0) for p in range(parts)])
        # each record acknowledged before the next is sent: a batch each
        producer = Background(kafka_broker.bootstrap, unique_topic, records, chunk=1, one_producer=True)
        got: list[tuple[int, str]] = []
        deadline = time.monotonic() + 90
        try:
            while len(got) < len(records) and time.monotonic() < deadline:
                m = c.poll(0.5)
                if m is not None and not m.error():
                    got.append(partition_and_key(m))
        finally:
            c.close()
            producer.join()
        incremental = sluice.total("sluice_upstream_fetch_requests_total", kind="incremental")
    assert not [r.getMessage() for r in caplog.records if r.name.split(".")[0] in ("sluice", "asyncio")]
    assert sorted(got, key=lambda r: r[0]) == sorted(records, key=lambda r: r[0])  # in order within a partition
    assert incremental > 0  # the upstream session carried the changes
    host, _, port = kafka_broker.bootstrap.rpartition(":")
    with RawClient(host, int(port)) as raw:
        held = {p.partition_index: p.records_size
                for _, p in raw.fetch(12, unique_topic, dict.fromkeys(busy, 0), max_wait_ms=10).partitions()}
    fetches = [line for line in map(json.loads, path.read_text().splitlines()) if line["api"] == "Fetch"]
    assert min(line["version"] for line in fetches) >= 13  # topics by id (KIP-516): their names looked up
    listed = [sorted((i["topic"], i["partition"]) for i in line["partitions"]) for line in fetches]
    assert listed and all(rows == [(unique_topic, p) for p in range(parts)] for rows in listed), listed[:3]
    sent = {p: sum(i["bytes"] for line in fetches for i in line["partitions"] if i["partition"] == p)
            for p in range(parts)}
    assert all(sent[p] == 0 for p in range(parts) if p not in busy), sent
    assert all(sent[p] >= held[p] > 0 for p in busy), (sent, held)


# ------------------------------------------------------------------------------------- broker restart


class GroupMember:
    """A classic-group confluent-kafka consumer (subscribe) and what it delivered, checked as it arrives against
    what Kafka promises a group member that commits nothing: while it holds a partition, the partition's records
    come once each, in order, from where the assignment started (the earliest offset: nothing is committed,
    ``auto.offset.reset`` is earliest); they come again only after the member lost or gave up the partition and
    was assigned it again (a rebalance), from the earliest offset again. librdkafka revokes ("revoking assignment
    and rejoining group") when no coordinator answered it for ``session.timeout.ms``: a broker restart slower than
    that rebalances, and re-delivers. Reading stops at positions (every partition read to its end offset), never
    at a count of records, which re-delivered records would reach early. ``report`` says what happened, for
    failure messages: the group's events and the test's marks (times from the first mark), each partition's
    deliveries, and the client's own log (librdkafka's lines go to this object, not to stderr)."""

    def __init__(self, bootstrap: str, topic: str, **conf: Any) -> None:
        self.t0: float | None = None
        self.t0_utc = ""  # the first mark's wall-clock time, to find Sluice's log lines (UTC timestamps) beside
        #: (seconds from the first mark, what, partitions): the group's callbacks and the test's marks
        self.events: list[tuple[float, str, list[int]]] = []
        #: per partition: the offset its next record must have while it is assigned (None: not assigned)
        self.expect: dict[int, int | None] = {}
        #: per partition: the offsets delivered, in delivery order
        self.offsets: dict[int, list[int]] = {}
        self.problems: list[str] = []
        self.client_log: list[str] = []
        #: the end offsets the last read_to read to
        self.ends: dict[int, int] = {}
        logger = logging.Logger(f"rdkafka-{topic}")  # not in logging's tree: its lines stay here
        logger.addHandler(_ListHandler(self.client_log, self.clock))
        self.consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"g-{topic}",
                                  "auto.offset.reset": "earliest", "enable.auto.commit": False,
                                  "fetch.wait.max.ms": 100, **conf}, logger=logger)
        self.consumer.subscribe([topic], on_assign=self._assigned, on_revoke=self._taken("revoked"),
                                on_lost=self._taken("lost"))

    def mark(self, what: str) -> None:
        now = time.monotonic()
        if self.t0 is None:
            self.t0 = now
            self.t0_utc = datetime.datetime.now(datetime.UTC).strftime("%H:%M:%S.%f")[:-3]
        self.events.append((now - self.t0, what, []))

    def _event(self, what: str, partitions: list[TopicPartition]) -> None:
        self.mark(what)
        self.events[-1][2].extend(tp.partition for tp in partitions)

    def _assigned(self, _consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self._event("assigned", partitions)
        for tp in partitions:
            self.expect[tp.partition] = 0  # nothing committed: the earliest offset

    def _taken(self, what: str) -> Callable[[Consumer, list[TopicPartition]], None]:
        def taken(_consumer: Consumer, partitions: list[TopicPartition]) -> None:
            self._event(what, partitions)
            for tp in partitions:
                self.expect[tp.partition] = None
        return taken

    def positions(self) -> dict[int, int]:
        """Per partition, the offset after the highest one delivered."""
        return {p: max(offsets) + 1 for p, offsets in self.offsets.items() if offsets}

    def runs(self) -> dict[int, list[tuple[int, int]]]:
        """Per partition, the runs of consecutive offsets delivered, (first, last), in delivery order."""
        out: dict[int, list[tuple[int, int]]] = {}
        for p, offsets in self.offsets.items():
            runs = out[p] = []
            for o in offsets:
                if runs and o == runs[-1][1] + 1:
                    runs[-1] = (runs[-1][0], o)
                else:
                    runs.append((o, o))
        return out

    def lost(self) -> bool:
        """Whether the member lost or gave up partitions before it was closed (closing revokes them all)."""
        for _, what, _ in self.events:
            if what == "closing":
                return False
            if what in ("lost", "revoked"):
                return True
        return False

    def read_to(self, ends: dict[int, int], timeout: float) -> bool:
        """Poll until every partition has been read to its end offset in ``ends`` (bounded by ``timeout``)."""
        self.ends = ends
        return self.poll_until(lambda: all(self.positions().get(p, 0) >= end for p, end in ends.items()), timeout)

    def poll_until(self, done: Callable[[], bool], timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while not done() and time.monotonic() < deadline:
            m = self.consumer.poll(0.2)
            if m is None:
                continue
            if m.error():  # the client's own reports (brokers down while the broker restarts): for the report
                self.client_log.append(f"{self.clock()} poll: {m.error()}")
                continue
            self._delivered(m)
        return done()

    def clock(self) -> str:
        return "-" if self.t0 is None else f"{time.monotonic() - self.t0:+.1f}s"

    def _delivered(self, m: Message) -> None:
        partition, offset, key = m.partition(), m.offset(), m.key()
        assert partition is not None and offset is not None and key is not None, m
        self.offsets.setdefault(partition, []).append(offset)
        expect = self.expect.get(partition)
        problem = None
        if key.decode() != f"p{partition}-{offset:05d}":
            problem = f"p{partition}@{offset}: key {key.decode()!r}, not the record produced there"
        elif expect is None:
            problem = f"p{partition}@{offset}: delivered while not assigned"
        elif offset != expect:
            what = "a gap" if offset > expect else "delivered again"
            problem = f"p{partition}@{offset}: {what} within one assignment (expected offset {expect})"
        if problem is not None and len(self.problems) < 20:
            self.problems.append(f"{self.clock()} {problem}")
        if expect is not None:
            self.expect[partition] = offset + 1

    def report(self, sluice_log: str = "") -> str:
        lines = [f"group events and marks (seconds from the first mark, at {self.t0_utc} UTC):"]
        lines += [f"  {t:+7.2f}s {what} {parts if parts else ''}" for t, what, parts in self.events]
        lines.append("per partition: position, records delivered, runs of consecutive offsets delivered:")
        positions = self.positions()
        for p, runs in sorted(self.runs().items()):
            lines.append(f"  p{p}: position {positions[p]}, {len(self.offsets[p])} records, "
                         + " ".join(f"{first}..{last}" for first, last in runs))
        behind = [f"p{p} ({positions.get(p, 0)} of {end})" for p, end in sorted(self.ends.items())
                  if positions.get(p, 0) < end]
        if behind:
            lines.append(f"not read to the end: {', '.join(behind)}")
        if self.problems:
            lines += ["problems:", *(f"  {x}" for x in self.problems)]
        lines += ["client log (last 25 lines):", *(f"  {x}" for x in self.client_log[-25:])]
        if sluice_log:
            lines += ["Sluice's log (last 40 lines):", *(f"  {x}" for x in sluice_log.splitlines()[-40:])]
        return "\n".join(lines)

    def close(self) -> None:
        self.mark("closing")
        self.consumer.close()


class _ListHandler(logging.Handler):
    """librdkafka's log lines (served by poll, so stamped about when they were logged) into a list."""

    def __init__(self, into: list[str], clock: Callable[[], str]) -> None:
        super().__init__()
        self.into, self.clock = into, clock

    def emit(self, record: logging.LogRecord) -> None:
        self.into.append(f"{self.clock()} {record.levelname} {record.getMessage()}")


@pytest.fixture
def sluice_log(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    """Sluice's operational log from INFO on (tests/support/logs.py routes it through logging), for failure
    messages."""
    caplog.set_level(logging.INFO, logger="sluice")
    return caplog


def _read_across(broker: KafkaBroker, sluice: ProxyThread, topic: str, log: pytest.LogCaptureFixture,
                 outage: Callable[[GroupMember], None], **conf: Any) -> GroupMember:
    """The two restart tests' course: ``topic`` created, the first half of its records produced and read by a group
    member (through ``sluice``; ``conf`` on top of GroupMember's), ``outage`` done to the broker, the second half
    produced and every partition read to its end. Returns the closed member, what it read checked as it came
    (GroupMember); a half not read to its end fails here, with the member's report and Sluice's log."""
    create_topic(broker.bootstrap, topic, PARTITIONS)
    records = keys()
    half = len(records) // 2
    produce(broker.bootstrap, topic, records[:half])
    member = GroupMember(sluice.bootstrap, topic, **conf)
    try:
        member.mark("subscribed")
        read = member.read_to(dict.fromkeys(range(PARTITIONS), PER_PARTITION // 2), 60)
        assert read, member.report(log.text)
        outage(member)
        produce(broker.bootstrap, topic, records[half:])
        member.mark("second half produced")
        read = member.read_to(dict.fromkeys(range(PARTITIONS), PER_PARTITION), 120)
    finally:
        member.close()
    assert read and not member.problems, member.report(log.text)
    return member


def test_broker_restart_mid_consumption(unique_topic: str, sluice_log: pytest.LogCaptureFixture) -> None:
    """Its own broker (the shared one must not restart under other tests). Half the records, a restart, the
    other half: the group member (through Sluice, terminate mode, librdkafka's default 45 s session) reads every
    partition to its end, each record once and in order while it keeps its assignment. A restart that takes longer
    than the session as the client sees it (a loaded machine: "Consumer group session timed out ... after 45151
    ms") rebalances the group, and the records come again from the earliest offset (nothing is committed): Kafka's
    contract, checked as such (GroupMember), not a failure; the rebalance itself is the next test's scenario."""
    with KafkaBroker() as broker, ProxyThread(broker.bootstrap, **TERMINATE) as sluice:
        def restart(member: GroupMember) -> None:
            member.mark("restart: stopping the broker")
            broker.restart()
            member.mark(f"restart: broker ready (its start {broker.last_start_seconds:.1f} s)")

        member = _read_across(broker, sluice, unique_topic, sluice_log, restart)
        if not member.lost():  # the assignment held across the restart: every record exactly once
            assert all(runs == [(0, PER_PARTITION - 1)] for runs in member.runs().values()), \
                member.report(sluice_log.text)


@pytest.mark.parametrize("hard", [False, True], ids=["stop", "kill"])
def test_group_member_resumes_every_partition_after_losing_its_assignment(unique_topic: str, hard: bool,
                                                                          sluice_log: pytest.LogCaptureFixture
                                                                          ) -> None:
    """The scenario a slow restart makes of the previous test, made deterministic: the broker stays down
    (stopped, or killed: log recovery at start) until the member (a 6 s session) has reported its assignment
    lost; then it starts again. The member rejoins through Sluice, is assigned every partition again, and reads
    each from the earliest offset (nothing committed: a fetch position that moves back) to the end, once and in
    order; every partition resumes. Sluice's connections to the old broker are gone (its fetch sessions with
    them): the member's new connections get new upstream sessions."""
    with KafkaBroker() as broker, ProxyThread(broker.bootstrap, **TERMINATE) as sluice:
        def down_until_lost(member: GroupMember) -> None:
            member.mark("broker down")
            broker.kill() if hard else broker.stop()
            # librdkafka: no answer from the coordinator for session.timeout.ms -> the assignment is lost
            lost = member.poll_until(member.lost, 60)
            assert lost, member.report(sluice_log.text)
            broker.start()
            member.mark(f"broker ready (its start {broker.last_start_seconds:.1f} s)")

        # the broker's group.min.session.timeout.ms (6 s) is the shortest session it takes
        member = _read_across(broker, sluice, unique_topic, sluice_log, down_until_lost,
                              **{"session.timeout.ms": 6000, "heartbeat.interval.ms": 1000})
        # each partition: its first half, then, after the loss, everything again from the earliest offset, to the end
        # (GroupMember checked that each assignment read from the earliest offset, once and in order)
        runs = member.runs()
        assert all(runs[p][0] == (0, PER_PARTITION // 2 - 1) and runs[p][-1] == (0, PER_PARTITION - 1)
                   for p in range(PARTITIONS)), member.report(sluice_log.text)
