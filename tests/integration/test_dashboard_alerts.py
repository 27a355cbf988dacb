"""The alerting rules (config/prometheus/sluice-alerts.yml) and the Grafana dashboard (config/grafana/) against the
real thing:

- ``promtool check rules`` accepts the rules and ``promtool test rules`` passes their unit tests
  (config/prometheus/sluice-alerts.test.yml: every alert firing for an input that should fire it, and not for its
  look-alikes); ``promtool check config`` accepts both Prometheus configs with the rules they load;
- a real Prometheus, started with config/prometheus.yml (so loading the rules through its rule_files), scrapes an
  in-process Sluice while real clients produce and consume through it with a size budget, a throttle,
  terminate-mode fetch sessions and cooperative consumption (a group of 4 consumers sharing 3 partitions) in
  force, Sluice an instance of a fleet (its control topic on the same broker). Then every dashboard query
  (Grafana's variables substituted as tests/support/grafana.py describes), as Grafana runs it (a range query: over
  the traffic), and every rule's expression, "armed", return series; the template variables have values; every
  rule evaluated without error; and no alert fires.

"Armed" expression: an alert's expression returns series only while it fires, so each comparison in it is made a
``bool`` comparison (``x > 0`` -> ``x > bool 0``: 0 or 1 instead of a filter). A series then proves that every
metric the alert reads exists and that its vector matches (``and on (...)``, arithmetic) pair up; the rules are
written without ``unless`` and ``absent()`` so that this holds. When they fire is promtool's test above.
"""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from kafka import KafkaConsumer, KafkaProducer

from rig.kafka import KafkaBroker
from rig.kafka_python_group import wait_partitions_known
from rig.proxy_thread import ProxyThread
from tests.support.faults import wait_until
from tests.support.grafana import load_dashboard, parse_label_values, queries, substitute, variable_queries
from tests.support.prometheus import REPO, Prometheus, prometheus_config, promtool, rule_files, scalar
from tests.support.sharing import members_of, python_member, wait_for_all
from tests.support.sharing import produce as produce_keyed
from tests.support.topics import create_topic

RULES = REPO / "config" / "prometheus" / "sluice-alerts.yml"
RULES_TEST = REPO / "config" / "prometheus" / "sluice-alerts.test.yml"
ALERTS = {"SluiceDown", "SluiceUpstreamDown", "SluiceUpstreamConnectErrors", "SluiceThrottleNotHolding",
          "SluicePartitionStarving", "SluiceThrottledLagNotFalling", "SluiceFramesRejected",
          "SluiceAccessLogDropping", "SluiceQuotaHoldsClient"}

PARTITIONS = 3
PER_PARTITION = 20
VALUE = 20 * 1024  # one record per batch: a budget of 45 KiB (30 KiB per partition) cuts inside batches
#: a client quota on the budgeted consumer, far above what it reads: metered, never throttled
QUOTA = {"name": "dashboard", "client_id": "reporting-*", "fetch_rate_bytes": 1 << 30}
#: a quota for the whole fleet (no client of the test is its entity): the fleet quota panel's gauges are exported
#: while an entry is fleet-scoped
FLEET_QUOTA = {"name": "fleet-wide", "client_id": "nobody-*", "produce_rate_bytes": 1 << 20, "scope": "fleet"}
BUDGET = {"client_id": "reporting-*", "fetch_max_bytes": 45 * 1024, "partition_max_bytes": 30 * 1024}
LEADER_RATE = 512 * 1024


# ---------------------------------------------------------------------------------------------------- promtool


def test_promtool_check_rules() -> None:
    proc = promtool("check", "rules", str(RULES))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"SUCCESS: {len(ALERTS)} rules found" in proc.stdout, proc.stdout


def test_promtool_test_rules() -> None:
    """Each alert shown firing for the input that should fire it, not for its look-alikes, not before `for`."""
    proc = promtool("test", "rules", str(RULES_TEST))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    tested = set(re.findall(r"(?m)^\s+- alertname: (\w+)$", RULES_TEST.read_text()))
    assert tested == ALERTS, f"alerts without a promtool test: {ALERTS - tested}"


