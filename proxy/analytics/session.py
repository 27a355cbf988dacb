"""The SparkSession the job runs in: local[N] on one machine, or a cluster master, with the same code.

Local masters bind the driver to 127.0.0.1 (``SPARK_LOCAL_IP`` plus ``spark.driver.host``/``bindAddress``): with no
remote executors there is nothing to reach it from elsewhere, and Spark otherwise picks the machine's first
non-loopback address, which sandboxes and CI runners may not route. The web UI is off for local masters (one more
listening port for a batch job nobody watches). A cluster master keeps Spark's defaults, since executors must reach
the driver; ``conf`` overrides anything.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

from pyspark.sql import SparkSession

__all__ = ["DEFAULT_MASTER", "build_session", "is_local"]

DEFAULT_MASTER = "local[2]"
LOOPBACK = "127.0.0.1"

# For every master. UTC: the access log's timestamps are UTC and buckets must not shift with the machine's zone.
# A few shuffle partitions: the aggregates are small (per client, per API, per bucket); Spark's default of 200
# would spend most of a local run scheduling empty tasks. AQE coalesces further where it can.
_BASE_CONF = {
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.shuffle.partitions": "4",
    "spark.sql.adaptive.enabled": "true",
    # A gzip file cut short (a sidecar killed mid-write) keeps what could be read instead of failing the job.
    "spark.sql.files.ignoreCorruptFiles": "true",
    # Logs rotated away between listing and reading are skipped, not fatal.
    "spark.sql.files.ignoreMissingFiles": "true",
}

_LOCAL_CONF = {
    "spark.driver.host": LOOPBACK,
    "spark.driver.bindAddress": LOOPBACK,
    "spark.ui.enabled": "false",
    # The console progress bar is for interactive shells; in a batch job's output it is noise.
    "spark.ui.showConsoleProgress": "false",
    # The parsed log is cached for the ~15 aggregations; 10M rows need more than Spark's 1 GiB default (only
    # effective when this process starts the JVM, which is the case for `sluice report`).
    "spark.driver.memory": "4g",
}


def is_local(master: str) -> bool:
    return master == "local" or master.startswith("local[") or master.startswith("local-cluster[")


def build_session(
    master: str = DEFAULT_MASTER, *, app_name: str = "sluice-report", conf: Mapping[str, str] | None = None
) -> SparkSession:
    """A new or the running SparkSession; with a running one, runtime SQL settings are still applied."""
    settings = dict(_BASE_CONF)
    if is_local(master):
        settings.update(_LOCAL_CONF)
        # Read by the JVM at launch (the block manager and RPC bind before any conf is consulted).
        os.environ.setdefault("SPARK_LOCAL_IP", LOOPBACK)
    if conf:
        settings.update(conf)
    # Python workers, if Spark ever needs one (the job itself uses no Python UDFs), run this interpreter.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder.master(master).appName(app_name)
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    for key, value in settings.items():
        if key.startswith("spark.sql."):  # getOrCreate() on a running session ignores builder conf
            spark.conf.set(key, value)
    spark.sparkContext.setLogLevel("ERROR")
    return spark
