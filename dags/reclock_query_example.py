"""Example: a downstream Spark job scheduled on a collection's Asset, so it runs when an append added updates
to it, reading exactly the new updates: the asset events' extra carries the new ``[lower, upper)``
(``reclock.orchestration.assets``), and ``reclock.tables.spark_updates`` reads the updates in that range from
exactly the live parts, under a read hold. A manual run reads the collection AS OF its latest complete time.
Enabled by ``RECLOCK_QUERY_EXAMPLE=<collection>``; Spark comes from the ``reclock_spark`` connection (Spark
Connect, or a ``spark`` connection whose host is the master). Copy it for your own jobs."""

import os
from datetime import datetime, timezone

from airflow.sdk import DAG, Asset, task

COLLECTION = os.environ.get("RECLOCK_QUERY_EXAMPLE")

if COLLECTION:
    ASSET = Asset(f"reclock://{COLLECTION}")

    with DAG(dag_id=f"query__{COLLECTION}", schedule=[ASSET],
             start_date=datetime(2024, 1, 1, tzinfo=timezone.utc), catchup=False, max_active_runs=1,
             tags=["reclock", "example"]):

        @task.pyspark(conn_id="reclock_spark")
        def new_updates(spark, triggering_asset_events=None) -> dict:
            from reclock.orchestration.assets import new_range
            from reclock.tables import read_table, spark_updates

            new = new_range(triggering_asset_events[ASSET]) if triggering_asset_events else None
            if new is None:  # a manual run: the whole collection AS OF its latest complete time
                with read_table(COLLECTION) as r:  # the hold lasts while the job reads
                    rows = r.spark(spark).count()
                print(f"query__{COLLECTION}: {rows} rows AS OF {r.as_of}", flush=True)
                return {"as_of": r.as_of, "rows": rows}
            lower, upper = new
            updates = spark_updates(spark, COLLECTION, lower, upper).count()
            print(f"query__{COLLECTION}: {updates} new updates at {lower} <= ts < {upper}", flush=True)
            return {"lower": lower, "upper": upper, "updates": updates}

        new_updates()
