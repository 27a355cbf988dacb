"""Clients only ever connect to Sluice: the broker's real address never reaches them.

Two independent proofs, with kafka-python, confluent-kafka (librdkafka) and the Java client, each producing,
consuming in a group and asking for cluster metadata through Sluice:

1. Every byte Sluice writes to a client is recorded (a tap on ``ClientProtocol.send_client``), cut
   into response frames and matched to the request that asked for it by correlation id. Responses that carry addresses
   (Metadata, FindCoordinator, DescribeCluster; Fetch v16+/Produce v10+ node endpoints) are decoded and every
   host/port in them must be Sluice's; the broker's port (and its controller's) must appear in no response
   at all, neither as a big-endian int32 after its host (as every address struct writes it) in an address-carrying
   frame nor as ASCII digits in any frame.
2. The operating system's view: while the Java console consumer and a confluent-kafka consumer (each in its own
   process) run through Sluice, psutil samples their TCP connections; every remote port is one of Sluice's
   listeners.
"""

from __future__ import annotations

import struct
import subprocess
import sys
import textwrap
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from typing import Any

import psutil
import pytest
from confluent_kafka import Consumer as CKConsumer
from confluent_kafka import Producer as CKProducer
from confluent_kafka.admin import AdminClient as CKAdmin
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer

from proxy.core.chain import Chain
from proxy.core.connection import Connection
from proxy.core.exchange import Relayed
from proxy.io import transports
from proxy.wire.messages import decode_response, peek_request_header
from proxy.wire.model import Message
from rig.java_tools import CONSOLE_CONSUMER, JavaTools
from rig.kafka import KafkaBroker
from rig.kafka_python_group import wait_partitions_known
from rig.proxy_thread import ProxyThread
from rig.topics import create_topic

pytestmark = pytest.mark.broker

PRODUCE, FETCH, METADATA, FIND_COORDINATOR, API_VERSIONS, DESCRIBE_CLUSTER = 0, 1, 3, 10, 18, 60
ADDRESS_APIS = {METADATA: "Metadata", FIND_COORDINATOR: "FindCoordinator", DESCRIBE_CLUSTER: "DescribeCluster"}
RECORDS_PER_CLIENT = 50


