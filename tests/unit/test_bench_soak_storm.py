"""bench.soak's and bench.storm's own analysis without a broker (smoke tests, so the benches do not rot; never a
timing): quantiles from histogram bucket deltas as Prometheus computes them, the per-interval line and the
summary of a soak, the storm's percentiles and upstream set-up share. The measurements themselves need the real
broker: ``python -m bench.soak``, ``python -m bench.storm`` (make bench-smoke runs
both briefly)."""

from __future__ import annotations

import asyncio
import math
import struct
import time

import pytest

from bench import soak, storm
from bench.support.verdict import Delivery
from proxy.wire.messages import decode_request, encode_response, response_codec
from proxy.wire.model import Message
from proxy.wire.records import decode_batch

INF = math.inf


def histogram(api_buckets: dict[str, dict[float, float]]) -> str:
    """Prometheus text of sluice_request_latency_seconds with the given cumulative buckets per api."""
    lines = ["# HELP sluice_request_latency_seconds x", "# TYPE sluice_request_latency_seconds histogram"]
    for api, buckets in api_buckets.items():
        for le, count in buckets.items():
            bound = "+Inf" if math.isinf(le) else repr(le)
            lines.append(f'sluice_request_latency_seconds_bucket{{api="{api}",le="{bound}"}} {count}')
        lines.append(f'sluice_request_latency_seconds_count{{api="{api}"}} {buckets[INF]}')
        lines.append(f'sluice_request_latency_seconds_sum{{api="{api}"}} 0.0')
    return "\n".join(lines) + "\n"


def test_quantile_interpolates_within_the_bucket_like_histogram_quantile() -> None:
    buckets = {0.001: 50.0, 0.01: 90.0, 0.1: 100.0, INF: 100.0}
    assert soak.quantile(0.5, buckets) == pytest.approx(0.001)
    assert soak.quantile(0.99, buckets) == pytest.approx(0.01 + 0.09 * 9 / 10)
    assert soak.quantile(0.7, buckets) == pytest.approx(0.001 + 0.009 * 20 / 40)
    assert soak.quantile(0.99, {0.1: 0.0, INF: 0.0}) is None  # nothing observed
    assert soak.quantile(0.99, {0.1: 10.0, INF: 20.0}) == 0.1  # in +Inf: the highest finite bound


def test_buckets_are_summed_over_apis_and_differenced_per_interval() -> None:
    before = histogram({"Produce": {0.01: 10.0, 0.1: 10.0, INF: 10.0},
                        "Fetch": {0.01: 0.0, 0.1: 5.0, INF: 5.0}})
    after = histogram({"Produce": {0.01: 110.0, 0.1: 110.0, INF: 110.0},
                       "Fetch": {0.01: 0.0, 0.1: 50.0, INF: 50.0},
                       "Metadata": {0.01: 0.0, 0.1: 100.0, INF: 100.0}})
    a = soak.latency_buckets(after, exclude=("Fetch",))
    assert a == {0.01: 110.0, 0.1: 210.0, INF: 210.0}
    d = soak.delta(a, soak.latency_buckets(before, exclude=("Fetch",)))
    assert d == {0.01: 100.0, 0.1: 200.0, INF: 200.0}
    assert soak.latency_buckets(after, only=("Fetch",)) == {0.01: 0.0, 0.1: 50.0, INF: 50.0}


def sample(t: float, rss_mb: float, fds: int, cpu_s: float, written_gib: float, requests: float) -> soak.Sample:
    b = {0.001: 0.0, 0.1: requests, INF: requests}  # every request so far took between 1 and 100 ms
    return soak.Sample(t=t, rss=int(rss_mb * soak.MIB), fds=fds, cpu_s=cpu_s, written=written_gib * soak.GIB,
                       requests=0.0, all_but_fetch=b, produce=b, fetch={0.1: 0.0, INF: 0.0})


def test_interval_line_gives_the_loop_threads_run_and_run_queue_wait_per_second() -> None:
    prev, cur = sample(60, 50, 20, 0.0, 0.0, 0.0), sample(120, 50, 20, 1.0, 0.0, 0.0)
    assert soak.interval_line(2, prev, cur)["loop_runq_wait_ms_per_s"] is None  # no schedstat: no figure
    prev.loop_sched, cur.loop_sched = (10_000_000, 5_000_000), (6_010_000_000, 12_005_000_000)
    line = soak.interval_line(2, prev, cur)
    assert line["loop_run_ms_per_s"] == 100.0 and line["loop_runq_wait_ms_per_s"] == 200.0


