"""The example policy package (examples/sluice-schema-id) as a user installs it: built and installed by pip into a
directory of its own, on the PYTHONPATH of a real Sluice process (the venv is left alone), found through its
``sluice.policies`` entry point and switched on by its section.

Real producers (kafka-python, confluent-kafka; compressed and not) write, in one burst, records that carry a
Schema Registry schema id to one partition of a checked topic and records that do not to another. The client sees
Kafka's answer for each record (INVALID_RECORD, with KIP-467's per-record message where the client reads it), the
refused records never reach the topic, and the accepted ones arrive once, in order, unchanged: read back from the
broker directly.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, NamedTuple

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Producer, TopicPartition
from kafka import KafkaProducer
from kafka import errors as kafka_errors

from rig.kafka import KafkaBroker
from rig.sluice_process import SluiceProcess
from tests.support.records import Rec, assert_same_records, rec_of
from tests.support.topics import create_topic

pytestmark = pytest.mark.broker

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "sluice-schema-id"
#: the [[schema_id.topics]] entry: every topic this module creates
ENTRY = "checked-*"
GOOD, BAD = 0, 1  # the partitions
NO_ID = "the value does not start with a schema id"


class Installed(NamedTuple):
    sluice: SluiceProcess
    access_log: Path


@pytest.fixture(scope="module")
def installed(kafka_broker: KafkaBroker, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Installed]:
    tmp = tmp_path_factory.mktemp("schema-id")
    # built from a copy: setuptools writes its build tree next to the sources
    source = tmp / "source"
    shutil.copytree(EXAMPLE, source, ignore=shutil.ignore_patterns("__pycache__", "build", "*.egg-info", "tests"))
    site = tmp / "site"
    pip = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                          "--no-index", "--disable-pip-version-check", "--target", str(site), str(source)],
                         capture_output=True, text=True, timeout=300)
    assert pip.returncode == 0, pip.stderr
    config = tmp / "sluice.toml"
    config.write_text(f'[[schema_id.topics]]\ntopic = "{ENTRY}"\n')
    path = os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH", "")) if p)
    access_log = tmp / "access.jsonl"
    with SluiceProcess(kafka_broker.bootstrap, {"PYTHONPATH": path, "SLUICE_CONFIG": str(config)},
                       access_log=access_log) as sluice:
        yield Installed(sluice, access_log)


def records(tag: str) -> tuple[list[Rec], list[Rec]]:
    """20 records with a schema id (Confluent's wire format: magic byte 0, the 4-byte id) for the GOOD partition,
    5 without for the BAD one; every field distinct per record."""
    ts = int(time.time() * 1000) - 60_000
    good = [Rec(GOOD, f"k-{i}".encode(), b"\x00\x00\x00\x00\x01" + f'{{"{tag}": {i}}}'.encode(),
                (("h", str(i).encode()),), ts + i) for i in range(20)]
    bad = [Rec(BAD, f"k-bad-{i}".encode(), f'{{"{tag}": {i}}}'.encode(), (("h", b"bad"),), ts + i)
           for i in range(5)]
    return good, bad


def interleaved(good: list[Rec], bad: list[Rec]) -> list[Rec]:
    """One burst, as the producers below send it: lingering 1 s, every batch waits for ``flush()``."""
    out: list[Rec] = []
    for i, rec in enumerate(good):
        out.append(rec)
        if i < len(bad):
            out.append(bad[i])
    return out


def produce_kafka_python(bootstrap: str, topic: str, client_id: str, compression: str,
                         recs: list[Rec]) -> dict[Rec, BaseException | None]:
    # Not idempotent (kafka-python 3's default with acks=all): its idempotent producer classes a batch's
    # INVALID_RECORD as fatal (TransactionManager.classify_batch_error, although its comment says the batch alone
    # fails) and then fails every batch not yet answered with that error, so a good partition's batch sent in a
    # request of its own after the refused one failed as refused now and then; the Java client and librdkafka fail
    # only the refused batch.
    producer = KafkaProducer(bootstrap_servers=bootstrap, client_id=client_id, acks="all", linger_ms=1000,
                             enable_idempotence=False, compression_type=None if compression == "none" else compression)
    try:
        futures = [(r, producer.send(topic, key=r.key, value=r.value, partition=r.partition,
                                     timestamp_ms=r.timestamp_ms, headers=list(r.headers))) for r in recs]
        producer.flush(60)
    finally:
        producer.close()
    return {r: f.exception for r, f in futures}


def produce_confluent(bootstrap: str, topic: str, client_id: str, compression: str,
                      recs: list[Rec]) -> dict[Rec, BaseException | KafkaError | None]:
    producer = Producer({"bootstrap.servers": bootstrap, "client.id": client_id, "acks": "all", "linger.ms": 1000,
                         "compression.type": compression, "log_level": 0})
    outcome: dict[Rec, BaseException | KafkaError | None] = {}

    def delivered(r: Rec) -> Callable[[KafkaError | None, Any], None]:
        return lambda err, _message: outcome.__setitem__(r, err)

    for r in recs:
        producer.produce(topic, key=r.key, value=r.value, partition=r.partition, timestamp=r.timestamp_ms,
                         headers=list(r.headers), on_delivery=delivered(r))
    assert producer.flush(60) == 0
    return outcome


def read_back(bootstrap: str, topic: str) -> tuple[list[Rec], int]:
    """The GOOD partition's records and the BAD partition's end offset, read from ``bootstrap`` directly."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "unused", "enable.auto.commit": False,
                         "log_level": 0})
    try:
        end = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1] for p in (GOOD, BAD)}
        consumer.assign([TopicPartition(topic, GOOD, OFFSET_BEGINNING)])
        got: list[Rec] = []
        deadline = time.monotonic() + 30
        while len(got) < end[GOOD] and time.monotonic() < deadline:
            m = consumer.poll(0.5)
            if m is not None and m.error() is None:
                got.append(rec_of(m))
    finally:
        consumer.close()
    return got, end[BAD]


