"""The access-log line (proxy/accesslog.py) against the schema written out the plain way: each field named and
JSON-encoded on its own, in the module docstring's order, by its rules (strings through json.dumps, ints as such,
``latency_ms`` with 3 decimals or null, the optional fields only when set, a policy's field as an int, a string or
compact JSON). The line builder caches what repeats per connection and per second; whatever the values (unicode,
control characters, None, a connection's fields changing between its requests, the clock crossing seconds), every
line must be the very same text."""

from __future__ import annotations

import io
import json
import math
from datetime import UTC, datetime, timedelta
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from proxy.accesslog import AccessLog

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def reference_line(t: float, r: dict[str, Any]) -> str:
    """One line as the schema describes it."""
    t_us = int(t * 1e6 + 0.5)  # the nearest microsecond (the module's rounding rule)
    ts = (_EPOCH + timedelta(microseconds=t_us)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    lat = r["latency_ms"]
    pairs: list[tuple[str, str]] = [
        ("schema", "1"), ("event", '"request"'), ("ts", json.dumps(ts)), ("conn_id", str(r["conn_id"])),
        ("client_id", json.dumps(r["client_id"])), ("api", json.dumps(r["api"])), ("api_key", str(r["api_key"])),
        ("version", str(r["version"])), ("correlation_id", str(r["correlation_id"])),
        ("listener", json.dumps(r["listener"])), ("upstream", json.dumps(r["upstream"])),
        *((name, str(r[name])) for name in ("bytes_client_to_proxy", "bytes_proxy_to_upstream",
                                            "bytes_upstream_to_proxy", "bytes_proxy_to_client")),
        ("latency_ms", f"{lat:.3f}" if math.isfinite(lat) else "null"),
        ("error_codes", "[" + ",".join(str(c) for c in r["error_codes"]) + "]"),
        ("decoded", "true" if r["decoded"] else "false"),
    ]
    if r["partitions"] is not None:
        pairs.append(("partitions", "[" + ",".join(
            f'{{"topic":{json.dumps(topic)},"partition":{p},"bytes":{n}}}' for topic, p, n in r["partitions"]) + "]"))
    for name in ("client_address", "principal"):
        if r[name] is not None:
            pairs.append((name, json.dumps(r[name])))
    for name, value in (r["fields"] or {}).items():
        pairs.append((name, str(value) if type(value) is int else json.dumps(value) if type(value) is str
                      else json.dumps(value, separators=(",", ":"))))
    return "{" + ",".join(f'"{name}":{raw}' for name, raw in pairs) + "}\n"


_text = st.text(max_size=12)  # any code point but surrogates: unicode, control characters, quotes, backslashes
_ints = st.integers(min_value=-(2**31), max_value=2**63)
_field_values = st.one_of(_ints, _text, st.booleans(), st.none(), st.floats(allow_nan=False, allow_infinity=False),
                          st.lists(st.integers(), max_size=3), st.dictionaries(_text, st.integers(), max_size=2))
_request = st.fixed_dictionaries({
    "conn_id": st.integers(0, 3), "client_id": st.one_of(st.none(), _text),
    "api": st.sampled_from(["Produce", "Fetch"]), "api_key": st.integers(0, 80),
    "version": st.integers(0, 17), "correlation_id": _ints,
    "bytes_client_to_proxy": _ints, "bytes_proxy_to_upstream": _ints, "bytes_upstream_to_proxy": _ints,
    "bytes_proxy_to_client": _ints,
    "latency_ms": st.one_of(st.floats(), st.floats(min_value=0, max_value=1e6)),
    "error_codes": st.lists(st.integers(-1, 120), max_size=3), "listener": st.sampled_from(["bootstrap", "broker-1"]),
    "upstream": st.one_of(st.just("broker:9092"), _text), "decoded": st.booleans(),
    "partitions": st.one_of(st.none(), st.lists(st.tuples(_text, st.integers(0, 99), _ints), max_size=3)),
    "client_address": st.one_of(st.none(), st.just("10.0.0.1"), _text), "principal": st.one_of(st.none(), _text),
    "fields": st.one_of(st.none(), st.dictionaries(st.sampled_from(["quota_throttle_time_ms", "throttled_bytes",
                                                                     "share_acknowledged"]), _field_values)),
})
# seconds since the epoch up to 2100, and steps that stay within a second or cross one
_times = st.lists(st.floats(min_value=0, max_value=4.1e9), min_size=1, max_size=4)


@given(st.lists(st.tuples(_times, _request), min_size=1, max_size=8))
def test_every_line_is_the_schema_written_out(requests: list[tuple[list[float], dict[str, Any]]]) -> None:
    out = io.StringIO()
    now = [0.0]
    log = AccessLog(out, clock=lambda: now[0])
    expected = []
    for times, r in requests:
        for t in times:  # the same request again at other times: cached parts reused, seconds crossed or not
            now[0] = t
            log.record(**r)
            expected.append(reference_line(t, r))
    assert out.getvalue() == "".join(expected)
