"""Codec benchmark: decode and re-encode a Fetch response with 1,000 partitions of 1 KiB record batches.

``python -m bench.codec [--partitions N] [--versions 12,4,16] [--repeat R] [--record-size BYTES]``

Compared in one run, on the same bytes: the construct reference codec (proxy.wire.compiler.Codec), the fast
path (proxy.wire.fetch_fast), kafka-python 3's generated codec (kafka.protocol.consumer.fetch.FetchResponse)
and kio (entity_reader / entity_writer) when it is importable. Each figure is the best of R timed runs (the
best run is the one least disturbed by the machine; all runs do the same work). Prints JSON lines
``{"name", "version", "op", "us_per_partition", "mb_per_s"}`` and, last, the summary for the first version:
``{"summary": "codec", "fast_us_per_partition": ..., "speedup_vs_kafka_python": ..., "lazy_fast_us_per_partition":
..., "reencoded_equal": ..., "same_as_kafka_python": ..., "load": ...}``. The headline compares like with like:
kafka-python's decode hands out every partition's fields and its records as bytes of their own, so the fast
path's figure (``fast-materialised``) is its decoder's form of the same result, ``decode(body, v,
copy_records=True)``: every field decoded, every record set copied out of the frame into its own ``bytes``,
nothing referring to the input. ``fast`` alone is lazy (records left as memoryview slices of the frame: what
Sluice's relay does, not what a decoder hands over) and is reported beside it, as is ``fast+copy-pass`` (the
lazy decode, then a pass that reads every field and copies each record set: the headline's definition before
``copy_records`` existed). The checks: the fast path re-encodes every version's body byte for byte
(``reencoded_equal``) and its like-for-like decode hands out what kafka-python decodes, records as ``bytes``
(``same_as_kafka_python``); the exit status is 1 unless both hold. Goal (``met``, bench/support/verdict.py):
``fast_us_per_partition`` <= 0.4; with ``--check`` a missed goal exits 1 too. ``--smoke``: 100 partitions, versions
12 and 16, 3 runs each.

``python -m bench.codec --compare REV [--versions 12,4,16] [--rounds 1]`` measures the fast path of another revision
against this checkout's, in one run: each side in its own process (REV's ``proxy`` and ``rig`` exported with
``git archive`` into a temporary directory; this checkout's as it is, uncommitted changes included), in the
order REV, this, this, REV (ABBA) per round, each reporting the best of R runs of the like-for-like decode
(``copy_records`` where the revision has it, else the decode followed by the copy pass, that revision's
like-for-like), the lazy decode and the encode, with the load average when it ran. The summary carries the
ratios this/REV (below 1 is faster) and the like-for-like check of this side.

``python -m bench.codec --fetch-request [--partitions 10000] [--versions 16]`` measures the Fetch *request*
fast path instead (proxy.wire.fetch_request_fast, used by the fetch-session policies) against the construct
path it replaces: ``{"bench": "fetch_request", "partitions", "version", "decode_us_per_partition"
(decode + partitions()), "encode_us_per_partition", "construct_us_per_partition" (decode_request +
request_partitions), "construct_encode_us_per_partition" (apply_plan + encode_request, v7+)}``, then
``{"summary": "codec_fetch_request", ...}``, whose check is that the fast path re-encodes every request byte for byte.
"""

from __future__ import annotations

import argparse
import functools
import inspect
import io
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.support.verdict import add_options, at_most, emit, exit_status, summary
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
#: like for like, per partition, v12 (docs/PERFORMANCE.md)
GOALS = {"fast_us_per_partition": at_most(0.4)}


