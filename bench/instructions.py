"""Machine instructions per round trip through Sluice's connection core, counted by Valgrind's callgrind.

``python -m bench.instructions [--case produce|fetch_all|fetch_small|metadata|bare] [--rounds 200] [--compare REV]``
``[--sharing shared|unshared|off] [--terminate] [--client-session]`` (``fetch_small`` only)
``[--policies none|all] [--access-log file|off]`` (``produce`` only) ``[--cold]``

A count, not a timing: the same on a loaded machine as on a quiet one, so a change of a few percent shows where a
wall-clock figure cannot (two starts of the same Sluice on this project's shared 2-core machine differ by more).
Unlike ``bench.pipeline_cpu --opcodes``, which counts the bytecodes of Sluice's own code, it counts everything the
CPU executes for the round trips: Python's interpreter, its allocator and garbage collector, the C extensions.

Cases, each through one connection of the core (proxy/core/connection.py) driven as the I/O layer drives it, on a
port that keeps what it is handed (no copy) and checks it after the count:

- ``produce``: a producer's round trip (Produce v10, acks=1, one 100-byte record; the broker's plain answer),
  default settings, access log off: relayed, no policy reads it (the per-request cost every client pays);
  ``--policies all``: with ``bench.passthrough``'s ``ALL_POLICIES`` (the quota meters every Produce) and the access
  log written to a file, as ``bench.passthrough --policies all`` runs it (``--access-log off``: not written);
- ``fetch_all``: ``bench.pipeline_cpu --opcodes --case fetch_all``'s Fetch v12 of a session-less client with every
  policy on (``bench.passthrough``'s ``ALL_POLICIES``), 3 partitions x 20 batches of 16 KiB, collected whole;
- ``fetch_small``: a consumer kept caught up on a low-rate topic: each Fetch v12 (one partition, max wait 500 ms)
  answered with one one-record batch (a 200-byte value), the next fetch from the offset after it. ``--sharing``:
  ``shared`` (default): the client reads slice 0/2 of the topic (``[[sharing.standalone]]``, the record's key in
  its slice: kept); ``unshared``: sharing on for other topics only (``bench.sharing``'s ``no-sharing``: the
  client's fetches pass the policy unfiltered); ``off``: sharing not configured. ``--terminate``: ``[sessions] mode =
  "terminate"`` (the upstream answers in Sluice's session, 77). ``--client-session``: the client keeps a fetch
  session (Java, kafka-python: a full request, then incremental ones in the session its first answer named);
  without: session-less (librdkafka, aiokafka);
- ``metadata``: a client's Metadata refresh (v12, one topic of 6 partitions led by 3 brokers), default settings:
  the addresses policy rewrites every answer's brokers to Sluice's listeners; the broker answers each in the same
  bytes but its correlation id, as a cluster that does not change does;
- ``bare``: ``produce``'s round trips through the bare relay's protocols (rig/bare_relay.py: bytes in, bytes out,
  the least a Python proxy can do; ``bench.passthrough``'s baseline) on transports that keep what they are
  written: what a relay costs in Python per round trip, system calls left out as in the other cases.

Each case runs 40 warm-up round trips, then ``--rounds`` counted ones, in a child process under callgrind: its
instrumentation is switched on (``callgrind_control -i on``) only once the child is warm, and only what runs inside
the measured loop is counted (``--toggle-collect`` on the C function of ``operator.call``, which runs it), so
start-up, warm-up and exit count nothing. ``--compare REV`` counts REV's tree too (a temporary worktree, this
file's harness run against its code).

``--cold``: each counted round trip starts from evicted caches (a 64 MiB buffer written before it, uncounted), and
callgrind models a core's caches (a Zen core's L1s and its 2 MiB L2, the same on every machine): ``cold_misses``
per round trip are the cache lines, code and data, it brings in from beyond that L2. That is what a round trip
costs where it runs: on a machine whose cores the clients and the broker share, each request finds the caches
holding their work, not Sluice's, and a count warm in a loop misses almost none of it (docs/PERFORMANCE.md relates
the misses to ``bench.passthrough``'s CPU per send).

One JSON line per count, then ``{"summary": "instructions", "case", "rounds", "instructions" (per round trip, this
tree), "memory_instructions" (of them, the C library's block copies and fills: the bytes moved), ["before",
"ratio" with --compare; with --cold "cold_misses", "l1_misses", "cold_misses_before", "cold_misses_ratio"],
"goals": {}, "met": true, "wrong", "errors", "correct"}``: the check is every round trip's
reply as the client must get it (the broker's bytes for a relayed one, every batch for ``fetch_all``); the exit
status is 1 when one was wrong or a count failed. ``--smoke``: 20 rounds. Needs ``valgrind`` (Debian's package;
``make install`` installs it) and a libpython with its symbols (``operator.call``'s C function is found by name).
"""

