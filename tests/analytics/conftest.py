"""Spark for the analytics tests: a real local[2] session (never mocked), one for the run, bound to 127.0.0.1.
pyspark and a Java runtime are required - missing either fails the tests, as a missing broker does.

Every session has the Kafka connector and Delta Lake (resolved from Maven Central once, then from the Ivy cache):
Spark reads ``spark.jars.packages`` only when it starts its JVM, which the first session does for the whole run."""

from __future__ import annotations

import contextlib
import io
import json
import os
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlparse

import pytest
from pyspark.sql import DataFrame, SparkSession

from bench.analytics import rounded
from proxy.analytics.session import build_session
from proxy.cli import main

LOOPBACK = "127.0.0.1"
# pytest-timeout's 300 s (pyproject.toml) guards against a hang; it also counts a module fixture's setup, and these
# tests' fixtures run whole Spark jobs. `make test` runs them at low priority (nice 10) beside the broker sessions,
# and .ci/run beside the oldest-Kafka session and the benches too: there, starved of CPU, test_generated's fixture
# (~60 s on an idle machine) went past 300 s and was stopped mid-chart. The guard stays, with room for a saturated
# machine.
SPARK_TIMEOUT_S = 1200


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:  # the hook sees the whole session's items: only this directory's
        if here in item.path.parents and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(SPARK_TIMEOUT_S))

# Small and explicit: the test data is tiny, so fewer shuffle partitions means fewer empty tasks.
TEST_CONF = {
    "spark.sql.shuffle.partitions": "4",
    "spark.driver.host": LOOPBACK,
    "spark.driver.bindAddress": LOOPBACK,
    "spark.ui.enabled": "false",
    "spark.driver.memory": "2g",
    # The JVM's client compiler only, one GC thread: these jobs are many and tiny, where C2's compilations cost
    # more CPU than they save (test_generated: 58 s against 67 s of wall), and CI runs them beside broker sessions
    "spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC",
}


@pytest.fixture(scope="session")
def _spark_sessions() -> Iterator[list[SparkSession]]:
    """The local sessions started in this run (one, unless a test stopped it), each stopped at the end."""
    before = os.environ.get("SPARK_LOCAL_IP")
    os.environ["SPARK_LOCAL_IP"] = LOOPBACK  # forced, not defaulted: the machine's value must not leak in
    started: list[SparkSession] = []
    try:
        yield started
    finally:
        for session in started:
            session.stop()
        if before is None:
            os.environ.pop("SPARK_LOCAL_IP", None)
        else:
            os.environ["SPARK_LOCAL_IP"] = before


@pytest.fixture(scope="module")
def spark(_spark_sessions: list[SparkSession]) -> SparkSession:
    """The run's local session, shared by the modules: each start costs a JVM, Ivy's resolution of the connector
    and Delta, and their warm-up (~15 s of wall on an idle machine, six times over before). Started again when a
    test stopped it (test_standalone makes way for a cluster's: one SparkContext per process)."""
    active = SparkSession.getActiveSession()
    if active is None or all(active is not s for s in _spark_sessions):
        active = build_session("local[2]", app_name="sluice-analytics-tests", conf=TEST_CONF, kafka=True, delta=True)
        _spark_sessions.append(active)
    return active


def table(spark: SparkSession, path: str) -> DataFrame:
    return spark.read.parquet(path)


def sorted_rows(spark: SparkSession, path: str) -> list[str]:
    """A Parquet table's rows as sorted JSON, floats to 9 significant digits (a sum of doubles differs in its last
    bits with the order Spark adds them in): two tables are equal when these are, as bench.analytics compares."""
    return sorted(json.dumps(rounded(r.asDict(recursive=True)), sort_keys=True, default=str)
                  for r in table(spark, path).collect())


def local_path(source: str) -> str:
    """Spark's file URI (file:/tmp/x) as a plain path, to compare with the oracle's."""
    return urlparse(source).path


def sluice(*args: str) -> tuple[int, str, str]:
    """``sluice ARGS`` in this process: its exit status, standard output and standard error. ``sluice report``
    starts its Spark session in this process's JVM (the connector's and Delta's jars already loaded: a subprocess
    costs a JVM's start, Ivy's resolution and the JIT's warm-up, ~1 min of CPU on a busy machine) and stops it when
    done: the module's session is started again by :func:`spark` for the next module that asks."""
    before = os.environ.get("SPARK_LOCAL_IP")
    os.environ["SPARK_LOCAL_IP"] = LOOPBACK
    out, err = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc = main(list(args))
    finally:
        if before is None:
            os.environ.pop("SPARK_LOCAL_IP", None)
        else:
            os.environ["SPARK_LOCAL_IP"] = before
    return rc, out.getvalue(), err.getvalue()
