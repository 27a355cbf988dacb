"""The fleet's topics: created with the settings the design relies on, those settings checked, read to their end
(confluent-kafka; blocking, called from threads or the CLI).

The control topic (proxy/fleet/records.py) relies on (:data:`CONTROL_TOPIC_CONFIG`, set when Sluice creates it,
checked by every instance at start-up: ``fleet_control_topic_setting`` in the log and
``sluice_fleet_control_topic_setting_unexpected{setting}`` 1 when an operator changed one):

- ``cleanup.policy=compact``: the latest record of each section is kept forever (``delete`` would drop the
  fleet's settings with age);
- ``unclean.leader.election.enable=false``: an unclean election truncates the log and gives its offsets to other
  records, and a revision is an offset (Kafka's default; checked because a cluster default may differ);
- ``delete.retention.ms`` at least a day (7 days when Sluice creates it): how long a tombstone stays readable.
  A following instance reads it within moments; one cut off from the cluster re-reads the topic when it is back
  (control.py), so this is a margin, not a bound the design waits on.

``min.compaction.lag.ms`` is left at Kafka's default (0): a revision is its record's offset, so compaction may drop
a superseded record at once without changing any revision, and the history is a topic of its own.

The status topic is compacted and deleted (the latest status per instance; a silent one ages out), the history
topic deleted only (every change, as made; kept as long as ``retention.ms`` says, forever by default).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicCollection, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic

__all__ = ["AUTHORIZATION", "CONTROL_TOPIC_CONFIG", "Denied", "Record", "config_drift", "create_missing",
           "describe_configs", "read_to_end", "topic_id", "write_permissions"]

#: the control topic's settings when Sluice creates it
CONTROL_TOPIC_CONFIG = {"cleanup.policy": "compact", "unclean.leader.election.enable": "false",
                        "delete.retention.ms": str(7 * 86_400_000)}
#: the least delete.retention.ms the check accepts (Kafka's default)
MIN_DELETE_RETENTION_MS = 86_400_000
STATUS_TOPIC_CONFIG = {"cleanup.policy": "compact,delete", "retention.ms": str(7 * 86_400_000)}
HISTORY_TOPIC_CONFIG = {"cleanup.policy": "delete", "retention.ms": "-1"}

AUTHORIZATION = frozenset({KafkaError.TOPIC_AUTHORIZATION_FAILED, KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
                           KafkaError.CLUSTER_AUTHORIZATION_FAILED, KafkaError.GROUP_AUTHORIZATION_FAILED})
_POLL_S = 0.2

#: (key, value, offset) of a record
Record = tuple[bytes | None, bytes | None, int]


class Denied(Exception):
    """A call the cluster refused for want of a permission: ``operation`` on ``resource`` ``name``."""

    def __init__(self, resource: str, name: str, operation: str, error: str) -> None:
        super().__init__(f"{operation} on {resource}:{name}: {error}")
        self.resource, self.name, self.operation, self.error = resource, name, operation, error


def code_of(exc: KafkaException) -> int | None:
    err = exc.args[0] if exc.args else None
    return err.code() if isinstance(err, KafkaError) else None


def config_drift(found: Mapping[str, str]) -> list[tuple[str, str, str]]:
    """The control topic's settings that are not what the design relies on: (setting, expected, found)."""
    out = []
    if found.get("cleanup.policy") != "compact":
        out.append(("cleanup.policy", "compact", found.get("cleanup.policy", "")))
    if found.get("unclean.leader.election.enable", "false") != "false":
        out.append(("unclean.leader.election.enable", "false", found["unclean.leader.election.enable"]))
    retention = found.get("delete.retention.ms", "")
    if not retention.lstrip("-").isdigit() or int(retention) < MIN_DELETE_RETENTION_MS:
        out.append(("delete.retention.ms", f">= {MIN_DELETE_RETENTION_MS}", retention))
    return out


def create_missing(admin: AdminClient, wanted: Mapping[str, Mapping[str, str]], replication_factor: int,
                   timeout: float, on_created: Callable[[str, int], None]) -> list[str]:
    """Create the topics of ``wanted`` (name -> config) the cluster does not show (one partition each: one order
    for the whole fleet); replication factor ``replication_factor`` or min(3, brokers). The topics created (their
    metadata may take a moment to reach every broker); :class:`Denied` (Create) for a topic the principal may not
    create; another instance creating it first is fine."""
    meta = admin.list_topics(timeout=timeout)
    missing = [name for name in wanted if name not in meta.topics]
    if not missing:
        return []
    rf = replication_factor or min(3, max(1, len(meta.brokers)))
    topics = [NewTopic(name, 1, rf, config={**wanted[name], "min.insync.replicas": str(min(2, rf))})
              for name in missing]
    denied: Denied | None = None
    created = []
    for name, future in admin.create_topics(topics, request_timeout=timeout).items():
        try:
            future.result()
            on_created(name, rf)
            created.append(name)
        except KafkaException as exc:
            code = code_of(exc)
            if code in (KafkaError.TOPIC_AUTHORIZATION_FAILED, KafkaError.CLUSTER_AUTHORIZATION_FAILED):
                denied = Denied("Topic", name, "Create", str(exc.args[0]))
            elif code != KafkaError.TOPIC_ALREADY_EXISTS:
                raise
    if denied is not None:
        raise denied
    return created


