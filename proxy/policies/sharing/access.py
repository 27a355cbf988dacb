"""Whether Sluice's own login may use a shared group's slice groups, asked of the cluster before a group is shared.

Each slice's position lives in a group of its own, ``<group>.sluice-slice-<i>-of-<n>`` (:func:`.frontier.slice_group`),
which Sluice's principal reads and commits: on a cluster with an authorizer it needs Read and Describe on the prefix
``<group>`` (docs/security.md, Kafka ACLs). A literal grant on the group alone, the usual grant for a consumer
group, leaves every slice group refused (GROUP_AUTHORIZATION_FAILED), and a group shared regardless could never
read or commit its slices: its members' OffsetFetch would be told to retry for as long as the grant is missing.

So before the first rebalance Sluice shares a group in, it reads one slice group's offsets (one OffsetFetch, no
partition) with its own login, and a refused group is **consumed unshared**, as without Sluice, said once a minute
(``sharing_slice_groups_refused``, beside the ``kafka_not_authorized`` event naming the grant): nothing waits on a
grant, nothing is read twice that was committed. A refusal learnt later, from a read of a group already shared (the
grant revoked), is filed the same way: a classic group's members holding slices are made to rejoin unshared
(:mod:`.groups`), a KIP-848 group's are handed the broker's assignment as it stands (:mod:`.heartbeats`); a slice
that widens to its whole partition is taken from the client first, as whenever a slice changes. A refused group is
asked again at a rebalance or a member's heartbeat at least :data:`RECHECK_S` after: once granted, its classic
members are made to rejoin and its KIP-848 members are marked again, so the group is shared within about that long
of the grant. A check that fails for another reason (a timeout, the coordinator moving) decides nothing: the group
is shared as if granted, its calls retried as any.

Sans-IO: the check is a :class:`~.group_calls.GroupCall` submitted through the state's ``submit`` and waited for as
a request's ``pending``; the clock is injected.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from .frontier import SLICE_GROUP_INFIX, slice_group
from .group_calls import GroupCall
from .keys import Slice

__all__ = ["RECHECK_S", "Checking", "SliceAccess"]

#: a group found refused is asked again at its first rebalance after this long (a grant added meanwhile then counts)
RECHECK_S = 30.0
#: the slice group the check reads: any slice group's name falls under the prefix grant the table asks for
_CHECKED = Slice(0, 2)


@dataclass(frozen=True, slots=True)
class Checking:
    """A group request that waits for its group's check (its policy's state meanwhile: run again once settled)."""

    group: str


class SliceAccess:
    """What Sluice knows of its own access to each shared group's slice groups."""

    def __init__(self, submit: Callable[[GroupCall], GroupCall], clock: Callable[[], float],
                 granted: Callable[[str], None]) -> None:
        #: ``granted(group)``: a group found refused before is granted now
        self._submit, self._clock, self._on_granted = submit, clock, granted
        self._granted: set[str] = set()
        #: group -> when a refusal was learnt (and why)
        self._refused: dict[str, tuple[float, str]] = {}
        #: group -> when a check failed for another reason (undecided: shared meanwhile)
        self._failed: dict[str, float] = {}
        self._checks: dict[str, GroupCall] = {}

    def check(self, group: str) -> GroupCall | None:
        """None when what is known of ``group`` decides a rebalance (:meth:`refused` says how); else the check a
        request waits for (started here, or already running)."""
        if group in self._granted:
            return None
        running = self._checks.get(group)
        if running is not None:
            return running
        now = self._clock()
        learnt = self._refused.get(group)
        at = learnt[0] if learnt is not None else self._failed.get(group)
        if at is not None and now - at < RECHECK_S:
            return None
        call = self._checks[group] = GroupCall(reads={slice_group(group, _CHECKED): set()},
                                               purpose="[sharing]: the slice groups of a shared group")
        self._submit(call)
        call.on_settled(lambda: self._checked(group, call))
        return call

    def _checked(self, group: str, call: GroupCall) -> None:
        self._checks.pop(group, None)
        if call.refused:
            return  # filed by learn(), which sees every call first
        if call.error is None:
            self._granted.add(group)
            self._failed.pop(group, None)
            if self._refused.pop(group, None) is not None:
                self._on_granted(group)
        else:
            self._failed[group] = self._clock()

    def refused(self, group: str) -> str | None:
        """Why ``group``'s slice groups are refused to Sluice's login, or None (granted, or not known to be
        refused)."""
        learnt = self._refused.get(group)
        return learnt[1] if learnt is not None else None

    def learn(self, call: GroupCall) -> list[str]:
        """A settled call of Sluice's: the shared groups it found refused, newly (none if it was not refused).
        Refused as the check sees it (the group's Describe: FindCoordinator, OffsetFetch), so that a grant found by
        a check holds: a commit refused for want of Read (on a slice group or the topic, which a check could only
        see by writing a commit) is the commit's to report and retry (:mod:`.offsets`, ``kafka_not_authorized``),
        not a reason to unshare a group that the next check would share again."""
        if not call.refused:
            return []
        why = call.error or "refused"
        new = []
        for group in sorted(shared_groups(call.groups)):
            if group not in self._refused:
                new.append(group)
            self._granted.discard(group)
            self._refused[group] = (self._clock(), why)
        return new


def shared_groups(groups: Iterable[str]) -> set[str]:
    """The consumer groups whose slice groups (or themselves) ``groups`` are."""
    return {g.split(SLICE_GROUP_INFIX, 1)[0] for g in groups}
