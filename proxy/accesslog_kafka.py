"""The access log as a Kafka stream: ``[logging.access_log_kafka]`` produces every access-log event (the same JSON
line the file gets, the same versioned schema) to a topic, for the Spark job's topic modes (proxy/analytics).

The rule this module keeps: the proxy path never waits for Kafka. :meth:`KafkaAccessLogSink.offer` hands the line
that :class:`~proxy.accesslog.AccessLog` already formatted to the producer's bounded buffer and returns; when the
buffer is full (the cluster slow or down) the event is dropped and counted in ``sluice_access_log_dropped_total``
{reason="buffer_full"}. Everything else - batching, compression, connecting, retrying, a broker outage - happens
off the event loop.

Why confluent-kafka (librdkafka), not aiokafka
----------------------------------------------

- ``Producer.produce()`` is a C call that copies the value into librdkafka's queue and returns: about a
  microsecond, and it raises ``BufferError`` at once when the queue is full - exactly the non-blocking, bounded
  buffer this needs (``queue.buffering.max.messages`` / ``.max.kbytes`` = ``buffer_events`` / ``buffer_bytes``).
- Batching, compression, the network and the retries run in librdkafka's own threads, in C, without the GIL: none
  of it costs the proxy's single event-loop thread. aiokafka is asyncio-native, but its producer builds and
  compresses record batches and runs its sender task in Python *on the proxy's loop*: every event would cost the
  proxy more than the ~3 us the access log costs today, and an outage's reconnect loop would run there too. With
  aiokafka a bounded buffer of our own would also be needed (its ``send()`` waits for space).
- It is well kept (Confluent, librdkafka's authors; monthly releases; wheels with librdkafka inside for Linux,
  macOS and Windows, so nothing to build or install besides the wheel), and already tested against here: the client
  tests run confluent-kafka through Sluice.

Delivery reports are requested for failures only (``delivery.report.only.error``), so a healthy stream costs no
Python callback per event; failures and librdkafka's errors are served by ``poll(0)`` from a loop timer every
:data:`POLL_INTERVAL_S` (a few microseconds), counted, and logged at most once per interval per kind. The producer
is idempotent (no duplicates or reordering from its retries), keyed by ``key`` (default ``hostname:pid``): one
Sluice process's events stay in one partition, in order, and the key tells processes apart in the analytics.

Lifecycle: made with the :class:`~proxy.server.Proxy` (a bad librdkafka property is a ConfigError naming
``logging.access_log_kafka.properties``, exit 2), started by ``Proxy.start`` (attached to the access log),
detached and flushed at ``Proxy.stop`` once the connections are closed, for at most ``flush_timeout_s`` (in a
worker thread: the loop stays free); what is still buffered then is dropped and counted as ``stopped``.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from collections.abc import Sequence
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Producer

from proxy.accesslog import LogLimiter, get_logger
from proxy.config import AccessLogKafkaSettings, ConfigError
from proxy.kafka_acls import AclReporter, principal_name
from proxy.metrics import ACCESS_LOG_DROP_REASONS, Metrics

__all__ = ["POLL_INTERVAL_S", "KafkaAccessLogSink", "producer_config"]

#: How often failed deliveries and librdkafka's errors are collected (``poll(0)`` on the event loop).
POLL_INTERVAL_S = 0.2
_LOG_INTERVAL_S = 10.0
_PURGED = frozenset({KafkaError._PURGE_QUEUE, KafkaError._PURGE_INFLIGHT})

log = get_logger("sluice.accesslog.kafka")


#: librdkafka's default message.max.bytes, and the most it accepts (CONFIGURATION.md)
_MESSAGE_MAX_BYTES_DEFAULT = 1_000_000
_MESSAGE_MAX_BYTES_LIMIT = 1_000_000_000


def default_key() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def producer_config(settings: AccessLogKafkaSettings, upstream: Sequence[str]) -> dict[str, Any]:
    """The librdkafka properties of the sink's producer (callbacks are added by the sink)."""
    conf: dict[str, Any] = {
        "client.id": "sluice-access-log",
        "bootstrap.servers": ",".join(settings.bootstrap_servers or upstream),
        # The bounded buffer: produce() raises BufferError at once beyond either bound (never blocks).
        "queue.buffering.max.messages": settings.buffer_events,
        "queue.buffering.max.kbytes": max(1, settings.buffer_bytes // 1024),
        "linger.ms": settings.linger_ms,
        "compression.type": settings.compression,
        # librdkafka refuses a message longer than message.max.bytes (1,000,000 by default) before compressing it:
        # a session-less consumer of ~15,000 partitions has Fetch lines longer than that, each listing every
        # partition. Any line that fits the buffer is taken; the broker judges the compressed batch against the
        # topic's max.message.bytes (JSON lines compress ~10x: a 3 MB line goes under the default 1 MB).
        "message.max.bytes": max(_MESSAGE_MAX_BYTES_DEFAULT, min(settings.buffer_bytes, _MESSAGE_MAX_BYTES_LIMIT)),
        "message.timeout.ms": max(1, round(settings.delivery_timeout_s * 1000)),
        # Retries never duplicate or reorder a process's events (acks=all comes with it).
        "enable.idempotence": True,
        "delivery.report.only.error": True,
        # librdkafka's own log lines would repeat what error_cb reports (rate-limited below) on every reconnect.
        "log.connection.close": False,
        "log_level": 0,
        **settings.properties,
    }
    return conf


class KafkaAccessLogSink:
    """Produces access-log lines to ``settings.topic``; see the module docstring. ``offer`` runs on the proxy's event
    loop; ``close`` is awaited there once, at shutdown."""

    def __init__(self, settings: AccessLogKafkaSettings, upstream: Sequence[str], metrics: Metrics) -> None:
        self.settings = settings
        self.topic = settings.topic
        self.key = settings.key or default_key()
        self._dropped = {reason: metrics.access_log_dropped.labels(reason)
                         for reason in ACCESS_LOG_DROP_REASONS if reason != "write_failed"}
        self._full = self._dropped["buffer_full"]
        self._limiter = LogLimiter(_LOG_INTERVAL_S, time.monotonic)
        #: events purged at close (dropped as ``stopped``)
        self.purged = 0
        # the principal as the properties log in (SASL's user; a missing ACL is named once: proxy/kafka_acls.py)
        self._acls = AclReporter(principal_name(str(settings.properties.get("sasl.username", "")),
                                                str(settings.properties.get("ssl.certificate.location", ""))),
                                 log.warning)
        conf = producer_config(settings, upstream)
        self.bootstrap_servers: str = conf["bootstrap.servers"]
        conf["on_delivery"] = self._on_delivery
        conf["error_cb"] = self._on_error
        # Anything librdkafka still logs (log_level 0: emergencies only) goes to the operational log.
        conf["logger"] = logging.getLogger("sluice.accesslog.kafka.librdkafka")
        try:
            self._producer = Producer(conf)
        except (KafkaException, ValueError, TypeError) as exc:
            raise ConfigError("logging.access_log_kafka.properties", f"librdkafka refused the producer "
                              f"configuration: {exc}") from None
        self._produce = self._producer.produce
        self._timer: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.closed = False
        producer = self._producer
        metrics.access_log_buffered.set_function(lambda: len(producer))

    # ------------------------------------------------------------------------------------------ hot path

    def offer(self, line: str) -> None:
        """Buffer one access-log line (a JSON object plus its newline, which the message leaves out). Never blocks,
        never raises: a full buffer drops the event and counts it."""
        try:
            self._produce(self.topic, line[:-1], self.key)
        except BufferError:
            self._full.inc()
        except KafkaException as exc:  # refused before buffering, e.g. larger than message.max.bytes
            self._failed(exc.args[0] if exc.args else None)

    # ------------------------------------------------------------------------------------------ lifecycle

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._timer = loop.call_later(POLL_INTERVAL_S, self._poll)
        log.info("access_log_kafka_started", topic=self.topic, key=self.key,
                 bootstrap_servers=self.bootstrap_servers,
                 buffer_events=self.settings.buffer_events, buffer_bytes=self.settings.buffer_bytes)

    def _poll(self) -> None:
        self._producer.poll(0)
        if not self.closed and self._loop is not None:
            self._timer = self._loop.call_later(POLL_INTERVAL_S, self._poll)

    async def close(self, timeout: float | None = None) -> int:
        """Flush for at most ``timeout`` seconds (default ``flush_timeout_s``) in a worker thread, then drop what is
        left (counted as ``stopped``). Returns the number of events dropped here. The access log must no longer
        offer lines (``AccessLog.detach_sink``)."""
        if self.closed:
            return 0
        self.closed = True
        if self._timer is not None:
            self._timer.cancel()
        timeout = self.settings.flush_timeout_s if timeout is None else timeout
        producer = self._producer
        remaining = await asyncio.get_running_loop().run_in_executor(None, producer.flush, timeout)
        if remaining:
            producer.purge()  # in queue and in flight: each is reported as purged, counted as stopped
        producer.poll(0)
        log.info("access_log_kafka_closed", topic=self.topic, dropped_at_stop=self.purged)
        return self.purged

    # ------------------------------------------------------------------------------------------ callbacks

    def _on_delivery(self, err: KafkaError | None, _msg: Any) -> None:
        if err is None:
            return
        if err.code() in _PURGED:
            self.purged += 1
            self._dropped["stopped"].inc()
            return
        self._failed(err)

    def _failed(self, err: KafkaError | None) -> None:
        self._dropped["delivery_failed"].inc()
        code = err.code() if isinstance(err, KafkaError) else None
        if code == KafkaError.TOPIC_AUTHORIZATION_FAILED:
            self._denied(err)
            return
        suppressed = self._limiter.allow(("delivery", code))
        if suppressed is not None:
            log.warning("access_log_kafka_delivery_failed", topic=self.topic, error=str(err),
                        not_logged=suppressed, interval_s=_LOG_INTERVAL_S)

    def _denied(self, err: KafkaError | None) -> None:
        self._acls.missing("Topic", self.topic, "Write", "[logging.access_log_kafka]: every access-log event",
                           str(err))

    def _on_error(self, err: KafkaError) -> None:
        if err.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED:
            self._denied(err)
            return
        suppressed = self._limiter.allow(("error", err.code()))
        if suppressed is not None:
            log.warning("access_log_kafka_error", topic=self.topic, error=err.str(), fatal=err.fatal(),
                        not_logged=suppressed, interval_s=_LOG_INTERVAL_S)
