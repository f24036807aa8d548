"""The ``reclock`` command."""

from __future__ import annotations

import os
import sys
import time

import click

from reclock.errors import ReclockError


def _stack(secure: bool | None = None):
    from reclock.dev.stack import Stack

    return Stack(secure=secure)


@click.group()
def main() -> None:
    """Reclock: exactly-once ingestion with reclocking (Airflow drives, Spark writes, Postgres decides)."""


@main.group()
def dev() -> None:
    """The local stack: Postgres, Kafka, Spark Connect and Airflow on 127.0.0.1 (state in .reclock/)."""


@dev.command()
def install() -> None:
    """Install what the stack needs but the machine lacks (Postgres server, Maven jars: the Kafka broker,
    Spark's Kafka connector, S3A, Kafka Connect with Debezium's Postgres connector; the local Kinesis
    endpoint, kinesalite, from npm; Toxiproxy, the network faults of the tests, built from its Go module)."""
    from reclock.dev.jars import PROFILES, ensure_jars, raw_floats_jar
    from reclock.dev.kinesis import ensure_kinesalite
    from reclock.dev.postgres import ensure_installed
    from reclock.dev.toxiproxy import ensure_toxiproxy

    stack = _stack()
    t0 = time.monotonic()
    click.echo(f"postgres server: {ensure_installed()}")
    for profile in PROFILES:
        folder = ensure_jars(stack.state, profile)
        click.echo(f"{profile} jars: {folder} ({len(list(folder.rglob('*.jar')))} jars)")
    click.echo(f"raw-floats jar: {raw_floats_jar(stack.state)}")
    click.echo(f"kinesalite: {ensure_kinesalite()}")
    click.echo(f"toxiproxy: {ensure_toxiproxy()}")
    click.echo(f"installed in {time.monotonic() - t0:.1f}s")


@dev.command()
@click.option("--service", "-s", "services", multiple=True,
              type=click.Choice(["postgres", "kafka", "spark", "airflow"]),
              help="Start only these (default: all).")
@click.option("--smoke/--no-smoke", default=True, help="Run the smoke checks after start.")
@click.option("--secure", is_flag=True, default=None,
              help="The first time: every service authenticated and encrypted (TLS with the stack's own CA, "
                   "SCRAM, Kafka ACLs, least-privilege roles, a Spark Connect token, parts on S3 over TLS); "
                   "the state folder remembers it.")
def up(services: tuple[str, ...], smoke: bool, secure: bool | None) -> None:
    """Start the stack (idempotent) and wait until every service is healthy."""
    from reclock.dev.stack import SERVICES

    stack = _stack(secure)
    t0 = time.monotonic()
    stack.up(services or SERVICES, echo=click.echo)
    click.echo(f"stack up in {time.monotonic() - t0:.1f}s (state: {stack.state.root})")
    if not services or "airflow" in services:
        _print_login(stack)
    if smoke and not services:
        stack.smoke(echo=click.echo)


@dev.command()
def down() -> None:
    """Stop exactly what `up` started."""
    _stack().down(echo=click.echo)


@dev.command()
def status() -> None:
    """Show which services run, and where."""
    for name, state in _stack().status().items():
        click.echo(f"{name:24s} {state}")


@dev.command()
@click.argument("service", required=False)
@click.option("--lines", "-n", default=40, help="Lines per log.")
def logs(service: str | None, lines: int) -> None:
    """Print the tail of each service's log (or of SERVICE's)."""
    for name, path in _stack().logs().items():
        if service and not name.startswith(service):
            continue
        click.echo(f"==> {name}: {path}")
        if path.exists():
            click.echo("\n".join(path.read_text(errors="replace").splitlines()[-lines:]))


@dev.command()
def smoke() -> None:
    """Check that each running service does the real thing Reclock needs."""
    _stack().smoke(echo=click.echo)


