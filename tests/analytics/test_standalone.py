"""The same job, unchanged, on a Spark standalone cluster: a master and a worker started here from the installed
pyspark (``spark-class org.apache.spark.deploy.master.Master`` / ``...worker.Worker``), on 127.0.0.1. Over the
same access-log topic (generated sidecar logs on the rig's broker, read through the Kafka connector the cluster's
executors get from the driver), the batch report's summary and every table equal the local[2] run's, and the
Structured Streaming job's per-minute tables written from the cluster equal them too."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
import urllib.request
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyspark
import pytest
from pyspark.sql import SparkSession

from proxy.analytics import live
from proxy.analytics.job import JobResult, run_job
from proxy.analytics.session import build_session
from proxy.analytics.source import KafkaTopic
from rig.kafka import KafkaBroker, free_ports
from tests.analytics.conftest import LOOPBACK, TEST_CONF
from tests.analytics.kafka_data import create_log_topic, generated_records, produce, rows_of

pytestmark = pytest.mark.broker

# The executor's JVM as the driver's (TEST_CONF): C1 only and one GC thread, for many tiny jobs on 2 cores
CLUSTER_CONF = {**TEST_CONF, "spark.executor.memory": "1g", "spark.cores.max": "2",
                "spark.executor.extraJavaOptions": TEST_CONF["spark.driver.extraJavaOptions"]}


def _wait(condition: Any, what: str, procs: list[subprocess.Popen[bytes]], logs: list[Path],
          timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        for proc, log in zip(procs, logs, strict=True):
            assert proc.poll() is None, f"{what}: exited {proc.returncode}\n{log.read_text()[-3000:]}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}\n{logs[-1].read_text()[-3000:]}"
        time.sleep(0.1)  # poll interval of a real condition, bounded by the deadline


def _accepts(port: int) -> bool:
    try:
        socket.create_connection((LOOPBACK, port), timeout=1).close()
    except OSError:
        return False
    return True


def _alive_workers(ui_port: int) -> int:
    try:
        with urllib.request.urlopen(f"http://{LOOPBACK}:{ui_port}/json/", timeout=2) as resp:  # the master's UI
            return int(json.load(resp).get("aliveworkers", 0))
    except (OSError, ValueError):
        return 0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``spark://127.0.0.1:PORT`` once its worker has registered; both stopped afterwards."""
    base = tmp_path_factory.mktemp("spark-cluster")
    home = Path(pyspark.__file__).parent
    port, master_ui, worker_ui = free_ports(3)
    # the master's and the worker's JVMs too (spark-class reads SPARK_DAEMON_JAVA_OPTS): they mostly wait
    env = {**os.environ, "SPARK_HOME": str(home), "SPARK_LOCAL_IP": LOOPBACK, "SPARK_LOG_DIR": str(base),
           "SPARK_DAEMON_JAVA_OPTS": TEST_CONF["spark.driver.extraJavaOptions"]}
    spark_class = str(home / "bin" / "spark-class")
    procs: list[subprocess.Popen[bytes]] = []
    logs = [base / "master.log", base / "worker.log"]
    url = f"spark://{LOOPBACK}:{port}"
    try:
        with open(logs[0], "wb") as out:
            procs.append(subprocess.Popen(
                [spark_class, "org.apache.spark.deploy.master.Master", "--host", LOOPBACK, "--port", str(port),
                 "--webui-port", str(master_ui)], stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env=env, start_new_session=True))
        _wait(lambda: _accepts(port) and _accepts(master_ui), "the master", procs, logs[:1])
        with open(logs[1], "wb") as out:
            procs.append(subprocess.Popen(
                [spark_class, "org.apache.spark.deploy.worker.Worker", url, "--host", LOOPBACK, "--cores", "2",
                 "--memory", "2g", "--webui-port", str(worker_ui), "--work-dir", str(base / "work")],
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, start_new_session=True))
        _wait(lambda: _alive_workers(master_ui) == 1, "the worker registered with the master", procs, logs)
        yield url
    finally:
        for proc in reversed(procs):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in reversed(procs):
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(30)


def comparable(result: JobResult) -> dict[str, Any]:
    """The summary less what differs between any two runs (the time taken, where the files went)."""
    return {k: v for k, v in result.summary().items() if k not in ("seconds", "report", "tables")}


def test_a_standalone_cluster_gives_the_same_report_as_local(
        spark: SparkSession, cluster: str, kafka_broker: KafkaBroker, tmp_path: Path) -> None:
    name = f"access-log-{uuid.uuid4().hex[:8]}"
    create_log_topic(kafka_broker.bootstrap, name)
    produce(kafka_broker.bootstrap, name, generated_records(tmp_path / "gen", 1_500, files=2, malformed=4, seed=11))
    # a fixed end: both runs read exactly the same records
    topic = KafkaTopic(kafka_broker.bootstrap, name, None, datetime.now(UTC))
    local = run_job(spark, topic, tmp_path / "local")
    spark.stop()  # one SparkContext per process: the module's local one makes way for the cluster's
    remote = build_session(cluster, app_name="sluice-standalone-test", conf=CLUSTER_CONF, kafka=True)
    try:
        assert remote.sparkContext.master == cluster
        on_cluster = run_job(remote, topic, tmp_path / "cluster")
        assert comparable(on_cluster) == comparable(local)
        assert set(on_cluster.tables) == set(local.tables)
        for table, path in local.tables.items():
            columns = tuple(remote.read.parquet(path).columns)
            assert rows_of(remote, on_cluster.tables[table], columns) == rows_of(remote, path, columns), table
        # The streaming job on the cluster: its tables equal the batch's.
        live_dir = str(tmp_path / "live")
        live.run_stream(remote, KafkaTopic(kafka_broker.bootstrap, name), live_dir, once=True,
                        max_records_per_batch=1_000)
        current = live.current_tables(remote, live_dir)
        for table, spec in live.MINUTE_TABLES.items():
            assert rows_of(remote, current.paths[table], spec.columns) == rows_of(
                remote, local.tables[table], spec.columns), table
        assert "Per minute: bytes by client" in on_cluster.report.read_text()
    finally:
        remote.stop()
