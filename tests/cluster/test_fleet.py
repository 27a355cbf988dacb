"""A fleet of sidecars run as one (proxy/fleet/) on a 3-broker cluster whose replication goes through a
Sluice sidecar per broker, every sidecar an instance of one fleet (its settings in the control topic on the same
cluster). What must hold, from each instance's admin API, metrics and log, never the clock:

- one ``sluice throttle set`` on one sidecar is applied by every sidecar, at the same revision, and throttles a
  replica move at the leader's sidecar (partitions held back there);
- two changes based on the same revision, on two instances at once: exactly one is written, the other is refused
  (409; ``sluice throttle set`` says why) - no lost update;
- an instance killed -9, a change made, the instance restarted: it applied the change before it listened (the
  instance killed is one whose broker the change's write does not need: see ``_bystanders``);
- garbage, another schema's and invalid records in the control topic are skipped and counted on every instance,
  the last good settings stay, and the next good record is applied;
- the control cluster stopped (a separate broker): every instance keeps serving (/readyz, a produce and a consume
  through it), says the control cluster is unreachable, refuses a change with 503 (nothing written); one started
  meanwhile with ``on_unreachable = "wait"`` is alive but not ready and opens no listener; the cluster back: every
  instance reachable again (and ready), and the next change reaches every instance;
- a section deleted and set again while the cleaner really compacts the control topic, instances restarted in
  between, and a writer validating otherwise: every instance converges, no revision is used twice, no drift.

The wall-clock side (time from a write to its application on 20 instances) is ``python -m bench.fleet``.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from proxy.app import load_settings
from proxy.fleet.kafka_config import client_config
from proxy.fleet.topics import read_to_end
from proxy.fleet.writer import FleetWriter
from proxy.kafka_acls import AclReporter
from rig.cluster import KafkaCluster
from rig.fleet import admin_json, fleet_env, start_fleet, transaction_coordinator
from rig.java_tools import JavaTools
from rig.kafka import KafkaBroker
from rig.reassign import create_on, fill, reassign, wait_in_sync
from rig.sluice_process import SluiceProcess
from tests.support.faults import wait_until

pytestmark = pytest.mark.broker

THROTTLE = 200_000  # B/s: a move of MOVE_BYTES is held back from its first response on
MOVE_BYTES = 3_000_000
SETTINGS = load_settings(None, env={})


@dataclass
class Fleet:
    cluster: KafkaCluster
    name: str

    @property
    def sidecars(self) -> list[SluiceProcess]:
        return [self.cluster.sidecars[n] for n in sorted(self.cluster.sidecars)]

    @property
    def topic(self) -> str:
        return f"sluice-fleet-{self.name}"

    @property
    def transactional_id(self) -> str:  # the fleet's writers' (proxy/fleet/control.py)
        return f"sluice-fleet-{self.name}"


@pytest.fixture(scope="module")
def fleet() -> Iterator[Fleet]:
    """A 3-broker cluster replicating through a sidecar per broker, the sidecars one fleet."""
    name = f"it-{uuid.uuid4().hex[:8]}"
    with KafkaCluster(3, replication_via_sluice=True, sidecar_env=fleet_env(name, status_interval_s="1")) as cluster:
        # The history topic created beforehand (as an operator may) with its leader where the control topic's is:
        # a change's transaction writes both, and ``_bystanders`` needs a broker that leads none of its partitions.
        leader = cluster.partitions(f"sluice-fleet-{name}")[0].leader
        history = f"sluice-fleet-{name}-history"
        admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
        assignment = [[leader, *(n for n in sorted(cluster.sidecars) if n != leader)]]
        admin.create_topics([NewTopic(history, 1, replica_assignment=assignment,
                                      config={"min.insync.replicas": "2"})])[history].result(30)
        yield Fleet(cluster, name)


def _get(sidecar: SluiceProcess) -> dict[str, Any]:
    status, body = admin_json(sidecar.admin_url, "/throttles")
    assert status == 200, body
    return body


def _sluice(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "proxy", *args], capture_output=True, text=True, timeout=120,
                          check=False)


def _wait_revision(sidecars: list[SluiceProcess], revision: int) -> None:
    for s in sidecars:
        wait_until(partial(_at_least, s, revision), 30, partial(_describe, s))


def _at_least(s: SluiceProcess, revision: int) -> bool:
    return bool(_get(s)["revision"] >= revision)


def _describe(s: SluiceProcess) -> str:
    return f"{s}: {_get(s)}"


def _reachable(s: SluiceProcess, value: float) -> bool:
    return s.metric("sluice_fleet_control_reachable") == value


def _fleet_log(s: SluiceProcess, what: str) -> str:
    """``what`` and the instance's last fleet log events (what a failed wait shows)."""
    events = [e for e in s.log_events() if str(e.get("event", "")).startswith("fleet")]
    return "\n".join([f"{s} {what}; its last fleet events:", *(json.dumps(e) for e in events[-15:])])


