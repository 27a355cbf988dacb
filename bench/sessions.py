"""Upstream offload of ``[sessions] mode = "terminate"``: clients idly polling many partitions, bytes per second
on the Sluice<->broker link and the proxy's CPU per client fetch, with and without Sluice's own fetch session.

``python -m bench.sessions [--partitions 1000] [--busy 3] [--seconds 10] [--clients confluent,kafka-python]
[--min-bytes 1] [--sharing]``

One rig broker, ``--partitions`` partitions (one topic, or topics of 5,000: KRaft refuses larger CreateTopics
batches); a background producer writes a small record to each of ``--busy`` partitions every 50 ms. Each client
of ``--clients`` is assigned every partition (from the end, no group) and polls for ``--seconds`` after a
warm-up, once per mode, each time through a fresh in-process Sluice:

- ``confluent``: confluent-kafka (librdkafka), session-less: every fetch lists every partition;
- ``kafka-python``: uses fetch sessions itself (KIP-227); in terminate mode Sluice serves its session and runs
  its own, independent session upstream.

Modes:

- ``direct``: Sluice in passthrough mode. It relays Fetch requests and responses byte for byte (the stream
  path), so its upstream bytes (``sluice_bytes_total{direction="proxy_to_upstream"|"upstream_to_proxy"}``) are
  exactly what the same client exchanges with the broker directly;
- ``terminate``: Sluice in terminate mode; the upstream bytes are what the Sluice<->broker link carries.

Bytes and records are counted over the measured window only: after the warm-up (at least ``--warmup`` seconds, 5
Fetch requests, so it includes the first, full fetch, every assigned partition's position known and a record of
every busy partition got: the client fetches steadily).
The proxy's CPU is its event-loop thread's CPU time (``time.thread_time()`` read on that thread: the clients
run in this process too, so process CPU would count them) per client Fetch request.

JSON lines: one per (client, mode); per client ``{"bench": "sessions", "client": ..., "partitions": ...,
"upstream_bytes_per_fetch_ratio": ..., "upstream_bytes_per_record_ratio": ..., "upstream_bytes_per_s_ratio": ...,
"records_per_fetch_ratio": ..., "upstream_over_client_bytes_terminate": ..., "cpu_ms_per_fetch_direct": ...,
"cpu_ms_per_fetch_terminate": ...}`` (:func:`fetch_split`: each mode's line has its bytes per fetch, upstream
requests and responses apart, its records per fetch and its upstream over client link bytes); last line, whatever
the clients,
``{"summary": "sessions", "partitions": ..., "upstream_bytes_per_fetch_ratio": {client: ...},
"upstream_bytes_per_record_ratio": {client: ...}, "cpu_ms_per_fetch_terminate": {client: ...}, "by_run": {...},
"goals", "met", "lost", "duplicated", "out_of_order", "unexpected", "errors", "correct"}`` (bench/support/verdict.py).
The headline ratios are terminate mode's upstream bytes (requests + responses) over direct mode's, per client fetch
and per record delivered: what a user's link carries for the same work. Bytes per second are only in the client
lines: a client's fetch rate depends on its own speed, which differs between runs, so a slower client would
"improve" them. The check, per client and mode (``by_run``), by offset against the offsets the broker acknowledged
to the producer: each busy partition's records from the first the client got to the last, each once, in order (a
busy partition it got nothing of loses every record written to it); the exit status is 1 otherwise. Goals (at
10,000 partitions; ``--check`` exits 1 when one is missed): in terminate mode the session-less client costs at most
3 ms of proxy CPU per fetch and carries at most 0.1% of direct's upstream bytes per fetch, the client with its own
sessions no more than direct. ``--smoke``: 100 partitions, 2 busy, 2 s per mode.

``--sharing``: cooperative consumption enabled in both modes for topics other than the bench's (bench.sharing's
``no-sharing`` configuration): with ``--partitions 3 --busy 3``, every fetch a small answer of a record or two,
the CPU per fetch a caught-up consumer of a low-rate topic costs when sharing is configured but not applied.

``--min-bytes`` sets the clients' fetch min bytes (``fetch.min.bytes`` / ``fetch_min_bytes``, default 1). Set
above what the busy partitions write in ``fetch.wait.max.ms`` (500 ms), every fetch waits its full 500 ms in both
modes: the clients then fetch at one pace whoever answers them, and bytes per second compare the same work.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from confluent_kafka import Consumer, KafkaError, Message, Producer, TopicPartition
from kafka import KafkaConsumer
from kafka import TopicPartition as KafkaTopicPartition

from bench.support.verdict import Delivery, add_options, at_most, delivery, emit, exit_status, summary
from proxy import metrics
from proxy.accesslog import configure_logging
from proxy.config import LoggingSettings
from rig.kafka import KafkaBroker
from rig.proxy_thread import ProxyThread
from rig.topics import create_topic

#: for 10,000 mostly idle partitions, in terminate mode: a session-less client (librdkafka) costs at most 3 ms of
#: proxy CPU per fetch and its upstream link carries at most 0.1% of the bytes direct; a client with sessions of
#: its own (kafka-python) carries no more than direct
GOALS = {"cpu_ms_per_fetch_terminate.confluent": at_most(3.0),
         "upstream_bytes_per_fetch_ratio.confluent": at_most(0.001),
         "upstream_bytes_per_fetch_ratio.kafka-python": at_most(1.0)}


def snapshot(sluice: ProxyThread) -> dict[str, float]:
    out: dict[str, float] = {d: sluice.total("sluice_bytes_total", direction=d) for d in metrics.DIRECTIONS}
    out["fetches"] = sluice.total("sluice_requests_total", api="Fetch")
    out["full"] = sluice.total("sluice_upstream_fetch_requests_total", kind="full")
    out["incremental"] = sluice.total("sluice_upstream_fetch_requests_total", kind="incremental")
    return out


class Traffic:
    """A few busy partitions: one small record each every ``period`` seconds until stopped; the offsets the broker
    acknowledged, per partition."""

    def __init__(self, bootstrap: str, topic: str, partitions: list[int], period: float = 0.05) -> None:
        self.topic = topic
        self.acked: dict[int, list[int]] = {p: [] for p in partitions}
        self.failed: list[str] = []
        self._stop = threading.Event()
        self._producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0, "enable.idempotence": True})
        self._thread = threading.Thread(target=self._run, args=(topic, partitions, period), daemon=True)
        self._thread.start()

    def _run(self, topic: str, partitions: list[int], period: float) -> None:
        i = 0
        while not self._stop.wait(period):  # a producer's pace, not synchronisation
            for p in partitions:
                self._producer.produce(topic, value=f"v{i}".encode(), partition=p, on_delivery=self._delivered)
            self._producer.poll(0)
            i += 1

    def _delivered(self, err: KafkaError | None, msg: Message) -> None:
        partition, offset = msg.partition(), msg.offset()
        if err is not None or partition is None or offset is None:
            self.failed.append(str(err))
        else:
            self.acked[partition].append(offset)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)
        if left := self._producer.flush(10):
            self.failed.append(f"{left} records unacknowledged")

    def check(self, received: list[tuple[str, int, int]]) -> Delivery:
        return busy_check(self.topic, self.acked, received)


def busy_check(topic: str, acked: Mapping[int, list[int]], received: list[tuple[str, int, int]]) -> Delivery:
    """What a client got of the busy partitions' records (``acked``: the offsets the broker acknowledged per busy
    partition of ``topic``), by offset: from the first offset it got of each busy partition to the last, every
    acknowledged record once, in order (it starts at the end and stops somewhere in the stream); a busy partition
    it got nothing of loses every record acknowledged to it; a record of any other partition is unexpected (only
    the busy ones are written)."""
    got: dict[int, list[int]] = {}
    for t, partition, offset in received:
        got.setdefault(partition if t == topic else -1, []).append(offset)
    sent = {}
    for p, offsets in acked.items():
        mine = got.get(p, [])
        sent[p] = [o for o in sorted(offsets) if min(mine) <= o <= max(mine)] if mine else sorted(offsets)
    return delivery(sent, got)


async def _loop_thread_cpu() -> float:
    # A coroutine so that it runs on the proxy's loop thread: thread_time() is that thread's CPU (ns resolution,
    # unlike the clock ticks /proc reports per thread).
    return time.thread_time()


def proxy_cpu(sluice: ProxyThread) -> float:
    """CPU seconds the proxy's event-loop thread has used so far."""
    return sluice.call(_loop_thread_cpu())