@dev.command()
def env() -> None:
    """Print the stack's settings as shell exports: `eval "$(reclock dev env)"`, then `reclock read ...` or
    `airflow dags list` (the Airflow settings and every connection of the stack are exported too)."""
    import shlex

    exports, undefined = _stack().shell_env()
    for key, value in exports.items():
        click.echo(f"export {key}={shlex.quote(value)}")
    for cid in undefined:
        click.echo(f"reclock dev env: the config names connection {cid}, which the dev stack does not define; "
                   f"export AIRFLOW_CONN_{cid.upper()} yourself", err=True)


@dev.command(context_settings={"ignore_unknown_options": True, "allow_extra_args": True,
                               "help_option_names": []})
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def airflow(args: tuple[str, ...]) -> None:
    """Run any `airflow` command against the stack: its metadata database, settings and connections
    (e.g. `reclock dev airflow backfill create --dag-id rebuild__orders --from-date ... --to-date ...`)."""
    if not _stack().airflow.home.is_dir():
        raise click.ClickException("the stack has no Airflow yet: run `reclock dev up` first")
    _stack().airflow.exec(list(args))


@main.command()
@click.option("--waves", default=2, show_default=True, help="Producer waves (one DAG run each).")
@click.option("--per-wave", default=20_000, show_default=True, help="Records per wave.")
def demo(waves: int, per_wave: int) -> None:
    """Bring the stack up, fill the demo topic, run ingest__demo_orders through Airflow, show what landed."""
    from reclock.dev.demo import run_demo
    from reclock.dev.stack import SERVICES

    stack = _stack()
    t0 = time.monotonic()
    stack.up(SERVICES, echo=click.echo)
    _print_login(stack)
    stack.smoke(echo=click.echo)
    click.echo(f"stack up and checked in {time.monotonic() - t0:.1f}s\n")
    run_demo(stack, waves=waves, per_wave=per_wave, echo=click.echo)


# Settings of the commands below: an option, else its environment variable, else where there is one an
# Airflow connection (reclock.settings); a missing one is an error naming how to give it.
_config = click.option("--config", "config", metavar="PATH", help="Reclock config file [RECLOCK_CONFIG].")
_dsn = click.option("--dsn", help="Consensus Postgres DSN [RECLOCK_DSN; else connection reclock_postgres].")
_blob = click.option("--blob-url", "blob_url", help="Where parts live: a folder, file:// or s3:// [RECLOCK_BLOB_URL].")
_bootstrap = click.option("--bootstrap", metavar="HOST:PORT",
                          help="Kafka brokers [RECLOCK_BOOTSTRAP; else the config's bootstrap: or connection:].")
_spark_master = click.option("--spark-master", "spark_master", metavar="MASTER",
                             help="Run Spark in this process on MASTER, e.g. local[2] [RECLOCK_SPARK_MASTER].")
_spark_remote = click.option("--spark-remote", "spark_remote", metavar="URL",
                             help="Spark Connect URL sc://host:port, or several servers that stand in for each "
                                  "other, comma-separated [RECLOCK_SPARK_REMOTE; else connection reclock_spark].")


def _cycle_settings(command):
    """The options of a command that runs a source's Spark work: every setting of a cycle context."""
    for option in reversed((_config, _dsn, _blob, _bootstrap, _spark_master, _spark_remote)):
        command = option(command)
    return command


def _settings():
    """``reclock.settings``, imported when a command runs (``reclock --help`` stays quick)."""
    from reclock import settings

    return settings


def _contexts():
    """``reclock.orchestration.contexts`` (the cycle's and the sinks' contexts), imported when a command runs."""
    from reclock.orchestration import contexts

    return contexts


