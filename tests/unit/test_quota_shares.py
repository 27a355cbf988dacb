"""One quota for a fleet (proxy/policies/quota/shares.py), sans-IO: each instance's share from the usage reports
every instance publishes, max-min fair with a floor; a silent instance's share goes to the others; the usage topic
lost, the fallback to quota / instances last live. Three FleetShares stand for three instances; the test carries
each one's reports to the others (the usage topic's part) on one fake clock."""

from __future__ import annotations

import json

import pytest

from proxy.policies.quota.shares import FLOOR, GROWTH, SILENT_INTERVALS, FleetShares, water_fill

KEY = ("payments", "produce", None, "app", None)
Q = 3_000_000.0


def test_water_fill_meets_small_wants_and_splits_the_rest() -> None:
    assert water_fill(90, [float("inf")] * 3) == [30, 30, 30]
    assert water_fill(90, [10, float("inf"), float("inf")]) == [10, 40, 40]
    assert water_fill(90, [10, 20, 30]) == [20, 30, 40]  # nobody wants the last 30: spread equally
    assert sum(water_fill(90, [50, 50, 50])) == pytest.approx(90)


class Fleet:
    """Instances whose reports reach each other at every tick (``lost``: the ones whose topic is unreachable)."""

    def __init__(self, n: int) -> None:
        self.now = 0.0
        self.shares = {f"i{k}": FleetShares(me=f"i{k}") for k in range(n)}
        self.lost: set[str] = set()
        self.dead: set[str] = set()

    def tick(self, usage: dict[str, tuple[float, bool]]) -> None:
        """One interval: each live instance counted ``usage`` (bytes in the interval, throttled) and publishes."""
        self.now += 1.0
        reports = {}
        for name, s in self.shares.items():
            if name in self.dead:
                continue
            amount, throttled = usage.get(name, (0.0, False))
            if amount:
                s.used(KEY, amount, throttled, self.now - 0.1)  # throttled up to the interval's end
            reports[name] = s.report(self.now)
        for name, value in reports.items():
            if name in self.lost:
                continue
            for other, s in self.shares.items():
                if other not in self.dead and other not in self.lost:
                    s.offer(name, value, self.now)
        for s in self.shares.values():
            s.tick(self.now)

    def share(self, name: str) -> float:
        return self.shares[name].share(KEY, Q, self.now)


def greedy(names: list[str], fleet: Fleet) -> dict[str, tuple[float, bool]]:
    """Every named instance's clients want more than its share: it uses all of it and throttles."""
    return {n: (fleet.share(n), True) for n in names}


def test_instances_that_all_want_more_split_the_quota_equally() -> None:
    fleet = Fleet(3)
    for _ in range(3):
        fleet.tick(greedy(["i0", "i1", "i2"], fleet))
    assert [fleet.share(n) for n in ("i0", "i1", "i2")] == [pytest.approx(Q / 3)] * 3


def test_an_instance_whose_clients_left_keeps_a_floor_and_the_others_take_the_rest() -> None:
    fleet = Fleet(3)
    for _ in range(3):
        fleet.tick(greedy(["i0", "i1", "i2"], fleet))
    for _ in range(2):  # i2's clients moved to i0: i2 uses nothing
        fleet.tick(greedy(["i0", "i1"], fleet))
    floor = FLOOR * Q / 3
    assert fleet.share("i2") == pytest.approx(floor)
    assert fleet.share("i0") == pytest.approx((Q - floor) / 2)
    assert sum(fleet.share(n) for n in fleet.shares) == pytest.approx(Q)
    fleet.tick({**greedy(["i0", "i1"], fleet), "i2": (floor, True)})  # a client comes back to i2: it grows at once
    assert fleet.share("i2") == pytest.approx(Q / 3)


def test_an_instance_using_less_than_its_share_keeps_what_it_uses_and_room_to_grow() -> None:
    fleet = Fleet(2)
    for _ in range(2):
        fleet.tick({"i0": (fleet.share("i0"), True), "i1": (0.2 * Q, False)})
    assert fleet.share("i1") == pytest.approx(0.2 * Q * (1 + GROWTH))
    assert fleet.share("i0") == pytest.approx(Q - 0.2 * Q * (1 + GROWTH))


def test_a_killed_instances_share_goes_to_the_others() -> None:
    fleet = Fleet(3)
    for _ in range(3):
        fleet.tick(greedy(["i0", "i1", "i2"], fleet))
    fleet.dead.add("i2")  # kill -9: no more reports
    for _ in range(SILENT_INTERVALS):
        fleet.tick(greedy(["i0", "i1"], fleet))
    assert fleet.shares["i0"].live(fleet.now) == 3  # not yet silent long enough
    fleet.tick(greedy(["i0", "i1"], fleet))
    assert fleet.shares["i0"].live(fleet.now) == 2
    assert fleet.share("i0") == fleet.share("i1") == pytest.approx(Q / 2)


