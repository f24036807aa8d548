"""Airflow 3 for the stack: api-server, scheduler, dag-processor and triggerer as separate processes on
127.0.0.1 (never ``airflow standalone``, which opens log servers on 0.0.0.0), LocalExecutor, the
metadata DB in the stack's Postgres, the repo's ``dags/`` and ``plugins/``.

With ``teams`` (team -> a DAG folder of its own) Airflow runs in multi-team mode: each folder is a DAG
bundle owned by its team (and the project's ``dags/`` is not read) (created before the DAG processor starts), and ``users`` (name -> (role, team))
log in with Airflow's simple auth manager beside ``admin``: a user of a team reads only the DAGs of its
team's bundle (plus those of no team), which is how the tests give two users different DAG permissions.
"""

from __future__ import annotations

import base64
import json
import os
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from reclock.dev import procs
from reclock.dev.procs import LOOPBACK
from reclock.dev.state import REPO_ROOT, StackState
from reclock.errors import StackError
from reclock.orchestration.deployment import AIRFLOW_ENV, metadata_db_env

COMPONENTS = ("api-server", "scheduler", "dag-processor", "triggerer")
"""One of each process Airflow needs; :attr:`LocalAirflow.components` adds the extra schedulers."""

HA_SETTINGS = {
    # a scheduler whose heartbeat is this old is dead to the others, which then take over what it had queued
    "AIRFLOW__SCHEDULER__SCHEDULER_HEALTH_CHECK_THRESHOLD": "30",
    # how often a scheduler looks for such tasks (default 300 s: a run waited up to five minutes)
    "AIRFLOW__SCHEDULER__ORPHANED_TASKS_CHECK_INTERVAL": "30",
    # a task whose supervisor stopped heartbeating (every 5 s) is failed and retried after this long
    # (default 300 s), e.g. one a dead scheduler's executor ran
    "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT": "90",
}
"""How Reclock configures Airflow's recovery from a dead scheduler or task process: what it takes over and
when (Airflow's defaults wait five minutes on each)."""
ADMIN_USER = "admin"


