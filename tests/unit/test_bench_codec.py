"""bench.codec's checks and its --compare side run end to end on a small response (a smoke test, so the bench does
not rot; it asserts what the bench checks and reports, never a timing)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import codec
from proxy.wire.fetch_fast import FetchResponseView


def test_summary_carries_its_checks(capsys: pytest.CaptureFixture[str]) -> None:
    assert codec.main(["--partitions", "20", "--versions", "12,4", "--repeat", "1"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    names = {line["name"] for line in lines[:-1]}
    assert {"fast", "fast-materialised", "fast+copy-pass", "kafka-python"} <= names
    summary = lines[-1]
    assert summary["summary"] == "codec" and summary["reencoded_equal"] and summary["same_as_kafka_python"]
    assert summary["fast_us_per_partition"] > 0 and summary["load"] >= 0


@pytest.mark.parametrize("version", [4, 11, 12, 16])
def test_like_for_like_is_what_kafka_python_hands_out(version: int) -> None:
    body = codec.build_response(version, 30)
    assert codec.same_as_kafka_python(version, body)
    view = codec.like_for_like(version, body)()[0]
    assert all(type(p.records) is bytes for _, p in view.partitions())
    # a lazy view is not like for like: its records are slices of the frame
    lazy = FetchResponseView.decode(memoryview(body), version)
    assert all(type(p.records) is memoryview for _, p in lazy.partitions())


def test_compare_side_reports_its_source_and_load() -> None:
    line = codec.side(12, 20, 1)
    assert line["copy_records"] and line["like_for_like_us"] > 0 and line["lazy_us"] > 0
    assert (Path(line["source"]) / "proxy" / "wire" / "fetch_fast.py").is_file() and line["load"] >= 0
