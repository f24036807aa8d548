"""spark-submit entry point: rebuild one source's shards from its recorded bindings and swap them in
(``reclock.cycle.rebuild``: the same updates at the same timestamps).

    spark-submit --master MASTER --jars "$RECLOCK_SPARK_JARS" spark_jobs/rebuild.py SOURCE [--from-ms T] [--to-ms T]

``--from-ms`` / ``--to-ms``: rebuild only the bindings at ``T1 <= ts < T2`` (ms since the epoch), widened to
whole batches (``reclock.cycle.rebuild``); without them, every binding.

The master and the jars come from spark-submit (the ``rebuild__<source>`` DAG's ``spark_submit`` task: the
``reclock_spark_submit`` connection and ``RECLOCK_SPARK_JARS``). Every other setting comes from the
environment, never from the command line, which process lists and Airflow's logs show: ``RECLOCK_CONFIG``,
``RECLOCK_DSN``, ``RECLOCK_BLOB_URL``, and where the upstream is: ``RECLOCK_UPSTREAM`` as the task resolved it
(else as a task finds it: ``RECLOCK_BOOTSTRAP``, the config, ``AIRFLOW_CONN_*`` connections in the environment). Prints the result as one JSON line; a
missing setting prints ``error: ...`` and exits 1.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys

from reclock import cycle
from reclock.config import load_config
from reclock.errors import ReclockError
from reclock.orchestration.contexts import cycle_context
from reclock.settings import SUBMITTED


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="spark-submit [options] spark_jobs/rebuild.py")
    parser.add_argument("source")
    parser.add_argument("--from-ms", type=int, default=None, help="rebuild the bindings at ts >= this")
    parser.add_argument("--to-ms", type=int, default=None, help="... and ts < this")
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # a usage error: argparse printed it
        return int(e.code or 0)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    log = logging.getLogger("reclock.rebuild")
    try:
        # where the upstream is as the task resolved it (RECLOCK_UPSTREAM), taken as given: the job has no
        # Airflow connections to look up
        ctx = cycle_context(load_config().source(args.source), spark=SUBMITTED,
                            upstream=os.environ.get("RECLOCK_UPSTREAM"))
        out = cycle.rebuild(ctx, window=(args.from_ms, args.to_ms),
                            on_slice=lambda done, total: log.info("slice %d of %d written", done, total))
    except ReclockError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(json.dumps({"source": args.source, **out}), flush=True)
    return 0


if __name__ == "__main__":
    from reclock.exiting import leave

    leave(main(sys.argv[1:]))  # not sys.exit: see leave
