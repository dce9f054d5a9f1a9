"""The `brooq` command group and what its commands share: the --database and
--read-database-url options, the queue an operator command talks through, JSON and table
output, times as operators read them.

The commands that only read (READ_COMMANDS) read through ``open_reads``: on the read
target when one is set (a standby, most often: docs/how-to/read-replica.md), where they
need nothing of the primary; every other command, and every write, goes through
``open_queue`` to the database itself.

Owns: the click group every command module registers on (``cli``), opening the database
or the read target for a command (a reachable primary checked first, so an unreachable
database or a standby is one line at once rather than a pool's timeout or a refused
write later; a read target may be a standby), and the small text helpers.
Must never: run SQL of its own, catch errors (brooq.cli.main turns them into one line
and an exit code), or print anything but what a command asked for.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

import click

import brooq
from brooq import dsn as dsn_mod
from brooq import settings as settings_mod
from brooq.cli.terminal import one_line
from brooq.db import connect, refuse_standby
from brooq.errors import DatabaseUnavailable
from brooq.operator.replica import ReplicaLag, lag
from brooq.sql import queries, validate_schema

DSN_IN_ARGV_NOTE = (
    " A password given here shows in ps (/proc/PID/cmdline) while Python starts, before "
    "brooq replaces its command line; prefer DATABASE_URL_FILE or the credential."
)
# The commands that only read, and so read on the read target when one is set.
READ_COMMANDS = ("stats", "top", "jobs list", "jobs show", "queues", "keys", "fleet", "periodic")
READ_TARGET = "the read target (--read-database-url, QUEUE_READ_DATABASE_URL)"


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(brooq.__version__, prog_name="brooq")
@click.option(
    "--database",
    metavar="DSN",
    help="PostgreSQL connection string (default: DATABASE_URL, DATABASE_URL_FILE "
    "or the systemd credential database-url)." + DSN_IN_ARGV_NOTE,
)
@click.option(
    "--read-database-url",
    "read_database",
    metavar="DSN",
    help="Where the commands that only read (" + ", ".join(READ_COMMANDS) + "; not "
    "queues pause or resume, nor keys unblock) read, a standby most often; writes never go "
    "there (default: QUEUE_READ_DATABASE_URL, QUEUE_READ_DATABASE_URL_FILE or the systemd "
    "credential read-database-url; unset: the database). A password given here shows in ps "
    "while Python starts; prefer QUEUE_READ_DATABASE_URL_FILE or the credential.",
)
@click.option(
    "--schema",
    metavar="NAME",
    help="brooq's own schema (default: QUEUE_SCHEMA; unset: the job table the search_path finds).",
)
@click.pass_context
def cli(
    ctx: click.Context, database: str | None, read_database: str | None, schema: str | None
) -> None:
    """brooq: a PostgreSQL job queue. Operator commands."""
    ctx.ensure_object(dict)
    ctx.obj["database"] = database
    ctx.obj["read_database"] = read_database
    ctx.obj["schema"] = schema


def schema(ctx: click.Context, default: str | None = None) -> str | None:
    """brooq's schema: --schema, else ``default`` (an application's Queue), else
    QUEUE_SCHEMA; None: the search_path's. A bad name is InvalidSettings (exit 2)."""
    given = ctx.obj.get("schema")
    if given is not None:
        return validate_schema(given, "--schema")
    if default is not None:
        return default
    env = settings_mod.getenv("QUEUE_SCHEMA")
    return validate_schema(env.strip(), "QUEUE_SCHEMA") if env is not None else None


def dsn(ctx: click.Context) -> str:
    """The connection string: --database, else DATABASE_URL and its kin."""
    return dsn_mod.resolve(ctx.obj.get("database"))


def checked_dsn(ctx: click.Context) -> str:
    """The connection string once a connection has worked: a readable error now rather
    than a traceback later."""
    return _reachable(dsn(ctx))


def _reachable(found: str) -> str:
    """``found`` once a connection to it has worked and reached a primary: an unreachable
    database (DatabaseUnavailable) or a standby (ReadOnlyDatabase: every command reads
    or writes the primary's tables) is one line now."""
    with connect(found) as conn:
        refuse_standby(conn)
    return found