class Tap:
    """Records, per client connection, the request headers Sluice read and every byte it wrote back."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.requests: dict[int, dict[int, tuple[int, int]]] = defaultdict(dict)  # conn -> corr -> (key, ver)
        self.written: dict[int, bytearray] = defaultdict(bytearray)

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        original_classify = Chain.classify
        original_send = transports.ClientProtocol.send_client
        tap = self

        def classify(chain: Chain, frame: bytes, now: float, info: Any = None, relayable: bool = False) -> Any:
            try:
                h = peek_request_header(frame)
            except Exception:  # malformed: Sluice rejects it itself; nothing is answered
                pass
            else:
                if info is not None:
                    with tap.lock:
                        tap.requests[info.conn_id][h.correlation_id] = (h.api_key, h.api_version)
            return original_classify(chain, frame, now, info, relayable)

        original_relay = Connection._relay

        def relay(conn: Connection, r: Relayed, wire: bytes | None) -> None:
            # a request of an API version relayed unread before is read by Chain.relay, not classify: every relayed
            # request is sent by Connection._relay
            h = r.header
            with tap.lock:
                tap.requests[conn.info.conn_id][h.correlation_id] = (h.api_key, h.api_version)
            original_relay(conn, r, wire)

        def send_client(client: transports.ClientProtocol, buffers: Any) -> None:
            buffers = list(buffers)
            if client.transport is not None and not client.torn_down:
                with tap.lock:
                    for data in buffers:
                        tap.written[client.conn.info.conn_id] += bytes(data)
            original_send(client, buffers)

        monkeypatch.setattr(Chain, "classify", classify)
        monkeypatch.setattr(Connection, "_relay", relay)
        monkeypatch.setattr(transports.ClientProtocol, "send_client", send_client)

    def frames(self) -> Iterator[tuple[int, int, bytes]]:
        """(api_key, api_version, response frame without its size prefix) for every complete response."""
        with self.lock:
            written = {c: bytes(b) for c, b in self.written.items()}
            requests = {c: dict(r) for c, r in self.requests.items()}
        for conn, data in written.items():
            pos = 0
            while len(data) - pos >= 4:
                (size,) = struct.unpack_from(">i", data, pos)
                if len(data) - pos - 4 < size:
                    break  # the connection closed mid-response
                frame = data[pos + 4 : pos + 4 + size]
                pos += 4 + size
                (corr,) = struct.unpack_from(">i", frame, 0)
                assert corr in requests[conn], f"connection {conn}: response to unknown correlation id {corr}"
                key, version = requests[conn][corr]
                yield key, version, frame


def addresses(msg: Message) -> Iterator[tuple[str, int]]:
    """Every (host, port) pair anywhere in a decoded message."""
    fields = msg.fields()
    if "port" in fields and "host" in fields:
        yield fields["host"], fields["port"]
    for value in fields.values():
        if isinstance(value, Message):
            yield from addresses(value)
        elif isinstance(value, list):
            for item in value:
                if isinstance(item, Message):
                    yield from addresses(item)


def carries_addresses(key: int, version: int) -> bool:
    return key in ADDRESS_APIS or (key == FETCH and version >= 16) or (key == PRODUCE and version >= 10)


# ------------------------------------------------------------------------------------------------ clients


def run_kafka_python(bootstrap: str, topic: str) -> None:
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all")
    try:
        for i in range(RECORDS_PER_CLIENT):
            producer.send(topic, key=b"kp-%d" % i, value=b"kafka-python %d" % i)
        producer.flush(30)
    finally:
        producer.close(10)
    consumer = KafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=f"kp-{topic}",
                             auto_offset_reset="earliest", enable_auto_commit=False)
    got = 0
    try:
        wait_partitions_known(consumer, topic, 2)  # the test's topic
        deadline = time.monotonic() + 60
        while got < RECORDS_PER_CLIENT and time.monotonic() < deadline:
            got += sum(len(m) for m in consumer.poll(timeout_ms=500).values())
        consumer.commit()
    finally:
        consumer.close()
    assert got >= RECORDS_PER_CLIENT
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        cluster = admin.describe_cluster()
    finally:
        admin.close()
    assert cluster["brokers"], cluster


def run_confluent(bootstrap: str, topic: str) -> None:
    producer = CKProducer({"bootstrap.servers": bootstrap, "acks": "all"})
    for i in range(RECORDS_PER_CLIENT):
        producer.produce(topic, key=b"ck-%d" % i, value=b"confluent %d" % i)
    assert producer.flush(30) == 0
    consumer = CKConsumer({"bootstrap.servers": bootstrap, "group.id": f"ck-{topic}",
                           "auto.offset.reset": "earliest", "enable.auto.commit": False})
    consumer.subscribe([topic])
    got = 0
    deadline = time.monotonic() + 60
    try:
        while got < RECORDS_PER_CLIENT and time.monotonic() < deadline:
            m = consumer.poll(0.5)
            if m is not None and m.error() is None:
                got += 1
        consumer.commit(asynchronous=False)
    finally:
        consumer.close()
    assert got >= RECORDS_PER_CLIENT
    admin = CKAdmin({"bootstrap.servers": bootstrap})
    cluster = admin.describe_cluster().result(30)
    assert cluster.nodes
    assert admin.list_topics(timeout=30).brokers


def remote_ports(proc: subprocess.Popen[Any]) -> set[int]:
    """The remote ports of a running process's TCP connections now (empty once it has exited)."""
    try:
        return {c.raddr.port for c in psutil.Process(proc.pid).net_connections(kind="tcp") if c.raddr}
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return set()


def watch_connections(proc: subprocess.Popen[Any], deadline_s: float) -> tuple[set[int], float]:
    """Sample a running process's TCP connections (remote ports) until it exits; (ports, seconds waited)."""
    remote: set[int] = set()
    start = time.monotonic()
    deadline = start + deadline_s
    while proc.poll() is None and time.monotonic() < deadline:
        remote |= remote_ports(proc)
        time.sleep(0.02)  # sampling interval while the client runs; the loop ends when it exits
    return remote, time.monotonic() - start


CONFLUENT_CONSUMER_SCRIPT = textwrap.dedent(
    """
    import sys, time
    from confluent_kafka import Consumer
    bootstrap, topic, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "sub-" + topic, "auto.offset.reset": "earliest"})
    c.subscribe([topic])
    got, deadline = 0, time.monotonic() + 60
    while got < n and time.monotonic() < deadline:
        m = c.poll(0.5)
        if m is not None and m.error() is None:
            got += 1
    print(got, flush=True)
    sys.stdin.read()  # its connections stay open until the test has looked at them (it closes stdin)
    c.close()
    """
)


# -------------------------------------------------------------------------------------------------- test


@pytest.fixture
def tapped_sluice(kafka_broker: KafkaBroker, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[ProxyThread, Tap]]:
    tap = Tap()
    tap.install(monkeypatch)
    with ProxyThread(kafka_broker.bootstrap) as proxy:
        yield proxy, tap


