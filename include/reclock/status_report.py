"""Where every source and sink stands, read from what Reclock records: the status report behind
``reclock status`` and the Airflow plugin's pages (one module, two faces).

    reclock.sources, remap_collections ─┐
    shards, shard_batches, read_holds ──┤
    statistics (a cycle's steps) ───────┼──> overview() ──> Overview(sources, sinks)
    status_history ─────────────────────┤    source_detail() ──> SourceDetail(bindings, history, series)
    the kind's lag probe ───────────────┘    (Kafka: group reclock-<source>; "unknown" when it does not answer)

A cycle is read back from its statistics rows: a ``mint`` row opens it, ``write_batches`` rows (one per
description) and ``append`` rows follow, a ``resume`` row closes it. Each row's ``seconds`` is the step's own
time and ``at`` its end, so the cycle's wall time (first step's start to resume's end) minus the steps'
seconds is the *scheduler gap*: task start-up and the scheduler between the two tasks.

Never blocks a cycle: it only reads, on a read-only connection with a statement timeout and a lock timeout,
with queries bounded by the index on ``(name, id DESC)``; the lag probe has a short timeout and degrades to
an unknown lag with the reason, never an exception.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Callable, Collection, Mapping, Sequence

from reclock.config import Config
from reclock.part_layout import ERRORS_KIND
from reclock.redaction import redact
from reclock.persist import connect
from reclock.persist.remap_store import read_progress
from reclock.persist.shards import ReadHold
from reclock.persist.status import COLUMNS as STATUS_COLUMNS, Status
from reclock.read import read_updates
from reclock.sources.base import Lag, human_bytes
from reclock.sources.registry import kind_named, kind_of

STATEMENT_TIMEOUT_MS = 2000
RECENT_ROWS = 60  # statistics rows per source read for the overview: the last cycle and a half, at least
LAG_DEADLINE_S = 3.0  # the page waits no longer for the lag probes
SERIES_ROWS = 2000  # statistics rows per source read for its plots
STEPS = ("mint", "write_batches", "append", "resume")


# -- values ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Cycle:
    """One cycle read back from its statistics rows (seconds per step; None for a step not recorded)."""

    started: datetime
    ended: datetime
    mint: float | None
    write_batches: float | None
    append: float | None
    resume: float | None
    records: int  # rows written to the source's shards (data and errors)
    bytes: int
    offsets_known: int | None  # the sum of the upstream upper's offsets at mint
    offsets_committed: int | None  # the sum of the offsets resume committed

    @property
    def total(self) -> float:
        return (self.ended - self.started).total_seconds()

    @property
    def steps(self) -> float:
        return sum(s for s in (self.mint, self.write_batches, self.append, self.resume) if s is not None)

    @property
    def scheduler_gap(self) -> float:
        return max(0.0, self.total - self.steps)


@dataclass(frozen=True)
class DagRunState:
    """One run of a DAG as Airflow records it."""

    dag_id: str
    run_id: str
    state: str  # queued / running / success / failed
    run_type: str
    started: datetime | None
    ended: datetime | None
    failed_tasks: tuple[str, ...] = ()


@dataclass(frozen=True)
class DagState:
    """What Airflow knows of a DAG: its pause flag and its newest runs (newest first)."""

    dag_id: str
    paused: bool | None
    runs: tuple[DagRunState, ...] = ()

    @property
    def failed_since_success(self) -> int:
        """Failed runs newer than the newest successful one."""
        n = 0
        for r in self.runs:
            if r.state == "success":
                break
            n += r.state == "failed"
        return n

    @property
    def newest_finished(self) -> DagRunState | None:
        return next((r for r in self.runs if r.state in ("success", "failed")), None)


def run_failure(dag: DagState | None, status_at: datetime | None, status_run: str | None = None) -> DagRunState | None:
    """The newest finished run of ``dag`` if it failed and the source's newest status row is not that run's
    own and older than its end (a run that failed before any step could record why: a task killed, a
    setting missing, a refused conf); None otherwise (a step that stalled in that run says why itself)."""
    run = dag.newest_finished if dag is not None else None
    if run is None or run.state != "failed" or run.ended is None or run.run_id == status_run:
        return None
    return run if status_at is None or run.ended > status_at else None


@dataclass(frozen=True)
class SourceStatus:
    name: str
    kind: str
    status: str | None  # starting / running / stalled / failed / paused (None: never ran)
    error: str | None
    status_at: datetime | None
    paused: bool | None  # the DAG's pause flag, when the caller knows it
    upper: int  # the resumption frontier: the least upper of the remap collection and the shards
    since: int
    now_ms: int
    last_cycle: Cycle | None
    lag: Lag
    read_holds: tuple[ReadHold, ...]
    errors_count: int
    errors_latest: tuple[dict, ...] = ()
    dags: tuple[str, ...] = ()
    airflow: DagState | None = None  # the ingest DAG's pause flag and newest runs, when Airflow can say
    # a Postgres source's tables snapshotted online in chunks, with their progress as appended
    # (``reclock.sources.postgres.registration.chunked_snapshots``)
    online_snapshots: Mapping[str, dict] = field(default_factory=dict)

    @property
    def upper_age_s(self) -> float | None:
        return (self.now_ms - self.upper) / 1000 if self.upper else None

    @property
    def since_age_s(self) -> float | None:
        return (self.now_ms - self.since) / 1000 if self.since else None


@dataclass(frozen=True)
class SinkStatus:
    name: str
    collection: str | None
    status: str | None
    error: str | None
    status_at: datetime | None
    paused: bool | None
    frontier: int | None  # the sink's upper, from its last statistics row
    lag_ms: int | None  # the collection's upper minus the frontier, while updates wait beyond the frontier
    last_at: datetime | None
    messages: int | None
    bytes: int | None
    seconds: float | None
    read_hold: int | None
    dags: tuple[str, ...] = ()


@dataclass(frozen=True)
class Overview:
    generated_at: datetime
    sources: tuple[SourceStatus, ...]
    sinks: tuple[SinkStatus, ...]


@dataclass(frozen=True)
class BindingRow:
    """A row of the source's ``<source>_progress`` relation: a binding's ``ts`` and the rest of the row as
    text, in the kind's columns (Kafka: partition, offset; Postgres: the LSN; S3: key, byte offset)."""

    ts: int
    cells: tuple[str, ...]


