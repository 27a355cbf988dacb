"""The sharing policy's row of Sluice's Grafana dashboard (``Registration.dashboard``)."""

from __future__ import annotations

from ...dashboard import Panel, Row, rate, sel

ROW = Row("Cooperative consumption", [
    Panel("Shared partitions and members per partition", "none",
          "sluice_sharing_partitions: partitions split into key-hash slices among each group's members (as the "
          "members behind this Sluice hold them); sluice_sharing_partition_members: members sharing each.",
          [(f"max by (group) ({sel('sluice_sharing_partitions')})", "{{group}} partitions"),
           (f"max by (group) ({sel('sluice_sharing_partition_members')})", "{{group}} members/partition")],
          width=8),
    Panel("Stable-offset lag by group", "short",
          "sluice_sharing_stable_offset_lag: how far the furthest slice is ahead of the group's committed "
          "(stable) offset, summed over its shared partitions: what a consumer resuming from the group's offset "
          "without Sluice would read again. Rising without bound = a slice that no longer commits.",
          [(f"max by (group) ({sel('sluice_sharing_stable_offset_lag')})", "{{group}}")], width=8),
    Panel("Records filtered/s by reason, read-ahead", "cps",
          "sluice_sharing_records_filtered_total: records left out of members' fetch responses (other_slice: "
          "another member's keys; committed: an earlier slice committed them); "
          "sluice_sharing_filtered_bytes_total: record bytes of the partitions filtered (as fetched); "
          "sluice_sharing_read_ahead_total by event: fetch offsets moved past what Sluice read with nothing for "
          "the member, fetches sent again within the client's wait, read-aheads forgotten (the broker answered "
          "a moved offset out of range), slice positions Sluice committed on itself (advanced).",
          [(rate("sluice_sharing_records_filtered_total", by="reason"), "{{reason}}"),
           (rate("sluice_sharing_filtered_bytes_total"), "bytes filtered/s"),
           (rate("sluice_sharing_read_ahead_total", by="event"), "read-ahead {{event}}")], width=8),
    Panel("Not shared, withheld and rejoins/s", "cps",
          "sluice_sharing_not_shared_total by reason (kip848_group, client_id_collision, bad_marker, "
          "bad_assignment, member_unknown, undecodable_batch); sluice_sharing_withheld_partitions_total: "
          "partitions withheld from a member not yet known (after a restart); sluice_sharing_rejoins_total; "
          "sluice_sharing_assignments_total: assignments rewritten as group leader; "
          "sluice_sharing_stable_offsets_raised_total: group commits Sluice made as a member to raise a "
          "stable offset a concurrent commit left behind.",
          [(rate("sluice_sharing_not_shared_total", by="reason"), "not shared: {{reason}}"),
           (rate("sluice_sharing_withheld_partitions_total"), "withheld partitions"),
           (rate("sluice_sharing_rejoins_total"), "rejoins"),
           (rate("sluice_sharing_assignments_total"), "assignments rewritten"),
           (rate("sluice_sharing_stable_offsets_raised_total"), "stable offsets raised")]),
    Panel("Decoded-batch cache and own group requests", "short",
          "sluice_sharing_cache_bytes (sharing.cache_max_bytes), sluice_sharing_cache_lookups_total by outcome "
          "(hit/miss per second); sluice_sharing_group_calls_total: Sluice's own slice-position and group "
          "requests per second, ok or failed.",
          [(f"sum by (instance) ({sel('sluice_sharing_cache_bytes')})", "{{instance}} cache bytes"),
           (rate("sluice_sharing_cache_lookups_total", by="outcome"), "cache {{outcome}}/s"),
           (rate("sluice_sharing_group_calls_total", by="outcome"), "group calls {{outcome}}/s")]),
])