class Client(Protocol):
    #: (topic, partition, offset) of every record handed over, in order
    received: list[tuple[str, int, int]]

    def poll(self) -> int:
        """Poll for up to ~0.1 s; the number of records received."""

    def positioned(self) -> bool:
        """Every assigned partition has a position: no offset lookup is left, the client fetches them all."""

    def close(self) -> None: ...


class ConfluentClient:
    """confluent-kafka: session-less, every fetch lists every assigned partition."""

    def __init__(self, bootstrap: str, topics: list[tuple[str, int]], mode: str, min_bytes: int) -> None:
        self._assigned = sum(n for _, n in topics)
        self._fetching = 0  # partitions librdkafka's last statistics called "active" (fetching, offset known)
        # group.id only because confluent-kafka's Consumer insists; assign() uses no group
        self._consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-{mode}",
                                   "enable.auto.commit": False, "fetch.wait.max.ms": 500,
                                   "fetch.min.bytes": min_bytes, "statistics.interval.ms": 1000,
                                   "stats_cb": self._statistics})
        self._consumer.assign([TopicPartition(t, p, -1) for t, n in topics for p in range(n)])  # -1: from the end
        self.received: list[tuple[str, int, int]] = []

    def _statistics(self, raw: str) -> None:
        # librdkafka's statistics (its STATISTICS.md): each partition's fetch_state, "active" once its offset is
        # known and it is fetched. Counted in the text: a JSON parse of 10,000 partitions' entries each second
        # would hold the GIL the in-process Sluice's loop needs.
        self._fetching = raw.count('"fetch_state":"active"')

    def positioned(self) -> bool:
        # Not position(): librdkafka's is the application's (the offset after the last record consumed), unset for
        # a partition it has handed nothing of. At 10,000 partitions assigned at the end, librdkafka spends its
        # first ~30 s or more on offset lookups (seen: ~550 ListOffsets and ~370 Metadata requests a second, 48
        # MB/s of responses, straight to the broker as through Sluice), adding partitions to its fetches as they
        # resolve.
        return self._fetching >= self._assigned

    def poll(self) -> int:
        m = self._consumer.poll(0.1)
        if m is None or m.error():
            return 0
        self.received.append((m.topic() or "", m.partition() or 0, m.offset() or 0))
        return 1

    def close(self) -> None:
        self._consumer.close()


