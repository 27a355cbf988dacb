"""A replica move throttled by Sluice (KIP-73, replication through a Sluice sidecar per broker) against the time
``sluice throttle plan`` predicts and against Kafka's own throttle, in one run.

``python -m bench.reassign [--mb 200] [--throttle 10MB] [--live-rate 1MB]
[--modes unthrottled,sluice-leader,sluice-follower,kafka,sluice-change] [--fleet]``

``--fleet``: the sidecars are one fleet (proxy/fleet/) and every throttle change is one ``PUT
/throttles`` on broker 3's sidecar (not on the move's path): the change goes through the fleet's control topic
and the bench waits until every sidecar applied its revision; the move is throttled at broker 1's sidecar as
without it. The summary says ``"fleet": true``.

Setup: the rig's KRaft cluster (rig/cluster.py: 3 brokers, one controller, brokers at -Xmx512m), each broker's
REPLICATION listener (``inter.broker.listener.name``) advertised at a Sluice sidecar in front of it, so a follower
fetches from a leader through the leader's sidecar. For each mode, a new one-partition topic on broker 1 holding
``--mb`` MB (10 kB records, produced straight to broker 1) is moved from [1] to [1, 2] with
``kafka-reassign-partitions --execute`` from the jars; the move is timed from the tool's return (the reassignment
is with the controller) until broker 2 is in the partition's ISR (polled every 0.1 s). The bytes moved are the
partition's log segments on broker 1.

Modes:

- ``unthrottled``: through the sidecars, no throttle (how fast this machine moves it);
- ``sluice-leader``: broker 1's sidecar with ``leader_rate_bytes`` = ``--throttle`` on the topic's replica "0:2"
  (``PUT /throttles``);
- ``sluice-follower``: the same sidecar with ``follower_rate_bytes`` instead (broker 2's fetches from broker 1 all
  pass through it);
- ``kafka``: no Sluice throttle; Kafka's own, ``--throttle`` on the reassignment (leader and follower side);
- ``sluice-change``: the leader throttle, raised to twice ``--throttle`` once half the bytes have moved (a live
  ``PUT /throttles``): the per-second rate before and after the change shows from when it applies.

The plan is KIP-73's (``sluice throttle plan``, proxy/policies/throttle/sizing.py): bytes / (throttle - inbound);
nothing is produced to the moving topic, so inbound is 0. Each throttled move starts with its quota's history idle
(Kafka's SimpleRate over 11 x 1 s windows: bytes recorded within the last 11 s would let the next move run ahead
of the throttle until the rate is reached again; the same holds for Kafka's quota), so the bench waits until
the sidecar measures 0 B/s before each move.

Meanwhile a live topic on broker 1 gets ``--live-rate`` bytes/s from a producer, and a kafka-python consumer reads
it from its beginning through broker 1's sidecar (the same Sluice that throttles the move; consumers are not
throttled): its rate during each move against the producer's says whether the move took from the client.

JSON lines: one per mode ``{"bench": "reassign", "mode", "bytes", "throttle_bps", "plan_s", "move_s",
"move_vs_plan", "left_out", "throttled_bytes", "replica_bytes", "consumer_bps", "producer_bps"}`` (``sluice-change``:
also ``rate_before_bps``, ``rate_after_bps``, per second ``rates``); last line ``{"summary": "reassign",
"move_vs_plan": {"leader", "follower"}, "move_vs_kafka_throttle": {"leader", "follower"}, "consumer_vs_producer",
"cpus", "load_1m_at_start", "move_vs_plan_worst_error", "goals", "met", "lost", ..., "every_replica_whole",
"every_byte_counted", "correct"}`` (bench/support/verdict.py). The checks: each move left the new replica holding
the leader's whole log (``replica_bytes``); each move a Sluice throttle carried had its bytes all metered by that
throttle (``every_byte_counted``, present when one ran); the live consumer got every record acknowledged, once, in
order (by offset). The exit status is 1 otherwise. Goal: each side's move within 10% of the plan
(``move_vs_plan_worst_error`` <= 0.1; ``--check`` exits 1 when it is missed). ``--smoke``: 10 MB moved by the
Sluice leader throttle alone. The machine may be shared
(the cluster, the sidecars, the clients and the bench itself, and other work: ``cpus`` and the load average at the
start are measured); the unthrottled move says how much headroom it had.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from bench.support.verdict import Delivery, add_options, at_most, delivery, emit, exit_status, summary
from proxy.cli_throttle import parse_size
from proxy.policies.throttle.sizing import move_time_s
from rig.cluster import KafkaCluster
from rig.fleet import admin_json, fleet_env
from rig.java_tools import JavaTools
from rig.reassign import create_on, fill, log_bytes, put_throttles, reassign, verify, wait_in_sync
from rig.sluice_process import SluiceProcess

MODES = ("unthrottled", "sluice-leader", "sluice-follower", "kafka", "sluice-change")


class Live:
    """A producer at a fixed byte rate (straight to broker 1) and a consumer through broker 1's sidecar reading the
    topic from its beginning, both in threads; each keeps (time, bytes) per record batch it handled, and the
    offsets acknowledged and consumed (the check)."""

    def __init__(self, producer_bootstrap: str, consumer_bootstrap: str, topic: str, rate: int) -> None:
        self.produced: list[tuple[float, int]] = []
        self.consumed: list[tuple[float, int]] = []
        self.acked: list[int] = []  # offsets, as the broker acknowledged them (one partition)
        self.received: list[int] = []  # offsets, in the order the consumer got them
        self.failed: list[str] = []
        self._stop = threading.Event()
        self._stop_consuming = threading.Event()
        self._threads = [threading.Thread(target=self._produce, args=(producer_bootstrap, topic, rate), daemon=True),
                         threading.Thread(target=self._consume, args=(consumer_bootstrap, topic), daemon=True)]
        for t in self._threads:
            t.start()

    def _produce(self, bootstrap: str, topic: str, rate: int) -> None:
        from confluent_kafka import KafkaError, Message, Producer

        producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "client.id": "bench-reassign-live",
                             "enable.idempotence": True})
        value = b"x" * 10_000

        def delivered(err: KafkaError | None, msg: Message) -> None:
            offset = msg.offset()
            if err is not None or offset is None:
                self.failed.append(f"live producer: {err}")
            else:
                self.acked.append(offset)

        start, sent = time.monotonic(), 0
        while not self._stop.is_set():
            producer.produce(topic, value, on_delivery=delivered)
            producer.poll(0)
            sent += len(value)
            self.produced.append((time.monotonic(), len(value)))
            # pacing: the next record is due when the rate allows it (a produce rate, not a synchronisation)
            self._stop.wait(max(0.0, start + sent / rate - time.monotonic()))
        if left := producer.flush(10):
            self.failed.append(f"live producer: {left} records unacknowledged")

    def _consume(self, bootstrap: str, topic: str) -> None:
        from kafka import KafkaConsumer

        consumer = KafkaConsumer(topic, bootstrap_servers=bootstrap, client_id="bench-reassign-live-consumer",
                                 auto_offset_reset="earliest", enable_auto_commit=False, fetch_max_wait_ms=100)
        try:
            while not self._stop_consuming.is_set():
                for records in consumer.poll(timeout_ms=200).values():
                    self.consumed.append((time.monotonic(), sum(len(r.value) for r in records)))
                    self.received += [r.offset for r in records]
        finally:
            consumer.close()

    @staticmethod
    def rate(samples: list[tuple[float, int]], t0: float, t1: float) -> float:
        return sum(n for t, n in samples if t0 <= t < t1) / max(t1 - t0, 1e-9)

    def stop(self, drain_s: float = 30.0) -> Delivery:
        """Stop producing, let the consumer read to the last record acknowledged (bounded), stop it; what it got of
        the records acknowledged, by offset."""
        self._stop.set()
        self._threads[0].join(15)
        deadline = time.monotonic() + drain_s
        while self.acked and max(self.received, default=-1) < max(self.acked) and time.monotonic() < deadline:
            time.sleep(0.1)  # bounded poll of the consumer catching up
        self._stop_consuming.set()
        self._threads[1].join(15)
        return delivery({0: sorted(self.acked)}, {0: self.received})


def wait_idle(sidecar: SluiceProcess, timeout: float = 40.0) -> None:
    """Until the sidecar's two quotas measure 0 B/s: their samples have expired (see the module docstring)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if sidecar.metric("sluice_throttle_byte_rate", {"side": "leader"}) == 0 \
                and sidecar.metric("sluice_throttle_byte_rate", {"side": "follower"}) == 0:
            return
        time.sleep(0.5)  # poll interval of the condition
    raise RuntimeError("the sidecar's quotas did not go idle")


