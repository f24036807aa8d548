"""Reclock: exactly-once ingestion with reclocking, persist shards in Postgres, and Kafka sinks.

The pure core (`time`, `remap`, `batch`) imports nothing of ours but itself; adapters (`persist`,
`sources`, `sinks`) import the core; `cycle` wires the steps DAG tasks call; `dev` runs the local stack.
"""

__version__ = "0.1.0"
