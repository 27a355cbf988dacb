"""The Kafka ACLs Sluice's own principals need on a cluster with an authorizer: one list, from which docs/security.md's
table is made (``python -m proxy.kafka_acls`` prints it; a unit test holds the page to it), which the rig applies
to its locked-down broker (``allow.everyone.if.no.acl.found=false``) and which names what is missing when a call is
refused (:class:`AclReporter`: one log event per missing permission, never a misleading one). Sans-IO.

Three principals (Kafka's ``User:<name>``; Sluice logs in as ``[upstream.sasl]``, or ``[fleet.sasl]`` for the
fleet, or ``logging.access_log_kafka.properties`` for the access log):

- ``instance``: every Sluice instance (its own requests: topic names, cooperative consumption's group calls, the
  access log, following the fleet and publishing its status);
- ``writer``: besides the ``instance`` rows, the instances whose admin API may change the fleet;
- ``reader``: ``sluice fleet status`` and ``sluice fleet history`` (read only).

Names are templates: ``{fleet}`` the fleet's name, ``{topic}`` a topic clients fetch through Sluice, ``{group}``
a shared consumer group, ``{shared_topic}`` a shared topic, ``{access_log_topic}`` the access log's topic.
Kafka's implications (``Read``, ``Write`` imply ``Describe``: Kafka's AclEntry) keep the rows short. Kafka 3.0+
lets ``Write`` on a topic stand for ``IdempotentWrite`` on the cluster (KIP-679), so the idempotent producers
(status, access log) need nothing more.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

__all__ = ["ACLS", "Acl", "AclReporter", "Grant", "Role", "grants", "principal_name", "readme_table"]

Role = Literal["instance", "writer", "reader"]
Resource = Literal["Topic", "Group", "TransactionalId", "Cluster"]
Pattern = Literal["literal", "prefixed"]

CONTROL, STATUS, HISTORY = "sluice-fleet-{fleet}", "sluice-fleet-{fleet}-status", "sluice-fleet-{fleet}-history"
#: between a shared group's id and its slice's name in the group holding that slice's positions
#: (proxy/policies/sharing/frontier.py slice_group): the group id first, so the prefixed grant on it covers them all
SLICE_GROUP_INFIX = ".sluice-slice-"
USAGE = USAGE_GROUP = "sluice-fleet-{fleet}-usage"
FLEET_GROUP = TRANSACTIONAL_ID = "sluice-fleet-{fleet}"


@dataclass(frozen=True, slots=True)
class Acl:
    """One row of the table: ``role`` may ``operations`` on ``resource`` ``name`` (a template) for ``needed_by``."""

    role: Role
    resource: Resource
    name: str
    operations: tuple[str, ...]
    needed_by: str
    pattern: Pattern = "literal"


ACLS: tuple[Acl, ...] = (
    # --- every instance: its own requests (proxy/io/cluster.py) ---
    Acl("instance", "Topic", "{topic}", ("Describe",),
        "topic names of Fetch v13+ (Metadata by topic id): throttles, budgets and sharing by topic name"),
    Acl("instance", "Group", "{group}", ("Read", "Describe"),
        "[sharing]: the group described, its slice groups `{group}.sluice-slice-*` committed and read "
        "(FindCoordinator, OffsetCommit, OffsetFetch, DescribeGroups, ConsumerGroupDescribe)", "prefixed"),
    Acl("instance", "Topic", "{shared_topic}", ("Read",), "[sharing]: the slices' commits (OffsetCommit)"),
    # --- the access log to Kafka (proxy/accesslog_kafka.py), as logging.access_log_kafka.properties logs in ---
    Acl("instance", "Topic", "{access_log_topic}", ("Write",), "[logging.access_log_kafka]: every access-log event"),
    # --- [quota]'s fleet-scoped quotas (proxy/fleet/usage.py): every instance reports its usage and reads the others'
    Acl("instance", "Topic", USAGE, ("Read", "Write"),
        "[quota] entries with scope = \"fleet\": each instance's usage reports, read back by every instance"),
    Acl("instance", "Group", USAGE_GROUP, ("Describe",),
        "[quota] fleet scope: librdkafka's usage reader looks its group's coordinator up (nothing is committed)"),
    # --- the fleet (proxy/fleet/): following it, its status ---
    Acl("instance", "Topic", CONTROL, ("Read", "DescribeConfigs"),
        "[fleet]: following the control topic; its compaction settings checked at start-up"),
    Acl("instance", "Group", FLEET_GROUP, ("Describe",),
        "[fleet]: librdkafka's consumers look their group's coordinator up (nothing is committed)"),
    Acl("instance", "Topic", STATUS, ("Write",), "[fleet]: the instance's status records"),
    Acl("instance", "Topic", "sluice-fleet-{fleet}", ("Create",),
        "[fleet]: the fleet's topics created when missing (not needed when they are created beforehand)",
        "prefixed"),
    # --- the instances whose admin API may change the fleet (proxy/fleet/writer.py) ---
    Acl("writer", "TransactionalId", TRANSACTIONAL_ID, ("Write",),
        "[fleet] changes: one transaction per change, fencing the other writers (KIP-98)"),
    Acl("writer", "Topic", CONTROL, ("Write",), "[fleet] changes: the control record"),
    Acl("writer", "Topic", HISTORY, ("Read", "Write"), "[fleet] changes: the history record; rollback reads it"),
    # --- sluice fleet status | history ---
    Acl("reader", "Topic", CONTROL, ("Read",), "`sluice fleet status`: the fleet's revisions"),
    Acl("reader", "Topic", STATUS, ("Read",), "`sluice fleet status`: the instances"),
    Acl("reader", "Topic", HISTORY, ("Read",), "`sluice fleet history`"),
    Acl("reader", "Group", FLEET_GROUP, ("Describe",), "librdkafka's consumers look their group's coordinator up"),
)

_ROLE_TEXT = {"instance": "every instance", "writer": "instances that change the fleet",
              "reader": "fleet status, history"}


def readme_table() -> str:
    """docs/security.md's ACL table (Markdown), placeholders as ``<fleet>``..."""
    rows = ["| principal | resource | name | pattern | operations | needed for |", "|---|---|---|---|---|---|"]
    for acl in ACLS:
        name = acl.name.replace("{", "<").replace("}", ">")
        rows.append(f"| {_ROLE_TEXT[acl.role]} | {acl.resource} | `{name}` | {acl.pattern} | "
                    f"{', '.join(acl.operations)} | {acl.needed_by.replace('{', '<').replace('}', '>')} |")
    return "\n".join(rows) + "\n"


