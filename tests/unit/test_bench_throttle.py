"""bench.throttle's own logic without a broker (a smoke test, so the bench does not rot; never a timing): the
window figures, the end-of-backlog fallback, the Java output parser, the Sluice config it writes and its checks
on the arguments. The measurement itself needs the real broker and runs as ``python -m bench.throttle``."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import throttle
from proxy.app import load_settings

TARGET = 1_000_000


def steady(seconds: int, per_second: int, per_chunk: int = 4) -> list[tuple[float, int]]:
    return [(s + i / per_chunk, per_second // per_chunk) for s in range(seconds) for i in range(per_chunk)]


def test_windows_after_the_first_only() -> None:
    # A burst in the warm-up window (seconds 0-10) does not count; 33 s give the windows [11, 22) ... [22, 33)
    samples = [(0.5, 50 * TARGET), *steady(33, TARGET)]
    stats = throttle.analyse(samples, 33, TARGET)
    assert stats.basis == "windows" and stats.windows == 12
    assert stats.worst_window_error == pytest.approx(0.0)
    assert stats.mean_bytes_s == pytest.approx(TARGET)
    assert len(stats.per_second) == 33 and stats.per_second[0] == 51 * TARGET


def test_worst_window_and_mean_at_twice_the_target() -> None:
    samples = steady(23, TARGET) + [(t, n) for t, n in steady(23, TARGET) if t >= 15]  # 2x from second 15
    stats = throttle.analyse(samples, 23, TARGET)
    assert stats.windows == 2  # [11, 22) and [12, 23)
    assert stats.worst_window_error == pytest.approx(8 / 11)  # [12, 23): 3 s at 1x, 8 s at 2x
    assert stats.mean_bytes_s == pytest.approx((4 + 16) / 12 * TARGET)


def test_backlog_end_keeps_only_windows_before_it_or_falls_back_to_the_whole_run() -> None:
    samples = steady(33, 2 * TARGET)
    late = throttle.analyse([s for s in samples if s[0] < 25.5], 33, TARGET, exhausted_at=25.5)
    assert late.basis == "windows" and late.windows == 4  # [11, 22) ... [14, 25): second 25 is partial
    assert late.worst_window_error == pytest.approx(1.0)
    early = throttle.analyse([s for s in samples if s[0] < 8], 33, TARGET, exhausted_at=8.0)
    assert early.basis == "until_backlog_end" and early.windows == 0
    assert early.mean_bytes_s == pytest.approx(2 * TARGET) and early.worst_window_error == pytest.approx(1.0)


def test_printed_records_complete_when_the_value_is_in_whatever_the_chunks() -> None:
    value = b"t" * 100
    stream = b"".join(b"Partition:%d\tOffset:%d\t" % (p, o) + value + b"\n" for p, o in [(0, 0), (3, 17), (1, 5)])
    stream = stream[:-1]  # the last newline stays in the tool's buffer
    for size in (1, 7, 64, len(stream)):
        parser = throttle.PrintedRecords(len(value))
        got = [r for i in range(0, len(stream), size) for r in parser.feed(stream[i : i + size])]
        assert got == [(0, 0), (3, 17), (1, 5)]
    with pytest.raises(ValueError):
        throttle.PrintedRecords(len(value)).feed(b"Processed a total of 3 messages.\n" * 3)


def test_sluice_config_is_valid_and_throttles_the_bench_clients(tmp_path: Path) -> None:
    path = tmp_path / "sluice.toml"
    path.write_text(throttle.sluice_config("bench-throttle-1", TARGET, "terminate"))
    settings = load_settings(path, env={})
    assert settings.throttle.leader_rate_bytes == TARGET
    assert [(t.topic, t.replicas) for t in settings.throttle.topics] == [("bench-throttle-1", "*")]
    assert [c.client_id for c in settings.throttle.consumers] == ["bench-throttle-*"]
    assert settings.sessions.mode == "terminate"


def test_arguments() -> None:
    args = throttle.parse_args([])
    assert (args.seconds, args.rate, args.modes) == (33, 1.0, ["passthrough", "terminate"])
    assert {throttle.CLIENTS[c].kind for c in args.clients} == {"session", "sessionless"}
    assert throttle.parse_args(["--seconds", "23", "--mib", "40", "--clients", "confluent"]).clients == ["confluent"]
    for bad in (["--seconds", "21"], ["--mib", "30", "--seconds", "33"], ["--clients", "nope"], ["--rate", "0"]):
        with pytest.raises(SystemExit):
            throttle.parse_args(bad)
