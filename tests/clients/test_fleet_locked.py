"""A fleet on a cluster locked down as production runs it (conftest ``locked_broker``: the authorizer on, nothing
allowed without an ACL, SASL/SCRAM over TLS), each principal granted exactly the README's ACLs
(proxy/kafka_acls.py): ``sluice-writer`` (``instance`` and ``writer`` rows) behind one instance, ``sluice``
(``instance`` rows only) behind the other, ``sluice-reader`` for ``sluice fleet status|history``. The admin API
knows its operators by their own tokens (alice, bob).

What must hold, from the CLI's answers, the instances' admin API and logs, and the topics' end offsets:

- a change through the writer's instance is applied by both; a dry run writes nothing (the topics' ends stay);
- through the other instance a change is refused (403), the message names the ACL its principal lacks, and one
  ``kafka_not_authorized`` event says so; nothing is written;
- the history shows every change with the principal the admin API authenticated; a rollback writes an earlier
  revision's settings again and every instance applies it;
- ``sluice fleet status`` with the reader's credentials: every instance up, no drift (exit 0);
- a fleet-scoped quota: each instance's usage reports written and the other's read (two live instances);
- no instance ever logged the control cluster unreachable, and no permission was missing but the one refused.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from proxy.kafka_acls import Role, grants
from rig.fleet import admin_json, fleet_env
from rig.kafka import end_offsets
from rig.secure_broker import LOCKED_USERS, SecureBroker, allow
from rig.sluice_process import SluiceProcess
from tests.support.faults import wait_until

pytestmark = pytest.mark.broker


def sasl_ssl(broker: SecureBroker, user: str) -> dict[str, str]:
    """SLUICE_* variables: Sluice's upstream is the broker's SASL_SSL listener, its own login ``user``."""
    return {"SLUICE_UPSTREAM__TLS__ENABLED": "true", "SLUICE_UPSTREAM__TLS__CA_FILE": str(broker.ca.cert),
            "SLUICE_UPSTREAM__SASL__MECHANISM": "SCRAM-SHA-512", "SLUICE_UPSTREAM__SASL__USERNAME": user,
            "SLUICE_UPSTREAM__SASL__PASSWORD": LOCKED_USERS[user]}


@dataclass
class LockedFleet:
    name: str
    broker: SecureBroker
    writer: SluiceProcess
    follower: SluiceProcess
    tokens: dict[str, Path]
    reader_config: Path

    @property
    def topics(self) -> tuple[str, str]:
        return f"sluice-fleet-{self.name}", f"sluice-fleet-{self.name}-history"

    def ends(self) -> dict[str, dict[int, int]]:
        return {t: end_offsets(self.broker.plaintext, t) for t in self.topics}


@pytest.fixture(scope="module")
def fleet(locked_broker: SecureBroker, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LockedFleet]:
    name = f"locked-{uuid.uuid4().hex[:8]}"
    roles: dict[str, tuple[Role, ...]] = {"sluice-writer": ("instance", "writer"), "sluice": ("instance",),
                                          "sluice-reader": ("reader",)}
    for user, granted in roles.items():
        allow(locked_broker.plaintext, f"User:{user}", grants(granted, {"fleet": name}))
    directory = tmp_path_factory.mktemp("locked-fleet")
    tokens = {}
    for who in ("alice", "bob"):
        tokens[who] = directory / f"{who}.token"
        tokens[who].write_text(f"{who}-{uuid.uuid4().hex}\n")
    config = directory / "sluice.toml"
    # a fleet-scoped quota: every instance reports its usage and reads the others' (the usage topic)
    config.write_text("".join(f'[[admin.principals]]\nname = "{who}"\ntoken_file = "{path}"\n\n'
                              for who, path in tokens.items())
                      + '[quota]\nscope = "fleet"\n[[quota.entries]]\nname = "apps"\nclient_id = "app-*"\n'
                        'fetch_rate_bytes = 1000000\n')
    reader = directory / "reader.toml"
    reader.write_text(f'[upstream]\nbootstrap_servers = ["{locked_broker.sasl_ssl}"]\n'
                      f'[upstream.tls]\nenabled = true\nca_file = "{locked_broker.ca.cert}"\n'
                      f'[upstream.sasl]\nmechanism = "SCRAM-SHA-512"\nusername = "sluice-reader"\n'
                      f'password = "{LOCKED_USERS["sluice-reader"]}"\n'
                      f'[fleet]\nname = "{name}"\nstatus_interval_s = 1.0\n')
    env = {**fleet_env(name, status_interval_s="1"), "SLUICE_CONFIG": str(config)}
    with SluiceProcess(locked_broker.sasl_ssl, extra_env={**env, **sasl_ssl(locked_broker, "sluice-writer")}) as w, \
            SluiceProcess(locked_broker.sasl_ssl, extra_env={**env, **sasl_ssl(locked_broker, "sluice")}) as f:
        yield LockedFleet(name, locked_broker, w, f, tokens, reader)


def _sluice(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "proxy", *args], capture_output=True, text=True, timeout=120,
                          check=False)


def _set(fleet: LockedFleet, instance: SluiceProcess, who: str, *args: str) -> subprocess.CompletedProcess[str]:
    return _sluice("config", "set", "throttle", *args, "--admin", instance.admin_url,
                   "--token-file", str(fleet.tokens[who]))


def _throttle(s: SluiceProcess) -> dict[str, Any]:
    status, body = admin_json(s.admin_url, "/throttles")
    assert status == 200, body
    return body


def _at(s: SluiceProcess, revision: int, rate: int) -> bool:
    body = _throttle(s)
    return bool(body["revision"] == revision and body["leader_rate_bytes"] == rate)


def _wait_all(fleet: LockedFleet, revision: int, rate: int) -> None:
    for s in (fleet.writer, fleet.follower):
        wait_until(partial(_at, s, revision, rate), 30, partial(_describe, s))


def _describe(s: SluiceProcess) -> str:
    return f"{s}: {_throttle(s)}"


def _events(s: SluiceProcess, name: str) -> list[dict[str, Any]]:
    return [e for e in s.log_events() if e.get("event") == name]


def test_a_fleet_on_a_locked_cluster_writes_applies_reports_and_keeps_its_history(fleet: LockedFleet) -> None:
    done = _set(fleet, fleet.writer, "alice", "leader_rate_bytes=2000000")
    assert done.returncode == 0, done.stderr
    first = json.loads(done.stdout)["revision"]
    _wait_all(fleet, first, 2_000_000)

    ends = fleet.ends()
    tried = _set(fleet, fleet.writer, "alice", "leader_rate_bytes=1", "--dry-run")
    assert tried.returncode == 0 and "dry run" in tried.stderr, tried.stderr
    refused = _set(fleet, fleet.follower, "alice", "leader_rate_bytes=3000000")
    assert refused.returncode != 0
    missing = f"User:sluice may not Write TransactionalId:sluice-fleet-{fleet.name}"
    assert "HTTP 403" in refused.stderr and missing in refused.stderr, refused.stderr
    assert fleet.ends() == ends  # neither wrote anything
    _wait_all(fleet, first, 2_000_000)

    done = _set(fleet, fleet.writer, "bob", "leader_rate_bytes=4000000")
    assert done.returncode == 0, done.stderr
    second = json.loads(done.stdout)["revision"]
    _wait_all(fleet, second, 4_000_000)
    rolled = _sluice("fleet", "rollback", "throttle", str(first), "--admin", fleet.writer.admin_url,
                     "--token-file", str(fleet.tokens["bob"]))
    assert rolled.returncode == 0, rolled.stderr
    third = json.loads(rolled.stdout)["revision"]
    assert first < second < third
    _wait_all(fleet, third, 2_000_000)

    history = _sluice("fleet", "history", "throttle", "--config", str(fleet.reader_config), "--json")
    assert history.returncode == 0, history.stderr
    rows = [json.loads(line) for line in history.stdout.splitlines()]
    assert [(r["revision"], r["principal"], r["action"]) for r in rows] == [
        (first, "alice", "set"), (second, "bob", "set"), (third, "bob", f"rollback to {first}")]
    assert rows[2]["change"] == "leader_rate_bytes: 4000000 -> 2000000"

    status = _sluice("fleet", "status", "--config", str(fleet.reader_config), "--json")
    assert status.returncode == 0, status.stdout + status.stderr
    rows = [json.loads(line) for line in status.stdout.splitlines()]
    assert len(rows) == 2 and {(r["state"], r["drift"]) for r in rows} == {("up", "")}, rows

    for s in (fleet.writer, fleet.follower):
        assert not _events(s, "fleet_control_unreachable"), s.log_tail()
    assert not _events(fleet.writer, "kafka_not_authorized")
    assert [(e["principal"], e["resource"], e["operation"]) for e in _events(fleet.follower, "kafka_not_authorized")
            ] == [("User:sluice", f"TransactionalId:sluice-fleet-{fleet.name}", "Write")]


def _usage(s: SluiceProcess) -> str:
    return (f"{s}: two live instances, the usage topic reachable (live "
            f"{s.metric('sluice_quota_fleet_live_instances')}); log:\n{s.log_tail()}")


def test_a_fleet_scoped_quota_on_a_locked_cluster_shares_usage_between_the_instances(fleet: LockedFleet) -> None:
    """Each instance, its principal granted only the ``instance`` rows, publishes its quota usage to the fleet's
    usage topic and reads the others' (what a fleet-scoped quota splits by): both see two live instances, the usage
    topic reachable, and no permission missing (but the fleet change the other test has refused)."""
    def live(s: SluiceProcess) -> bool:
        return s.metric("sluice_quota_fleet_live_instances") == 2 and s.metric(
            "sluice_quota_fleet_usage_reachable") == 1

    for s in (fleet.writer, fleet.follower):
        wait_until(partial(live, s), 60, partial(_usage, s))
        refused = [e for e in _events(s, "kafka_not_authorized")
                   if e["resource"] != f"TransactionalId:sluice-fleet-{fleet.name}"]
        assert not refused, refused
    assert end_offsets(fleet.broker.plaintext, f"sluice-fleet-{fleet.name}-usage")[0] > 0