from __future__ import annotations

import argparse
import gc
import json
import operator
import os
import re
import subprocess
import sys
import tempfile
import time
import tomllib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from bench.support.verdict import add_options, emit, exit_status, summary

ROOT = Path(__file__).resolve().parent.parent
CASES = ("produce", "fetch_all", "fetch_small", "metadata", "bare")
#: ``fetch_small``'s settings per ``--sharing`` (its topic is "bench"; its client, bench.pipeline_cpu.CLIENT_ID)
SMALL_SHARING = {
    "off": "",
    "unshared": '[sharing]\nenabled = true\n[[sharing.topics]]\ntopic = "bench-sharing-*"\n',
    "shared": '[sharing]\nenabled = true\n[[sharing.topics]]\ntopic = "bench"\n'
              '[[sharing.standalone]]\nclient_id = "bench-client"\ntopic = "bench"\nslice = "0/2"\n',
}
WARMUP = 40
#: uvloop reads up to 256 KiB a time
READ_SIZE = 256 * 1024


class KeptPort:
    """A :class:`~proxy.core.connection.Port` that keeps what the core hands it, by reference (the core's views
    are of bytes it never reuses once handed over, in these cases), so the count holds no copy of the harness's."""

    def __init__(self, call_later: Callable[[float, Callable[[], None]], Any]) -> None:
        self.client: list[Any] = []
        self.upstream: list[Any] = []
        self.call_later = call_later

    def send_client(self, buffers: Sequence[Any]) -> None:
        self.client.extend(buffers)

    def send_upstream(self, buffers: Sequence[Any]) -> None:
        self.upstream.extend(buffers)

    def pause_client(self) -> None: ...

    def resume_client(self) -> None: ...

    def pause_upstream(self) -> None: ...

    def resume_upstream(self) -> None: ...

    def close(self, abort: bool) -> None:
        raise AssertionError(f"the core closed the connection (abort={abort})")

    def read_upstream_into(self, on: bool) -> None: ...  # the core takes upstream_data either way

    def defer(self, callback: Callable[[], None]) -> None:
        callback()  # the core takes a callback at once or later


class KeptTransport:
    """A transport for the bare relay's protocols that keeps what it is written."""

    def __init__(self) -> None:
        self.written: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.written.append(data)


def frames_of(case: str, count: int, small: SmallFetch | None = None,
              session_id: int = 0) -> tuple[list[tuple[bytes, bytes]], dict[str, Any] | None]:
    """The round trips of ``case`` ((request, response) frames without size prefixes) and the settings' overrides;
    ``fetch_small``'s requests in a client's session name ``session_id`` (the one its first answer named)."""
    from bench import pipeline_cpu

    if case == "metadata":
        return [_metadata_frames(i) for i in range(count)], None
    if case in ("produce", "bare"):
        overrides = None
        if case == "produce" and small is not None and small.policies == "all":
            from bench.passthrough import ALL_POLICIES

            overrides = tomllib.loads(ALL_POLICIES)
        return [pipeline_cpu._produce_frames(i) for i in range(count)], overrides
    if case == "fetch_small":
        assert small is not None
        return _small_fetch_frames(small, count, session_id), small.overrides()
    from bench.passthrough import ALL_POLICIES

    return pipeline_cpu._fetch_all_frames(12, count), tomllib.loads(ALL_POLICIES)


class SmallFetch(NamedTuple):
    """``fetch_small``'s configuration: ``--sharing``, ``--terminate``, ``--client-session``; ``produce``'s:
    ``--policies``."""

    sharing: str = "shared"
    terminate: bool = False
    client_session: bool = False
    policies: str = "none"
    access_log: str = "file"
    #: --cold: caches evicted before each round trip, cache misses counted (any case)
    cold: bool = False

    def overrides(self) -> dict[str, Any]:
        terminate = '[sessions]\nmode = "terminate"\n' if self.terminate else ""
        return tomllib.loads(terminate + SMALL_SHARING[self.sharing])

    def argv(self) -> list[str]:
        return ["--sharing", self.sharing, *(["--terminate"] if self.terminate else []),
                *(["--client-session"] if self.client_session else []), "--policies", self.policies,
                "--access-log", self.access_log, *(["--cold"] if self.cold else [])]


