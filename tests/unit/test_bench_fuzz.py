"""bench.fuzz's own logic (a smoke test, so the bench does not rot): its JSON lines, the summary, a failure
reported with where it was raised and the draws that led to it, and a crash input replayed. The fuzzing itself
runs as ``python -m bench.fuzz``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bench import fuzz
from rig import fuzz_targets as targets


def lines(capsys: pytest.CaptureFixture[str]) -> list[dict[str, Any]]:
    return [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]


def test_a_short_run_prints_a_line_per_target_and_the_summary(capsys: pytest.CaptureFixture[str]) -> None:
    assert fuzz.main(["--minutes", "0.02", "--engine", "hypothesis", "--batch", "10",
                      "--targets", "decode_requests,fetch_streamer_valid"]) == 0
    out = lines(capsys)
    assert [line.get("target") for line in out[:2]] == ["decode_requests", "fetch_streamer_valid"]
    assert all(line["inputs"] > 0 and line["crashes"] == 0 and line["engine"] == "hypothesis" for line in out[:2])
    summary = out[-1]
    assert summary["summary"] == "fuzz" and summary["crashes"] == 0
    assert summary["inputs"] == sum(line["inputs"] for line in out[:2])


def test_every_target_is_registered() -> None:
    assert set(targets.TARGETS) == {
        "frame_reader_client", "frame_reader_upstream", "fetch_streamer_valid", "fetch_streamer_mutated",
        "decode_requests", "decode_responses", "fetch_request_fast", "fetch_baseline", "fetch_response_fast",
        "connection_events"}


def test_a_failure_is_reported_with_its_place_and_draws(monkeypatch: pytest.MonkeyPatch,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    def broken(data: Any) -> None:
        if data.draw(targets.st.integers(0, 10), label="n") > 3:
            raise IndexError("boom")

    monkeypatch.setitem(targets.TARGETS, "broken", broken)
    assert fuzz.main(["--minutes", "0.01", "--engine", "hypothesis", "--batch", "50", "--targets", "broken"]) == 1
    out = lines(capsys)
    [found] = out[0]["found"]
    assert found["error"] == "IndexError: boom" and "test_bench_fuzz.py" in found["where"]
    assert "Draw 1 (n)" in found["example"] and "reproduce_failure" in found["example"]
    assert out[-1]["crashes"] == 1


def test_a_crash_input_is_replayed_with_its_draws(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    def broken(data: Any) -> None:
        data.draw(targets.st.integers(0, 10), label="n")
        raise IndexError("boom")

    monkeypatch.setitem(targets.TARGETS, "broken", broken)
    error, where, example = fuzz.replay("broken", bytes(64))
    assert error == "IndexError: boom" and "(broken)" in where and "Draw (n): 0" in example
    monkeypatch.setitem(targets.TARGETS, "broken", lambda data: None)
    assert fuzz.replay("broken", bytes(64))[0] == "no longer fails"
