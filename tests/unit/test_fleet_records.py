"""The fleet's sans-IO core (proxy/fleet/records.py, status.py): record schema, folding in topic order, the
revision check, the status table. The I/O is tests/cluster/test_fleet.py's."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from proxy.app import load_settings
from proxy.config import ConfigError
from proxy.fleet.kafka_config import client_config
from proxy.fleet.records import SCHEMA, Change, Conflict, FleetState, Skipped, decode, encode, next_revision
from proxy.fleet.status import StatusRecord, fleet_table

SETTINGS = load_settings(None, env={})
SECTIONS = tuple(SETTINGS.dynamic_sections)
SECTION = SECTIONS[0]


def _validate(section: str, values: dict[str, Any]) -> Any:
    return getattr(SETTINGS.with_overrides({section: values}), section)


def _state() -> FleetState:
    return FleetState("blue", SECTIONS, _validate)


def _record(revision: int, settings: dict[str, Any] | None = None, **over: Any) -> tuple[bytes, bytes]:
    return encode(Change(over.pop("fleet", "blue"), over.pop("section", SECTION), revision, settings or {},
                         "ops", "2026-01-01T00:00:00Z"))


def test_a_record_round_trips() -> None:
    change = Change("blue", SECTION, 3, {"a": 1}, "ops", "2026-01-01T00:00:00Z")
    key, value = encode(change)
    assert key == SECTION.encode()
    assert json.loads(value)["schema"] == SCHEMA
    assert decode(key, value, "blue", SECTIONS) == change


@pytest.mark.parametrize(("key", "value", "reason"), [
    (b"x", b"\xff\xfe not json", "garbage"),
    (b"x", b"[1, 2]", "garbage"),
    (SECTION.encode(), json.dumps({"schema": 99}).encode(), "schema"),
    (SECTION.encode(), json.dumps({"schema": SCHEMA, "revision": "1", "settings": {}}).encode(), "garbage"),
    (SECTION.encode(), json.dumps({"schema": SCHEMA, "revision": 1, "settings": []}).encode(), "garbage"),
    (b"other", _record(1)[1], "garbage"),  # key and section differ
    (SECTION.encode(), None, "tombstone"),
])
def test_bad_records_are_skipped_with_their_reason(key: bytes, value: bytes | None, reason: str) -> None:
    with pytest.raises(Skipped) as caught:
        decode(key, value, "blue", SECTIONS)
    assert caught.value.reason == reason


def test_another_fleets_and_static_sections_records_are_skipped() -> None:
    with pytest.raises(Skipped, match="fleet"):
        _state().offer(*_record(1, fleet="green"))
    key, value = encode(Change("blue", "listen", 1, {}))
    with pytest.raises(Skipped) as caught:
        _state().offer(key, value)
    assert caught.value.reason == "section"


def test_changes_fold_in_order_and_a_stale_or_invalid_one_keeps_the_last_good() -> None:
    state = _state()
    change, validated = state.offer(*_record(1))
    assert change.revision == 1 and state.revision(SECTION) == 1
    assert validated == getattr(SETTINGS, SECTION)  # {} = the section's defaults
    with pytest.raises(Skipped) as stale:
        state.offer(*_record(1))
    assert stale.value.reason == "stale"
    with pytest.raises(Skipped) as invalid:
        state.offer(*_record(2, {"no_such_key": 1}))
    assert invalid.value.reason == "invalid" and "no_such_key" in invalid.value.detail
    assert state.revision(SECTION) == 1
    state.offer(*_record(5))  # revisions only grow; gaps are allowed (a compacted topic keeps the latest)
    assert state.revisions()[SECTION] == 5


def test_a_change_based_on_an_older_revision_is_a_conflict() -> None:
    state = _state()
    assert next_revision(state, SECTION, None) == 1
    assert next_revision(state, SECTION, 0) == 1
    state.offer(*_record(1))
    with pytest.raises(Conflict) as caught:
        next_revision(state, SECTION, 0)
    assert (caught.value.based_on, caught.value.current) == (0, 1)
    assert next_revision(state, SECTION, 1) == 2
    assert next_revision(state, SECTION, None) == 2  # unconditional (e.g. a clear): on top of the latest


def test_the_status_table_says_up_lagging_silent() -> None:
    now = datetime(2026, 1, 1, tzinfo=UTC)

    def rec(instance: str, revision: int, age_s: float) -> StatusRecord:
        at = (now - timedelta(seconds=age_s)).isoformat().replace("+00:00", "Z")
        return StatusRecord("blue", instance, "h", 1, "1.0", at, at, {"bootstrap": 9092}, {SECTION: revision})

    records = [rec("c", 2, 1), rec("a", 2, 0), rec("b", 1, 2), rec("d", 2, 60)]
    assert StatusRecord.decode(records[0].encode()[1]) == records[0]
    assert StatusRecord.decode(b"garbage") is None
    rows = fleet_table(records, {SECTION: 2}, now, 5.0)
    assert [(r["instance"], r["state"]) for r in rows] == [("a", "up"), ("b", "lagging"), ("c", "up"),
                                                           ("d", "silent")]


def test_fleet_settings_default_off_and_invalid_names_the_key() -> None:
    assert SETTINGS.fleet.enabled is False
    with pytest.raises(ConfigError) as caught:
        SETTINGS.with_overrides({"fleet.enabled": True})
    assert caught.value.key == "fleet.name"
    with pytest.raises(ConfigError) as caught:
        SETTINGS.with_overrides({"fleet.control_topic": "a b"})
    assert caught.value.key == "fleet.control_topic"
    on = SETTINGS.with_overrides({"fleet.enabled": True, "fleet.name": "blue"})
    assert (on.fleet.control, on.fleet.status) == ("sluice-fleet-blue", "sluice-fleet-blue-status")


def test_the_control_cluster_uses_upstreams_credentials_by_default(tmp_path: Any) -> None:
    s = SETTINGS.with_overrides({"fleet.enabled": True, "fleet.name": "blue",
                                 "upstream.sasl": {"mechanism": "PLAIN", "username": "u", "password": "p"}})
    conf = client_config(s.fleet, s.upstream, "x")
    assert conf["security.protocol"] == "SASL_PLAINTEXT" and conf["sasl.username"] == "u"
    assert conf["bootstrap.servers"] == ",".join(s.upstream.bootstrap_servers)
    own = s.with_overrides({"fleet.credentials": "fleet", "fleet.bootstrap_servers": ["127.0.0.1:1"]})
    conf = client_config(own.fleet, own.upstream, "x")
    assert conf["security.protocol"] == "PLAINTEXT" and conf["bootstrap.servers"] == "127.0.0.1:1"
