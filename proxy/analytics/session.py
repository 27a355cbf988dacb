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

The landed access-log table (``delta=True``; proxy/analytics/landed.py) is a Delta Lake table: Delta's Spark jar is
resolved the same way. Delta publishes one artifact per Spark minor (``delta-spark_<spark minor>_<scala>``); 4.4.0 is
the release built for Spark 4.2 (its PyPI package requires pyspark <= 4.2.0; 4.4.1's Spark-4.2 jar is not on Maven
Central). Only the JVM side is needed - the job writes and reads the table through DataFrame ``format("delta")``, so
the ``delta-spark`` Python package is not a dependency. Its transitive dependencies that pyspark already ships
(newer versions, in pyspark/jars) are excluded, as for the Kafka connector.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

from pyspark.sql import SparkSession

__all__ = ["DEFAULT_MASTER", "DELTA_PACKAGE", "KAFKA_CONNECTOR", "build_session", "is_local", "kafka_package"]

#: Spark's Kafka source/sink for Structured Streaming and batch (Scala 2.13: the build pyspark 4 ships)
KAFKA_CONNECTOR = "org.apache.spark:spark-sql-kafka-0-10_2.13"
#: The connector's dependencies pyspark already ships (pyspark/jars, the same versions): not downloaded again
#: (hadoop-client-* alone are ~60 MB) nor put on the classpath twice. What is fetched: the connector, its token
#: provider, kafka-clients and commons-pool2.
_SHIPPED = ("org.apache.hadoop:hadoop-client-runtime", "org.apache.hadoop:hadoop-client-api", "at.yawk.lz4:lz4-java",
            "org.xerial.snappy:snappy-java", "org.slf4j:slf4j-api", "com.google.code.findbugs:jsr305",
            "org.scala-lang.modules:scala-parallel-collections_2.13",
            # Delta's (see above); an older RoaringBitmap or Parquet beside pyspark's would shadow them
            "org.apache.logging.log4j:log4j-api", "org.apache.logging.log4j:log4j-core",
            "org.apache.logging.log4j:log4j-slf4j2-impl", "org.apache.parquet:parquet-hadoop",
            "org.apache.parquet:parquet-column", "org.apache.parquet:parquet-common",
            "org.apache.parquet:parquet-encoding", "org.apache.parquet:parquet-format-structures",
            "org.apache.parquet:parquet-jackson", "com.fasterxml.jackson.core:jackson-databind",
            "com.fasterxml.jackson.core:jackson-core", "com.fasterxml.jackson.core:jackson-annotations",
            "com.github.luben:zstd-jni", "org.roaringbitmap:RoaringBitmap", "org.roaringbitmap:shims",
            "io.airlift:aircompressor", "commons-pool:commons-pool", "commons-logging:commons-logging")
#: Delta Lake for Spark 4.2 (Scala 2.13), see above
DELTA_PACKAGE = "io.delta:delta-spark_4.2_2.13:4.4.0"
_DELTA_CONF = {
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
    # A table's state (its log replayed) is rebuilt on every table's first query, in this many tasks (Delta's
    # DeltaSQLConf.scala, DELTA_SNAPSHOT_PARTITIONS; Delta's own build runs its local tests with 2). The default's
    # 50 small tasks cost seconds per table on 2 cores: the report over the landed rollups reads five tables, and
    # with 50 spent 4-5 s of wall on each, measured at 2M lines (docs/PERFORMANCE.md, Analytics).
    "spark.databricks.delta.snapshotPartitions": "2",
}

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
    # And C2 (HotSpot's optimising compiler) only for code that stays hot: a method is compiled by C2 after ten times
    # the invocations and loop iterations of HotSpot's defaults (the Tier4* thresholds of its tiered compilation
    # policy, compilationPolicy.cpp; C1 still compiles everything warm). Each `sluice report` is a fresh JVM, and
    # most of what it runs - Spark's planning, Delta's log replay, a few dozen small queries over rollups and
    # tables - never runs long enough to repay a C2 compilation, which on two cores takes the CPU from the job
    # itself; a scan of millions of JSON lines still gets C2 within its first seconds. `sluice report` at 10M lines,
    # cold (`python -m bench.analytics --cold --compare REV`): 31.6 -> 30.0 s over the landed table, 66.1 -> 65.3 s
    # over the JSON lines; warm (the bench's job after its warm-up), 24.8 -> 19.35 JVM CPU-s over the landed table
    # (docs/PERFORMANCE.md, Analytics). C1 alone (TieredStopAtLevel=1) was as quick over the landed rollups but took
    # 143 s over the JSON lines against 63-65.
    "spark.driver.extraJavaOptions": "-XX:+UseParallelGC -XX:Tier4InvocationThreshold=50000 "
                                     "-XX:Tier4MinInvocationThreshold=6000 -XX:Tier4CompileThreshold=150000 "
                                     "-XX:Tier4BackEdgeThreshold=400000",
}


def is_local(master: str) -> bool:
    return master == "local" or master.startswith("local[") or master.startswith("local-cluster[")


def kafka_package() -> str:
    """The connector's Maven coordinates for the installed Spark (they must match exactly)."""
    import pyspark

    return f"{KAFKA_CONNECTOR}:{pyspark.__version__}"


def build_session(
    master: str = DEFAULT_MASTER, *, app_name: str = "sluice-report", conf: Mapping[str, str] | None = None,
    kafka: bool = False, delta: bool = False,
) -> SparkSession:
    """A new or the running SparkSession; with a running one, runtime SQL settings are still applied. ``kafka``:
    with the Kafka connector (needed to read the access-log topic; only when this call starts the JVM)."""
    settings = dict(_BASE_CONF)
    if is_local(master):
        settings.update(_LOCAL_CONF)
        # Read by the JVM at launch (the block manager and RPC bind before any conf is consulted).
        os.environ.setdefault("SPARK_LOCAL_IP", LOOPBACK)
    packages = [*([kafka_package()] if kafka else []), *([DELTA_PACKAGE] if delta else [])]
    if packages:
        settings["spark.jars.packages"] = ",".join(packages)
        settings["spark.jars.excludes"] = ",".join(_SHIPPED)
    if delta:
        settings.update(_DELTA_CONF)
    if conf:
        settings.update(conf)
        extra = [p for p in packages if p not in conf.get("spark.jars.packages", "")]
        if "spark.jars.packages" in conf and extra:
            settings["spark.jars.packages"] = ",".join([conf["spark.jars.packages"], *extra])
    # Python workers, if Spark ever needs one (the job itself uses no Python UDFs), run this interpreter.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder.master(master).appName(app_name)
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    for key, value in settings.items():
        # getOrCreate() on a running session ignores builder conf; static ones (Delta's extension) stay as started
        if key.startswith("spark.sql.") and spark.conf.isModifiable(key):
            spark.conf.set(key, value)
    spark.sparkContext.setLogLevel("ERROR")
    return spark
