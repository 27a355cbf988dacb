"""Kafka Streams through Sluice: a real Streams application (rig/streams/WordCount.java, Kafka's own
kafka-streams jar of the broker's release), exactly-once, reading and writing only through Sluice, with
cooperative consumption (``[sharing]``) on for every topic and for other groups' clients (``shared-*``): Streams'
own consumers do not opt in. (Opted in, a classic-protocol Streams group whose consumers outnumber a topic's
partitions has its assignment rewritten into slices, which Streams' assignor refuses: TaskAssignmentException,
"Number of assigned partitions 2 is not equal to the number of active taskIds 1"; see the limits in
docs/cooperative-consumption.md.)

Two instances of the application in one group split the input's partitions (a rebalance as the second joins);
their output, read from the broker (read_committed), must end as the exact word counts of the input, computed
here. Once with the classic rebalance protocol (Streams' own assignor over JoinGroup/SyncGroup) and, on a release
whose brokers run them (Kafka 4.2+; 4.1 has them as early access only), with KIP-1071 streams groups
(``group.protocol=streams``, StreamsGroupHeartbeat, which Sluice relays untouched).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer

from rig.java_tools import FEATURE_COMMAND, JavaTools
from rig.kafka import KafkaBroker
from rig.proxy_thread import ProxyThread
from rig.streams_app import WordCountApp
from tests.clients.test_sessions_clients import LineReader

pytestmark = pytest.mark.broker

PARTITIONS = 3
LINES = 600
WORDS = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet", "kilo"]
STREAMS_GROUPS_FROM = (4, 2)
WITHIN_S = 120.0


def _lines() -> list[str]:
    # deterministic, uneven counts: line i holds 1-3 words picked by i
    return [" ".join(WORDS[(i * k + k) % len(WORDS)] for k in range(1, 2 + i % 3)) for i in range(LINES)]


def _protocols() -> list[str]:
    version = JavaTools().version
    return ["classic", "streams"] if version[:2] >= STREAMS_GROUPS_FROM else ["classic"]


@pytest.fixture(scope="module")
def app(java_tools: JavaTools) -> WordCountApp:
    return WordCountApp(java_tools)


@pytest.fixture
def sharing_proxy(kafka_broker: KafkaBroker) -> Iterator[ProxyThread]:
    proxy = ProxyThread(kafka_broker.bootstrap, **{"sharing.enabled": True, "sharing.clients": ["shared-*"],
                                                    "sharing.topics": [{"topic": "*"}]})
    try:
        yield proxy
    finally:
        proxy.stop()


def _running(states: list[LineReader], within: float) -> None:
    """Until every instance has printed ``STATE RUNNING`` (bounded by ``within`` s)."""
    deadline = time.monotonic() + within
    for s in states:
        while "STATE RUNNING" not in s.lines:
            assert time.monotonic() < deadline, f"an instance never reached RUNNING: {[x.lines for x in states]}"
            s.wait_for(len(s.lines) + 1, 0.2)


def _final_counts(bootstrap: str, topic: str, want: dict[str, str], within: float) -> dict[str, str]:
    """The output topic's latest value per word (committed records only), read until it equals ``want`` or
    ``within`` s pass."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"check-{topic}", "auto.offset.reset": "earliest",
                         "enable.auto.commit": False, "isolation.level": "read_committed"})
    latest: dict[str, str] = {}
    try:
        consumer.subscribe([topic])
        deadline = time.monotonic() + within
        while latest != want and time.monotonic() < deadline:
            for m in consumer.consume(num_messages=1000, timeout=0.2):
                if m.error() is None:
                    latest[(m.key() or b"").decode()] = (m.value() or b"").decode()
    finally:
        consumer.close()
    return latest


@pytest.mark.parametrize("protocol", _protocols())
def test_word_count_through_sluice_with_sharing_on(
        protocol: str, kafka_broker: KafkaBroker, sharing_proxy: ProxyThread, app: WordCountApp,
        java_tools: JavaTools, unique_topic: str, tmp_path: Path) -> None:
    source, sink = f"{unique_topic}-in", f"{unique_topic}-out"
    java_tools.create_topic(sharing_proxy.bootstrap, source, partitions=PARTITIONS)
    java_tools.create_topic(sharing_proxy.bootstrap, sink, partitions=PARTITIONS)
    if protocol == "streams":
        # streams.version=1: on by default for a new 4.2+ cluster; setting it again is a no-op
        java_tools.run(FEATURE_COMMAND, ["--bootstrap-server", sharing_proxy.bootstrap, "upgrade",
                                         "--feature", "streams.version=1"])
    lines = _lines()
    want = {w: str(n) for w, n in Counter(w for line in lines for w in line.split()).items()}
    app_id = f"wc-{protocol}-{unique_topic}"
    instances = [app.spawn(sharing_proxy.bootstrap, app_id, source, sink, protocol, tmp_path / f"state-{n}")
                 for n in range(2)]
    states = [LineReader(p.stdout) for p in instances]
    errors = [LineReader(p.stderr) for p in instances]
    try:
        # Both instances in the group (each RUNNING once: the second's join rebalanced the first), then the input
        _running(states, WITHIN_S)
        java_tools.console_produce(sharing_proxy.bootstrap, source, lines)
        got = _final_counts(kafka_broker.bootstrap, sink, want, WITHIN_S)
        group_api = "StreamsGroupHeartbeat" if protocol == "streams" else "JoinGroup"
        through_sluice = sharing_proxy.total("sluice_requests_total", api=group_api)
    finally:
        for p in instances:
            p.terminate()
        for p in instances:
            p.wait(60)
    assert got == want, {w: (got.get(w), n) for w, n in want.items() if got.get(w) != n}
    assert through_sluice > 0, f"no {group_api} went through Sluice"
    logged = [ln for e in errors for ln in e.drain(5) if " ERROR " in ln]
    assert not logged, logged[:5]
