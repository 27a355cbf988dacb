"""Codec benchmark: decode and re-encode a Fetch response with 1,000 partitions of 1 KiB record batches.

``python -m bench.codec [--partitions N] [--versions 12,4,16] [--repeat R]``

Compared in one run, on the same bytes: the construct reference codec (proxy.wire.compiler.Codec), the fast
path (proxy.wire.fetch_fast), kafka-python 3's generated codec (kafka.protocol.consumer.fetch.FetchResponse)
and kio (entity_reader / entity_writer) when it is importable. Each figure is the best of R timed runs (the
best run is the one least disturbed by the machine; all runs do the same work). Prints JSON lines
``{"name", "version", "op", "us_per_partition", "mb_per_s"}`` and, last, the summary for the first version:
``{"summary": "codec", "fast_us_per_partition": ..., "speedup_vs_kafka_python": ..., "lazy_fast_us_per_partition":
..., "reencoded_equal": ..., "same_as_kafka_python": ...}``. The headline compares like with like: kafka-python's
decode hands out every partition's fields and its records as bytes, so the fast path's figure
(``fast-materialised``) reads every field and copies the records out of the frame too; ``fast`` alone is lazy
(fields read on access, records left as slices of the frame: what Sluice's relay does, not what a decoder
returns) and is reported beside it. The checks: the fast path re-encodes every version's body byte for byte
(``reencoded_equal``) and hands out what kafka-python decodes (``same_as_kafka_python``); the exit status is 1
unless both hold.

``python -m bench.codec --fetch-request [--partitions 10000] [--versions 16]`` measures the Fetch *request*
fast path instead (proxy.wire.fetch_request_fast, used by the fetch-session policies) against the construct
path it replaces: ``{"bench": "fetch_request", "partitions", "version", "decode_us_per_partition"
(decode + partitions()), "encode_us_per_partition", "construct_us_per_partition" (decode_request +
request_partitions), "construct_encode_us_per_partition" (apply_plan + encode_request, v7+)}``.
"""

from __future__ import annotations

import argparse
import functools
import io
import json
import sys
import time
from collections.abc import Callable
from typing import Any

from proxy.policies.terminate import sessions
from proxy.wire.fetch_fast import FetchResponseView
from proxy.wire.fetch_layout import FIRST_SESSION
from proxy.wire.fetch_request_fast import decode_fetch_request, encode_fetch_request
from proxy.wire.fetch_stream import FetchStreamer
from proxy.wire.messages import decode_request, encode_request, request_codec, response_codec
from proxy.wire.model import Message
from proxy.wire.records import Record, encode_batch, iter_batches, new_batch
from rig.fetch_oracle import apply_plan, request_partitions

RECORD_SIZE = 1024


