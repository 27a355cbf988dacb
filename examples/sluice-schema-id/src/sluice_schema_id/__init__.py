"""A Sluice policy from a package of its own: Produce requests to listed topics are refused, partition by
partition, unless every record carries a Confluent Schema Registry schema id, as a broker with schema ID validation
refuses them (``INVALID_RECORD``, the culprit records named: KIP-467).

Installed beside Sluice it is found through its entry point (``sluice.policies``: ``schema_id =
"sluice_schema_id:REGISTRATION"``) and does nothing until ``[[schema_id.topics]]`` lists a topic::

    [[schema_id.topics]]
    topic = "orders-*"        # a name or a glob
    keys = false              # values are checked; keys too when true
    schema_ids = [1, 7]       # the ids accepted; empty = any

What it adds to Sluice, all declared here: the ``[schema_id]`` section, the metric
``sluice_schema_id_refused_records_total{topic}`` and the access-log field ``schema_id_refused``.
"""

from __future__ import annotations

from proxy.core.registration import Registration

from .policy import SchemaId, SchemaIdMetrics
from .settings import SchemaIdSettings, SchemaIdTopicSettings

REGISTRATION = Registration(
    SchemaId, "schema_id", SchemaIdSettings, metrics=SchemaIdMetrics,
    log_fields={"schema_id_refused": "int: on Produce lines where [schema_id] refused partitions, the records of "
                                     "their batches (never sent upstream)"})

__all__ = ["REGISTRATION", "SchemaId", "SchemaIdMetrics", "SchemaIdSettings", "SchemaIdTopicSettings"]
