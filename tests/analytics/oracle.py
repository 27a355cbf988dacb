"""The test oracle: the same access logs read with plain Python (json, gzip), aggregated with dicts.

Independent of the job on purpose - no Spark, no proxy.analytics import - so a shared mistake cannot hide: the
classification rules are restated here from the access-log schema (proxy/accesslog.py), not imported.
"""

from __future__ import annotations

import json
import math
import zlib
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

BYTES = ("bytes_client_to_proxy", "bytes_proxy_to_upstream", "bytes_upstream_to_proxy", "bytes_proxy_to_client")
INT_FIELDS = ("schema", "conn_id", "api_key", "version", "correlation_id", *BYTES)
STR_FIELDS = ("event", "ts", "api", "listener", "upstream")
NULLABLE = ("client_id", "latency_ms")


def _gunzip_complete_lines(path: Path) -> str:
    """A gzip file's text up to its last complete line, even when the file was cut short (a truncated gzip keeps
    what was decompressed before the cut; a partial last line is not a line)."""
    data = path.read_bytes()
    out: list[bytes] = []
    while data:
        d = zlib.decompressobj(16 + zlib.MAX_WBITS)
        out.append(d.decompress(data))
        if not d.eof:  # truncated: no more members
            break
        data = d.unused_data  # concatenated gzip members
    text = b"".join(out).decode("utf-8")
    return text if text.endswith("\n") else text[: text.rfind("\n") + 1]


def log_files(paths: Iterable[Path]) -> list[Path]:
    files: list[Path] = []
    for p in paths:
        files.extend(sorted(f for f in p.rglob("*") if f.is_file()) if p.is_dir() else [p])
    return files


def read_lines(paths: Iterable[Path]) -> Iterator[tuple[Path, str]]:
    for f in log_files(paths):
        text = _gunzip_complete_lines(f) if f.suffix == ".gz" else f.read_text(encoding="utf-8")
        for line in text.split("\n"):
            if line.strip():
                yield f, line


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _well_typed(obj: dict[str, Any]) -> bool:
    """Every present, non-null schema field has its schema type (what Spark's PERMISSIVE parse enforces)."""
    for k in INT_FIELDS:
        if obj.get(k) is not None and not _is_int(obj[k]):
            return False
    for k in (*STR_FIELDS, "client_id"):
        if obj.get(k) is not None and not isinstance(obj[k], str):
            return False
    if obj.get("ts") is not None:
        try:
            datetime.fromisoformat(obj["ts"])
        except ValueError:
            return False
    lat = obj.get("latency_ms")
    if lat is not None and (isinstance(lat, bool) or not isinstance(lat, int | float)):
        return False
    codes = obj.get("error_codes")
    if codes is not None and not (isinstance(codes, list) and all(_is_int(c) for c in codes)):
        return False
    return obj.get("decoded") is None or isinstance(obj["decoded"], bool)


def classify(line: str) -> tuple[str, dict[str, Any] | None]:
    try:
        obj = json.loads(line)
    except ValueError:
        return "malformed", None
    if not isinstance(obj, dict) or not _well_typed(obj):
        return "malformed", None
    if obj.get("schema") is None:
        return "incomplete", None
    if obj["schema"] != 1:
        return "other_schema", None
    if obj.get("event") is None:
        return "incomplete", None
    if obj["event"] != "request":
        return "other_event", None
    required = (*INT_FIELDS, *STR_FIELDS, "error_codes", "decoded")
    if any(obj.get(k) is None for k in required):
        return "incomplete", None
    return "valid", obj


def latency_us(ms: float | None) -> int | None:
    """A latency in whole microseconds, half up; None when not a measurement (missing, not finite, negative, or
    beyond 1e12 ms)."""
    if ms is None or not math.isfinite(ms) or not 0 <= ms <= 1e12:
        return None
    return math.floor(ms * 1000.0 + 0.5)


def quantize(us: int) -> int:
    """``us`` to its 3 most significant decimal digits, the rest rounded half up."""
    scale = 10 ** max(len(str(us)) - 3, 0)
    x = us + scale // 2
    return x - x % scale


def epoch_us(ts: str) -> int:
    dt = datetime.fromisoformat(ts)
    return round(dt.timestamp() * 1_000_000)


