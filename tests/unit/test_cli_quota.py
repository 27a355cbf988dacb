"""``sluice quota`` (proxy/cli_quota.py) against the admin API of a Proxy that is not started: an entry changed
where it stands or appended, a rate exempted or unset, entries cleared, the status table, and a change refused
with the key that is wrong."""

from __future__ import annotations

import asyncio
import json

import pytest
from structlog.testing import capture_logs

from proxy.app import load_settings
from proxy.cli import main
from proxy.cli_quota import table
from proxy.policies.quota import Quota
from tests.support.admin import admin_over


async def test_set_clear_and_status(capsys: pytest.CaptureFixture[str]) -> None:
    settings = load_settings(None, env={}).with_overrides({"admin.port": 0, "quota.entries": [
        {"name": "all", "client_id": "<default>", "produce_rate_bytes": 1_000_000}]})

    async def cli(*args: str) -> tuple[int, str]:
        code = await asyncio.to_thread(main, ["quota", *args, "--admin", url])  # off the admin API's loop
        return code, capsys.readouterr().out

    async with admin_over(settings) as (proxy, url):
        with capture_logs():
            code, out = await cli("set", "--entry", "etl", "--client-id", "etl-*", "--fetch-rate", "5MB",
                                  "--produce-rate", "exempt")
            assert code == 0
            entries = json.loads(out)["entries"]
            assert [e["name"] for e in entries] == ["all", "etl"]
            assert entries[1]["fetch_rate_bytes"] == 5_000_000 and entries[1]["produce_rate_bytes"] == 0
            quota = proxy.policy("quota")
            assert isinstance(quota, Quota)
            gov = quota.book.quotas.governing("etl-1", None, "")
            # exempt from "all"'s produce quota
            assert gov.produce is None and gov.fetch is not None and gov.fetch.name == "etl"
            code, out = await cli("set", "--entry", "all", "--produce-rate", "unset", "--request-rate", "50")
            assert json.loads(out)["entries"][0] == {**entries[0], "produce_rate_bytes": None, "request_rate": 50.0}
            code, out = await cli("status")
            assert code == 0 and out.splitlines()[1].split() == [
                "ENTRY", "ENTITY", "PRODUCE", "FETCH", "REQUESTS", "SCOPE", "SHARED"]
            assert out.splitlines()[3].split() == ["etl", "client_id=etl-*", "exempt", "5.00", "MB/s", "-",
                                                   "instance", "no"]
            code, out = await cli("clear", "--entry", "all")
            assert [e["name"] for e in json.loads(out)["entries"]] == ["etl"]
            with pytest.raises(SystemExit) as e:
                await cli("set", "--entry", "new", "--produce-rate", "1MB")  # an entry with no entity
            assert "quota.entries[1].client_id: set at least one of" in str(e.value.code)
            with pytest.raises(SystemExit) as e:
                await cli("clear", "--entry", "gone")
            assert "no entry called gone" in str(e.value.code)
            code, out = await cli("clear")
            assert json.loads(out)["entries"] == []


def test_the_status_table_lists_entries_then_the_busiest_entities() -> None:
    body = {"window_s": 1.0, "samples": 11, "scope": "fleet", "revision": 4, "entries": [
        {"name": "etl", "principal": None, "client_id": "etl-*", "client_address": None,
         "produce_rate_bytes": 5_000_000, "fetch_rate_bytes": 0, "request_rate": None, "shared": False,
         "scope": None}],
        "status": {"entities": [{"entry": "etl", "kind": "produce", "principal": None, "client_id": "etl-1",
                                 "client_address": None, "rate": 1_250_000.0, "bound": 2_500_000.0}],
                   "more_entities": 3,
                   "fleet": {"usage_topic": "reachable", "live_instances": 2, "instance": "h:9092"}}}
    lines = table(body)
    assert lines[0] == ("quotas: window 11 x 1.0 s, scope fleet, fleet revision 4; fleet usage topic reachable, "
                        "2 live instance(s), this one h:9092")
    assert lines[2].split() == ["etl", "client_id=etl-*", "5.00", "MB/s", "exempt", "-", "fleet", "no"]
    assert lines[5].split() == ["etl", "produce", "client_id=etl-1", "1.25", "MB/s", "2.50", "MB/s"]
    assert lines[-1] == "... and 3 more"
