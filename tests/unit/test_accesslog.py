"""proxy.accesslog: one schema-v1 JSON line per record(), nothing when "off", the operational log setup."""

from __future__ import annotations

import asyncio
import importlib
import io
import json
import logging
import re
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

import proxy
from proxy import accesslog
from proxy.accesslog import (
    SCHEMA_VERSION,
    AccessLog,
    KeptListing,
    LogLimiter,
    configure_logging,
    get_access_log,
    get_logger,
)
from proxy.app import load_settings
from proxy.config import LoggingSettings
from proxy.server import Proxy
from tests.support.logs import route_sluice_logs_to_pytest

SCHEMA_FIELDS = [
    "schema",
    "event",
    "ts",
    "conn_id",
    "client_id",
    "api",
    "api_key",
    "version",
    "correlation_id",
    "listener",
    "upstream",
    "bytes_client_to_proxy",
    "bytes_proxy_to_upstream",
    "bytes_upstream_to_proxy",
    "bytes_proxy_to_client",
    "latency_ms",
    "error_codes",
    "decoded",
]


def fields(**overrides: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "conn_id": 7,
        "client_id": "consumer-1",
        "api": "Fetch",
        "api_key": 1,
        "version": 17,
        "correlation_id": 42,
        "bytes_client_to_proxy": 120,
        "bytes_proxy_to_upstream": 118,
        "bytes_upstream_to_proxy": 65536,
        "bytes_proxy_to_client": 65530,
        "latency_ms": 1.2345678,
        "error_codes": [],
        "listener": "127.0.0.1:19093",
        "upstream": "127.0.0.1:9092",
        "decoded": True,
    }
    base.update(overrides)
    return base


def lines_of(text: str) -> list[dict[str, Any]]:
    assert text.endswith("\n")
    return [json.loads(line) for line in text.splitlines()]


@pytest.fixture
def restore_logging() -> Iterator[None]:
    """configure_logging() changes global state (structlog, the root logger, the access log): undo it."""
    yield
    root = logging.getLogger()
    for handler in [h for h in root.handlers if isinstance(h, accesslog.SluiceHandler)]:
        root.removeHandler(handler)
    root.setLevel(logging.WARNING)
    route_sluice_logs_to_pytest()  # the test session's own configuration (tests/support/logs.py)
    accesslog.reset_access_log()


# ------------------------------------------------------------------------------------------------ schema


def test_one_line_per_record_with_schema_fields_in_order(tmp_path: Path) -> None:
    path = tmp_path / "access.jsonl"
    log = AccessLog(str(path))
    assert log.enabled
    log.record(**fields())
    log.record(**fields(correlation_id=43, error_codes=[1, 6], decoded=False, client_id=None))
    log.close()
    first, second = lines_of(path.read_text(encoding="utf-8"))
    assert list(first) == SCHEMA_FIELDS
    assert first["schema"] == SCHEMA_VERSION == 1
    assert first["event"] == "request"
    expected = fields()
    expected["latency_ms"] = 1.235  # rounded to microseconds
    assert {k: first[k] for k in expected} == expected
    assert (second["correlation_id"], second["error_codes"], second["decoded"]) == (43, [1, 6], False)
    assert second["client_id"] is None


def test_ts_is_iso8601_utc_with_microseconds() -> None:
    out = io.StringIO()
    AccessLog(out, clock=lambda: 1700000000.123456).record(**fields())
    assert lines_of(out.getvalue())[0]["ts"] == "2023-11-14T22:13:20.123456Z"

    out = io.StringIO()
    before = datetime.now(UTC)
    AccessLog(out).record(**fields())
    ts = datetime.fromisoformat(lines_of(out.getvalue())[0]["ts"])
    assert ts.utcoffset() == timedelta(0)
    assert before - timedelta(seconds=1) <= ts <= datetime.now(UTC) + timedelta(seconds=1)