def build_response(version: int, partitions: int, topics: int = 10, record_size: int = RECORD_SIZE) -> bytes:
    """A realistic response body: ``topics`` topics, ``partitions`` partitions in all, each holding one real
    v2 record batch with a 1 KiB value (so ~1.1 KiB of record bytes per partition)."""
    per_topic = max(1, partitions // topics)
    responses = []
    n = 0
    for t in range(topics):
        parts = []
        for p in range(per_topic if t < topics - 1 else partitions - n):
            value = bytes((p + i) % 251 for i in range(record_size))
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
    """The copy pass over a lazy view: every partition's fields read, its records copied out of the frame as
    bytes (the lazy view's records are slices of it). ``fast+copy-pass``; the like-for-like path before
    ``copy_records``."""
    return [(p.partition_index, p.error_code, p.high_watermark, p.last_stable_offset, p.log_start_offset,
             p.preferred_read_replica, None if p.records is None else bytes(p.records))
            for _, p in view.partitions()]


def rows(view: FetchResponseView) -> list[tuple[Any, ...]]:
    """A decoded view's partitions as kafka-python's decode hands them out, as they are (nothing copied)."""
    return [(p.partition_index, p.error_code, p.high_watermark, p.last_stable_offset, p.log_start_offset,
             p.preferred_read_replica, p.records)
            for _, p in view.partitions()]


def has_copy_records() -> bool:
    """Whether this checkout's fast path has the decoder's form (``copy_records``; --compare may run older
    revisions)."""
    return "copy_records" in inspect.signature(FetchResponseView.decode).parameters


def like_for_like(version: int, body: bytes) -> Callable[[], Any]:
    """The fast path's decode of ``body`` into what kafka-python's decode hands out: ``copy_records`` where the
    checkout has it, else the lazy decode and the copy pass. Returns a decode() closure whose result has the
    view first."""
    if has_copy_records():
        return lambda: (FetchResponseView.decode(body, version, copy_records=True),)
    view = memoryview(body)
    return lambda: (lambda v: (v, materialised(v)))(FetchResponseView.decode(view, version))


def same_as_kafka_python(version: int, body: bytes) -> bool:
    """The fast path's like-for-like decode hands out what kafka-python's decode of the same body does: every
    partition's fields equal, its records ``bytes`` of their own (the comparison is like for like only if both
    hand out the same)."""
    from kafka.protocol.consumer.fetch import FetchResponse

    theirs = [(p.partition_index, p.error_code, p.high_watermark, p.last_stable_offset, p.log_start_offset,
               p.preferred_read_replica, p.records)
              for t in FetchResponse.decode(body, version=version).responses for p in t.partitions]
    ours = rows(FetchResponseView.decode(body, version, copy_records=True))
    return ours == theirs and all(r[-1] is None or type(r[-1]) is bytes for r in ours)


def contenders(version: int, body: bytes) -> dict[str, tuple[Callable[[], Any], Callable[[Any], Any]]]:
    """name -> (decode(), encode(decoded)) closures over the same body."""
    codec = response_codec(1, version)
    view = memoryview(body)
    out: dict[str, tuple[Callable[[], Any], Callable[[Any], Any]]] = {
        "construct": (lambda: codec.decode(body), codec.encode),
        "fast": (lambda: FetchResponseView.decode(view, version), lambda v: v.encode()),
        # like for like with a decoder's output: every field decoded, every record set copied out as bytes
        "fast-materialised": (lambda: FetchResponseView.decode(body, version, copy_records=True),
                              lambda v: v.encode()),
        # the same result by the lazy decode and a copy pass over it (the headline's definition before)
        "fast+copy-pass": (lambda: (lambda v: (v, materialised(v)))(FetchResponseView.decode(view, version)),
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


def reencodes(version: int, body: bytes) -> bool:
    """Whether the fast path reproduces the body exactly (a benchmark of a wrong codec is worthless)."""
    view = FetchResponseView.decode(memoryview(body), version)
    return b"".join(view.encode()[0]) == body


def check_fast(version: int, body: bytes) -> None:
    """:func:`reencodes`, or exit 1 (one side of --compare: its parent reports the failure)."""
    if not reencodes(version, body):
        raise SystemExit(f"fast path re-encode differs from the input for v{version}")


def run(versions: list[int], partitions: int, repeat: int, record_size: int) -> list[dict[str, Any]]:
    """Each version's contenders timed; a version whose body the fast path does not re-encode byte for byte is
    not timed, and its line says so (``reencoded_equal``: false)."""
    lines: list[dict[str, Any]] = []
    for version in versions:
        body = build_response(version, partitions, record_size=record_size)
        if not reencodes(version, body):
            line = {"name": "fast", "version": version, "reencoded_equal": False}
            lines.append(line)
            print(json.dumps(line), flush=True)
            continue
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


def side(version: int, partitions: int, repeat: int, record_size: int = RECORD_SIZE) -> dict[str, Any]:
    """One side of --compare, in this process's checkout: the like-for-like decode and its encode, and the
    lazy decode and its encode, each the best of ``repeat`` runs."""
    import proxy

    body = build_response(version, partitions, record_size=record_size)
    check_fast(version, body)
    view = memoryview(body)
    decode_lfl = like_for_like(version, body)
    decoded = decode_lfl()[0]
    lazy_view = FetchResponseView.decode(view, version)
    t_dec = best_of(decode_lfl, repeat, 4.0)
    t_enc = best_of(decoded.encode, repeat, 4.0)
    t_lazy = best_of(lambda: FetchResponseView.decode(view, version), repeat, 4.0)
    t_lazy_enc = best_of(lazy_view.encode, repeat, 4.0)

    def us(t: float) -> float:
        return round(t / partitions * 1e6, 3)

    return {"version": version, "decode_us": us(t_dec), "encode_us": us(t_enc),
            "like_for_like_us": us(t_dec + t_enc), "lazy_us": us(t_lazy + t_lazy_enc),
            "copy_records": has_copy_records(), "source": str(Path(proxy.__file__).resolve().parents[1]),
            "load": round(os.getloadavg()[0], 2)}


#: runs the bench file given as argv[1] with the rest of argv, importing ``proxy`` from the working directory (first
#: on the path) and ``bench`` from this checkout (appended: the other tree holds proxy/ and rig/ only)
_CHILD = ("import runpy, sys; path = sys.argv[1]; sys.path.append(path.rsplit('/bench/', 1)[0]); "
          "sys.argv = ['bench.codec', *sys.argv[2:]]; runpy.run_path(path, run_name='__main__')")


def compare(rev: str, versions: list[int], partitions: int, repeat: int, rounds: int,
            record_size: int = RECORD_SIZE, check_goals: bool = False) -> int:
    """This checkout against ``rev``, ABBA per round, each side in its own process; see the module doc."""
    # here, not at the top: each side runs this file in a tree of proxy/ and rig/ only
    from bench.support.revision import extract_revision, short_revision

    root = Path(__file__).resolve().parents[1]
    label = short_revision(rev)
    here = subprocess.run(["git", "-C", str(root), "describe", "--always", "--dirty"], capture_output=True,
                          text=True, check=True).stdout.strip()
    runs: dict[str, list[dict[str, Any]]] = {"rev": [], "this": []}
    with tempfile.TemporaryDirectory(prefix="codec-compare-") as tmp:
        extract_revision(rev, Path(tmp), ("proxy", "rig"))
        trees = {"rev": tmp, "this": str(root)}
        for _ in range(rounds):
            for name in ("rev", "this", "this", "rev"):
                out = subprocess.run(
                    [sys.executable, "-c", _CHILD, __file__, "--side", "--versions", ",".join(map(str, versions)),
                     "--partitions", str(partitions), "--repeat", str(repeat), "--record-size", str(record_size)],
                    cwd=trees[name], capture_output=True, text=True, check=True).stdout
                for raw in out.splitlines():
                    line = {"side": name, "revision": label if name == "rev" else here, **json.loads(raw)}
                    if line["source"] != str(Path(trees[name]).resolve()):
                        raise SystemExit(f"the {name} side imported proxy from {line['source']}")
                    runs[name].append(line)
                    print(json.dumps(line), flush=True)

    def mean(name: str, version: int, key: str) -> float:
        values = [r[key] for r in runs[name] if r["version"] == version]
        return sum(values) / len(values)

    for version in versions:
        print(json.dumps({
            "version": version,
            "rev_like_for_like_us": round(mean("rev", version, "like_for_like_us"), 3),
            "like_for_like_us": round(mean("this", version, "like_for_like_us"), 3),
            "ratio": round(mean("this", version, "like_for_like_us") / mean("rev", version, "like_for_like_us"), 3),
            "lazy_ratio": round(mean("this", version, "lazy_us") / mean("rev", version, "lazy_us"), 3),
        }), flush=True)
    first = versions[0]
    body = build_response(first, partitions, record_size=record_size)
    line = summary("codec_compare", {
        "rev": label, "this": here, "version": first, "record_size": record_size,
        "fast_us_per_partition": round(mean("this", first, "like_for_like_us"), 3),
        "rev_fast_us_per_partition": round(mean("rev", first, "like_for_like_us"), 3),
        "ratio": round(mean("this", first, "like_for_like_us") / mean("rev", first, "like_for_like_us"), 3),
        "lazy_ratio": round(mean("this", first, "lazy_us") / mean("rev", first, "lazy_us"), 3),
        "loads": [r["load"] for r in runs["rev"] + runs["this"] if r["version"] == first],
        "order": "ABBA", "rounds": rounds,
    }, GOALS, checks={"reencoded_equal": reencodes(first, body),
                      "same_as_kafka_python": same_as_kafka_python(first, body)})
    emit(line)
    return exit_status(line, check_goals)


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
        line: dict[str, Any] = {"bench": "fetch_request", "version": version, "reencoded_equal": False}
        print(json.dumps(line), flush=True)
        return line
    t_dec = best_of(lambda: decode_fetch_request(frame).partitions(), repeat, 4.0)
    t_enc = best_of(lambda: encode_fetch_request(view, 1, 1, wanted, forgotten), repeat, 4.0)
    t_con = best_of(lambda: request_partitions(decode_request(frame)[1], version), repeat, 4.0)
    t_con_enc = None
    if version >= FIRST_SESSION:
        plan = sessions.UpstreamPlan(sessions.FetchMetadata(1, 1), request_partitions(body, version), [], {})
        t_con_enc = best_of(lambda: encode_request(header, apply_plan(body, version, plan)), repeat, 4.0)

    def us(t: float | None) -> float | None:
        return None if t is None else round(t / partitions * 1e6, 3)

    line = {"bench": "fetch_request", "partitions": partitions, "version": version, "reencoded_equal": True,
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
    ap.add_argument("--compare", metavar="REV",
                    help="this checkout's fast path against revision REV, ABBA, each side in its own process")
    ap.add_argument("--rounds", type=int, default=1, help="ABBA rounds of --compare")
    ap.add_argument("--record-size", type=int, default=RECORD_SIZE,
                    help="bytes of record value per partition (one record; the headline is at 1024)")
    ap.add_argument("--side", action="store_true", help=argparse.SUPPRESS)  # one side of --compare
    add_options(ap, "100 partitions, versions 12 and 16, 3 runs each (with --fetch-request: 1,000 partitions)")
    args = ap.parse_args(argv)
    if args.smoke:
        args.partitions, args.repeat, args.rounds = (1000 if args.fetch_request else 100), 3, 1
        if args.versions == "12,4,16" and not args.fetch_request:
            args.versions = "12,16"
    if args.side:
        for version in (int(v) for v in args.versions.split(",")):
            print(json.dumps(side(version, args.partitions, args.repeat, args.record_size)), flush=True)
        return 0
    if args.compare:
        versions = [int(v) for v in args.versions.split(",")]
        return compare(args.compare, versions, args.partitions, args.repeat if args.smoke else max(args.repeat, 200),
                       args.rounds, args.record_size, args.check)
    if args.fetch_request:
        versions = [int(v) for v in (args.versions if args.versions != "12,4,16" else "16").split(",")]
        partitions = args.partitions if args.partitions != 1000 or args.smoke else 10000
        requests = [run_request(version, partitions, args.repeat) for version in versions]
        line = summary("codec_fetch_request", {"partitions": partitions, "versions": versions}, {},
                       checks={"reencoded_equal": all(r["reencoded_equal"] for r in requests)})
        emit(line)
        return exit_status(line, args.check)
    versions = [int(v) for v in args.versions.split(",")]
    lines = run(versions, args.partitions, args.repeat, args.record_size)
    first = versions[0]

    def figure(name: str) -> float | None:
        for line in lines:
            if line["name"] == name and line["version"] == first and line.get("op") == "decode+encode":
                return float(line["us_per_partition"])
        return None

    fast = figure("fast-materialised")
    kp = figure("kafka-python")
    line = summary("codec", {
        "version": first,
        "fast_us_per_partition": fast,
        "speedup_vs_kafka_python": round(kp / fast, 2) if fast and kp else None,
        "lazy_fast_us_per_partition": figure("fast"),
        "load": round(os.getloadavg()[0], 2),
    }, GOALS, checks={
        "reencoded_equal": all(x.get("reencoded_equal", True) for x in lines),
        "same_as_kafka_python": all(same_as_kafka_python(v, build_response(v, args.partitions,
                                                                             record_size=args.record_size))
                                    for v in versions)})
    emit(line)
    return exit_status(line, args.check)


if __name__ == "__main__":
    sys.exit(main())
