"""Memory under load: peak RSS of Sluice while 50 concurrent consumers drain a backlog, with and without a
1 MiB budget and the global response-memory bound (KIP-74 policy, proxy/policies/size_limit/).

``python -m bench.size_limit [--consumers 50] [--mib 32] [--bound-mib 16]``

One rig broker, one topic (8 partitions, ``--mib`` MiB of 10 KiB records produced once, directly). For each
configuration a fresh Sluice subprocess starts, its idle RSS is the base, then ``--consumers`` raw consumers
(asyncio, one connection each, session-less Fetch v12 asking for up to 50 MiB per response and 10 MiB per
partition — greedy on purpose) each drain the whole topic through it, while psutil samples Sluice's RSS every
20 ms. Configurations:

- ``nobudget``: no budget, Fetch responses stream through (what Sluice holds is bounded by the per-connection
  write high-water mark);
- ``budget``: every client has a 1 MiB budget (responses are collected, trimmed, re-encoded) and
  ``global_max_bytes`` = ``--bound-mib`` MiB bounds the response bytes held at once.

JSON lines per configuration; last line
``{"summary": "size_limit", "base_rss_mb": ..., "global_bound_mb": ..., "peak_rss_budget_mb": ...,
"peak_rss_nobudget_mb": ..., "peak_rss_budget_over_base_mb": ..., "goals", "met", "lost", "out_of_order", ...,
"consumers_same_bytes", "correct"}`` (bench/support/verdict.py). Goal (``met``): peak_rss_budget_over_base_mb <=
1.5 x global_bound_mb. Its check: every consumer read every record once, in order (each batch starts where its
partition's previous one ended: ``out_of_order``; every partition read to its end offset: ``lost``; every consumer
received the same bytes: ``consumers_same_bytes``). The exit status is 1 when the check fails; with ``--check``,
also when the goal is not met. ``--smoke``: 5 consumers, a 4 MiB backlog, a 2 MiB bound.
"""

from __future__ import annotations

import argparse
import asyncio
import struct
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psutil
from kafka import KafkaProducer

from bench.support.verdict import Delivery, add_options, at_most, emit, exit_status, summary
from proxy.wire.fetch_fast import decode_frame
from proxy.wire.messages import encode_request, request_codec
from proxy.wire.model import Message
from proxy.wire.records import walk_batches
from rig.kafka import KafkaBroker, end_offsets
from rig.sluice_process import SluiceProcess
from rig.topics import create_topic

PARTITIONS = 8
RECORD = 10 * 1024
MB = 1e6
DRAIN_S = 300.0  # a consumer's bound on draining the backlog: what it has not read by then is lost


