"""Benchmarks: each ``python -m bench.NAME`` prints JSON lines; figures are ratios measured in one run."""