@main.command()
@click.argument("collection")
@click.option("--as-of", "as_of", type=int, default=None, help="Timestamp (ms); default: upper - 1.")
@click.option("--limit", default=20, show_default=True, help="Rows to print (0: all).")
@_dsn
@_blob
def read(collection: str, as_of: int | None, limit: int, dsn: str | None, blob_url: str | None) -> None:
    """Print COLLECTION's contents AS OF a time (consolidated: rows with their multiplicity `diff`)."""
    from reclock.persist import connect
    from reclock.read import read_as_of

    s = _settings()
    blob = s.find_blob_store(blob_url)
    with connect(s.find_dsn(dsn)) as conn:
        table = read_as_of(conn, blob, collection, as_of)
    total = sum(table.column("diff").to_pylist()) if table.num_rows else 0
    shown = table if limit == 0 else table.slice(0, limit)
    click.echo(shown.to_pandas().to_string(index=False) if shown.num_rows else "(empty)")
    click.echo(f"-- {table.num_rows} distinct rows, {total} in all")


@main.command()
@click.argument("source")
@_dsn
def progress(source: str, dsn: str | None) -> None:
    """Print SOURCE's bindings (its `<source>_progress` relation), uppers and latest status."""
    from reclock.persist import connect
    from reclock.persist.remap_store import load_remap
    from reclock.persist.status import latest_status
    from reclock.sources.registry import kind_named

    with connect(_settings().find_dsn(dsn)) as conn:
        load_remap(conn, source)  # a bad or unregistered name: ConfigError / UnknownSource, not a SQL error
        (kind,) = conn.execute("SELECT kind FROM reclock.sources WHERE name = %s", (source,)).fetchone()
        columns = kind_named(kind).progress_columns  # (ts, the kind's FromTime...)
        cells = ", ".join(f'p."{c}"::text' for c in columns[1:])
        rows = conn.execute(f'SELECT p.ts, {cells} FROM reclock."{source}_progress" p '
                            f'ORDER BY p.ts, p."{columns[1]}"').fetchall()
        shards = conn.execute("SELECT id, upper, since FROM reclock.shards WHERE source = %s ORDER BY id",
                              (source,)).fetchall()
        status = latest_status(conn, source)
    click.echo(f"{'ts':<16} " + " ".join(f"{c:<10}" for c in columns[1:]).rstrip())
    for ts, *cells in rows:
        click.echo(f"{ts:<16d} " + " ".join(f"{'-' if c is None else c:<10}" for c in cells).rstrip())
    for sid, upper, since in shards:
        click.echo(f"shard {sid}: upper {upper}, since {since}")
    _echo_status(status)


@main.command("status")
@click.argument("source", required=False)
@click.option("--json", "as_json", is_flag=True, help="Print the figures as the plugin's JSON endpoint does.")
@click.option("--probe-timeout", default=2.0, show_default=True, help="Seconds the Kafka lag probe may take.")
@_config
@_dsn
@_blob
@_bootstrap
def status_command(source: str | None, as_json: bool, probe_timeout: float, config: str | None, dsn: str | None,
           blob_url: str | None, bootstrap: str | None) -> None:
    """Print where every source and sink stands (or SOURCE, with its bindings and status history): status,
    upper and since, the last cycle's time split, records and bytes, lag, read holds, errors."""
    import json
    import os

    from reclock import status_report as sr
    from reclock.config import load_config

    from reclock.orchestration import airflow_state

    s = _settings()
    cfg = load_config(config)
    blob = s.find_blob_store(blob_url) if blob_url or os.environ.get("RECLOCK_BLOB_URL") else None
    # --bootstrap is a Kafka source's brokers; every kind finds its upstream as its cycles do otherwise
    lag = sr.lag_probe(cfg, probe_timeout, given=lambda spec: bootstrap if spec.kind == "kafka" else None,
                       dsn=s.find_dsn(dsn))
    # pause flags and failed runs, where this process reaches Airflow's metadata database
    dags = airflow_state.dag_states(airflow_state.all_dag_ids(cfg)) if airflow_state.configured() else None
    with sr.open_readonly(s.find_dsn(dsn)) as conn:
        if source is None:
            ov = sr.overview(conn, cfg, lag, blob=blob, dags=dags)
            click.echo(json.dumps(sr.to_json(ov), indent=2) if as_json else "\n".join(sr.report_lines(ov)))
            return
        detail = sr.source_detail(conn, source, cfg, lag, blob=blob, dags=dags)
    if detail is None:
        raise click.ClickException(f"source {source}: not registered and not in the config")
    if as_json:
        click.echo(json.dumps(sr.to_json(detail), indent=2))
        return
    click.echo("\n".join(sr.detail_lines(detail)))


