"""An application beside its Sluice sidecar: the example of docker-compose.yml's ``app`` service and the application
of the Kubernetes pod test (rig/kube_pod.py).

It runs inside the Sluice image (Python and kafka-python, nothing else of Sluice's), with $KAFKA_BOOTSTRAP_SERVERS
at its sidecar on localhost (the Helm chart sets it). A sidecar in a plain second container (or a compose service)
may start after the application, and the broker behind it later still (a cold JVM, in a compose file that starts
everything at once): its first client retries its bootstrap for up to $BOOTSTRAP_TIMEOUT_S seconds, not
kafka-python's 30, before it counts as failed. It creates its topic (one partition), produces $RECORDS records
(acks=all, offsets checked 0..N-1), then consumes them in group $GROUP the way a careful application does: a batch
counts as consumed only once its offset commit has succeeded, and it does some work per batch ($WORK_S seconds), so
a stop lands mid-way. On SIGTERM it finishes the batch in hand, commits it if Sluice still answers, and exits 0.
Each step is a JSON line on stdout; the last, ``{"event": "stopped", "position": P, ...}``, says where it stopped:
every record below P consumed once, in order, and committed; a failure is ``{"event": "failed", "why": ...}`` and
exit code 1.
"""

import json
import os
import signal
import sys
import threading

from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import NewTopic
from kafka.errors import KafkaError, TopicAlreadyExistsError
from kafka.structs import OffsetAndMetadata

BOOTSTRAP = os.environ["KAFKA_BOOTSTRAP_SERVERS"]
TOPIC = os.environ["TOPIC"]
GROUP = os.environ["GROUP"]
RECORDS = int(os.environ["RECORDS"])
WORK_S = float(os.environ.get("WORK_S", "0.05"))
#: once this many records are committed, the work on the next batch lasts until the application is stopped (0:
#: never): a test's stop then lands with a batch in hand, whenever it comes (rig/kube_pod.py)
HOLD_AT = int(os.environ.get("HOLD_AT", "0"))
BOOTSTRAP_TIMEOUT_S = float(os.environ.get("BOOTSTRAP_TIMEOUT_S", "180"))
stop = threading.Event()


def say(event: str, **fields: object) -> None:
    print(json.dumps({"event": event, **fields}), flush=True)


def produce() -> None:
    # kafka-python retries a bootstrap that is refused, or closed by a sidecar whose broker is not up yet, with
    # backoff until this timeout: the application's first contact, so it carries the wait for the whole stack.
    admin = KafkaAdminClient(bootstrap_servers=BOOTSTRAP, client_id="pod-app",
                             bootstrap_timeout_ms=int(BOOTSTRAP_TIMEOUT_S * 1000))
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
        # the application's work on the batch; a SIGTERM meanwhile still finishes it
        stop.wait(None if HOLD_AT and position >= HOLD_AT else WORK_S)
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
try:
    produce()
    consume()
except Exception as exc:  # a client's error: said as the failure it is, for the checks that read these lines
    say("failed", why=f"{type(exc).__name__}: {exc}")
    sys.exit(1)