def test_broker_address_never_reaches_clients(tapped_sluice: tuple[ProxyThread, Tap], kafka_broker: KafkaBroker,
                                              java_tools: JavaTools, unique_topic: str) -> None:
    sluice, tap = tapped_sluice
    bootstrap = sluice.bootstrap
    create_topic(kafka_broker.bootstrap, unique_topic, partitions=2)

    run_kafka_python(bootstrap, unique_topic)
    run_confluent(bootstrap, unique_topic)
    total = 2 * RECORDS_PER_CLIENT

    # The Java console consumer (Fetch v17, fetch sessions, a group) in its own process, watched by psutil.
    java = java_tools.spawn(CONSOLE_CONSUMER, [
        "--bootstrap-server", bootstrap, "--topic", unique_topic, "--from-beginning", "--group", f"j-{unique_topic}",
        "--max-messages", str(total), "--timeout-ms", "20000",
    ])  # fmt: skip
    java_ports, _ = watch_connections(java, 90)
    out, err = java.communicate(timeout=30)
    assert java.returncode == 0, f"java console consumer failed:\n{err[-3000:]}"
    assert len(out.splitlines()) == total, err[-3000:]

    # confluent-kafka in its own process, watched the same way.
    # A short-lived client: sampled while it runs (a thread), and once more when it has consumed, while it still
    # holds its connections (sampling alone can miss them all on a loaded machine, where each look is slow).
    ck = subprocess.Popen([sys.executable, "-c", CONFLUENT_CONSUMER_SCRIPT, bootstrap, unique_topic, str(total)],
                          stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    sampled: list[set[int]] = []
    sampler = threading.Thread(target=lambda: sampled.append(watch_connections(ck, 90)[0]))
    sampler.start()
    assert ck.stdout is not None
    consumed = ck.stdout.readline()  # the script's own deadline bounds it
    ck_ports = remote_ports(ck)
    _, ck_err = ck.communicate(timeout=30)  # closes its stdin: the script closes its consumer and exits
    sampler.join()
    ck_ports |= sampled[0]
    assert ck.returncode == 0 and consumed.strip() == str(total), ck_err[-3000:]

    listener_ports = set(sluice.proxy.listener_ports().values())
    real_ports = {kafka_broker.port, kafka_broker.controller_port}

    # --- 2. the OS view: the client processes only ever connected to Sluice's listeners
    for name, ports in (("java", java_ports), ("confluent-kafka", ck_ports)):
        assert ports, f"{name}: no TCP connection observed"
        assert ports <= listener_ports, f"{name} connected to {ports - listener_ports}; Sluice: {listener_ports}"

    # --- 1. the bytes: no response frame carries the broker's address
    seen: Counter[str] = Counter()
    advertised: set[tuple[str, int]] = set()
    # An address on the wire, in every struct Kafka writes one in (Metadata and DescribeCluster brokers,
    # FindCoordinator's coordinators, KIP-951 NodeEndpoints): the host string's bytes, then the port as an int32
    # right after them. The port's four bytes alone also turn up by chance: a topic's error code (00 00), its
    # name's length (a varint) and first letter made 00 00 33 74, port 13172, in one run.
    port_int32 = {kafka_broker.host.encode() + struct.pack(">i", p) for p in real_ports}
    port_ascii = {str(p).encode() for p in real_ports}
    for key, version, frame in tap.frames():
        seen[ADDRESS_APIS.get(key, str(key))] += 1
        for digits in port_ascii:
            assert digits not in frame, f"api {key} v{version}: broker port {digits!r} as text in a response"
        if key == API_VERSIONS or carries_addresses(key, version):
            for raw in port_int32:
                assert raw not in frame, f"api {key} v{version}: the broker's host and port in a response"
        if carries_addresses(key, version):
            _, body = decode_response(key, version, frame)
            for host, port in addresses(body):
                if port < 0:
                    continue  # "no node" placeholder (e.g. FindCoordinator before the coordinator is up)
                advertised.add((host, port))
                assert port not in real_ports, f"api {key} v{version} names the broker: {host}:{port}"
                assert (host, port) in {("127.0.0.1", p) for p in listener_ports}, f"{host}:{port} is not Sluice"
    for api in ADDRESS_APIS.values():
        assert seen[api] > 0, f"no {api} response observed; the test would prove nothing about it ({seen})"
    assert advertised == {("127.0.0.1", sluice.proxy.router.port_for(kafka_broker.node_id))}
