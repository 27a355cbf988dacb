"""While the upstream is down Sluice stays quiet: every client connection still fails (its connection is closed,
the failure counted in sluice_upstream_connect_errors_total), but the operational log gets at most one
``upstream_connect_failed`` event per broker per interval, the next one carrying the count not logged meanwhile
(proxy/server.py ``Proxy.connect_failed``). Sluice runs in-process in front of a port nothing listens on; its
operational log is captured with structlog.testing. And when a broker comes up on that port (a sidecar started
before its cluster), the same Sluice serves it, with no restart."""

from __future__ import annotations

import math
import socket
import struct
import time
from collections.abc import Iterator, MutableMapping
from typing import Any

import pytest
from kafka import KafkaAdminClient, KafkaProducer
from kafka.admin import NewTopic
from structlog.testing import capture_logs

from proxy.accesslog import LogLimiter
from proxy.server import _CONNECT_LOG_INTERVAL_S as INTERVAL
from rig.kafka import KafkaBroker, free_ports, metadata_brokers, read_topic
from rig.proxy_thread import ProxyThread

ATTEMPTS = 50
#: ApiVersions v0, correlation id 1, client id "test"
API_VERSIONS = struct.pack(">ihhih", 14, 18, 0, 1, 4) + b"test"


@pytest.fixture
def logs() -> Iterator[list[MutableMapping[str, Any]]]:
    """The operational log events of the test (asserted on, not printed)."""
    with capture_logs() as events:
        yield events


def attempt(port: int) -> None:
    """Connect, send an ApiVersions request, and see the connection closed without an answer (bounded wait)."""
    with socket.create_connection(("127.0.0.1", port), timeout=15) as s:
        try:
            s.sendall(API_VERSIONS)
            data = s.recv(65536)
        except (ConnectionResetError, BrokenPipeError):
            return
        assert data == b"", f"expected the connection closed, got {data[:64]!r}"


def failures(logs: list[MutableMapping[str, Any]]) -> list[MutableMapping[str, Any]]:
    return [e for e in logs if e["event"] == "upstream_connect_failed"]


def test_connect_failures_are_logged_once_per_interval_with_the_count_not_logged(
        logs: list[MutableMapping[str, Any]]) -> None:
    (dead,) = free_ports(1)
    shift = [0.0]  # added to the real clock of Sluice's connect-failure log limiter
    with ProxyThread(f"127.0.0.1:{dead}") as sluice:
        sluice.proxy._connect_log = LogLimiter(INTERVAL, lambda: time.monotonic() + shift[0])
        start = time.monotonic()
        for _ in range(ATTEMPTS):
            attempt(sluice.proxy.bootstrap_port)
        elapsed = time.monotonic() - start
        assert sluice.total("sluice_upstream_connect_errors_total") == ATTEMPTS  # every one failed
        logged = failures(logs)
        assert 1 <= len(logged) <= math.ceil(elapsed / INTERVAL) + 1, (elapsed, logged)
        first = logged[0]
        assert (first["log_level"], first["node_id"], first["not_logged"]) == ("warning", None, 0)
        assert first["upstream"] == [f"127.0.0.1:{dead}"] and first["interval_s"] == INTERVAL
        # each logged event accounts for itself and the ones not logged before it
        accounted = sum(e["not_logged"] + 1 for e in logged)
        assert accounted <= ATTEMPTS

        # An interval later the next failure is logged, with the count of those that were not.
        shift[0] = INTERVAL
        attempt(sluice.proxy.bootstrap_port)
        assert sluice.total("sluice_upstream_connect_errors_total") == ATTEMPTS + 1
        logged_next = failures(logs)
        assert len(logged_next) == len(logged) + 1
        assert logged_next[-1]["not_logged"] == ATTEMPTS - accounted


def test_a_broker_that_comes_up_after_sluice_is_served_without_a_restart(
        logs: list[MutableMapping[str, Any]]) -> None:
    """A sidecar started before its cluster answers (a pod whose broker is still starting, a cluster briefly
    away): Sluice could not ask for the brokers at its start, so it opened no broker listener, and the client's
    connections are closed while nothing answers. Once the broker is up, the same Sluice serves it: its Metadata
    names Sluice's listener for the broker (never the broker's own address), and every record produced through it
    is stored once, in order, as read back through it by another client kind (librdkafka)."""
    port, controller = free_ports(2)
    with ProxyThread(f"127.0.0.1:{port}") as sluice:
        attempt(sluice.proxy.bootstrap_port)
        assert sluice.total("sluice_upstream_connect_errors_total") == 1 and failures(logs)
        with KafkaBroker(port=port, controller_port=controller):
            (node_id, _, advertised), = metadata_brokers("127.0.0.1", sluice.proxy.bootstrap_port, timeout=15)
            assert advertised == sluice.settings.listen.broker_port_base + node_id != port
            topic = "comes-up-late"
            admin = KafkaAdminClient(bootstrap_servers=sluice.bootstrap)
            try:
                admin.create_topics([NewTopic(topic, num_partitions=1, replication_factor=1)])
            finally:
                admin.close()
            values = [b"late-%03d" % i for i in range(50)]
            producer = KafkaProducer(bootstrap_servers=sluice.bootstrap, acks="all", linger_ms=0)
            try:
                # one at a time: a batch per record, each acknowledged before the next is sent
                offsets = [producer.send(topic, value=v).get(timeout=30).offset for v in values]
            finally:
                producer.close()
            assert offsets == list(range(len(values)))
            stored = read_topic(sluice.bootstrap, topic)
            assert [(offset, value) for offset, _, value in stored[0]] == list(enumerate(values))