#: a key of slice 0/2 (its murmur2 hash below 2^30): ``--sharing shared`` keeps the record
SMALL_KEY = b"key-1"


def _small_fetch_frames(small: SmallFetch, count: int, session_id: int) -> list[tuple[bytes, bytes]]:
    """Fetch v12 round trips of one partition, each answered with the one one-record batch at its fetch offset:
    the first request full (epoch 0 in a client's session), the next ones incremental in ``session_id``."""
    from bench.pipeline_cpu import request_frame, response_frame
    from proxy.policies.terminate.sessions import LEGACY, FetchMetadata
    from proxy.wire.records import Record, encode_batch, new_batch

    key = ("bench", 0)
    upstream_session = 77 if small.terminate or small.client_session else 0
    frames = []
    for i in range(count):
        meta = FetchMetadata(session_id, i) if small.client_session else LEGACY
        records = encode_batch(new_batch([Record(key=SMALL_KEY, value=b"v" * 200)], base_offset=i))
        frames.append((request_frame(12, i + 1, {key: i}, meta),
                       response_frame(12, i + 1, [key], i + 1, upstream_session, records)))
    return frames


def wrong_reply(case: str, request: bytes, response: bytes, reply: bytes) -> bool:
    """Whether the client's ``reply`` is not what it must get: the broker's bytes as they came for a relayed
    response, every partition and batch for ``fetch_all`` (:func:`bench.pipeline_cpu.check`), for ``metadata`` the
    broker's answer with its brokers at Sluice's advertised host (one host, none of theirs; a --compare revision's
    rig may name it otherwise)."""
    if case == "metadata":
        from proxy.wire.messages import decode_response

        if int.from_bytes(reply[:4], "big") != len(reply) - 4:
            return True
        (got_header, got), (header, want) = decode_response(3, 12, reply[4:]), decode_response(3, 12, response)
        hosts = {b.host for b in got.brokers}
        return (got_header.correlation_id != header.correlation_id or got.topics != want.topics
                or [b.node_id for b in got.brokers] != [b.node_id for b in want.brokers]
                or len(hosts) != 1 or bool(hosts & {b.host for b in want.brokers}))
    if case in ("fetch_all", "fetch_small"):
        from bench.pipeline_cpu import check

        return check("fetch_all", 12, request, response, reply) is not None
    return reply != len(response).to_bytes(4, "big") + response


#: one round trip: the request as one read, the response as its reads -> what the client got
RoundTrip = Callable[[bytes, list[bytes]], list[Any]]


def _core(case: str, overrides: dict[str, Any] | None, access_log: str = "off") -> RoundTrip:
    """A connection of the core, as the server makes one (``sluice run``'s default access log: off; else the file
    ``access_log``)."""
    from proxy.accesslog import AccessLog
    from proxy.core.connection import Connection
    from proxy.core.exchange import ConnectionInfo
    from proxy.core.observer import ConnectionEvents
    from rig.core_rig import CoreRig

    rig = CoreRig(overrides)
    rig.access_log = AccessLog(access_log)
    rig.proxy.chain.access_log = rig.access_log  # the chain's too: it lists a Fetch's partitions only for a log on
    events = ConnectionEvents(rig.metrics, rig.access_log, rig.proxy.chain)
    port = KeptPort(rig.timers.call_later)
    # made here, not by CoreRig.connect (a FakePort, which copies what it is handed): --compare runs this harness
    # against another revision's rig, so it asks of it no more than the core's own interface
    conn = Connection(ConnectionInfo(1, "bootstrap"), rig.proxy.chain, port, memory=rig.memory, names=rig.names,
                      observer=events, tallies=events.tallies, clock=rig.clock, limits=rig.limits)
    conn.upstream_ready("broker:9092")
    tick = 0.05 if case == "fetch_all" else 0.0  # the throttle's and quota's windows move on, as in pipeline_cpu
    #: fetch_small: after the first round trip, the clock moves past sharing's member_wait_s: a client of no
    #: group Sluice knows then fetches unfiltered (``unshared``), as a member holding whole partitions does
    settle = [rig.proxy.settings.sharing.member_wait_s + 1] if case == "fetch_small" else []

    def round_trip(request: bytes, reads: list[bytes]) -> list[Any]:
        port.client = []
        conn.client_data(request)
        for data in reads:
            conn.upstream_data(data)
        if tick:
            rig.advance(tick)
        if settle:
            rig.advance(settle.pop())
        return port.client

    return round_trip


