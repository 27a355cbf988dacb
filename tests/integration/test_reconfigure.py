"""Budgets change while Sluice runs — admin API (PUT /size-limits, bearer token) and SIGHUP — without
dropping a connection: the same raw client connection sees the new budget on its next fetch."""

from __future__ import annotations

import json
import signal
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from proxy.wire.records import walk_batches
from rig.kafka import KafkaBroker
from rig.raw import RawClient
from tests.support.subprocess_proxy import SubprocessProxy
from tests.support.topics import create_topic, produce_values

pytestmark = pytest.mark.broker

TOKEN = "s3cret-token"
RECORDS = 40
VALUE = 10 * 1024


def http(method: str, url: str, body: Any = None, token: str | None = TOKEN) -> tuple[int, Any]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as e:
        text = e.read()
        return e.code, json.loads(text) if text.startswith(b"{") else text.decode()


def record_bytes(c: RawClient, topic: str) -> tuple[int, int]:
    """(record bytes in one fetch of partition 0 from offset 0, size of its first batch)."""
    view = c.fetch(12, topic, {0: 0}, max_bytes=50 << 20, partition_max_bytes=10 << 20)
    [(_, part)] = list(view.partitions())
    walk = walk_batches(part.records or b"")
    return walk.complete_size, walk.batches[0].size


def test_budget_changes_live_through_admin_api_and_sighup(kafka_broker: KafkaBroker, tmp_path: Path) -> None:
    topic = f"reconf-{int(time.time() * 1000)}"
    create_topic(kafka_broker.bootstrap, topic)
    produce_values(kafka_broker.bootstrap, topic, ((0, None, bytes([i % 256]) * VALUE) for i in range(RECORDS)),
                   batch_size=1, linger_ms=0)

    config = tmp_path / "sluice.toml"
    config.write_text("")  # no budgets at start
    with SubprocessProxy(kafka_broker.bootstrap, extra_env={"SLUICE_CONFIG": str(config),
                                                            "SLUICE_ADMIN__TOKEN": TOKEN}) as sluice:
        url = f"{sluice.admin_url}/size-limits"
        with RawClient("127.0.0.1", sluice.bootstrap_port) as c:
            unlimited, first = record_bytes(c, topic)
            assert unlimited >= RECORDS * VALUE  # no budget: everything in one response

            # Refused without the token, and refused (naming the key) when invalid: nothing changes.
            assert http("PUT", url, {"budgets": [{"client_id": "*", "fetch_max_bytes": 1}]}, token=None)[0] == 401
            status, err = http("PUT", url, {"budgets": [{"fetch_max_bytes": 5}]})
            assert status == 400 and "client_id" in err["error"]
            assert record_bytes(c, topic)[0] == unlimited

            status, applied = http("PUT", url, {"budgets": [{"client_id": "raw-*", "fetch_max_bytes": 50_000}]})
            assert status == 200 and applied["budgets"][0]["fetch_max_bytes"] == 50_000
            assert http("GET", url)[1] == applied
            limited, _ = record_bytes(c, topic)  # same connection, next fetch
            assert first <= limited <= 50_000

            # SIGHUP re-reads the file (its dynamic sections).
            config.write_text('[[size_limit.budgets]]\nclient_id = "*"\nfetch_max_bytes = 25000\n')
            sluice.signal(signal.SIGHUP)
            deadline = time.monotonic() + 10
            while http("GET", url)[1]["budgets"][0]["fetch_max_bytes"] != 25_000 and time.monotonic() < deadline:
                time.sleep(0.05)  # bounded poll of the observable configuration
            assert http("GET", url)[1]["budgets"][0]["fetch_max_bytes"] == 25_000
            assert first <= record_bytes(c, topic)[0] <= 25_000

            # An invalid file is refused with a log event; the running configuration stays.
            config.write_text('[[size_limit.budgets]]\nfetch_max_bytes = "lots"\n')
            sluice.signal(signal.SIGHUP)
            deadline = time.monotonic() + 10
            while "reload_refused" not in sluice.stderr_text() and time.monotonic() < deadline:
                time.sleep(0.05)
            assert "reload_refused" in sluice.stderr_text()
            assert http("GET", url)[1]["budgets"][0]["fetch_max_bytes"] == 25_000
        assert sluice.stop() == 0