@dataclass(frozen=True, slots=True)
class Grant:
    """One ACL to create: ``operation`` on ``resource`` ``name`` (placeholders filled in)."""

    resource: Resource
    name: str
    pattern: Pattern
    operation: str


def grants(roles: Iterable[Role], names: Mapping[str, str]) -> list[Grant]:
    """The ACLs of ``roles`` with the placeholders filled from ``names``; rows whose placeholders ``names`` leaves
    out are left out (e.g. no ``group``: sharing is not used)."""
    wanted = set(roles)
    out: list[Grant] = []
    for acl in ACLS:
        if acl.role not in wanted:
            continue
        try:
            name = acl.name.format(**names)
        except KeyError:
            continue
        out.extend(Grant(acl.resource, name, acl.pattern, op) for op in acl.operations)
    return out


def principal_name(sasl_username: str, tls_client_cert: str = "") -> str:
    """The principal a broker sees for Sluice's own login: ``User:<name>`` with SASL (Kafka's default
    principal builder); with TLS client certificates only, the certificate's subject (named by its file)."""
    if sasl_username:
        return f"User:{sasl_username}"
    if tls_client_cert:
        return f"the subject of {tls_client_cert}"
    return "User:ANONYMOUS"


def acl_command(principal: str, resource: str, name: str, operations: Iterable[str],
                pattern: Pattern = "literal") -> str:
    """The kafka-acls.sh line that grants it (Kafka's tool, ``--<resource>``; ``--resource-pattern-type`` for a
    prefixed grant)."""
    flag = {"Topic": "--topic", "Group": "--group", "TransactionalId": "--transactional-id",
            "Cluster": "--cluster"}.get(resource, f"--{resource.lower()}")
    target = flag if resource == "Cluster" else f"{flag} {name}"
    ops = " ".join(f"--operation {op}" for op in operations)
    kind = " --resource-pattern-type prefixed" if pattern == "prefixed" else ""
    return f"kafka-acls --add --allow-principal {principal} {ops}{kind} {target}"


def covering_grant(resource: str, name: str, operation: str) -> tuple[str, Pattern, tuple[str, ...]]:
    """The grant to name for a refused ``operation`` on ``resource`` ``name``: (name, pattern, operations). A slice
    group's refusal names the table's prefixed grant on the shared group, both its operations: slice groups come
    and go with the number of members (``-1-of-3``...), so a literal grant on the one refused would hold only
    until the next layout, and its commits need Read too. Anything else: that permission, literally."""
    if resource == "Group" and SLICE_GROUP_INFIX in name:
        row = next(a for a in ACLS if a.role == "instance" and a.resource == "Group" and a.name == "{group}")
        return name.split(SLICE_GROUP_INFIX, 1)[0], row.pattern, row.operations
    return name, "literal", (operation,)


class AclReporter:
    """One log event per missing permission (``kafka_not_authorized``: principal, resource, operation, what needs
    it, and the kafka-acls line that grants it); ``emit`` is a structlog-style ``log.warning``."""

    def __init__(self, principal: str, emit: Callable[..., object]) -> None:
        self.principal = principal
        self._emit = emit
        self._seen: set[tuple[str, str, str]] = set()

    def missing(self, resource: str, name: str, operation: str, needed_by: str, error: str = "") -> str:
        """Report (once) and return the one-line description: ``User:x may not Write Topic:y``."""
        text = f"{self.principal} may not {operation} {resource}:{name}"
        granted, pattern, operations = covering_grant(resource, name, operation)
        # once per missing grant: every slice group of a shared group is missing the same one
        key = (resource, granted, operation if pattern == "literal" else pattern)
        if key not in self._seen:
            self._seen.add(key)
            self._emit("kafka_not_authorized", principal=self.principal, resource=f"{resource}:{name}",
                       operation=operation, needed_by=needed_by, error=error,
                       grant=acl_command(self.principal, resource, granted, operations, pattern))
        return text


if __name__ == "__main__":
    print(readme_table(), end="")
