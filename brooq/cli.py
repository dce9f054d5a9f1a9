"""The `brooq` command: migrations and the operator's reads and writes.

Exit codes: 0 success, 1 refused (unknown id, a transition the state does not allow,
database unreachable), 2 bad usage.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from datetime import datetime, timezone
from functools import wraps
from typing import Any, TypeVar

import click

import brooq
from brooq import dsn as dsn_mod
from brooq import migrate as migrate_mod
from brooq.durations import parse_duration_string
from brooq.errors import (
    BrooqError,
    DatabaseUnavailable,
    InvalidDsn,
    InvalidJob,
    InvalidJobId,
    InvalidTransition,
    SchemaMissing,
)

F = TypeVar("F", bound=Callable[..., Any])


def _dsn(ctx: click.Context) -> str:
    return dsn_mod.resolve(ctx.obj.get("database"))


def _queue(ctx: click.Context) -> brooq.Queue:
    return brooq.Queue(_dsn(ctx))


def _emit_json(value: Any) -> None:
    click.echo(json.dumps(value, indent=2, sort_keys=False, default=str))


def operator_errors(fn: F) -> F:
    """Turn brooq's errors into one line on stderr and the documented exit code."""

    @wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except (InvalidDsn, InvalidJob, InvalidJobId) as exc:
            click.echo(f"error: {exc}", err=True)
            sys.exit(2)
        except (InvalidTransition, DatabaseUnavailable, SchemaMissing, BrooqError) as exc:
            click.echo(f"error: {exc}", err=True)
            sys.exit(1)

    return wrapper  # type: ignore[return-value]


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(brooq.__version__, prog_name="brooq")
@click.option(
    "--database",
    metavar="DSN",
    help="PostgreSQL connection string (default: DATABASE_URL, DATABASE_URL_FILE "
    "or the systemd credential database-url).",
)
@click.pass_context
def cli(ctx: click.Context, database: str | None) -> None:
    """brooq: a PostgreSQL job queue. Operator commands."""
    ctx.ensure_object(dict)
    ctx.obj["database"] = database


# -- migrations ----------------------------------------------------------------------------


@cli.group()
def migrate() -> None:
    """Apply or revert the schema (a deployment step, never done at start-up)."""


@migrate.command("up")
@click.option("--to", "target", type=int, help="Stop at this version.")
@click.pass_context
@operator_errors
def migrate_up(ctx: click.Context, target: int | None) -> None:
    """Apply every migration not yet applied."""
    applied = migrate_mod.up(_checked_dsn(ctx), target)
    for m in applied:
        click.echo(f"applied {m.version:04d}_{m.name}")
    if not applied:
        click.echo("nothing to apply: the schema is up to date")


@migrate.command("down")
@click.option("--steps", default=1, show_default=True, type=click.IntRange(min=1))
@click.pass_context
@operator_errors
def migrate_down(ctx: click.Context, steps: int) -> None:
    """Revert the last applied migration (or --steps of them)."""
    undone = migrate_mod.down(_checked_dsn(ctx), steps)
    for m in undone:
        click.echo(f"reverted {m.version:04d}_{m.name}")
    if not undone:
        click.echo("nothing to revert")


@migrate.command("status")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_context
@operator_errors
def migrate_status(ctx: click.Context, as_json: bool) -> None:
    """Show which migrations are applied."""
    statuses = migrate_mod.status(_checked_dsn(ctx))
    if as_json:
        _emit_json(
            [
                {
                    "version": s.version,
                    "name": s.name,
                    "applied_at": s.applied_at.isoformat() if s.applied_at else None,
                }
                for s in statuses
            ]
        )
        return
    for s in statuses:
        when = s.applied_at.isoformat(timespec="seconds") if s.applied_at else "pending"
        click.echo(f"{s.version:04d}_{s.name:<30} {when}")


@migrate.command("sql")
@click.argument("direction", type=click.Choice(["up", "down"]), default="up")
def migrate_sql(direction: str) -> None:
    """Print the migrations' SQL, for teams that apply schema with their own tool."""
    click.echo(migrate_mod.script(direction), nl=False)


def _checked_dsn(ctx: click.Context) -> str:
    dsn = _dsn(ctx)
    from brooq.db import connect

    connect(dsn).close()  # a readable error now rather than a traceback later
    return dsn


# -- reads ---------------------------------------------------------------------------------


