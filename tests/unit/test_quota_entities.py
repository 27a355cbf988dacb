"""Client quota entities (proxy/policies/quota/book.py): which entry governs each kind for a client, in Kafka's order
of precedence (the Kafka documentation's quotas section, ClientQuotaManager's DefaultQuotaCallback) with Sluice's
client address between the user and the client.id, exemptions, and which clients share a rate. Sans-IO: the
snapshot and the book, no connection (tests/unit/test_quota_policy.py drives the policy through the core)."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.app import load_settings
from proxy.config import ConfigError
from proxy.policies.quota.book import QuotaBook, Quotas

#: the precedence table of docs/quotas.md, most specific first: each entry's produce quota is its rank, so the
#: governing entry of a client is read off its quota
LEVELS: list[dict[str, Any]] = [
    {"principal": "alice", "client_id": "etl-1"},
    {"principal": "alice", "client_id": "etl-*"},  # a glob: between a name and <default>
    {"principal": "alice", "client_id": "<default>"},
    {"principal": "alice"},
    {"principal": "svc-*", "client_id": "etl-1"},
    {"principal": "<default>", "client_id": "etl-1"},
    {"principal": "<default>", "client_id": "<default>"},
    {"principal": "<default>"},
    {"client_address": "10.1.2.3"},  # one host: a name
    {"client_address": "10.1.0.0/16", "client_id": "etl-1"},
    {"client_address": "10.1.0.0/16"},  # a network: a glob, the longer prefix first
    {"client_address": "10.0.0.0/8"},
    {"client_address": "<default>"},
    {"client_id": "etl-1"},
    {"client_id": "etl-*"},
    {"client_id": "<default>"},
]


def quotas(entries: list[dict[str, Any]], **section: Any) -> Quotas:
    settings = load_settings(None, env={}).with_overrides({"quota.entries": entries, **{
        f"quota.{k}": v for k, v in section.items()}})
    return Quotas.from_settings(settings.quota)


def ranked(levels: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The levels as entries whose produce quota is 1 + their rank, listed in reverse (list order must not matter
    across levels)."""
    return [{**level, "name": f"level-{i}", "produce_rate_bytes": i + 1} for i, level in enumerate(levels)][::-1]


@pytest.mark.parametrize("principal", ["alice", "svc-a"])
def test_each_level_wins_over_the_next(principal: str) -> None:
    """Dropping the governing entry each time, the next level governs: the table is a total order."""
    levels = ranked(LEVELS)
    expected = [i for i, lv in enumerate(LEVELS)
                if lv.get("principal") in (None, "<default>", principal) or (lv.get("principal") == "svc-*"
                                                                            and principal.startswith("svc-"))]
    seen = []
    while levels:
        gov = quotas(levels).governing("etl-1", principal, "10.1.2.3")
        if gov.produce is None:
            break  # the levels left do not select this client
        rank = int(gov.produce.name.removeprefix("level-"))
        seen.append(rank)
        levels = [e for e in levels if e["name"] != gov.produce.name]
    assert seen == expected


def test_an_address_outside_the_networks_and_no_principal_fall_to_the_client_id() -> None:
    q = quotas(ranked(LEVELS))
    # no SASL principal: no user-level entry applies, <default> user included (Kafka would call it ANONYMOUS)
    assert q.governing("etl-1", None, "10.1.2.3").produce.name == "level-8"  # type: ignore[union-attr]
    assert q.governing("etl-1", None, "10.9.0.1").produce.name == "level-11"  # type: ignore[union-attr]
    assert q.governing("etl-1", None, "192.168.0.1").produce.name == "level-12"  # type: ignore[union-attr]
    # no address known (a connection Sluice cannot place): the address levels never match, <default> neither
    assert q.governing("etl-1", None, "").produce.name == "level-13"  # type: ignore[union-attr]
    assert q.governing("etl-2", None, "").produce.name == "level-14"  # type: ignore[union-attr]
    assert q.governing(None, None, "").produce.name == "level-15"  # type: ignore[union-attr]


def test_each_kind_is_resolved_on_its_own() -> None:
    q = quotas([{"client_id": "etl-1", "produce_rate_bytes": 1000},
                {"client_id": "<default>", "fetch_rate_bytes": 500, "request_rate": 10}])
    gov = q.governing("etl-1", None, "")
    assert gov.produce.name == "entries[0]"  # type: ignore[union-attr]
    assert gov.fetch.name == "entries[1]" and gov.request.name == "entries[1]"  # type: ignore[union-attr]
    assert q.governing("web", None, "").produce is None


def test_zero_exempts_an_entity_from_a_less_specific_entry() -> None:
    q = quotas([{"client_id": "<default>", "produce_rate_bytes": 100, "fetch_rate_bytes": 100},
                {"principal": "ops", "produce_rate_bytes": 0}])
    ops = q.governing("tool", "ops", "")
    assert ops.produce is None  # exempt: no quota of that kind
    assert ops.fetch is not None and ops.fetch.name == "entries[0]"  # the kind it leaves unset falls through
    assert q.governing("tool", "dev", "").produce is not None