def test_loop_schedstat_reads_linux_fields_or_none() -> None:
    import os
    import sys

    own = soak.loop_schedstat(os.getpid())
    if sys.platform == "linux":  # schedstat is Linux's
        assert own is not None and own[0] > 0 and own[1] >= 0
    else:
        assert own is None
    assert soak.loop_schedstat(2**22 + 1) is None  # above Linux's pid_max: no such process


def test_summary_measures_growth_after_the_warm_up_interval() -> None:
    samples = [sample(0, 50, 20, 0.0, 0.0, 0.0), sample(60, 60, 25, 10.0, 0.5, 100.0),
               sample(120, 61, 25, 20.0, 1.0, 200.0), sample(180, 61.5, 26, 30.0, 1.5, 200.0)]
    out = soak.summary(samples, Delivery(duplicated=2))
    assert out["summary"] == "soak" and out["minutes"] == 3.0
    assert out["lost"] == 0 and out["duplicated"] == 2 and not out["correct"]  # the check travels with the figures
    failed = soak.summary(samples, Delivery(), ["ck producer: 3 records unacknowledged"])
    assert failed["errors"] == ["ck producer: 3 records unacknowledged"] and not failed["correct"]
    assert soak.summary(samples, Delivery())["correct"]
    assert out["rss_growth_mb"] == 1.5 and out["fd_growth"] == 1  # from the end of minute 1, not from the start
    assert out["cpu_s_per_gib"] == 20.0
    # the probe's added p99 is the worst minute's after the first, and a minute without it meets no goal
    assert out["probe_added_p99_ms_max_after_first"] is None
    for s, added in zip(samples[1:], (3.0, 0.2, 0.4), strict=True):
        s.probe = {"added_p99_ms": added}
    probed = soak.summary(samples, Delivery())
    assert probed["probe_added_p99_ms_max_after_first"] == 0.4
    assert probed["probe_bare_added_p99_ms_max_after_first"] is None  # a probe without the bare relay's path
    for s, added in zip(samples[1:], (2.0, 0.3, 0.1), strict=True):
        s.probe["bare_added_p99_ms"] = added
    assert soak.summary(samples, Delivery())["probe_bare_added_p99_ms_max_after_first"] == 0.3
    assert probed["goals"]["probe_added_p99_ms_max_after_first"] == "<= 0.5"
    # the probe's Produce: the broker's own tail and what Sluice added to it, worst minute after the first, no goals
    assert probed["probe_produce_direct_p99_ms_max_after_first"] is None  # no minute probed a Produce
    for s, (direct, added) in zip(samples[1:], ((9.0, 1.0), (6.5, 0.2), (4.0, 0.7)), strict=True):
        s.probe["produce"] = {"direct_p99_ms": direct, "added_p99_ms": added}
    produced = soak.summary(samples, Delivery())
    assert produced["probe_produce_direct_p99_ms_max_after_first"] == 6.5
    assert produced["probe_produce_added_p99_ms_max_after_first"] == 0.7
    assert "probe_produce_direct_p99_ms_max_after_first" not in produced["goals"]
    # the last interval saw no new observations at all: no p99 rather than a made-up one
    assert out["p99_ms_last_minute"] is None
    line = soak.interval_line(1, samples[0], samples[1])
    assert line["rss_mb"] == 60.0 and line["fds"] == 25 and line["cpu_s_per_gib"] == 20.0
    assert line["p99_ms"] == pytest.approx(1.0 + 99.0 * 99 / 100)  # 100 new ones, all in (1 ms, 100 ms]
    with pytest.raises(ValueError):
        soak.summary(samples[:1], Delivery())