def direct_dsn(ctx: click.Context) -> str:
    """For ``brooq migrate`` (a session advisory lock, statements outside a transaction):
    --database when given, else the direct connection (QUEUE_LISTEN_DATABASE_URL, else
    DATABASE_URL and its kin; docs/poolers.md), once a connection has worked."""
    explicit = ctx.obj.get("database")
    found = dsn_mod.resolve(explicit) if explicit else dsn_mod.resolve_listen(dsn(ctx))
    return _reachable(found)


def open_queue(ctx: click.Context) -> brooq.Queue:
    """A Queue of one pooled connection, closed when the command ends."""
    # One plain connection first: an unreachable database is reported at once, where the
    # pool would keep retrying until its timeout.
    opened = brooq.Queue(checked_dsn(ctx), pool_size=1, schema=schema(ctx))
    ctx.call_on_close(opened.close)
    return opened


def read_target(ctx: click.Context) -> str | None:
    """The read target: --read-database-url, else QUEUE_READ_DATABASE_URL and its kin;
    None when none is set. A bad value is InvalidDsn (exit 2), never echoed."""
    return dsn_mod.resolve_read(ctx.obj.get("read_database"))


def checked_read_target(ctx: click.Context) -> str | None:
    """``read_target`` once a connection to it has worked: an unreachable one is one
    line naming it as the read target."""
    target = read_target(ctx)
    if target is not None:
        try:
            connect(target).close()
        except DatabaseUnavailable as exc:
            raise DatabaseUnavailable(f"{READ_TARGET}: {exc}") from None
    return target


def open_reads(ctx: click.Context) -> brooq.Queue:
    """The Queue a command that only reads reads through: on the read target when one is
    set (the database itself is then not needed, nor opened), else ``open_queue``."""
    target = checked_read_target(ctx)
    if target is None:
        return open_queue(ctx)
    opened = brooq.Queue(target, pool_size=1, schema=schema(ctx))
    ctx.call_on_close(opened.close)
    return opened


def reads_from(ctx: click.Context, queue: brooq.Queue) -> tuple[str, ReplicaLag] | None:
    """Where ``queue`` (``open_reads``'s) read and how far behind its primary that is,
    when it is the read target; None when the command read the database itself."""
    target = read_target(ctx)
    if target is None:
        return None
    with queue.connection() as conn:
        return dsn_mod.describe(target), lag(conn, queries(queue.schema))


def standby_note(ctx: click.Context, queue: brooq.Queue) -> str:
    """What to add to "nothing found" when ``queue`` (``open_reads``'s) read a standby:
    ``; read from ops@db2:5432/app, a standby, 30s behind its primary: what its primary
    wrote since is not there yet``; "" when it read a primary."""
    with queue.connection() as conn:
        standing = lag(conn, queries(queue.schema))
    if not standing.standby:
        return ""
    target = read_target(ctx)
    database = dsn_mod.describe(target if target is not None else queue.dsn)
    return f"; {reads_line(database, standing)}: what its primary wrote since is not there yet"


def reads_line(database: str, standing: ReplicaLag) -> str:
    """The line saying where a command read, and how far behind its primary that is:
    ``read from ops@db2:5432/app, a standby, 0.3s behind its primary``."""
    return f"read from {database}, {standing.summary()}"


def name_check(validate: Callable[[object], str]) -> Callable[..., str | None]:
    """A click callback: an option's name (a topic, a queue, a tag) as ``validate`` gives it
    back, or a usage error (exit 2, one line) with the reason it refused."""

    def check(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
        if value is None:
            return None
        try:
            return validate(value)
        except brooq.InvalidJob as exc:
            raise click.BadParameter(str(exc), ctx=ctx, param=param) from None

    return check


def emit_json(value: Any) -> None:
    click.echo(json.dumps(value, indent=2, ensure_ascii=False))


def utc(moment: datetime) -> str:
    return moment.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def table(headers: list[str], rows: list[list[str]], right: set[int]) -> list[str]:
    """Columns as wide as their widest cell; the ``right`` ones (numbers) right-aligned.
    Each cell as a terminal may show it (brooq.cli.terminal.one_line)."""
    rows = [[one_line(cell) for cell in row] for row in rows]
    widths = [max(len(c) for c in column) for column in zip(headers, *rows, strict=True)]
    return [
        "  ".join(
            cell.rjust(width) if i in right else cell.ljust(width)
            for i, (cell, width) in enumerate(zip(row, widths, strict=True))
        ).rstrip()
        for row in [headers, *rows]
    ]
