"""An application beside its Sluice sidecar: the example of docker-compose.yml's ``app`` service and the application
of the Kubernetes pod test (rig/kube_pod.py).

It runs inside the Sluice image (Python and kafka-python, nothing else of Sluice's), with $KAFKA_BOOTSTRAP_SERVERS
at its sidecar on localhost (the Helm chart sets it). A sidecar in a plain second container (or a compose service)
may start after the application: it waits, bounded, until the sidecar's port accepts. It creates its topic (one
partition), produces $RECORDS records (acks=all, offsets checked 0..N-1), then consumes them in group $GROUP the way
a careful application does: a batch counts as consumed only once its offset commit has succeeded, and it does some
work per batch ($WORK_S seconds), so a stop lands mid-way. On SIGTERM it finishes the batch in hand, commits it if
Sluice still answers, and exits 0. Each step is a JSON line on stdout; the last, ``{"event": "stopped", "position":
P, ...}``, says where it stopped: every record below P consumed once, in order, and committed.
"""

import json
import os
import signal
import socket
import sys
import threading
import time

from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import NewTopic
from kafka.errors import KafkaError, TopicAlreadyExistsError
from kafka.structs import OffsetAndMetadata

BOOTSTRAP = os.environ["KAFKA_BOOTSTRAP_SERVERS"]
TOPIC = os.environ["TOPIC"]
GROUP = os.environ["GROUP"]
RECORDS = int(os.environ["RECORDS"])
WORK_S = float(os.environ.get("WORK_S", "0.05"))
stop = threading.Event()


def say(event: str, **fields: object) -> None:
    print(json.dumps({"event": event, **fields}), flush=True)


def wait_for_sidecar(timeout_s: float = 60.0) -> None:
    host, _, port = BOOTSTRAP.split(",")[0].rpartition(":")
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            socket.create_connection((host, int(port)), timeout=2).close()
            return
        except OSError as exc:
            if time.monotonic() > deadline:
                say("failed", why=f"nothing accepts on {BOOTSTRAP} after {timeout_s:.0f}s: {exc}")
                sys.exit(1)
            time.sleep(0.2)  # the sidecar is starting: poll its port, bounded by the deadline


def produce() -> None:
    admin = KafkaAdminClient(bootstrap_servers=BOOTSTRAP, client_id="pod-app")
    try:
        admin.create_topics([NewTopic(TOPIC, num_partitions=1, replication_factor=1)])
    except TopicAlreadyExistsError:
        pass
    finally:
        admin.close()
    producer = KafkaProducer(bootstrap_servers=BOOTSTRAP, acks="all", linger_ms=5, client_id="pod-app")
    futures = [producer.send(TOPIC, value=b"record-%06d" % i) for i in range(RECORDS)]
    producer.flush(timeout=60)
    offsets = [f.get(timeout=60).offset for f in futures]
    producer.close()
    if offsets != list(range(RECORDS)):
        say("failed", why=f"produced offsets are not 0..{RECORDS - 1}")
        sys.exit(1)
    say("produced", records=RECORDS)


def consume() -> None:
    tp = TopicPartition(TOPIC, 0)
    consumer = KafkaConsumer(bootstrap_servers=BOOTSTRAP, group_id=GROUP, client_id="pod-app",
                             enable_auto_commit=False, auto_offset_reset="earliest", max_poll_records=20,
                             request_timeout_ms=5000)
    consumer.subscribe([TOPIC])
    position = 0  # the next offset: everything below it consumed once, in order, and committed
    in_order = True
    while not stop.is_set():
        batch = consumer.poll(timeout_ms=500).get(tp, [])
        if not batch:
            continue
        for record in batch:
            if record.offset != position + batch.index(record) or record.value != b"record-%06d" % record.offset:
                in_order = False
        stop.wait(WORK_S)  # the application's work on the batch; a SIGTERM meanwhile still finishes it
        following = batch[-1].offset + 1
        try:
            consumer.commit({tp: OffsetAndMetadata(following, "", -1)}, timeout_ms=5000)
        except KafkaError as exc:  # Sluice gone (drained and closed): the batch is not counted, it is read again
            say("commit_failed", offset=following, error=type(exc).__name__)
            break
        position = following
        say("committed", offset=position)
    try:
        consumer.close(autocommit=False)
    except KafkaError:
        pass
    say("stopped", position=position, in_order=in_order, records=RECORDS)


signal.signal(signal.SIGTERM, lambda *_: stop.set())
wait_for_sidecar()
produce()
consume()
