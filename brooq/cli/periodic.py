"""`brooq periodic [--app MODULE:ATTR]`: the schedules an application registers, and
those stored in the database, with `add`, `change`, `pause`, `resume`, `remove` and `run`
for the stored ones.

Owns: that command and its table (``periodic_lines``, a pure function): per schedule its
name, the cron text or "every 30s", the time zone, the next tick, and the last claimed
tick's job id and state (read from brooq_periodic joined with job; "deleted" once
retention removed the job).
Read on the read target when one is set (brooq.cli.common.read_target).
Must never: write a schedule but through Queue's stored-schedule methods, or enqueue a
tick (only brooq-master does; `run` enqueues the schedule's job through Queue.run_schedule).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

import click
import psycopg

from brooq import app as app_mod
from brooq import dsn as dsn_mod
from brooq.cli.common import (
    checked_read_target,
    cli,
    emit_json,
    open_queue,
    schema,
    table,
    utc,
)
from brooq.cli.terminal import say, say_lines
from brooq.db import connect, schema_missing
from brooq.declare.periodic import Schedule, next_tick
from brooq.errors import AppLoadError, BrooqError
from brooq.operator import schedules as schedules_mod
from brooq.operator.schedules import StoredSchedule
from brooq.sql import queries


@dataclass(frozen=True)
class Row:
    name: str
    schedule: str
    tz: str
    next_tick: datetime
    last_tick: datetime | None
    last_job: uuid.UUID | None
    last_state: str | None  # "deleted": the job row is gone

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "schedule": self.schedule,
            "tz": self.tz,
            "next_tick": self.next_tick.isoformat(),
            "last_tick": None if self.last_tick is None else self.last_tick.isoformat(),
            "last_job": None if self.last_job is None else str(self.last_job),
            "last_state": self.last_state,
        }


def rows(schedules: dict[str, Schedule], found: dict[str, Any], now: datetime) -> list[Row]:
    """One Row per schedule, by name; ``found``: brooq_periodic's rows by name."""
    out = []
    for name, s in sorted(schedules.items()):
        r = found.get(name)
        job = None if r is None else r[1]
        state = None if r is None or job is None else (r[2] or "deleted")
        out.append(
            Row(
                name=name,
                schedule=s.describe(),
                tz=s.tz,
                next_tick=next_tick(s, now),
                last_tick=None if r is None else r[0],
                last_job=job,
                last_state=state,
            )
        )
    return out


def periodic_lines(found: list[Row]) -> list[str]:
    if not found:
        return ["(no periodic schedules: register one with queue.periodic(...))"]
    headers = ["NAME", "SCHEDULE", "TZ", "NEXT TICK", "LAST TICK", "LAST JOB", "STATE"]
    body = [
        [
            r.name,
            r.schedule,
            r.tz,
            utc(r.next_tick),
            "-" if r.last_tick is None else utc(r.last_tick),
            "-" if r.last_job is None else str(r.last_job),
            r.last_state or "-",
        ]
        for r in found
    ]
    return table(headers, body, right=set())


@cli.group("periodic", invoke_without_command=True)
@click.option(
    "--app",
    "app_spec",
    metavar="MODULE:ATTR",
    help="The brooq.Queue of your application, as given to brooq-master: its declared "
    "schedules are listed too.",
)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_context
def periodic(ctx: click.Context, app_spec: str | None, as_json: bool) -> None:
    """The periodic schedules: those the application declares (with --app: name,
    schedule, time zone, next tick in UTC, and the last tick's job and its state,
    "deleted" once retention removed it), then those stored in the database (`brooq
    periodic add`), which every master runs beside the application's."""
    if ctx.invoked_subcommand is not None:
        if app_spec is not None or as_json:
            raise click.UsageError("give --app and --json without a command: they list")
        return
    declared: list[Row] = []
    stored: list[StoredSchedule] = []
    if app_spec is not None:
        try:
            queue = app_mod.load(app_spec)
        except AppLoadError as exc:
            raise click.BadParameter(str(exc), param_hint="--app") from None
        dsn = checked_read_target(ctx) or dsn_mod.resolve(ctx.obj.get("database") or queue._dsn_arg)
        the_schema = schema(ctx, queue.schema)
    else:
        queue = None
        dsn = checked_read_target(ctx) or dsn_mod.resolve(ctx.obj.get("database"))
        the_schema = schema(ctx)
    q = queries(the_schema)
    try:
        with connect(dsn) as conn:
            if queue is not None:
                found = {
                    r[0]: r[1:]
                    for r in conn.execute(q.periodic_list, {"names": sorted(queue.schedules)})
                }
                declared = rows(queue.schedules, found, datetime.now(timezone.utc))
            stored = schedules_mod.listed(conn, q=q)
    except psycopg.errors.UndefinedTable as exc:
        raise schema_missing(exc) from None
    if as_json:
        if queue is not None:
            emit_json([r.to_dict() for r in declared])  # the declared ones, as always
        else:
            emit_json([s.to_dict() for s in stored])
        return
    if queue is not None:
        say_lines(periodic_lines(declared))
    if stored or queue is None:
        if queue is not None:
            say("")
        say_lines(stored_lines(stored))