def produce(bootstrap: str, topic: str, mib: int) -> None:
    create_topic(bootstrap, topic, partitions=PARTITIONS)
    producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=5, batch_size=256 * 1024, acks=1)
    payload = b"r" * RECORD
    for i in range(mib * (1 << 20) // RECORD):
        producer.send(topic, value=payload, partition=i % PARTITIONS)
    producer.flush(120)
    producer.close()


def fetch_frame(topic: str, offsets: dict[int, int], corr: int, client_id: str) -> bytes:
    body = request_codec(1, 12).default().replace(
        replica_id=-1, max_wait_ms=100, min_bytes=1, max_bytes=50 << 20, isolation_level=0, session_id=0,
        session_epoch=-1, forgotten_topics_data=[], rack_id="",
        topics=[Message(topic=topic, partitions=[
            Message(partition=p, current_leader_epoch=-1, fetch_offset=o, last_fetched_epoch=-1,
                    log_start_offset=-1, partition_max_bytes=10 << 20) for p, o in offsets.items()])])
    header = Message(request_api_key=1, request_api_version=12, correlation_id=corr, client_id=client_id)
    frame = encode_request(header, body)
    return struct.pack(">i", len(frame)) + frame


async def drain(port: int, topic: str, ends: dict[int, int], n: int, deadline_s: float = DRAIN_S
                ) -> tuple[int, Delivery]:
    """One consumer: fetch until every partition reaches its end offset (or the deadline passes); returns the
    record bytes received and what it got of the records: the batches that did not start where the partition's
    previous one ended (a gap or a repeat: ``out_of_order``), the records never reached (``lost``)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    offsets = dict.fromkeys(ends, 0)
    got = corr = out_of_order = 0
    deadline = time.monotonic() + deadline_s
    try:
        while any(offsets[p] < ends[p] for p in ends) and time.monotonic() < deadline:
            corr += 1
            writer.write(fetch_frame(topic, {p: o for p, o in offsets.items() if o < ends[p]}, corr, f"c{n}"))
            size = struct.unpack(">i", await reader.readexactly(4))[0]
            view = decode_frame(await reader.readexactly(size), 12)[2]
            for _, part in view.partitions():
                for batch in walk_batches(part.records or b"").batches:
                    out_of_order += batch.base_offset != offsets[part.partition_index]
                    offsets[part.partition_index] = batch.next_offset
                    got += batch.size
    finally:
        writer.close()
    return got, Delivery(lost=sum(max(0, ends[p] - offsets[p]) for p in ends), out_of_order=out_of_order)


class RssSampler:
    def __init__(self, pid: int) -> None:
        self.proc = psutil.Process(pid)
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self.proc.memory_info().rss)
            self._stop.wait(0.02)

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)


def run_config(name: str, broker: KafkaBroker, topic: str, ends: dict[int, int], consumers: int,
               config: str) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "sluice.toml"
        path.write_text(config)
        with SluiceProcess(broker.bootstrap, extra_env={"SLUICE_CONFIG": str(path)}) as sluice:
            base = psutil.Process(sluice.pid).memory_info().rss
            t0 = time.monotonic()
            with RssSampler(sluice.pid) as sampler:

                async def all_consumers() -> list[tuple[int, Delivery]]:
                    return await asyncio.gather(*(drain(sluice.bootstrap_port, topic, ends, n)
                                                  for n in range(consumers)))

                drained = asyncio.run(all_consumers())
            elapsed = time.monotonic() - t0
            received = [got for got, _ in drained]
            line = {"bench": "size_limit", "config": name, "consumers": consumers,
                    "base_rss_mb": round(base / MB, 1), "peak_rss_mb": round(sampler.peak / MB, 1),
                    "relayed_mb": round(sum(received) / MB, 1), "elapsed_s": round(elapsed, 2),
                    "mb_per_s": round(sum(received) / MB / elapsed, 1),
                    # every consumer read every record once, in order: no batch out of place, the same bytes
                    **sum((d for _, d in drained), Delivery()).fields(),
                    "consumers_differing": len(set(received)) - 1,
                    "waits": sluice.metric("sluice_response_memory_waits_total"),
                    "trimmed_mb": round(sluice.metric("sluice_size_limit_trimmed_bytes_total") / MB, 1)}
            emit(line)
            return line


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--consumers", type=int, default=50)
    ap.add_argument("--mib", type=int, default=32, help="backlog size")
    ap.add_argument("--bound-mib", type=int, default=16, help="size_limit.global_max_bytes, MiB")
    add_options(ap, "5 consumers, a 4 MiB backlog, a 2 MiB bound")
    args = ap.parse_args(argv)
    if args.smoke:
        args.consumers, args.mib, args.bound_mib = 5, 4, 2
    bound = args.bound_mib << 20
    with KafkaBroker() as broker:
        topic = f"bench-size-limit-{int(time.time())}"
        produce(broker.bootstrap, topic, args.mib)
        ends = end_offsets(broker.bootstrap, topic)
        nobudget = run_config("nobudget", broker, topic, ends, args.consumers, "")
        budget = run_config("budget", broker, topic, ends, args.consumers, (
            f"[size_limit]\nglobal_max_bytes = {bound}\n"
            '[[size_limit.budgets]]\nclient_id = "*"\nfetch_max_bytes = 1048576\n'))
    base = min(nobudget["base_rss_mb"], budget["base_rss_mb"])
    check = sum((Delivery(**{k: line[k] for k in Delivery().fields()}) for line in (nobudget, budget)), Delivery())
    line = summary("size_limit", {
        "base_rss_mb": base, "global_bound_mb": round(bound / MB, 1), "peak_rss_budget_mb": budget["peak_rss_mb"],
        "peak_rss_nobudget_mb": nobudget["peak_rss_mb"],
        "peak_rss_budget_over_base_mb": round(budget["peak_rss_mb"] - base, 1)},
        {"peak_rss_budget_over_base_mb": at_most(round(1.5 * bound / MB, 1))}, check=check,
        checks={"consumers_same_bytes": not (nobudget["consumers_differing"] or budget["consumers_differing"])})
    emit(line)
    return exit_status(line, args.check)


if __name__ == "__main__":
    sys.exit(main())