@dataclass(frozen=True)
class SeriesPoint:
    """One cycle on the plots: when it ended, records per second of its wall time, lag at its mint (what
    upstream held beyond what the previous cycle committed, in the kind's lag unit: Kafka records, Postgres
    bytes of WAL), and its wall time."""

    at: datetime
    throughput: float
    lag: int | None
    cycle_s: float


@dataclass(frozen=True)
class SourceDetail:
    source: SourceStatus
    bindings: tuple[BindingRow, ...]
    history: tuple[Status, ...]  # newest first
    series: tuple[SeriesPoint, ...]
    columns: tuple[str, ...] = ("ts", "partition", "offset")  # the kind's progress relation's columns


def to_json(value: Any) -> Any:
    """A value of this module as JSON-ready data (times as ISO strings, ages and splits included)."""
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, (list, tuple)):
        return [to_json(v) for v in value]
    if isinstance(value, dict):
        return {k: to_json(v) for k, v in value.items()}
    if hasattr(value, "__dataclass_fields__"):
        out = {k: to_json(getattr(value, k)) for k in value.__dataclass_fields__}
        for prop in ("upper_age_s", "since_age_s", "total", "scheduler_gap"):
            if hasattr(type(value), prop):
                out[prop] = to_json(getattr(value, prop))
        return out
    if isinstance(value, bytes):
        return value.hex()
    return value


# -- cycles from statistics rows (pure) -------------------------------------------------------------------


def _sum_values(x: Any) -> int:
    if isinstance(x, dict):
        return sum(int(v or 0) for v in x.values())
    return int(x or 0)


