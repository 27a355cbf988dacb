"""One way to create a topic for the rig, the benches and the tests: librdkafka's admin client (confluent_kafka), in
this process.

Why not Kafka's ``kafka-topics.sh`` (``JavaTools.create_topic``): it starts a JVM for one request, and on a loaded
machine (CI runs the benches' smoke runs at ``nice -n 19`` on a saturated 2-core machine) that JVM's start and exit
can outlast any sensible timeout — bench.passthrough failed with "Created topic" printed and the JVM (dumping its
CDS class archive at exit) still running at 60 s. Where a Java client is the point (the Java admin client's
CreateTopics through Sluice), the tests use ``JavaTools`` directly; everywhere else, this.

Why one helper: the benches and tests each had their own copy (kafka-python's admin, confluent's admin, the JVM),
with different timeouts and different notions of "done".
"""

from __future__ import annotations

from collections.abc import Mapping


def create_topic(bootstrap: str, topic: str, partitions: int = 1, replication_factor: int = 1,
                 config: Mapping[str, str] | None = None, timeout: float = 60.0) -> None:
    """Create ``topic`` at ``bootstrap`` (a broker or Sluice) and return once the broker has answered that it is
    created; raise ``confluent_kafka.KafkaException`` if it is not (it exists already, a bad config, no answer
    within ``timeout`` seconds).

    ``operation_timeout`` is CreateTopics' ``timeout_ms`` (Kafka's CreateTopicsRequest.json): how long the broker
    may wait for the creation to complete before it answers; the copies this replaced (kafka-python's admin, its
    request timeout) sent a non-zero one too, and librdkafka's default (socket.timeout.ms) is the same 60 s."""
    from confluent_kafka.admin import AdminClient, NewTopic

    # log_level 0 (syslog "emerg"): librdkafka's own log lines (a broker that goes away, say) would otherwise
    # print to stderr from a passing run; a failure reaches the caller as the future's exception instead.
    admin = AdminClient({"bootstrap.servers": bootstrap, "client.id": "sluice-rig-create-topic", "log_level": 0})
    new = NewTopic(topic, num_partitions=partitions, replication_factor=replication_factor,
                   config=dict(config or {}))
    futures = admin.create_topics([new], operation_timeout=timeout, request_timeout=timeout)
    # request_timeout bounds the whole request (lookup, send, the broker's wait, the answer): the future resolves
    # by then, so the wait here is only a backstop.
    futures[topic].result(timeout + 10.0)