def stored_lines(stored: list[StoredSchedule]) -> list[str]:
    """The schedules stored in the database as a table."""
    if not stored:
        return ["(no schedule stored in the database: add one with brooq periodic add)"]
    headers = ["STORED", "SCHEDULE", "TZ", "TOPIC", "NEXT TICK", "LAST TICK", "LAST JOB"]
    body = []
    for s in stored:
        d = s.to_dict()
        body.append(
            [
                s.name,
                d["schedule"],
                s.tz,
                s.topic,
                "paused" if s.paused else utc(datetime.fromisoformat(d["next_tick"])),
                "-" if s.last_tick is None else utc(s.last_tick),
                "-" if s.last_job is None else str(s.last_job),
            ]
        )
    return table(headers, body, right=set())


def _options(adding: bool) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """The options of `add` (topic and a cron or every required) and `change` (any)."""

    def payload(ctx: click.Context, param: click.Parameter, value: str | None) -> Any:
        if value is None:
            return None
        try:
            return json.loads(value)
        except ValueError as exc:
            raise click.BadParameter(f"not JSON: {exc}", ctx=ctx, param=param) from None

    decorators = [
        click.argument("name"),
        click.option("--topic", required=adding, help="The topic of each tick's job."),
        click.option("--cron", help="5 cron fields, or @hourly, @daily, ... (in --tz)."),
        click.option("--every", help="A period of at least 1s (30s, 5m, 1h)."),
        click.option("--tz", default="UTC" if adding else None, help="An IANA time zone."),
        click.option("--payload", callback=payload, help="The job's payload, as JSON."),
        click.option("--queue", "queue_name", help="The job's queue (default: its topic's)."),
        click.option("--priority", type=int, default=0 if adding else None, help="Higher first."),
        click.option(
            "--backfill",
            type=click.IntRange(0, 1000),
            default=0 if adding else None,
            help="After downtime, enqueue so many missed ticks before the due one.",
        ),
    ]

    def apply(fn: Callable[..., None]) -> Callable[..., None]:
        for decorate in reversed(decorators):
            fn = decorate(fn)
        return click.pass_context(fn)

    return apply


@periodic.command("add")
@_options(adding=True)
@click.option("--paused", is_flag=True, help="Stored paused: no tick until resumed.")
def periodic_add(ctx: click.Context, name: str, queue_name: str | None, **given: Any) -> None:
    """Store the schedule NAME in the database: every master enqueues its ticks, once
    each, from the next one (within a second)."""
    if (given["cron"] is None) == (given["every"] is None):
        raise click.UsageError("give exactly one of --cron and --every")
    stored = open_queue(ctx).add_schedule(name, queue=queue_name, **given)
    say(
        f"added schedule {name}: {stored.to_dict()['schedule']} ({stored.tz}), next tick "
        f"{stored.to_dict()['next_tick'] or 'when resumed'}"
    )


@periodic.command("change")
@_options(adding=False)
def periodic_change(ctx: click.Context, name: str, queue_name: str | None, **given: Any) -> None:
    """Change the stored schedule NAME: only the options given (--cron and --every replace
    each other). The masters follow within a second."""
    fields = {k: v for k, v in given.items() if v is not None}
    if queue_name is not None:
        fields["queue"] = queue_name
    if not fields:
        raise click.UsageError("give at least one option to change")
    stored = open_queue(ctx).change_schedule(name, **fields)
    say(f"changed schedule {name}: {stored.to_dict()['schedule']} ({stored.tz})")


@periodic.command("pause")
@click.argument("name")
@click.pass_context
def periodic_pause(ctx: click.Context, name: str) -> None:
    """No tick of the stored schedule NAME is enqueued until it is resumed."""
    open_queue(ctx).pause_schedule(name)
    say(f"paused schedule {name}")


@periodic.command("resume")
@click.argument("name")
@click.pass_context
def periodic_resume(ctx: click.Context, name: str) -> None:
    """The stored schedule NAME's ticks come again (missed ones as its backfill says)."""
    open_queue(ctx).resume_schedule(name)
    say(f"resumed schedule {name}")


@periodic.command("remove")
@click.argument("name")
@click.pass_context
def periodic_remove(ctx: click.Context, name: str) -> None:
    """Remove the stored schedule NAME (its jobs already enqueued stay)."""
    if not open_queue(ctx).remove_schedule(name):
        raise BrooqError(f"no stored schedule named {name!r} (brooq periodic lists them)")
    say(f"removed schedule {name}")


@periodic.command("run")
@click.argument("name")
@click.pass_context
def periodic_run(ctx: click.Context, name: str) -> None:
    """Enqueue the stored schedule NAME's job now, outside its ticks."""
    job_id = open_queue(ctx).run_schedule(name)
    say(f"enqueued {job_id}")