def cycles_from_statistics(rows: Sequence[tuple[str, dict, datetime]]) -> list[Cycle]:
    """The complete cycles (mint ... resume) among statistics ``rows`` ``(step, metrics, at)``, oldest first.
    Rows of other steps (rebuild) are skipped; a cycle without its mint row (cut off) is dropped."""
    out: list[Cycle] = []
    cur: dict | None = None
    for step, m, at in rows:
        secs = float(m.get("seconds") or 0.0)
        if step == "mint":
            cur = {"started": at.timestamp() - secs, "mint": secs, "write_batches": None, "append": None,
                   "records": 0, "bytes": 0, "known": m.get("offsets_known")}
        elif cur is None or step not in STEPS:
            continue
        elif step in ("write_batches", "append"):
            cur[step] = (cur[step] or 0.0) + secs
            if step == "write_batches":
                cur["records"] += _sum_values(m.get("records"))
                cur["bytes"] += _sum_values(m.get("bytes"))
        elif step == "resume":
            committed = m.get("offsets_committed")
            out.append(Cycle(
                started=datetime.fromtimestamp(cur["started"], tz=at.tzinfo or timezone.utc), ended=at,
                mint=cur["mint"], write_batches=cur["write_batches"], append=cur["append"], resume=secs,
                records=cur["records"], bytes=cur["bytes"], offsets_known=cur["known"],
                offsets_committed=_sum_values(committed) if committed is not None else None))
            cur = None
    return out


def series_of(cycles: Sequence[Cycle]) -> list[SeriesPoint]:
    """The plots' points of ``cycles`` (oldest first)."""
    points, committed = [], None
    for c in cycles:
        lag = None
        if c.offsets_known is not None and committed is not None:
            lag = max(0, c.offsets_known - committed)
        points.append(SeriesPoint(c.ended, c.records / c.total if c.total > 0 else 0.0, lag, c.total))
        if c.offsets_committed is not None:
            committed = c.offsets_committed
    return points


# -- reading ----------------------------------------------------------------------------------------------


def open_readonly(dsn: str):
    """A connection that can only read, and gives up rather than wait: a status page never holds up a
    cycle (no statement runs longer than :data:`STATEMENT_TIMEOUT_MS`, none waits on a lock)."""
    conn = connect(dsn)
    conn.execute(f"SET default_transaction_read_only = on; SET statement_timeout = {STATEMENT_TIMEOUT_MS}; "
                 f"SET lock_timeout = {STATEMENT_TIMEOUT_MS // 2}")
    return conn


LagProbe = Callable[[str], Lag]
"""A source's name -> its lag."""


def _kind_named(name: str):
    """A registered source's kind by its name (None: a kind this Reclock does not know)."""
    try:
        return kind_named(name)
    except Exception:  # noqa: BLE001 - an unknown kind shows without its kind's words
        return None


def lag_probe(config: Config | None, timeout: float = 2.0, given: Any = None,
              dsn: str | None = None) -> LagProbe:
    """A source's lag as its kind probes it (``SourceKind.lag``: Kafka, the consumer group ``reclock-<source>``
    at its brokers, the sum over partitions of the last stable offset minus the committed offset; Postgres,
    the WAL flushed beyond the slot; S3, objects and bytes not yet ingested, from its catalog in the consensus
    database ``dsn``, else the one the settings name), its upstream found as its cycles find it (``given``: a
    command's option, e.g. ``--bootstrap``, or a function of the spec giving it for the sources it is for:
    ``SourceKind.find_upstream``). Any failure (no config, an unreachable upstream, a missing topic or slot)
    is an unknown lag with the reason."""
    def probe(name: str) -> Lag:
        spec = config.sources.get(name) if config else None
        if spec is None:
            return Lag(None, "not in the config")
        kind = kind_of(spec)
        try:
            upstream = kind.find_upstream(spec, given(spec) if callable(given) else given)
            return kind.lag(spec, upstream, timeout, dsn)
        except Exception as e:  # a status page degrades, it never fails on a probe
            first = str(e).splitlines()[0][:160] if str(e) else ""
            return Lag(None, redact(f"unknown: {type(e).__name__}: {first}"), kind.lag_unit)

    return probe


def no_lag(name: str) -> Lag:
    return Lag(None, "not probed")


def _probe_all(lag: LagProbe, names: Sequence[str], deadline_s: float) -> dict[str, Lag]:
    """``lag`` of every source, in parallel; a probe still running after ``deadline_s`` is an unknown lag
    (its thread is left to finish on its own timeout, nobody waits for it)."""
    if not names:
        return {}
    pool = ThreadPoolExecutor(min(8, len(names)), "reclock-lag")
    futures = {n: pool.submit(lag, n) for n in names}
    wait(futures.values(), timeout=deadline_s)
    pool.shutdown(wait=False, cancel_futures=True)
    return {n: f.result() if f.done() and not f.cancelled() else Lag(None, f"unknown: no answer in {deadline_s:g}s")
            for n, f in futures.items()}


