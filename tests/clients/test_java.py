"""The Java client (Kafka's own console and perf tools, from the rig's jars) through Sluice.

The Java consumer is the one client that uses Fetch v17 with incremental fetch sessions (KIP-227) and reads
KIP-951 node endpoints, so this is the coverage for Sluice's Fetch rewriting path. Every check compares what came
back through Sluice with what was produced *and* with what the broker returns to the same tool directly
(partition, offset, timestamp, headers, key, value), so "unchanged" includes the fields Kafka assigns.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from rig.java_tools import CONSOLE_CONSUMER, CONSOLE_PRODUCER, JavaTools
from rig.kafka import KafkaBroker
from rig.proxy_thread import ProxyThread
from tests.support.records import assert_log_holds

pytestmark = pytest.mark.broker

SEP = "|"  # between the fields of a console line; never inside a key, value or header
HEADERS_DELIMITER = "#"  # between the headers and the key


@dataclass(frozen=True)
class Line:
    """One record as the console consumer prints it."""

    timestamp: int
    partition: int
    offset: int
    headers: str
    key: str
    value: str


def make_lines(n: int, keys: int, tag: str) -> list[tuple[str, str, str]]:
    """(headers, key, value) for n records; the value is unique, the key repeats every `keys` records."""
    return [(f"h-index:{i},h-tag:{tag}", f"key-{i % keys}", f"value {tag} {i} " + "x" * (i % 50)) for i in range(n)]


def produce(tools: JavaTools, bootstrap: str, topic: str, records: list[tuple[str, str, str]],
            compression: str = "none") -> None:
    args = [
        "--bootstrap-server", bootstrap, "--topic", topic,
        "--property", "parse.key=true", "--property", f"key.separator={SEP}",
        "--property", "parse.headers=true", "--property", f"headers.delimiter={HEADERS_DELIMITER}",
        "--property", "headers.separator=,", "--property", "headers.key.separator=:",
        "--producer-property", f"compression.type={compression}",
        "--producer-property", "acks=all",
    ]  # fmt: skip
    text = "".join(f"{h}{HEADERS_DELIMITER}{k}{SEP}{v}\n" for h, k, v in records)
    tools.run(CONSOLE_PRODUCER, args, input=text, timeout=90)


def consume(tools: JavaTools, bootstrap: str, topic: str, n: int, group: str | None = None) -> list[Line]:
    """Up to n records from the beginning; fewer only if 20 s pass without a record (then asserted by caller)."""
    args = [
        "--bootstrap-server", bootstrap, "--topic", topic, "--from-beginning",
        "--max-messages", str(n), "--timeout-ms", "20000",
        "--property", "print.timestamp=true", "--property", "print.partition=true",
        "--property", "print.offset=true", "--property", "print.headers=true", "--property", "print.key=true",
        "--property", f"key.separator={SEP}", "--property", "headers.separator=,",
        "--property", "headers.key.separator=:",
    ]  # fmt: skip
    if group is not None:
        args += ["--group", group]
    proc = tools.run(CONSOLE_CONSUMER, args, timeout=120, check=False)
    assert proc.returncode == 0 or "TimeoutException" in proc.stderr, f"console consumer failed:\n{proc.stderr}"
    out: list[Line] = []
    for raw in proc.stdout.splitlines():
        ts, part, off, headers, key, value = raw.split(SEP)
        assert ts.startswith("CreateTime:") and part.startswith("Partition:") and off.startswith("Offset:"), raw
        out.append(Line(int(ts.split(":", 1)[1]), int(part.split(":", 1)[1]), int(off.split(":", 1)[1]),
                        headers, key, value))
    assert len(out) == n, f"consumed {len(out)} of {n} records; stderr:\n{proc.stderr[-3000:]}"
    return out


@pytest.fixture(scope="module")
def sluice(kafka_broker: KafkaBroker) -> Iterator[ProxyThread]:
    with ProxyThread(kafka_broker.bootstrap) as p:
        yield p


def test_one_partition_exact_order(sluice: ProxyThread, kafka_broker: KafkaBroker, java_tools: JavaTools,
                                   unique_topic: str) -> None:
    java_tools.create_topic(sluice.bootstrap, unique_topic, partitions=1)
    records = make_lines(300, keys=7, tag="p1")
    produce(java_tools, sluice.bootstrap, unique_topic, records)
    got = consume(java_tools, sluice.bootstrap, unique_topic, len(records))
    assert [(r.headers, r.key, r.value) for r in got] == records
    assert [(r.partition, r.offset) for r in got] == [(0, i) for i in range(len(records))]
    assert_log_holds(kafka_broker.bootstrap, unique_topic, {0: len(records)})  # no record stored twice after them
    # Unchanged down to the broker-assigned fields: the same tool reading the broker directly sees the same.
    assert consume(java_tools, kafka_broker.bootstrap, unique_topic, len(records)) == got


@pytest.mark.parametrize("compression", ["none", "gzip", "snappy", "lz4", "zstd"])
def test_three_partitions_with_group(sluice: ProxyThread, kafka_broker: KafkaBroker, java_tools: JavaTools,
                                     unique_topic: str, compression: str) -> None:
    java_tools.create_topic(sluice.bootstrap, unique_topic, partitions=3)
    records = make_lines(400, keys=12, tag=compression)
    produce(java_tools, sluice.bootstrap, unique_topic, records, compression)
    got = consume(java_tools, sluice.bootstrap, unique_topic, len(records), group=f"g-{unique_topic}")

    # Every record once (values are unique), unchanged.
    assert Counter((r.headers, r.key, r.value) for r in got) == Counter(records)
    # Keys hash to partitions: each key lives in one partition, and its records keep the produced order.
    partition_of: dict[str, set[int]] = defaultdict(set)
    for r in got:
        partition_of[r.key].add(r.partition)
    assert all(len(p) == 1 for p in partition_of.values()), partition_of
    assert len({p for ps in partition_of.values() for p in ps}) > 1, "12 keys should spread over partitions"
    by_key_got: dict[str, list[str]] = defaultdict(list)
    for r in sorted(got, key=lambda r: (r.partition, r.offset)):
        by_key_got[r.key].append(r.value)
    by_key_want: dict[str, list[str]] = defaultdict(list)
    for _h, k, v in records:
        by_key_want[k].append(v)
    assert by_key_got == by_key_want
    # Within each partition the consumer saw offsets 0..n-1 in order (interleaving across partitions is free).
    per_partition: dict[int, list[int]] = defaultdict(list)
    for r in got:
        per_partition[r.partition].append(r.offset)
    assert all(offs == list(range(len(offs))) for offs in per_partition.values()), per_partition
    # and the log holds no more than those: no record stored twice after the last one the count read
    assert_log_holds(kafka_broker.bootstrap, unique_topic, {p: len(offs) for p, offs in per_partition.items()})
    # Same partitions, offsets, timestamps, headers, keys and values as the broker serves directly.
    direct = consume(java_tools, kafka_broker.bootstrap, unique_topic, len(records))
    assert sorted(direct, key=lambda r: (r.partition, r.offset)) == sorted(got, key=lambda r: (r.partition, r.offset))


def test_perf_tools_through_sluice(sluice: ProxyThread, java_tools: JavaTools, unique_topic: str) -> None:
    java_tools.create_topic(sluice.bootstrap, unique_topic, partitions=3)
    n = 20_000
    produced = java_tools.producer_perf(sluice.bootstrap, unique_topic, num_records=n, record_size=512,
                                        producer_props={"acks": "all", "compression.type": "lz4"}, timeout=120)
    assert produced.records == n
    consumed = java_tools.consumer_perf(sluice.bootstrap, unique_topic, messages=n, timeout=120)
    assert consumed.records == n
