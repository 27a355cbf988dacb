"""`sluice throttle plan` (KIP-73 Q&A: move time = bytes / (T - IN), safe range IN < T < N - IN/R) and sizes."""

from __future__ import annotations

import pytest

from proxy.cli import main
from proxy.cli_throttle import parse_size, plan


@pytest.mark.parametrize(("text", "value"), [("100", 100), ("5MB", 5_000_000), ("5mb/s", 5_000_000),
                                             ("2MiB", 2 << 20), ("1.5GB", 1_500_000_000), ("10 KiB/s", 10240)])
def test_parse_size(text: str, value: int) -> None:
    assert parse_size(text) == value


@pytest.mark.parametrize("text", ["", "MB", "5XB", "-1MB", "5 M B", "1e6"])
def test_parse_size_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="not a size"):
        parse_size(text)


def test_move_time_is_bytes_over_throttle_minus_inbound() -> None:
    seconds, warnings = plan(600_000_000, 10_000_000, 40_000_000, network=125_000_000, replication_factor=3)
    assert seconds == pytest.approx(20.0) and warnings == []


def test_throttle_at_or_below_inbound_never_finishes() -> None:
    for t in (10_000_000, 5_000_000):
        seconds, warnings = plan(1, 10_000_000, t)
        assert seconds is None and "never finishes" in warnings[0]


def test_throttle_above_safe_upper_bound_warns() -> None:
    # N - IN/R = 100 - 30/3 = 90 MB/s
    seconds, warnings = plan(1_000, 30_000_000, 95_000_000, network=100_000_000, replication_factor=3)
    assert seconds is not None and len(warnings) == 1 and "N - IN/R = 90.00 MB/s" in warnings[0]
    assert plan(1_000, 30_000_000, 89_000_000, network=100_000_000, replication_factor=3)[1] == []


def test_plan_command_output_and_exit_codes(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["throttle", "plan", "--bytes", "600MB", "--inbound-rate", "10MB", "--throttle", "40MB",
                 "--network", "125MB"]) == 0
    out = capsys.readouterr()
    assert "move time          20.0 s" in out.out and "10.00 MB/s < T < 121.67 MB/s" in out.out
    assert out.err == ""
    assert main(["throttle", "plan", "--bytes", "1GB", "--inbound-rate", "50MB", "--throttle", "40MB"]) == 1
    out = capsys.readouterr()
    assert "never (T <= IN)" in out.out and "warning: the move never finishes" in out.err
    with pytest.raises(SystemExit) as e:
        main(["throttle", "plan", "--bytes", "lots", "--inbound-rate", "1", "--throttle", "2"])
    assert e.value.code == 2
