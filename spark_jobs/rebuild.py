"""spark-submit entry point: rebuild one source's shards from its recorded bindings and swap them in
(``reclock.cycle.rebuild``: the same updates at the same timestamps).

    spark-submit --master MASTER --jars "$RECLOCK_SPARK_JARS" spark_jobs/rebuild.py SOURCE

The master and the jars come from spark-submit (the ``rebuild__<source>`` DAG's ``spark_submit`` task: the
``reclock_spark_submit`` connection and ``RECLOCK_SPARK_JARS``). Every other setting comes from the
environment, never from the command line, which process lists and Airflow's logs show: ``RECLOCK_CONFIG``,
``RECLOCK_DSN``, ``RECLOCK_BLOB_URL``, and ``RECLOCK_BOOTSTRAP`` unless the source's config names its brokers
(``AIRFLOW_CONN_*`` connections in the environment serve too). Prints the result as one JSON line; a
missing setting prints ``error: ...`` and exits 1.
"""

from __future__ import annotations

import json
import logging
import sys

from reclock import cycle
from reclock.config import load_config
from reclock.errors import ReclockError
from reclock.orchestration.contexts import cycle_context
from reclock.settings import SUBMITTED


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: spark-submit [options] spark_jobs/rebuild.py SOURCE", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    log = logging.getLogger("reclock.rebuild")
    try:
        ctx = cycle_context(load_config().source(argv[0]), spark=SUBMITTED)
        out = cycle.rebuild(ctx, on_slice=lambda done, total: log.info("slice %d of %d written", done, total))
    except ReclockError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(json.dumps({"source": argv[0], **out}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
