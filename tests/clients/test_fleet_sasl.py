"""Who may change a fleet: whoever may write its control topic. A broker with SASL listeners and
KRaft's StandardAuthorizer (rig/secure_broker.py ``authorizer=True``); two fleet instances behind its SASL_PLAINTEXT
listener, each logging in with its own principal (``[upstream.sasl]``, which the fleet's clients use too):
``alice`` may write the control topic under the fleet's transactional id, ``bob`` may read it and use the
transactional id but not write the topic. ``sluice throttle set`` on bob's instance is refused (403) and says why,
nothing reaches the topic; on alice's it is applied by both."""

from __future__ import annotations

import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka.admin import (
    AclBinding,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ResourcePatternType,
    ResourceType,
)

from rig.fleet import admin_json, fleet_env
from rig.secure_broker import SASL_USERS, SecureBroker
from rig.sluice_process import SluiceProcess
from tests.support.faults import wait_until

pytestmark = pytest.mark.broker


@pytest.fixture(scope="module")
def authorizing_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureBroker]:
    broker = SecureBroker.start(tmp_path_factory.mktemp("acl-broker"), authorizer=True)
    try:
        yield broker
    finally:
        broker.close()


def _allow(admin: AdminClient, user: str, kind: ResourceType, name: str, *operations: AclOperation) -> None:
    bindings = [AclBinding(kind, name, ResourcePatternType.LITERAL, f"User:{user}", "*", op,
                           AclPermissionType.ALLOW) for op in operations]
    for future in admin.create_acls(bindings).values():
        future.result(timeout=30)


def _instance(broker: SecureBroker, user: str, fleet: str, node_id: int) -> SluiceProcess:
    env = {**fleet_env(fleet, status_interval_s="1"), "SLUICE_UPSTREAM__SASL__MECHANISM": "PLAIN",
           "SLUICE_UPSTREAM__SASL__USERNAME": user, "SLUICE_UPSTREAM__SASL__PASSWORD": SASL_USERS[user]}
    return SluiceProcess(broker.sasl_plaintext, extra_env=env, node_id=node_id)


def test_a_principal_without_write_on_the_control_topic_cannot_change_the_fleet(
        authorizing_broker: SecureBroker, tmp_path: Path) -> None:
    fleet = f"acl-{uuid.uuid4().hex[:8]}"
    topic, txn = f"sluice-fleet-{fleet}", f"sluice-fleet-{fleet}"
    admin = AdminClient({"bootstrap.servers": authorizing_broker.plaintext})  # User:ANONYMOUS, a super user
    read, write, describe = AclOperation.READ, AclOperation.WRITE, AclOperation.DESCRIBE
    _allow(admin, "alice", ResourceType.TOPIC, topic, read, write, describe)
    _allow(admin, "alice", ResourceType.TRANSACTIONAL_ID, txn, write, describe)
    _allow(admin, "bob", ResourceType.TOPIC, topic, read, describe)
    _allow(admin, "bob", ResourceType.TRANSACTIONAL_ID, txn, write, describe)
    with _instance(authorizing_broker, "alice", fleet, 1) as alice, \
            _instance(authorizing_broker, "bob", fleet, 2) as bob:
        refused = subprocess.run([sys.executable, "-m", "proxy", "throttle", "set", "--admin", bob.admin_url,
                                  "--leader-rate", "1MB"], capture_output=True, text=True, timeout=120, check=False)
        assert refused.returncode != 0
        assert "HTTP 403" in refused.stderr and "not authorized to change the fleet" in refused.stderr, \
            refused.stderr
        assert bob.metric("sluice_fleet_writes_total", {"outcome": "refused"}) == 1
        for s in (alice, bob):
            status, body = admin_json(s.admin_url, "/throttles")
            assert (status, body["revision"], body["leader_rate_bytes"]) == (200, 0, 0)
        done = subprocess.run([sys.executable, "-m", "proxy", "throttle", "set", "--admin", alice.admin_url,
                               "--leader-rate", "2MB"], capture_output=True, text=True, timeout=120, check=False)
        assert done.returncode == 0, done.stderr
        wait_until(lambda: admin_json(bob.admin_url, "/throttles")[1]["revision"] == 1, 30, "bob applies it")
        assert admin_json(bob.admin_url, "/throttles")[1]["leader_rate_bytes"] == 2_000_000
