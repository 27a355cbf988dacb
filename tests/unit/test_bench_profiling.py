"""bench/support/profiling.py's summary of py-spy's collapsed stacks: each sample filed under the innermost part of
Sluice inside the event loop's frames (a smoke test of the bench's analysis; the sampling itself needs a process)."""

from __future__ import annotations

from bench.support.profiling import part_of, summarize

OUTER = "<module> (proxy/__main__.py:5);main (proxy/cli.py:457);run (uvloop/__init__.py:92);" \
        "Runner.run (asyncio/runners.py:118)"


def stack(*inner: str) -> list[str]:
    return [*OUTER.split(";"), *inner]


def test_samples_are_filed_by_the_innermost_part_inside_the_loop() -> None:
    assert part_of(stack()) == "event_loop"  # no Sluice frame inside the loop: uvloop's own C code
    assert part_of(stack("ClientProtocol.data_received (proxy/io/transports.py:84)",
                         "Connection.client_data (proxy/core/connection.py:187)",
                         "Connection._send_upstream (proxy/core/connection.py:409)",
                         "ClientProtocol.send_upstream (proxy/io/transports.py:138)")) == "writes"
    assert part_of(stack("UpstreamProtocol.data_received (proxy/io/transports.py:196)",
                         "Connection._record (proxy/core/connection.py:600)",
                         "Counter.inc (prometheus_client/metrics.py:337)")) == "metrics"
    assert part_of(stack("Chain.classify (proxy/core/chain.py:120)",
                         "peek_request_header (proxy/wire/messages.py:160)")) == "header_parse"
    assert part_of(stack("HttpServer._serve (proxy/io/http_server.py:120)",
                         "AdminServer._metrics (proxy/admin.py:190)",
                         "Metrics.exposition (proxy/metrics.py:250)")) == "admin"


def test_the_summary_gives_shares_and_time_per_request() -> None:
    lines = [f"{OUTER} 60\n",
             f"{OUTER};ClientProtocol.send_client (proxy/io/transports.py:134) 30\n",
             f"{OUTER};Connection._frame_loop (proxy/core/connection.py:220) 10\n"]
    s = summarize(lines, rate_hz=100, requests=10)
    assert s["samples"] == 100 and s["cpu_s_sampled"] == 1.0 and s["us_per_request"] == 100_000.0
    assert s["parts"]["event_loop"] == {"share": 0.6, "us_per_request": 60_000.0}
    assert s["parts"]["writes"]["share"] == 0.3 and s["parts"]["framing"]["share"] == 0.1
    assert s["top_functions"][0] == {"function": "Runner.run (asyncio/runners.py:118)", "share": 0.6}