def counters(sidecar: SluiceProcess) -> dict[str, float]:
    return {f"{what}_{side}": sidecar.metric(name, {"side": side})
            for what, name in (("left_out", "sluice_throttle_left_out_partitions_total"),
                               ("bytes", "sluice_throttle_bytes_total"))
            for side in ("leader", "follower")}


class Throttles:
    """Where the bench sets the throttles: broker 1's sidecar; with ``--fleet``, broker 3's, and every sidecar of the
    fleet applies it (waited for: each one's GET shows the revision written)."""

    def __init__(self, cluster: KafkaCluster, fleet: bool) -> None:
        self.cluster, self.fleet = cluster, fleet

    def put(self, section: dict[str, Any]) -> None:
        if not self.fleet:
            put_throttles(self.cluster.sidecars[1].admin_url, section)
            return
        status, body = admin_json(self.cluster.sidecars[3].admin_url, "/throttles", "PUT", section)
        if status != 200:
            raise RuntimeError(f"the fleet refused the throttle: {status} {body}")
        deadline = time.monotonic() + 30
        for sidecar in self.cluster.sidecars.values():
            while admin_json(sidecar.admin_url, "/throttles")[1]["revision"] < body["revision"]:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{sidecar} did not apply revision {body['revision']} within 30 s")
                time.sleep(0.05)  # bounded poll of the sidecar's revision

    def clear(self) -> None:
        self.put({"leader_rate_bytes": 0, "follower_rate_bytes": 0, "topics": [], "consumers": []})