def _latest_status(conn, names: Sequence[str]) -> dict[str, tuple]:
    """name -> (status, error, at, run_id) of its newest status row."""
    return {n: (st, redact(err), at, run) for n, st, err, at, run in conn.execute(
        "SELECT n, s.status, s.error, s.at, s.run_id FROM unnest(%s::text[]) n, LATERAL (SELECT status, error, "
        "at, run_id FROM reclock.status_history WHERE name = n ORDER BY id DESC LIMIT 1) s", (list(names),))}


def _recent_statistics(conn, names: Sequence[str], limit: int) -> dict[str, list]:
    out: dict[str, list] = {n: [] for n in names}
    for n, step, metrics, at in conn.execute(
            "SELECT n, s.step, s.metrics, s.at FROM unnest(%s::text[]) n, LATERAL (SELECT id, step, metrics, at "
            "FROM reclock.statistics WHERE name = n ORDER BY id DESC LIMIT %s) s ORDER BY n, s.id",
            (list(names), limit)):
        out[n].append((step, metrics, at))
    return out


def _errors_latest(conn, blob, shard: str, limit: int = 5, kind=None) -> tuple[dict, ...]:
    """The newest rows of an error collection (raw bytes left out), newest first, from its ``limit`` newest
    parts (through its part list)."""
    row = conn.execute("SELECT min(min_ts) FROM (SELECT min_ts FROM reclock.shard_batches WHERE shard = %s "
                       "AND rows > 0 ORDER BY id DESC LIMIT %s) newest", (shard, limit)).fetchone()
    if row is None or row[0] is None:
        return ()
    table = read_updates(conn, blob, shard, lower=row[0])
    if table is None:
        return ()
    keep = [c for c in ("ts", "partition", "offset", "reason") if c in table.column_names]
    rows = table.select(keep).to_pylist()
    if kind is not None:  # the record's position as its kind prints it
        rows = [{**r, "position": kind.position_text(r["partition"], r["offset"])} if "offset" in r else r
                for r in rows]
    return tuple(rows[-limit:][::-1])


