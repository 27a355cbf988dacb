"""Graceful shutdown of a real ``sluice run`` process on SIGTERM.

A client holds a long-poll Fetch (an empty partition, max_wait_ms > 0: the broker answers only when the wait
ends) when SIGTERM arrives. Sluice must stop accepting at once (new connections refused), still deliver that
response, then close the connection and exit 0. With a drain timeout shorter than the poll, it must give up on
the request at the timeout, close, and still exit 0.

"In flight" is established from Sluice's own metrics, not by waiting: the Fetch frame's bytes have been sent
upstream (sluice_bytes_total{direction="proxy_to_upstream"} grew by exactly its size) before the signal.

A client reading slower than Sluice writes, which sends another request once the drain began, still gets the
answer whole, then a FIN (not a reset): Sluice half-closes and reads what the client still sends before closing
(proxy/io/transports.py, ClientProtocol.close_client), and its exit waits for that.
"""

from __future__ import annotations

import signal
import socket
import struct
import time
from collections.abc import Iterator

import pytest
from kafka import KafkaAdminClient, KafkaProducer
from kafka.admin import NewTopic

from proxy.wire.messages import decode_response, encode_request
from proxy.wire.model import Message
from proxy.wire.records import decode_batches
from rig.kafka import KafkaBroker
from rig.raw import recv_exact
from tests.support.subprocess_proxy import SubprocessProxy

pytestmark = pytest.mark.broker

FETCH, FETCH_VERSION = 1, 12
CORRELATION_ID = 4242


@pytest.fixture
def empty_topic(kafka_broker: KafkaBroker, unique_topic: str) -> str:
    admin = KafkaAdminClient(bootstrap_servers=kafka_broker.bootstrap)
    try:
        admin.create_topics([NewTopic(unique_topic, num_partitions=1, replication_factor=1)])
    finally:
        admin.close()
    return unique_topic


def fetch_frame(topic: str, max_wait_ms: int, max_bytes: int = 1 << 20) -> bytes:
    """A FetchRequest v12 for partition 0 at offset 0 (of an empty topic the broker waits max_wait_ms)."""
    header = Message(request_api_key=FETCH, request_api_version=FETCH_VERSION, correlation_id=CORRELATION_ID,
                     client_id="sluice-shutdown-test")
    partition = Message(partition=0, current_leader_epoch=-1, fetch_offset=0, last_fetched_epoch=-1,
                        log_start_offset=-1, partition_max_bytes=max_bytes)
    body = Message(replica_id=-1, max_wait_ms=max_wait_ms, min_bytes=1, max_bytes=max_bytes, isolation_level=0,
                   session_id=0, session_epoch=-1, topics=[Message(topic=topic, partitions=[partition])],
                   forgotten_topics_data=[], rack_id="")
    frame = encode_request(header, body)
    return struct.pack(">i", len(frame)) + frame


def assert_eof(sock: socket.socket) -> None:
    try:
        data = sock.recv(1024)
    except ConnectionResetError:
        return
    assert data == b"", f"expected the connection closed, got {data[:32]!r}"


def send_in_flight(sluice: SubprocessProxy, sock: socket.socket, frame: bytes) -> None:
    """Send `frame` and return once Sluice has forwarded all of it upstream (a real condition, bounded)."""
    key = {"direction": "proxy_to_upstream"}
    before = sluice.metric("sluice_bytes_total", key)
    sock.sendall(frame)
    deadline = time.monotonic() + 10
    while sluice.metric("sluice_bytes_total", key) < before + len(frame):
        assert time.monotonic() < deadline, "the Fetch never reached the upstream side of Sluice"
        time.sleep(0.02)  # bounded poll of Sluice's byte counter


def wait_refused(ports: list[int], deadline_s: float = 10.0) -> None:
    """Every port refuses a new TCP connection within the deadline (listeners closed on SIGTERM)."""
    deadline = time.monotonic() + deadline_s
    pending = list(ports)
    while pending:
        port = pending[0]
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                pass
        except ConnectionRefusedError:
            pending.pop(0)
            continue
        assert time.monotonic() < deadline, f"port {port} still accepts connections after SIGTERM"
        time.sleep(0.02)  # bounded poll until the listener is closed


def stopped_event(sluice: SubprocessProxy) -> dict[str, object]:
    events = [e for e in sluice.log_events() if e.get("event") == "stopped"]
    assert len(events) == 1, sluice.stderr_text()
    return events[0]


@pytest.fixture
def sluice_factory(kafka_broker: KafkaBroker) -> Iterator[list[SubprocessProxy]]:
    started: list[SubprocessProxy] = []
    yield started
    for proc in started:
        proc.close()


def start(kafka_broker: KafkaBroker, started: list[SubprocessProxy], drain_s: float) -> SubprocessProxy:
    proc = SubprocessProxy(kafka_broker.bootstrap, {"SLUICE_SHUTDOWN__DRAIN_TIMEOUT_S": str(drain_s)})
    started.append(proc)
    return proc


