"""Transactions (KIP-98) end to end through Sluice, with every policy that edits a Fetch on: Sluice terminating
fetch sessions (``[sessions] mode = "terminate"``: responses rebuilt from its own upstream session), byte budgets
(``[size_limit]``: the requests clamped, so a partition's records end after a few batches, often inside a
transaction) and a KIP-73 throttle leaving partitions' records out of responses (``[throttle]``).

Two transactional producers and an idempotent one write through Sluice too (FindCoordinator for a transactional
id, InitProducerId, AddPartitionsToTxn, EndTxn), interleaved in the same partitions: transactions of one producer
aborted while the other's commit, batches of one record and of many, compressed and not. Five consumers read the
whole topic through Sluice with ``isolation.level = read_committed``, one of each kind: without fetch sessions
(confluent-kafka/librdkafka, aiokafka), with them (the Java consumer, kafka-python), and newest versions first
(franz-go). A read_committed consumer reads up to the last stable offset and drops an aborted transaction's
records using the response's aborted-transaction list and the producer's abort marker (a control batch): a response
Sluice rebuilt or cut must keep both, and the LSO, for its partitions.

What each consumer must see: every committed record once, unchanged, each partition's in offset order; no record
of an aborted transaction; and while a transaction is open, nothing at or past its first offset (the LSO), not even
records written after it outside any transaction, until it commits, then all of them.

And the sidecar killed -9 in the middle of transactions sent through it (Sluice as a process of its own,
restarted on its ports): each transaction commits or aborts whole; what committed is read once.
"""

from __future__ import annotations

import itertools

import pytest
from confluent_kafka import KafkaException, Producer

from rig.java_tools import JavaTools
from rig.kafka import KafkaBroker
from rig.proxy_thread import ProxyThread
from rig.sluice_process import SluiceProcess
from tests.integration.test_sessions_terminate import create_topic
from tests.support.sharing import Member, check_exactly_once, java_member, members_of, python_member, wait_for_all
from tests.support.topics import wait_group_coordinator

pytestmark = pytest.mark.broker

PARTITIONS = 2
READ_COMMITTED = "read_committed"
#: a record's value, padded so that the budgets below end a partition after a few batches
PAD = 160
SLUICE = {
    "sessions.mode": "terminate",
    "size_limit.budgets": [{"client_id": "txn-*", "fetch_max_bytes": 8192, "partition_max_bytes": 2048}],
    # ~0.6 MB of records reach the five consumers in all, ~0.36 MB of it the backlog they start with. The quota
    # must bind however slowly a loaded machine starts them: 20 kB/s over Kafka's 11 s window allows 0.22 MB, so
    # the backlog is held back unless its reading spreads over more than 18 s (the whole run then takes ~30 s).
    "throttle.leader_rate_bytes": 20_000,
    "throttle.topics": [{"topic": "*", "replicas": "*"}],
    "throttle.consumers": [{"client_id": "txn-*"}],
}


@pytest.fixture
def topic(kafka_broker: KafkaBroker, unique_topic: str) -> str:
    create_topic(kafka_broker.bootstrap, unique_topic, PARTITIONS)
    return unique_topic