def run_mode(mode: str, cluster: KafkaCluster, tools: JavaTools, work: Path, mb: int, throttle: int,
             live: Live, throttles: Throttles) -> dict[str, Any]:
    sidecar: SluiceProcess = cluster.sidecars[1]
    direct = cluster.broker(1).bootstrap
    topic = f"move-{mode}-{uuid.uuid4().hex[:6]}"
    create_on(tools, direct, topic, [1])
    fill(tools, direct, topic, mb * 10**6)
    size = log_bytes(cluster, 1, topic)
    wait_idle(sidecar)
    side = "follower" if mode == "sluice-follower" else "leader"
    # KIP-73's replica list: partition 0's new replica, broker 2 (the fetcher the sidecar sees)
    moving = [{"topic": topic, "replicas": "0:2"}]
    if mode in ("sluice-leader", "sluice-change"):
        throttles.put({"leader_rate_bytes": throttle, "topics": moving})
    elif mode == "sluice-follower":
        throttles.put({"follower_rate_bytes": throttle, "topics": moving})
    before = counters(sidecar)
    reassign(tools, cluster.bootstrap, topic, [1, 2], work, throttle=throttle if mode == "kafka" else None)
    t0 = time.monotonic()
    out: dict[str, Any] = {"bench": "reassign", "mode": mode, "bytes": size}
    if mode == "sluice-change":
        t1, extra = _change_midway(cluster, sidecar, topic, size, throttle, t0, throttles)
        out.update(extra)
        plan = move_time_s(size / 2, throttle, 0) + move_time_s(size / 2, 2 * throttle, 0)
    else:
        t1 = wait_in_sync(cluster, topic, 2, timeout=600)
        plan = move_time_s(size, throttle, 0) if mode != "unthrottled" else float("nan")
    after = counters(sidecar)
    moved = log_bytes(cluster, 2, topic)  # in the ISR with nothing more produced: the leader's log, whole
    throttles.clear()
    if mode == "kafka":
        verify(tools, cluster.bootstrap, topic, [1, 2], work)  # removes Kafka's throttle configs
    move = t1 - t0
    out.update({
        "throttle_bps": None if mode == "unthrottled" else throttle,
        "plan_s": round(plan, 2) if plan == plan else None,
        "move_s": round(move, 2),
        "move_vs_plan": round(move / plan, 3) if plan == plan else None,
        "left_out": after[f"left_out_{side}"] - before[f"left_out_{side}"],
        "throttled_bytes": after[f"bytes_{side}"] - before[f"bytes_{side}"],
        "replica_bytes": moved,
        "consumer_bps": round(Live.rate(live.consumed, t0, t1)),
        "producer_bps": round(Live.rate(live.produced, t0, t1)),
    })  # fmt: skip
    return out


