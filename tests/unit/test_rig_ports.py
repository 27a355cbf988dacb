"""The rig's port picks: a session given its own range (SLUICE_PORT_RANGE) picks only from it, and a port picked
for a listener is not handed out again, a Sluice's every broker node's port among them."""

from __future__ import annotations

import collections

import pytest

from rig import kafka
from rig.kafka import PORT_RANGE_ENV, RIG_NODE_IDS, RigError, free_ports
from rig.sluice_process import pick_ports


def test_ports_are_picked_from_the_sessions_own_range(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(PORT_RANGE_ENV, "61400-61449")
    ports = free_ports(20)
    assert len(set(ports)) == 20
    assert all(61400 <= p <= 61449 for p in ports), ports


@pytest.mark.parametrize("value", ["61400", "61449-61400", "80-90", "a-b"])
def test_a_range_that_is_not_one_names_the_setting(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv(PORT_RANGE_ENV, value)
    with pytest.raises(RigError, match=PORT_RANGE_ENV):
        free_ports(1)


def test_a_run_is_consecutive_and_inside_the_range(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(PORT_RANGE_ENV, "61450-61459")
    monkeypatch.setattr(kafka, "_HANDED_OUT", collections.deque(maxlen=512))
    for _ in range(20):
        first, *rest = free_ports(5, consecutive=True)
        assert rest == [first + 1, first + 2, first + 3, first + 4]
        assert 61450 <= first and first + 4 <= 61459
        kafka._HANDED_OUT.clear()


def test_no_port_a_sluice_may_serve_a_node_on_is_handed_out_again(monkeypatch: pytest.MonkeyPatch) -> None:
    # Sluice serves broker node N on base + N for every node its upstream's metadata names (proxy/server.py
    # open_listener): in front of the rig's 3-broker cluster, base + 1, + 2 and + 3 are its ports, and a port handed
    # to another listener later must be none of them.
    monkeypatch.setenv(PORT_RANGE_ENV, "61460-61499")
    monkeypatch.setattr(kafka, "_HANDED_OUT", collections.deque(maxlen=512))
    bootstrap, base, admin = pick_ports(RIG_NODE_IDS)
    assert bootstrap < base and admin != base
    sluices = {bootstrap, admin, *(base + node for node in range(1, RIG_NODE_IDS + 1))}
    others = free_ports(40 - len(sluices) - 1)  # every port of the range left (base itself is handed out too)
    assert not sluices & set(others)
