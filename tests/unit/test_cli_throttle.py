"""`sluice throttle plan` (KIP-73's sizing: move time = bytes / (T - IN), safe range IN < T < N - IN/R), sizes, and
`set`/`status` against the admin API (entries shown as configured)."""

from __future__ import annotations

import asyncio
import json

import pytest
from structlog.testing import capture_logs

from proxy.app import load_settings
from proxy.cli import main
from proxy.cli_throttle import parse_size, plan
from proxy.policies.throttle import Throttle
from tests.support.admin import admin_over


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


async def test_set_and_status_show_topic_entries_as_configured(capsys: pytest.CaptureFixture[str]) -> None:
    settings = load_settings(None, env={}).with_overrides({"admin.port": 0, "throttle.topics": [
        {"topic": "orders-*", "replicas": "*"}, {"topic": "o*", "replicas": "0:1"}]})

    async def cli(*args: str) -> tuple[int, str]:
        # The CLI blocks on HTTP: it runs off the loop that serves the admin API.
        code = await asyncio.to_thread(main, ["throttle", *args, "--admin", url])
        return code, capsys.readouterr().out

    async with admin_over(settings) as (proxy, url):
        with capture_logs() as logs:  # the proxy's own events, kept off the CLI's stdout
            code, out = await cli("set", "--topic", "orders-*=0:2", "--topic", "orders-audit=", "--topic", "a?",
                                  "--leader-rate", "5MB")
            assert code == 0
            # orders-* is replaced where it stands (first among the globs: its place is configuration), the new
            # entries are appended ("TOPIC=" lists no replicas, plain "TOPIC" all); globs stay as written.
            topics = [{"topic": "orders-*", "replicas": "0:2"}, {"topic": "o*", "replicas": "0:1"},
                      {"topic": "orders-audit", "replicas": ""}, {"topic": "a?", "replicas": "*"}]
            assert json.loads(out)["topics"] == topics
            policy = proxy.policy("throttle")
            assert isinstance(policy, Throttle)
            throttles = policy.throttles
            assert throttles.entry("orders-eu") == "orders-*" and throttles.entry("orders-audit") == "orders-audit"
            code, out = await cli("status")
            assert code == 0 and json.loads(out)["topics"] == topics
            with pytest.raises(SystemExit) as e:
                await cli("set", "--topic", "orders/eu")
            assert "throttle.topics[4].topic" in str(e.value.code) and "'/'" in str(e.value.code)
        assert [event["event"] for event in logs] == ["reconfigured", "admin_changed"]
