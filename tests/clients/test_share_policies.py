"""Sluice's policies on share groups (KIP-932): Java share consumers (Kafka's ConsoleShareConsumer, a
KafkaShareConsumer) through Sluice, against a real broker.

The broker is the module's own: its delivery count limit is the lowest Kafka accepts
(``group.share.delivery.count.limit=2``, bounded below by ``group.share.min.delivery.count.limit``), so a record
that is acquired twice without being acknowledged is archived, lost to the group (KIP-932). A proxy that trimmed
ShareFetch responses would leave records acquired but unseen, and after two such rounds they would never arrive:
"every record delivered" is what catches that.

- A 256 KiB budget (``[size_limit]``): Sluice lowers each ShareFetch's MaxBytes, never trims the response. Every
  ShareFetch response is within the budget (plus the response's own fields), the budget binds (without it the
  consumers ask for far more), every record produced is delivered and acknowledged (the access log's
  ``share_acknowledged``), and the share-group's Sluice metrics count what was acquired and acknowledged.
- A consumer throttle: the rate is a bench's (python -m bench.throttle --share); here, the throttled consumers still get
  every record, and nothing is acknowledged other than accepted.
- A client quota (``[quota]``): the rate is ``python -m bench.quota``'s; here, a share consumer held by a fetch
  quota gets every record once, every one accepted, none archived.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from rig.java_tools import CONSOLE_SHARE_CONSUMER, JavaTools
from rig.kafka import KafkaBroker
from rig.proxy_thread import ProxyThread
from tests.clients.test_sessions_clients import LineReader

pytestmark = pytest.mark.broker

PARTITIONS = 3
RECORDS = 1200
VALUE_SIZE = 2048  # 1200 x 2 KiB: each consumer's share fetches would ask for ~1 MB (500 records) unbudgeted
BUDGET = 256 * 1024
#: what a ShareFetch response carries besides record bytes: header, per partition its fields and AcquiredRecords
#: ranges, NodeEndpoints; a few hundred bytes in practice, bounded here generously but far below one record batch
OVERHEAD = 4096


@pytest.fixture(scope="module")
def share_broker() -> Iterator[KafkaBroker]:
    with KafkaBroker(overrides={"group.share.delivery.count.limit": 2}) as broker:
        yield broker


def _value(i: int) -> str:
    head = f"rec-{i:05d}-"
    return head + "x" * (VALUE_SIZE - len(head))


def consume_all(java_tools: JavaTools, bootstrap: str, topic: str, group: str, want: set[str],
                within: float, consumers: int = 2, props: dict[str, str] | None = None) -> list[str]:
    """``consumers`` share consumers of ``group`` (client ids share-policies-N; ``props``: more consumer
    properties, e.g. a SASL login) until together they have printed every value of ``want`` (bounded by ``within``
    s), then closed (a share consumer's close acknowledges what it was handed); every line printed."""
    extra = [a for k, v in (props or {}).items() for a in ("--consumer-property", f"{k}={v}")]
    args_each = [[
        "--bootstrap-server", bootstrap, "--topic", topic, "--group", group, "--timeout-ms", "600000",
        "--consumer-property", f"client.id=share-policies-{n}", *extra,
    ] for n in range(consumers)]  # fmt: skip
    with java_tools.spawned(CONSOLE_SHARE_CONSUMER, args_each) as processes:
        readers = [LineReader(c.stdout) for c in processes]
        errors = [LineReader(c.stderr) for c in processes]
        deadline = time.monotonic() + within
        while not want <= {ln for r in readers for ln in r.lines}:
            missing = want - {ln for r in readers for ln in r.lines}
            assert time.monotonic() < deadline, f"{len(missing)} of {len(want)} records never arrived (archived?)"
            for r in readers:
                r.wait_for(len(r.lines) + len(want), 0.1)  # what has arrived (up to 0.1 s for more)
    got = [ln for r in readers for ln in r.drain(10)]
    assert not [ln for e in errors for ln in e.drain(5) if "ERROR" in ln], [e.lines for e in errors]
    return got


def _share_topic_with_records(broker: KafkaBroker, java_tools: JavaTools, topic: str) -> tuple[str, str, list[str]]:
    """The topic with its RECORDS values produced, and its share group (named after it), set up."""
    group = f"share-{topic}"
    java_tools.create_topic(broker.bootstrap, topic, partitions=PARTITIONS)
    java_tools.share_group_from_earliest(broker.bootstrap, group)
    values = [_value(i) for i in range(RECORDS)]
    java_tools.console_produce(broker.bootstrap, topic, values)
    return topic, group, values


def _acknowledged(lines: list[dict[str, object]]) -> dict[str, int]:
    """Records acknowledged per type (accept, release, reject, gap), from the access log's lines."""
    acks: dict[str, int] = {}
    for line in lines:
        for kind, n in dict(line.get("share_acknowledged") or {}).items():  # type: ignore[call-overload]
            acks[kind] = acks.get(kind, 0) + n
    return acks


def _share_lines(log: Path, api: str) -> list[dict[str, object]]:
    lines = [json.loads(ln) for ln in log.read_text().splitlines() if ln.strip()]
    return [ln for ln in lines if ln["api"] == api]


def test_budget_bounds_share_fetches_and_every_record_is_delivered(
        share_broker: KafkaBroker, java_tools: JavaTools, unique_topic: str, tmp_path: Path) -> None:
    topic, group, values = _share_topic_with_records(share_broker, java_tools, unique_topic)
    log = tmp_path / "access.log"
    proxy = ProxyThread(share_broker.bootstrap, **{
        "size_limit.budgets": [{"client_id": "share-policies-*", "fetch_max_bytes": BUDGET}],
        "logging.access_log": str(log)})
    try:
        got = consume_all(java_tools, proxy.bootstrap, topic, group, set(values), within=120)
        acquired = proxy.total("sluice_share_records_acquired_total")
        accepted = proxy.total("sluice_share_records_acknowledged_total", type="accept")
        clamped = proxy.total("sluice_size_limit_share_clamped_requests_total")
    finally:
        proxy.stop()
    assert set(got) == set(values), f"unexpected values: {sorted(set(got) - set(values))[:3]}"
    fetches = _share_lines(log, "ShareFetch")
    sizes = [int(f["bytes_proxy_to_client"]) for f in fetches]  # type: ignore[call-overload]
    assert sizes and max(sizes) <= BUDGET + OVERHEAD, f"ShareFetch responses over the budget: {sorted(sizes)[-5:]}"
    # The budget binds: some response is filled up to it (unbudgeted, a consumer asks for ~1 MB at once).
    assert max(sizes) > BUDGET // 2, sorted(sizes)[-5:]
    assert clamped > 0
    # Never trimmed: what the broker sent is what the consumer got.
    assert all(f["bytes_upstream_to_proxy"] == f["bytes_proxy_to_client"] for f in fetches)
    # Every record acquired was handed over and acknowledged as accepted (none released, rejected or lost).
    acks = _acknowledged(fetches + _share_lines(log, "ShareAcknowledge"))
    logged_acquired = sum(int(f.get("share_acquired") or 0) for f in fetches)  # type: ignore[call-overload]
    assert logged_acquired == acquired >= RECORDS
    assert set(acks) == {"accept"} and acks["accept"] == accepted >= RECORDS, acks


THROTTLE_BPS = 1_000_000  # 2.4 MB of records: a few quota windows


def test_throttled_share_consumers_get_every_record_and_the_quota_counts_them(
        share_broker: KafkaBroker, java_tools: JavaTools, unique_topic: str, tmp_path: Path) -> None:
    """The throttle holds share consumers without costing a record: every record delivered and accepted (none
    archived under the delivery count limit of 2), every record byte counted against the quota, the responses
    passed unchanged, and the consumers muted (the quota was exceeded) — the rate itself is bench.share_throttle's."""
    topic, group, values = _share_topic_with_records(share_broker, java_tools, unique_topic)
    log = tmp_path / "access.log"
    proxy = ProxyThread(share_broker.bootstrap, **{
        "throttle.leader_rate_bytes": THROTTLE_BPS, "throttle.topics": [{"topic": topic, "replicas": "*"}],
        "throttle.consumers": [{"client_id": "share-policies-*"}], "logging.access_log": str(log)})
    try:
        got = consume_all(java_tools, proxy.bootstrap, topic, group, set(values), within=120)
        metered = proxy.total("sluice_throttle_bytes_total", side="leader")
    finally:
        proxy.stop()
    assert set(got) == set(values), f"unexpected values: {sorted(set(got) - set(values))[:3]}"
    fetches = _share_lines(log, "ShareFetch")
    assert all(f["bytes_upstream_to_proxy"] == f["bytes_proxy_to_client"] for f in fetches)
    logged = sum(int(f.get("throttled_bytes") or 0) for f in fetches)  # type: ignore[call-overload]
    assert metered == logged >= RECORDS * VALUE_SIZE
    assert {f.get("throttle_target_bps") for f in fetches} == {THROTTLE_BPS}
    acks = _acknowledged(fetches + _share_lines(log, "ShareAcknowledge"))
    assert set(acks) == {"accept"} and acks["accept"] >= RECORDS, acks


QUOTA_BPS = 1_000_000  # 2.4 MB of records: a few seconds of the quota


def test_share_consumers_held_by_a_fetch_quota_get_every_record_once(
        share_broker: KafkaBroker, java_tools: JavaTools, unique_topic: str, tmp_path: Path) -> None:
    """A client quota on a share consumer (proxy/policies/quota) holds it on the request side only: every record
    delivered once (none acquired twice: no lock lapsed) and accepted, none archived under the delivery limit of 2,
    the responses passed whole with the throttle time, and the consumer muted (the quota bound)."""
    topic, group, values = _share_topic_with_records(share_broker, java_tools, unique_topic)
    log = tmp_path / "access.log"
    proxy = ProxyThread(share_broker.bootstrap, **{
        "quota.entries": [{"client_id": "share-policies-*", "fetch_rate_bytes": QUOTA_BPS}],
        "logging.access_log": str(log)})
    try:
        got = consume_all(java_tools, proxy.bootstrap, topic, group, set(values), within=120, consumers=1)
        metered = proxy.total("sluice_quota_bytes_total", entry="entries[0]", kind="fetch")
        held = proxy.total("sluice_quota_throttled_total", entry="entries[0]", api="ShareFetch")
    finally:
        proxy.stop()
    assert sorted(got) == sorted(values), f"{len(got)} delivered for {len(values)} records"  # each once
    fetches = _share_lines(log, "ShareFetch")
    assert sum(int(f["bytes_proxy_to_client"]) for f in fetches) == metered >= RECORDS * VALUE_SIZE  # type: ignore[call-overload]
    assert held > 0 and any(f.get("quota_throttle_time_ms") for f in fetches)
    # never cut: every response as the broker sent it, but for the throttle time (same size)
    assert all(f["bytes_upstream_to_proxy"] == f["bytes_proxy_to_client"] for f in fetches)
    acks = _acknowledged(fetches + _share_lines(log, "ShareAcknowledge"))
    acquired = sum(int(f.get("share_acquired") or 0) for f in fetches)  # type: ignore[call-overload]
    assert set(acks) == {"accept"} and acks["accept"] == acquired == RECORDS, (acks, acquired)
