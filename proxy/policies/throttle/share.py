"""Consumer throttles on share consumers (KIP-932 ShareFetch), bounded on the request side only.

A Fetch response can be trimmed: the records left out are simply fetched again. A ShareFetch response cannot. The
broker *acquires* every record it puts in a ShareFetch response for that member; records cut from it stay acquired
until the acquisition lock times out (``group.share.record.lock.duration.ms``, 30 s), each such round counts
toward the delivery count limit (``group.share.delivery.count.limit``, 5), and past it the broker archives them:
lost to the group (KIP-932, "In-flight records"; SharePartition.acquire). So Sluice never edits a ShareFetch
response, and never drops a ShareFetch request's acknowledgements.

Nor can it leave a partition out of a ShareFetch request: a share session's incremental request lists only the
partitions it adds or acknowledges, and the broker fetches from every partition cached in the session
(ShareSessionContext.getErroneousAndValidTopicIdPartitions, subsequent requests); leaving a partition out of the
request that opens a session (epoch 0) would drop it from the broker's session while the client's
ShareSessionHandler still believes it in, so it would never be fetched again.

What is left, and what this module does:

- the request's ``MaxBytes`` is lowered to the quota's headroom (at least 1 byte: the broker still returns one
  batch, KIP-74's progress rule) when the connection's share session holds a throttled partition, so one response
  cannot carry much more than the quota allows now;
- every throttled partition's record bytes in the response count against the leader quota (as for a consumer's
  Fetch), and when the quota is exceeded the client is muted for the quota's throttle time (KIP-219 muting: the
  next ShareFetch, and the acknowledgements it carries, wait). The mute is capped at half the acquisition lock the
  response announces (``AcquisitionLockTimeoutMs``), so the records the client holds are acknowledged before
  their lock lapses: a throttle slows a share consumer, it never makes the broker redeliver.

Share sessions stay as the client made them: epochs and partitions pass unchanged (only ``MaxBytes`` changes).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ...core.rate import WindowedRate

#: ShareFetch/ShareAcknowledge ShareSessionEpoch values (KIP-932, ShareRequestMetadata): open a session, close it
INITIAL_EPOCH = 0
FINAL_EPOCH = -1
#: the mute never exceeds this share of the acquisition lock the broker announced
LOCK_SHARE = 0.5


@dataclass(slots=True)
class ShareSession:
    """The partitions (topic id, partition) of one connection's share session, as the client's requests define
    it (ShareSessionHandler): an epoch-0 request opens it with the partitions listed, later ones add the listed
    partitions and remove the forgotten ones, the final one (epoch -1) closes it."""

    partitions: set[tuple[bytes, int]] = field(default_factory=set)

    def update(self, body: Any) -> None:
        epoch = body.share_session_epoch
        if epoch == INITIAL_EPOCH:
            self.partitions.clear()
        for topic in body.topics or ():
            tid = bytes(topic.topic_id)
            for p in topic.partitions or ():
                self.partitions.add((tid, p.partition_index))
        for topic in body.forgotten_topics_data or ():
            tid = bytes(topic.topic_id)
            for index in topic.partitions or ():
                self.partitions.discard((tid, index))


def clamp_max_bytes(body: Any, headroom: float) -> bool:
    """Lower the request's MaxBytes to ``headroom`` (at least 1); True if it changed."""
    if headroom == float("inf"):
        return False
    bound = max(1, int(headroom))
    if body.max_bytes > bound:
        body.max_bytes = bound
        return True
    return False


def throttled_bytes(body: Any, throttled: Any) -> tuple[int, list[bytes]]:
    """Record bytes of the throttled partitions of a ShareFetch response (``throttled(topic_id, partition)`` ->
    True/False, or None when the topic id has no name yet), and the ids that had none."""
    sent = 0
    unnamed: list[bytes] = []
    for topic in body.responses or ():
        tid = bytes(topic.topic_id)
        for p in topic.partitions or ():
            size = len(p.records) if p.records else 0
            if not size:
                continue
            verdict = throttled(tid, p.partition_index)
            if verdict is None:
                unnamed.append(tid)
            elif verdict:
                sent += size
    return sent, unnamed


def mute_for(quota: WindowedRate, lock_timeout_ms: int, now: float) -> float:
    """How long to stop reading the client (0: within the quota): the quota's throttle time, capped by the
    acquisition lock (see the module docstring)."""
    return within_lock(quota.throttle_time(now), lock_timeout_ms)


def within_lock(wait: float, lock_timeout_ms: int) -> float:
    """``wait`` capped at :data:`LOCK_SHARE` of the acquisition lock the broker announced (0 or less: none
    announced, no cap): a share consumer muted for that long still acknowledges its records before their lock
    lapses (the client quotas hold share consumers this way too, proxy/policies/quota)."""
    if wait <= 0:
        return 0.0
    if lock_timeout_ms > 0:
        wait = min(wait, lock_timeout_ms / 1000.0 * LOCK_SHARE)
    return wait