def _bare() -> RoundTrip:
    """The bare relay's two protocols on transports that keep what they are written."""
    from rig.bare_relay import _Relay

    relay = _Relay()
    client, upstream = KeptTransport(), KeptTransport()
    relay.client.transport, relay.upstream.transport = client, upstream

    def round_trip(request: bytes, reads: list[bytes]) -> list[Any]:
        client.written = []
        relay.client.data_received(request)
        for data in reads:
            relay.upstream.data_received(data)
        return client.written

    return round_trip


def _metadata_frames(corr: int) -> tuple[bytes, bytes]:
    """A Metadata v12 request for one topic and the broker's answer (3 brokers, 6 partitions), no size prefixes."""
    from bench.pipeline_cpu import CLIENT_ID
    from proxy.wire.messages import request_codec, response_codec
    from proxy.wire.model import Message
    from rig.core_rig import request, response

    body = request_codec(3, 12).default().replace(topics=[Message(topic_id=bytes(16), name="bench")],
                                                 allow_auto_topic_creation=False,
                                                 include_topic_authorized_operations=False)
    partitions = [Message(error_code=0, partition_index=p, leader_id=1 + p % 3, leader_epoch=0,
                          replica_nodes=[1 + p % 3], isr_nodes=[1 + p % 3], offline_replicas=[]) for p in range(6)]
    answer = response_codec(3, 12).default().replace(
        brokers=[Message(node_id=n, host=f"10.0.0.{n}", port=9092, rack=None) for n in (1, 2, 3)],
        cluster_id="bench-cluster", controller_id=1,
        topics=[Message(error_code=0, name="bench", topic_id=bytes(16), is_internal=False, partitions=partitions,
                        topic_authorized_operations=-2147483648)])
    return request(3, 12, corr, body, client_id=CLIENT_ID), response(3, 12, corr, answer)


def _trips(frames: list[tuple[bytes, bytes]]) -> list[tuple[bytes, list[bytes]]]:
    """``frames`` as the reads hand them over: the request whole, the response in reads of up to 256 KiB."""
    trips = []
    for request, response in frames:
        wire = len(response).to_bytes(4, "big") + response
        trips.append((len(request).to_bytes(4, "big") + request,
                      [wire[i : i + READ_SIZE] for i in range(0, len(wire), READ_SIZE)]))
    return trips


