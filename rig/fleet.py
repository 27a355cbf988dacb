"""A fleet of Sluice processes (proxy/fleet/) for tests and benches: their environment, their start,
the admin API's JSON answers with their HTTP status (a 409 is an answer under test, not an error), and which broker
coordinates the fleet's writes."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from rig.sluice_process import START_TIMEOUT_S, SluiceProcess

if TYPE_CHECKING:
    from rig.java_tools import JavaTools

__all__ = ["admin_json", "fleet_env", "start_fleet", "transaction_coordinator"]

TRANSACTIONS_COMMAND = "org.apache.kafka.tools.TransactionsCommand"  # kafka-transactions.sh (KIP-664)


def fleet_env(name: str, control_bootstrap: str | None = None, **settings: str) -> dict[str, str]:
    """SLUICE_* variables of a fleet instance: fleet ``name`` on, its control cluster (default: the upstream),
    and ``settings`` as ``[fleet]`` keys (``status_interval_s="1"``)."""
    env = {"SLUICE_FLEET__ENABLED": "true", "SLUICE_FLEET__NAME": name}
    if control_bootstrap:
        env["SLUICE_FLEET__BOOTSTRAP_SERVERS"] = control_bootstrap
    env.update({f"SLUICE_FLEET__{k.upper()}": v for k, v in settings.items()})
    return env


def start_fleet(upstreams: Sequence[str], env: Mapping[str, str], start_timeout: float = START_TIMEOUT_S,
                together: bool = False) -> list[SluiceProcess]:
    """One Sluice per upstream (each its own ports); all or none (RigError). One after the other, or
    ``together`` (all spawned, then each waited for: a few at once on this machine's two cores), from this thread:
    a child's PR_SET_PDEATHSIG fires when the *thread* that spawned it ends (prctl(2))."""
    started: list[SluiceProcess] = []
    try:
        for upstream in upstreams:
            started.append(SluiceProcess(upstream, extra_env=env, start_timeout=start_timeout,
                                         wait=not together))
        for process in started:
            process.wait_ready()
    except BaseException:
        for p in started:
            p.close()
        raise
    return started


def admin_json(admin_url: str, path: str, method: str = "GET", body: Any = None,
               timeout: float = 30.0) -> tuple[int, dict[str, Any]]:
    """(HTTP status, JSON body) of an admin API call; an HTTP error status is returned, not raised."""
    req = urllib.request.Request(f"{admin_url}{path}", data=None if body is None else json.dumps(body).encode(),
                                 method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, dict(json.loads(resp.read()))
    except urllib.error.HTTPError as exc:
        return exc.code, dict(json.loads(exc.read() or b"{}"))


def transaction_coordinator(java_tools: JavaTools, bootstrap: str, transactional_id: str) -> int:
    """The node id of the broker coordinating ``transactional_id``: the leader of its ``__transaction_state``
    partition, as ``kafka-transactions.sh describe`` reports it (its CoordinatorId column). The id must have been
    used (a fleet's: once a change was written)."""
    done = java_tools.run(TRANSACTIONS_COMMAND,
                          ["--bootstrap-server", bootstrap, "describe", "--transactional-id", transactional_id])
    header, row = (line.split() for line in done.stdout.splitlines()[:2])
    return int(row[header.index("CoordinatorId")])