def overview(conn, config: Config | None = None, lag: LagProbe = no_lag,
             paused: Mapping[str, bool] | None = None, blob=None, now_ms: int | None = None,
             only: str | None = None, dags: Mapping[str, DagState] | None = None,
             readable: Collection[str] | None = None) -> Overview:
    """Every source (registered in ``reclock.sources`` or configured) and sink (configured, or holding a
    read hold ``sink:<name>``). ``lag`` probes a source's lag (in parallel, a thread each); ``dags`` maps DAG
    ids to what Airflow knows of them (pause flags and newest runs: a source whose newest ingest run failed
    after its last status row shows ``failed`` with that run), ``paused`` their pause flags alone; with
    ``blob`` the error collections' newest rows are read too. ``only``: just that source. ``readable``: the
    DAG ids the viewer may read (Airflow's per-DAG permissions); a source whose ingest DAG, or a sink whose
    ``sink__<name>`` is not among them is left out before anything of it is read or probed (None:
    everything)."""
    now_ms = now_ms if now_ms is not None else int(time.time() * 1000)
    kinds = dict(conn.execute("SELECT name, kind FROM reclock.sources").fetchall())
    for name, spec in (config.sources if config else {}).items():
        kinds.setdefault(name, spec.kind)
    names = sorted(n for n in kinds if (only is None or n == only)
                   and (readable is None or ingest_dag(n, config) in readable))
    remaps = {r[0]: r[1:] for r in conn.execute(
        "SELECT source, upper, since FROM reclock.remap_collections WHERE source = ANY(%s)", (names,))}
    shards: dict[str, list] = {}
    for sid, src, kind, upper, since in conn.execute(
            "SELECT id, source, kind, upper, since FROM reclock.shards ORDER BY id"):
        shards.setdefault(src, []).append((sid, kind, upper, since))
    holds: dict[str, list[ReadHold]] = {}
    for row in conn.execute("SELECT shard, holder, ts, updated_at, expires_at FROM reclock.read_holds "
                            "WHERE expires_at IS NULL OR expires_at > now() ORDER BY shard, holder"):
        holds.setdefault(row[0], []).append(ReadHold(*row))
    error_shards = [sid for n in names for sid, kind, _, _ in shards.get(n, ()) if kind == ERRORS_KIND]
    errors = dict(conn.execute("SELECT shard, coalesce(sum(rows), 0) FROM reclock.shard_batches "
                               "WHERE shard = ANY(%s) GROUP BY shard", (error_shards,)).fetchall())

    sink_specs = {} if only else dict(config.sinks) if config else {}
    sink_names = sorted(n for n in set(sink_specs) | ({h.holder[5:] for hs in holds.values() for h in hs
                                                      if h.holder.startswith("sink:")} if not only else set())
                        if readable is None or f"sink__{n}" in readable)
    if readable is not None:  # a hidden source's shards and their holders stay hidden
        visible = {sid for n in names for sid, *_ in shards.get(n, ())}
        visible |= {spec.collection for n, spec in sink_specs.items() if n in sink_names}
        visible |= {h.shard for hs in holds.values() for h in hs
                    if h.holder.startswith("sink:") and h.holder[5:] in sink_names}
        holds = {sid: hs for sid, hs in holds.items() if sid in visible}
    statuses = _latest_status(conn, [*names, *sink_names])
    online = dict(conn.execute("SELECT name, config -> 'postgres' -> 'chunked' FROM reclock.sources WHERE name = ANY(%s) "
                               "AND config -> 'postgres' -> 'chunked' <> '{}'::jsonb", (names,)).fetchall())
    stats = _recent_statistics(conn, [*names, *sink_names], RECENT_ROWS)
    dags = dags or {}
    paused = {**{d: s.paused for d, s in dags.items() if s.paused is not None}, **(paused or {})}
    lags = _probe_all(lag, names, LAG_DEADLINE_S)

    sources = []
    for n in names:
        rc_upper, rc_since = remaps.get(n, (0, 0))
        own = shards.get(n, [])
        upper = min([rc_upper, *(u for _, _, u, _ in own)])
        since = max([rc_since, *(s for _, _, _, s in own)]) if own else rc_since
        st = statuses.get(n, (None, None, None, None))
        cycles = cycles_from_statistics(stats.get(n, []))
        err_shard = next((sid for sid, kind, _, _ in own if kind == ERRORS_KIND), None)
        count = int(errors.get(err_shard, 0)) if err_shard else 0
        spec = config.sources.get(n) if config else None
        source_kind = kind_of(spec) if spec else _kind_named(kinds[n])
        latest = _errors_latest(conn, blob, err_shard, kind=source_kind) if blob is not None and count else ()
        # the source's DAGs: its ingest DAG, and a rebuild DAG for a kind that replays (a Kafka source); only
        # those Airflow has, when it was asked
        replays = source_kind is not None and (spec is None or source_kind.rebuild_refused(spec) is None)
        ingest_id = ingest_dag(n, config)
        dag_ids = (ingest_id, *((f"rebuild__{n}",) if replays else ()))
        dag_ids = tuple(d for d in dag_ids if not dags or d in dags)
        failed = run_failure(dags.get(ingest_id), st[2], st[3])
        if failed is not None:
            tasks = f" (task {', '.join(failed.failed_tasks)} failed)" if failed.failed_tasks else ""
            st = ("failed", f"Airflow run {failed.run_id} of {failed.dag_id} failed at "
                            f"{failed.ended:%Y-%m-%d %H:%M:%S}{tasks} before any step recorded why; see its log",
                  failed.ended, failed.run_id)
        sources.append(SourceStatus(
            name=n, kind=kinds[n], status=st[0], error=st[1], status_at=st[2], paused=paused.get(ingest_id),
            upper=upper, since=since, now_ms=now_ms, last_cycle=cycles[-1] if cycles else None, lag=lags[n],
            read_holds=tuple(h for sid, *_ in own for h in holds.get(sid, ())), errors_count=count,
            errors_latest=latest, dags=dag_ids, airflow=dags.get(ingest_id), online_snapshots=online.get(n) or {}))

    sinks = []
    shard_upper = {sid: u for v in shards.values() for sid, _, u, _ in v}
    newest = dict(conn.execute("SELECT shard, max(max_ts) FROM reclock.shard_batches WHERE shard = ANY(%s) "
                               "GROUP BY shard", ([k.collection for k in sink_specs.values()],)).fetchall())
    for n in sink_names:
        spec = sink_specs.get(n)
        collection = spec.collection if spec else next(
            (h.shard for hs in holds.values() for h in hs if h.holder == f"sink:{n}"), None)
        st = statuses.get(n, (None, None, None, None))
        last = next(((m, at) for step, m, at in reversed(stats.get(n, [])) if step == "sink"), None)
        hold = next((h.ts for h in holds.get(collection, ()) if h.holder == f"sink:{n}"), None)
        frontier = last[0].get("frontier") if last else None
        upper_now = shard_upper.get(collection)
        sinks.append(SinkStatus(
            name=n, collection=collection, status=st[0], error=st[1], status_at=st[2],
            paused=paused.get(f"sink__{n}"), frontier=frontier,
            # the collection's upper beyond the frontier, while updates wait there (an idle collection's upper
            # moves on without any: nothing to write is no lag)
            lag_ms=(None if frontier is None or upper_now is None else
                    0 if newest.get(collection) is None or newest[collection] < frontier else max(0, upper_now - frontier)),
            last_at=last[1] if last else None, messages=last[0].get("messages") if last else None,
            bytes=last[0].get("bytes") if last else None, seconds=last[0].get("seconds") if last else None,
            read_hold=hold, dags=(f"sink__{n}",)))
    return Overview(datetime.fromtimestamp(now_ms / 1000, tz=timezone.utc), tuple(sources), tuple(sinks))


