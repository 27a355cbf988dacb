"""The analytics job's pure parts: KIP-73 sizing, Jain's index, bucket sizes, units, the schema's agreement with
the access-log writer, HTML escaping. No Spark session."""

from __future__ import annotations

import io
import json
import math

import pytest
from pyspark.sql.types import ArrayType, BooleanType, DoubleType, LongType, StringType, TimestampType

from proxy.accesslog import AccessLog
from proxy.analytics import html
from proxy.analytics.buckets import choose_bucket_seconds
from proxy.analytics.fairness import jain_index, jain_index_from_sums
from proxy.analytics.kip73 import InboundRate, ThrottleInputs, move_time_s, recommend, safe_range
from proxy.analytics.schema import CORRUPT_COLUMN, OPTIONAL_FIELDS, V1_FIELDS, access_log_schema
from proxy.analytics.units import fmt_bytes, fmt_duration, parse_bytes, parse_duration

MB = 1_000_000


def rate(upstream: str, peak: float) -> InboundRate:
    return InboundRate(upstream, peak_bps=peak, p95_bps=peak * 0.8, mean_bps=peak / 2, windows=10, window_s=10)


# ----------------------------------------------------------------------------------------------------- KIP-73


def test_move_time_is_bytes_over_spare_throttle() -> None:
    assert move_time_s(3600 * MB, throttle_bps=30 * MB, inbound_bps=20 * MB) == 360.0
    assert move_time_s(1, throttle_bps=20 * MB, inbound_bps=20 * MB) == math.inf  # T <= IN never finishes
    assert move_time_s(1, throttle_bps=10 * MB, inbound_bps=20 * MB) == math.inf


def test_safe_range_is_in_to_n_minus_in_over_r() -> None:
    assert safe_range(30 * MB, 125 * MB, 3) == (30 * MB, 115 * MB)
    low, high = safe_range(100 * MB, 125 * MB, 1)
    assert low >= high  # inbound alone fills the link: no safe throttle
    with pytest.raises(ValueError):
        safe_range(1, 2, 0)


def test_recommendation_for_a_move_within_an_hour() -> None:
    # IN = 20 MB/s on the busiest broker; 360 GB in an hour needs T >= 20 + 100 = 120 MB/s... above N - IN/R
    rates = [rate("kafka-1:9092", 20 * MB), rate("kafka-2:9092", 12 * MB)]
    rec = recommend(rates, ThrottleInputs(network_bps=125 * MB, replication_factor=3, move_bytes=360_000 * MB,
                                          move_within_s=3600))
    assert rec.inbound_bps == 20 * MB and rec.busiest_upstream == "kafka-1:9092"
    assert rec.feasible and rec.throttle_bps is None
    assert rec.move_time_s == pytest.approx(360_000 * MB / (rec.high_bps - 20 * MB))
    assert any("above the safe range" in t for t in rec.text)

    # 180 GB in an hour: T >= 20 + 50 = 70 MB/s, inside (20, 118.33) MB/s; rounded up to 2 significant figures
    rec = recommend(rates, ThrottleInputs(move_bytes=180_000 * MB, move_within_s=3600))
    assert rec.throttle_bps == 70 * MB
    assert rec.move_time_s == pytest.approx(3600)
    assert any("leader.replication.throttled.rate=70000000" in t for t in rec.text)

    rec = recommend(rates, ThrottleInputs(move_bytes=170_500 * MB, move_within_s=3600))  # needs 67.36 MB/s
    assert rec.throttle_bps == 68 * MB and rec.move_time_s is not None and rec.move_time_s < 3600


def test_recommendation_without_a_move_shows_examples_and_no_traffic_is_fine() -> None:
    rec = recommend([rate("b", 10 * MB)], ThrottleInputs())
    assert rec.throttle_bps is None and len(rec.examples) == 9
    assert all(rec.low_bps < t < rec.high_bps for t, _b, _m in rec.examples)
    empty = recommend([], ThrottleInputs(move_bytes=3600 * MB))
    assert empty.inbound_bps == 0 and empty.throttle_bps == MB
    assert "No inbound traffic" in empty.text[0]


def test_no_safe_throttle_is_said_plainly() -> None:
    rec = recommend([rate("b", 120 * MB)], ThrottleInputs(move_bytes=MB))
    assert not rec.feasible and rec.throttle_bps is None and rec.examples == []
    assert any("No safe throttle exists" in t for t in rec.text)


# ------------------------------------------------------------------------------------------- fairness, buckets


def test_jain_index() -> None:
    assert jain_index([5, 5, 5, 5]) == 1.0
    assert jain_index([1, 0, 0, 0]) == 0.25
    assert jain_index([1, 1, 0, 0]) == 0.5  # k equally served of n: k/n
    assert jain_index([]) is None and jain_index([0, 0]) is None
    assert jain_index_from_sums(3, 6.0, 14.0) == pytest.approx(36 / 42)
    with pytest.raises(ValueError):
        jain_index([-1])


@pytest.mark.parametrize(
    ("span_s", "bucket"), [(0, 1), (100, 1), (300, 5), (3600, 60), (86_400, 900), (10**9, 86_400)]
)
def test_bucket_sizes(span_s: float, bucket: int) -> None:
    assert choose_bucket_seconds(span_s) == bucket


# ------------------------------------------------------------------------------------------------------ units


def test_units() -> None:
    assert parse_bytes("500GiB") == 500 * 2**30
    assert parse_bytes("125M") == 125 * MB
    assert parse_bytes("1.5k") == 1500
    assert parse_duration("90m") == 5400 and parse_duration("2h") == 7200 and parse_duration("30") == 30
    for bad in ("", "x", "5 parsecs", "-1"):
        with pytest.raises(ValueError):
            parse_bytes(bad)
    assert fmt_bytes(1536) == "1.5 KiB" and fmt_bytes(12) == "12 B"
    assert fmt_duration(5400) == "1 h 30 min" and fmt_duration(math.inf) == "never"


# ----------------------------------------------------------------------------------------------------- schema


def test_schema_matches_what_the_access_log_writes() -> None:
    """Every field AccessLog.record() writes is in the Spark schema with the type its JSON value needs."""
    buf = io.StringIO()
    log = AccessLog(buf)
    log.record(conn_id=1, client_id=None, api="Fetch", api_key=1, version=17, correlation_id=3,
               bytes_client_to_proxy=1, bytes_proxy_to_upstream=2, bytes_upstream_to_proxy=3, bytes_proxy_to_client=4,
               latency_ms=1.5, error_codes=[6], listener="l", upstream="u", decoded=True)
    log.flush()
    line = json.loads(buf.getvalue())
    assert list(line) == list(V1_FIELDS)  # same fields, same order as the writer
    expected = {int: LongType, str: StringType, float: DoubleType, bool: BooleanType, list: ArrayType}
    for name, value in line.items():
        dtype = V1_FIELDS[name]
        if name == "ts":
            assert isinstance(dtype, TimestampType)
        elif value is not None:
            assert isinstance(dtype, expected[type(value)]), name
    names = access_log_schema().fieldNames()
    assert names == [*V1_FIELDS, *OPTIONAL_FIELDS, CORRUPT_COLUMN]


def test_html_escapes_everything_from_the_logs() -> None:
    evil = '<script>alert("x")</script>'
    page = html.render(evil, evil, [html.Section("a", evil, paragraphs=[evil], tables=[
        html.Table(evil, [evil], [[evil]])], pre_caption=evil, preformatted=[evil])])
    assert "<script>" not in page
    assert page.count("&lt;script&gt;") >= 6
