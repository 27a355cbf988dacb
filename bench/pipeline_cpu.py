"""Proxy CPU per Fetch in the sans-IO policy chain, by policy, for one client with many partitions (no sockets,
no broker: the request and response frames are built before timing and replayed), so the figures are the
chain's alone.

``python -m bench.pipeline_cpu [--partitions 10000] [--version 12] [--fetches 20] [--cases A,B]
[--compare REV [--rounds 6]]``

One JSON line per case (``--cases``: those only), all in one run: ``{"bench": "pipeline_cpu", "case",
"partitions", "version", "ms_per_fetch"}`` (request + response side, the median of ``--fetches`` fetches, each
timed alone, every frame built beforehand), then ``{"summary": "pipeline_cpu", ...}`` with every case's figure.

``--compare REV`` runs this very file against REV's code (extracted into a temporary directory; revisions from
before the policy chain are driven through their ``proxy.pipeline.Pipeline``, see :func:`engine`) and against this
tree's: for each case, ``--rounds`` times, a fresh process of each (the round's hash seed), both on one CPU, making
their fetches in turns (ABBA, fetch by fetch; see :func:`compare`). It ends with ``{"summary":
"pipeline_cpu_compare", "rounds", "before": {...}, "after": {...}, "ratio": {...}, "ratio_range": {...}}``: each
side's median per case, the median of the rounds' ratios (after / before) and their range: before and after in one
run, the same harness.

Every reply is checked after the timing (:func:`check`); each summary carries the replies found wrong (``"wrong"``)
and the verdict (bench/support/verdict.py), and the bench exits 1 when any was (with ``--compare``, on either side).
Goals (``met``; ``--check`` exits 1 when one is missed): ``terminate_sessionless`` at most 3 ms per fetch and
``terminate_logged`` at most 5 (at the default 10,000 partitions: a ~450 KB line a fetch); with ``--compare``, no
case more than 5% slower than REV's.
``--smoke``: 1,000 partitions, 5 fetches per case. Cases:

- ``relay``: no policy applies (the request is classified and relayed; Fetch responses below v16 are not opened);
- ``size_limit``: a KIP-74 budget for the client (request clamped and reordered, response collected and enforced);
- ``terminate_sessionless``: ``[sessions] mode = "terminate"``, a session-less client (librdkafka): every fetch
  lists every partition, starting one further on each time (librdkafka's rotation), and gets a full response,
  the upstream session carries three changed partitions;
- ``terminate_logged``: the same with the access log on (the analytics' input), through the connection core (the
  framing, and the access-log line, which lists every partition of each response the chain decodes, written), the
  busy partitions answered with a record batch each (their bytes in the line); each line is checked against its
  reply (:func:`check_line`);
- ``terminate_session``: the same for a client with its own session (Java, kafka-python): incremental requests
  and responses with the three changed partitions (O(changed) on both sides);
- ``produce``: not a Fetch: a producer's round trip (Produce v10, acks=1, one 100-byte record; the broker's plain
  answer) through the connection core as the server drives it (request framed, classified, sent; response read,
  skimmed for KIP-951 NodeEndpoints, relayed), default settings, access log off: the per-request cost every
  client pays (``ms_per_fetch`` is then per round trip). ``--partitions`` and ``--version`` do not apply to it.

``python -m bench.pipeline_cpu --opcodes [--case fetch_all] [--compare REV]`` counts instead of timing: the Python
bytecodes Sluice executes, and the calls it makes, for one ``produce`` round trip (after 40 warm-up round trips; the
harness's own frames, bench/ and rig/, left out), with the functions that execute most. A count does not move with
the machine's load, so a change of a few percent shows where a timing could not: through a real broker the same
round trip's added p50 is within a spread of several microseconds between process starts (bench/latency.py), and on
this machine each of these bytecodes weighs several times its warm cost (docs/PERFORMANCE.md). The bare relay
(rig/bare_relay.py) executes a few dozen per round trip. ``before_request_write`` and ``before_response_write``
count what runs before each write is handed over: uvloop sends in ``writelines()`` itself when nothing is queued, so
those are on the client's wait, and the rest (metrics, the access-log line) overlaps the broker's or the client's
work. ``{"bench": "pipeline_opcodes", "case": "produce", "opcodes": N, "calls": N, "before_request_write": N,
"before_response_write": N, "top": [[opcodes, calls, "file:function"], ...]}``; ``--case fetch_all`` counts a Fetch
round trip instead, through the core with every policy on as ``bench.passthrough --policies all`` runs them (its
``ALL_POLICIES``): a session-less client (librdkafka's requests) of 3 partitions, each answered with 20 batches of
16 KiB (~1 MiB, as a consumer catching up gets them), version ``--version`` (below 13: names), the fake clock 50 ms
on per round trip; the check: every batch reaches the client unchanged; with ``--compare REV`` both sides, one run
each, and ``{"summary": "pipeline_opcodes_compare", "before": {...}, "after": {...}, "ratio": ...}`` (after /
before, all bytecodes).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import tomllib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.support.verdict import add_options, at_most, emit, exit_status, summary

try:
    from proxy.app import load_settings
except ImportError:  # pragma: no cover - revisions before the composition root (--compare)
    from proxy.config import load_settings  # type: ignore[attr-defined,no-redef]

try:
    from proxy.policies.terminate.sessions import LEGACY, FetchMetadata, FetchParams, PartitionKey, UpstreamPlan
except ImportError:  # pragma: no cover - revisions before the policy packages (--compare)
    from proxy.policies.sessions import (  # type: ignore[no-redef]
        LEGACY,
        FetchMetadata,
        FetchParams,
        PartitionKey,
        UpstreamPlan,
    )
from proxy.wire.fetch_fast import FetchPartition, FetchResponseView, FetchTopic, decode_frame
from proxy.wire.fetch_request_fast import decode_fetch_request
from proxy.wire.messages import encode_request, request_codec
from proxy.wire.model import Message

CLIENT_ID = "bench-client"
BUSY = 3  # partitions with news in every fetch
TOPIC_ID = bytes(range(16))  # the topic's id, named "bench" (Fetch v13+ address topics by id)
CASES = ("relay", "size_limit", "terminate_sessionless", "terminate_logged", "terminate_session", "produce")
#: what ``--opcodes`` reports per side (``--compare``)
OPCODE_KEYS = ("opcodes", "calls", "before_request_write", "before_response_write")

#: a fetch through the proxy's per-request logic: (request frame, upstream response frame) -> the client's reply
#: (b"" when the response is relayed unopened)
Fetch = Callable[[bytes, bytes], bytes]


def _module(name: str, before: str) -> Any:
    """Module ``name`` of this tree, or ``before``, its name in revisions before the policy packages."""
    try:
        return importlib.import_module(name)
    except ImportError:
        return importlib.import_module(before)


def _apply_plan() -> Any:
    """The construct-model request builder (rig/fetch_oracle.py; in revisions before the chain,
    proxy.policies.sessions)."""
    try:
        return importlib.import_module("rig.fetch_oracle").apply_plan
    except ImportError:
        return _module("proxy.policies.terminate.sessions", "proxy.policies.sessions").apply_plan


def request_frame(version: int, corr: int, offsets: dict[PartitionKey, int], meta: FetchMetadata,
                  max_bytes: int = 50 << 20) -> bytes:
    body = request_codec(1, version).default().replace(max_wait_ms=500, min_bytes=1, max_bytes=max_bytes)
    body = body.replace(replica_id=-1) if version < 15 else body
    parts = {k: FetchParams(o) for k, o in offsets.items()}
    body = _apply_plan()(body, version, UpstreamPlan(meta, parts, [], parts))
    header = Message(request_api_key=1, request_api_version=version, correlation_id=corr, client_id=CLIENT_ID)
    return encode_request(header, body)


def response_frame(version: int, corr: int, keys: list[PartitionKey], hw: int, session_id: int,
                   records: bytes = b"") -> bytes:
    """A Fetch response frame (no size prefix) listing ``keys`` at high watermark ``hw``, each with ``records``.
    The timed cases send none: the cost measured is the per-partition work, which does not depend on record bytes
    (they are never copied); ``--opcodes --case fetch_all`` sends batches, which size limits and throttles walk."""
    topics: list[FetchTopic] = []
    for topic, index in keys:
        if not topics or (topics[-1].topic or topics[-1].topic_id) != topic:
            topics.append(FetchTopic(topic_id=topic) if isinstance(topic, bytes) else FetchTopic(topic=topic))
        topics[-1].partitions.append(FetchPartition(index, 0, hw, hw, 0, None, -1, records, None))
    buffers, _ = FetchResponseView(version, 0, 0, session_id, topics).encode_frame(corr)
    return b"".join(bytes(b) for b in buffers)[4:]


def overrides(case: str) -> dict[str, object]:
    if case == "size_limit":
        return {"size_limit.budgets": [{"client_id": CLIENT_ID, "fetch_max_bytes": 1 << 20}]}
    if case.startswith("terminate"):
        return {"sessions.mode": "terminate"}
    return {}


def chain(case: str) -> tuple[Any, Any, Any]:
    """The chain a proxy configured for ``case`` builds (proxy/policies/__init__.py), one connection of it, and
    its metrics."""
    from proxy.accesslog import AccessLog
    from proxy.core.chain import Chain
    from proxy.core.exchange import ConnectionInfo
    from proxy.core.policy import Services
    from proxy.core.routing import Router
    from proxy.core.topic_names import TopicNames
    from proxy.metrics import Metrics
    from proxy.policies import build

    settings = load_settings(None, env={}).with_overrides(overrides(case))
    metrics = Metrics()
    names = TopicNames(time.monotonic)
    services = Services(metrics, time.monotonic, Router("127.0.0.1", 0, open_listener=lambda node: 0), names)
    pipeline = Chain(build(settings, services), metrics, names, AccessLog("off"))
    return pipeline, pipeline.connect(ConnectionInfo(1, "bootstrap")), metrics


def _fetch(pl: Any, conn: Any, frame: bytes, upstream: bytes) -> bytes:
    """One fetch through the chain as the connection core drives it; the reply when the response was opened."""
    ex = pl.classify(frame, 0.0)
    pl.on_request(conn, ex)
    if not ex.collect:
        return b""
    pl.on_response(conn, ex, upstream)
    assert ex.reply is not None
    return b"".join(bytes(b) for b in ex.reply)


def engine(case: str, log: io.StringIO | None = None) -> Fetch:
    """One connection's per-request logic for ``case``: this tree's chain, or the pipeline of revisions before it
    (``--compare`` runs this file against those too); a ``_logged`` case writes its access log to ``log``."""
    try:
        importlib.import_module("proxy.core.chain")
    except ImportError:
        return _pipeline_engine(case)
    if case.endswith("_logged"):
        return _core_engine(overrides(case), log=log if log is not None else io.StringIO())
    pl, conn, _ = chain(case)
    return lambda frame, upstream: _fetch(pl, conn, frame, upstream)


def _pipeline_engine(case: str) -> Fetch:  # pragma: no cover - runs only against old revisions
    pipeline = importlib.import_module("proxy.pipeline")
    router = importlib.import_module("proxy.routing").Router("127.0.0.1", 0, open_listener=lambda node: 0)
    settings = load_settings(None, env={}).with_overrides(overrides(case))
    if case == "size_limit":
        size_limit = _module("proxy.policies.size_limit.policy", "proxy.policies.size_limit")
        limits = size_limit.SizeLimits.from_settings(settings.size_limit)
        pl = pipeline.Pipeline(router, limits)
    elif case.startswith("terminate"):
        modes = _module("proxy.policies.terminate.policy", "proxy.policies.terminate").SessionModes("terminate")
        pl = pipeline.Pipeline(router, session_modes=modes)
    else:
        pl = pipeline.Pipeline(router)
    conn = pipeline.ConnectionState()

    def fetch(frame: bytes, upstream: bytes) -> bytes:
        req = pl.on_request(frame, conn)
        if not req.collect:
            return b""
        out = pl.on_response(req, upstream)
        return b"".join(bytes(b) for b in out.buffers)

    return fetch


def check(case: str, version: int, request: bytes, upstream: bytes, reply: bytes) -> str | None:
    """What is wrong with the client's ``reply`` to ``request`` (None when nothing is): ``relay`` relays the
    response unopened; ``produce`` hands the client the broker's bytes; the other cases answer with the
    request's correlation id, no error, every partition of the upstream response at its high watermark (nothing
    lost), only partitions the request asked for, and for a session-less client every one of them (KIP-227: a
    full response); ``fetch_all`` (``--opcodes``) also every partition's batches as the broker sent them."""
    if case == "relay":
        return None if reply == b"" else "the response was opened"
    if case == "produce":  # the broker's answer, as it sent it (size prefix included)
        return None if reply == len(upstream).to_bytes(4, "big") + upstream else "the reply differs from the broker's"
    if not reply:
        return "the response was relayed unopened"
    corr, _, view = decode_frame(reply[4:], version)
    request_view = decode_fetch_request(request)
    asked = set(request_view.partitions())
    if corr != request_view.correlation_id:
        return f"correlation id {corr}"
    if view.error_code:
        return f"error {view.error_code}"
    got = _high_watermarks(view, version)
    upstream_view = decode_frame(upstream, version)[2]
    news = _high_watermarks(upstream_view, version)
    if any(got.get(key) != hw for key, hw in news.items()):
        return "a partition's news is missing"
    if not set(got) <= asked:
        return "a partition the request did not ask for"
    if case in ("terminate_sessionless", "terminate_logged") and set(got) != asked:
        return f"{len(got)} of {len(asked)} partitions in a session-less client's response"
    if case == "fetch_all" and _records_of(view, version) != _records_of(upstream_view, version):
        return "the records differ from the broker's"
    return None


