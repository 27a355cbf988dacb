"""The sharing policy's metrics (cooperative consumption), on the proxy's registry."""

from __future__ import annotations

from typing import Final

from prometheus_client import CollectorRegistry, Counter, Gauge

from ...metrics import TallyFamily

#: why cooperative consumption left something unshared
NOT_SHARED_REASONS: Final[tuple[str, ...]] = (
    "kip848_group", "streams_group", "client_id_collision", "bad_marker", "bad_assignment", "member_unknown",
    "undecodable_batch")
#: why records were left out of a member's fetch response: another member's key slice, or already committed
FILTER_REASONS: Final[tuple[str, ...]] = ("other_slice", "committed")
#: what the read-ahead cursor did (proxy/policies/sharing/cursor.py)
READ_AHEAD_EVENTS: Final[tuple[str, ...]] = ("moved", "fetched_again", "forgotten", "advanced")


class SharingMetrics:
    """Shared partitions per group, records filtered, assignments rewritten, the decoded-batch cache."""

    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        # The group label is the one exception to "no client-chosen labels": an operator reads these per group,
        # and a group's children are removed when no member of it is behind this Sluice any more, so they are
        # bounded by the groups of the consumers this Sluice serves now.
        self.sharing_partitions = Gauge(
            "sluice_sharing_partitions",
            "Partitions split into key-hash slices among a group's members, as the members behind this Sluice hold "
            "them, by group.", ["group"], registry=r)
        self.sharing_partition_members = Gauge(
            "sluice_sharing_partition_members",
            "Members sharing each of those partitions (the most among them), by group.", ["group"], registry=r)
        self.sharing_stable_lag = Gauge(
            "sluice_sharing_stable_offset_lag",
            "Sum over a group's shared partitions of (the furthest slice position - the stable offset), as last "
            "computed at a commit through this Sluice: what a consumer resuming from the group's committed offset "
            "(one without Sluice, a lag tool) would read again.", ["group"], registry=r)
        self.sharing_records_filtered = Counter(
            "sluice_sharing_records_filtered_total",
            "Records left out of members' fetch responses, by reason: other_slice (another member's key slice) or "
            "committed (an earlier slice already committed it).", ["reason"], registry=r)
        self.sharing_filtered_bytes = Counter(
            "sluice_sharing_filtered_bytes_total",
            "Record bytes of the shared partitions Sluice filtered, as fetched (before filtering).", registry=r)
        self.sharing_assignments = Counter(
            "sluice_sharing_assignments_total",
            "Group assignments this Sluice rewrote as the group leader's (topics split into key-hash slices).",
            registry=r)
        self.sharing_not_shared = Counter(
            "sluice_sharing_not_shared_total",
            "Times cooperative consumption left something unshared, by reason: kip848_group (a KIP-848 member "
            "subscribed by regular expression), streams_group (a Kafka Streams member: its assignor maps partitions "
            "to tasks), "
            "client_id_collision (two members with one client.id and host behind one Sluice), "
            "bad_marker / bad_assignment (undecodable group protocol data), member_unknown (an opted-in client's "
            "fetches passed unfiltered: no group member seen for it), undecodable_batch (a batch passed unfiltered), "
            "slice_groups_refused (Sluice's login may not use a group's slice groups: learnt, and each member's "
            "join while it may not).",
            ["reason"], registry=r)
        self.sharing_withheld = Counter(
            "sluice_sharing_withheld_partitions_total",
            "Shared partitions whose records were withheld from a member whose slices Sluice did not know yet "
            "(after a Sluice restart, until the group tells it again), or whose topic id Sluice could not name "
            "yet (a failed lookup, asked again).", registry=r)
        self.sharing_rejoins = Counter(
            "sluice_sharing_rejoins_total",
            "Members Sluice asked to rejoin their group (a heartbeat answered REBALANCE_IN_PROGRESS).", registry=r)
        self.sharing_stable_raised = Counter(
            "sluice_sharing_stable_offsets_raised_total",
            "Partitions' group commits Sluice made as a member to raise the stable offset, after a concurrent commit "
            "of the partition left the group below it.", registry=r)
        self.sharing_read_ahead = Counter(
            "sluice_sharing_read_ahead_total",
            "The read-ahead cursor, by event: moved (a member's fetch of a partition sent upstream from past offsets "
            "Sluice read that hold nothing for it), fetched_again (a fetch that got nothing for the member sent "
            "upstream again, from there, within its wait), forgotten (the broker answered a moved offset out of "
            "range or diverging: the member fetches from its own offset again), advanced (a slice's position "
            "committed on by Sluice past offsets its member's fetches found nothing for it at).", ["event"],
            registry=r)
        self.sharing_cache_bytes = Gauge(
            "sluice_sharing_cache_bytes",
            "Bytes of decoded batches kept for the other members of a partition (sharing.cache_max_bytes).",
            registry=r)
        # told once per record set filtered: a plain number each (no lock), exported at scrape time
        self.sharing_cache_lookups = TallyFamily(
            "sluice_sharing_cache_lookups", "Decoded-batch cache lookups, by outcome: hit or miss.", "outcome",
            ("hit", "miss"))
        r.register(self.sharing_cache_lookups)
        self.sharing_group_calls = Counter(
            "sluice_sharing_group_calls_total",
            "Group requests of Sluice's own (slice positions and group descriptions), by outcome: ok or failed.",
            ["outcome"], registry=r)
        for outcome in ("ok", "failed"):
            self.sharing_group_calls.labels(outcome)
        for not_shared in NOT_SHARED_REASONS:
            self.sharing_not_shared.labels(not_shared)
        for filtered in FILTER_REASONS:
            self.sharing_records_filtered.labels(filtered)
        for event in READ_AHEAD_EVENTS:
            self.sharing_read_ahead.labels(event)