def child(case: str, rounds: int, flag: Path, small: SmallFetch) -> int:
    """Run in valgrind: warm up, say "ready", wait for the parent to switch instrumentation on (``flag``), run the
    counted round trips inside ``operator.call``, then check every reply; print one JSON line."""
    frames, overrides = frames_of(case, WARMUP + rounds, small)
    trips = _trips(frames)
    log = "off"
    if case == "produce" and small.policies == "all" and small.access_log == "file":
        # removed by its finalizer when the child returns (mkdtemp's directories were left behind)
        log_dir = tempfile.TemporaryDirectory(prefix="bench-instructions-log-")
        log = str(Path(log_dir.name) / "access.log")
    round_trip = _bare() if case == "bare" else _core(case, overrides, log)
    replies: list[list[Any]] = []

    def run(todo: list[tuple[bytes, list[bytes]]]) -> None:
        for request, reads in todo:
            replies.append(round_trip(request, reads))

    if case == "fetch_small" and small.client_session:
        # the client's next requests name the session its first answer named (Sluice's own in terminate mode)
        from proxy.wire.fetch_fast import decode_frame

        run(trips[:1])
        session_id = decode_frame(b"".join(bytes(b) for b in replies[0])[4:], 12)[2].session_id
        frames = frames_of(case, WARMUP + rounds, small, session_id)[0]
        trips = trips[:1] + _trips(frames[1:])
        run(trips[1:WARMUP])
    else:
        run(trips[:WARMUP])
    gc.freeze()  # as `sluice run` does once started: the long-lived heap is out of the collector's way
    print("ready", flush=True)
    while not flag.exists():
        time.sleep(0.01)
    replies.clear()
    if small.cold:
        # each round trip from cold caches, as on a machine whose cores its clients and the broker share: every
        # cache line of a buffer larger than the modelled caches written first (uncounted: only operator.call's
        # inside is collected), so each round trip brings in again all the code and data it touches
        junk = bytearray(EVICT_BYTES)
        ones = b"\x01" * (EVICT_BYTES // 64)
        for request, reads in trips[WARMUP:]:
            junk[::64] = ones
            replies.append(operator.call(round_trip, request, reads))
    else:
        operator.call(run, trips[WARMUP:])
    wrong = sum(wrong_reply(case, request, response, b"".join(bytes(b) for b in reply))
                for (request, response), reply in zip(frames[WARMUP:], replies, strict=True))
    print(json.dumps({"rounds": len(replies), "wrong": wrong}), flush=True)
    return 0


def count(tree: Path, case: str, rounds: int, small: SmallFetch) -> dict[str, Any]:
    """One count of ``case`` with ``tree``'s code: instructions per round trip."""
    with tempfile.TemporaryDirectory(prefix="bench-instructions-") as tmp:
        flag, out = Path(tmp) / "go", Path(tmp) / "callgrind.out"
        cmd = ["valgrind", "--tool=callgrind", "--instr-atstart=no", "--collect-atstart=no",
               *(CACHE_MODEL if small.cold else []),
               "--toggle-collect=_operator_call", f"--callgrind-out-file={out}", sys.executable, "-m",
               "bench.instructions", "--child", str(flag), "--case", case, "--rounds", str(rounds), *small.argv()]
        # this file's harness, the tree's code (the harness reads no more of the tree than its modules' interfaces)
        env = {**os.environ, "PYTHONPATH": f"{tree}{os.pathsep}{ROOT}" if tree != ROOT else str(ROOT)}
        proc = subprocess.Popen(cmd, cwd=tree, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert proc.stdout is not None
        line = proc.stdout.readline()
        while line and line.strip() != "ready":  # a log line first (fetch_small unshared: sharing_member_unknown)
            line = proc.stdout.readline()
        if line.strip() != "ready":
            proc.kill()
            _, err = proc.communicate()
            raise RuntimeError(f"the counted process did not start: {line}{err[-3000:]}")
        subprocess.run(["callgrind_control", "-i", "on", str(proc.pid)], check=True, capture_output=True)
        flag.touch()
        rest, err = proc.communicate(timeout=3600)
        if proc.returncode != 0:
            raise RuntimeError(f"the counted process failed ({proc.returncode}): {err[-3000:]}")
        collected = re.search(r"Collected : (\d+)", err)
        if collected is None or int(collected.group(1)) == 0:
            raise RuntimeError(f"callgrind counted nothing: is libpython's symbol _operator_call there?\n{err[-2000:]}")
        memory = memory_instructions(out)
        misses = cache_misses(out) if small.cold else None
    result = json.loads(rest.strip().splitlines()[-1])
    total, counted = int(collected.group(1)), result["rounds"]
    figures = {"instructions": round(total / counted), "memory_instructions": round(memory / counted)}
    if misses is not None:
        figures |= {"cold_misses": round(misses[0] / counted, 1), "l1_misses": round(misses[1] / counted, 1)}
    return {**figures, "wrong": result["wrong"]}


#: --cold: the caches callgrind models, the same on every machine (a count must not depend on the host's): an AMD
#: Zen core's (this project's machines'), 32 KiB L1i, 48 KiB L1d, and its 2 MiB L2 as the last level; what misses
#: there comes from the shared L3 or memory (tens of nanoseconds a line)
CACHE_MODEL = ["--cache-sim=yes", "--I1=32768,8,64", "--D1=49152,12,64", "--LL=2097152,16,64"]
#: --cold: bytes written (a byte per 64-byte line) before each round trip: 32 times the modelled last level
EVICT_BYTES = 64 << 20


def cache_misses(out: Path) -> tuple[int, int]:
    """(last-level misses: instruction fetches, data reads and writes; first-level misses) in the count, from the
    totals line of callgrind's output (its ``events:`` line names the columns)."""
    events: list[str] = []
    totals: list[int] = []
    for line in out.read_text().splitlines():
        if line.startswith("events:"):
            events = line.split()[1:]
        elif line.startswith(("summary:", "totals:")):
            totals = [int(v) for v in line.split()[1:]]
    got = dict(zip(events, totals, strict=False))
    return (got["ILmr"] + got["DLmr"] + got["DLmw"], got["I1mr"] + got["D1mr"] + got["D1mw"])


#: the C library's block copies and fills: what a response's bytes cost to move, counted apart
MEMORY_FUNCTIONS = re.compile(r":__(memcpy|memmove|memset)\w*")


def memory_instructions(out: Path) -> int:
    """The instructions ``memcpy``/``memmove``/``memset`` executed in the count (their own, from callgrind's
    annotation): on a Fetch's path the bytes moved, which grow with the response, not with what Sluice does per
    request."""
    report = subprocess.run(["callgrind_annotate", "--inclusive=no", "--threshold=100", str(out)],
                            capture_output=True, text=True, check=True).stdout
    return sum(int(line.split()[0].replace(",", "")) for line in report.splitlines()
               if MEMORY_FUNCTIONS.search(line) and line.strip()[:1].isdigit())


def worktree_of(rev: str, tmp: Path) -> Path:
    tree = tmp / "tree"
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "-q", str(tree), rev], check=True)
    (tree / "bench" / "instructions.py").write_text(Path(__file__).read_text())  # the same harness for both
    return tree


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.instructions", description=__doc__.split("\n\n")[0])
    ap.add_argument("--case", choices=CASES, default="produce")
    ap.add_argument("--rounds", type=int, default=200, help="round trips counted (default 200)")
    ap.add_argument("--compare", metavar="REV", help="count REV's code too (a temporary worktree)")
    ap.add_argument("--sharing", choices=tuple(SMALL_SHARING), default="shared",
                    help="fetch_small: the client reads a slice (shared), sharing on for other topics (unshared), "
                         "or sharing not configured (off)")
    ap.add_argument("--terminate", action="store_true", help='fetch_small: [sessions] mode = "terminate"')
    ap.add_argument("--client-session", action="store_true",
                    help="fetch_small: the client keeps a fetch session (Java, kafka-python)")
    ap.add_argument("--policies", choices=("none", "all"), default="none",
                    help="produce: every policy of bench.passthrough --policies all on (the access log: --access-log)")
    ap.add_argument("--access-log", choices=("file", "off"), default="file",
                    help="produce --policies all: the access log written to a file (default, as bench.passthrough) "
                         "or off")
    ap.add_argument("--cold", action="store_true",
                    help="each round trip from evicted caches; count the cache misses (of callgrind's model of a "
                         "core's caches) too")
    ap.add_argument("--child", metavar="FLAG", type=Path, help=argparse.SUPPRESS)
    add_options(ap, "20 rounds")
    args = ap.parse_args(argv)
    small = SmallFetch(args.sharing, args.terminate, args.client_session, args.policies, args.access_log, args.cold)
    if args.child is not None:
        return child(args.case, args.rounds, args.child, small)
    rounds = 20 if args.smoke else args.rounds
    errors: list[str] = []
    after = count(ROOT, args.case, rounds, small)
    variant: dict[str, Any] = {k: v for k, v in small._asdict().items()
                               if k not in ("policies", "access_log", "cold")} \
        if args.case == "fetch_small" else {"policies": small.policies, "access_log": small.access_log} \
        if args.case == "produce" and small.policies == "all" else {}
    if small.cold:
        variant["cold"] = True
    emit({"bench": "instructions", "case": args.case, **variant, "side": "after" if args.compare else "this",
          **after})
    figures: dict[str, Any] = {"case": args.case, **variant, "rounds": rounds, "instructions": after["instructions"],
                               "memory_instructions": after["memory_instructions"]}
    if small.cold:
        figures |= {"cold_misses": after["cold_misses"], "l1_misses": after["l1_misses"]}
    wrong = after["wrong"]
    if args.compare:
        with tempfile.TemporaryDirectory(prefix="bench-instructions-rev-") as tmp:
            try:
                before = count(worktree_of(args.compare, Path(tmp)), args.case, rounds, small)
            finally:
                subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(Path(tmp) / "tree")],
                               check=False, capture_output=True)
        emit({"bench": "instructions", "case": args.case, "side": "before", "rev": args.compare, **before})
        wrong += before["wrong"]
        figures |= {"rev": args.compare, "before": before["instructions"],
                    "ratio": round(after["instructions"] / before["instructions"], 3)}
        if small.cold:
            figures |= {"cold_misses_before": before["cold_misses"],
                        "cold_misses_ratio": round(after["cold_misses"] / before["cold_misses"], 3)}
    if wrong:
        errors.append(f"{wrong} replies differ from what the client must get")
    line = summary("instructions", {**figures, "wrong": wrong}, {}, checks={"replies_as_sent": not wrong},
                   errors=errors)
    emit(line)
    return exit_status(line, args.check)


if __name__ == "__main__":
    raise SystemExit(main())