def test_the_usage_topic_lost_falls_back_to_the_quota_over_the_instances_last_live() -> None:
    fleet = Fleet(3)
    for _ in range(3):
        fleet.tick(greedy(["i0", "i1", "i2"], fleet))
    assert fleet.shares["i0"].state == "reachable"
    fleet.lost.add("i0")  # its reports no longer come back (nor do the others reach it)
    changes = []
    for _ in range(SILENT_INTERVALS + 1):
        fleet.tick(greedy(["i0", "i1", "i2"], fleet))
        changes.append(fleet.shares["i0"].state)
    assert changes[-1] == "unreachable" and fleet.share("i0") == pytest.approx(Q / 3)
    fleet.lost.clear()
    fleet.tick(greedy(["i0", "i1", "i2"], fleet))
    assert fleet.shares["i0"].state == "reachable"


def test_a_starting_instance_that_never_reads_its_reports_falls_back_to_the_whole_quota_alone() -> None:
    s = FleetShares(me="i0")
    for t in range(SILENT_INTERVALS + 1):
        s.tick(float(t))
        assert s.state == "starting"
    s.tick(SILENT_INTERVALS + 0.5)
    assert s.state == "unreachable" and s.share(KEY, Q, 4.0) == Q  # it never knew another instance


def test_reports_that_are_not_reports_are_skipped() -> None:
    s = FleetShares(me="i0")
    assert not s.offer("i1", b"not json", 0.0)
    assert not s.offer("i1", b'{"schema": 99, "instance": "i1", "usage": []}', 0.0)
    assert not s.offer("i2", b'{"schema": 1, "instance": "i1", "usage": []}', 0.0)  # keyed by another
    assert not s.offer("i1", b'{"schema": 1, "instance": "i1", "usage": [["x"]]}', 0.0)
    assert s.offer("i1", b'{"schema": 1, "instance": "i1", "interval_s": 1.0, "usage": []}', 0.0)
    assert s.live(0.0) == 2


def test_a_client_arriving_at_an_idle_instance_gets_an_equal_share_at_once() -> None:
    """Held to the idle floor, its first request would wait seconds; the instance counts itself among those that
    want more from its first throttle, and holds the client to an equal share (and never more than two intervals)."""
    from proxy.app import load_settings
    from proxy.policies.quota.book import QuotaBook, Quotas

    settings = load_settings(None, env={}).with_overrides({"fleet.enabled": True, "fleet.name": "f", "quota.entries": [
        {"name": "payments", "client_id": "app", "produce_rate_bytes": int(Q), "scope": "fleet"}]})
    shares = FleetShares(me="i0")
    book = QuotaBook(Quotas.from_settings(settings.quota), shares)
    for other in ("i1", "i2"):  # both hold half the quota and want more
        shares.offer(other, json.dumps({"schema": 1, "instance": other, "interval_s": 1.0, "usage": [
            [*KEY, Q / 2, True]]}).encode(), 0.0)
    [entry] = book.quotas.entries
    assert entry.key("produce", "app", None, "") == KEY
    delay = book.record(entry, "produce", int(Q / 3), KEY, 0.0)  # a second of an equal share, at once
    assert book.rates[KEY].bound == pytest.approx(Q / 3, rel=0.01)
    assert delay == pytest.approx(0.0, abs=0.01)
    delay = book.record(entry, "produce", int(Q), KEY, 0.0)  # far more: held two intervals at most
    assert delay == pytest.approx(2.0)


def test_an_instance_whose_client_stopped_early_in_the_interval_wants_no_more() -> None:
    s = FleetShares(me="i0")
    s.used(KEY, 100.0, True, 0.1)  # throttled early on, then its client left
    s.report(1.0)
    assert s.share(KEY, Q, 1.0) == Q  # alone: all of it, whatever it wants
    s.offer("i1", json.dumps({"schema": 1, "instance": "i1", "interval_s": 1.0, "usage": [[*KEY, Q, True]]}).encode(),
            1.0)
    assert s.share(KEY, Q, 1.0) == pytest.approx(max(FLOOR * Q / 2, 100.0 * (1 + GROWTH)))


def test_ticks_resumed_after_a_pause_start_over_rather_than_report_the_topic_lost() -> None:
    s = FleetShares(me="i0")
    s.tick(0.0)
    s.offer("i0", s.report(0.0), 0.0)
    assert s.tick(1.0) == "reachable"
    assert s.tick(100.0) is None and s.state == "starting"  # no fleet quota meanwhile: not a lost topic
    s.offer("i0", s.report(100.5), 100.5)
    assert s.tick(101.0) == "reachable"
