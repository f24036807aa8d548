"""Every DAG of a Reclock config: ``ingest__<source>`` per source (``ingest_group__<group>`` per continuous
group instead of its sources' own), ``rebuild__<source>`` per source whose kind replays its bindings
(``SourceKind.rebuild_refused``), ``sink__<sink>`` per sink. The DAG file (``dags/reclock_ingest.py``) calls :func:`build_all` and nothing else."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any, Collection

from reclock.config import config_path, groups, load_config
from reclock.errors import ConfigError
from reclock.orchestration.ingest import build_group_dag, build_ingest_dag
from reclock.orchestration.rebuild import build_rebuild_dag
from reclock.orchestration.sinks import build_sink_dag
from reclock.sources.registry import kind_of


def build_all(project: Path, only: Collection[str] | None = None) -> dict[str, Any]:
    """The DAGs keyed by dag_id. ``project`` is the folder holding ``dags/``: the config is
    ``$RECLOCK_CONFIG``, else its ``include/reclock.yaml``; rebuild jobs are in its ``spark_jobs/``.
    ``only``: the DAGs of just these sources and sinks (a team's DAG file in a DAG bundle of its own, so
    that Airflow's per-team permissions cover them; every name must be in the config)."""
    path = config_path(default=Path(project) / "include" / "reclock.yaml").resolve()
    cfg = load_config(path)
    if only is not None:
        unknown = sorted(set(only) - set(cfg.sources) - set(cfg.sinks))
        if unknown:
            raise ConfigError(f"{path}: build_all(only=...) names {', '.join(unknown)}, which the config does not have")
        cfg = replace(cfg, sources={n: s for n, s in cfg.sources.items() if n in only},
                      sinks={n: s for n, s in cfg.sinks.items() if n in only})
    dags = {spec.ingest_dag: build_ingest_dag(spec) for spec in cfg.sources.values() if not spec.group}
    dags.update({f"ingest_group__{g}": build_group_dag(g, members) for g, members in groups(cfg.sources).items()})
    # an upstream that keeps no history to replay (Postgres) has no rebuild DAG: its kind says why
    dags.update({f"rebuild__{name}": build_rebuild_dag(spec, path, Path(project) / "spark_jobs")
                 for name, spec in cfg.sources.items() if kind_of(spec).rebuild_refused(spec) is None})
    dags.update({f"sink__{name}": build_sink_dag(spec) for name, spec in cfg.sinks.items()})
    return dags