def test_promtool_check_config_of_both_prometheus_configs(tmp_path: Path) -> None:
    """config/prometheus.yml as it is; config/compose/prometheus.yml with its rule files mapped from where
    docker-compose.yml mounts them back to the repository."""
    proc = promtool("check", "config", str(REPO / "config" / "prometheus.yml"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS: 1 rule files found" in proc.stdout, proc.stdout

    compose = (REPO / "docker-compose.yml").read_text()
    mounts = {container: REPO / host for host, container in
              re.findall(r"(?m)^\s*-\s*\./([^:\s]+):([^:\s]+)(?::ro)?\s*$", compose)}
    text = (REPO / "config" / "compose" / "prometheus.yml").read_text()
    entries = rule_files(text)
    assert entries, "config/compose/prometheus.yml loads no rule files"
    for entry in entries:
        assert entry in mounts, f"{entry} is not mounted into the prometheus service by docker-compose.yml"
        assert mounts[entry].resolve() == RULES.resolve()
        text = text.replace(entry, str(mounts[entry]))
    config = tmp_path / "prometheus.yml"
    config.write_text(text)
    proc = promtool("check", "config", str(config))
    assert proc.returncode == 0, proc.stdout + proc.stderr


# ------------------------------------------------------------------------ a real Prometheus, real traffic


_COMPARISON = re.compile(r"==|!=|>=|<=|>|<")


def armed(expr: str) -> str:
    """``expr`` with every comparison outside label matchers and strings made a ``bool`` comparison."""
    out: list[str] = []
    depth, i, quote = 0, 0, ""
    while i < len(expr):
        c = expr[i]
        if quote:
            out.append(c)
            if c == "\\":
                out.append(expr[i + 1])
                i += 1
            elif c == quote:
                quote = ""
            i += 1
            continue
        match = _COMPARISON.match(expr, i) if depth == 0 else None
        if match:
            out.append(match.group())
            i = match.end()
            if not re.match(r"\s*bool\b", expr[i:]):
                out.append(" bool")
            continue
        if c in "\"'`":
            quote = c
        elif c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
        out.append(c)
        i += 1
    return "".join(out)


def test_armed_expressions() -> None:
    assert armed('a{x!="1"} > 0 and on (i) b == 0') == 'a{x!="1"} > bool 0 and on (i) b == bool 0'
    assert armed("a >= bool 1 or b < c") == "a >= bool 1 or b < bool c"
    assert armed('label_replace(a, "d", "x>y", "", "") != 1') == 'label_replace(a, "d", "x>y", "", "") != bool 1'


@dataclass
class Scraped:
    sluice: ProxyThread
    prometheus: Prometheus
    #: when the traffic began (Unix time): dashboard panels are range queries from then
    since: float


def value_of(key: bytes) -> bytes:
    return (key * (VALUE // len(key) + 1))[:VALUE]


def produce(bootstrap: str, topic: str) -> None:
    """PER_PARTITION records per partition through Sluice, one record per batch, each acknowledged."""
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks=1, linger_ms=0, batch_size=1,
                             max_in_flight_requests_per_connection=1)
    try:
        for i in range(PER_PARTITION):
            for p in range(PARTITIONS):
                key = f"p{p}-{i:04d}".encode()
                producer.send(topic, key=key, value=value_of(key), partition=p)
        producer.flush(60)
    finally:
        producer.close(timeout=10)


def consume_all(bootstrap: str, topic: str, client_id: str) -> None:
    """Every record through Sluice with kafka-python (fetch sessions), once, unchanged."""
    consumer = KafkaConsumer(topic, bootstrap_servers=bootstrap, client_id=client_id,
                             group_id=f"{client_id}-{uuid.uuid4().hex[:8]}", auto_offset_reset="earliest",
                             enable_auto_commit=False)
    got: dict[bytes, bytes] = {}
    try:
        wait_partitions_known(consumer, topic, PARTITIONS)
        deadline = time.monotonic() + 120
        while len(got) < PARTITIONS * PER_PARTITION and time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=500).values():
                got.update((r.key, r.value) for r in records)
    finally:
        consumer.close()
    assert len(got) == PARTITIONS * PER_PARTITION, f"{client_id}: {len(got)} records"
    assert all(v == value_of(k) for k, v in got.items()), f"{client_id}: a record changed"


def share(sluice: ProxyThread, prometheus: Prometheus, bootstrap: str, topic: str) -> None:
    """4 consumers (confluent-kafka, committing after each poll) in one group share the 3 partitions of ``topic``
    through Sluice until each has received records and Prometheus has scraped the group's gauges (which Sluice
    removes once the group's members have left); then they leave."""
    group = f"g-{topic}"
    with members_of(*(python_member("confluent", sluice.bootstrap, topic, group, f"sharing-dashboard-{i}")
                      for i in range(4))) as members:
        wait_until(lambda: sluice.total("sluice_sharing_partitions", group=group) > 0, 90, "the group to share")
        produced = produce_keyed(bootstrap, topic, 300, keys=60, tag="dashboard")
        wait_for_all(members, {v for _, v in produced})
        prometheus.wait_for(f'sluice_sharing_stable_offset_lag{{group="{group}"}}', bool)


@pytest.fixture(scope="module")
def scraped(kafka_broker: KafkaBroker) -> Iterator[Scraped]:
    """Sluice with a size budget and a client quota (clients reporting-*), a leader throttle (clients backfill-*,
    one topic) and terminate-mode sessions, scraped every second by a real Prometheus; real clients produce both
    topics and consume them through it. Yields once every client connection has closed (the counters stand still)."""
    stamp = uuid.uuid4().hex[:8]
    budgeted, throttled = f"dashboard-budgeted-{stamp}", f"dashboard-throttled-{stamp}"
    shared = f"dashboard-shared-{stamp}"
    for topic in (budgeted, throttled, shared):
        create_topic(kafka_broker.bootstrap, topic, PARTITIONS)
    with ProxyThread(kafka_broker.bootstrap, **{
            "admin.enabled": True, "admin.port": 0,
            "sessions.mode": "terminate",
            "size_limit.budgets": [BUDGET],
            "size_limit.global_max_bytes": 1 << 20,
            "throttle.leader_rate_bytes": LEADER_RATE,
            "throttle.topics": [{"topic": throttled, "replicas": "*"}],
            "throttle.consumers": [{"client_id": "backfill-*"}],
            "quota.entries": [QUOTA, FLEET_QUOTA],
            "sharing.enabled": True, "sharing.topics": [{"topic": shared}],
            "fleet.enabled": True, "fleet.name": f"dashboard-{stamp}"}) as sluice:
        prometheus = Prometheus(prometheus_config(sluice.admin_port))
        since = time.time()
        try:
            prometheus.wait_ready()
            prometheus.wait_for('up{job="sluice"}', lambda r: scalar(r) == 1.0)
            for topic in (budgeted, throttled):
                produce(sluice.bootstrap, topic)
            consume_all(sluice.bootstrap, budgeted, "reporting-dashboard")
            consume_all(sluice.bootstrap, throttled, "backfill-dashboard")
            share(sluice, prometheus, kafka_broker.bootstrap, shared)
            wait_until(lambda: sluice.total("sluice_connections_open") == 0, 30, "every connection closed")
            yield Scraped(sluice, prometheus, since)
        finally:
            prometheus.close()


#: counters the traffic must have moved, so the panels and rules reading them show data. Not among them:
#: sluice_size_limit_deferred_partitions_total. Sluice clamps the request to the budget, and a Kafka 4 broker then
#: fills a later partition only when a whole batch of it fits what is left of the budget, so Sluice keeps at least
#: that batch and no partition loses all its records (the counter stays an exported 0 here).
MOVED: tuple[tuple[str, dict[str, str]], ...] = (
    ("sluice_requests_total", {"api": "Produce"}),
    ("sluice_requests_total", {"api": "Fetch"}),
    ("sluice_size_limit_trimmed_bytes_total", {}),
    ("sluice_size_limit_limited_responses_total", {}),
    ("sluice_throttle_bytes_total", {"side": "leader"}),
    ("sluice_throttle_left_out_partitions_total", {"side": "leader"}),
    ("sluice_upstream_fetch_requests_total", {"kind": "incremental"}),
    ("sluice_downstream_fetch_requests_total", {"kind": "incremental"}),
    ("sluice_sharing_records_filtered_total", {"reason": "other_slice"}),
    ("sluice_sharing_assignments_total", {}),
    ("sluice_quota_bytes_total", {"entry": "dashboard", "kind": "fetch"}),
)


def _equals(expected: float, result: list[dict[str, Any]]) -> bool:
    return scalar(result) == expected


@pytest.mark.broker
def test_prometheus_stored_what_the_traffic_did(scraped: Scraped) -> None:
    """The budget, the throttle, the sessions and sharing all acted, and Prometheus holds exactly the proxy's counts."""
    for name, labels in MOVED:
        expected = scraped.sluice.total(name, **labels)
        assert expected > 0, f"{name}{labels}: the traffic never moved it"
        matchers = ", ".join(f'{k}="{v}"' for k, v in labels.items())
        scraped.prometheus.wait_for(f"sum({name}{{{matchers}}})", partial(_equals, expected))
    limit = scraped.prometheus.query('sluice_throttle_rate_limit_bytes{side="leader"}')
    assert scalar(limit) == LEADER_RATE


@pytest.mark.broker
def test_every_dashboard_query_returns_series(scraped: Scraped) -> None:
    dashboard = load_dashboard()
    for title, expr in queries(dashboard):
        promql = substitute(expr)
        assert "$" not in promql, f"{title}: a Grafana variable tests/support/grafana.py does not know: {promql}"
        scraped.prometheus.wait_for(promql, bool, timeout=15, since=scraped.since)


@pytest.mark.broker
def test_every_template_variable_has_values(scraped: Scraped) -> None:
    for name, query in variable_queries(load_dashboard()).items():
        series, label = parse_label_values(substitute(query))
        params = [("match[]", series)] if series else []
        values = scraped.prometheus.api(f"label/{label}/values", params)
        assert values, f"variable {name}: {query} has no values"
    assert scraped.prometheus.api("label/job/values", [("match[]", "sluice_build_info")]) == ["sluice"]


@pytest.mark.broker
def test_every_rule_is_loaded_evaluated_and_armed(scraped: Scraped) -> None:
    """Prometheus loaded the rule file through config/prometheus.yml and evaluated each rule without error; each
    expression, armed (module docstring), returns series from this Sluice's metrics."""
    prometheus = scraped.prometheus

    def evaluated() -> list[dict[str, Any]]:
        rules = prometheus.rules()
        return rules if rules and all(r["lastEvaluation"] > "0001-01-01T00:00:00Z" for r in rules) else []

    wait_until(lambda: bool(evaluated()), 30, "every rule evaluated once")
    rules = evaluated()
    assert {r["name"] for r in rules} == ALERTS
    assert {Path(r["file"]).resolve() for r in rules} == {RULES.resolve()}
    for rule in rules:
        assert rule["health"] == "ok", f"{rule['name']}: {rule.get('lastError')}"
        query = rule["query"]
        assert "unless" not in query and "absent" not in query, f"{rule['name']}: cannot be armed: {query}"
        prometheus.wait_for(armed(query), bool, timeout=15)


@pytest.mark.broker
def test_no_alert_fires_under_healthy_traffic(scraped: Scraped) -> None:
    assert scraped.prometheus.query('ALERTS{alertstate="firing"}') == []
