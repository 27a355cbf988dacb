"""The SparkSession the job runs in: local[N] on one machine, or a cluster master, with the same code.

Local masters bind the driver to 127.0.0.1 (``SPARK_LOCAL_IP`` plus ``spark.driver.host``/``bindAddress``): with no
remote executors there is nothing to reach it from elsewhere, and Spark otherwise picks the machine's first
non-loopback address, which sandboxes and CI runners may not route. The web UI is off for local masters (one more
listening port for a batch job nobody watches). A cluster master keeps Spark's defaults, since executors must reach
the driver; ``conf`` overrides anything.

The topic modes (``kafka=True``) need Spark's Kafka connector, which pyspark does not ship: it is resolved from Maven
Central at start-up (``spark.jars.packages``, cached in ``~/.ivy2.5.2``) and handed to the executors by Spark, on a
cluster too. The connector must be the same version as Spark itself, so it is the installed pyspark's version:
pyspark is pinned (pyproject.toml) to a release whose connector is published there (4.2.0; 4.3.0's is not).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

from pyspark.sql import SparkSession

__all__ = ["DEFAULT_MASTER", "KAFKA_CONNECTOR", "build_session", "is_local", "kafka_package"]

#: Spark's Kafka source/sink for Structured Streaming and batch (Scala 2.13: the build pyspark 4 ships)
KAFKA_CONNECTOR = "org.apache.spark:spark-sql-kafka-0-10_2.13"
#: The connector's dependencies pyspark already ships (pyspark/jars, the same versions): not downloaded again
#: (hadoop-client-* alone are ~60 MB) nor put on the classpath twice. What is fetched: the connector, its token
#: provider, kafka-clients and commons-pool2.
_SHIPPED = ("org.apache.hadoop:hadoop-client-runtime", "org.apache.hadoop:hadoop-client-api", "at.yawk.lz4:lz4-java",
            "org.xerial.snappy:snappy-java", "org.slf4j:slf4j-api", "com.google.code.findbugs:jsr305",
            "org.scala-lang.modules:scala-parallel-collections_2.13")

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
    # The parsed log is cached once and read by a few aggregations. Compressing the cache made building it cost
    # more than parsing the JSON (the dictionary encoder hashes every string value to decide whether to use
    # itself); uncompressed, the cache of 10M lines is only a little larger.
    "spark.sql.inMemoryColumnarStorage.compressed": "false",
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
    # A batch job wants throughput, not short pauses: the parallel collector spends less CPU than G1 (Java 17's
    # default) on the many short-lived objects of JSON parsing, and on a local master the driver JVM is the
    # executor (same caveat as the memory above).
    "spark.driver.extraJavaOptions": "-XX:+UseParallelGC",
}


def is_local(master: str) -> bool:
    return master == "local" or master.startswith("local[") or master.startswith("local-cluster[")


def kafka_package() -> str:
    """The connector's Maven coordinates for the installed Spark (they must match exactly)."""
    import pyspark

    return f"{KAFKA_CONNECTOR}:{pyspark.__version__}"


def build_session(
    master: str = DEFAULT_MASTER, *, app_name: str = "sluice-report", conf: Mapping[str, str] | None = None,
    kafka: bool = False,
) -> SparkSession:
    """A new or the running SparkSession; with a running one, runtime SQL settings are still applied. ``kafka``:
    with the Kafka connector (needed to read the access-log topic; only when this call starts the JVM)."""
    settings = dict(_BASE_CONF)
    if is_local(master):
        settings.update(_LOCAL_CONF)
        # Read by the JVM at launch (the block manager and RPC bind before any conf is consulted).
        os.environ.setdefault("SPARK_LOCAL_IP", LOOPBACK)
    if kafka:
        settings["spark.jars.packages"] = kafka_package()
        settings["spark.jars.excludes"] = ",".join(_SHIPPED)
    if conf:
        settings.update(conf)
        if kafka and "spark.jars.packages" in conf and kafka_package() not in conf["spark.jars.packages"]:
            settings["spark.jars.packages"] = f"{conf['spark.jars.packages']},{kafka_package()}"
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
