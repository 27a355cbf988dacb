"""The rig's port picks: a session given its own range (SLUICE_PORT_RANGE) picks only from it."""

from __future__ import annotations

import pytest

from rig.kafka import PORT_RANGE_ENV, RigError, free_ports


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
