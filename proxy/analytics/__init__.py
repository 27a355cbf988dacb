"""Traffic analytics over Sluice's access logs, on Spark (the ``analytics`` extra: pyspark, matplotlib).

``sluice report --logs PATH... --out DIR`` runs :func:`proxy.analytics.job.run_job`: access logs (JSON lines, any
number of files, gzip allowed) in, Parquet aggregates and a self-contained HTML report out. One module per concept:

- ``schema``: the explicit Spark schema of access-log schema 1 (+ fields later versions add);
- ``session``: the SparkSession (local[N] bound to 127.0.0.1, or a cluster master);
- ``source``: reading (files, or the access-log topic over a time range), classifying and counting lines (malformed
  ones counted, never fatal), caching valid rows;
- ``live``: ``sluice stream``, Structured Streaming over the topic keeping per-minute tables current (exactly once);
  ``minutes``: their report sections and the live report;
- ``buckets``: the time-bucket size; ``aggregates``: one DataFrame per Parquet table;
- ``fairness``: Jain's index; ``kip73``: throttle sizing from observed inbound rates; ``units``: sizes and rates;
- ``charts`` (matplotlib, PNG; ``drawing``: drawn by a worker process beside the job), ``html`` (the page),
  ``sections`` (what the report says); ``job``: all of it in order.

Importing this package does not import pyspark: ``proxy.cli`` can describe ``report`` without the extra.
"""
