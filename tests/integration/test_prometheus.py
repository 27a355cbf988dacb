"""A real Prometheus (Debian's ``prometheus`` package) scrapes Sluice's /metrics using config/prometheus.yml,
and its HTTP API reports exactly the traffic the test sent; ``promtool check metrics`` accepts /metrics.

The Prometheus runner is tests/support/prometheus.py (shared with tests/integration/test_dashboard_alerts.py).
The traffic is deterministic: ApiVersions requests over a raw socket (a known number per version, known bytes)
and Produce requests from kafka-python sent one at a time (acks=1, linger 0, each awaited: one request each).
A missing ``prometheus``/``promtool`` is a failure: ``make install`` installs them.
"""

from __future__ import annotations

import socket
import struct
from collections import Counter
from collections.abc import Iterator

import pytest
from kafka import KafkaAdminClient, KafkaProducer
from kafka.admin import NewTopic

from proxy.wire.messages import encode_request
from proxy.wire.model import Message
from rig.kafka import KafkaBroker
from rig.raw import recv_exact
from tests.support.prometheus import Prometheus, binary, by_label, prometheus_config, promtool, scalar
from tests.support.subprocess_proxy import SubprocessProxy

pytestmark = pytest.mark.broker

# ApiVersions versions to send, with repeats: the per-version counts are what Prometheus must report.
API_VERSIONS_SENT = (0, 1, 2, 3, 3, 4, 4, 4, 4)
PRODUCE_COUNT = 25


def send_api_versions(port: int, versions: tuple[int, ...]) -> int:
    """One raw connection, one ApiVersions request per entry of `versions`, each answered; bytes sent."""
    sent = 0
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        for corr, version in enumerate(versions, start=1):
            body = Message(client_software_name="sluice-prom-test", client_software_version="1") \
                if version >= 3 else Message()
            frame = encode_request(Message(request_api_key=18, request_api_version=version, correlation_id=corr,
                                           client_id="sluice-prom-test"), body)
            sock.sendall(struct.pack(">i", len(frame)) + frame)
            sent += 4 + len(frame)
            (size,) = struct.unpack(">i", recv_exact(sock, 4))
            response = recv_exact(sock, size)
            (got_corr, error_code) = struct.unpack_from(">ih", response, 0)
            assert (got_corr, error_code) == (corr, 0), f"ApiVersions v{version}: {response[:16].hex()}"
    return sent


@pytest.fixture
def sluice(kafka_broker: KafkaBroker) -> Iterator[SubprocessProxy]:
    with SubprocessProxy(kafka_broker.bootstrap) as proc:
        yield proc


@pytest.fixture
def prometheus(sluice: SubprocessProxy) -> Iterator[Prometheus]:
    binary("promtool")  # both binaries come from the same package; fail early if either is missing
    prom = Prometheus(prometheus_config(sluice.admin_port))
    try:
        prom.wait_ready()
        yield prom
    finally:
        prom.close()


def test_prometheus_scrapes_exact_request_counts(sluice: SubprocessProxy, prometheus: Prometheus,
                                                  kafka_broker: KafkaBroker, unique_topic: str) -> None:
    # The target is up: Prometheus scrapes Sluice's admin port with the project's scrape config.
    prometheus.wait_for('up{job="sluice"}', lambda r: scalar(r) == 1.0)
    # Nothing has talked to this Sluice yet: no request series, and no client bytes.
    assert prometheus.query('sluice_requests_total') == []
    assert scalar(prometheus.query('sluice_bytes_total{direction="client_to_proxy"}')) == 0.0

    # 1. Raw ApiVersions requests: exact counts per version and exact bytes.
    sent_bytes = send_api_versions(sluice.bootstrap_port, API_VERSIONS_SENT)
    expected = {str(v): float(n) for v, n in Counter(API_VERSIONS_SENT).items()}
    result = prometheus.wait_for('sluice_requests_total{api="ApiVersions"}',
                                 lambda r: by_label(r, "version") == expected)
    assert by_label(result, "version") == expected
    assert {r["metric"]["job"] for r in result} == {"sluice"}
    prometheus.wait_for('sluice_bytes_total{direction="client_to_proxy"}', lambda r: scalar(r) == sent_bytes)
    prometheus.wait_for('sum(sluice_request_latency_seconds_count{api="ApiVersions"})',
                        lambda r: scalar(r) == len(API_VERSIONS_SENT))

    # 2. A real client: PRODUCE_COUNT Produce requests, one record each (acks=1, no batching, each awaited).
    admin = KafkaAdminClient(bootstrap_servers=kafka_broker.bootstrap)
    try:
        admin.create_topics([NewTopic(unique_topic, num_partitions=1, replication_factor=1)])
    finally:
        admin.close()
    producer = KafkaProducer(bootstrap_servers=sluice.bootstrap, acks=1, linger_ms=0, retries=0)
    try:
        for i in range(PRODUCE_COUNT):
            producer.send(unique_topic, key=b"k%d" % i, value=b"v%d" % i, partition=0).get(timeout=30)
    finally:
        producer.close(timeout=10)
    prometheus.wait_for('sum(sluice_requests_total{api="Produce"})', lambda r: scalar(r) == PRODUCE_COUNT)
    # What Prometheus stored is what /metrics says (for a counter that is no longer moving).
    assert sluice.metric("sluice_requests_total", {"api": "Produce"}) == PRODUCE_COUNT
    # The ApiVersions series only grew by the client's own ApiVersions requests, never shrank.
    after = by_label(prometheus.query('sluice_requests_total{api="ApiVersions"}'), "version")
    assert all(after.get(v, 0.0) >= n for v, n in expected.items()), after


def test_promtool_accepts_metrics(sluice: SubprocessProxy) -> None:
    send_api_versions(sluice.bootstrap_port, (0, 3))  # so labelled series and histogram buckets exist
    text = sluice.metrics_text()
    assert "sluice_requests_total{" in text and "sluice_request_latency_seconds_bucket{" in text
    proc = promtool("check", "metrics", input_text=text)
    assert proc.returncode == 0, f"promtool check metrics failed ({proc.returncode}):\n{proc.stdout}{proc.stderr}"
