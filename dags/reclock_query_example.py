"""Example: a downstream Spark job scheduled on a collection's Asset, so it runs after every append, reading
the collection AS OF its latest complete time through ``reclock.tables`` (exactly the live parts, under a read
hold). Enabled by ``RECLOCK_QUERY_EXAMPLE=<collection>``; Spark comes from the ``reclock_spark`` connection
(Spark Connect, or a ``spark`` connection whose host is the master). Copy it for your own jobs."""

import os
from datetime import datetime, timezone

from airflow.sdk import DAG, Asset, task

COLLECTION = os.environ.get("RECLOCK_QUERY_EXAMPLE")

if COLLECTION:
    with DAG(dag_id=f"query__{COLLECTION}", schedule=[Asset(f"reclock://{COLLECTION}")],
             start_date=datetime(2024, 1, 1, tzinfo=timezone.utc), catchup=False, max_active_runs=1,
             tags=["reclock", "example"]):

        @task.pyspark(conn_id="reclock_spark")
        def count_rows(spark) -> dict:
            from reclock.tables import read_table

            with read_table(COLLECTION) as r:  # the hold lasts while the job reads
                rows = r.spark(spark).count()
            print(f"query__{COLLECTION}: {rows} rows AS OF {r.as_of}", flush=True)
            return {"as_of": r.as_of, "rows": rows}

        count_rows()
