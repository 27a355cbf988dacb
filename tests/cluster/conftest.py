"""The 3-broker cluster this directory's tests share."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from rig.cluster import KafkaCluster


@pytest.fixture(scope="package")
def kafka_cluster() -> Iterator[KafkaCluster]:
    """One KRaft cluster of 3 brokers and a controller for this directory's tests, replicating through a Sluice
    sidecar per broker (KIP-73's replication path); started by the first test that asks for it (~10-20 s).
    Tests isolate themselves by topic name and put back what they change (a killed broker is restarted, throttles
    are cleared). Each broker is a rack of its own with Kafka's rack-aware replica selector (KIP-392): only a
    consumer that names its rack (client.rack) is served by a follower. Stopped when the directory's last test is
    done, not at the session's end: idle, its four JVMs and three sidecars (the followers' fetches every 500 ms)
    take ~8 % of a core (4.6 CPU-s a minute, measured on the 2-core machine), which the session's other tests, run
    after these, would pay for the rest of it."""
    with KafkaCluster(3, replication_via_sluice=True, racks=True) as cluster:
        yield cluster
