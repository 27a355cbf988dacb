"""Resolve the Spark packages the analytics job needs (the Kafka connector, Delta Lake: proxy/analytics/session.py)
into Ivy's cache once, at `make install`.

Spark resolves ``spark.jars.packages`` when a session starts its JVM, downloading what its Ivy cache lacks. On a
machine that never ran Spark, `make test`'s two Spark sessions start side by side and both download into the one
cache: Ivy has no lock across processes, so one JVM read a jar the other was still writing ("Downloaded file size
(0) doesn't match expected Content Length ... download failed") and every test of its session failed at setup.
Resolved here first, each session only finds the jars in the cache.

    python -m rig.spark_packages
"""

from __future__ import annotations

import os

from proxy.analytics.session import build_session


def main() -> int:
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"  # as the tests' sessions (tests/analytics/conftest.py)
    spark = build_session("local[1]", app_name="sluice-install-packages", kafka=True, delta=True)
    try:
        # The jars are on the driver's classpath once the session is up: a class of each, to be sure.
        jvm = spark.sparkContext._jvm
        assert jvm is not None
        for cls in ("org.apache.spark.sql.kafka010.KafkaSourceProvider", "io.delta.sql.DeltaSparkSessionExtension"):
            jvm.java.lang.Class.forName(cls, False, jvm.Thread.currentThread().getContextClassLoader())
    finally:
        spark.stop()
    print("spark packages resolved: the Kafka connector and Delta Lake are in Ivy's cache")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
