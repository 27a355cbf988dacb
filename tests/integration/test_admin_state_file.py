"""admin.state_file with Sluice as a subprocess and the real broker: a throttle on a topic glob and a budget set
through the admin API survive a restart (shown by GET and in force on fetches), and still win over the config file
after a SIGHUP, until the state file is deleted."""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from rig.kafka import KafkaBroker
from rig.raw import RawClient
from tests.integration.test_throttle_admin import http, partition_bytes
from tests.support.subprocess_proxy import SubprocessProxy
from tests.support.topics import create_topic, produce_values

pytestmark = pytest.mark.broker

TOKEN = "throttle-token"  # the one tests.integration.test_throttle_admin.http sends
RECORDS = 20
VALUE = 10 * 1024


def wait_for(condition: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"no {what} within {timeout:.0f} s")
        time.sleep(0.05)  # bounded poll of an observable condition, not a synchronising sleep


def reconfigurations(sluice: SubprocessProxy) -> int:
    return sum(1 for event in sluice.log_events() if event.get("event") == "reconfigured")


def sighup(sluice: SubprocessProxy) -> None:
    """SIGHUP, and wait until Sluice has applied the reload (its "reconfigured" log event)."""
    before = reconfigurations(sluice)
    sluice.signal(signal.SIGHUP)
    wait_for(lambda: reconfigurations(sluice) > before, "reload after SIGHUP")


def test_admin_changes_survive_restart_and_win_over_sighup(kafka_broker: KafkaBroker, tmp_path: Path) -> None:
    stamp = int(time.time() * 1000)
    topic = f"orders-state-{stamp}"
    create_topic(kafka_broker.bootstrap, topic)
    produce_values(kafka_broker.bootstrap, topic, ((0, None, bytes([i]) * VALUE) for i in range(RECORDS)), linger_ms=0)

    state = tmp_path / "state.json"
    config = tmp_path / "sluice.toml"
    config.write_text('[throttle]\nleader_rate_bytes = 7\n[[throttle.topics]]\ntopic = "from-file"\n')
    env = {"SLUICE_CONFIG": str(config), "SLUICE_ADMIN__TOKEN": TOKEN, "SLUICE_ADMIN__STATE_FILE": str(state)}
    throttle = {"leader_rate_bytes": 1, "consumers": [{"client_id": "backfill-*"}],
                "topics": [{"topic": f"orders-state-{stamp}-audit", "replicas": ""},
                           {"topic": "orders-state-*", "replicas": "*"}]}
    budget = {"budgets": [{"client_id": "reporting-*", "fetch_max_bytes": 50_000}]}

    with SubprocessProxy(kafka_broker.bootstrap, extra_env=env) as sluice:
        url = f"{sluice.admin_url}/throttles"
        assert http("GET", url)[1]["leader_rate_bytes"] == 7  # the config file's
        status, throttle_applied = http("PUT", url, throttle)
        assert status == 200 and throttle_applied["topics"] == throttle["topics"]
        status, budget_applied = http("PUT", f"{sluice.admin_url}/size-limits", budget)
        assert status == 200
        assert sluice.stop() == 0
    for applied in (throttle_applied, budget_applied):  # the answer's, not the section's
        del applied["revision"], applied["store"]
    assert json.loads(state.read_text()) == {"version": 1, "throttle": throttle_applied, "size_limit": budget_applied}

    with SubprocessProxy(kafka_broker.bootstrap, extra_env=env) as sluice:
        url = f"{sluice.admin_url}/throttles"
        status, shown = http("GET", url)
        assert status == 200 and shown.pop("status") is not None
        assert shown == {**throttle_applied, "revision": 0, "store": "this instance"}  # as configured: the glob
        # as written, the entries in order; a restarted process counts its own changes from 0
        assert http("GET", f"{sluice.admin_url}/size-limits") == (200, {**budget_applied, "revision": 0,
                                                                       "store": "this instance"})
        # In force, not only shown: the glob selects the topic for a backfill consumer at 1 byte/s. Of the first
        # fetch only the first batch passes (the quota is not yet reached: at least one batch), the next one gets
        # the partition with its records left out.
        with RawClient("127.0.0.1", sluice.bootstrap_port, client_id="backfill-raw") as c:
            assert 0 < partition_bytes(c, topic)[0] < RECORDS * VALUE
            assert partition_bytes(c, topic) == (0, 0, RECORDS)

            # SIGHUP re-reads the config file, then re-applies the state file: the admin change still wins ...
            config.write_text('[throttle]\nleader_rate_bytes = 9\n[[throttle.topics]]\ntopic = "from-file"\n')
            sighup(sluice)
            assert http("GET", url)[1]["leader_rate_bytes"] == 1
            assert partition_bytes(c, topic) == (0, 0, RECORDS)
            # ... until the state file is deleted: the next SIGHUP hands the sections back to the config file.
            state.unlink()
            sighup(sluice)
            status, shown = http("GET", url)
            assert (shown["leader_rate_bytes"], shown["topics"]) == (9, [{"topic": "from-file", "replicas": "*"}])
            assert http("GET", f"{sluice.admin_url}/size-limits")[1]["budgets"] == []
            assert partition_bytes(c, topic)[0] >= RECORDS * VALUE  # the topic is no longer throttled
        assert sluice.stop() == 0