def check_line(version: int, reply: bytes, line: str) -> str | None:
    """What is wrong with the access-log ``line`` of a Fetch's ``reply`` (None when nothing is): it lists every
    partition of the reply, in its order, by the topic's name, with the record bytes the reply carries."""
    view = decode_frame(reply[4:], version)[2]
    listed = [(item["topic"], item["partition"], item["bytes"]) for item in json.loads(line).get("partitions", ())]
    sent = [("bench", p.partition_index, p.records_size) for t in view.topics for p in t.partitions]
    return None if listed == sent else "the access log's line differs from the reply"


def _records_of(view: FetchResponseView, version: int) -> dict[PartitionKey, bytes]:
    """Each partition a response lists, keyed as :func:`_high_watermarks` keys them, and its record bytes."""
    return {(t.topic_id if version >= 13 else t.topic, p.partition_index): bytes(p.records or b"")
            for t in view.topics for p in t.partitions}


def _high_watermarks(view: FetchResponseView, version: int) -> dict[PartitionKey, int]:
    """Each partition a response lists, keyed as requests key it (topic ids from v13), and its high watermark."""
    return {(t.topic_id if version >= 13 else t.topic, p.partition_index): p.high_watermark
            for t in view.topics for p in t.partitions}


def one_record_batch() -> bytes:
    """A record batch of one 100-byte record."""
    from proxy.wire.records import Record, encode_batch, new_batch

    return bytes(encode_batch(new_batch([Record(key=b"k", value=b"v" * 100)])))


