"""Shared fixtures. The broker comes from rig/ (a real Kafka 4.x, KRaft, single node); see ARCHITECTURE.md. The cluster
tests share one 3-broker cluster (rig/cluster.py): tests/cluster/conftest.py.

A missing Java or Kafka is an error, never a skip: these tests exist to run against the real thing.
"""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import Iterator

import pytest
from hypothesis import settings

from rig.java_tools import JavaTools
from rig.kafka import KafkaBroker
from rig.secure_broker import LOCKED_USERS, SASL_USERS, SecureBroker, create_scram_user
from tests.support.logs import route_sluice_logs_to_pytest

# CI (CI=true) replays the same examples every run, so a submission's result does not depend on the draw;
# developer runs keep hypothesis' random search (and its example database) to find new cases.
# Neither has Hypothesis' per-example deadline (200 ms by default): a wall-clock threshold, which a loaded machine
# crosses (591 ms for a sessions property beside CI's broker sessions); timing lives in bench/.
settings.register_profile("dev", deadline=None)
settings.register_profile("ci", parent=settings.get_profile("dev"), derandomize=True, database=None)
settings.load_profile("ci" if os.environ.get("CI") == "true" else "dev")


route_sluice_logs_to_pytest()  # passing tests print no log lines (tests/support/logs.py)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Spark's tests (tests/analytics) run last, each module's in its order: they are the suite's CPU-bound part
    (local[2] keeps both cores busy), while the broker and client tests mostly wait on Kafka's clocks. (``make test``
    runs them in a session of their own, at a low CPU priority, beside the rest: see the Makefile.)"""
    items.sort(key=lambda item: item.nodeid.startswith("tests/analytics/"))  # stable: the rest keep their order


@pytest.fixture(scope="session")
def kafka_broker() -> Iterator[KafkaBroker]:
    """One broker for the whole session (a start costs ~1.5 s); tests isolate themselves by topic name."""
    with KafkaBroker() as broker:
        yield broker


@pytest.fixture(scope="session")
def java_tools() -> Iterator[JavaTools]:
    """Kafka's Java console/perf tools from the same jars; pass them any bootstrap (broker or proxy)."""
    tools = JavaTools()
    yield tools
    tools.close()


@pytest.fixture
def unique_topic(request: pytest.FixtureRequest) -> str:
    """A topic name no other test uses: readable (from the test name) and unique (random suffix).

    Only [a-zA-Z0-9-]: Kafka treats '.' and '_' as colliding in metric names and warns about mixing them.
    """
    base = re.sub(r"[^a-zA-Z0-9-]+", "-", request.node.name).strip("-")[:60]
    return f"{base}-{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="session")
def secure_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureBroker]:
    """A second broker, with SSL (mTLS), SASL_PLAINTEXT and SASL_SSL listeners (rig/secure_broker.py), started
    once, lazily: only the security tests ask for it. SCRAM users are created through the Admin API; SASL
    sessions expire every 4 s so clients re-authenticate on open connections (KIP-368)."""
    broker = SecureBroker.start(tmp_path_factory.mktemp("secure-broker"), reauth_ms=4000)
    try:
        for user, password in SASL_USERS.items():
            create_scram_user(broker.plaintext, user, password)
        yield broker
    finally:
        broker.close()


@pytest.fixture(scope="session")
def locked_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureBroker]:
    """A broker locked down as production runs it (rig/secure_broker.py ``authorizer=True``): KRaft's
    StandardAuthorizer, nothing allowed without an ACL, SCRAM users for Sluice's principals and a client's
    (LOCKED_USERS), reached over SASL_SSL. Each test grants its own ACLs (on its own topics and groups), those of
    proxy/kafka_acls.py for Sluice's principals. Started once, lazily."""
    broker = SecureBroker.start(tmp_path_factory.mktemp("locked-broker"), authorizer=True)
    try:
        for user, password in LOCKED_USERS.items():
            create_scram_user(broker.plaintext, user, password, ("SCRAM-SHA-512",))
        yield broker
    finally:
        broker.close()