def _cycle_context(source: str, config: str | None, dsn: str | None, blob_url: str | None,
                   bootstrap: str | None, spark_master: str | None, spark_remote: str | None, conf=None):
    """SOURCE's cycle context from the options and settings, Spark found before any step runs."""
    from reclock.config import load_config

    s = _settings()
    spec = load_config(config).source(source)
    from reclock.sources.registry import kind_of

    # a kind whose writes need Spark has it found before any step runs; another finds it when it asks
    spark = s.find_spark(spark_master, spark_remote) if kind_of(spec).writes_on_spark else None
    return _contexts().cycle_context(spec, conf, dsn=dsn, blob_url=blob_url, upstream=bootstrap, spark=spark)


@main.command()
@click.argument("source")
@click.option("--max-records", type=int, default=None, help="Override the record budget for this cycle.")
@_cycle_settings
def cycle(source: str, max_records: int | None, **settings: str | None) -> None:
    """Run one cycle of SOURCE in this process (mint, write_batches, append, resume), outside Airflow."""
    from reclock.cycle import run_cycle

    ctx = _cycle_context(source, **settings, conf={"max_records": max_records} if max_records else None)
    click.echo(run_cycle(ctx))


@main.command()
@click.argument("source")
@click.option("--table", "table", metavar="SCHEMA.TABLE", help="Only this table (new to the source, or one of its "
              "own): snapshotted on its own at the next binding while the other tables stream on (the slot stays).")
@_cycle_settings
def resnapshot(source: str, table: str | None, **settings: str | None) -> None:
    """Start Postgres source SOURCE over from a fresh snapshot at a new timestamp (after DDL, a redefined
    publication or a lost slot stalled it): its next cycle retracts what its collections hold and writes the
    snapshot. --table: one table alone, online."""
    from reclock.cycle import resnapshot as run_resnapshot

    if table is not None:
        out = run_resnapshot(_cycle_context(source, **settings), table)
        click.echo(f"source {source}: table {out['table']} is snapshotted on its own at the first binding at or after "
                   f"ts {out['at_ts']}; the next cycle writes it while the other tables stream")
        return
    out = run_resnapshot(_cycle_context(source, **settings))
    click.echo(f"source {source}: re-snapshot bound at ts {out['ts']} (LSN {out['lsn'] >> 32:X}/"
               f"{out['lsn'] & 0xFFFFFFFF:X}) over {', '.join(out['tables'])}; the next cycle writes it")


@main.command()
@click.argument("source")
@click.option("--from", "from_", metavar="TIME", help="Rebuild only the bindings at or after TIME (ISO 8601, e.g. "
              "2026-01-02T03:04:05Z, or ms since the epoch); widened to whole batches.")
@click.option("--to", "to", metavar="TIME", help="... and before TIME.")
@_cycle_settings
def rebuild(source: str, from_: str | None, to: str | None, **settings: str | None) -> None:
    """Re-derive SOURCE's updates from upstream (today's decode, the recorded bindings: same offsets, same
    timestamps) and swap them in while cycles go on; --from/--to: only that window."""
    from reclock.cycle import rebuild as run_rebuild
    from reclock.orchestration.runs import parse_time_ms

    window = tuple(parse_time_ms(f"source {source}", opt, int(v) if v and v.isdigit() else v)
                   for opt, v in (("--from", from_), ("--to", to)))
    ctx = _cycle_context(source, **settings)
    with click.progressbar(length=1, label=f"rebuilding {source}", show_pos=True) as bar:
        def on_slice(done: int, total: int) -> None:
            bar.length = total
            bar.update(done - bar.pos)

        out = run_rebuild(ctx, on_slice=on_slice, window=window)
    if out["window"] is None:
        click.echo(f"{source}: nothing to rebuild (the window holds no time below the upper {out['upper']})")
        return
    lo, hi = out["window"]
    click.echo(f"rebuilt {', '.join(ctx.spec.shards)} over [{lo}, {hi}) (upper {out['upper']}): {out['parts']} "
               f"parts, records {out.get('records')}")