def test_the_old_first_match_form_reads_as_entities() -> None:
    """Globs and networks as before; 0 now exempts (it used to mean "none" while the entry still governed)."""
    q = quotas([{"name": "etl", "client_id": "etl-*", "produce_rate_bytes": 5_000_000, "fetch_rate_bytes": 0},
                {"name": "office", "client_address": "10.20.0.0/16", "request_rate": 200, "shared": True}])
    gov = q.governing("etl-7", None, "10.20.1.1")
    assert gov.produce.name == "etl" and gov.fetch is None  # type: ignore[union-attr]
    assert gov.request.name == "office"  # type: ignore[union-attr]


def test_rates_are_keyed_by_the_parts_the_entry_names() -> None:
    """Kafka's metric tags: a user-level quota is one rate for all the user's client.ids, a <default> or glob
    part one rate per value, shared = true one rate for every client the entry selects."""
    q = quotas([{"name": "alice", "principal": "alice", "produce_rate_bytes": 1},
                {"name": "users", "principal": "<default>", "client_id": "<default>", "produce_rate_bytes": 1},
                {"name": "net", "client_address": "10.0.0.0/8", "produce_rate_bytes": 1},
                {"name": "office", "client_address": "192.168.0.0/16", "produce_rate_bytes": 1, "shared": True}])
    keys = {}
    for client, principal, host in [("a", "alice", "1.1.1.1"), ("b", "alice", "1.1.1.2"), ("a", "bob", "1.1.1.1"),
                                    ("b", "bob", "1.1.1.1"), ("a", None, "10.0.0.1"), ("b", None, "10.0.0.1"),
                                    ("a", None, "10.0.0.2"), ("a", None, "192.168.1.1"), ("b", None, "192.168.2.2")]:
        entry = q.governing(client, principal, host).produce
        assert entry is not None
        keys[(client, principal, host)] = entry.key("produce", client, principal, host)
    assert keys[("a", "alice", "1.1.1.1")] == keys[("b", "alice", "1.1.1.2")] == ("alice", "produce", "alice", None,
                                                                                 None)
    assert keys[("a", "bob", "1.1.1.1")] != keys[("b", "bob", "1.1.1.1")]  # per user and client.id
    assert keys[("a", None, "10.0.0.1")] == keys[("b", None, "10.0.0.1")] != keys[("a", None, "10.0.0.2")]
    assert keys[("a", None, "192.168.1.1")] == keys[("b", None, "192.168.2.2")]  # shared


def test_one_rate_holds_every_client_of_a_user() -> None:
    q = quotas([{"principal": "alice", "produce_rate_bytes": 100}])
    book = QuotaBook(q)
    entry = q.governing("a", "alice", "").produce
    assert entry is not None
    assert book.record(entry, "produce", 100, entry.key("produce", "a", "alice", ""), 0.0) == 0.0
    # 200 bytes in the first second against 100 B/s: two seconds' worth (a window is at least one second)
    assert book.record(entry, "produce", 100, entry.key("produce", "b", "alice", ""), 0.0) == pytest.approx(2.0)


@pytest.mark.parametrize(("entries", "key", "message"), [
    ([{"client_id": "a", "producer_byte_rate": 5}], "quota.entries[0].producer_byte_rate",
     "Sluice's name for this is produce_rate_bytes"),
    ([{"client_id": "a", "request_percentage": 50}], "quota.entries[0].request_percentage",
     "Sluice's name for this is request_rate"),
    ([{"user": "a", "produce_rate_bytes": 5}], "quota.entries[0].user", "Sluice's name for this is principal"),
    ([{"client_id": "a"}], "quota.entries[0].produce_rate_bytes", "set at least one of produce_rate_bytes"),
    ([{"produce_rate_bytes": 5}], "quota.entries[0].client_id", "set at least one of principal, client_id"),
    ([{"client_address": "<deflt>", "produce_rate_bytes": 5}], "quota.entries[0].client_address", "must be an IP"),
    ([{"client_id": "a", "produce_rate_bytes": 5}, {"client_id": "a", "fetch_rate_bytes": 5}],
     "quota.entries[1].client_id", "names the entity of quota.entries[0]"),
    ([{"client_address": "10.0.0.1", "produce_rate_bytes": 5},
      {"client_address": "10.0.0.1/32", "fetch_rate_bytes": 5}],
     "quota.entries[1].client_id", "names the entity of quota.entries[0]"),
    ([{"client_id": "a", "produce_rate_bytes": 5, "scope": "fleet"}], "quota.entries[0].scope",
     "needs [fleet] enabled"),
])
def test_bad_entries_name_the_key(entries: list[dict[str, Any]], key: str, message: str) -> None:
    with pytest.raises(ConfigError) as e:
        quotas(entries)
    assert e.value.key == key and message in e.value.reason, str(e.value)


def test_a_fleet_scope_needs_the_fleet() -> None:
    with pytest.raises(ConfigError) as e:
        quotas([{"client_id": "a", "produce_rate_bytes": 5}], scope="fleet")
    assert e.value.key == "quota.scope"
    settings = load_settings(None, env={}).with_overrides({
        "fleet.enabled": True, "fleet.name": "f", "quota.scope": "fleet",
        "quota.entries": [{"client_id": "a", "produce_rate_bytes": 5},
                          {"client_id": "b", "produce_rate_bytes": 5, "scope": "instance"}]})
    assert [e.fleet for e in Quotas.from_settings(settings.quota).entries] == [True, False]