def ingest_dag(source: str, config: Config | None) -> str:
    """The DAG that ingests ``source``: its spec's (``ingest__<source>``, or its continuous group's), else
    ``ingest__<source>`` for a source registered but no longer configured."""
    spec = config.sources.get(source) if config else None
    return spec.ingest_dag if spec else f"ingest__{source}"


def source_detail(conn, name: str, config: Config | None = None, lag: LagProbe = no_lag,
                  paused: Mapping[str, bool] | None = None, blob=None, bindings: int = 200,
                  history: int = 50, dags: Mapping[str, DagState] | None = None,
                  readable: Collection[str] | None = None) -> SourceDetail | None:
    """One source's status, its newest ``bindings`` bindings (the ``<source>_progress`` relation), its
    newest ``history`` status rows and its series over the last :data:`SERIES_ROWS` statistics rows.
    None if there is no such source, or ``readable`` (see :func:`overview`) hides it."""
    ov = overview(conn, config, lag, paused, blob, only=name, dags=dags, readable=readable)
    if not ov.sources:
        return None
    columns, rows = read_progress(conn, name, newest=bindings)
    hist = conn.execute(f"SELECT {STATUS_COLUMNS} FROM reclock.status_history WHERE name = %s "
                        "ORDER BY id DESC LIMIT %s", (name, history)).fetchall()
    stats = _recent_statistics(conn, [name], SERIES_ROWS)[name]
    return SourceDetail(ov.sources[0], tuple(BindingRow(r[0], r[1:]) for r in reversed(rows)),
                        tuple(Status(name, st, redact(err), at, step, run, redact(trace))
                              for st, err, at, step, run, trace in hist),
                        tuple(series_of(cycles_from_statistics(stats))), columns)


# -- words and figures shared by the command and the page --------------------------------------------------


def age(seconds: float | None) -> str:
    """``3.2s``, ``4m05s``, ``2h03m``, ``3d04h`` (``-`` for none)."""
    if seconds is None:
        return "-"
    s = max(0.0, seconds)
    if s < 60:
        return f"{s:.1f}s"
    if s < 3600:
        return f"{int(s // 60)}m{int(s % 60):02d}s"
    if s < 86400:
        return f"{int(s // 3600)}h{int(s % 3600 // 60):02d}m"
    return f"{int(s // 86400)}d{int(s % 86400 // 3600):02d}h"


def ts_text(ms: int) -> str:
    """A timestamp as UTC time, or ``-`` for 0 (nothing yet)."""
    if not ms:
        return "-"
    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + "Z"


def secs(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}s"


def status_text(status: str | None, paused: bool | None) -> str:
    if paused:
        return "paused" + (f" ({status})" if status and status != "paused" else "")
    return status or "never ran"


def _head_lines(what: str, x: SourceStatus | SinkStatus) -> list[str]:
    """The first lines of a source or a sink: its status (and the error it stalled on)."""
    head = f"{what}: {status_text(x.status, x.paused)}" + (f" at {x.status_at:%Y-%m-%d %H:%M:%S}" if x.status_at else "")
    return [head] + ([f"  error: {x.error}"] if x.status == "stalled" and x.error else [])


