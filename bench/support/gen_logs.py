"""Generated Sluice access logs (schema 1) for the analytics tests and benchmark.

``python -m bench.support.gen_logs --rows N --out DIR [--files K] [--gzip] [--malformed M] [--extensions] [--seed S]``

Without ``--out`` it times itself: 1M rows (or ``--rows``) into a temporary directory, deleted afterwards, and the
rate printed.

Writes K files ``DIR/sluice-access-NNN.jsonl`` (``.jsonl.gz`` with --gzip), as K sidecars would: each file has
its own connections (conn_id restarts per process) and lines in time order, all files covering the same span.
The traffic is shaped like a small deployment: consumers (mostly Fetch, then Heartbeat, OffsetCommit, Metadata,
FindCoordinator, ListOffsets), producers (mostly Produce, some Metadata, ApiVersions, InitProducerId), each
client with a bootstrap connection and one per broker; request and response sizes and latencies log-normal per
API; a small share of decoded responses carry realistic error codes. Lines are formatted exactly as
``proxy.accesslog.AccessLog.record`` writes them (same field order, same number formatting).

``--malformed M`` spreads M malformed lines over the files (truncated lines, non-JSON text, a string where a
number belongs): every one is a line Spark's PERMISSIVE mode reports as corrupt. ``--extensions`` adds the
fields later access-log versions carry (``partitions``, ``throttle_target_bps``/``throttled_bytes``,
``session_upstream_bytes``), appended after the schema-1 fields as the schema's rules require.

Speed: numpy draws whole chunks of columns at once and lines are assembled from pre-formatted pieces (per
connection, per API, per second of timestamp), ~1.5 us a row on this project's machines; files are written by a
process pool (one process per core). Without numpy the same distributions come from ``random``, row by row.
Prints one JSON line: rows, files, malformed, bytes, seconds, rows_per_s.
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import os
import random
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, TextIO

try:
    import numpy as np
except ImportError:  # the pure-Python path below draws the same distributions
    np = None  # type: ignore[assignment]

__all__ = ["API_SPECS", "Deployment", "GenResult", "generate"]

CHUNK_ROWS = 100_000
START_EPOCH_S = 1_738_324_800  # 2025-01-31T12:00:00Z: fixed, so seeded runs are byte-identical
BROKERS = 3
BOOTSTRAP_PORT = 19092
BROKER_PORT_BASE = 19093  # Sluice serves node N on base + N


@dataclass(frozen=True)
class ApiSpec:
    name: str
    key: int
    version: int
    req_median: float  # bytes, log-normal
    req_sigma: float
    resp_median: float
    resp_sigma: float
    lat_median_ms: float
    lat_sigma: float
    error_p: float  # share of responses with a non-zero error code
    errors: tuple[int, ...]
    decoded: bool  # Sluice decodes (and may rewrite) this API's responses
    to_bootstrap: bool  # sent on the bootstrap connection rather than a broker's


API_SPECS: dict[str, ApiSpec] = {
    s.name: s
    for s in (
        ApiSpec("Fetch", 1, 17, 180, 0.3, 12_000, 1.6, 40.0, 1.5, 0.003, (6, 1, 74), False, False),
        ApiSpec("Produce", 0, 11, 9_000, 1.4, 90, 0.2, 3.0, 0.8, 0.002, (6, 7, 19), False, False),
        ApiSpec("Metadata", 3, 12, 60, 0.4, 900, 0.7, 1.2, 0.6, 0.01, (3, 5), True, True),
        ApiSpec("ApiVersions", 18, 4, 70, 0.1, 480, 0.05, 0.3, 0.5, 0.0, (), True, True),
        ApiSpec("FindCoordinator", 10, 6, 70, 0.2, 80, 0.2, 1.0, 0.6, 0.02, (15,), True, True),
        ApiSpec("Heartbeat", 12, 4, 80, 0.1, 20, 0.1, 0.8, 0.5, 0.01, (27, 25, 22), True, False),
        ApiSpec("OffsetCommit", 8, 9, 160, 0.5, 60, 0.3, 4.0, 0.7, 0.005, (27, 22, 25), True, False),
        ApiSpec("ListOffsets", 2, 9, 120, 0.3, 90, 0.3, 1.5, 0.5, 0.0, (), False, False),
        ApiSpec("InitProducerId", 22, 5, 60, 0.1, 40, 0.1, 8.0, 0.5, 0.0, (), False, True),
    )
}

# role -> (API mix). Consumers fetch, producers produce; the overall mix lands near 50% Fetch, 30% Produce.
ROLE_MIX: dict[str, dict[str, float]] = {
    "consumer": {
        "Fetch": 0.74, "Heartbeat": 0.12, "OffsetCommit": 0.07, "Metadata": 0.03, "FindCoordinator": 0.01,
        "ListOffsets": 0.02, "ApiVersions": 0.01,
    },
    "producer": {"Produce": 0.9, "Metadata": 0.07, "ApiVersions": 0.02, "InitProducerId": 0.01},
}

# (client_id, role, weight: share of this file's requests)
CLIENTS: tuple[tuple[str | None, str, float], ...] = (
    ("orders-consumer", "consumer", 0.22),
    ("billing-consumer", "consumer", 0.14),
    ("analytics-spark", "consumer", 0.12),
    ("audit-consumer", "consumer", 0.06),
    ("orders-producer", "producer", 0.2),
    ("payments-producer", "producer", 0.14),
    ("rdkafka", "producer", 0.08),
    (None, "consumer", 0.04),  # a client that sends no client_id: logged as null
)

TOPICS = (("orders", 6), ("payments", 4), ("clicks", 8))


@dataclass(frozen=True)
class GenResult:
    files: list[Path]
    rows: int  # valid request lines
    malformed: int
    bytes: int
    seconds: float

    def json(self) -> dict[str, Any]:
        return {
            "bench": "gen_logs",
            "rows": self.rows,
            "files": len(self.files),
            "malformed": self.malformed,
            "bytes": self.bytes,
            "seconds": round(self.seconds, 3),
            "rows_per_s": round(self.rows / self.seconds) if self.seconds > 0 else None,
        }


@dataclass(frozen=True)
class _Conn:
    conn_id: int
    client: int  # index into the deployment's clients
    node: int  # 0 = bootstrap
    head: str  # '"conn_id":..,"client_id":..,' pre-formatted
    tail: str  # '"listener":..,"upstream":..,'


@dataclass(frozen=True)
class Deployment:
    """Who talks through one sidecar: ``clients`` (client_id, role, share of requests) and ``topics`` (name,
    partitions). Every client has a bootstrap connection and one per broker."""

    clients: tuple[tuple[str | None, str, float], ...] = CLIENTS
    topics: tuple[tuple[str, int], ...] = TOPICS

    @classmethod
    def sized(cls, clients: int | None = None, topics: int | None = None) -> Deployment:
        """The small default deployment, grown to ``clients`` clients and ``topics`` topics (never fewer than the
        default's): the added clients are two consumers to a producer with Zipf-like shares (client k gets 1/k of
        the first's), together as busy as the named ones; the added topics have 1 to 32 partitions."""
        extra_c = max(0, (clients or 0) - len(CLIENTS))
        named = sum(w for _c, _r, w in CLIENTS)
        harmonic = sum(1.0 / (k + 1) for k in range(extra_c))
        added = tuple(
            (f"{'producer' if k % 3 == 2 else 'consumer'}-{k:04d}", "producer" if k % 3 == 2 else "consumer",
             named / (k + 1) / harmonic)
            for k in range(extra_c)
        )
        extra_t = max(0, (topics or 0) - len(TOPICS))
        more = tuple((f"topic-{k:03d}", (1, 3, 6, 12, 24, 32)[k % 6]) for k in range(extra_t))
        return cls(CLIENTS + added, TOPICS + more)

    @cached_property
    def conns(self) -> list[_Conn]:
        conns: list[_Conn] = []
        for ci, (client_id, _role, _w) in enumerate(self.clients):
            for node in range(BROKERS + 1):
                conn_id = len(conns) + 1
                port = BOOTSTRAP_PORT if node == 0 else BROKER_PORT_BASE + node
                upstream = f"kafka-{max(node, 1)}:9092"
                conns.append(
                    _Conn(
                        conn_id,
                        ci,
                        node,
                        f'"conn_id":{conn_id},"client_id":{json.dumps(client_id)},',
                        f'"listener":"127.0.0.1:{port}","upstream":"{upstream}",',
                    )
                )
        return conns


API_NAMES = list(API_SPECS)
_API_HEAD = [f'"api":"{s.name}","api_key":{s.key},"version":{s.version},' for s in API_SPECS.values()]


def _conn_index(client: int, node: int) -> int:
    return client * (BROKERS + 1) + node


# ---------------------------------------------------------------------------------------------- column draws


@dataclass
class _Columns:
    """One chunk of rows as Python lists (what the line formatter consumes)."""

    t_us: list[int]
    conn: list[int]  # index into the deployment's conns
    api: list[int]  # index into API_NAMES
    req: list[int]
    resp: list[int]
    lat: list[float]
    err: list[int]  # 0 = none


def _columns_numpy(rng: Any, n: int, t0_us: int, t1_us: int, dep: Deployment) -> _Columns:
    assert np is not None
    t = np.sort(rng.integers(t0_us, t1_us, size=n, endpoint=False))
    weights = np.array([w for _c, _r, w in dep.clients])
    client = rng.choice(len(dep.clients), size=n, p=weights / weights.sum())
    api = np.empty(n, dtype=np.int64)
    for ci, (_cid, role, _w) in enumerate(dep.clients):
        rows = np.flatnonzero(client == ci)
        mix = ROLE_MIX[role]
        names = list(mix)
        p = np.array([mix[k] for k in names])
        api[rows] = np.array([API_NAMES.index(k) for k in names])[rng.choice(len(names), size=rows.size, p=p / p.sum())]
    to_bootstrap = np.array([s.to_bootstrap for s in API_SPECS.values()])[api]
    node = np.where(to_bootstrap, 0, rng.integers(1, BROKERS + 1, size=n))
    conn = client * (BROKERS + 1) + node
    specs = list(API_SPECS.values())
    req_mu = np.log(np.array([s.req_median for s in specs]))[api]
    req_sd = np.array([s.req_sigma for s in specs])[api]
    resp_mu = np.log(np.array([s.resp_median for s in specs]))[api]
    resp_sd = np.array([s.resp_sigma for s in specs])[api]
    lat_mu = np.log(np.array([s.lat_median_ms for s in specs]))[api]
    lat_sd = np.array([s.lat_sigma for s in specs])[api]
    req = np.maximum(12, rng.lognormal(req_mu, req_sd)).astype(np.int64)
    resp = np.maximum(12, rng.lognormal(resp_mu, resp_sd)).astype(np.int64)
    lat = np.round(rng.lognormal(lat_mu, lat_sd), 3)
    err_p = np.array([s.error_p for s in specs])[api]
    has_err = rng.random(n) < err_p
    err = np.zeros(n, dtype=np.int64)
    for ai, s in enumerate(specs):
        rows = np.flatnonzero(has_err & (api == ai))
        if rows.size and s.errors:
            err[rows] = np.array(s.errors)[rng.integers(0, len(s.errors), size=rows.size)]
    return _Columns(t.tolist(), conn.tolist(), api.tolist(), req.tolist(), resp.tolist(), lat.tolist(), err.tolist())


def _columns_python(rnd: random.Random, n: int, t0_us: int, t1_us: int, dep: Deployment) -> _Columns:
    t = sorted(rnd.randrange(t0_us, t1_us) for _ in range(n))
    specs = list(API_SPECS.values())
    weights = [w for _c, _r, w in dep.clients]
    cols = _Columns(t, [], [], [], [], [], [])
    for ci in rnd.choices(range(len(dep.clients)), weights=weights, k=n):
        mix = ROLE_MIX[dep.clients[ci][1]]
        name = rnd.choices(list(mix), weights=list(mix.values()))[0]
        ai = API_NAMES.index(name)
        s = specs[ai]
        node = 0 if s.to_bootstrap else rnd.randint(1, BROKERS)
        cols.conn.append(_conn_index(ci, node))
        cols.api.append(ai)
        cols.req.append(max(12, int(rnd.lognormvariate(math.log(s.req_median), s.req_sigma))))
        cols.resp.append(max(12, int(rnd.lognormvariate(math.log(s.resp_median), s.resp_sigma))))
        cols.lat.append(round(rnd.lognormvariate(math.log(s.lat_median_ms), s.lat_sigma), 3))
        cols.err.append(rnd.choice(s.errors) if s.errors and rnd.random() < s.error_p else 0)
    return cols


# ---------------------------------------------------------------------------------------------- formatting


class _Extensions:
    """The fields later access-log versions add, drawn per row (only with --extensions; tests use few rows)."""

    def __init__(self, rnd: random.Random, rows: int, span_s: float, dep: Deployment) -> None:
        self.rnd = rnd
        self.topics = dep.topics
        weight = dict((c, w) for c, _r, w in dep.clients)["analytics-spark"] / sum(w for _c, _r, w in dep.clients)
        fetch = API_SPECS["Fetch"]
        mean_fetch = fetch.resp_median * math.exp(fetch.resp_sigma**2 / 2)  # mean of the log-normal
        # Fetches of "analytics-spark" are throttled; the target sits above their expected rate in the first half
        # and below it in the second, so the report shows a throttle that held and then did not.
        expected = rows * weight * ROLE_MIX["consumer"]["Fetch"] * mean_fetch / max(span_s, 1.0)
        self.targets = (int(expected * 1.3), int(expected * 0.9))
        self.throttled_client = [c for c, _r, _w in dep.clients].index("analytics-spark")
        self.partition_weights = {t: [1.0 / (1 + p) for p in range(n)] for t, n in dep.topics}

    def fields(self, conn: _Conn, api: str, resp: int, req: int, first_half: bool) -> str:
        rnd = self.rnd
        out = []
        if api in ("Fetch", "Produce"):
            topic, n = self.topics[rnd.randrange(len(self.topics))]
            parts = sorted(set(rnd.choices(range(n), weights=self.partition_weights[topic], k=rnd.randint(1, 3))))
            payload = max(0, (resp if api == "Fetch" else req) - 80)
            shares = [0.0 if (api == "Fetch" and rnd.random() < 0.2) else rnd.random() for _ in parts]
            total = sum(shares) or 1.0
            items = ",".join(
                f'{{"topic":"{topic}","partition":{p},"bytes":{int(payload * s / total)}}}'
                for p, s in zip(parts, shares, strict=True)
            )
            out.append(f'"partitions":[{items}]')
        if api == "Fetch" and conn.client == self.throttled_client:
            target = self.targets[0] if first_half else self.targets[1]
            out.append(f'"throttle_target_bps":{target},"throttled_bytes":{resp}')
        if api == "Fetch":
            out.append(f'"session_upstream_bytes":{int(resp * rnd.uniform(0.15, 0.6))}')
        return ("," + ",".join(out)) if out else ""


def _lines(cols: _Columns, corr: list[int], sec_cache: dict[int, str], ext: _Extensions | None,
           mid_us: int, conns: list[_Conn]) -> Iterator[str]:
    decoded_api = [s.decoded for s in API_SPECS.values()]
    for t_us, ci, ai, req, resp, lat, err in zip(
        cols.t_us, cols.conn, cols.api, cols.req, cols.resp, cols.lat, cols.err, strict=True
    ):
        sec = t_us // 1_000_000
        prefix = sec_cache.get(sec)
        if prefix is None:
            prefix = sec_cache[sec] = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(sec))
        conn = conns[ci]
        corr[ci] += 1
        decoded = decoded_api[ai] or err != 0
        # Sluice rewrites addresses in decoded responses: the client-facing size differs a little from upstream's.
        to_client = resp + (ci % 7) - 3 if decoded_api[ai] else resp
        extra = "" if ext is None else ext.fields(conn, API_NAMES[ai], resp, req, t_us < mid_us)
        yield (
            f'{{"schema":1,"event":"request","ts":"{prefix}.{t_us - sec * 1_000_000:06d}Z",'
            f"{conn.head}{_API_HEAD[ai]}"
            f'"correlation_id":{corr[ci]},{conn.tail}'
            f'"bytes_client_to_proxy":{req},"bytes_proxy_to_upstream":{req},'
            f'"bytes_upstream_to_proxy":{resp},"bytes_proxy_to_client":{to_client},'
            f'"latency_ms":{lat:.3f},"error_codes":[{err if err else ""}],'
            f'"decoded":{"true" if decoded else "false"}{extra}}}\n'
        )