def _echo_status(status) -> None:
    """Print a ``persist.status.Status`` (the latest status row of a source or sink), if there is one."""
    if status:
        click.echo(f"status: {status.status} at {status.at}" + (f" -- {status.error}" if status.error else ""))


@main.group()
def sink() -> None:
    """Exactly-once sinks (Kafka topics, Iceberg tables): run one, see where it is, drop it."""


def _sink_ctx(name: str, config: str | None, dsn: str | None, blob_url: str | None, bootstrap: str | None):
    from reclock.config import load_config

    return _contexts().any_sink_context(load_config(config).sink(name), dsn=dsn, blob_url=blob_url,
                                        bootstrap=bootstrap)


@sink.command("run")
@click.argument("name")
@click.option("--fresh", is_flag=True, help="Start anew with a snapshot even though the topic (or table) holds "
              "data (an Iceberg table's contents are replaced).")
@click.option("--follow", type=float, default=None, metavar="SECONDS",
              help="Keep running: look for new appends every SECONDS.")
@_config
@_dsn
@_blob
@_bootstrap
def sink_run(name: str, fresh: bool, follow: float | None, **settings: str | None) -> None:
    """Write sink NAME's collection to its Kafka topic or Iceberg table, exactly once, up to its upper (then
    stop, or --follow)."""
    from reclock.sinks.iceberg import IcebergSink, IcebergSinkContext
    from reclock.sinks.kafka import KafkaSink

    ctx = _sink_ctx(name, **settings)
    if isinstance(ctx, IcebergSinkContext):
        sink = IcebergSink(ctx)
        sink.start(fresh)
        started = f"started at frontier {sink.begin.frontier} of table {ctx.spec.table}"

        def progress(r) -> tuple[bool, str]:  # (did the step write anything, what to say)
            return bool(r.commits), f"frontier {r.frontier}: {r.rows} rows, {r.bytes} bytes in {r.commits} commits"
    else:
        sink = KafkaSink(ctx)
        sink.start(fresh)
        started = (f"started (older instances fenced) at frontier {sink.begin.frontier}, "
                   f"version {sink.begin.version}")

        def progress(r) -> tuple[bool, str]:
            return bool(r.transactions), (f"frontier {r.frontier} (version {r.version}): {r.messages} messages, "
                                          f"{r.bytes} bytes in {r.transactions} transactions")
    b = sink.begin
    click.echo(f"sink {name}: {started}"
               + (f", snapshot AS OF {b.snapshot_at} first" if b.snapshot_at is not None else ""), err=True)
    while True:
        wrote, line = progress(sink.step())
        if wrote or follow is None:
            click.echo(f"sink {name}: {line}", err=True)
        if follow is None:
            return
        time.sleep(follow)


