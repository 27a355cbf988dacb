"""Where a Sluice process spends its time, sampled from outside with py-spy while a bench drives it.

:class:`Profile` attaches ``py-spy record`` (non-blocking: the process is never paused, so the figures it
perturbs least are the ones being measured) to a running Sluice and, when stopped, leaves two files in the
chosen directory: ``NAME.raw`` (collapsed stacks, one ``frame;frame;... count`` line each: what flamegraph.pl
and speedscope.app read) and ``NAME.json`` (the summary below), and returns the summary.

The summary attributes each sample to the first part of Sluice found walking its stack from the innermost frame
out (:data:`PARTS`), so a sample in prometheus_client called from the connection counts as ``metrics``, one in a
policy called from the chain as ``policies``; what has no Sluice frame at all is the event loop itself (uvloop's
C code: epoll, socket reads, callbacks dispatched; py-spy sees only Python frames, so native time counts towards
the innermost Python frame that called it: a write's send() towards ``writes``). Divided by the requests Sluice
served meanwhile (``sluice_requests_total``), each part becomes microseconds of CPU per request.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

#: (part, frame predicate on "function (file:line)") in the order a stack is matched from its innermost frame:
#: the first part one of its frames matches is the sample's
PARTS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("access_log", ("proxy/accesslog",)),
    ("metrics", ("proxy/metrics.py", "prometheus_client/")),
    ("header_parse", ("peek_request_header", "request_header_version", "(proxy/wire/api_keys.py")),
    ("policies", ("proxy/policies/",)),
    ("wire_codecs", ("proxy/wire/",)),
    ("chain", ("proxy/core/chain.py", "proxy/core/exchange.py")),
    ("writes", ("send_client (", "send_upstream (")),
    ("framing", ("proxy/core/connection.py",)),
    ("transports", ("proxy/io/transports.py",)),
    ("other_sluice", ("proxy/",)),
)
LOOP = "event_loop"  # no Sluice frame: uvloop/asyncio dispatching, reads, wake-ups, timers
ADMIN = "admin"  # the admin server (h11): /metrics scrapes, the benches' own among them
#: frames of the admin server: its sockets, HTTP (h11), routes and handlers
_ADMIN_FRAMES = ("h11/", "proxy/io/http_server.py", "proxy/http_routes.py", "proxy/admin.py")
#: frames of the event loop itself: what is inside the innermost of them is a callback it runs
_LOOP_FRAMES = ("asyncio/runners.py", "asyncio/base_events.py", "asyncio/events.py", "uvloop/")


def available() -> bool:
    return shutil.which("py-spy") is not None or (Path(sys.executable).parent / "py-spy").exists()


def _py_spy() -> str:
    local = Path(sys.executable).parent / "py-spy"
    return str(local) if local.exists() else "py-spy"


def part_of(stack: list[str]) -> str:
    """The part a sample's stack (outermost frame first) belongs to."""
    start = 0
    for i, frame in enumerate(stack):
        if any(n in frame for n in _LOOP_FRAMES):
            start = i + 1
    inner = stack[start:]
    if any(n in f for f in inner for n in _ADMIN_FRAMES):
        return ADMIN
    for frame in reversed(inner):
        for part, needles in PARTS:
            if any(n in frame for n in needles):
                return part
    return LOOP


def summarize(lines: Iterable[str], rate_hz: int, requests: float) -> dict[str, Any]:
    """Samples per part, their CPU seconds, their share and microseconds per request."""
    parts: Counter[str] = Counter()
    functions: Counter[str] = Counter()  # self samples of the innermost frame (the top-functions list)
    for line in lines:
        line = line.rstrip("\n")
        if not line:
            continue
        stack_text, _, count_text = line.rpartition(" ")
        try:
            count = int(count_text)
        except ValueError:
            continue
        stack = [f for f in stack_text.split(";") if not f.startswith(("process ", "thread "))]
        parts[part_of(stack)] += count
        if stack:
            functions[stack[-1]] += count
    total = sum(parts.values())
    per_request = 1e6 / rate_hz / requests if requests else float("nan")
    return {
        "samples": total, "rate_hz": rate_hz, "requests": int(requests),
        "cpu_s_sampled": round(total / rate_hz, 2),
        "us_per_request": round(total * per_request, 2),
        "parts": {p: {"share": round(n / total, 3), "us_per_request": round(n * per_request, 2)}
                  for p, n in parts.most_common()} if total else {},
        "top_functions": [{"function": f, "share": round(n / total, 3)} for f, n in functions.most_common(15)]
        if total else [],
    }


class Profile:
    """``py-spy record`` attached to ``pid`` until :meth:`stop`."""

    def __init__(self, pid: int, out_dir: Path, name: str, rate_hz: int = 250) -> None:
        out_dir.mkdir(parents=True, exist_ok=True)
        self.raw = out_dir / f"{name}.raw"
        self.json = out_dir / f"{name}.json"
        self.rate_hz = rate_hz
        self.proc = subprocess.Popen(
            [_py_spy(), "record", "--pid", str(pid), "--rate", str(rate_hz), "--format", "raw", "--nonblocking",
             "--output", str(self.raw)],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)

    def stop(self, requests: float) -> dict[str, Any]:
        """Stop sampling (py-spy writes its file on SIGINT); the summary, also written to ``NAME.json``."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
        try:
            _, err = self.proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            _, err = self.proc.communicate()
        if not self.raw.exists():
            raise SystemExit(f"py-spy wrote no profile: {err[-2000:]}")
        with self.raw.open() as f:
            summary = summarize(f, self.rate_hz, requests)
        summary["raw"] = str(self.raw)
        self.json.write_text(json.dumps(summary, indent=1))
        return summary
