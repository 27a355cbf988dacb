"""proxy.accesslog_kafka without a broker: the buffer is bounded, what does not fit is dropped and counted at once,
what is still buffered at close is dropped and counted as stopped, and a property librdkafka refuses is a
ConfigError naming the key. (With real brokers: tests/integration/test_access_log_kafka.py.)"""

from __future__ import annotations

import asyncio

import pytest

from proxy.accesslog_kafka import KafkaAccessLogSink, producer_config
from proxy.app import load_settings
from proxy.config import AccessLogKafkaSettings, ConfigError
from proxy.metrics import Metrics
from rig.kafka import free_ports


def settings(**overrides: object) -> AccessLogKafkaSettings:
    (dead,) = free_ports(1)  # nothing listens there: nothing is ever delivered
    base = {"logging.access_log_kafka.enabled": True,
            "logging.access_log_kafka.bootstrap_servers": [f"127.0.0.1:{dead}"]}
    base.update({f"logging.access_log_kafka.{k}": v for k, v in overrides.items()})
    return load_settings(None, env={}).with_overrides(base).logging.access_log_kafka


def dropped(metrics: Metrics, reason: str) -> float:
    return metrics.total("sluice_access_log_dropped_total", reason=reason)


async def test_a_full_buffer_drops_and_counts_without_waiting_and_close_drops_the_rest() -> None:
    metrics = Metrics()
    sink = KafkaAccessLogSink(settings(buffer_events=3), [], metrics)
    sink.start(asyncio.get_running_loop())
    for i in range(10):
        sink.offer(f'{{"i":{i}}}\n')
    assert dropped(metrics, "buffer_full") == 7
    assert metrics.total("sluice_access_log_buffered_events") >= 3
    assert await sink.close(0) == 3
    assert dropped(metrics, "stopped") == 3
    assert dropped(metrics, "delivery_failed") == 0
    assert await sink.close(0) == 0  # once


def test_upstream_cluster_by_default_and_the_buffer_bounds_in_the_producer() -> None:
    s = load_settings(None, env={}).logging.access_log_kafka
    conf = producer_config(s, ["u1:9092", "u2:9092"])
    assert conf["bootstrap.servers"] == "u1:9092,u2:9092"
    assert (conf["queue.buffering.max.messages"], conf["queue.buffering.max.kbytes"]) == (100_000, 65536)
    assert conf["enable.idempotence"] is True and conf["delivery.report.only.error"] is True
    # a line is taken up to the buffer's size (never below librdkafka's default; at most what it accepts)
    assert conf["message.max.bytes"] == 67_108_864
    assert producer_config(settings(buffer_bytes=4096), [])["message.max.bytes"] == 1_000_000
    assert producer_config(settings(buffer_bytes=2**31 - 1), [])["message.max.bytes"] == 1_000_000_000
    assert producer_config(settings(), ["u1:9092"])["bootstrap.servers"] != "u1:9092"


def test_a_property_librdkafka_refuses_names_the_key() -> None:
    with pytest.raises(ConfigError) as info:
        KafkaAccessLogSink(settings(properties={"no.such.property": "1"}), [], Metrics())
    assert info.value.key == "logging.access_log_kafka.properties"
    assert "no.such.property" in info.value.reason