def _produce_frames(corr: int) -> tuple[bytes, bytes]:
    """A Produce v10 request (acks=1, one 100-byte record) and the broker's answer to it, no size prefixes."""
    from proxy.wire.messages import response_codec
    from rig.core_rig import request, response

    records = one_record_batch()
    body = request_codec(0, 10).default().replace(acks=1, timeout_ms=30000, topic_data=[
        Message(name="bench", partition_data=[Message(index=0, records=records)])])
    answer = response_codec(0, 10).default().replace(responses=[Message(name="bench", partition_responses=[
        Message(index=0, error_code=0, base_offset=corr, log_append_time_ms=-1, log_start_offset=0,
                record_errors=[], error_message=None)])])
    return request(0, 10, corr, body, client_id=CLIENT_ID), response(0, 10, corr, answer)


def _core_engine(overrides: dict[str, Any] | None = None, tick_s: float = 0.0, log: io.StringIO | None = None
                 ) -> Fetch:
    """A connection of the core (proxy/core/connection.py) on a port that keeps what it is handed: a request and
    its response go through as the server's reads would hand them over; the client's bytes come back. The fake
    clock moves ``tick_s`` on after each round trip. The access log: written to ``log``, else off."""
    from proxy.accesslog import AccessLog
    from rig.core_rig import CoreRig

    rig = CoreRig(overrides)
    rig.access_log = AccessLog(log if log is not None else "off")  # off: `sluice run`'s default
    rig.proxy.chain.access_log = rig.access_log  # the chain's too: it lists a Fetch's partitions only for a log on
    # the topic's name known (as from a Metadata response): a logged Fetch v13+ waits for its ids' names otherwise
    rig.names.learn(TOPIC_ID, "bench")
    conn, port = rig.connect()

    def round_trip(frame: bytes, upstream: bytes) -> bytes:
        conn.client_data(len(frame).to_bytes(4, "big") + frame)
        conn.upstream_data(len(upstream).to_bytes(4, "big") + upstream)
        port.upstream.clear()
        rig.advance(tick_s)
        return port.take_client()

    return round_trip