class KafkaPythonClient:
    """kafka-python: opens a fetch session per broker and sends incremental fetches."""

    def __init__(self, bootstrap: str, topics: list[tuple[str, int]], mode: str, min_bytes: int) -> None:
        # one client id in both modes: it is in every request's header, and "terminate" is three bytes longer than
        # "direct" (of ~200 a request: 0.3 % of the upstream bytes per fetch the modes are compared by)
        self._consumer = KafkaConsumer(bootstrap_servers=bootstrap, client_id="bench-kafka-python",
                                       group_id=None, enable_auto_commit=False, fetch_max_wait_ms=500,
                                       fetch_min_bytes=min_bytes)
        self._consumer.assign([KafkaTopicPartition(t, p) for t, n in topics for p in range(n)])
        self._consumer.seek_to_end()  # lazy: the offsets are looked up on the first polls (the warm-up)
        self.received: list[tuple[str, int, int]] = []

    def positioned(self) -> bool:
        return bool(self._consumer._subscription.has_all_fetch_positions())  # no public call says it

    def poll(self) -> int:
        n = 0
        for tp, msgs in self._consumer.poll(timeout_ms=100).items():
            self.received += [(tp.topic, tp.partition, m.offset) for m in msgs]
            n += len(msgs)
        return n

    def close(self) -> None:
        self._consumer.close()


CLIENTS: dict[str, Callable[[str, list[tuple[str, int]], str, int], Client]] = {
    "confluent": ConfluentClient, "kafka-python": KafkaPythonClient}


PER_TOPIC = 5000
MAX_WARMUP_S = 300.0
WARM_FETCHES = 5