@dataclass
class Oracle:
    classes: Counter[str] = field(default_factory=Counter)
    rows: list[dict[str, Any]] = field(default_factory=list)

    @classmethod
    def read(cls, paths: Iterable[Path]) -> Oracle:
        o = cls()
        for f, line in read_lines(paths):
            kind, obj = classify(line)
            o.classes[kind] += 1
            if obj is not None:
                obj["_source"] = str(f.absolute())
                o.rows.append(obj)
        return o

    # ---------------------------------------------------------------- aggregates, keyed like the Parquet tables

    def _sum(self, key: Any) -> dict[Any, tuple[int, ...]]:
        acc: dict[Any, list[int]] = defaultdict(lambda: [0] * 5)
        for r in self.rows:
            a = acc[key(r)]
            a[0] += 1
            for i, b in enumerate(BYTES, 1):
                a[i] += r[b]
        return {k: tuple(v) for k, v in acc.items()}

    def by_client(self) -> dict[Any, tuple[int, ...]]:
        return self._sum(lambda r: r.get("client_id"))

    def by_api(self) -> dict[Any, tuple[int, ...]]:
        return self._sum(lambda r: r["api"])

    def by_connection(self) -> dict[Any, tuple[int, ...]]:
        return self._sum(lambda r: (r["_source"], r["conn_id"]))

    def by_listener(self) -> dict[Any, tuple[int, ...]]:
        return self._sum(lambda r: r["listener"])

    def by_upstream(self) -> dict[Any, tuple[int, ...]]:
        return self._sum(lambda r: r["upstream"])

    def traffic(self, bucket_s: int) -> dict[Any, tuple[int, ...]]:
        def key(r: dict[str, Any]) -> tuple[int, Any, str]:
            return (epoch_us(r["ts"]) // (bucket_s * 1_000_000) * bucket_s, r.get("client_id"), r["api"])

        return self._sum(key)

    def requests_with_errors(self) -> dict[str, int]:
        return dict(Counter(r["api"] for r in self.rows if r["error_codes"]))

    def error_codes(self) -> dict[tuple[str, int], int]:
        return dict(Counter((r["api"], c) for r in self.rows for c in r["error_codes"]))

    def inbound(self, window_s: int) -> dict[tuple[str, int], int]:
        acc: dict[tuple[str, int], int] = defaultdict(int)
        for r in self.rows:
            acc[(r["upstream"], epoch_us(r["ts"]) // (window_s * 1_000_000) * window_s)] += r[
                "bytes_upstream_to_proxy"]
        return dict(acc)

    def latencies(self) -> dict[str, list[float]]:
        """API -> its measured latencies (ms), sorted."""
        acc: dict[str, list[float]] = defaultdict(list)
        for r in self.rows:
            if latency_us(r.get("latency_ms")) is not None:
                acc[r["api"]].append(float(r["latency_ms"]))
        return {k: sorted(v) for k, v in acc.items()}

    def latency_by_api(self) -> dict[str, tuple[int, float, float, float, float, float]]:
        """API -> (measured, p50, p95, p99, max, mean), ms: nearest-rank percentiles of the quantized latencies,
        the exact max, the mean of the whole microseconds."""
        out = {}
        for api, values in self.latencies().items():
            us = [latency_us(v) for v in values]
            q = sorted(quantize(u) for u in us if u is not None)
            n = len(q)
            # nearest rank: the smallest value whose cumulative count reaches ceil(p/100 x n)
            p50, p95, p99 = (q[(n * p + 99) // 100 - 1] / 1000 for p in (50, 95, 99))
            out[api] = (n, p50, p95, p99, values[-1], sum(u for u in us if u is not None) / n / 1000)
        return out

    def partitions(self) -> dict[tuple[str, int], tuple[int, int, int, int, int]]:
        """(topic, partition) -> (fetch bytes, fetches, empty fetches, produce bytes, produces)."""
        acc: dict[tuple[str, int], list[int]] = defaultdict(lambda: [0] * 5)
        for r in self.rows:
            for p in r.get("partitions") or []:
                a = acc[(p["topic"], p["partition"])]
                if r["api"] == "Fetch":
                    a[0] += p["bytes"]
                    a[1] += 1
                    a[2] += p["bytes"] == 0
                elif r["api"] == "Produce":
                    a[3] += p["bytes"]
                    a[4] += 1
        return {k: (v[0], v[1], v[2], v[3], v[4]) for k, v in acc.items()}

    def throttle(self, bucket_s: int) -> dict[tuple[int, str], tuple[int, int]]:
        """(bucket, source) -> (max target, throttled bytes)."""
        acc: dict[tuple[int, str], list[int]] = defaultdict(lambda: [0, 0])
        for r in self.rows:
            if r.get("throttle_target_bps") is not None:
                a = acc[(epoch_us(r["ts"]) // (bucket_s * 1_000_000) * bucket_s, r["_source"])]
                a[0] = max(a[0], r["throttle_target_bps"])
                a[1] += r.get("throttled_bytes") or 0
        return {k: (v[0], v[1]) for k, v in acc.items()}

    def sessions(self) -> tuple[int, int]:
        """(client-facing bytes, upstream session bytes) over rows carrying session_upstream_bytes."""
        rows = [r for r in self.rows if r.get("session_upstream_bytes") is not None]
        return sum(r["bytes_proxy_to_client"] for r in rows), sum(r["session_upstream_bytes"] for r in rows)


def jain(values: Sequence[float]) -> float:
    total = sum(values)
    sq = sum(v * v for v in values)
    return total * total / (len(values) * sq)