def test_timestamp_cache_follows_the_clock_across_seconds() -> None:
    now = [1700000000.999999]
    out = io.StringIO()
    log = AccessLog(out, clock=lambda: now[0])
    log.record(**fields())
    now[0] = 1700000001.000001
    log.record(**fields())
    now[0] = 1700003600.5
    log.record(**fields())
    assert [e["ts"] for e in lines_of(out.getvalue())] == [
        "2023-11-14T22:13:20.999999Z",
        "2023-11-14T22:13:21.000001Z",
        "2023-11-14T23:13:20.500000Z",
    ]


@pytest.mark.parametrize("client_id", ['quote"back\\slash', "new\nline", "tab\tnul\x00", "üñí€😀", ""])
def test_hostile_strings_stay_valid_json(client_id: str) -> None:
    out = io.StringIO()
    log = AccessLog(out)
    log.record(**fields(client_id=client_id, listener='l"1', upstream="u\n1"))
    (event,) = lines_of(out.getvalue())
    assert (event["client_id"], event["listener"], event["upstream"]) == (client_id, 'l"1', "u\n1")


def test_partitions_field_only_when_given() -> None:
    out = io.StringIO()
    log = AccessLog(out)
    log.record(**fields())
    log.record(**fields(partitions=[('t"1', 0, 1024), ("t2", 3, 0)]))
    plain, decoded = lines_of(out.getvalue())
    assert "partitions" not in plain
    assert decoded["partitions"] == [{"topic": 't"1', "partition": 0, "bytes": 1024},
                                     {"topic": "t2", "partition": 3, "bytes": 0}]


def test_partitions_listed_line_after_line_stay_right_and_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    """A consumer's fetches list the same mostly empty partitions in every line: their text is kept, within the
    bound (a listing longer than it clears what was kept and still comes out whole), and a partition's bytes
    are its own in each line."""
    monkeypatch.setattr(accesslog, "_ITEMS_MAX", 5)
    out = io.StringIO()
    log = AccessLog(out)
    listings = [[("t", p, 0) for p in range(4)], [("t", 0, 7), ("t", 1, 0), ("t", 2, 0), ("t", 3, 0)],
                [("t", p, 0) for p in range(9)], [("t", p, 0) for p in range(4)], [("u", 0, 0), ("t", 0, 0)]]
    for listing in listings:
        log.record(**fields(partitions=listing))
        assert len(log._items) <= 5
    assert [[(i["topic"], i["partition"], i["bytes"]) for i in event["partitions"]]
            for event in lines_of(out.getvalue())] == listings


def test_kept_listings_come_out_as_their_rows_line_after_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """A listing of a response assembled from kept encodings (terminate mode's full response) is written as its
    rows would be: a partition's bytes in its own line only, a topic id's name once learnt, across the bound
    (the oldest key list dropped), and item by item for a list longer than the bound, one naming a partition
    twice, or bytes for a partition it does not list."""
    monkeypatch.setattr(accesslog, "_ITEMS_MAX", 6)
    out = io.StringIO()
    log = AccessLog(out)
    a: list[tuple[Any, int]] = [(b"id-a", 0), (b"id-a", 1), ("t", 0), (b"id-a", 2)]
    b: list[tuple[Any, int]] = [("t", p) for p in range(5)]
    labels = {b"id-a": "aWQtYQ==", "t": "t"}
    listings = [
        KeptListing(a, labels, {}),
        KeptListing(a, labels, {(b"id-a", 1): 7, ("t", 0): 9}),
        KeptListing(a, labels, {}),
        KeptListing(a, {**labels, b"id-a": 'named "a"'}, {(b"id-a", 2): 1}),  # the id's name learnt
        KeptListing(b, labels, {("t", 4): 3}),  # b pushes a out
        KeptListing(a, labels, {}),
        KeptListing([("t", p) for p in range(7)], labels, {("t", 6): 2}),  # longer than the bound
        KeptListing([("t", 0), ("t", 1), ("t", 0)], labels, {("t", 0): 5}),  # a partition twice
        KeptListing(a, labels, {("t", 9): 4}),  # bytes for a partition not listed
        KeptListing(a, labels, {(b"id-a", 0): 8}),
    ]
    for listing in listings:
        log.record(**fields(partitions=listing))
        assert log._kept._count <= 6
    assert [[(i["topic"], i["partition"], i["bytes"]) for i in event["partitions"]]
            for event in lines_of(out.getvalue())] == [listing.rows() for listing in listings]