def _malformed_line(rnd: random.Random, good: str, kind: int) -> str:
    """Three kinds Spark reports as corrupt: a line cut short (a proxy killed mid-write), text that is not JSON
    at all, and a string where the schema has a number."""
    if kind == 0:
        return good[: rnd.randrange(10, len(good) // 2)] + "\n"
    if kind == 1:
        return "*** log rotated by logrotate, not JSON ***\n"
    return good.replace('"conn_id":', '"conn_id":"c', 1).replace(',"client_id"', '","client_id"', 1)


@dataclass(frozen=True)
class _FileJob:
    path: Path
    rows: int
    malformed: int
    seed: int
    span_s: float
    compress: bool
    extensions: bool
    deployment: Deployment


def _write_file(job: _FileJob) -> int:
    seed = job.seed
    rnd = random.Random(seed)
    rng = np.random.default_rng(seed) if np is not None else None
    t0 = START_EPOCH_S * 1_000_000
    span_us = max(1, int(job.span_s * 1_000_000))
    dep = job.deployment
    corr = [0] * len(dep.conns)
    sec_cache: dict[int, str] = {}
    ext = _Extensions(rnd, job.rows, job.span_s, dep) if job.extensions else None
    # Malformed lines go after randomly chosen valid lines (positions drawn up front, so chunking does not matter).
    bad_after = sorted(rnd.randrange(max(job.rows, 1)) for _ in range(job.malformed))
    out: TextIO
    if job.compress:
        # Level 1: gzip's default level 9 would triple the time for ~10% smaller files.
        out = gzip.open(job.path, "wt", encoding="utf-8", compresslevel=1)
    else:
        out = open(job.path, "w", encoding="utf-8", buffering=1 << 20)  # closed below
    size = 0
    written = 0
    bad_i = 0
    try:
        chunks = max(1, math.ceil(job.rows / CHUNK_ROWS))
        for k in range(chunks):
            n = min(CHUNK_ROWS, job.rows - k * CHUNK_ROWS)
            # Each chunk covers its slice of the span, so a file's lines are in time order, as a proxy writes.
            # (sliced by row count, so the last, shorter chunk does not come out denser or sparser)
            c0 = t0 + span_us * (k * CHUNK_ROWS) // job.rows
            c1 = max(c0 + 1, t0 + span_us * (k * CHUNK_ROWS + n) // job.rows)
            cols = _columns_numpy(rng, n, c0, c1, dep) if rng is not None else _columns_python(rnd, n, c0, c1, dep)
            lines = list(_lines(cols, corr, sec_cache, ext, t0 + span_us // 2, dep.conns))
            here = []
            while bad_i < len(bad_after) and bad_after[bad_i] < written + n:
                here.append((bad_after[bad_i] - written, bad_i % 3))
                bad_i += 1
            for at, kind in reversed(here):  # back to front: earlier positions stay valid
                lines.insert(at + 1, _malformed_line(rnd, lines[at], kind))
            text = "".join(lines)
            out.write(text)
            size += len(text)
            written += n
        if job.rows == 0:  # malformed lines only
            for i in range(job.malformed):
                text = _malformed_line(rnd, '{"schema":1,"event":"request","conn_id":1,"client_id":"x"}\n', i % 3)
                out.write(text)
                size += len(text)
    finally:
        out.close()
    return size


def generate(
    out_dir: str | Path,
    rows: int,
    *,
    files: int = 1,
    compress: bool = False,
    malformed: int = 0,
    extensions: bool = False,
    seed: int = 7,
    span_s: float = 3600.0,
    jobs: int | None = None,
    deployment: Deployment | None = None,
) -> GenResult:
    """Write ``rows`` valid lines (+ ``malformed`` bad ones) over ``files`` files in ``out_dir``, each file the
    traffic of one sidecar serving ``deployment`` (default: ``Deployment()``, 8 clients and 3 topics)."""
    if files < 1 or rows < 0 or malformed < 0:
        raise ValueError("files >= 1, rows >= 0, malformed >= 0")
    started = time.monotonic()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    suffix = ".jsonl.gz" if compress else ".jsonl"
    work = [
        _FileJob(
            out / f"sluice-access-{i:03d}{suffix}",
            rows // files + (1 if i < rows % files else 0),
            malformed // files + (1 if i < malformed % files else 0),
            seed * 1000 + i,
            span_s,
            compress,
            extensions,
            deployment or Deployment(),
        )
        for i in range(files)
    ]
    workers = min(files, jobs or os.cpu_count() or 1)
    if workers > 1:
        with ProcessPoolExecutor(workers) as pool:
            sizes = list(pool.map(_write_file, work))
    else:
        sizes = [_write_file(j) for j in work]
    return GenResult([j.path for j in work], rows, malformed, sum(sizes), time.monotonic() - started)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1_000_000, help="valid request lines in all (default 1M)")
    ap.add_argument("--out", help="directory for the files (created); default: a temporary one, deleted after")
    ap.add_argument("--files", type=int, default=1, help="number of files (sidecars), default 1")
    ap.add_argument("--gzip", action="store_true", help="write .jsonl.gz")
    ap.add_argument("--malformed", type=int, default=0, help="malformed lines to mix in, in all")
    ap.add_argument("--extensions", action="store_true", help="add partitions/throttle/session fields")
    ap.add_argument("--span-s", type=float, default=3600.0, help="time span the lines cover, seconds")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--jobs", type=int, default=None, help="writer processes (default: one per core)")
    ap.add_argument("--clients", type=int, default=None,
                    help=f"client_ids per sidecar (default and minimum {len(CLIENTS)})")
    ap.add_argument("--topics", type=int, default=None, help=f"topics (default and minimum {len(TOPICS)})")
    a = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="sluice-gen-logs-") as scratch:
        result = generate(a.out or scratch, a.rows, files=a.files, compress=a.gzip, malformed=a.malformed,
                          extensions=a.extensions, seed=a.seed, span_s=a.span_s, jobs=a.jobs,
                          deployment=Deployment.sized(a.clients, a.topics))
    print(json.dumps(result.json()), flush=True)


if __name__ == "__main__":
    main()