def access_log_lines(path: Path, client_id: str, refused: int) -> list[dict[str, Any]]:
    """The client's Produce lines, once they account for ``refused`` records (the log is flushed within a
    second of a line: a bounded poll of the file)."""
    deadline = time.monotonic() + 10
    while True:
        lines = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
        mine = [line for line in lines if line.get("client_id") == client_id and line.get("api") == "Produce"]
        if sum(int(line.get("schema_id_refused", 0)) for line in mine) >= refused or time.monotonic() > deadline:
            return mine
        time.sleep(0.05)


@pytest.mark.parametrize(("client", "compression"), [
    ("kafka-python", "none"), ("kafka-python", "snappy"), ("kafka-python", "zstd"), ("confluent", "gzip"),
    ("confluent", "lz4")])
def test_records_without_a_schema_id_are_refused_and_the_rest_arrive(
        installed: Installed, kafka_broker: KafkaBroker, client: str, compression: str) -> None:
    sluice = installed.sluice
    topic = f"checked-{client}-{compression}-{uuid.uuid4().hex[:8]}"
    client_id = f"schema-id-{uuid.uuid4().hex[:8]}"
    create_topic(kafka_broker.bootstrap, topic, partitions=2)
    good, bad = records(f"{client}-{compression}")
    refused_before = sluice.metric("sluice_schema_id_refused_records_total", {"topic": ENTRY})

    outcome: Mapping[Rec, BaseException | KafkaError | None]
    if client == "kafka-python":
        outcome = produce_kafka_python(sluice.bootstrap, topic, client_id, compression, interleaved(good, bad))
        for r in bad:
            refusal = outcome[r]
            assert isinstance(refusal, kafka_errors.InvalidRecordError), (r, refusal)
            assert NO_ID in str(refusal)  # the record's own message (KIP-467 RecordErrors)
    else:
        outcome = produce_confluent(sluice.bootstrap, topic, client_id, compression, interleaved(good, bad))
        for r in bad:
            error = outcome[r]
            assert isinstance(error, KafkaError) and error.code() == KafkaError.INVALID_RECORD, (r, error)
    assert [outcome[r] for r in good] == [None] * len(good)

    got, bad_end = read_back(kafka_broker.bootstrap, topic)
    assert bad_end == 0  # no refused record reached the topic
    assert_same_records(good, got)  # every accepted one, once, in order, unchanged
    assert sluice.metric("sluice_schema_id_refused_records_total", {"topic": ENTRY}) - refused_before == len(bad)
    refusals = [(line["schema_id_refused"], line["bytes_proxy_to_upstream"] != 0)
                for line in access_log_lines(installed.access_log, client_id, len(bad)) if "schema_id_refused" in line]
    # kafka-python drains every ready partition of a broker into one request: it went upstream without the refused
    # partition; librdkafka sends a request per partition: Sluice answered that one itself, nothing went upstream
    assert refusals == [(len(bad), client == "kafka-python")]


def test_acks_0_refused_closes_the_connection_and_sends_nothing_upstream(installed: Installed,
                                                                          kafka_broker: KafkaBroker) -> None:
    sluice = installed.sluice
    topic = f"checked-acks0-{uuid.uuid4().hex[:8]}"
    create_topic(kafka_broker.bootstrap, topic, partitions=2)
    good, bad = records("acks0")
    closed = sluice.metric("sluice_frames_rejected_total", {"reason": "refused"})
    producer = KafkaProducer(bootstrap_servers=sluice.bootstrap, acks=0, linger_ms=1000)
    try:
        for r in (good[0], bad[0]):  # one request: a passing partition and a refused one
            producer.send(topic, key=r.key, value=r.value, partition=r.partition, timestamp_ms=r.timestamp_ms)
        producer.flush(60)
        deadline = time.monotonic() + 30  # acks=0: flush() returns once written; Sluice reads it after
        while sluice.metric("sluice_frames_rejected_total", {"reason": "refused"}) == closed:
            assert time.monotonic() < deadline, "the acks=0 request was not refused"
            time.sleep(0.05)
    finally:
        producer.close()
    # the refusal came before anything of the request went upstream: a record acknowledged after it is the
    # partition's first
    after = KafkaProducer(bootstrap_servers=sluice.bootstrap, acks="all")
    try:
        assert after.send(topic, value=good[1].value, partition=GOOD).get(60).offset == 0
    finally:
        after.close()
    assert read_back(kafka_broker.bootstrap, topic)[1] == 0