def build_response(version: int, partitions: int, topics: int = 10) -> bytes:
    """A realistic response body: ``topics`` topics, ``partitions`` partitions in all, each holding one real
    v2 record batch with a 1 KiB value (so ~1.1 KiB of record bytes per partition)."""
    per_topic = max(1, partitions // topics)
    responses = []
    n = 0
    for t in range(topics):
        parts = []
        for p in range(per_topic if t < topics - 1 else partitions - n):
            value = bytes((p + i) % 251 for i in range(RECORD_SIZE))
            batch = new_batch([Record(0, 0, b"key-%d" % p, value, [])], base_offset=1000 + p,
                              base_timestamp=1_700_000_000_000)
            parts.append(Message(
                partition_index=p, error_code=0, high_watermark=2000 + p, last_stable_offset=2000 + p,
                log_start_offset=0, aborted_transactions=None, preferred_read_replica=-1,
                records=encode_batch(batch),
            ))
            n += 1
        topic: dict[str, Any] = {"topic_id": bytes([t + 1]) * 16} if version >= 13 else {"topic": f"t-{t}"}
        responses.append(Message(**topic, partitions=parts))
    msg = Message(throttle_time_ms=0, error_code=0, session_id=12345, responses=responses)
    return response_codec(1, version).encode(msg)


def best_of(fn: Callable[[], Any], repeat: int, budget_s: float) -> float:
    """The best wall time of ``repeat`` calls, stopping early when ``budget_s`` is spent."""
    best = float("inf")
    spent = 0.0
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        dt = time.perf_counter() - t0
        best = min(best, dt)
        spent += dt
        if spent > budget_s:
            break
    return best


def walked(view: FetchResponseView) -> FetchResponseView:
    for _, p in view.partitions():
        if p.records is not None:
            for _batch in iter_batches(p.records):
                pass
    return view


def materialised(view: FetchResponseView) -> list[tuple[Any, ...]]:
    """What a decoder hands out, from the fast view: every partition's fields read, its records copied out of the
    frame as bytes (the view's records are slices of it)."""
    return [(p.partition_index, p.error_code, p.high_watermark, p.last_stable_offset, p.log_start_offset,
             p.preferred_read_replica, None if p.records is None else bytes(p.records))
            for _, p in view.partitions()]


def same_as_kafka_python(version: int, body: bytes) -> bool:
    """The fast path's materialised partitions equal kafka-python's decode of the same body (the comparison is
    like for like only if both hand out the same)."""
    from kafka.protocol.consumer.fetch import FetchResponse

    theirs = [(p.partition_index, p.error_code, p.high_watermark, p.last_stable_offset, p.log_start_offset,
               p.preferred_read_replica, p.records)
              for t in FetchResponse.decode(body, version=version).responses for p in t.partitions]
    return materialised(FetchResponseView.decode(memoryview(body), version)) == theirs


def contenders(version: int, body: bytes) -> dict[str, tuple[Callable[[], Any], Callable[[Any], Any]]]:
    """name -> (decode(), encode(decoded)) closures over the same body."""
    codec = response_codec(1, version)
    view = memoryview(body)
    out: dict[str, tuple[Callable[[], Any], Callable[[Any], Any]]] = {
        "construct": (lambda: codec.decode(body), codec.encode),
        "fast": (lambda: FetchResponseView.decode(view, version), lambda v: v.encode()),
        # like for like with a decoder's output: every field read, the records copied out as bytes
        "fast-materialised": (lambda: (lambda v: (v, materialised(v)))(FetchResponseView.decode(view, version)),
                              lambda d: d[0].encode()),
        # what a byte-budget policy adds: walking every partition's record batches by header
        "fast+batch-walk": (lambda: walked(FetchResponseView.decode(view, version)), lambda v: v.encode()),
    }
    if version >= 16:
        # The transparent relay's Fetch v16+ path: walk the response in 64 KiB chunks as it streams through,
        # forwarding slices (proxy/wire/fetch_stream.py). "decode" is the whole relay; nothing to encode.
        framed = b"\x00" + body  # an empty response-header tag section precedes the body on the wire

        def relay() -> list[Any]:
            s = FetchStreamer(version, len(framed), lambda _nodes: None)
            return [s.feed(view_f[i : i + 65536]) for i in range(0, len(framed), 65536)]

        view_f = memoryview(framed)
        out["stream-relay"] = (relay, lambda _out: None)
    try:
        from kafka.protocol.consumer.fetch import FetchResponse

        out["kafka-python"] = (lambda: FetchResponse.decode(body, version=version),
                               lambda r: r.encode())
    except ImportError:  # pragma: no cover - a dependency of Sluice itself
        pass
    try:
        import importlib

        from kio.serial import entity_reader, entity_writer

        kio_type = importlib.import_module(f"kio.schema.fetch.v{version}.response").FetchResponse
        read = entity_reader(kio_type)
        write = entity_writer(kio_type)

        def kio_encode(obj: Any) -> bytes:
            buf = io.BytesIO()
            write(buf, obj)
            return buf.getvalue()

        out["kio"] = (lambda: read(body, 0)[0], kio_encode)
    except ImportError:  # kio is a dev-only dependency
        pass
    return out


def check_fast(version: int, body: bytes) -> None:
    """The fast path must reproduce the body exactly (a benchmark of a wrong codec is worthless)."""
    view = FetchResponseView.decode(memoryview(body), version)
    if b"".join(view.encode()[0]) != body:
        raise SystemExit(f"fast path re-encode differs from the input for v{version}")


def run(versions: list[int], partitions: int, repeat: int) -> list[dict[str, Any]]:
    lines: list[dict[str, Any]] = []
    for version in versions:
        body = build_response(version, partitions)
        check_fast(version, body)
        mb = len(body) / 1e6
        for name, (dec, enc) in contenders(version, body).items():
            # Slow codecs get fewer runs: each has ~4 s per op at most.
            decoded = dec()
            t_dec = best_of(dec, repeat, 4.0)
            t_enc = best_of(functools.partial(enc, decoded), repeat, 4.0)
            for op, t in (("decode", t_dec), ("encode", t_enc), ("decode+encode", t_dec + t_enc)):
                line = {"name": name, "version": version, "op": op,
                        "us_per_partition": round(t / partitions * 1e6, 3), "mb_per_s": round(mb / t, 1)}
                lines.append(line)
                print(json.dumps(line), flush=True)
    return lines


def build_request(version: int, partitions: int, topics: int = 10) -> tuple[Message, Message, bytes]:
    """A consumer's full Fetch request: ``topics`` topics, ``partitions`` partitions in all; (header, body,
    frame)."""
    per_topic = max(1, partitions // topics)
    entries = []
    n = 0
    for t in range(topics):
        count = per_topic if t < topics - 1 else partitions - n
        parts = [Message(partition=p, current_leader_epoch=5, fetch_offset=1000 + p, last_fetched_epoch=4,
                         log_start_offset=-1, partition_max_bytes=1048576) for p in range(count)]
        n += count
        topic: dict[str, Any] = {"topic_id": bytes([t + 1]) * 16} if version >= 13 else {"topic": f"t-{t}"}
        entries.append(Message(**topic, partitions=parts))
    body = request_codec(1, version).default().replace(topics=entries)
    header = Message(request_api_key=1, request_api_version=version, correlation_id=7, client_id="bench")
    return header, body, encode_request(header, body)


def run_request(version: int, partitions: int, repeat: int) -> dict[str, Any]:
    header, body, frame = build_request(version, partitions)
    view = decode_fetch_request(frame)
    wanted, forgotten = view.partitions(), view.forgotten()
    if encode_fetch_request(view, view.session_id, view.session_epoch, wanted, forgotten) != frame:
        raise SystemExit(f"fetch request fast path re-encode differs from the input for v{version}")
    t_dec = best_of(lambda: decode_fetch_request(frame).partitions(), repeat, 4.0)
    t_enc = best_of(lambda: encode_fetch_request(view, 1, 1, wanted, forgotten), repeat, 4.0)
    t_con = best_of(lambda: request_partitions(decode_request(frame)[1], version), repeat, 4.0)
    t_con_enc = None
    if version >= FIRST_SESSION:
        plan = sessions.UpstreamPlan(sessions.FetchMetadata(1, 1), request_partitions(body, version), [], {})
        t_con_enc = best_of(lambda: encode_request(header, apply_plan(body, version, plan)), repeat, 4.0)

    def us(t: float | None) -> float | None:
        return None if t is None else round(t / partitions * 1e6, 3)

    line = {"bench": "fetch_request", "partitions": partitions, "version": version,
            "decode_us_per_partition": us(t_dec), "encode_us_per_partition": us(t_enc),
            "construct_us_per_partition": us(t_con), "construct_encode_us_per_partition": us(t_con_enc)}
    print(json.dumps(line), flush=True)
    return line


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--partitions", type=int, default=1000)
    ap.add_argument("--versions", default="12,4,16",
                    help="comma-separated Fetch versions; the first is summarised")
    ap.add_argument("--repeat", type=int, default=30)
    ap.add_argument("--fetch-request", action="store_true",
                    help="benchmark the Fetch request fast path (default 10,000 partitions, v16)")
    args = ap.parse_args(argv)
    if args.fetch_request:
        versions = [int(v) for v in (args.versions if args.versions != "12,4,16" else "16").split(",")]
        for version in versions:
            run_request(version, args.partitions if args.partitions != 1000 else 10000, args.repeat)
        return 0
    versions = [int(v) for v in args.versions.split(",")]
    lines = run(versions, args.partitions, args.repeat)
    first = versions[0]

    def figure(name: str) -> float | None:
        for line in lines:
            if line["name"] == name and line["version"] == first and line["op"] == "decode+encode":
                return float(line["us_per_partition"])
        return None

    fast = figure("fast-materialised")
    kp = figure("kafka-python")
    same = all(same_as_kafka_python(v, build_response(v, args.partitions)) for v in versions)
    print(json.dumps({
        "summary": "codec",
        "version": first,
        "fast_us_per_partition": fast,
        "speedup_vs_kafka_python": round(kp / fast, 2) if fast and kp else None,
        "lazy_fast_us_per_partition": figure("fast"),
        "reencoded_equal": True,  # run() stops (exit status 1) at the first body the fast path changes
        "same_as_kafka_python": same,
    }))
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