def test_probe_figures_give_what_sluice_and_the_bare_relay_each_add_to_the_direct_path() -> None:
    # 100 samples a path, in seconds: the nearest-rank p50 is the 51st, the p99 and p999 the 100th
    direct = [0.001 + i * 1e-6 for i in range(100)]
    samples = {"sluice": [x + 0.0004 for x in direct], "bare": [x + 0.0001 for x in direct], "direct": direct}
    out = soak.probe_figures(samples)
    assert out["probes"] == 100
    assert (out["direct_p50_ms"], out["direct_p99_ms"]) == (1.05, 1.099)
    assert (out["added_p50_ms"], out["added_p99_ms"], out["added_p999_ms"]) == (0.4, 0.4, 0.4)
    assert (out["bare_added_p50_ms"], out["bare_added_p99_ms"], out["bare_added_p999_ms"]) == (0.1, 0.1, 0.1)
    # a probe of two paths (no bare relay) has no bare figures; fewer than 10 samples on a path, only the count
    assert not any(k.startswith("bare") for k in soak.probe_figures({"sluice": samples["sluice"], "direct": direct}))
    assert soak.probe_figures({"sluice": direct, "bare": direct[:9], "direct": direct}, "OSError: x") == \
        {"probes": 100, "error": "OSError: x"}


def test_storm_percentiles_are_nearest_rank() -> None:
    values = [float(v) for v in range(1, 201)]
    assert storm.percentiles(values) == {"p50": 100.0, "p90": 180.0, "p99": 198.0, "max": 200.0}
    assert storm.percentiles([]) == {}


def test_storm_upstream_setup_bounds_the_wait_and_splits_the_cpu() -> None:
    cold_clients = [{"api_versions": 100.0 + i} for i in range(100)]
    out = storm.upstream_setup(cold_clients, [10.0 + i / 10 for i in range(100)],
                               {"cold": 3.0, "warm_connect": 1.0, "warm_requests": 3.0})
    assert out["upstream_wait_bound_ms"] == {"p50": 14.9, "p90": 18.9, "p99": 19.8, "max": 19.9}
    assert out["upstream_wait_share_bound"]["p50"] == round(14.9 / 149.0, 3)
    assert out["sluice_cpu_ms_per_client"]["cold"] == 3.0
    assert out["connection_setup_cpu_share"] == 0.25


@pytest.mark.parametrize("answer", ["in order", "wrong correlation id", "closed"])
async def test_a_storm_client_counts_as_answered_only_with_every_answer_in_order(answer: str) -> None:
    """The storm's check: a client is answered when each request got its own answer (by correlation id); an
    answer to another request, or a connection closed early, leaves it unanswered."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        for correlation_id in (1, 2, 3):
            size = int.from_bytes(await reader.readexactly(4), "big")
            await reader.readexactly(size)
            if answer == "closed" and correlation_id == 2:
                break
            sent = 7 if answer == "wrong correlation id" and correlation_id == 3 else correlation_id
            writer.write((4).to_bytes(4, "big") + sent.to_bytes(4, "big"))
            await writer.drain()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        client = storm.Client(port, storm.frames("t", 0))
        await client.run(time.perf_counter(), connect=True)
        await client.close()
    finally:
        server.close()
        await server.wait_closed()
    assert client.answered == (answer == "in order")


def test_the_probes_produce_is_acks_all_to_partition_0_and_its_answer_is_checked() -> None:
    frame = soak._probe_produce_frame("t")
    assert struct.unpack(">i", frame[:4])[0] == len(frame) - 4
    header, body = decode_request(frame[4:])
    assert (header.request_api_key, header.request_api_version) == (0, soak.PROBE_PRODUCE_VERSION)
    assert body.acks == -1
    assert [(t.name, [p.index for p in t.partition_data]) for t in body.topic_data] == [("t", [0])]
    # its record is keyed for the consumers' check to leave out: no producer of the load acknowledged it
    assert [r.key for r in decode_batch(body.topic_data[0].partition_data[0].records).records] == [soak.PROBE_KEY]
    load = soak.Load.__new__(soak.Load)
    load.received = {"ck": []}
    load._record("ck", soak.PROBE_KEY, 0, 5)
    load._record("ck", b"ck-1", 0, 6)
    assert load.received == {"ck": [(0, 6, "ck-1")]}

    def answer(code: int) -> bytes:
        reply = response_codec(0, soak.PROBE_PRODUCE_VERSION).default().replace(responses=[
            Message(name="t", partition_responses=[Message(index=0, error_code=code, base_offset=7)])])
        return encode_response(0, soak.PROBE_PRODUCE_VERSION, Message(correlation_id=3), reply)

    assert soak._produce_refused(answer(0)) is None
    assert soak._produce_refused(answer(29)) == "Produce answered error codes [29]"  # TOPIC_AUTHORIZATION_FAILED