@sink.command("status")
@click.argument("name")
@_config
@_dsn
@_blob
@_bootstrap
def sink_status(name: str, config: str | None, dsn: str | None, blob_url: str | None, bootstrap: str | None) -> None:
    """Print sink NAME's progress (its progress record, or its Iceberg table's frontier), read hold, lag and
    latest status."""
    from reclock.config import IcebergSinkSpec, load_config
    from reclock.persist import connect
    from reclock.persist.shards import read_holds, shard_info
    from reclock.persist.status import latest_status
    from reclock.sinks.iceberg import table_frontier
    from reclock.sinks.kafka import read_progress

    s = _settings()
    spec = load_config(config).sink(name)
    if isinstance(spec, IcebergSinkSpec):
        ctx = _contexts().iceberg_sink_context(spec, dsn=dsn, blob_url=blob_url)
        tf = table_frontier(ctx)
        frontier = tf.frontier if tf else None
        target = f"Iceberg table {spec.table} ({spec.layout})"
        progress = ("table not created yet" if tf is None else "none yet" if frontier is None
                    else f"frontier {frontier} (snapshot {tf.snapshot_id})")
    else:
        brokers = s.find_kafka(spec.kafka, f"sink {name}", bootstrap)
        p = read_progress(brokers, spec.progress_topic, name)
        frontier = p.frontier if p else None
        target = f"{spec.kafka.topic} ({spec.format})"
        progress = "none yet" if p is None else f"frontier {p.frontier}, version {p.version}"
    with connect(s.find_dsn(dsn)) as conn:
        info = shard_info(conn, spec.collection)
        hold = next((h for h in read_holds(conn, spec.collection) if h.holder == spec.holder), None)
        status = latest_status(conn, name)
    click.echo(f"sink {name}: {spec.collection} -> {target}")
    click.echo(f"progress: {progress}")
    click.echo(f"{spec.collection}: upper {info.upper}, since {info.since}; read hold "
               f"{hold.ts if hold else 'none'}; lag "
               f"{info.upper - frontier if frontier is not None else info.upper - info.since} ms")
    _echo_status(status)


@sink.command("drop")
@click.argument("name")
@_config
@_dsn
@_blob
@_bootstrap
def sink_drop(name: str, **settings: str | None) -> None:
    """Release sink NAME's read hold (compaction may pass it; recreating it then needs --fresh)."""
    from reclock.sinks import iceberg, kafka

    ctx = _sink_ctx(name, **settings)
    released = (iceberg.drop if isinstance(ctx, iceberg.IcebergSinkContext) else kafka.drop)(ctx)
    click.echo(f"sink {name}: read hold {'released' if released else 'was not held'}")


@main.command()
@_config
def check(config: str | None) -> None:
    """Validate the config as the DAG file does (kinds, keys, schemas) and resolve every Airflow connection its
    sources and sinks name (which the DAG file leaves to each task): an error lists every one not defined."""
    from reclock.config import config_path, load_config

    path = config_path(config)
    cfg = load_config(path)
    _settings().check_connections(cfg)
    click.echo(f"{path}: {len(cfg.sources)} sources, {len(cfg.sinks)} sinks; every connection they name is defined")


@main.command()
@_dsn
def migrate(dsn: str | None) -> None:
    """Apply pending migrations of the `reclock` schema."""
    from reclock.persist.migrate import migrate as run_migrations

    applied = run_migrations(_settings().find_dsn(dsn))
    click.echo(f"applied {applied}" if applied else "schema is up to date")


@main.command()
@click.option("--kafka-principal", default="User:reclock", show_default=True,
              help="The principal of the Kafka connection(s) the ACLs are for.")
@click.option("--consensus-role", default="reclock_app", show_default=True, help="The consensus database's role.")
@click.option("--consensus-database", default="reclock", show_default=True)
@click.option("--cdc-role", default="reclock_cdc", show_default=True, help="The Postgres sources' upstream role.")
@click.option("--apply-kafka", "admin_connection", metavar="CONNECTION", default=None,
              help="Instead of printing them, create the Kafka ACLs as the administrator of this Airflow "
                   "connection (a super user, e.g. a client certificate).")
@click.option("--scram-password-env", metavar="VAR", default=None,
              help="With --apply-kafka: also set the principal's SCRAM-SHA-512 password from this environment "
                   "variable (never an argument).")
@click.option("--create-topics", is_flag=True,
              help="With --apply-kafka: also create the sinks' topics and progress topics that are missing (else the "
                   "principal would need CREATE on them).")
