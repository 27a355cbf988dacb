"""bench.soak, bench.storm, bench.sharing and bench.quota, run briefly against the session's broker: they complete
and print the JSON lines their docstrings promise, with figures of the right kinds. Smoke tests so the benches do
not rot: no figure is judged (the benches measure; a 2-core machine under a test suite is no place to judge a
timing)."""

from __future__ import annotations

import json

import pytest

from bench import quota, sharing, soak, storm
from rig.kafka import KafkaBroker

pytestmark = pytest.mark.broker


def lines(out: str) -> list[dict[str, object]]:
    return [json.loads(line) for line in out.splitlines()]


def test_soak_runs_and_reports(kafka_broker: KafkaBroker, capsys: pytest.CaptureFixture[str]) -> None:
    assert soak.main(["--minutes", "0.1", "--interval-s", "3", "--rate", "50",
                      "--upstream", kafka_broker.bootstrap]) == 0
    out = lines(capsys.readouterr().out)
    intervals = [ln for ln in out if ln.get("bench") == "soak" and "interval" in ln]
    assert [ln["interval"] for ln in intervals] == [1, 2]
    for ln in intervals:
        assert isinstance(ln["rss_mb"], float) and isinstance(ln["fds"], int) and ln["requests"]
        assert "p999_ms" in ln and isinstance(ln["tail_by_api"], dict) and "probes" in ln["probe"]
    [outcome] = [ln for ln in out if "records_acknowledged" in ln]
    assert outcome["errors"] == [], outcome
    for consumer in ("ck_consumer", "kp_consumer"):
        assert outcome[consumer] == {"consumed": outcome["records_acknowledged"], "lost": 0, "duplicates": 0}
    summary = out[-1]
    assert summary["summary"] == "soak"
    assert set(summary) == {"summary", "minutes", "rss_growth_mb", "fd_growth", "p99_ms_last_minute",
                            "p99_ms_max_after_first", "p999_ms_max_after_first", "p99_goal_met",
                            "probe_added_p99_ms_max_after_first", "cpu_s_per_gib", "lost", "duplicated"}
    assert summary["lost"] == 0 and summary["duplicated"] == 0


def test_storm_runs_and_reports(kafka_broker: KafkaBroker, capsys: pytest.CaptureFixture[str]) -> None:
    assert storm.main(["--clients", "20", "--rounds", "1", "--partitions", "4",
                       "--upstream", kafka_broker.bootstrap]) == 0
    out = lines(capsys.readouterr().out)
    summary = out[-1]
    assert summary["summary"] == "storm" and summary["clients"] == 20
    for mode in ("cold", "warm"):
        for path in ("direct", "sluice"):
            for step in ("api_versions", "metadata", "list_offsets"):
                assert set(summary[f"{mode}_{path}_{step}_ms"]) == {"p50", "p90", "p99", "max"}  # type: ignore[arg-type]
    assert set(summary["upstream_wait_bound_ms"]) == {"p50", "p90", "p99", "max"}  # type: ignore[arg-type]
    assert set(summary["sluice_cpu_ms_per_client"]) == {"cold", "warm_connect", "warm_requests"}  # type: ignore[arg-type]
    assert summary["sluice_listen_backlog"] in ({}, {"bootstrap": 1024, "broker": 1024})


def test_sharing_runs_and_reports(kafka_broker: KafkaBroker, capsys: pytest.CaptureFixture[str]) -> None:
    assert sharing.main(["--records", "600", "--keys", "150", "--work-ms", "0",
                         "--upstream", kafka_broker.bootstrap]) == 0
    out = lines(capsys.readouterr().out)
    runs = [ln for ln in out if ln.get("bench") == "sharing"]
    assert [ln["path"] for ln in runs] == ["direct", "no-sharing", "sharing"]
    for ln in runs:
        assert sum(ln["per_consumer"]) == 600 and isinstance(ln["records_per_s"], float)  # every record once
        assert ln["lost"] == 0 and ln["duplicated"] == 0
    assert runs[2]["filtered_mib"] > 0 and runs[1]["filtered_mib"] == 0  # only the shared topic was filtered
    summary = out[-1]
    assert summary["summary"] == "sharing"
    assert {"speedup_vs_no_sharing", "speedup_vs_direct", "cpu_s_per_filtered_mib", "client", "batch_records",
            "goals", "met"} <= set(summary)
    assert summary["check"] == {"lost": 0, "duplicated": 0, "out_of_order": 0, "ok": True}


def test_quota_runs_and_reports(kafka_broker: KafkaBroker, capsys: pytest.CaptureFixture[str]) -> None:
    assert quota.main(["--smoke", "--upstream", kafka_broker.bootstrap]) == 0
    out = lines(capsys.readouterr().out)
    runs = [ln for ln in out if ln.get("bench") == "quota" and "second" not in ln]
    assert [(ln["side"], ln["client"]) for ln in runs] == [("produce", "confluent"), ("fetch", "confluent")]
    assert runs[0]["acknowledged"] == runs[0]["stored"] > 0  # every acknowledged record is in the topic
    summary = out[-1]
    assert summary["summary"] == "quota" and summary["lost"] == [] and summary["errors"] == []
    assert isinstance(summary["worst_window_error"], float)
