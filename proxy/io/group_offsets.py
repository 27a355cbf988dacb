"""Group offsets of Sluice's own (commits with metadata, reads with metadata and leader epoch) through
confluent-kafka's AdminClient (librdkafka): coordinator discovery, TLS and the SASL mechanisms are librdkafka's.

librdkafka's calls return concurrent futures completed on its own threads; each is awaited through
``asyncio.wrap_future`` with a bound, so the event loop never blocks on one. The client is made on first use (a
proxy that never shares makes none) and released off the loop at stop (librdkafka's destroy joins its threads).

A per-partition NOT_COORDINATOR / COORDINATOR_LOAD_IN_PROGRESS is handed back as such (librdkafka does not retry
it for these admin calls): the caller finds the coordinator again by asking again.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Mapping
from typing import Any

from confluent_kafka import ConsumerGroupTopicPartitions, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient

from ..config import UpstreamSettings
from ..core.group_calls import Committed
from ..core.group_calls import TopicPartition as Partition

__all__ = ["GroupOffsets", "admin_config"]

#: librdkafka's "no offset" (RD_KAFKA_OFFSET_INVALID), Kafka's -1
_NO_OFFSET = -1001


def admin_config(upstream: UpstreamSettings) -> dict[str, Any]:
    """The librdkafka properties of Sluice's own admin client: ``[upstream]``'s servers, TLS and SASL identity.
    ``upstream.tls.min_version`` has no librdkafka property: OpenSSL's own floor (TLS 1.2 in the wheels) applies."""
    tls, sasl = upstream.tls, upstream.sasl
    protocol = ("SASL_" if sasl.mechanism else "") + ("SSL" if tls.enabled else "PLAINTEXT")
    conf: dict[str, Any] = {
        "bootstrap.servers": ",".join(upstream.bootstrap_servers),
        "client.id": "sluice",
        "security.protocol": protocol,
        "socket.connection.setup.timeout.ms": max(1000, round(upstream.connect_timeout_s * 1000)),
        # failures are the caller's to log (group_call_failed); librdkafka's lines would repeat them per reconnect
        "log_level": 0,
        "log.connection.close": False,
        "logger": logging.getLogger("sluice.server.librdkafka"),
        "error_cb": lambda _error: None,
    }
    if tls.enabled:
        conf["ssl.ca.location"] = tls.ca_file or "probe"
        conf["ssl.endpoint.identification.algorithm"] = "https" if tls.check_hostname else "none"
        if tls.cert_file:
            conf["ssl.certificate.location"] = tls.cert_file
            conf["ssl.key.location"] = tls.key_file
        if tls.key_password_file:
            with open(tls.key_password_file, encoding="utf-8") as fh:
                conf["ssl.key.password"] = fh.read().strip()
    if sasl.mechanism:
        conf.update({"sasl.mechanism": sasl.mechanism, "sasl.username": sasl.username,
                     "sasl.password": sasl.secret()})
    return conf


class GroupOffsets:
    """Commits and reads of group offsets; every call bounded by ``timeout`` seconds."""

    def __init__(self, upstream: UpstreamSettings, timeout: float) -> None:
        self._upstream = upstream
        self.timeout = timeout
        self._client: AdminClient | None = None

    def _admin(self) -> AdminClient:
        if self._client is None:
            self._client = AdminClient(admin_config(self._upstream))
        return self._client

    async def _result(self, futures: Mapping[Any, Any], group: str) -> ConsumerGroupTopicPartitions:
        try:
            result: ConsumerGroupTopicPartitions = await asyncio.wait_for(
                asyncio.wrap_future(futures[group]), self.timeout)
        except KafkaException as e:
            raise OSError(f"group {group}: {e.args[0] if e.args else e}") from None
        return result

    async def commit(self, group: str, offsets: Mapping[Partition, tuple[int, str | None]]) -> dict[Partition, int]:
        """A simple commit (no generation, no member: the group has no members) of ``offsets``, with their
        metadata; the error code of each partition (0: committed)."""
        # TopicPartition takes no None metadata: a partition without any is given none
        parts = [TopicPartition(t, p, o) if md is None else TopicPartition(t, p, o, metadata=md)
                 for (t, p), (o, md) in sorted(offsets.items())]
        futures = self._admin().alter_consumer_group_offsets([ConsumerGroupTopicPartitions(group, parts)],
                                                             request_timeout=self.timeout)
        result = await self._result(futures, group)
        return {(tp.topic, tp.partition): tp.error.code() if tp.error is not None else 0
                for tp in result.topic_partitions or ()}

    async def read(self, group: str, partitions: Iterable[Partition]) -> tuple[dict[Partition, Committed],
                                                                               dict[Partition, int]]:
        """The committed offsets of ``partitions`` in ``group`` (offset -1: none), and the error code of the
        partitions that failed."""
        parts = [TopicPartition(t, p) for t, p in sorted(partitions)]
        futures = self._admin().list_consumer_group_offsets([ConsumerGroupTopicPartitions(group, parts)],
                                                            request_timeout=self.timeout)
        result = await self._result(futures, group)
        read: dict[Partition, Committed] = {}
        errors: dict[Partition, int] = {}
        for tp in result.topic_partitions or ():
            key = (tp.topic, tp.partition)
            if tp.error is not None:
                errors[key] = tp.error.code()
                continue
            offset = tp.offset if tp.offset >= 0 else -1
            epoch = tp.leader_epoch if tp.leader_epoch is not None and offset >= 0 else -1
            read[key] = Committed(offset, epoch, tp.metadata)
        return read, errors

    async def close(self) -> None:
        """Release the client off the loop (librdkafka's destroy waits for its threads)."""
        held, self._client = [self._client], None
        await asyncio.to_thread(held.clear)
