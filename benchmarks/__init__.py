"""Reclock's benchmark harness (issue 5): ingest throughput against Spark Structured Streaming, a bare Spark
batch job and a plain consumer; per-cycle overhead; memory; state size; freshness under the scheduler.

Run ``.venv/bin/python -m benchmarks.run --size quick --reps 1`` (see :mod:`benchmarks.run`).
"""
