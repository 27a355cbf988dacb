"""The fleet's sans-IO core (proxy/fleet/records.py, status.py, history.py, topics.py's settings check): record
schema, revisions that are offsets, folding in topic order (compacted or not), the revision check, the status table
(drift, silent, forgotten), the history's rows. The I/O is tests/cluster/test_fleet.py's."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from proxy.app import load_settings
from proxy.config import ConfigError
from proxy.fleet.history import Entry, history_rows
from proxy.fleet.kafka_config import client_config
from proxy.fleet.records import (
    SCHEMA,
    Change,
    Conflict,
    FleetState,
    Skipped,
    check_based_on,
    decode,
    encode,
    settings_hash,
)
from proxy.fleet.status import StatusRecord, fleet_table
from proxy.fleet.topics import config_drift

SETTINGS = load_settings(None, env={})
SECTIONS = tuple(SETTINGS.dynamic_sections)
SECTION = "throttle"
assert SECTION in SECTIONS

Log = list[tuple[bytes, bytes | None]]


def _validate(section: str, values: dict[str, Any]) -> Any:
    return getattr(SETTINGS.with_overrides({section: values}), section)


def _state(validate: Any = _validate) -> FleetState:
    return FleetState("blue", SECTIONS, validate)


def _record(settings: dict[str, Any] | None = None, **over: Any) -> tuple[bytes, bytes]:
    return encode(Change(over.pop("fleet", "blue"), over.pop("section", SECTION), over.pop("revision", 1),
                         settings or {}, "ops", "2026-01-01T00:00:00Z"))


def _fold(state: FleetState, log: Log, offsets: list[int] | None = None) -> FleetState:
    for (key, value), offset in zip(log, offsets or range(len(log)), strict=True):
        try:
            state.offer(key, value, offset)
        except Skipped:
            pass
    return state


def test_a_record_round_trips_and_its_revision_is_its_offset() -> None:
    change = Change("blue", SECTION, 3, {"a": 1}, "ops", "2026-01-01T00:00:00Z")
    key, value = encode(change)
    assert key == SECTION.encode()
    assert json.loads(value)["schema"] == SCHEMA
    # the payload's revision (what an older Sluice numbered) is not the revision: the offset is
    assert decode(key, value, 41, "blue", SECTIONS) == Change("blue", SECTION, 42, {"a": 1}, "ops",
                                                              "2026-01-01T00:00:00Z")
    assert decode(key, None, 7, "blue", SECTIONS) == Change("blue", SECTION, 8, None)  # a tombstone: a delete


@pytest.mark.parametrize(("key", "value", "reason"), [
    (b"x", b"\xff\xfe not json", "garbage"),
    (b"x", b"[1, 2]", "garbage"),
    (SECTION.encode(), json.dumps({"schema": 99}).encode(), "schema"),
    (SECTION.encode(), json.dumps({"schema": SCHEMA, "revision": 1, "settings": []}).encode(), "garbage"),
    (b"other", _record()[1], "garbage"),  # key and section differ
    (b"listen", None, "section"),  # a tombstone of a section not changeable at run time
])
def test_bad_records_are_skipped_with_their_reason(key: bytes, value: bytes | None, reason: str) -> None:
    with pytest.raises(Skipped) as caught:
        decode(key, value, 0, "blue", SECTIONS)
    assert caught.value.reason == reason


def test_another_fleets_and_static_sections_records_are_skipped() -> None:
    with pytest.raises(Skipped, match="fleet"):
        _state().offer(*_record(fleet="green"), 0)
    key, value = encode(Change("blue", "listen", 1, {}))
    with pytest.raises(Skipped) as caught:
        _state().offer(key, value, 0)
    assert caught.value.reason == "section"


def test_changes_fold_in_order_invalid_keeps_the_last_good_and_a_tombstone_hands_the_section_back() -> None:
    state = _state()
    change, validated = state.offer(*_record({"leader_rate_bytes": 5}), 0)
    assert (change.revision, state.revision(SECTION)) == (1, 1)
    assert validated.leader_rate_bytes == 5
    with pytest.raises(Skipped) as stale:
        state.offer(*_record(), 0)  # the same record again
    assert stale.value.reason == "stale"
    with pytest.raises(Skipped) as invalid:
        state.offer(*_record({"no_such_key": 1}), 3)
    assert invalid.value.reason == "invalid" and "no_such_key" in invalid.value.detail
    # the invalid record is the section's latest (every version agrees on the revision), the last good stays
    assert state.revision(SECTION) == 4 and state.settings_of()[SECTION]["leader_rate_bytes"] == 5
    change, validated = state.offer(SECTION.encode(), None, 9)
    assert (change.settings, validated, state.revision(SECTION)) == (None, None, 10)
    assert SECTION not in state.settings_of()  # the instance's own settings again


def test_a_compacted_topic_folds_to_what_the_whole_topic_folds_to() -> None:
    """Set, set, delete, set again: an instance that read every record and one that starts after the cleaner
    kept only the latest record per key (offsets kept, the tombstone gone) agree on settings and revisions."""
    log: Log = [_record({"leader_rate_bytes": 1}), _record({}, section="size_limit"),
                _record({"leader_rate_bytes": 3}), (SECTION.encode(), None), _record({"leader_rate_bytes": 4})]
    whole = _fold(_state(), log)
    compacted = _fold(_state(), [log[1], log[4]], [1, 4])
    assert whole.revisions() == compacted.revisions() == {**dict.fromkeys(SECTIONS, 0), SECTION: 5,
                                                          "size_limit": 2}
    assert whole.settings_of() == compacted.settings_of()
    assert whole.hashes() == compacted.hashes()


def test_a_writer_with_other_validation_agrees_on_revisions_and_never_reuses_one() -> None:
    """An older Sluice (simulated: its validation refuses what this one accepts) folds the same records: it skips
    one as invalid, yet counts its revision, so a change based on what it read is no conflict, and the change it
    writes lands at an offset of its own: a revision nobody has."""

    def older(section: str, values: dict[str, Any]) -> Any:
        if values.get("leader_rate_bytes", 0) > 100:
            raise ConfigError(f"{section}.leader_rate_bytes", "above what this version allows")
        return _validate(section, values)

    log: Log = [_record({"leader_rate_bytes": 50}), _record({"leader_rate_bytes": 500})]
    new, old = _fold(_state(), log), _fold(_state(older), log)
    assert new.revision(SECTION) == old.revision(SECTION) == 2
    assert new.hashes() != old.hashes()  # what `sluice fleet status` shows as drift
    check_based_on(new, SECTION, old.revision(SECTION))  # no conflict
    log.append(_record({"leader_rate_bytes": 60}, revision=old.revision(SECTION) + 1))  # the older writer's
    revisions = [c.revision for c in (decode(k, v, o, "blue", SECTIONS) for o, (k, v) in enumerate(log))]
    assert revisions == [1, 2, 3] and len(set(revisions)) == len(revisions)
    assert _fold(_state(), log).settings_of()[SECTION]["leader_rate_bytes"] == 60


def test_a_change_based_on_an_older_revision_is_a_conflict() -> None:
    state = _fold(_state(), [_record(), _record()])
    check_based_on(state, SECTION, None)  # unconditional (--force)
    check_based_on(state, SECTION, 2)
    check_based_on(state, SECTION, 7)  # counted records since compacted away: no conflict
    with pytest.raises(Conflict) as caught:
        check_based_on(state, SECTION, 1)
    assert (caught.value.based_on, caught.value.current) == (1, 2)


def _status(instance: str, revision: int, age_s: float, now: datetime, digest: str = "h1",
            topic: str = "t1") -> StatusRecord:
    at = (now - timedelta(seconds=age_s)).isoformat().replace("+00:00", "Z")
    return StatusRecord("blue", instance, "h", 1, "1.0", at, at, {"bootstrap": 9092}, {SECTION: revision},
                        {SECTION: digest}, topic)


def test_the_status_table_says_up_lagging_drift_silent_and_forgets_the_long_silent() -> None:
    now = datetime(2026, 1, 1, tzinfo=UTC)
    records = [_status("c", 2, 1, now), _status("a", 2, 0, now), _status("b", 1, 2, now),
               _status("d", 2, 60, now), _status("e", 2, 1, now, digest="h2"), _status("f", 2, 1, now, topic="t0"),
               _status("g", 2, 90_000, now)]
    assert StatusRecord.decode(records[0].encode()[1]) == records[0]
    assert StatusRecord.decode(b"garbage") is None
    rows = fleet_table(records, {SECTION: 2}, {SECTION: "h1"}, now, 5.0, 86_400.0, "t1")
    assert [(r["instance"], r["state"]) for r in rows] == [
        ("a", "up"), ("b", "lagging"), ("c", "up"), ("d", "silent"), ("e", "drift"), ("f", "lagging")]
    silent = next(r for r in rows if r["instance"] == "d")
    assert silent["since"] == records[3].published_at and silent["last_seen_s"] == 60
    assert next(r for r in rows if r["instance"] == "e")["drift"] == SECTION


def test_the_history_says_who_changed_what() -> None:
    entries = [Entry("blue", SECTION, 9, {"leader_rate_bytes": 2}, "bob", "t2", 4),
               Entry("blue", SECTION, 4, {"leader_rate_bytes": 1}, "alice", "t1"),
               Entry("blue", "quota", 6, {}, "alice", "t1"),
               Entry("green", SECTION, 5, {}, "eve", "t1"),
               Entry("blue", SECTION, 12, {"leader_rate_bytes": 1}, "carol", "t3", 9, "rollback", 4)]
    assert Entry.decode(entries[0].encode()[1]) == entries[0]
    rows = history_rows(entries, "blue", SECTION)
    assert [(r["revision"], r["principal"], r["action"], r["change"]) for r in rows] == [
        (4, "alice", "set", "leader_rate_bytes=1"), (9, "bob", "set", "leader_rate_bytes: 1 -> 2"),
        (12, "carol", "rollback to 4", "leader_rate_bytes: 2 -> 1")]
    assert len(history_rows(entries, "blue")) == 4


def test_the_control_topics_settings_are_checked() -> None:
    good = {"cleanup.policy": "compact", "delete.retention.ms": "604800000", "unclean.leader.election.enable": "false"}
    assert config_drift(good) == []
    changed = {**good, "cleanup.policy": "compact,delete", "delete.retention.ms": "100",
               "unclean.leader.election.enable": "true"}
    assert sorted(s for s, _, _ in config_drift(changed)) == ["cleanup.policy", "delete.retention.ms",
                                                              "unclean.leader.election.enable"]
    assert settings_hash({"a": 1, "b": [2]}) == settings_hash({"b": [2], "a": 1}) != settings_hash({"a": 2})


def test_fleet_settings_default_off_and_invalid_names_the_key() -> None:
    assert SETTINGS.fleet.enabled is False and SETTINGS.fleet.on_unreachable == "serve-local"
    with pytest.raises(ConfigError) as caught:
        SETTINGS.with_overrides({"fleet.enabled": True})
    assert caught.value.key == "fleet.name"
    with pytest.raises(ConfigError) as caught:
        SETTINGS.with_overrides({"fleet.control_topic": "a b"})
    assert caught.value.key == "fleet.control_topic"
    with pytest.raises(ConfigError) as caught:
        SETTINGS.with_overrides({"fleet.name": "blue", "fleet.history_topic": "sluice-fleet-blue"})
    assert caught.value.key == "fleet.history_topic"
    with pytest.raises(ConfigError) as caught:
        SETTINGS.with_overrides({"fleet.on_unreachable": "panic"})
    assert caught.value.key == "fleet.on_unreachable"
    on = SETTINGS.with_overrides({"fleet.enabled": True, "fleet.name": "blue"})
    assert (on.fleet.control, on.fleet.status, on.fleet.history) == (
        "sluice-fleet-blue", "sluice-fleet-blue-status", "sluice-fleet-blue-history")


def test_the_control_cluster_uses_upstreams_credentials_by_default(tmp_path: Any) -> None:
    s = SETTINGS.with_overrides({"fleet.enabled": True, "fleet.name": "blue",
                                 "upstream.sasl": {"mechanism": "PLAIN", "username": "u", "password": "p"}})
    conf = client_config(s.fleet, s.upstream, "x")
    assert conf["security.protocol"] == "SASL_PLAINTEXT" and conf["sasl.username"] == "u"
    assert conf["bootstrap.servers"] == ",".join(s.upstream.bootstrap_servers)
    own = s.with_overrides({"fleet.credentials": "fleet", "fleet.bootstrap_servers": ["127.0.0.1:1"]})
    conf = client_config(own.fleet, own.upstream, "x")
    assert conf["security.protocol"] == "PLAINTEXT" and conf["bootstrap.servers"] == "127.0.0.1:1"