class Writers:
    """Two transactional producers (``a``: lz4, batches of many records; ``b``: a record per batch) and an idempotent
    one (``plain``), all through ``bootstrap``; :attr:`kept` the records a read_committed consumer must get."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.topic = topic
        common = {"bootstrap.servers": bootstrap, "acks": "all", "log_level": 0}
        self.a = Producer({**common, "transactional.id": f"txn-a-{topic}", "linger.ms": 5, "compression.type": "lz4"})
        self.b = Producer({**common, "transactional.id": f"txn-b-{topic}", "linger.ms": 0, "batch.num.messages": 1})
        self.plain = Producer({**common, "enable.idempotence": True, "linger.ms": 0})
        for p in (self.a, self.b):
            p.init_transactions(30)
        self.kept: list[tuple[str, str]] = []
        self._seq = itertools.count()

    def write(self, producer: Producer, tag: str, n: int, partition: int | None = None) -> list[tuple[str, str]]:
        """``n`` records to ``partition`` (None: alternating between the partitions), acknowledged (an aborted
        transaction's records are then in the log for the consumers to skip: aborting with records still queued
        purges them unsent)."""
        out = []
        for i in range(n):
            seq = next(self._seq)
            key, value = f"k{seq % 17}", f"{tag}-{seq:05d}-".ljust(PAD, "v")
            producer.produce(self.topic, key=key.encode(), value=value.encode(),
                             partition=i % PARTITIONS if partition is None else partition)
            out.append((key, value))
        assert producer.flush(30) == 0
        return out

    def rounds(self, n: int) -> None:
        """``n`` rounds of both transactions open at once and plain records between them: both commit, or one of
        them aborts while the other commits."""
        for r in range(n):
            self.a.begin_transaction()
            self.b.begin_transaction()
            a: list[tuple[str, str]] = []
            b: list[tuple[str, str]] = []
            for step in range(4):
                a += self.write(self.a, f"a{r}", 6)
                self.kept += self.write(self.plain, f"plain{r}", 2)
                b += self.write(self.b, f"b{r}", 3 + step)
            if r % 3 == 1:
                self.a.abort_transaction(30)
            else:
                self.a.commit_transaction(30)
                self.kept += a
            if r % 3 == 2:
                self.b.abort_transaction(30)
            else:
                self.b.commit_transaction(30)
                self.kept += b


def consumers(tools: JavaTools, bootstrap: str, topic: str) -> list[Member]:
    """One read_committed consumer of each kind, each in a group of its own reading both partitions whole."""
    group = f"g-{topic}"
    python = [python_member(client, bootstrap, topic, f"{group}-{client}", f"txn-{client}", assign=PARTITIONS,
                            isolation=READ_COMMITTED) for client in ("confluent", "aiokafka", "kafka-python")]
    return [*python,
            python_member("franz-go", bootstrap, topic, f"{group}-franz", "txn-franz-go", isolation=READ_COMMITTED),
            java_member(tools, bootstrap, topic, f"{group}-java", "txn-java",
                        props={"isolation.level": READ_COMMITTED})]


def values(records: list[tuple[str, str]]) -> set[str]:
    return {v for _, v in records}


def test_read_committed_consumers_of_every_kind_get_committed_records_once(
        kafka_broker: KafkaBroker, java_tools: JavaTools, topic: str) -> None:
    with ProxyThread(kafka_broker.bootstrap, **SLUICE) as sluice:
        writers = Writers(sluice.bootstrap, topic)
        writers.rounds(6)
        wait_group_coordinator(kafka_broker.bootstrap, f"g-{topic}-confluent")  # librdkafka's, in assign mode
        with members_of(*consumers(java_tools, sluice.bootstrap, topic)) as members:
            for m in members:
                wait_for_all([m], values(writers.kept), late_s=0)
            # A transaction left open in partition 0: its LSO stays at the transaction's first offset, so neither
            # its records nor the plain ones written after them may reach a read_committed consumer until it
            # commits. Plain records in partition 1 then: once a consumer has them it has fetched since.
            writers.a.begin_transaction()
            held = writers.write(writers.a, "open", 6, partition=0)
            held += writers.write(writers.plain, "after", 6, partition=0)
            writers.kept += writers.write(writers.plain, "beside", 6, partition=1)
            for m in members:
                wait_for_all([m], values(writers.kept), late_s=0)
                early = values(held) & {g.value for g in m.received}
                assert not early, f"{m.client_id} read past the last stable offset: {sorted(early)[:3]}"
            writers.a.commit_transaction(30)
            writers.kept += held
            writers.rounds(3)
            for m in members:
                wait_for_all([m], values(writers.kept))
                check_exactly_once([m], writers.kept)
        # the throttle edited responses under way: throttled partitions left empty (error 0, their real offsets)
        assert sluice.total("sluice_throttle_left_out_partitions_total", side="leader") > 0


def commit_or_abort(producer: Producer) -> bool:
    """What confluent-kafka's transactional API asks of an application (KIP-98): a retriable error, call commit
    again (the broker's outcome of a resent EndTxn is the first one's); an error that requires an abort, abort and
    say so (the caller sends the transaction again); a fatal one is raised. True: committed."""
    while True:
        try:
            producer.commit_transaction(30)
            return True
        except KafkaException as exc:
            err = exc.args[0]
            if err.retriable():
                continue
            if err.txn_requires_abort():
                producer.abort_transaction(30)
                return False
            raise


def test_transactions_in_flight_when_sluice_is_killed_commit_or_abort_whole(kafka_broker: KafkaBroker,
                                                                            topic: str) -> None:
    """The sidecar killed -9 and restarted on its ports (its container restarted in the pod) in the middle of
    transactions a producer sends through it: some records acknowledged, more in flight, the commit still to come.
    librdkafka resends what the dead connections carried (the same producer id, epoch and sequence numbers, which
    the broker deduplicates) and the application follows the API's error classes (:func:`commit_or_abort`). A
    read_committed consumer through Sluice, Sluice terminating its fetch sessions, gets the records of every
    transaction that committed once, in order, and none of one that aborted."""
    rounds, per_txn = 6, 16
    with SluiceProcess(kafka_broker.bootstrap, {"SLUICE_SESSIONS__MODE": "terminate"}) as sluice:
        producer = Producer({"bootstrap.servers": sluice.bootstrap, "transactional.id": f"txn-kill-{topic}",
                             "linger.ms": 5, "log_level": 0})
        producer.init_transactions(30)
        kept: list[tuple[str, str]] = []
        aborted: list[tuple[str, str]] = []
        killed = 0
        for r in range(rounds):
            committed = False
            attempt = 0
            while not committed:
                producer.begin_transaction()
                sent = [(f"k{i % 5}", f"r{r}-a{attempt}-{i:03d}-".ljust(PAD, "v")) for i in range(per_txn)]
                for i, (key, value) in enumerate(sent):
                    producer.produce(topic, key=key.encode(), value=value.encode(), partition=i % PARTITIONS)
                    if i == per_txn // 2:
                        producer.flush(30)  # half acknowledged inside the transaction
                if r % 2 == 1 and attempt == 0:
                    sluice.kill()  # the other half in flight (or queued), the commit to come
                    sluice.restart()
                    killed += 1
                committed = commit_or_abort(producer)
                (kept if committed else aborted).extend(sent)
                attempt += 1
        assert killed == rounds // 2
        wait_group_coordinator(kafka_broker.bootstrap, f"g-{topic}")
        with members_of(python_member("confluent", sluice.bootstrap, topic, f"g-{topic}", "txn-kill-reader",
                                      assign=PARTITIONS, isolation=READ_COMMITTED)) as members:
            wait_for_all(members, values(kept))
            check_exactly_once(members, kept)
            got = {g.value for m in members for g in m.received}
            assert not got & values(aborted), f"aborted transactions' records read: {sorted(got & values(aborted))[:3]}"