#: ``--case fetch_all``: partitions, batches in each partition's answer, record bytes per batch
FETCH_ALL_SHAPE = (3, 20, 16 * 1024)


def _fetch_all_frames(version: int, count: int) -> list[tuple[bytes, bytes]]:
    """``count`` Fetch round trips of a session-less client under every policy: each request asks for the 3
    partitions from where the last answer ended; each answer carries 20 batches of 16 KiB per partition. The
    upstream answers name session 77, the session Sluice opens upstream (terminate mode)."""
    from proxy.wire.records import Record, encode_batch, new_batch

    partitions, batches, size = FETCH_ALL_SHAPE
    topic: str | bytes = TOPIC_ID if version >= 13 else "bench"
    keys: list[PartitionKey] = [(topic, i) for i in range(partitions)]
    frames = []
    for i in range(count):
        base = i * batches * 16
        records = b"".join(encode_batch(new_batch([Record(value=b"v" * (size // 16 - 10)) for _ in range(16)],
                                                  base_offset=base + b * 16)) for b in range(batches))
        frames.append((request_frame(version, i + 1, dict.fromkeys(keys, base), LEGACY),
                       response_frame(version, i + 1, keys, base + batches * 16, 77, records)))
    return frames


@dataclass
class Run:
    """One case's fetches, built and ready (:func:`prepare`): :meth:`step` times the next ones, each alone;
    :meth:`wrong` checks every reply after the timing."""

    case: str
    version: int
    fetch: Fetch
    frames: list[tuple[bytes, bytes]]
    log: io.StringIO | None = None
    replies: list[bytes] = field(default_factory=list)
    times: list[float] = field(default_factory=list)  # seconds, per fetch made

    def step(self, count: int = 1) -> list[float]:
        """The next ``count`` fetches (fewer when the frames run out), each timed alone: their ms."""
        done = len(self.replies)
        for frame, upstream in self.frames[done:done + count]:
            t0 = time.perf_counter()
            self.replies.append(self.fetch(frame, upstream))
            self.times.append(time.perf_counter() - t0)
        return [t * 1000 for t in self.times[done:]]

    def wrong(self) -> list[str]:
        """What :func:`check` finds wrong with each reply that is, and :func:`check_line` with each access-log line
        (the last ones of ``log``, when given) that is."""
        made = self.frames[:len(self.replies)]
        wrong = [w for (frame, upstream), reply in zip(made, self.replies, strict=True)
                 if (w := check(self.case, self.version, frame, upstream, reply)) is not None]
        if self.log is not None and self.replies:
            lines = self.log.getvalue().splitlines()[-len(self.replies):]
            wrong += [w for reply, line in zip(self.replies, lines, strict=True)
                      if (w := check_line(self.version, reply, line)) is not None]
        return wrong


def prepare(case: str, partitions: int, version: int, fetches: int) -> Run:
    """``case``'s engine after one warm-up fetch (session creation), and ``fetches`` more frames, every one built
    before the first is timed, so building them (much allocation, cold caches) never lands in a timed fetch."""
    if case == "produce":
        fetch = _core_engine()
        fetch(*_produce_frames(0))
        return Run(case, version, fetch, [_produce_frames(i + 1) for i in range(fetches)])
    topic: str | bytes = TOPIC_ID if version >= 13 else "bench"
    keys: list[PartitionKey] = [(topic, i) for i in range(partitions)]
    busy = keys[:BUSY]
    log = io.StringIO() if case.endswith("_logged") else None
    records = one_record_batch() if log is not None else b""  # bytes on the busy partitions, for the line to list
    fetch = engine(case, log)
    session_client = case == "terminate_session"
    first = request_frame(version, 1, dict.fromkeys(keys, 0), FetchMetadata(0, 0) if session_client else LEGACY)
    reply = fetch(first, response_frame(version, 1, keys, 0, 77))
    sid = decode_frame(reply[4:], version)[2].session_id if reply else 0
    frames: list[tuple[bytes, bytes]] = []
    for i in range(fetches):
        hw = i + 1
        if session_client:  # only the busy partitions advance: the client sends just those
            frames.append((request_frame(version, i + 2, dict.fromkeys(busy, hw - 1), FetchMetadata(sid, i + 1)),
                           response_frame(version, i + 2, busy, hw, 77)))
        else:
            # librdkafka starts each fetch one partition further on (its fairness rotation)
            turn = (i + 1) % len(keys)
            offsets = dict.fromkeys(keys[turn:] + keys[:turn], 0) | dict.fromkeys(busy, hw - 1)
            terminate = case.startswith("terminate")
            frames.append((request_frame(version, i + 2, offsets, LEGACY),
                           response_frame(version, i + 2, busy if terminate else keys, hw, 77 if terminate else 0,
                                          records)))
    return Run(case, version, fetch, frames, log)


def run_case(case: str, partitions: int, version: int, fetches: int) -> tuple[float, int]:
    """Median ms per fetch (request + response side) of ``case`` (:func:`prepare`), and how many replies were
    wrong."""
    run = prepare(case, partitions, version, fetches)
    ms = statistics.median(run.step(fetches))
    if wrong := run.wrong():
        print(json.dumps({"bench": "pipeline_cpu", "case": case, "error": wrong[0], "wrong": len(wrong)}),
              flush=True)
    return ms, len(wrong)


def serve() -> None:
    """The side of a ``--compare`` this process's code is: JSON commands on stdin, one answer line each on stdout.
    ``{"case", "partitions", "version", "fetches"}`` prepares a run (``{"ready": true}``), ``{"step": n}`` makes its
    next n fetches (``{"ms": [...]}``), ``{"wrong": true}`` checks them (``{"wrong": n, "errors": [...]}``);
    ``{"opcodes": case, "version"}`` answers :func:`count_opcodes`. A command out of turn ends the process (its
    caller sees it end)."""
    run: Run | None = None
    for line in sys.stdin:
        command = json.loads(line)
        if "case" in command:
            run = prepare(command["case"], command["partitions"], command["version"], command["fetches"])
            answer: dict[str, Any] = {"ready": True}
        elif "opcodes" in command:
            answer = count_opcodes(command["opcodes"], command["version"])
        elif run is None:
            raise SystemExit(f"--serve: {command} before a case was prepared")
        elif "step" in command:
            answer = {"ms": run.step(command["step"])}
        else:
            wrong = run.wrong()
            answer = {"wrong": len(wrong), "errors": wrong[:1]}
        print(json.dumps(answer), flush=True)


def count_opcodes(case: str = "produce", version: int = 12, top: int = 15) -> dict[str, Any]:
    """One ``produce`` (or ``fetch_all``) round trip through the core, traced bytecode by bytecode (sys.settrace
    with ``f_trace_opcodes``): what Sluice's own code executes, the harness's frames left out."""
    if case == "fetch_all":
        from bench.passthrough import ALL_POLICIES

        fetch = _core_engine(tomllib.loads(ALL_POLICIES), tick_s=0.05)
        frames = _fetch_all_frames(version, 42)
    else:
        fetch = _core_engine()
        frames = [_produce_frames(i) for i in range(42)]
    for frame, upstream in frames[:40]:  # warm: caches filled, lazily built state built
        fetch(frame, upstream)
    harness = (str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parent.parent / "rig"))
    opcodes: dict[str, int] = {}
    calls: dict[str, int] = {}
    #: the count when each write was handed to the port: what ran before it is on the client's wait (uvloop 0.23
    #: sends in writelines() itself when nothing is queued), what runs after overlaps the other side's work
    at_writes: list[int] = []

    def tracer(frame: Any, event: str, arg: Any) -> Any:
        code = frame.f_code
        if code.co_filename.startswith(harness):
            if event == "call" and code.co_name in ("send_client", "send_upstream"):
                at_writes.append(sum(opcodes.values()))
            return None  # not Sluice's: neither counted nor traced line by line
        where = f"{Path(code.co_filename).name}:{code.co_name}"
        if event == "call":
            frame.f_trace_opcodes = True
            frame.f_trace_lines = False
            calls[where] = calls.get(where, 0) + 1
        elif event == "opcode":
            opcodes[where] = opcodes.get(where, 0) + 1
        return tracer

    frame, upstream = frames[41]
    sys.settrace(tracer)
    try:
        reply = fetch(frame, upstream)
    finally:
        sys.settrace(None)
    wrong = check(case, version if case == "fetch_all" else 10, frame, upstream, reply)
    ranked = sorted(opcodes, key=lambda k: -opcodes[k])[:top]
    before_request, before_response = at_writes[0], at_writes[1] - at_writes[0]
    return {"bench": "pipeline_opcodes", "case": case, "opcodes": sum(opcodes.values()),
            "calls": sum(calls.values()), "before_request_write": before_request,
            "before_response_write": before_response,
            "top": [[opcodes[k], calls.get(k, 0), k] for k in ranked], "wrong": 0 if wrong is None else 1}


@contextlib.contextmanager
def revision_tree(rev: str) -> Iterator[Path]:
    """REV's code (its ``proxy``, ``rig`` and ``bench`` packages, bench/support/revision.py) in a temporary
    directory, with this file and its verdict in it (the same harness for both sides, with the summaries this one
    carries)."""
    from bench.support.revision import extract_revision  # the coordinator's only: a --serve side may lack it

    here = Path(__file__).resolve().parent
    with tempfile.TemporaryDirectory(prefix="pipeline-cpu-") as tmp:
        tree = Path(tmp)
        extract_revision(rev, tree, ("proxy", "rig", "bench"))
        shutil.copy(here / "pipeline_cpu.py", tree / "bench" / "pipeline_cpu.py")
        (tree / "bench" / "support").mkdir(exist_ok=True)
        (tree / "bench" / "support" / "__init__.py").touch()
        shutil.copy(here / "support" / "verdict.py", tree / "bench" / "support" / "verdict.py")
        yield tree


def compare_opcodes(rev: str, case: str, version: int) -> dict[str, dict[str, float]]:
    """``--opcodes`` on each side once ("before": ``rev``'s code, "after": this tree's), each in a ``--serve``
    process (:class:`Side`): a count is the same in every run. Each side's line is printed."""
    from bench.support.revision import REPO
    sides: dict[str, dict[str, float]] = {}
    with revision_tree(rev) as tree:
        for name in ("before", "after"):
            side = Side(tree if name == "before" else REPO, 0)
            try:
                line = side.ask(opcodes=case, version=version)
            finally:
                side.close()
            print(json.dumps({**line, "side": name}), flush=True)
            sides[name] = {key: line[key] for key in (*OPCODE_KEYS, "wrong")}
    return sides


class Side:
    """A ``--serve`` process of this file run against ``tree``'s code with hash seed ``seed`` (so two sides iterate
    their sets and dicts of strings alike), on ``cpu`` only when one is given."""

    def __init__(self, tree: Path, seed: int, cpu: int | None = None) -> None:
        env = {**os.environ, "PYTHONPATH": str(tree), "PYTHONHASHSEED": str(seed)}
        self._process = subprocess.Popen([sys.executable, "-m", "bench.pipeline_cpu", "--serve"], cwd=tree, env=env,
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        if cpu is not None:
            os.sched_setaffinity(self._process.pid, {cpu})  # before its first command: nothing is timed yet

    def ask(self, **command: Any) -> dict[str, Any]:
        assert self._process.stdin is not None and self._process.stdout is not None
        self._process.stdin.write(json.dumps(command) + "\n")
        self._process.stdin.flush()
        line = self._process.stdout.readline()
        if not line:
            raise RuntimeError(f"the --serve process ended (exit {self._process.wait()})")
        answer: dict[str, Any] = json.loads(line)
        return answer

    def close(self) -> None:
        assert self._process.stdin is not None
        self._process.stdin.close()
        self._process.wait(60)


def _pair(case: str, sides: dict[str, Side], round_: int, medians: dict[str, dict[str, list[float]]],
          partitions: int, version: int, fetches: int) -> int:
    """``case`` prepared on both sides, then its fetches made in turns (ABBA), each side's median added to
    ``medians`` and printed; how many replies were wrong."""
    times: dict[str, list[float]] = {"before": [], "after": []}
    for side in sides.values():
        side.ask(case=case, partitions=partitions, version=version, fetches=fetches)
    for i in range(fetches):
        # ABBA fetch by fetch: on a shared core the second of a pair finds more in the caches (the interpreter's
        # code is the same pages), so neither side may always go second on the same fetches
        for name in ("before", "after") if i % 4 in (0, 3) else ("after", "before"):
            times[name] += sides[name].ask(step=1)["ms"]
    wrong = 0
    for name, side in sides.items():
        checked = side.ask(wrong=True)
        wrong += checked["wrong"]
        ms = statistics.median(times[name])
        medians[name][case].append(ms)
        print(json.dumps({"bench": "pipeline_cpu", "case": case, "partitions": partitions, "version": version,
                          "ms_per_fetch": round(ms, 4), "side": name, "round": round_, "wrong": checked["wrong"],
                          **({"error": checked["errors"][0]} if checked["errors"] else {})}), flush=True)
    return wrong


def compare(rev: str, cases: tuple[str, ...], partitions: int, version: int, fetches: int,
            rounds: int) -> dict[str, Any]:
    """Each case's fetches on both sides ("before": ``rev``'s code, "after": this tree's) in turns of one fetch,
    ``rounds`` times over: each case in each round on two fresh ``--serve`` processes (:class:`Side`) with the
    round's hash seed, both on one CPU (this process on the others, when there are others), the case prepared on
    both, then its fetches made in turns (:func:`_pair`). The machine's speed moves by more than the 5 % gate
    within one run here (docs/PERFORMANCE.md: identical code read 0.69-1.22 when each side ran whole processes in
    turn), but a fetch and the other side's are milliseconds apart, on the same core. Per case: each side's median
    ms (of its rounds' medians), the ratio (after / before, the median of the rounds'), and the rounds' range."""
    from bench.support.revision import REPO
    cpus = sorted(os.sched_getaffinity(0))
    medians: dict[str, dict[str, list[float]]] = {side: {case: [] for case in cases} for side in ("before", "after")}
    wrong = 0
    os.sched_setaffinity(0, cpus[:-1] or cpus)
    try:
        with revision_tree(rev) as tree:
            for round_ in range(rounds):
                for case in cases:  # fresh processes: what a case leaves behind (a heap) is not the next's
                    sides = {"before": Side(tree, round_, cpus[-1]), "after": Side(REPO, round_, cpus[-1])}
                    try:
                        wrong += _pair(case, sides, round_, medians, partitions, version, fetches)
                    finally:
                        for side in sides.values():
                            side.close()
    finally:
        os.sched_setaffinity(0, cpus)
    ratios = {case: [a / b for a, b in zip(medians["after"][case], medians["before"][case], strict=True) if b]
              for case in cases}
    return {"before": {case: round(statistics.median(medians["before"][case]), 4) for case in cases},
            "after": {case: round(statistics.median(medians["after"][case]), 4) for case in cases},
            "ratio": {case: round(statistics.median(r), 3) if r else None for case, r in ratios.items()},
            "ratio_range": {case: [round(min(r), 3), round(max(r), 3)] if r else None for case, r in ratios.items()},
            "wrong": wrong}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--partitions", type=int, default=10_000)
    ap.add_argument("--version", type=int, default=12)
    ap.add_argument("--fetches", type=int, default=20)
    ap.add_argument("--compare", metavar="REV", help="run the same harness against REV's code too, then compare")
    ap.add_argument("--rounds", type=int, default=6, help="with --compare: rounds (each case, fresh processes)")
    ap.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)  # a side of --compare (serve())
    ap.add_argument("--cases", type=lambda v: tuple(v.split(",")), default=CASES,
                    help=f"comma-separated, of {','.join(CASES)} (default: all)")
    ap.add_argument("--opcodes", action="store_true", help="count a produce round trip's bytecodes instead")
    ap.add_argument("--case", choices=("produce", "fetch_all"), default="produce",
                    help="with --opcodes: the round trip counted (fetch_all: a Fetch, every policy on)")
    add_options(ap, "1,000 partitions, 5 fetches per case")
    args = ap.parse_args(argv)
    if args.serve:
        serve()
        return
    if unknown := set(args.cases) - set(CASES):
        ap.error(f"--cases: unknown {', '.join(sorted(unknown))}")
    if args.rounds < 1:
        ap.error("--rounds: at least 1")
    if args.smoke:
        args.partitions, args.fetches, args.rounds = 1000, 5, 1
    if args.opcodes and args.case == "fetch_all" and args.version >= 13:
        # topic ids: the throttle names topics, so Sluice would first look the names up with a Metadata request
        # of its own, which this harness's upstream does not answer
        ap.error("--case fetch_all counts Fetch versions below 13 (topic names)")
    if args.opcodes:
        if not args.compare:
            line = count_opcodes(args.case, args.version)
            print(json.dumps(line), flush=True)
            out = summary("pipeline_opcodes", {k: line[k] for k in ("case", *OPCODE_KEYS, "wrong")}, {},
                          errors=_wrong(line["wrong"]))
        else:
            sides = compare_opcodes(args.compare, args.case, args.version)
            before, after = sides["before"], sides["after"]
            wrong = int(before["wrong"] + after["wrong"])
            out = summary("pipeline_opcodes_compare", {
                "rev": args.compare, "case": args.case, "before": before, "after": after,
                "ratio": round(after["opcodes"] / before["opcodes"], 3), "wrong": wrong}, {}, errors=_wrong(wrong))
        emit(out)
        sys.exit(exit_status(out, args.check))
    if args.compare:
        got = compare(args.compare, args.cases, args.partitions, args.version, args.fetches, args.rounds)
        # no case more than 5% slower than before
        out = summary("pipeline_cpu_compare", {"rev": args.compare, "version": args.version, "rounds": args.rounds,
                                               **got}, {f"ratio.{case}": at_most(1.05) for case in args.cases},
                      errors=_wrong(got["wrong"]))
        emit(out)
        sys.exit(exit_status(out, args.check))
    figures: dict[str, object] = {"partitions": args.partitions}
    wrong = 0
    for case in args.cases:
        ms, bad = run_case(case, args.partitions, args.version, args.fetches)
        wrong += bad
        print(json.dumps({"bench": "pipeline_cpu", "case": case, "partitions": args.partitions,
                          "version": args.version, "ms_per_fetch": round(ms, 4), "wrong": bad}), flush=True)
        figures[case] = round(ms, 4)
    # a session-less client of 10,000 partitions costs at most 3 ms of proxy CPU per fetch in terminate mode, and
    # at most 5 with the access log on (each fetch's line lists every partition)
    goals = {case: goal for case, goal in (("terminate_sessionless", at_most(3.0)),
                                           ("terminate_logged", at_most(5.0))) if case in args.cases}
    out = summary("pipeline_cpu", {**figures, "wrong": wrong}, goals, errors=_wrong(wrong))
    emit(out)
    sys.exit(exit_status(out, args.check))


def _wrong(count: int) -> list[str]:
    return [f"{count} replies wrong (check())"] if count else []


if __name__ == "__main__":
    main()