def test_policy_fields_only_when_given() -> None:
    out = io.StringIO()
    log = AccessLog(out)
    log.record(**fields())
    log.record(**fields(fields={"throttle_target_bps": 5_000_000, "throttled_bytes": 1234,
                                "session_upstream_bytes": 77}))
    log.record(**fields(fields={"session_upstream_bytes": 0}))
    plain, both, session = lines_of(out.getvalue())
    assert not {"throttle_target_bps", "throttled_bytes", "session_upstream_bytes"} & set(plain)
    assert (both["throttle_target_bps"], both["throttled_bytes"], both["session_upstream_bytes"]) == \
        (5_000_000, 1234, 77)
    assert session["session_upstream_bytes"] == 0 and "throttle_target_bps" not in session


def test_non_finite_latency_is_null() -> None:
    out = io.StringIO()
    log = AccessLog(out)
    log.record(**fields(latency_ms=float("nan")))
    log.record(**fields(latency_ms=float("inf")))
    assert [e["latency_ms"] for e in lines_of(out.getvalue())] == [None, None]


def test_client_id_cache_is_bounded() -> None:
    out = io.StringIO()
    log = AccessLog(out)
    for i in range(10_000):  # a client inventing a new client_id per request
        log.record(**fields(client_id=f"c{i}"))
    assert len(log.strings) <= 4096
    assert lines_of(out.getvalue())[-1]["client_id"] == "c9999"


def test_per_connection_parts_cache_is_bounded() -> None:
    out = io.StringIO()
    log = AccessLog(out)
    for i in range(5_000):  # a long-lived proxy: every connection a new conn_id
        log.record(**fields(conn_id=i, client_address=f"10.0.{i // 256}.{i % 256}"))
    assert len(log._parts) <= 4096
    last = json.loads(out.getvalue().splitlines()[-1])
    assert (last["conn_id"], last["client_address"]) == (4999, "10.0.19.135")


# ------------------------------------------------------------------------------------- destinations


def test_log_limiter_allows_one_event_per_key_per_interval_and_counts_the_rest() -> None:
    now = [100.0]
    limiter = LogLimiter(10.0, lambda: now[0])
    assert limiter.allow("a") == 0  # the first one is logged, nothing was held back
    for t in (100.0, 101.0, 105.5, 109.999):
        now[0] = t
        assert limiter.allow("a") is None  # within the interval: not logged, counted
    assert limiter.allow("b") == 0  # keys (brokers) are independent
    now[0] = 110.0  # exactly one interval after the last logged one
    assert limiter.allow("a") == 4  # logged, with the four not logged
    assert limiter.allow("a") is None
    now[0] = 119.0
    assert limiter.allow("b") is None  # b was last logged at 109.999
    now[0] = 120.0
    assert limiter.allow("b") == 1
    assert limiter.allow("a") == 1
    assert limiter.allow("a") is None
    assert limiter.allow("a") is None
    now[0] = 500.0
    assert limiter.allow("a") == 2  # the count is of those since the last logged one, however long ago
    assert limiter.allow(None) == 0  # None (the bootstrap listener) is a key like any other
    now[0] = 520.0
    assert limiter.allow("a") == 0  # nothing held back since the last one


def test_off_writes_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = AccessLog("off")
    assert not log.enabled
    log.record(**fields())
    log.flush()
    log.close()
    assert capsys.readouterr() == ("", "")
    assert list(tmp_path.iterdir()) == []
    # Through the settings too.
    log = AccessLog(LoggingSettings(access_log="off"))
    log.record(**fields())
    assert capsys.readouterr() == ("", "")


def test_dash_means_stdout(capsys: pytest.CaptureFixture[str]) -> None:
    log = AccessLog("-")
    log.record(**fields())
    log.close()  # flushes, never closes stdout
    out, err = capsys.readouterr()
    assert err == ""
    assert lines_of(out)[0]["api"] == "Fetch"


