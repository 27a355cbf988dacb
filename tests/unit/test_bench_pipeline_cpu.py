"""bench.pipeline_cpu runs every case end to end through the sans-IO pipeline (a smoke test, so the bench does
not rot; it asserts what each case did, never a timing)."""

from __future__ import annotations

import json

import pytest

from bench import pipeline_cpu
from proxy import metrics


@pytest.mark.parametrize("version", [12, 16])
def test_every_case_runs_and_terminate_goes_upstream_incrementally(version: int,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    incremental = metrics.total("sluice_upstream_fetch_requests_total", kind="incremental")
    downstream = metrics.total("sluice_downstream_fetch_requests_total", kind="incremental")
    pipeline_cpu.main(["--partitions", "300", "--fetches", "3", "--version", str(version)])
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [line.get("case") for line in lines[:-1]] == list(pipeline_cpu.CASES)
    assert lines[-1]["summary"] == "pipeline_cpu" and all(lines[-1][case] >= 0 for case in pipeline_cpu.CASES)
    # 3 fetches each for the two terminate cases went upstream in Sluice's session; 3 were a client's own
    assert metrics.total("sluice_upstream_fetch_requests_total", kind="incremental") - incremental == 6
    assert metrics.total("sluice_downstream_fetch_requests_total", kind="incremental") - downstream == 3