@_config
def grants(kafka_principal: str, consensus_role: str, consensus_database: str, cdc_role: str,
           admin_connection: str | None, scram_password_env: str | None, create_topics: bool,
           config: str | None) -> None:
    """Print exactly what Reclock's principals need for the config: the Kafka ACLs (kafka-acls.sh commands), the
    consensus role's SQL, and each Postgres source's CDC role SQL (published tables as the config names them).
    Run them as an administrator; Reclock needs nothing more. --apply-kafka creates the ACLs itself."""
    from reclock.config import load_config
    from reclock.grants import apply_acls, cdc_grants, consensus_grants, kafka_acls, set_scram_password
    from reclock.sources.postgres.spec import PostgresSpec

    cfg = load_config(config)
    acls = kafka_acls(cfg)
    if admin_connection is not None:
        from reclock.errors import SettingError
        from reclock.connections import kafka_client_config

        admin = kafka_client_config(admin_connection)
        if scram_password_env:
            password = os.environ.get(scram_password_env)
            if not password:
                raise SettingError(f"--scram-password-env {scram_password_env}: the variable is not set")
            set_scram_password(admin, kafka_principal.removeprefix("User:"), password)
            click.echo(f"SCRAM-SHA-512 credentials of {kafka_principal} set")
        apply_acls(admin, kafka_principal, acls)
        click.echo(f"{len(acls)} ACLs of {kafka_principal} created as the administrator of {admin_connection}")
        if create_topics:
            from reclock.grants import create_sink_topics

            made = create_sink_topics(admin, cfg)
            click.echo(f"topics created: {', '.join(made) or 'none (all there)'}")
        return
    if acls:
        click.echo(f"# Kafka: the ACLs of {kafka_principal}")
        for acl in acls:
            click.echo(f"{acl.command(kafka_principal)}    # {acl.why}")
    click.echo(f"\n-- the consensus database {consensus_database}: role {consensus_role}")
    click.echo(";\n".join(consensus_grants(consensus_role, consensus_database)) + ";")
    for name, spec in cfg.sources.items():
        pg = spec.upstream
        if not isinstance(pg, PostgresSpec):  # the grants of a Postgres source's upstream database
            continue
        tables = list(pg.tables)
        click.echo(f"\n-- source {name}: role {cdc_role} in its upstream database (the publication "
                   f"{pg.publication} is created by the tables' owner)")
        if not tables:
            click.echo("-- (the config names no tables: grant SELECT on every table of the publication)")
        click.echo(";\n".join(cdc_grants(cdc_role, tables, "<upstream database>")) + ";")


def _print_login(stack) -> None:
    shown = stack.state.root / "airflow" / ".login-shown"
    if not shown.exists():
        click.echo(f"Airflow UI: {stack.airflow.url}  login: admin / {stack.airflow.admin_password} "
                   f"(shown once; also in {stack.state.file})")
        shown.touch()
    else:
        click.echo(f"Airflow UI: {stack.airflow.url}  login: admin (password in {stack.state.file})")



def run() -> None:
    """The command's entry point: a failure prints ``error: <one line>`` and exits 1, never a traceback (the
    short trace with ``RECLOCK_DEBUG=1``; the whole one with ``RECLOCK_DEBUG=full``). The process ends by
    :func:`reclock.exiting.leave`."""
    from reclock.exiting import leave

    try:
        _command()
    except SystemExit as e:
        leave(e.code)
    leave(0)


def _command() -> None:
    try:
        main(standalone_mode=True)
    except ReclockError as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(1)
    except KeyboardInterrupt:
        click.echo("error: interrupted", err=True)
        sys.exit(130)
    except Exception as e:  # noqa: BLE001 - the last resort: one line, not a traceback
        from reclock.explain import summary

        debug = os.environ.get("RECLOCK_DEBUG", "")
        if debug == "full":
            raise
        s = summary(e)
        click.echo(f"error: {s.message}", err=True)
        click.echo(s.trace if debug else "(RECLOCK_DEBUG=1 prints where it happened)", err=True)
        sys.exit(1)


if __name__ == "__main__":
    run()