def test_one_throttle_set_is_applied_by_every_sidecar_and_throttles_the_move(
        fleet: Fleet, java_tools: JavaTools, unique_topic: str, tmp_path: Path) -> None:
    one, _, three = fleet.sidecars
    direct = fleet.cluster.broker(1).bootstrap
    create_on(java_tools, direct, unique_topic, [1])
    fill(java_tools, direct, unique_topic, MOVE_BYTES)
    revision = _get(one)["revision"]
    # One command, on broker 3's sidecar: the move's leader is broker 1, behind sidecar one.
    done = _sluice("throttle", "set", "--admin", three.admin_url, "--leader-rate", str(THROTTLE),
                   "--topic", f"{unique_topic}=0:2")
    assert done.returncode == 0, done.stderr
    written = json.loads(done.stdout)["revision"]
    assert written > revision
    _wait_revision(fleet.sidecars, written)
    for s in fleet.sidecars:
        body = _get(s)
        assert (body["revision"], body["leader_rate_bytes"]) == (written, THROTTLE), (s, body)
        assert {"topic": unique_topic, "replicas": "0:2"} in body["topics"]
        assert s.metric("sluice_fleet_revision", {"section": "throttle"}) == written
    before = one.metric("sluice_throttle_left_out_partitions_total", {"side": "leader"})
    reassign(java_tools, fleet.cluster.bootstrap, unique_topic, [1, 2], tmp_path)
    wait_until(lambda: one.metric("sluice_throttle_left_out_partitions_total", {"side": "leader"}) > before, 60,
               "the move held back at the leader's sidecar")
    cleared = _sluice("throttle", "clear", "--admin", fleet.sidecars[1].admin_url)
    assert cleared.returncode == 0, cleared.stderr
    _wait_revision(fleet.sidecars, json.loads(cleared.stdout)["revision"])
    assert all(_get(s)["leader_rate_bytes"] == 0 for s in fleet.sidecars)
    wait_in_sync(fleet.cluster, unique_topic, 2, timeout=120)


