"""A real Prometheus (Debian's ``prometheus`` package) scrapes Sluice's /metrics using config/prometheus.yml,
and its HTTP API reports exactly the traffic the test sent; ``promtool check metrics`` accepts /metrics.

The traffic is deterministic: ApiVersions requests over a raw socket (a known number per version, known bytes)
and Produce requests from kafka-python sent one at a time (acks=1, linger 0, each awaited: one request each).
A missing ``prometheus``/``promtool`` is a failure: ``make install`` installs them.
"""

from __future__ import annotations

import json
import re
import shutil
import socket
import struct
import subprocess
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kafka import KafkaAdminClient, KafkaProducer
from kafka.admin import NewTopic

from proxy.wire.messages import encode_request
from proxy.wire.model import Message
from rig.kafka import KafkaBroker, free_ports
from tests.support.subprocess_proxy import SubprocessProxy

pytestmark = pytest.mark.broker

REPO = Path(__file__).resolve().parents[2]
PROMETHEUS_YML = REPO / "config" / "prometheus.yml"

# ApiVersions versions to send, with repeats: the per-version counts are what Prometheus must report.
API_VERSIONS_SENT = (0, 1, 2, 3, 3, 4, 4, 4, 4)
PRODUCE_COUNT = 25


def _binary(name: str) -> str:
    path = shutil.which(name)
    assert path, f"{name} not found on PATH: install Debian's `prometheus` package (`make install` does)"
    return path


def prometheus_config(admin_port: int) -> str:
    """config/prometheus.yml with its single target pointed at this Sluice's admin port (interval 1 s)."""
    text = PROMETHEUS_YML.read_text()
    text, n = re.subn(r"targets:\s*\[[^\]]*\]", f'targets: ["127.0.0.1:{admin_port}"]', text)
    assert n == 1, f"expected one targets list in {PROMETHEUS_YML}, found {n}"
    text, n = re.subn(r"(?m)^(\s*scrape_interval:\s*)\S+", r"\g<1>1s", text)
    assert n >= 1, f"no scrape_interval in {PROMETHEUS_YML}"
    return text


class Prometheus:
    """A prometheus server subprocess on a free 127.0.0.1 port with its own temp storage."""

    def __init__(self, config_text: str) -> None:
        self.binary = _binary("prometheus")
        self.tmp = Path(tempfile.mkdtemp(prefix="sluice-prom-"))
        config = self.tmp / "prometheus.yml"
        config.write_text(config_text)
        (self.port,) = free_ports(1)
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = self.tmp / "prometheus.log"
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(
                [
                    self.binary,
                    f"--config.file={config}",
                    f"--storage.tsdb.path={self.tmp / 'data'}",
                    f"--web.listen-address=127.0.0.1:{self.port}",
                ],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")[-5000:]

    def wait_ready(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, f"prometheus exited with {self.proc.returncode}:\n{self.log_text()}"
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as resp:
                    if resp.status == 200:
                        return
            except (OSError, urllib.error.URLError):
                pass
            time.sleep(0.1)  # bounded poll of /-/ready
        raise AssertionError(f"prometheus not ready after {timeout}s:\n{self.log_text()}")

    def query(self, promql: str) -> list[dict[str, Any]]:
        """An instant query; the result vector ([{"metric": {...}, "value": [ts, "v"]}, ...])."""
        url = f"{self.url}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
        with urllib.request.urlopen(url, timeout=5) as resp:
            body = json.loads(resp.read())
        assert body["status"] == "success", body
        assert body["data"]["resultType"] == "vector", body
        result: list[dict[str, Any]] = body["data"]["result"]
        return result

    def wait_for(self, promql: str, check: Callable[[list[dict[str, Any]]], bool], timeout: float = 30.0
                 ) -> list[dict[str, Any]]:
        """Poll `promql` until `check(result)` holds (Prometheus scrapes every second); AssertionError with the
        last result otherwise."""
        deadline = time.monotonic() + timeout
        last: list[dict[str, Any]] = []
        while time.monotonic() < deadline:
            last = self.query(promql)
            if check(last):
                return last
            time.sleep(0.25)  # bounded poll of Prometheus' answer
        raise AssertionError(f"{promql}: condition not met in {timeout}s, last result {last}\n{self.log_text()}")

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        shutil.rmtree(self.tmp, ignore_errors=True)


def by_label(result: list[dict[str, Any]], label: str) -> dict[str, float]:
    return {r["metric"].get(label, ""): float(r["value"][1]) for r in result}


def scalar(result: list[dict[str, Any]]) -> float | None:
    return float(result[0]["value"][1]) if result else None


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        assert chunk, "connection closed by the proxy"
        buf += chunk
    return bytes(buf)


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
            (size,) = struct.unpack(">i", _recv_exact(sock, 4))
            response = _recv_exact(sock, size)
            (got_corr, error_code) = struct.unpack_from(">ih", response, 0)
            assert (got_corr, error_code) == (corr, 0), f"ApiVersions v{version}: {response[:16].hex()}"
    return sent


@pytest.fixture
def sluice(kafka_broker: KafkaBroker) -> Iterator[SubprocessProxy]:
    with SubprocessProxy(kafka_broker.bootstrap) as proc:
        yield proc


@pytest.fixture
def prometheus(sluice: SubprocessProxy) -> Iterator[Prometheus]:
    _binary("promtool")  # both binaries come from the same package; fail early if either is missing
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
    promtool = _binary("promtool")
    send_api_versions(sluice.bootstrap_port, (0, 3))  # so labelled series and histogram buckets exist
    text = sluice.metrics_text()
    assert "sluice_requests_total{" in text and "sluice_request_latency_seconds_bucket{" in text
    proc = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, f"promtool check metrics failed ({proc.returncode}):\n{proc.stdout}{proc.stderr}"