def test_file_is_appended_and_reopened_after_rotation(tmp_path: Path) -> None:
    path = tmp_path / "access.jsonl"
    path.write_text('{"earlier": true}\n', encoding="utf-8")
    log = AccessLog(str(path))
    log.record(**fields(correlation_id=1))
    log.flush()
    path.rename(tmp_path / "access.jsonl.1")
    log.reopen()
    log.record(**fields(correlation_id=2))
    log.close()
    rotated = lines_of((tmp_path / "access.jsonl.1").read_text(encoding="utf-8"))
    assert rotated[0] == {"earlier": True} and rotated[1]["correlation_id"] == 1
    assert [e["correlation_id"] for e in lines_of(path.read_text(encoding="utf-8"))] == [2]


def test_first_line_is_flushed_without_close(tmp_path: Path) -> None:
    # A quiet proxy must not sit on its only lines until shutdown.
    path = tmp_path / "access.jsonl"
    log = AccessLog(str(path))
    log.record(**fields())
    assert len(path.read_text(encoding="utf-8").splitlines()) == 1
    log.close()


class _DiskFull(io.StringIO):
    def write(self, s: str) -> int:
        raise OSError(28, "No space left on device")


def test_write_errors_never_reach_the_caller() -> None:
    log = AccessLog(_DiskFull())
    log.record(**fields())
    log.record(**fields())
    assert log.dropped == 2


def test_dropped_lines_count_in_the_proxys_metric() -> None:
    """sluice_access_log_dropped_total: exported as 0 from the start, one per line a write failure lost."""
    log = AccessLog(_DiskFull())
    proxy = Proxy(load_settings(None, env={}), access_log=log)
    assert b'sluice_access_log_dropped_total{reason="write_failed"} 0.0' in proxy.metrics.exposition()
    for _ in range(3):
        log.record(**fields())
    assert proxy.metrics.total("sluice_access_log_dropped_total", reason="write_failed") == 3 == log.dropped


def test_unopenable_file_fails_at_construction(tmp_path: Path) -> None:
    with pytest.raises(OSError):
        AccessLog(str(tmp_path / "no" / "such" / "dir" / "access.jsonl"))


# ----------------------------------------------------------------------------------- configure_logging


def test_configure_logging_sets_access_log_and_json_operational_log(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], restore_logging: None
) -> None:
    path = tmp_path / "access.jsonl"
    access = configure_logging(LoggingSettings(level="info", access_log=str(path), format="json"))
    assert get_access_log() is access
    access.record(**fields())
    get_logger("sluice.test").info("listening", port=19092)
    get_logger("sluice.test").debug("hidden")
    logging.getLogger("asyncio").warning("library %s", "message")
    access.close()

    out, err = capsys.readouterr()
    assert out == ""  # the access log went to its file, the operational log to stderr
    assert len(lines_of(path.read_text(encoding="utf-8"))) == 1
    ops = lines_of(err)
    assert len(ops) == 2
    assert ops[0]["event"] == "listening" and ops[0]["port"] == 19092
    assert ops[0]["level"] == "info" and ops[0]["logger"] == "sluice.test"
    assert datetime.fromisoformat(ops[0]["ts"]).utcoffset() == timedelta(0)
    assert ops[1]["event"] == "library message" and ops[1]["logger"] == "asyncio"
    assert ops[1]["level"] == "warning"


def test_configure_logging_level_and_reconfigure(
    capsys: pytest.CaptureFixture[str], restore_logging: None
) -> None:
    log = get_logger("sluice.test")  # created before configuration: must follow it (lazy)
    configure_logging(LoggingSettings(level="debug", access_log="off"))
    log.debug("one")
    configure_logging(LoggingSettings(level="error", access_log="off"))
    log.warning("two")
    log.error("three")
    events = [e["event"] for e in lines_of(capsys.readouterr().err)]
    assert events == ["one", "three"]
    assert not get_access_log().enabled