def describe_configs(admin: AdminClient, topic: str, timeout: float) -> dict[str, str]:
    """The topic's settings in force (DescribeConfigs); :class:`Denied` without DescribeConfigs on it."""
    resource = ConfigResource("topic", topic)
    try:
        entries = admin.describe_configs([resource], request_timeout=timeout)[resource].result()
    except KafkaException as exc:
        if code_of(exc) == KafkaError.TOPIC_AUTHORIZATION_FAILED:
            raise Denied("Topic", topic, "DescribeConfigs", str(exc.args[0])) from None
        raise
    return {name: str(entry.value) for name, entry in entries.items() if entry.value is not None}


def topic_id(admin: AdminClient, topic: str, timeout: float) -> str:
    """The topic's id (KIP-516; a topic created again has another): "" if the topic does not exist.
    :class:`Denied` (Describe) if the principal may not see it."""
    future = admin.describe_topics(TopicCollection([topic]), request_timeout=timeout)[topic]
    try:
        return str(future.result().topic_id)
    except KafkaException as exc:
        code = code_of(exc)
        if code == KafkaError.TOPIC_AUTHORIZATION_FAILED:
            raise Denied("Topic", topic, "Describe", str(exc.args[0])) from None
        if code == KafkaError.UNKNOWN_TOPIC_OR_PART:
            return ""
        raise


def write_permissions(admin: AdminClient, topics: list[str], timeout: float) -> list[str]:
    """The topics of ``topics`` the principal may not write, as the cluster says (Metadata's authorized
    operations, KIP-430): what a refused transaction names."""
    missing = []
    futures = admin.describe_topics(TopicCollection(topics), request_timeout=timeout,
                                    include_authorized_operations=True)
    for name, future in futures.items():
        try:
            ops = {op.name for op in future.result().authorized_operations or ()}
        except KafkaException:
            ops = set()
        if "WRITE" not in ops and "ALL" not in ops:
            missing.append(name)
    return missing


def read_to_end(conf: dict[str, Any], topic: str, group: str, timeout: float,
                on_denied: Callable[[Denied], object], clock: Callable[[], float] = time.monotonic) -> list[Record]:
    """Every committed record of ``topic`` from its beginning to its end now, in partition order (a fresh
    consumer of ``group``; nothing is committed). librdkafka's consumer looks the group's coordinator up whether
    it commits or not; refused (no Describe on the group) it still reads: ``on_denied`` is told. Blocking;
    :class:`Denied` (Read on the topic), KafkaException (missing topic, timeout...)."""
    consumer = Consumer({**conf, "group.id": group, "enable.auto.commit": False,
                         "isolation.level": "read_committed", "enable.partition.eof": True,
                         "auto.offset.reset": "earliest"})
    out: list[Record] = []
    try:
        try:
            meta = consumer.list_topics(topic, timeout=timeout).topics.get(topic)
        except KafkaException as exc:
            raise _denied_read(topic, exc.args[0]) if code_of(exc) in AUTHORIZATION else exc from None
        if meta is None or meta.error is not None:
            error = meta.error if meta is not None and meta.error else KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART)
            if error.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED:
                raise _denied_read(topic, error)
            raise KafkaException(error)
        partitions = set(meta.partitions)
        consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
        at_end: set[int] = set()
        deadline = clock() + timeout
        while at_end < partitions:
            if clock() > deadline:
                raise KafkaException(KafkaError(KafkaError._TIMED_OUT, f"reading {topic} to its end"))
            msg = consumer.poll(_POLL_S)
            if msg is None:
                continue
            err = msg.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    at_end.add(msg.partition() or 0)
                elif err.code() == KafkaError.GROUP_AUTHORIZATION_FAILED:
                    on_denied(Denied("Group", group, "Describe", err.str()))
                elif err.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED:
                    raise _denied_read(topic, err)
                elif err.fatal():
                    raise KafkaException(err)
                continue
            out.append((msg.key(), msg.value(), msg.offset() or 0))
        return out
    finally:
        consumer.close()


def _denied_read(topic: str, err: Any) -> Denied:
    return Denied("Topic", topic, "Read", err.str() if isinstance(err, KafkaError) else str(err))
