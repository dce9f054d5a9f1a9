"""`brooq periodic --app MODULE:ATTR`: the schedules an application registers.

Owns: that command and its table (``periodic_lines``, a pure function): per schedule its
name, the cron text or "every 30s", the time zone, the next tick, and the last claimed
tick's job id and state (read from brooq_periodic joined with job; "deleted" once
retention removed the job).
Read on the read target when one is set (brooq.cli.common.read_target).
Must never: write to the database, or enqueue anything (only brooq-master does).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

import click
import psycopg

from brooq import app as app_mod
from brooq import dsn as dsn_mod
from brooq.cli.common import checked_read_target, cli, emit_json, schema, table, utc
from brooq.cli.terminal import say_lines
from brooq.db import connect, schema_missing
from brooq.declare.periodic import Schedule, next_tick
from brooq.errors import AppLoadError
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


@cli.command("periodic")
@click.option(
    "--app",
    "app_spec",
    required=True,
    metavar="MODULE:ATTR",
    help="The brooq.Queue of your application, as given to brooq-master.",
)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output (a list).")
@click.pass_context
def periodic(ctx: click.Context, app_spec: str, as_json: bool) -> None:
    """The periodic schedules the application registers: name, schedule, time zone,
    next tick (UTC), and the last tick's job and its state ("deleted" once retention
    removed it)."""
    try:
        queue = app_mod.load(app_spec)
    except AppLoadError as exc:
        raise click.BadParameter(str(exc), param_hint="--app") from None
    dsn = checked_read_target(ctx) or dsn_mod.resolve(ctx.obj.get("database") or queue._dsn_arg)
    try:
        with connect(dsn) as conn:
            found = {
                r[0]: r[1:]
                for r in conn.execute(
                    queries(schema(ctx, queue.schema)).periodic_list,
                    {"names": sorted(queue.schedules)},
                )
            }
    except psycopg.errors.UndefinedTable as exc:
        raise schema_missing(exc) from None
    listed = rows(queue.schedules, found, datetime.now(timezone.utc))
    if as_json:
        emit_json([r.to_dict() for r in listed])
        return
    say_lines(periodic_lines(listed))