def _change_midway(cluster: KafkaCluster, sidecar: SluiceProcess, topic: str, size: int, throttle: int,
                   t0: float, throttles: Throttles) -> tuple[float, dict[str, Any]]:
    """Leader throttle ``throttle`` until half the bytes have passed, then twice that; per-second rates from the
    sidecar's counter of throttled bytes."""
    start = sidecar.metric("sluice_throttle_bytes_total", {"side": "leader"})
    samples: list[tuple[float, float]] = []
    changed_at: float | None = None
    deadline = t0 + 600
    while time.monotonic() < deadline:
        now = time.monotonic()
        moved = sidecar.metric("sluice_throttle_bytes_total", {"side": "leader"}) - start
        samples.append((now - t0, moved))
        if changed_at is None and moved >= size / 2:
            throttles.put({"leader_rate_bytes": 2 * throttle, "topics": [{"topic": topic, "replicas": "0:2"}]})
            changed_at = time.monotonic() - t0
        if moved >= size and 2 in cluster.partitions(topic)[0].isr:
            break
        time.sleep(0.25)  # sampling interval of the counter
    t1 = wait_in_sync(cluster, topic, 2, timeout=60)
    rates = []
    for second in range(int(samples[-1][0])):
        inside = [m for t, m in samples if second <= t < second + 1]
        if len(inside) >= 2:
            rates.append(round(inside[-1] - inside[0]) * len(inside) // max(len(inside) - 1, 1))
    assert changed_at is not None
    before = [(t, m) for t, m in samples if changed_at - 3 <= t <= changed_at]
    after = [(t, m) for t, m in samples if changed_at + 1 <= t <= changed_at + 4]
    return t1, {
        "changed_at_s": round(changed_at, 2),
        "rate_before_bps": _rate(before),
        "rate_after_bps": _rate(after),
        "rates": rates,
    }


def _rate(samples: list[tuple[float, float]]) -> int | None:
    """Bytes per second between the first and the last (time, bytes) sample: over the time they span."""
    if len(samples) < 2 or samples[-1][0] <= samples[0][0]:
        return None
    return round((samples[-1][1] - samples[0][1]) / (samples[-1][0] - samples[0][0]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.reassign", description=__doc__.split("\n\n")[0])
    parser.add_argument("--mb", type=int, default=200, help="MB in the moved partition (default 200)")
    parser.add_argument("--throttle", default="10MB", help="the throttle (default 10MB, i.e. 10,000,000 B/s)")
    parser.add_argument("--live-rate", default="1MB", help="the live topic's produce rate (default 1MB/s)")
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--fleet", action="store_true", help="the sidecars one fleet; throttles set on broker 3's")
    add_options(parser, "10 MB moved by the Sluice leader throttle alone")
    args = parser.parse_args(argv)
    if args.smoke:
        args.mb, args.modes = 10, "sluice-leader"
    throttle, live_rate = int(parse_size(args.throttle)), int(parse_size(args.live_rate))
    modes = [m for m in args.modes.split(",") if m]
    if unknown := set(modes) - set(MODES):
        parser.error(f"unknown modes {sorted(unknown)}; known: {', '.join(MODES)}")
    load_at_start = round(os.getloadavg()[0], 2)  # the machine is shared: how busy it was, measured
    tools = JavaTools()
    work = Path(tempfile.mkdtemp(prefix="bench-reassign-"))
    results: dict[str, dict[str, Any]] = {}
    sidecar_env = fleet_env(f"bench-reassign-{uuid.uuid4().hex[:8]}") if args.fleet else None
    with KafkaCluster(3, replication_via_sluice=True, sidecar_env=sidecar_env) as cluster:
        throttles = Throttles(cluster, args.fleet)
        print(f"cluster up in {cluster.last_start_seconds:.1f}s", file=sys.stderr)
        create_on(tools, cluster.broker(1).bootstrap, "live", [1])
        live = Live(cluster.broker(1).bootstrap, cluster.sidecars[1].bootstrap, "live", live_rate)
        try:
            for mode in modes:
                results[mode] = run_mode(mode, cluster, tools, work, args.mb, throttle, live, throttles)
                emit(results[mode])
        finally:
            live_check = live.stop()
    # the checks: every byte a throttled move carried was metered by the throttle that moved it (when a Sluice
    # throttle moved one); every move left the new replica holding the whole log; the live consumer got every record
    # acknowledged, once, in order
    counted = {m: r["throttled_bytes"] >= r["bytes"] for m, r in results.items() if m.startswith("sluice-")}
    checks = {"every_replica_whole": all(r["replica_bytes"] == r["bytes"] for r in results.values())}
    if counted:
        checks["every_byte_counted"] = all(counted.values())
    figures: dict[str, Any] = {"fleet": args.fleet, "mb": args.mb, "throttle_bps": throttle,
                               "cpus": os.cpu_count(), "load_1m_at_start": load_at_start, "counted": counted}
    figures["move_vs_plan"] = {side: results[f"sluice-{side}"]["move_vs_plan"]
                               for side in ("leader", "follower") if f"sluice-{side}" in results}
    if "kafka" in results:
        figures["move_vs_kafka_throttle"] = {
            side: round(results[f"sluice-{side}"]["move_s"] / results["kafka"]["move_s"], 3)
            for side in ("leader", "follower") if f"sluice-{side}" in results}
        figures["kafka_move_vs_plan"] = results["kafka"]["move_vs_plan"]
    if "sluice-change" in results:
        figures["change_move_vs_plan"] = results["sluice-change"]["move_vs_plan"]
    figures["consumer_vs_producer"] = {m: round(r["consumer_bps"] / r["producer_bps"], 3)
                                       for m, r in results.items() if r["producer_bps"]}
    # each side's move within 10% of the plan
    deviations = [abs(r - 1) for r in figures["move_vs_plan"].values()]
    figures["move_vs_plan_worst_error"] = round(max(deviations), 3) if deviations else None
    line = summary("reassign", figures, {"move_vs_plan_worst_error": at_most(0.1)}, check=live_check,
                           checks=checks, errors=live.failed)
    emit(line)
    return exit_status(line, args.check)


if __name__ == "__main__":
    sys.exit(main())
