"""``[schema_id]``: the topics whose records must carry a Schema Registry schema id; read at start (a restart
changes them). No entry: the policy does nothing."""

from __future__ import annotations

from typing import Annotated

from proxy.config.base import (
    Meta,
    Section,
    check_topic_or_glob,
    field,
    field_validator,
    model_validator,
    one_entry_per_topic,
)

#: a schema id is the wire format's 4-byte signed int; Schema Registry hands out positive ones
SchemaIdValue = Annotated[int, Meta(ge=0, le=2**31 - 1)]


class SchemaIdTopicSettings(Section, kw_only=True, frozen=True):
    """One ``[[schema_id.topics]]`` entry. Resolved as Sluice's other topic lists are (``[[throttle.topics]]``):
    the entry naming a topic exactly wins, else the first glob in file order that matches it."""

    topic: Annotated[str, Meta(
        description='Topic name, or a glob over topic names ("orders-*", "*"): *, ?, [...] as in '
                    "fnmatch, case-sensitive.")]
    keys: Annotated[bool, Meta(description="Check record keys too (Confluent's "
                                           "confluent.key.schema.validation); values are always checked.")] = False
    schema_ids: Annotated[list[SchemaIdValue], Meta(
        description="The schema ids a checked key or value may carry; empty = any id.")] = field(default_factory=list)

    @field_validator("topic")
    @classmethod
    def _topic(cls, value: str) -> str:
        return check_topic_or_glob(value)


class SchemaIdSettings(Section, kw_only=True, frozen=True):
    """Produce requests to these topics are refused, per partition, unless every record carries a schema id
    (Confluent Schema Registry's wire format). Needs a restart."""

    topics: Annotated[list[SchemaIdTopicSettings], Meta(
        description="The checked topics; empty = the policy does nothing.")] = field(default_factory=list)

    @model_validator
    def _one_entry_per_topic(self) -> None:
        one_entry_per_topic("schema_id", [t.topic for t in self.topics])