def _source_lines(s: SourceStatus) -> list[str]:
    lines = _head_lines(f"source {s.name} ({s.kind})", s)
    lines.append(f"  upper {s.upper} ({ts_text(s.upper)}, {age(s.upper_age_s)} ago); "
                 f"since {s.since} ({ts_text(s.since)}, {age(s.since_age_s)} ago)")
    c = s.last_cycle
    if c:
        lines.append(f"  last cycle at {c.ended:%Y-%m-%d %H:%M:%S}: {secs(c.total)} = mint {secs(c.mint)} + "
                     f"write_batches {secs(c.write_batches)} + append {secs(c.append)} + resume "
                     f"{secs(c.resume)} + scheduler gap {secs(c.scheduler_gap)}; {c.records} records, "
                     f"{c.bytes} bytes")
    else:
        lines.append("  last cycle: none complete")
    lines.append(f"  lag: {s.lag.text()} ({s.lag.detail})")
    for table, p in sorted(s.online_snapshots.items()):
        after = "none yet" if p.get("done") is None else f"({', '.join(map(str, p['done']))})"
        lines.append(f"  online snapshot of {table}: {p.get('chunks', 0)} of ~{p.get('total', '?')} chunks, "
                     f"{p.get('rows', 0)} rows; last key read {after}")
    holds = ", ".join(f"{h.holder} on {h.shard} at {h.ts}" for h in s.read_holds) or "none"
    lines.append(f"  read holds: {holds}")
    lines.append(f"  errors: {s.errors_count}")
    lines += [f"    ts {e.get('ts')} at {e.get('position') or e.get('offset')}: {e.get('reason')}" for e in s.errors_latest]
    lines.append(f"  airflow: {airflow_text(s.airflow)}")
    return lines


def airflow_text(dag: DagState | None) -> str:
    """A DAG's newest runs in a few words: ``ingest__x: 2 failed runs since the last success (newest: <run>
    at <time>, task append)``."""
    if dag is None:
        return "unknown (no answer from Airflow's metadata database)"
    if not dag.runs:
        return f"{dag.dag_id}: no runs yet"
    newest = dag.runs[0]
    failed = dag.failed_since_success
    if failed:
        f = next(r for r in dag.runs if r.state == "failed")
        when = f" at {f.ended:%Y-%m-%d %H:%M:%S}" if f.ended else ""
        tasks = f", task {', '.join(f.failed_tasks)}" if f.failed_tasks else ""
        return f"{dag.dag_id}: {failed} failed run{'s' if failed > 1 else ''} since the last success (newest: " \
               f"{f.run_id}{when}{tasks}); newest run {newest.state}"
    return f"{dag.dag_id}: newest run {newest.run_id} {newest.state}"


def _sink_lines(k: SinkStatus) -> list[str]:
    lines = _head_lines(f"sink {k.name} ({k.collection})", k)
    lines.append(f"  frontier {k.frontier if k.frontier is not None else '-'}; lag "
                 f"{k.lag_ms if k.lag_ms is not None else '-'} ms; read hold "
                 f"{k.read_hold if k.read_hold is not None else 'none'}; last step "
                 f"{k.messages if k.messages is not None else '-'} messages, "
                 f"{k.bytes if k.bytes is not None else '-'} bytes in {secs(k.seconds)}")
    return lines


def report_lines(ov: Overview) -> list[str]:
    """``reclock status``: the overview as text (every figure the page shows)."""
    lines = [line for s in ov.sources for line in _source_lines(s)]
    lines += [line for k in ov.sinks for line in _sink_lines(k)]
    return lines or ["no sources or sinks yet"]


def detail_lines(d: SourceDetail) -> list[str]:
    """``reclock status SOURCE``: the source's figures, its bindings and its status history."""
    lines = _source_lines(d.source)
    lines.append(f"bindings (newest first): {', '.join(d.columns)}")
    lines += [f"  {b.ts} ({ts_text(b.ts)})  " + "  ".join(b.cells)
              for b in d.bindings]
    lines.append("status history (newest first): at, status, step, Airflow run")
    lines += [f"  {h.at:%Y-%m-%d %H:%M:%S} {h.status} {h.step or '-'} {h.run_id or '-'}"
              + (f" -- {h.error}" if h.error else "") for h in d.history]
    return lines