def test_two_changes_based_on_one_revision_one_is_refused(fleet: Fleet, tmp_path: Path) -> None:
    one, two, _ = fleet.sidecars
    base = _get(one)
    base.pop("status")
    answers: list[tuple[int, dict[str, Any]]] = []

    def put(sidecar: SluiceProcess, rate: int) -> None:
        answers.append(admin_json(sidecar.admin_url, "/throttles", "PUT", {**base, "leader_rate_bytes": rate}))

    threads = [threading.Thread(target=put, args=(s, r)) for s, r in ((one, 1_000_001), (two, 1_000_002))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(status for status, _ in answers) == [200, 409], answers
    written = next(body for status, body in answers if status == 200)
    assert written["revision"] > base["revision"]
    _wait_revision(fleet.sidecars, written["revision"])
    assert {_get(s)["leader_rate_bytes"] for s in fleet.sidecars} == {written["leader_rate_bytes"]}
    # The CLI with the stale body: refused, and it says why.
    stale = tmp_path / "stale.json"
    stale.write_text(json.dumps({**base, "leader_rate_bytes": 5}))
    done = _sluice("throttle", "set", "--admin", one.admin_url, "--file", str(stale))
    assert done.returncode != 0
    assert "HTTP 409" in done.stderr and "changed meanwhile" in done.stderr, done.stderr
    assert _get(one)["revision"] == written["revision"]
    admin_json(one.admin_url, "/throttles", "PUT", {})  # cleared (unconditional), for the next tests


def test_an_instance_killed_applies_the_latest_before_it_serves(fleet: Fleet, java_tools: JavaTools) -> None:
    first = _get(fleet.sidecars[0])
    first.pop("status")
    status, written = admin_json(fleet.sidecars[0].admin_url, "/throttles", "PUT",
                                 {**first, "follower_rate_bytes": 4_141_414})
    assert status == 200, written
    _wait_revision(fleet.sidecars, written["revision"])
    killed, writer = _bystanders(fleet, java_tools)
    killed.kill()
    try:
        body = _get(writer)
        body.pop("status")
        status, written = admin_json(writer.admin_url, "/throttles", "PUT", {**body, "follower_rate_bytes": 4_242_424})
        assert status == 200, written
        killed.restart()  # returns once /readyz answers and the bootstrap port accepts
    finally:  # the module's fleet whole again for the next tests, whatever failed here
        if not killed.is_running:
            killed.restart()
    after = _get(killed)
    assert (after["revision"], after["follower_rate_bytes"]) == (written["revision"], 4_242_424)
    events = [e.get("event") for e in killed.log_events()]
    starts = [i for i, e in enumerate(events) if e == "starting"]
    assert len(starts) >= 2, "the log of the restarted run"
    last_run = events[starts[-1]:]
    assert "fleet_caught_up" in last_run and "listening" in last_run
    assert last_run.index("fleet_caught_up") < last_run.index("listening"), last_run
    assert last_run.index("fleet_applied") < last_run.index("listening"), last_run
    status, cleared = admin_json(writer.admin_url, "/throttles", "PUT", {})
    assert status == 200, cleared
    _wait_revision(fleet.sidecars, cleared["revision"])


def _bystanders(fleet: Fleet, java_tools: JavaTools) -> tuple[SluiceProcess, SluiceProcess]:
    """(the sidecar to kill, the one to write through). The one killed fronts a broker that leads none of the
    control topic's partition, the history topic's (``fleet`` puts it with the control topic's) and the
    ``__transaction_state`` partition coordinating the fleet's transactional id:
    followers fetch from a leader through its sidecar, so killing the sidecar of either leader stops that partition's
    replication, and the change's transaction cannot complete (its produce or its coordinator's log append waits for
    the followers, replica.lag.time.max.ms, 30 s, until the ISR shrinks to the leader alone; then NOT_ENOUGH_REPLICAS:
    the partitions keep min.insync.replicas 2): the write is refused 503 as when the control cluster is down (the
    last test), which is not what this test is about. Two leaders, three brokers: one broker is neither."""
    leaders = {fleet.cluster.partitions(fleet.topic)[0].leader,
               fleet.cluster.partitions(f"{fleet.topic}-history")[0].leader,
               transaction_coordinator(java_tools, fleet.cluster.bootstrap, fleet.transactional_id)}
    killed = next(fleet.cluster.sidecars[n] for n in sorted(fleet.cluster.sidecars) if n not in leaders)
    writer = next(s for s in fleet.sidecars if s is not killed)
    return killed, writer


def test_garbage_and_invalid_records_are_skipped_and_counted(fleet: Fleet) -> None:
    sidecars = fleet.sidecars
    revision = _get(sidecars[0])["revision"]
    reasons = ("garbage", "schema", "invalid", "fleet")
    before = {id(s): {r: s.metric("sluice_fleet_records_skipped_total", {"reason": r}) for r in reasons}
              for s in sidecars}
    good = {"leader_rate_bytes": 0, "follower_rate_bytes": 31_337}

    def record(settings: dict[str, Any], **over: Any) -> bytes:
        return json.dumps({"schema": 1, "fleet": fleet.name, "section": "throttle", "revision": 1,
                           "settings": settings, "changed_by": "test", "changed_at": "", **over}).encode()

    producer = Producer({"bootstrap.servers": fleet.cluster.bootstrap, "log_level": 0})
    offsets: list[int] = []
    for value in (b"\x00\xffnot json at all", record(good, schema=2),
                  record({"follower_rate_bytes": -5}),  # fails the section's validation
                  record(good, fleet="another-fleet"),
                  record(good)):  # the last one is good: applied after the bad ones
        producer.produce(fleet.topic, value, b"throttle", on_delivery=lambda _e, m: offsets.append(m.offset() or 0))
    assert producer.flush(30) == 0
    last = max(offsets) + 1  # the good record's revision: its offset + 1
    assert last > revision
    _wait_revision(sidecars, last)
    for s in sidecars:
        assert _get(s)["follower_rate_bytes"] == 31_337
        after = {r: s.metric("sluice_fleet_records_skipped_total", {"reason": r}) for r in reasons}
        assert {r: after[r] - before[id(s)][r] for r in reasons} == dict.fromkeys(reasons, 1), (s, after)
        assert s.is_running
    skipped = [e for e in sidecars[0].log_events() if e.get("event") == "fleet_record_skipped"]
    assert {e["reason"] for e in skipped} >= set(reasons)
    status, cleared = admin_json(sidecars[0].admin_url, "/throttles", "PUT", {})
    assert status == 200, cleared
    _wait_revision(sidecars, cleared["revision"])


def test_control_cluster_down_serving_goes_on_and_changes_arrive_when_it_is_back(
        fleet: Fleet, unique_topic: str) -> None:
    name = f"ctl-{uuid.uuid4().hex[:8]}"
    with KafkaBroker() as control:
        upstreams = [b.bootstrap for b in fleet.cluster.brokers[:2]]
        # broker_port_base 0: a free port per broker node (base + N is only picked free for N = the node_id)
        env = {**fleet_env(name, control.bootstrap, status_interval_s="1", write_timeout_s="3"),
               "SLUICE_LISTEN__BROKER_PORT_BASE": "0"}
        instances = start_fleet(upstreams, env)
        try:
            a = instances[0]
            assert _get(a)["revision"] == 0
            control.stop()
            for s in instances:
                wait_until(partial(_reachable, s, 0), 30, partial(_fleet_log, s, "sees it down"))
            # Serving never stops: ready, and a produce and a consume through each instance.
            for i, s in enumerate(instances):
                status, _ = _readyz(s)
                assert status == 200
                _produce_and_consume(s, unique_topic, f"during-outage-{i}".encode())
            status, refused = admin_json(a.admin_url, "/throttles", "PUT", {"leader_rate_bytes": 1})
            assert status == 503 and "nothing changed" in refused["error"], refused
            assert _get(a)["leader_rate_bytes"] == 0
            events = [e.get("event") for e in a.log_events()]
            assert "fleet_control_unreachable" in events
            # An instance that must not serve without the fleet's settings (on_unreachable = "wait"), started now:
            # alive, not ready, no listener, until the control topic was read.
            waiting = SluiceProcess(upstreams[0], wait=False, extra_env={
                **env, "SLUICE_FLEET__ON_UNREACHABLE": "wait", "SLUICE_FLEET__STARTUP_TIMEOUT_S": "1"})
            instances.append(waiting)
            wait_until(lambda: any(e.get("event") == "fleet_waiting_for_control" for e in waiting.log_events()), 60,
                       partial(_fleet_log, waiting, "waits for the control topic"))
            assert _healthz(waiting) == 200
            assert waiting.readiness() == (False, "/readyz 503")
            with pytest.raises(OSError):
                socket.create_connection(("127.0.0.1", waiting.bootstrap_port), timeout=5).close()
            control.start()
            for s in instances:
                wait_until(partial(_reachable, s, 1), 60, partial(_fleet_log, s, "sees it back"))
            wait_until(lambda: waiting.readiness()[0], 60, partial(_fleet_log, waiting, "ready"))
            assert a.metric("sluice_fleet_refolds_total") >= 1  # read again from its beginning, once back
            status, written = admin_json(a.admin_url, "/throttles", "PUT", {"leader_rate_bytes": 2_000_000})
            assert status == 200, written
            _wait_revision(instances, written["revision"])
            assert {_get(s)["leader_rate_bytes"] for s in instances} == {2_000_000}
        finally:
            for s in instances:
                s.close()


def test_a_section_deleted_and_set_again_across_compaction_converges_everywhere(fleet: Fleet) -> None:
    """The control topic created beforehand, as an operator may, with a cleaner that runs within the test (its
    settings then differ from what the fleet relies on: both instances say so). A section set, deleted (an
    operator's tombstone), the cleaner run until the set and the tombstone are gone from the log (read back, not
    waited for), one instance restarted: neither holds the section now; the one running throughout remembers the
    tombstone's revision, the restarted one nothing, and the writer finds nothing. Set again through the
    restarted one: both apply it (its revision, an offset, is above every earlier one; numbered from what the
    writer found, it would have been below what the other applied). A writer validating otherwise (an older
    Sluice, simulated: it finds the latest record invalid) writes the next change: a revision nobody has, applied
    by both. ``sluice fleet status``: no lag, no drift."""
    name = f"cmp-{uuid.uuid4().hex[:8]}"
    control = f"sluice-fleet-{name}"
    cluster = fleet.cluster
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    admin.create_topics([NewTopic(control, 1, 3, config={
        "cleanup.policy": "compact", "segment.ms": "100", "min.cleanable.dirty.ratio": "0.01",
        "delete.retention.ms": "0", "min.insync.replicas": "2"})])[control].result(30)
    env = {**fleet_env(name, status_interval_s="1"), "SLUICE_LISTEN__BROKER_PORT_BASE": "0"}
    a, b = start_fleet([br.bootstrap for br in cluster.brokers[:2]], env)
    try:
        for s in (a, b):
            assert s.metric("sluice_fleet_control_topic_setting_unexpected", {"setting": "delete.retention.ms"}) == 1
            assert s.metric("sluice_fleet_control_topic_setting_unexpected", {"setting": "cleanup.policy"}) == 0
        first = _put_throttle(a, 1_111_111)
        _wait_at([a, b], first, 1_111_111)
        producer = Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all", "log_level": 0})
        offsets: list[int] = []
        producer.produce(control, None, b"throttle", on_delivery=lambda _e, m: offsets.append(m.offset() or 0))
        assert producer.flush(30) == 0
        deleted = offsets[0] + 1
        _wait_at([a, b], deleted, 0)  # each instance's own setting again

        def cleaned() -> bool:
            # Each look appends a record of a key no instance folds, so the log keeps rolling segments (the
            # active one is never cleaned) and stays dirty enough for the cleaner's next pass.
            producer.produce(control, b"{}", b"filler")
            assert producer.flush(30) == 0
            return not {first - 1, deleted - 1} & {o for k, _, o in _records(cluster.bootstrap, control)
                                                   if k == b"throttle"}

        wait_until(cleaned, 90, "the cleaner to drop the set and its tombstone")
        b.kill()
        b.restart()
        assert (_get(b)["revision"], _get(b)["leader_rate_bytes"]) == (0, 0)  # no trace of the section
        assert _get(a)["revision"] == deleted  # a, running throughout, remembers the tombstone's
        again = _put_throttle(b, 2_222_222)
        assert again > deleted
        _wait_at([a, b], again, 2_222_222)

        def older(section: str, values: dict[str, Any]) -> Any:  # refuses what this version accepts
            if values.get("leader_rate_bytes", 0) > 2_000_000:
                raise ValueError("above what this older Sluice allows")
            return getattr(SETTINGS.with_overrides({section: values}), section)

        settings = SETTINGS.with_overrides({"fleet.enabled": True, "fleet.name": name,
                                            "fleet.bootstrap_servers": cluster.bootstrap.split(",")})
        writer = FleetWriter(client_config(settings.fleet, settings.upstream, "older"), settings.fleet,
                             tuple(settings.dynamic_sections), older, AclReporter("User:ANONYMOUS", print),
                             lambda: "older")
        assert writer.read_state(30).revision("throttle") == again  # it counts the record it finds invalid
        third = writer.write("throttle", {"leader_rate_bytes": 1_500_000}, again, "older-sluice", 30).revision
        assert third is not None and third > again
        _wait_at([a, b], third, 1_500_000)
        _status_clean(name, cluster.bootstrap, {"throttle": third})
    finally:
        for s in (a, b):
            s.close()


def _put_throttle(s: SluiceProcess, rate: int) -> int:
    """``leader_rate_bytes`` set as ``sluice config set`` sets it (GET, then PUT with the revision read)."""
    body = _get(s)
    body.pop("status")
    status, written = admin_json(s.admin_url, "/throttles", "PUT", {**body, "leader_rate_bytes": rate})
    assert status == 200, written
    return int(written["revision"])


def _wait_at(instances: list[SluiceProcess], revision: int, rate: int) -> None:
    for s in instances:
        wait_until(partial(_has, s, revision, rate), 30,
                   partial(_fleet_log, s, f"at revision {revision}, leader_rate_bytes {rate}"))


def _has(s: SluiceProcess, revision: int, rate: int) -> bool:
    body = _get(s)
    return bool((body["revision"], body["leader_rate_bytes"]) == (revision, rate))


def _records(bootstrap: str, topic: str) -> list[tuple[bytes | None, bytes | None, int]]:
    return read_to_end({"bootstrap.servers": bootstrap}, topic, "rig-read", 30, lambda denied: None)


def _status_clean(name: str, bootstrap: str, revisions: dict[str, int]) -> None:
    done = _sluice("fleet", "status", "--fleet", name, "--bootstrap", bootstrap, "--json")
    rows = [json.loads(line) for line in done.stdout.splitlines()]
    assert done.returncode == 0 and len(rows) == 2, done.stdout + done.stderr
    for row in rows:
        assert (row["state"], row["drift"]) == ("up", ""), rows
        assert all(f"{s}={r}" in row["revisions"] for s, r in revisions.items()), rows


def _healthz(s: SluiceProcess) -> int:
    import urllib.request

    with urllib.request.urlopen(f"{s.admin_url}/healthz", timeout=10) as resp:
        return int(resp.status)


def _readyz(s: SluiceProcess) -> tuple[int, str]:
    import urllib.request

    with urllib.request.urlopen(f"{s.admin_url}/readyz", timeout=10) as resp:
        return resp.status, resp.read().decode()


def _produce_and_consume(sluice: SluiceProcess, topic: str, value: bytes) -> None:
    bootstrap = sluice.bootstrap
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "log_level": 0})
    producer.produce(topic, value)
    assert producer.flush(60) == 0, sluice.stderr_text()[-4000:]
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"g-{uuid.uuid4().hex[:6]}",
                         "enable.auto.commit": False})
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        seen: list[bytes] = []
        wait_until(lambda: _poll_into(consumer, seen) and value in seen, 60, f"{value!r} consumed via {bootstrap}")
    finally:
        consumer.close()


def _poll_into(consumer: Consumer, seen: list[bytes]) -> bool:
    msg = consumer.poll(0.5)
    if msg is not None and msg.error() is None:
        seen.append(msg.value() or b"")
    return True
