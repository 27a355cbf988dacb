"""Share groups (KIP-932, GA since Kafka 4.2) through Sluice on the session's 3-broker cluster.

Two Java share consumers (``kafka-console-share-consumer``) of a 3-partition RF 3 topic, in one share group, only
ever given Sluice's bootstrap: ShareGroupHeartbeat, ShareFetch (78) and ShareAcknowledge (79) all go through Sluice,
which decodes them and rewrites the NodeEndpoints a ShareFetch/ShareAcknowledge response carries (KIP-951's, as for
Fetch). Outcome, from the clients' side: together they receive every record produced, unchanged; after the leader of
a partition is stopped (its leadership moves) they receive the records produced next, still connected only to
Sluice's ports; the share-group admin tool (``kafka-share-groups --describe --members``) works through Sluice.

Share groups deliver at least once (a record whose acquisition lock lapses is delivered again, KIP-932), so the test
asks for every record, never for exactly one delivery.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from rig.cluster import KafkaCluster
from rig.java_tools import CONFIG_COMMAND, CONSOLE_SHARE_CONSUMER, FEATURE_COMMAND, SHARE_GROUP_COMMAND, JavaTools
from rig.sluice_process import SluiceProcess
from tests.clients.test_sessions_clients import LineReader
from tests.support.cluster_checks import remote_ports

pytestmark = pytest.mark.broker

PARTITIONS = 3
RECORDS = 300  # per batch: one before the leader move, one after


@pytest.fixture(scope="module")
def sluice(kafka_cluster: KafkaCluster) -> Iterator[SluiceProcess]:
    """Sluice in front of the whole cluster for clients, a free port per broker node."""
    with SluiceProcess(kafka_cluster.bootstrap, extra_env={"SLUICE_LISTEN__BROKER_PORT_BASE": "0"}) as proc:
        yield proc


def _received(readers: list[LineReader], want: set[str], within: float, what: str) -> None:
    """Until the consumers together have printed every value in ``want`` (bounded by ``within`` s)."""
    deadline = time.monotonic() + within
    while not want <= {ln for r in readers for ln in r.lines}:
        missing = want - {ln for r in readers for ln in r.lines}
        assert time.monotonic() < deadline, f"{what}: {len(missing)} of {len(want)} records never arrived"
        for r in readers:
            r.wait_for(len(r.lines) + len(want), 0.1)  # what has arrived (up to 0.1 s for more), not one line


def test_share_consumers_receive_every_record_and_follow_a_leader_move(
        kafka_cluster: KafkaCluster, sluice: SluiceProcess, java_tools: JavaTools, unique_topic: str) -> None:
    topic, group = unique_topic, f"share-{unique_topic}"
    java_tools.create_topic(sluice.bootstrap, topic, partitions=PARTITIONS, replication_factor=3)
    kafka_cluster.wait_partitions(topic, lambda s: len(s) == PARTITIONS and all(len(p.isr) == 3 for p in s),
                                  what="every ISR full")
    # share.version=1 is a new cluster's default from 4.2 (GA); 4.1's preview needs it set. Setting it again is a
    # no-op, so the same test runs on either release. Both admin calls go through Sluice.
    java_tools.run(FEATURE_COMMAND, ["--bootstrap-server", sluice.bootstrap, "upgrade", "--feature", "share.version=1"])
    # A share group starts at the log end by default (share.auto.offset.reset=latest); earliest, so the records
    # produced before the consumers join are theirs.
    java_tools.run(CONFIG_COMMAND, ["--bootstrap-server", sluice.bootstrap, "--alter", "--entity-type", "groups",
                                    "--entity-name", group, "--add-config", "share.auto.offset.reset=earliest"])
    before, after = [f"before-{i}" for i in range(RECORDS)], [f"after-{i}" for i in range(RECORDS)]
    java_tools.console_produce(sluice.bootstrap, topic, before)
    args_each = [[
        "--bootstrap-server", sluice.bootstrap, "--topic", topic, "--group", group, "--timeout-ms", "600000",
        "--consumer-property", f"client.id=sluice-test-share-{n}",
    ] for n in range(2)]  # fmt: skip
    victim = -1
    # Closed once every broker is back (the block's finally runs first): a share consumer's close acknowledges
    # and leaves the group.
    with java_tools.spawned(CONSOLE_SHARE_CONSUMER, args_each) as consumers:
        readers = [LineReader(c.stdout) for c in consumers]
        errors = [LineReader(c.stderr) for c in consumers]
        try:
            _received(readers, set(before), 90, "before the move")
            members = java_tools.run(SHARE_GROUP_COMMAND, ["--bootstrap-server", sluice.bootstrap, "--describe",
                                                           "--group", group, "--members"]).stdout
            assert sorted(ln.split()[3] for ln in members.splitlines() if ln.startswith(group)) == [
                "sluice-test-share-0", "sluice-test-share-1"], members
            victim = next(p.leader for p in kafka_cluster.partitions(topic) if p.partition == 0)
            kafka_cluster.broker(victim).stop()  # a controlled shutdown: its leaderships move to the others
            kafka_cluster.wait_partitions(topic, lambda s: all(p.leader not in (victim, -1) for p in s),
                                          what=f"leaders off broker {victim}")
            java_tools.console_produce(sluice.bootstrap, topic, after)
            _received(readers, set(after), 90, "after the move")
            seen = set().union(*(remote_ports(c.pid) for c in consumers))
        finally:
            if victim > 0 and not kafka_cluster.broker(victim).is_running:
                kafka_cluster.broker(victim).start()  # the next test gets its cluster back
            kafka_cluster.wait_partitions(topic, lambda s: all(len(p.isr) == 3 for p in s), timeout=90,
                                          what=f"broker {victim} back in every ISR")
    got = [ln for r in readers for ln in r.drain(10)]
    assert set(got) == set(before) | set(after), f"unexpected values: {sorted(set(got) - set(before + after))[:5]}"
    brokers = {b.port for b in kafka_cluster.brokers}
    assert seen and not seen & brokers, f"share consumers connected to brokers directly: {seen & brokers}"
    assert not [ln for e in errors for ln in e.drain(5) if "ERROR" in ln], [e.lines for e in errors]