def test_sigterm_drains_an_in_flight_fetch(kafka_broker: KafkaBroker, empty_topic: str,
                                           sluice_factory: list[SubprocessProxy]) -> None:
    sluice = start(kafka_broker, sluice_factory, drain_s=20.0)
    node_port = sluice.broker_port(kafka_broker.node_id)
    with socket.create_connection(("127.0.0.1", node_port), timeout=30) as sock:
        send_in_flight(sluice, sock, fetch_frame(empty_topic, max_wait_ms=4000))
        sluice.signal(signal.SIGTERM)

        # New connections are refused while the old one is still being drained.
        wait_refused([sluice.bootstrap_port, node_port])
        assert sluice.is_running, "Sluice exited before answering the in-flight Fetch"

        # The in-flight response still arrives, whole and correct...
        (size,) = struct.unpack(">i", recv_exact(sock, 4))
        frame = recv_exact(sock, size)
        header, body = decode_response(FETCH, FETCH_VERSION, frame)
        assert header.correlation_id == CORRELATION_ID
        assert body.error_code == 0
        [topic] = body.responses
        assert topic.topic == empty_topic
        [partition] = topic.partitions
        assert (partition.partition_index, partition.error_code, partition.high_watermark) == (0, 0, 0)
        # ...then the connection is closed.
        assert_eof(sock)

    assert sluice.wait(timeout=30) == 0, sluice.stderr_text()
    assert stopped_event(sluice)["abandoned_requests"] == 0


def test_drain_timeout_bounds_shutdown(kafka_broker: KafkaBroker, empty_topic: str,
                                       sluice_factory: list[SubprocessProxy]) -> None:
    sluice = start(kafka_broker, sluice_factory, drain_s=0.5)
    with socket.create_connection(("127.0.0.1", sluice.broker_port(kafka_broker.node_id)), timeout=30) as sock:
        send_in_flight(sluice, sock, fetch_frame(empty_topic, max_wait_ms=30_000))
        sluice.signal(signal.SIGTERM)
        # Sluice gives up on the 30 s poll after its drain timeout: it closes without a response and exits 0.
        assert_eof(sock)
    assert sluice.wait(timeout=20) == 0, sluice.stderr_text()
    assert stopped_event(sluice)["abandoned_requests"] == 1


#: what the slow client's answer holds: 48 records of 128 KiB, 6 MiB, far more than the sockets' buffers between
RECORDS, RECORD_BYTES = 48, 128 << 10


def test_sigterm_delivers_a_large_answer_whole_to_a_slow_client_that_sent_more_after_the_drain_began(
        kafka_broker: KafkaBroker, empty_topic: str, sluice_factory: list[SubprocessProxy]) -> None:
    """A consumer reading slower than Sluice writes (its receive buffer small, not reading yet) has a 6 MiB answer
    coming when SIGTERM arrives, and sends one more request once the drain began (a heartbeat, its next fetch),
    which Sluice does not read. It still reads the answer whole, every record as produced, and then the end of
    the stream: a FIN, not a reset. (Before: Sluice closed with that request unread, so its kernel sent an RST
    and dropped what it had not sent yet, and the process exited with the rest of the answer still in its
    buffer.)"""
    values = [bytes([i]) * RECORD_BYTES for i in range(RECORDS)]
    producer = KafkaProducer(bootstrap_servers=kafka_broker.bootstrap, acks="all", linger_ms=0,
                             max_request_size=4 << 20)
    try:
        for v in values:
            producer.send(empty_topic, v, partition=0)
        producer.flush(30)
    finally:
        producer.close()
    sluice = start(kafka_broker, sluice_factory, drain_s=20.0)
    node_port = sluice.broker_port(kafka_broker.node_id)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    with sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16 << 10)  # before connect: the window stays small
        sock.settimeout(30)
        sock.connect(("127.0.0.1", node_port))
        send_in_flight(sluice, sock, fetch_frame(empty_topic, max_wait_ms=0, max_bytes=16 << 20))
        sluice.signal(signal.SIGTERM)
        wait_refused([sluice.bootstrap_port, node_port])  # the drain began: Sluice reads nothing more
        sock.sendall(fetch_frame(empty_topic, max_wait_ms=0))  # never read, never answered

        (size,) = struct.unpack(">i", recv_exact(sock, 4))
        header, body = decode_response(FETCH, FETCH_VERSION, recv_exact(sock, size))
        assert header.correlation_id == CORRELATION_ID and body.error_code == 0
        [topic] = body.responses
        [partition] = topic.partitions
        assert partition.error_code == 0
        got = [bytes(r.value or b"") for b in decode_batches(partition.records or b"") for r in b.records]
        assert got == values
        assert sock.recv(1024) == b""  # a FIN: a reset raises ConnectionResetError here

    assert sluice.wait(timeout=30) == 0, sluice.stderr_text()
    assert stopped_event(sluice)["abandoned_requests"] == 0
