"""Throttles change while Sluice runs — `sluice throttle` CLI over the admin API (GET/PUT /throttles, bearer
token) and SIGHUP — without dropping a connection: the same raw client connection sees the change on its
next fetch. Also the throttle metrics on /metrics."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from rig.kafka import KafkaBroker
from rig.raw import RawClient
from tests.integration.test_reconfigure import http as _http
from tests.support.subprocess_proxy import SubprocessProxy
from tests.support.topics import create_topic, produce_values

pytestmark = pytest.mark.broker

TOKEN = "throttle-token"
RECORDS = 20
VALUE = 10 * 1024
REPO = Path(__file__).resolve().parents[2]


def http(method: str, url: str, body: object = None, token: str | None = TOKEN) -> tuple[int, Any]:
    return _http(method, url, body, token=token)


def cli(*args: str, token: str | None = TOKEN) -> subprocess.CompletedProcess[str]:
    """`sluice throttle ...` with the token in SLUICE_ADMIN__TOKEN (never on the command line), or none."""
    env = {k: v for k, v in os.environ.items() if k != "SLUICE_ADMIN__TOKEN"}
    if token is not None:
        env["SLUICE_ADMIN__TOKEN"] = token
    return subprocess.run([sys.executable, "-m", "proxy", "throttle", *args], capture_output=True, text=True,
                          timeout=60, cwd=REPO, env=env)


def partition_bytes(c: RawClient, topic: str) -> tuple[int, int, int]:
    """(record bytes, error code, high watermark) of partition 0 fetched from offset 0 on this connection."""
    view = c.fetch(12, topic, {0: 0}, max_wait_ms=100)
    [(_, part)] = list(view.partitions())
    return len(part.records or b""), part.error_code, part.high_watermark


def test_cli_admin_api_and_sighup_change_throttles_live(kafka_broker: KafkaBroker, tmp_path: Path) -> None:
    topic = f"throttle-admin-{int(time.time() * 1000)}"
    create_topic(kafka_broker.bootstrap, topic)
    produce_values(kafka_broker.bootstrap, topic, ((0, None, bytes([i]) * VALUE) for i in range(RECORDS)), linger_ms=0)

    config = tmp_path / "sluice.toml"
    config.write_text("")  # no throttle at start
    with SubprocessProxy(kafka_broker.bootstrap, extra_env={"SLUICE_CONFIG": str(config),
                                                            "SLUICE_ADMIN__TOKEN": TOKEN}) as sluice:
        url = f"{sluice.admin_url}/throttles"
        base = ["--admin", sluice.admin_url]
        with RawClient("127.0.0.1", sluice.bootstrap_port, client_id="backfill-raw") as c:
            full = partition_bytes(c, topic)
            assert full[0] >= RECORDS * VALUE and full[1:] == (0, RECORDS)

            # Refused without the token, and refused naming the key when invalid: nothing changes.
            assert http("PUT", url, {"leader_rate_bytes": 1}, token=None)[0] == 401
            status, err = http("PUT", url, {"topics": [{"topic": topic, "replicas": "0-1"}]})
            assert status == 400 and err["key"] == "throttle.topics[0].replicas" and "0-1" in err["error"]
            bad = cli("set", *base, "--topic", f"{topic}=0:x")
            assert bad.returncode != 0 and "throttle.topics[0].replicas" in bad.stderr
            no_token = cli("set", "--admin", sluice.admin_url, "--leader-rate", "1", token=None)
            assert no_token.returncode != 0 and "HTTP 401" in no_token.stderr
            token_file = tmp_path / "token"
            token_file.write_text(TOKEN + "\n")
            from_file = cli("clear", "--admin", sluice.admin_url, "--token-file", str(token_file), token=None)
            assert from_file.returncode == 0, from_file.stderr

            # A 1 byte/s throttle for backfill-* on the topic: of the first fetch, only the first batch passes
            # (below the bound the records that fit the headroom pass, and at least one batch), the next one on
            # the same connection gets the partition with empty records, error 0 and the real high watermark
            # (KIP-73's leader side).
            done = cli("set", *base, "--leader-rate", "1B", "--topic", topic, "--consumer", "backfill-*")
            assert done.returncode == 0, done.stderr
            applied = json.loads(done.stdout)
            assert applied["leader_rate_bytes"] == 1 and applied["topics"] == [{"topic": topic, "replicas": "*"}]
            assert 0 < partition_bytes(c, topic)[0] < full[0]
            assert partition_bytes(c, topic) == (0, 0, RECORDS)
            status = json.loads(cli("status", *base).stdout)
            assert status["leader_rate_bytes"] == 1 and status["status"]["leader_exceeded"] is True
            assert status["status"]["sum_lag"] == RECORDS
            assert sluice.metric("sluice_throttle_rate_limit_bytes", {"side": "leader"}) == 1
            assert sluice.metric("sluice_throttle_left_out_partitions_total", {"side": "leader"}) >= 1
            assert sluice.metric("sluice_throttle_sum_lag_offsets") == RECORDS
            assert sluice.metric("sluice_throttle_byte_rate", {"side": "leader"}) > 0

            # clear: the next fetch on the same connection gets everything again.
            assert cli("clear", *base).returncode == 0
            assert partition_bytes(c, topic)[0] == full[0]

            # SIGHUP re-reads the file's [throttle] section.
            config.write_text(f'[throttle]\nleader_rate_bytes = 2\n[[throttle.topics]]\ntopic = "{topic}"\n'
                              f'replicas = "0:5"\n[[throttle.consumers]]\nclient_id = "backfill-*"\n')
            sluice.signal(signal.SIGHUP)
            deadline = time.monotonic() + 10
            while http("GET", url)[1]["leader_rate_bytes"] != 2 and time.monotonic() < deadline:
                time.sleep(0.05)  # bounded poll of the observable configuration
            assert http("GET", url)[1]["topics"] == [{"topic": topic, "replicas": "0:5"}]
            assert sluice.metric("sluice_throttle_rate_limit_bytes", {"side": "leader"}) == 2
            # Consumers are throttled on the listed partitions (0 is listed, for broker 5, so for any consumer).
            # The quota's window still holds the bytes fetched above, so 2 B/s is exceeded at once.
            assert partition_bytes(c, topic) == (0, 0, RECORDS)
            assert http("GET", url)[1]["status"]["leader_exceeded"] is True
        assert sluice.stop() == 0