def _age(seconds: float) -> str:
    if seconds <= 0:
        return "-"
    if seconds < 60:
        return f"{seconds:.1f}s"
    if seconds < 3600:
        return f"{seconds / 60:.1f}m"
    return f"{seconds / 3600:.1f}h"


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_context
@operator_errors
def stats(ctx: click.Context, as_json: bool) -> None:
    """Jobs per topic and state (active states and dead), and the oldest ready age."""
    rows = _queue(ctx).stats()
    if as_json:
        _emit_json({"topics": [r.to_dict() for r in rows]})
        return
    header = (
        f"{'TOPIC':<32} {'PENDING':>8} {'PROCESSING':>10} {'FAILED':>7} {'DEAD':>6}  OLDEST READY"
    )
    click.echo(header)
    for r in rows:
        click.echo(
            f"{r.topic:<32} {r.pending:>8} {r.processing:>10} {r.failed:>7} {r.dead:>6}  "
            f"{_age(r.oldest_ready_age)}"
        )
    if not rows:
        click.echo("(no active or dead jobs)")


@cli.group()
def jobs() -> None:
    """List jobs or show one."""


@jobs.command("list")
@click.option("--topic", help="Only this topic.")
@click.option("--state", type=click.Choice(brooq.job.STATES), help="Only this state.")
@click.option("--limit", default=100, show_default=True, type=int, help="At most 1000.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_context
@operator_errors
def jobs_list(
    ctx: click.Context, topic: str | None, state: str | None, limit: int, as_json: bool
) -> None:
    """Jobs, newest first."""
    if not 1 <= limit <= brooq.queue.LIST_LIMIT_MAX:
        raise click.BadParameter(
            f"must be between 1 and {brooq.queue.LIST_LIMIT_MAX}", param_hint="--limit"
        )
    records = _queue(ctx).list_jobs(topic=topic, state=state, limit=limit)
    if as_json:
        _emit_json({"jobs": [r.to_dict() for r in records]})
        return
    click.echo(f"{'ID':<36}  {'TOPIC':<24} {'STATE':<10} {'ATT':>3}  CREATED")
    for r in records:
        created = r.created_at.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%S")
        click.echo(f"{r.id!s:<36}  {r.topic:<24} {r.state:<10} {r.attempts:>3}  {created}")


@jobs.command("show")
@click.argument("job_id")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_context
@operator_errors
def jobs_show(ctx: click.Context, job_id: str, as_json: bool) -> None:
    """A job's fate in one screen."""
    record = _queue(ctx).get(job_id)
    if record is None:
        raise InvalidTransition(f"no job with id {job_id}")
    if as_json:
        _emit_json(record.to_dict())
        return
    for key, value in record.to_dict().items():
        if key == "payload":
            value = json.dumps(value, ensure_ascii=False)
        click.echo(f"{key + ':':<17} {'' if value is None else value}")


# -- writes --------------------------------------------------------------------------------


@cli.command()
@click.argument("job_id")
@click.pass_context
@operator_errors
def cancel(ctx: click.Context, job_id: str) -> None:
    """pending, failed or processing -> canceled."""
    queue = _queue(ctx)
    if not queue.cancel(job_id):
        raise queue.explain_refusal(job_id, "cancel")
    click.echo(f"canceled {job_id}")


@cli.command()
@click.argument("job_id")
@click.pass_context
@operator_errors
def retry(ctx: click.Context, job_id: str) -> None:
    """dead or canceled -> pending now, attempts reset."""
    queue = _queue(ctx)
    if not queue.retry(job_id):
        raise queue.explain_refusal(job_id, "retry")
    click.echo(f"retried {job_id}")


@cli.command()
@click.argument("topic")
@click.option("--payload", default="null", show_default=True, help="JSON payload.")
@click.option("--key", "key", default=None, help="Idempotency key.")
@click.option("--at", "at", default=None, help="ISO 8601 time with a zone.")
@click.option("--in", "delay", default=None, help="A duration from now, e.g. 5m.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_context
@operator_errors
def enqueue(
    ctx: click.Context,
    topic: str,
    payload: str,
    key: str | None,
    at: str | None,
    delay: str | None,
    as_json: bool,
) -> None:
    """Put one job on the queue."""
    try:
        data = json.loads(payload)
    except json.JSONDecodeError as exc:
        raise click.BadParameter(f"not JSON: {exc}", param_hint="--payload") from None
    if at and delay:
        raise click.UsageError("give --at or --in, not both")
    available_at: datetime | None = None
    if at:
        try:
            available_at = datetime.fromisoformat(at)
        except ValueError:
            raise click.BadParameter("not an ISO 8601 time", param_hint="--at") from None
    elif delay:
        try:
            seconds = parse_duration_string(delay)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--in") from None
        from datetime import timedelta

        available_at = datetime.now(timezone.utc) + timedelta(seconds=seconds)
    job = brooq.Job(topic, data, idempotency_key=key, available_at=available_at)
    job_id, created = _queue(ctx).enqueue(job)
    if as_json:
        _emit_json({"id": str(job_id), "created": created})
    else:
        click.echo(f"{'enqueued' if created else 'exists'} {job_id}")


def main() -> None:
    cli(prog_name="brooq")