def layout(prefix: str, partitions: int) -> list[tuple[str, int]]:
    """(topic, partition count) covering ``partitions`` partitions."""
    return [(f"{prefix}-{i}", min(PER_TOPIC, partitions - i * PER_TOPIC))
            for i in range((partitions + PER_TOPIC - 1) // PER_TOPIC)]


#: ``--sharing``: cooperative consumption on for topics other than the bench's (bench.sharing's ``no-sharing``),
#: a client no group names let through at once (sharing.member_wait_s)
SHARING_ELSEWHERE = {"sharing.enabled": True, "sharing.topics": [{"topic": "bench-sharing-*"}],
                     "sharing.member_wait_s": 0.001}


def run_mode(client_name: str, mode: str, broker: KafkaBroker, topics: list[tuple[str, int]], partitions: int,
             warmup: float, seconds: float, min_bytes: int, busy: tuple[str, Sequence[int]],
             overrides: Mapping[str, Any] | None = None) -> tuple[dict[str, Any], list[tuple[str, int, int]]]:
    """The mode's line, and the records the client got (checked once the producer has stopped: every record it
    got has been acknowledged by then). ``busy``: the topic and partitions the producer writes."""
    with ProxyThread(broker.bootstrap, **{"sessions.mode": "terminate" if mode == "terminate" else "passthrough"},
                     **(overrides or {})) as sluice:
        client: Client = CLIENTS[client_name](sluice.bootstrap, topics, mode, min_bytes)
        try:
            # warm-up: at least ``warmup`` seconds and until the client fetches steadily, bounded. With 10,000
            # partitions a client first spends a while on metadata and offset lookups, adding partitions to its
            # fetches as their positions come (some ListOffsets answered NOT_LEADER_OR_FOLLOWER while new
            # partitions get leaders), so "steadily" is once every partition has a position and it has had a record
            # of every busy partition (seen: kafka-python with --min-bytes above the traffic, each fetch 500 ms,
            # still resetting offsets in the measured window, fetch requests of ~26-59 KB against ~20 bytes once
            # steady, and nothing of one busy partition)
            start, fetches0 = time.monotonic(), sluice.total("sluice_requests_total", api="Fetch")
            topic, wanted = busy
            while time.monotonic() - start < MAX_WARMUP_S and (
                    time.monotonic() - start < warmup
                    or sluice.total("sluice_requests_total", api="Fetch") - fetches0 < WARM_FETCHES
                    or not client.positioned()
                    # last: it reads every record received so far, so only once the rest holds
                    or not set(wanted) <= {p for t, p, _ in client.received if t == topic}):
                client.poll()
            before, cpu0, t0 = snapshot(sluice), proxy_cpu(sluice), time.monotonic()
            records = 0  # the window's only: its bytes are divided by them
            end = t0 + seconds
            while time.monotonic() < end:
                records += client.poll()
            after, cpu1, t1 = snapshot(sluice), proxy_cpu(sluice), time.monotonic()
        finally:
            client.close()
    d = {k: after[k] - before[k] for k in after}
    span = t1 - t0
    fetches = max(d["fetches"], 1.0)
    line = {"bench": "sessions", "client": client_name, "mode": mode, "partitions": partitions, "min_bytes": min_bytes,
            "seconds": round(span, 2), "fetches": int(d["fetches"]), "records": records,
            "upstream_bytes_per_s": round((d["proxy_to_upstream"] + d["upstream_to_proxy"]) / span),
            "upstream_request_bytes_per_s": round(d["proxy_to_upstream"] / span),
            "upstream_response_bytes_per_s": round(d["upstream_to_proxy"] / span),
            "client_bytes_per_s": round((d["client_to_proxy"] + d["proxy_to_client"]) / span),
            **fetch_split(d, records),
            "upstream_full_fetches": int(d["full"]), "upstream_incremental_fetches": int(d["incremental"]),
            "proxy_cpu_ms_per_fetch": round((cpu1 - cpu0) * 1000 / fetches, 3)}
    emit(line)
    return line, client.received


def fetch_split(d: Mapping[str, float], records: int) -> dict[str, float]:
    """Per client fetch of one window (``d``: snapshot differences): the upstream request and response bytes and
    the records delivered, and the upstream link's bytes over the client link's.

    A session client's fetch costs what it carries: its request lists the partitions whose offset moved, its
    response the partitions with news, with their records. A client that fetches less often gets more records,
    on more partitions, per fetch, and its fetch rate is its own: at 1,000 partitions kafka-python's fetches
    varied by up to 18 % between 10-second windows of one mode in one run, with Sluice in this process or in
    its own (18 windows, the modes interleaved), and one line, ~111 bytes + ~140 per record delivered, gave both
    modes' bytes per fetch (mean residuals +0.2 direct, -0.4 terminate, of ~400). The link ratio in terminate
    mode compares the same fetches: Sluice's own session upstream against the session it serves the client (1.0
    when the upstream carries what the client's session would cost it at that pace)."""
    fetches = max(d["fetches"], 1.0)
    client = d["client_to_proxy"] + d["proxy_to_client"]
    return {"upstream_request_bytes_per_fetch": round(d["proxy_to_upstream"] / fetches, 1),
            "upstream_response_bytes_per_fetch": round(d["upstream_to_proxy"] / fetches, 1),
            "records_per_fetch": round(records / fetches, 3),
            "upstream_over_client_bytes": round((d["proxy_to_upstream"] + d["upstream_to_proxy"]) / max(client, 1.0),
                                                4)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--partitions", type=int, default=1000)
    ap.add_argument("--busy", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--warmup", type=float, default=5.0)
    ap.add_argument("--min-bytes", type=int, default=1, help="the clients' fetch min bytes (see the docstring)")
    ap.add_argument("--clients", default="confluent,kafka-python",
                    help=f"comma-separated, of: {', '.join(CLIENTS)}")
    ap.add_argument("--sharing", action="store_true",
                    help="cooperative consumption on for other topics: what the clients' fetches cost Sluice when "
                         "sharing is configured but not applied to them")
    add_options(ap, "100 partitions, 2 busy, 2 s per mode after a 1 s warm-up")
    args = ap.parse_args(argv)
    if args.smoke:
        args.partitions, args.busy, args.seconds, args.warmup = 100, 2, 2.0, 1.0
    clients = [c.strip() for c in args.clients.split(",") if c.strip()]
    if unknown := [c for c in clients if c not in CLIENTS]:
        ap.error(f"unknown client(s) {', '.join(unknown)}; known: {', '.join(CLIENTS)}")
    # stdout carries only the JSON lines: the in-process Sluice's operational log goes to stderr
    configure_logging(LoggingSettings(level="warning", access_log="off"))
    with KafkaBroker() as broker:
        topics = layout(f"sessions-bench-{args.partitions}", args.partitions)
        for topic, n in topics:
            # up to PER_TOPIC partitions a topic, on one broker: creating them can take minutes on a loaded machine
            create_topic(broker.bootstrap, topic, partitions=n, timeout=300.0)
        first, first_n = topics[0]
        busy = [p * (first_n // max(args.busy, 1)) for p in range(args.busy)]
        traffic = Traffic(broker.bootstrap, first, busy)
        per_fetch: dict[str, float] = {}
        per_record: dict[str, float] = {}
        cpu: dict[str, float] = {}
        received: dict[str, list[tuple[str, int, int]]] = {}
        try:
            for name in clients:
                overrides = SHARING_ELSEWHERE if args.sharing else None
                direct, received[f"{name}/direct"] = run_mode(name, "direct", broker, topics, args.partitions,
                                                              args.warmup, args.seconds, args.min_bytes, (first, busy),
                                                              overrides)
                term, received[f"{name}/terminate"] = run_mode(name, "terminate", broker, topics, args.partitions,
                                                               args.warmup, args.seconds, args.min_bytes, (first, busy),
                                                               overrides)
                # Per client fetch and per record delivered: a client's fetch rate (and so its bytes/s) depends
                # on how fast it processes responses, which differs between the runs (kafka-python at 10,000
                # partitions is CPU-bound in itself); bytes per fetch and per record compare the same work.
                per_fetch[name] = _per(term, "fetches") / max(_per(direct, "fetches"), 1)
                per_record[name] = _per(term, "records") / max(_per(direct, "records"), 1)
                cpu[name] = term["proxy_cpu_ms_per_fetch"]
                emit({"bench": "sessions", "client": name, "partitions": args.partitions, "min_bytes": args.min_bytes,
                      "upstream_bytes_per_fetch_ratio": round(per_fetch[name], 4),
                      "upstream_bytes_per_record_ratio": round(per_record[name], 4),
                      "upstream_bytes_per_s_ratio": round(
                          term["upstream_bytes_per_s"] / max(direct["upstream_bytes_per_s"], 1), 4),
                      "records_per_fetch_ratio": round(
                          term["records_per_fetch"] / max(direct["records_per_fetch"], 0.001), 4),
                      "upstream_over_client_bytes_terminate": term["upstream_over_client_bytes"],
                      "cpu_ms_per_fetch_direct": direct["proxy_cpu_ms_per_fetch"],
                      "cpu_ms_per_fetch_terminate": term["proxy_cpu_ms_per_fetch"]})
        finally:
            traffic.stop()
    checks = {run: traffic.check(got) for run, got in received.items()}
    line = summary("sessions", {
        "partitions": args.partitions, "sharing": args.sharing,
        "upstream_bytes_per_fetch_ratio": {k: round(v, 4) for k, v in per_fetch.items()},
        "upstream_bytes_per_record_ratio": {k: round(v, 4) for k, v in per_record.items()},
        "cpu_ms_per_fetch_terminate": cpu, "by_run": {run: c.fields() for run, c in checks.items()}},
        {goal: target for goal, target in GOALS.items() if goal.rpartition(".")[2] in clients},
        check=sum(checks.values(), Delivery()), errors=[f"producer: {e}" for e in traffic.failed])
    emit(line)
    return exit_status(line, args.check)


def _per(line: dict[str, Any], what: str) -> float:
    """Upstream bytes per ``what`` (client fetches, records delivered) of one mode's line."""
    return float(line["upstream_bytes_per_s"] * line["seconds"] / max(line[what], 1))


if __name__ == "__main__":
    sys.exit(main())