def test_console_format_is_not_json(capsys: pytest.CaptureFixture[str], restore_logging: None) -> None:
    configure_logging(LoggingSettings(access_log="off", format="console"))
    get_logger("sluice.test").info("hello", who="world")
    err = capsys.readouterr().err
    assert "hello" in err and "who" in err
    with pytest.raises(json.JSONDecodeError):
        json.loads(err.splitlines()[0])


# ------------------------------------------------------------------------------------------------ sinks


class ListSink:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def offer(self, line: str) -> None:
        self.lines.append(line)


def test_a_sink_gets_every_line_even_when_the_destination_is_off() -> None:
    log = AccessLog("off")
    assert not log.enabled
    sink = ListSink()
    log.attach_sink(sink)
    assert log.enabled and log.sink is sink
    log.record(**fields(correlation_id=1))
    log.record(**fields(correlation_id=2))
    assert [r["correlation_id"] for r in lines_of("".join(sink.lines))] == [1, 2]
    log.detach_sink()
    assert not log.enabled
    log.record(**fields(correlation_id=3))
    assert len(sink.lines) == 2


def test_a_sink_gets_the_same_line_as_the_file(tmp_path: Path) -> None:
    path = tmp_path / "access.jsonl"
    log = AccessLog(str(path))
    sink = ListSink()
    log.attach_sink(sink)
    for i in range(3):
        log.record(**fields(correlation_id=i, partitions=[("t", 0, 10)],
                            fields={"throttle_target_bps": 5, "throttled_bytes": 1}))
    log.close()  # the file closes; the sink stays
    assert log.enabled
    log.record(**fields(correlation_id=3))
    assert path.read_text() == "".join(sink.lines[:3])
    assert len(sink.lines) == 4

async def test_last_lines_of_a_burst_are_flushed_without_another_request(tmp_path: Path) -> None:
    # The first line is flushed at once; the ones after it, within the flush interval, used to wait for the next
    # request (forever, on a proxy that then goes quiet). On the proxy's event loop a timer flushes them.
    path = tmp_path / "access.jsonl"
    log = AccessLog(str(path), flush_interval_s=0.05)
    try:
        for i in range(3):
            log.record(**fields(correlation_id=i))
        assert len(path.read_text(encoding="utf-8").splitlines()) == 1  # the rest is buffered
        deadline = time.monotonic() + 10
        while len(path.read_text(encoding="utf-8").splitlines()) < 3:
            assert time.monotonic() < deadline, "the buffered lines were never flushed"
            await asyncio.sleep(0.01)  # bounded poll of the file (the timer runs on this loop)
        assert [e["correlation_id"] for e in lines_of(path.read_text(encoding="utf-8"))] == [0, 1, 2]
    finally:
        log.close()


def test_policy_fields_of_every_json_kind() -> None:
    out = io.StringIO()
    log = AccessLog(out)
    log.record(**fields(fields={"n": 3, "s": 'a"b', "counts": {"ACCEPT": 2}, "flag": True, "none": None}))
    (line,) = lines_of(out.getvalue())
    assert {k: line[k] for k in ("n", "s", "counts", "flag", "none")} == \
        {"n": 3, "s": 'a"b', "counts": {"ACCEPT": 2}, "flag": True, "none": None}


def test_every_access_log_field_a_policy_sets_is_declared_by_its_registration() -> None:
    """Read from the source: the fields each policy package writes into ``Exchange.log`` are exactly those its
    registration declares (``Registration.log_fields``, the access-log reference), and no generic module sets one."""
    root = Path(proxy.__file__).parent
    written = re.compile(r'\bex\.log\[\s*"([a-z_]+)"\s*\]\s*=')
    for package in sorted(p for p in (root / "policies").iterdir() if (p / "__init__.py").exists()):
        registration = importlib.import_module(f"proxy.policies.{package.name}").REGISTRATION
        sets = {m for f in package.rglob("*.py") for m in written.findall(f.read_text())}
        assert sets == set(registration.log_fields), package.name
    generic = [f for f in root.rglob("*.py") if "policies" not in f.parts and written.search(f.read_text())]
    assert generic == []
