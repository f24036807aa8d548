"""The ``reclock`` command."""

from __future__ import annotations

import sys
import time

import click

from reclock.errors import ReclockError


def _stack():
    from reclock.dev.stack import Stack

    return Stack()


@click.group()
def main() -> None:
    """Reclock: exactly-once ingestion with reclocking (Airflow drives, Spark writes, Postgres decides)."""


@main.group()
def dev() -> None:
    """The local stack: Postgres, Kafka, Spark Connect and Airflow on 127.0.0.1 (state in .reclock/)."""


@dev.command()
def install() -> None:
    """Install what the stack needs but the machine lacks (Postgres server, Maven jars)."""
    from reclock.dev.jars import ensure_jars
    from reclock.dev.postgres import ensure_installed

    stack = _stack()
    t0 = time.monotonic()
    click.echo(f"postgres server: {ensure_installed()}")
    for profile in ("kafka", "spark"):
        folder = ensure_jars(stack.state, profile)
        click.echo(f"{profile} jars: {folder} ({len(list(folder.glob('*.jar')))} jars)")
    click.echo(f"installed in {time.monotonic() - t0:.1f}s")


@dev.command()
@click.option("--service", "-s", "services", multiple=True,
              type=click.Choice(["postgres", "kafka", "spark", "airflow"]),
              help="Start only these (default: all).")
@click.option("--smoke/--no-smoke", default=True, help="Run the smoke checks after start.")
def up(services: tuple[str, ...], smoke: bool) -> None:
    """Start the stack (idempotent) and wait until every service is healthy."""
    from reclock.dev.stack import SERVICES

    stack = _stack()
    t0 = time.monotonic()
    stack.up(services or SERVICES, echo=click.echo)
    click.echo(f"stack up in {time.monotonic() - t0:.1f}s (state: {stack.state.root})")
    if not services or "airflow" in services:
        shown = stack.state.root / "airflow" / ".login-shown"
        if not shown.exists():
            click.echo(f"Airflow UI: {stack.airflow.url}  login: admin / {stack.airflow.admin_password} "
                       f"(shown once; also in {stack.state.file})")
            shown.touch()
        else:
            click.echo(f"Airflow UI: {stack.airflow.url}  login: admin (password in {stack.state.file})")
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


@main.command()
@click.option("--dsn", envvar="RECLOCK_DSN", help="Postgres DSN (default: the local stack's).")
def migrate(dsn: str | None) -> None:
    """Apply pending migrations of the `reclock` schema."""
    from reclock.persist.migrate import migrate as run_migrations

    applied = run_migrations(dsn or _stack().postgres.dsn())
    click.echo(f"applied {applied}" if applied else "schema is up to date")


def run() -> None:
    try:
        main(standalone_mode=True)
    except ReclockError as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(1)


if __name__ == "__main__":
    run()
