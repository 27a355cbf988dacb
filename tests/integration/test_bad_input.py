"""Bad input is confined to its own connection: the proxy and a concurrent well-behaved client carry on."""

from __future__ import annotations

import socket
import struct
import time
from collections.abc import Iterator

import pytest
from kafka import KafkaConsumer, KafkaProducer

from rig.kafka import KafkaBroker
from rig.kafka_python_group import wait_partitions_known
from rig.proxy_thread import ProxyThread
from tests.support.records import Rec, assert_same_records, make_records

pytestmark = pytest.mark.broker


def rejected(sluice: ProxyThread, reason: str) -> float:
    return sluice.total("sluice_frames_rejected_total", reason=reason)


def request(api_key: int, version: int, body: bytes = b"", corr: int = 1) -> bytes:
    payload = struct.pack(">hhih", api_key, version, corr, 4) + b"test" + body
    return struct.pack(">i", len(payload)) + payload


def assert_closed_by_proxy(sock: socket.socket) -> None:
    """The proxy closes the connection: recv sees EOF (or a reset) within the timeout, no response bytes."""
    sock.settimeout(15)
    try:
        data = sock.recv(65536)
    except ConnectionResetError:
        return
    assert data == b"", f"expected the connection closed, got {data[:64]!r}"


BAD_INPUTS = {
    "garbage": (b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", "too_large"),
    "two_gib_frame": (struct.pack(">i", 2**31 - 1) + b"\x00" * 16, "too_large"),
    "negative_size": (struct.pack(">i", -5), "malformed"),
    "tiny_frame": (struct.pack(">i", 3) + b"abc", "malformed"),
    # Metadata v99: beyond the broker's (and Sluice's) range for an API Sluice decodes
    "metadata_v99": (request(3, 99), "unsupported_version"),
    # an API key Kafka does not define: refused by Sluice itself, never relayed
    "unknown_api_key": (request(999, 0), "unknown_api"),
}


@pytest.fixture(scope="module")
def sluice(kafka_broker: KafkaBroker) -> Iterator[ProxyThread]:
    with ProxyThread(kafka_broker.bootstrap) as p:
        yield p


def test_bad_connections_do_not_disturb_a_consumer(sluice: ProxyThread, unique_topic: str) -> None:
    records = make_records(200, 1)
    producer = KafkaProducer(bootstrap_servers=sluice.bootstrap, acks="all")
    consumer = KafkaConsumer(unique_topic, bootstrap_servers=sluice.bootstrap, group_id=f"g-{unique_topic}",
                             auto_offset_reset="earliest", enable_auto_commit=False)
    got: list[Rec] = []

    def send(rs: list[Rec]) -> None:
        for r in rs:
            producer.send(unique_topic, key=r.key, value=r.value, headers=list(r.headers), partition=0,
                          timestamp_ms=r.timestamp_ms)
        producer.flush(30)

    def drain(n: int) -> None:
        deadline = time.monotonic() + 60
        while len(got) < n and time.monotonic() < deadline:
            for msgs in consumer.poll(timeout_ms=500).values():
                got.extend(Rec(m.partition, m.key, m.value, tuple(m.headers), m.timestamp) for m in msgs)

    try:
        send(records[:100])
        wait_partitions_known(consumer, unique_topic, 1)  # auto-created by the producer: the broker's num.partitions
        drain(100)
        before = {reason: rejected(sluice, reason) for _, reason in BAD_INPUTS.values()}
        for name, (data, reason) in BAD_INPUTS.items():
            with socket.create_connection(("127.0.0.1", sluice.proxy.bootstrap_port)) as s:
                s.sendall(data)
                assert_closed_by_proxy(s)
            assert rejected(sluice, reason) > before[reason], f"{name}: no sluice_frames_rejected_total{{{reason}}}"
            before[reason] = rejected(sluice, reason)
        # A truncated frame, then the client goes away: nothing to answer, nothing else affected.
        with socket.create_connection(("127.0.0.1", sluice.proxy.bootstrap_port)) as s:
            s.sendall(struct.pack(">i", 256) + b"\x00\x03" * 10)
        # A version beyond the broker's for an API Sluice relays as bytes (DescribeConfigs v99): same.
        with socket.create_connection(("127.0.0.1", sluice.proxy.bootstrap_port)) as s:
            s.sendall(request(32, 99, b"\x00\x00\x00\x00"))
            assert_closed_by_proxy(s)
        send(records[100:])
        drain(200)
    finally:
        consumer.close()
        producer.close()
    assert_same_records(records, got, stored_in=(sluice.bootstrap, unique_topic))


def test_incomplete_frame_is_closed_after_request_timeout_while_a_consumer_carries_on(kafka_broker: KafkaBroker,
                                                                                     unique_topic: str) -> None:
    """Slowloris: a connection that sends part of a frame and then nothing is closed once the frame has stayed
    incomplete for limits.request_timeout_s (counted as request_timeout), whatever part it sent; a consumer
    on another connection keeps getting every record once, in order."""
    records = make_records(200, 1)
    api_versions = request(18, 0)
    with ProxyThread(kafka_broker.bootstrap, **{"limits.request_timeout_s": 0.5}) as sluice:
        producer = KafkaProducer(bootstrap_servers=sluice.bootstrap, acks="all")
        consumer = KafkaConsumer(unique_topic, bootstrap_servers=sluice.bootstrap, group_id=f"g-{unique_topic}",
                                 auto_offset_reset="earliest", enable_auto_commit=False)
        got: list[Rec] = []

        def send(rs: list[Rec]) -> None:
            for r in rs:
                producer.send(unique_topic, key=r.key, value=r.value, headers=list(r.headers), partition=0,
                              timestamp_ms=r.timestamp_ms)
            producer.flush(30)

        def drain(n: int) -> None:
            deadline = time.monotonic() + 60
            while len(got) < n and time.monotonic() < deadline:
                for msgs in consumer.poll(timeout_ms=500).values():
                    got.extend(Rec(m.partition, m.key, m.value, tuple(m.headers), m.timestamp) for m in msgs)

        slow: list[socket.socket] = []
        try:
            send(records[:100])
            wait_partitions_known(consumer, unique_topic, 1)  # auto-created: the broker's num.partitions
            drain(100)
            # Part of the size prefix; a size prefix and part of the frame; a whole request answered, then the
            # first bytes of the next one.
            for data in (api_versions[:2], api_versions[:9]):
                s = socket.create_connection(("127.0.0.1", sluice.proxy.bootstrap_port))
                slow.append(s)
                s.sendall(data)
            s = socket.create_connection(("127.0.0.1", sluice.proxy.bootstrap_port))
            slow.append(s)
            s.sendall(api_versions)
            s.settimeout(15)
            (size,) = struct.unpack(">i", s.recv(4, socket.MSG_WAITALL))
            assert struct.unpack(">i", s.recv(size, socket.MSG_WAITALL)[:4]) == (1,)  # its correlation id
            s.sendall(api_versions[:10])
            # The consumer's traffic goes on meanwhile, then every held connection is seen closed (EOF).
            send(records[100:])
            for s in slow:
                assert_closed_by_proxy(s)
            drain(200)
        finally:
            for s in slow:
                s.close()
            consumer.close()
            producer.close()
        assert sluice.total("sluice_frames_rejected_total", reason="request_timeout") == 3
        assert sluice.total("sluice_frames_rejected_total") == 3  # nothing of the consumer's was refused
    assert_same_records(records, got, stored_in=(kafka_broker.bootstrap, unique_topic))