@dataclass
class LocalAirflow:
    """Airflow's four processes under ``<state>/airflow``; ``env()`` is what every ``airflow`` call needs."""

    state: StackState
    postgres_dsn: str  # SQLAlchemy-free DSN of the metadata database (postgresql://...)
    extra_env: dict[str, str] | None = None
    teams: dict[str, Path] | None = None  # team -> its DAG bundle's folder (multi-team mode)
    users: dict[str, tuple[str, str | None]] | None = None  # more users: name -> (role, team)
    schedulers: int = 1  # more than one: highly available schedulers (scheduler, scheduler-2, ...)
    _admin_token: tuple[float, str] | None = field(default=None, init=False, repr=False, compare=False)

    @property
    def components(self) -> tuple[str, ...]:
        """Every process of this Airflow: :data:`COMPONENTS` and the extra schedulers."""
        extra = tuple(f"scheduler-{i}" for i in range(2, self.schedulers + 1))
        return (*COMPONENTS[:2], *extra, *COMPONENTS[2:])

    @property
    def home(self) -> Path:
        return self.state.dir("airflow")

    @property
    def port(self) -> int:
        return self.state.port("airflow_api")

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    @property
    def admin_password(self) -> str:
        return self.state.secret("airflow_admin_password", 12)

    def user_password(self, user: str) -> str:
        """The password of ``user`` (``admin``'s or one of ``users``), kept in ``stack.json``."""
        return self.admin_password if user == ADMIN_USER else self.state.secret(f"airflow_user_{user}", 12)

    def _bin(self) -> str:
        return str(Path(sys.executable).parent / "airflow")

    def env(self) -> dict[str, str]:
        """This process's environment with :meth:`settings` over it: what every ``airflow`` call runs with."""
        return {**os.environ, **self.settings()}

    def settings(self) -> dict[str, str]:
        """The stack's Airflow settings (``AIRFLOW_HOME``, the metadata database, the folders, keys, ports) and
        :attr:`extra_env`: what an ``airflow`` command needs to act on this stack (``reclock dev airflow``,
        ``reclock dev env``)."""
        fernet = base64.urlsafe_b64encode(self.state.secret("airflow_fernet", 24).encode()[:32].ljust(32, b"0"))
        passwords = self.home / "simple_auth_manager_passwords.json"
        users = {ADMIN_USER: ("admin", None), **(self.users or {})}
        wanted = {u: self.user_password(u) for u in users}
        if not passwords.exists() or json.loads(passwords.read_text()) != wanted:
            fd = os.open(passwords, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(json.dumps(wanted))
        env = {
            "AIRFLOW_HOME": str(self.home),
            "AIRFLOW__CORE__DAGS_FOLDER": str(REPO_ROOT / "dags"),
            "AIRFLOW__CORE__PLUGINS_FOLDER": str(REPO_ROOT / "plugins"),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
            "AIRFLOW__CORE__PARALLELISM": "4",
            "AIRFLOW__CORE__FERNET_KEY": fernet.decode(),
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": ",".join(
                f"{u}:{role}" + (f":{team}" if team else "") for u, (role, team) in users.items()),
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(passwords),
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{self.url}/execution/",
            **metadata_db_env(self.postgres_dsn),  # sync and async (asyncpg) URLs, TLS files
            "AIRFLOW__API__HOST": LOOPBACK,
            "AIRFLOW__API__PORT": str(self.port),
            "AIRFLOW__API__BASE_URL": self.url,
            "AIRFLOW__API__WORKERS": "1",
            "AIRFLOW__API__SECRET_KEY": self.state.secret("airflow_api_secret"),
            "AIRFLOW__API_AUTH__JWT_SECRET": self.state.secret("airflow_jwt_secret"),
            "AIRFLOW__SCHEDULER__SCHEDULER_IDLE_SLEEP_TIME": "0.25",
            "AIRFLOW__SCHEDULER__ENABLE_HEALTH_CHECK": "False",
            "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "10",
            "AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL": "10",
            "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(self.state.port("airflow_worker_logs")),
            "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT": str(self.state.port("airflow_trigger_logs")),
            "AIRFLOW__WEBSERVER__WEB_SERVER_HOST": LOOPBACK,
            "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "True",
            **HA_SETTINGS,
            "SPARK_LOCAL_IP": LOOPBACK,
            "NO_PROXY": "*",
            # retries, as every deployment of the DAGs has them, unless this environment sets its own
            **{k: os.environ.get(k, v) for k, v in AIRFLOW_ENV.items()},
        }
        if self.teams:
            # the teams' folders only: the project's dags/ would build every source's DAGs a second time
            bundles = [{"name": f"{team}_dags", "classpath": "airflow.dag_processing.bundles.local.LocalDagBundle",
                         "kwargs": {"path": str(folder)}, "team_name": team} for team, folder in self.teams.items()]
            env["AIRFLOW__CORE__MULTI_TEAM"] = "True"
            env["AIRFLOW__DAG_PROCESSOR__DAG_BUNDLE_CONFIG_LIST"] = json.dumps(bundles)
        env.update(self.extra_env or {})
        return env

    def exec(self, args: list[str]) -> None:
        """Replace this process by ``airflow ARGS`` run against the stack (its exit code is the command's)."""
        os.execve(self._bin(), [self._bin(), *args], self.env())

    def airflow(self, *args: str, timeout: float = 300) -> str:
        """Run one ``airflow`` CLI command with the stack's environment."""
        return procs.run([self._bin(), *args], f"airflow {' '.join(args[:2])}", env=self.env(), timeout=timeout)

    def pidfile(self, component: str) -> Path:
        return self.home / f"{component}.pid"

    def logfile(self, component: str) -> Path:
        return self.home / f"{component}.log"

    def running(self, component: str) -> bool:
        return procs.read_pid(self.pidfile(component)) is not None

    def start(self, connections: dict[str, dict] | None = None, timeout: float = 180) -> float:
        """Migrate the metadata DB, create connections, start the four processes, wait for health."""
        t0 = time.monotonic()
        if not all(self.running(c) for c in self.components):
            self.airflow("db", "migrate", timeout=600)
            existing = self.airflow("teams", "list") if self.teams else ""
            for team in self.teams or {}:
                if team not in existing:
                    self.airflow("teams", "create", team)
            if connections:
                self.set_connections(connections)
        for component in self.components:
            if not self.running(component):
                self.start_component(component)
        self.wait_healthy(timeout)
        return time.monotonic() - t0

    def start_component(self, component: str) -> int:
        """Start one of :attr:`components` (no migration, no waiting): what a service manager does when one
        died. Returns its pid."""
        kind = "scheduler" if component.startswith("scheduler") else component
        argv = {
            "api-server": [self._bin(), "api-server", "-H", LOOPBACK, "-p", str(self.port), "-w", "1"],
            "scheduler": [self._bin(), "scheduler", "-s"],
            "dag-processor": [self._bin(), "dag-processor"],
            "triggerer": [self._bin(), "triggerer", "-s"],
        }[kind]
        return procs.spawn(f"airflow {component}", argv, log=self.logfile(component),
                           pidfile=self.pidfile(component), env=self.env(), cwd=self.home)

    def set_connections(self, connections: dict[str, dict]) -> None:
        path = self.home / "connections.json"
        path.write_text(json.dumps(connections))
        path.chmod(0o600)
        try:
            self.airflow("connections", "import", "--overwrite", str(path))
        finally:
            path.unlink(missing_ok=True)

    def health(self) -> dict:
        with urllib.request.urlopen(f"{self.url}/api/v2/monitor/health", timeout=5) as r:
            return json.loads(r.read())

    def wait_healthy(self, timeout: float = 180) -> None:
        def healthy() -> bool:
            h = self.health()
            return all(h.get(k, {}).get("status") == "healthy"
                       for k in ("metadatabase", "scheduler", "dag_processor", "triggerer"))

        def alive() -> bool:
            dead = [c for c in self.components if not self.running(c)]
            if dead:
                raise StackError(f"airflow {dead[0]} exited during start-up"
                                 f"{procs._log_tail(self.logfile(dead[0]))}")
            return True

        procs.wait_until("airflow", healthy, timeout, log=self.logfile("api-server"), alive=alive)

    def token(self, user: str = ADMIN_USER) -> str:
        """A JWT for the REST API, from ``user``'s login (default: the admin)."""
        req = urllib.request.Request(
            f"{self.url}/auth/token", method="POST",
            data=json.dumps({"username": user, "password": self.user_password(user)}).encode(),
            headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=30) as r:
            return json.loads(r.read())["access_token"]

    def admin_token(self) -> str:
        """The admin's token for :meth:`api`, reused for up to 5 minutes (Airflow's tokens last a day): callers
        that poll the REST API from several threads then do not each log in again for every request (a loaded
        api-server, one worker, answered a login later than 10 s)."""
        if self._admin_token is None or time.monotonic() - self._admin_token[0] > 300:
            self._admin_token = (time.monotonic(), self.token())
        return self._admin_token[1]

    def api(self, method: str, path: str, body: dict | None = None, token: str | None = None) -> dict:
        """Call the REST API (``/api/v2/...``) as the admin."""
        req = urllib.request.Request(
            f"{self.url}/api/v2/{path.lstrip('/')}", method=method,
            data=json.dumps(body).encode() if body is not None else None,
            headers={"Content-Type": "application/json", "Authorization": f"Bearer {token or self.admin_token()}"})
        with urllib.request.urlopen(req, timeout=30) as r:
            raw = r.read()
            return json.loads(raw) if raw else {}

    def trigger(self, dag_id: str, conf: dict | None = None) -> str:
        """Unpause ``dag_id`` and trigger a run through the REST API; return its ``dag_run_id``."""
        self.unpause(dag_id)
        run = self.api("POST", f"dags/{dag_id}/dagRuns", {"logical_date": None, "conf": conf or {}})
        return run["dag_run_id"]

    def unpause(self, dag_id: str) -> None:
        self.api("PATCH", f"dags/{dag_id}", {"is_paused": False})

    def wait_for_dag(self, dag_id: str, timeout: float = 90) -> None:
        """Wait until the dag-processor has parsed ``dag_id`` (raise with the import errors if it fails)."""
        token = self.token()

        def parsed() -> bool:
            ids = {d["dag_id"] for d in self.api("GET", "dags?limit=1000", token=token).get("dags", [])}
            if dag_id in ids:
                return True
            errors = self.api("GET", "importErrors", token=token).get("import_errors", [])
            if errors:
                raise StackError(f"airflow: DAG import errors: {errors}")
            return False

        deadline = time.monotonic() + timeout
        while not parsed():
            if time.monotonic() > deadline:
                raise StackError(f"airflow: {dag_id} was not parsed within {timeout:.0f}s "
                                 f"(see {self.logfile('dag-processor')})")
            time.sleep(1)

    def wait_run(self, dag_id: str, run_id: str, timeout: float = 300) -> dict:
        """Wait until the run is ``success`` (return it) or ``failed`` (raise ``StackError`` with the
        states of its task instances)."""
        from urllib.parse import quote

        token = self.token()
        path = f"dags/{dag_id}/dagRuns/{quote(run_id, safe='')}"
        deadline = time.monotonic() + timeout
        while True:
            run = self.api("GET", path, token=token)
            if run["state"] == "success":
                return run
            if run["state"] == "failed":
                tis = self.api("GET", f"{path}/taskInstances", token=token).get("task_instances", [])
                states = ", ".join(f"{t['task_id']}={t['state']}" for t in tis)
                tails = "".join(self._log_tail(dag_id, run_id, t["task_id"]) for t in tis if t["state"] == "failed")
                raise StackError(f"airflow: run {run_id} of {dag_id} failed ({states}); "
                                 f"task logs under {self.home / 'logs'}{tails}")
            if time.monotonic() > deadline:
                raise StackError(f"airflow: run {run_id} of {dag_id} still {run['state']} after {timeout:.0f}s")
            time.sleep(0.5)

    def _log_tail(self, dag_id: str, run_id: str, task_id: str, lines: int = 6) -> str:
        """What a failed task's newest attempt logged at level error (its exception's type and message), else
        its last ``lines`` lines: what a test's failure shows, since the stack's folder is gone once the test
        ends. Nothing if there is no log."""
        import json

        folder = self.home / "logs" / f"dag_id={dag_id}" / f"run_id={run_id}" / f"task_id={task_id}"
        attempts = sorted(folder.glob("attempt=*.log"), key=lambda p: p.stat().st_mtime)
        if not attempts:
            return ""
        out, raw = [], attempts[-1].read_text(errors="replace").splitlines()
        for line in raw:
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if isinstance(event, dict) and event.get("level") in ("error", "critical"):
                causes = [f"{d.get('exc_type')}: {d.get('exc_value')}" for d in event.get("error_detail") or []]
                out.append(" / ".join([str(event.get("event")), *causes]))
        shown = (out or raw)[-lines:]
        return f"\n--- {task_id} ({attempts[-1].name}):\n" + "\n".join(line[:1500] for line in shown)

    def kill(self, component: str) -> bool:
        """SIGKILL ``component``'s process group and its descendants, as a crash of its host would: a scheduler
        with its LocalExecutor's workers and the tasks they run (each task process is a group of its own, so
        killing the group alone left them running, orphaned). True if it ran."""
        return procs.kill_tree(self.pidfile(component))

    def stop(self) -> list[str]:
        """Stop every component: the schedulers, dag-processor and triggerer side by side, then the api-server
        (the execution API of their tasks until they end). Returns those that ran."""
        from concurrent.futures import ThreadPoolExecutor

        first = [c for c in reversed(self.components) if c != "api-server"]
        with ThreadPoolExecutor(len(first)) as pool:
            ran = list(pool.map(lambda c: procs.stop(self.pidfile(c), timeout=30), first))
        ran.append(procs.stop(self.pidfile("api-server"), timeout=30))
        return [c for c, was in zip([*first, "api-server"], ran) if was]
