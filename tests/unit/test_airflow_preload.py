"""``plugins/airflow_local_settings.py``: the scheduler (whose LocalExecutor forks the task processes)
imports the tasks' modules once; the other Airflow processes import nothing of Reclock's."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

PLUGINS = Path(__file__).resolve().parents[2] / "plugins"
CHECK = """
import sys
sys.argv = ["airflow", {role!r}]
sys.path.append({plugins!r})
import airflow_local_settings
print(sorted(m for m in ("reclock.cycle", "reclock.orchestration.ingest", "pyspark.sql.connect.session")
             if m in sys.modules))
"""


def _loaded(role: str) -> str:
    out = subprocess.run([sys.executable, "-c", CHECK.format(role=role, plugins=str(PLUGINS))], check=True,
                         capture_output=True, text=True, timeout=120)
    return out.stdout.strip()


def test_the_scheduler_preloads_the_tasks_modules_and_no_other_process_does():
    assert _loaded("scheduler") == "['pyspark.sql.connect.session', 'reclock.cycle', 'reclock.orchestration.ingest']"
    for role in ("api-server", "triggerer", "dag-processor"):
        assert _loaded(role) == "[]", role
