"""A real KRaft cluster of N Kafka brokers for tests, benches and `make run BROKERS=N`.

One dedicated controller (its own small JVM) and N broker-only nodes (ids 1..N), all on 127.0.0.1 and free ports,
sharing one cluster id. Why a dedicated controller rather than combined nodes: the faults under test are broker
faults (kill -9 of a partition leader, restart); with combined nodes a leader's kill -9 may also take the active
controller and turn every broker fault into a quorum election as well, and a 3-voter quorum costs three
controllers' work on a 2-core machine. One voter is the smallest quorum that is still a real KRaft quorum (the
brokers register with it, heartbeat to it and are fenced by it, KIP-631), and it never dies in these tests.

Replication through Sluice (``replication_via_sluice=True``, KIP-73's replication path): each broker binds a
REPLICATION listener of its own, names it ``inter.broker.listener.name`` and advertises it at a Sluice sidecar in
front of that broker (``SluiceProcess``, its upstream the broker's client listener), so a follower fetches from the
leader through the leader's sidecar. Controllers are never reached through it (brokers connect to the controller's
CONTROLLER listener), and a broker never fetches from itself. The sidecars' ports are picked before the brokers
start (the broker's config names them); the sidecars start once the brokers serve.

>>> with KafkaCluster(3) as cluster:
...     cluster.bootstrap                    # "127.0.0.1:P1,127.0.0.1:P2,127.0.0.1:P3"
...     cluster.broker(2).kill(); cluster.broker(2).start()
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

from rig.kafka import DEFAULT_BROKER_JVM_OPTS, KafkaBroker, RigError, find_libs, free_ports, random_cluster_id

if TYPE_CHECKING:
    from rig.sluice_process import SluiceProcess

#: the dedicated controller's node id (never a broker id, so never in Metadata nor a Sluice port)
CONTROLLER_ID = 100
#: the broker's light JVM flags with a smaller heap: a controller holds only the metadata log
CONTROLLER_JVM_OPTS: tuple[str, ...] = tuple("-Xmx256m" if o.startswith("-Xmx") else o for o in DEFAULT_BROKER_JVM_OPTS)


@dataclass(frozen=True)
class PartitionState:
    partition: int
    leader: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    leader_epoch: int = -1


#: Kafka's replica selector that serves a consumer from a replica in its rack (KIP-392)
RACK_AWARE_SELECTOR = "org.apache.kafka.common.replica.RackAwareReplicaSelector"


def rack_of(node_id: int) -> str:
    """The rack (broker.rack) of broker ``node_id`` in a cluster made with ``racks=True``."""
    return f"rack-{node_id}"


class KafkaCluster:
    """A controller and ``brokers`` broker nodes (ids 1..N); optionally a Sluice sidecar per broker carrying the
    replication traffic (see the module docstring)."""

    def __init__(
        self,
        brokers: int = 3,
        *,
        replication_via_sluice: bool = False,
        sidecar_env: Mapping[str, str] | None = None,
        libs_dir: Path | str | None = None,
        jvm_opts: Sequence[str] | None = None,
        overrides: Mapping[str, str | int | float | bool | None] | None = None,
        racks: bool = False,
        startup_timeout: float = 90.0,
    ) -> None:
        if brokers < 1:
            raise RigError("a cluster needs at least one broker")
        self._libs = Path(libs_dir).resolve() if libs_dir is not None else find_libs()
        self._cluster_id = random_cluster_id()
        self.replication_via_sluice = replication_via_sluice
        self._sidecar_env = dict(sidecar_env or {})
        (controller_port,) = free_ports(1)
        voters = f"{CONTROLLER_ID}@127.0.0.1:{controller_port}"
        self.controller = KafkaBroker(
            libs_dir=self._libs, node_id=CONTROLLER_ID, port=controller_port, controller_port=controller_port,
            process_roles="controller", cluster_id=self._cluster_id, controller_voters=voters,
            jvm_opts=CONTROLLER_JVM_OPTS, startup_timeout=startup_timeout,
        )  # fmt: skip
        rf, isr = min(3, brokers), min(2, brokers)
        base: dict[str, Any] = {
            # Internal topics replicated like a production cluster's (RF 3, min ISR 2), so a broker's kill -9
            # leaves groups, transactions and share groups a coordinator.
            "offsets.topic.replication.factor": rf,
            "transaction.state.log.replication.factor": rf,
            "transaction.state.log.min.isr": isr,
            "share.coordinator.state.topic.replication.factor": rf,
            "share.coordinator.state.topic.min.isr": isr,
        }
        if racks:
            # KIP-392: each broker a rack of its own (:func:`rack_of`); a consumer that names its rack
            # (client.rack) is told to fetch from the in-sync replica in it (FetchResponse PreferredReadReplica)
            base["replica.selector.class"] = RACK_AWARE_SELECTOR
        base.update(overrides or {})
        #: node id -> (bootstrap port, broker port base, admin port) of its sidecar, when replication goes through
        #: Sluice
        self._sidecar_ports: dict[int, tuple[int, int, int]] = {}
        self._brokers: dict[int, KafkaBroker] = {}
        for node in range(1, brokers + 1):
            props = dict(base)
            if racks:
                props["broker.rack"] = rack_of(node)
            client_port, replication_port = free_ports(2)
            if replication_via_sluice:
                from rig.sluice_process import pick_ports

                ports = pick_ports(brokers)
                self._sidecar_ports[node] = ports
                sidecar = ports[1] + node
                props.update({
                    "listeners": f"PLAINTEXT://127.0.0.1:{client_port},REPLICATION://127.0.0.1:{replication_port}",
                    "advertised.listeners": f"PLAINTEXT://127.0.0.1:{client_port},REPLICATION://127.0.0.1:{sidecar}",
                    "inter.broker.listener.name": "REPLICATION",
                    "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,REPLICATION:PLAINTEXT,"
                                                      "CONTROLLER:PLAINTEXT",
                })  # fmt: skip
            self._brokers[node] = KafkaBroker(
                libs_dir=self._libs, node_id=node, port=client_port, process_roles="broker",
                cluster_id=self._cluster_id, controller_voters=voters, overrides=props, jvm_opts=jvm_opts,
                startup_timeout=startup_timeout,
            )  # fmt: skip
        self.sidecars: dict[int, Any] = {}  # node id -> SluiceProcess
        self.last_start_seconds: float | None = None

    # ---- addresses -----------------------------------------------------------------------------------------

    @property
    def bootstrap(self) -> str:
        """Every broker's client listener, comma-separated (what a client or Sluice is given)."""
        return ",".join(b.bootstrap for b in self._brokers.values())

    @property
    def node_ids(self) -> list[int]:
        return list(self._brokers)

    @property
    def brokers(self) -> list[KafkaBroker]:
        return list(self._brokers.values())

    def broker(self, node_id: int) -> KafkaBroker:
        return self._brokers[node_id]

    @property
    def libs_dir(self) -> Path:
        return self._libs

    @property
    def cluster_id(self) -> str:
        return self._cluster_id

    def running_bootstrap(self) -> str:
        """The client listeners of the brokers that are running now."""
        return ",".join(b.bootstrap for b in self._brokers.values() if b.is_running)

    # ---- lifecycle -----------------------------------------------------------------------------------------

    def start(self) -> KafkaCluster:
        t0 = time.monotonic()
        try:
            self.controller.start()
            # Brokers start in parallel: each start() waits for its own registration with the controller.
            errors: list[BaseException] = []

            def run(broker: KafkaBroker) -> None:
                try:
                    broker.start()
                except BaseException as exc:  # reported below, with the broker's log
                    errors.append(exc)

            threads = [threading.Thread(target=run, args=(b,), daemon=True) for b in self._brokers.values()]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            if errors:
                raise errors[0]
            if self.replication_via_sluice:
                self._start_sidecars()
        except BaseException:
            self.close()
            raise
        self.last_start_seconds = time.monotonic() - t0
        return self

    def _start_sidecars(self) -> None:
        from rig.sluice_process import SluiceProcess

        for node, broker in self._brokers.items():
            self.sidecars[node] = SluiceProcess(
                broker.bootstrap, extra_env=self._sidecar_env, node_id=node, ports=self._sidecar_ports[node]
            )

    def close(self) -> None:
        for sidecar in self.sidecars.values():
            with contextlib.suppress(Exception):
                sidecar.close()
        for broker in self._brokers.values():
            with contextlib.suppress(Exception):
                broker.close()
        with contextlib.suppress(Exception):
            self.controller.close()

    def __enter__(self) -> KafkaCluster:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<KafkaCluster {len(self._brokers)} brokers {self.bootstrap}>"

    # ---- state ---------------------------------------------------------------------------------------------

    def partitions(self, topic: str, bootstrap: str | None = None) -> list[PartitionState]:
        """Leader, replicas and ISR of each partition of ``topic``, from Metadata (kafka-python's admin client, at
        ``bootstrap``: by default the running brokers)."""
        from kafka import KafkaAdminClient

        admin = KafkaAdminClient(bootstrap_servers=bootstrap or self.running_bootstrap(), client_id="sluice-rig")
        try:
            (desc,) = admin.describe_topics([topic])
        finally:
            admin.close()
        if desc.get("error_code"):
            raise RigError(f"describe {topic}: error {desc['error_code']}")
        return sorted(
            (PartitionState(p["partition_index"], p["leader_id"], tuple(p["replica_nodes"]), tuple(p["isr_nodes"]),
                            p["leader_epoch"])
             for p in desc["partitions"]),
            key=lambda s: s.partition,
        )

    def wait_partitions(self, topic: str, ok: Any, timeout: float = 60.0, what: str = "") -> list[PartitionState]:
        """Poll :meth:`partitions` until ``ok(states)`` holds (bounded by ``timeout``); the states that passed."""
        deadline = time.monotonic() + timeout
        last: object = "not asked yet"
        while True:
            try:
                states = self.partitions(topic)
                if ok(states):
                    return states
                last = states
            except Exception as exc:  # a broker just died or came back: ask again
                last = exc
            if time.monotonic() >= deadline:
                raise RigError(f"{topic}: {what or 'condition'} not reached in {timeout:.0f}s; last: {last}\n"
                               f"{self.describe()}")
            time.sleep(0.2)  # poll interval of the condition above

    def describe(self, lines: int = 12) -> str:
        """For a failure: each node's broker and sidecar, running or not, with their errors and last log lines
        (the temp dirs holding the full logs go with the cluster)."""
        def one(title: str, proc: KafkaBroker | SluiceProcess) -> str:
            return f"=== {title} {'running' if proc.is_running else 'DOWN'}\n{proc.log_tail(lines)}"

        parts = [one("controller", self.controller)]
        for node, broker in self._brokers.items():
            parts.append(one(f"broker {node}", broker))
            sidecar = self.sidecars.get(node)
            if sidecar is not None:
                parts.append(one(f"sidecar of broker {node}", sidecar))
        return "\n".join(parts)
