"""The grant a ``kafka_not_authorized`` event names (proxy/kafka_acls.py AclReporter): the one the operator should
run, once per missing grant."""

from __future__ import annotations

from typing import Any

from proxy.kafka_acls import AclReporter
from proxy.policies.sharing.frontier import slice_group
from proxy.policies.sharing.keys import Slice


def reporter() -> tuple[AclReporter, list[dict[str, Any]]]:
    events: list[dict[str, Any]] = []
    return AclReporter("User:sluice", lambda event, **kw: events.append({"event": event, **kw})), events


def test_a_refused_slice_group_names_the_prefixed_grant_on_the_shared_group_once() -> None:
    acls, events = reporter()
    # every slice group of a layout refused, Describe (OffsetFetch) and Read (OffsetCommit): one grant is missing
    for s in (Slice(0, 2), Slice(1, 2), Slice(2, 3)):
        for operation in ("Describe", "Read"):
            text = acls.missing("Group", slice_group("orders", s), operation, "[sharing]")
            assert text == f"User:sluice may not {operation} Group:{slice_group('orders', s)}"
    assert [(e["resource"], e["operation"], e["grant"]) for e in events] == [
        ("Group:orders.sluice-slice-0-of-2", "Describe",
         "kafka-acls --add --allow-principal User:sluice --operation Read --operation Describe "
         "--resource-pattern-type prefixed --group orders")]


def test_other_refusals_name_that_permission_literally_once_each() -> None:
    acls, events = reporter()
    for _ in range(2):
        acls.missing("Topic", "payments", "Describe", "topic names")
        acls.missing("Group", "orders", "Describe", "[sharing]")
    assert [e["grant"] for e in events] == [
        "kafka-acls --add --allow-principal User:sluice --operation Describe --topic payments",
        "kafka-acls --add --allow-principal User:sluice --operation Describe --group orders"]
