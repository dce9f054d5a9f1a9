"""Apply the SQL files of migrations/ in order, each in its own transaction, under an
advisory lock so that two deploy steps cannot race. Versions live in brooq_migration.

The files are the only schema truth. Each has an up part and a down part:

    -- migrate:up
    CREATE TABLE ...;
    -- migrate:down
    DROP TABLE ...;

A file marked ``-- migrate:no-transaction`` (before its up part) runs statement by
statement in autocommit instead: ``CREATE INDEX CONCURRENTLY`` cannot run in a
transaction, and one transaction would keep every lock it took (an ACCESS EXCLUSIVE one
included) until its end, blocking producers and claims on a big table. Each statement
then runs under ``lock_timeout`` (LOCK_TIMEOUT) and is retried when it times out, so
a long transaction holding the table never queues every producer behind the migration.
Such a file must be idempotent (it is re-run from the top after a failure; its version
is recorded after its last statement; brooq.migration_files splits it at each ``;`` ending
a line outside quotes, so a ``$$`` body stays whole) and, before it runs and after any
failure, the invalid indexes it names (left by a failed concurrent build, and skipped
silently by ``CREATE INDEX CONCURRENTLY IF NOT EXISTS``) are dropped.

Owns: applying and reverting the files brooq.migration_files reads (the no-transaction
run included), the version bookkeeping (its statements are those of brooq/sql/migrate.sql),
``script`` (the files as one SQL text, for `brooq migrate sql`) and ``verify``, the check
the master and the CLI make that the schema on the search_path (QUEUE_SCHEMA's when set:
the files then run with it alone on the search_path, and it is created first) is brooq's
and up to date.
Must never: run at start-up on its own (migrating is a deployment step), compose SQL with
string formatting, or run SQL other than brooq/sql's and the migration files' own text.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, NamedTuple

import psycopg
from psycopg import sql
from psycopg.rows import class_row, scalar_row

from brooq.errors import MigrationError, SchemaMissing
from brooq.migration_files import Migration, load, migrations_dir, statements
from brooq.sql import Q, Queries, queries, validate_schema

if TYPE_CHECKING:
    from typing_extensions import LiteralString

# "brooq" as a number: the key of the session advisory lock held while migrating.
LOCK_KEY = 0x62726F6F71
# The version table, as brooq/sql/migrate.sql's statements spell it.
VERSION_TABLE = "brooq_migration"
# A no-transaction statement waits at most this long for a lock (well under a second, so
# producers queued behind it wait no longer), then is tried again after a pause.
LOCK_TIMEOUT = "500ms"
LOCK_RETRIES = 10
LOCK_RETRY_PAUSE = 1.0  # seconds, times the attempt number
LOCK_POLL = 0.2  # seconds between two tries of the migrator's advisory lock

log = logging.getLogger("brooq.migrate")


@dataclass(frozen=True)
class Status:
    version: int
    name: str
    applied_at: datetime | None


Conn = psycopg.Connection[Any]


class _Applied(NamedTuple):
    """A row of migration_versions."""

    version: int
    applied_at: datetime


class _SchemaCheck(NamedTuple):
    """The row of schema_check."""

    job_schema: str | None
    job_columns: list[str]
    has_versions: bool
    search_path: str


def _table_exists(conn: Conn, q: Queries = Q) -> bool:
    return bool(conn.cursor(row_factory=scalar_row).execute(q.migration_table_exists).fetchone())


def _versions(conn: Conn, q: Queries = Q) -> dict[int, datetime]:
    """Applied version -> when; the version table must exist."""
    rows = conn.cursor(row_factory=class_row(_Applied)).execute(q.migration_versions)
    return {row.version: row.applied_at for row in rows}


def _applied(conn: Conn, q: Queries = Q) -> dict[int, datetime]:
    return _versions(conn, q) if _table_exists(conn, q) else {}


def _use_schema(schema: str) -> sql.Composed:
    """migration_use_schema for ``schema``: the migration files' bare names land there."""
    return sql.SQL(Q.migration_use_schema).format(
        sql.Literal(sql.Identifier(schema).as_string(None))
    )


@contextmanager
def _locked(dsn: str, schema: str | None = None, *, create: bool = False) -> Iterator[Conn]:
    """The migrator's connection, under its advisory lock. With ``schema``, its
    search_path is that schema alone (created first when ``create``), so the migration
    files' bare names are brooq's relations there."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        lock = conn.cursor(row_factory=scalar_row)
        while not lock.execute(Q.migration_lock, {"key": LOCK_KEY}).fetchone():
            time.sleep(LOCK_POLL)  # another `migrate` runs: migrate.sql says why we poll
        try:
            if schema is not None:
                if create:
                    conn.execute(sql.SQL(Q.migration_create_schema).format(sql.Identifier(schema)))
                conn.execute(_use_schema(schema))
            yield conn
        finally:
            conn.execute(Q.migration_unlock, {"key": LOCK_KEY})


def _run(conn: Conn, script: str) -> None:
    # sql-outside: a migration file's own text, trusted SQL shipped with brooq and run as
    # one script; it cannot live in brooq/sql, being the schema itself (migrations/).
    statement: LiteralString = script
    conn.execute(statement)


def _drop_invalid_indexes(conn: Conn, m: Migration) -> list[str]:
    """Drop the invalid indexes among those ``m`` names (a failed concurrent build leaves
    one behind, and ``IF NOT EXISTS`` would then skip building it); returns their names.
    Only the file's own names: another invalid index may be a build running right now."""
    rows = conn.execute(Q.migration_invalid_indexes, {"names": m.indexes()}).fetchall()
    for schema, name in rows:
        log.warning("dropping the invalid index %s.%s left by a failed build", schema, name)
        conn.execute(sql.SQL(Q.migration_drop_index).format(sql.Identifier(schema, name)))
    return [f"{schema}.{name}" for schema, name in rows]


def _run_statement(conn: Conn, m: Migration, statement: str) -> None:
    """One statement of a no-transaction file, retried when it waits too long for a lock."""
    for attempt in range(1, LOCK_RETRIES + 1):
        try:
            _run(conn, statement)
            return
        except psycopg.errors.LockNotAvailable:
            try:
                dropped = _drop_invalid_indexes(conn, m)
            except psycopg.errors.LockNotAvailable:
                # A DROP INDEX CONCURRENTLY that timed out leaves its index invalid, and
                # dropping that one waits for the same holder: the retry drops it.
                dropped = []
            holders = conn.execute(Q.migration_lock_holders, {"waited": LOCK_TIMEOUT}).fetchall()
            if attempt == LOCK_RETRIES:
                raise MigrationError(
                    f"{m.version:04d}_{m.name}: gave up after {attempt} waits of "
                    f"{LOCK_TIMEOUT} for a lock on job; held by "
                    + (", ".join(f"pid {pid} ({what})" for pid, what in holders) or "nobody now")
                    + (f"; dropped the invalid index {', '.join(dropped)}" if dropped else "")
                    + "; run `brooq migrate up` again when they are done"
                ) from None
            pause = LOCK_RETRY_PAUSE * attempt
            log.warning(
                "%04d_%s: a statement waited %s for a lock (held by %s); retrying in %.0f s",
                m.version,
                m.name,
                LOCK_TIMEOUT,
                ", ".join(f"pid {pid}" for pid, _ in holders) or "nobody now",
                pause,
            )
            time.sleep(pause)
        except psycopg.Error:
            _drop_invalid_indexes(conn, m)
            raise


def _apply(conn: Conn, m: Migration, body: str) -> None:
    """Run ``body`` (m's up or down part) the way its file asks."""
    if m.transactional:
        _run(conn, body)
        return
    _drop_invalid_indexes(conn, m)
    conn.execute(Q.migration_set_lock_timeout, {"timeout": LOCK_TIMEOUT})
    try:
        for statement in statements(body):
            _run_statement(conn, m, statement)
    finally:
        conn.execute(Q.migration_reset_lock_timeout)


def up(dsn: str, target: int | None = None, *, schema: str | None = None) -> list[Migration]:
    """Apply every migration not yet applied (up to ``target``); returns what was applied.
    ``schema`` (QUEUE_SCHEMA): everything goes into that schema, created if missing."""
    migrations = load()
    applied_now: list[Migration] = []
    q = queries(schema)
    with _locked(dsn, schema, create=True) as conn:
        done = _applied(conn, q)
        for m in migrations:
            if m.version in done or (target is not None and m.version > target):
                continue
            if m.transactional:
                with conn.transaction():
                    conn.execute(q.migration_create_table)
                    _apply(conn, m, m.up)
                    conn.execute(q.migration_insert, {"version": m.version, "name": m.name})
            else:  # recorded after its last statement: a failure leaves it to re-run
                _apply(conn, m, m.up)
                with conn.transaction():
                    conn.execute(q.migration_create_table)
                    conn.execute(q.migration_insert, {"version": m.version, "name": m.name})
            applied_now.append(m)
    return applied_now


def down(dsn: str, steps: int = 1, *, schema: str | None = None) -> list[Migration]:
    """Undo the last ``steps`` applied migrations. Undoing the first one also drops the
    version table, so nothing of brooq's is left (a schema made by ``up`` stays: it may
    hold more than brooq's)."""
    by_version = {m.version: m for m in load()}
    undone: list[Migration] = []
    q = queries(schema)
    with _locked(dsn, schema) as conn:
        applied = sorted(_applied(conn, q), reverse=True)
        for version in applied[:steps]:
            m = by_version.get(version)
            if m is None:
                raise MigrationError(
                    f"version {version} is applied but has no file in {migrations_dir()}"
                )
            if m.transactional:
                with conn.transaction():
                    _apply(conn, m, m.down)
                    _forget(conn, version, q)
            else:  # forgotten after its last statement, as up records it
                _apply(conn, m, m.down)
                with conn.transaction():
                    _forget(conn, version, q)
            undone.append(m)
    return undone


def _forget(conn: Conn, version: int, q: Queries = Q) -> None:
    conn.execute(q.migration_delete, {"version": version})
    left = conn.cursor(row_factory=scalar_row).execute(q.migration_count)
    if left.fetchone() == 0:
        conn.execute(q.migration_drop_table)


def status(dsn: str, *, schema: str | None = None) -> list[Status]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        done = _applied(conn, queries(schema))
    return [Status(m.version, m.name, done.get(m.version)) for m in load()]


# The columns brooq's statements use: a table named job without them is someone else's
# (an application's own job table found first on the search_path).
JOB_COLUMNS = (
    "id",
    "topic",
    "payload",
    "state",
    "attempts",
    "available_at",
    "locked_by",
    "locked_until",
    "last_error",
    "idempotency_key",
    "created_at",
    "updated_at",
    "lease_expiries",  # 0002: the reaper counts expiries (a `migrate sql` schema too)
    "queue",  # 0003
    "priority",  # 0003
    "result",  # 0006
    "errors",  # 0006
    "waited",  # 0006
    "unique_key",  # 0011
    "start_after",  # 0011
    "tags",  # 0011
    "group_key",  # 0012
    "upstream_open",  # 0013
    "upstream_failed",  # 0013
    "on_upstream_failure",  # 0013
    "has_downstream",  # 0013
)


def verify(conn: Conn, schema: str | None = None) -> str:
    """Raise SchemaMissing unless the ``job`` table the connection's search_path finds
    (with ``schema``, QUEUE_SCHEMA: the one in that schema) is brooq's and, when the
    bookkeeping of ``brooq migrate`` is there, every migration this brooq ships is
    applied. A schema applied with one's own tool (``brooq migrate sql``) has no
    bookkeeping; its table is then checked alone. Returns the schema the table is in."""
    q = queries(schema)
    found = conn.cursor(row_factory=class_row(_SchemaCheck)).execute(q.schema_check).fetchone()
    assert found is not None  # one row, whatever exists
    search_path = found.search_path
    where = f"schema {schema} (QUEUE_SCHEMA)" if schema else f"the search_path {search_path}"
    if found.job_schema is None:
        raise SchemaMissing(
            f"the brooq schema is not installed (no table job in {where}): run "
            "`brooq migrate up` first" + (f" with QUEUE_SCHEMA={schema}" if schema else "")
        )
    schema = found.job_schema
    if found.has_versions:  # first: an older brooq schema lacks the newer columns too
        applied = set(_versions(conn, q))
        expected = [m.version for m in load()]
        missing = [v for v in expected if v not in applied]
        if missing:
            at = max(applied, default=0)
            raise SchemaMissing(
                f"the brooq schema in {schema} is at version {at} but this brooq needs "
                f"version {expected[-1]} (missing: {', '.join(map(str, missing))}): run "
                "`brooq migrate up`"
            )
    lacking = [c for c in JOB_COLUMNS if c not in found.job_columns]
    if lacking:
        raise SchemaMissing(
            f"the table {schema}.job is not brooq's (it lacks the columns "
            f"{', '.join(lacking)}; {where}): run `brooq migrate up` against the schema "
            "brooq should use and give brooq that schema (QUEUE_SCHEMA, or a search_path "
            "in the DSN's options)"
        )
    return schema


def _chosen(direction: str, first: int, last: int | None) -> list[Migration]:
    if direction not in ("up", "down"):
        raise MigrationError(f"direction must be 'up' or 'down', not {direction!r}")
    every = load()
    newest = every[-1].version if every else 0
    if not 1 <= first <= (last if last is not None else newest) <= newest:
        raise MigrationError(
            f"no brooq migrations {first} to {last}: this brooq ships 1 to {newest}"
        )
    chosen = [m for m in every if first <= m.version <= (last or newest)]
    return chosen if direction == "up" else chosen[::-1]


def _schema_parts(schema: str, direction: str) -> tuple[list[str], list[str]]:
    """What runs before and after the migrations' SQL for ``schema``: create it (up),
    put it alone on the search_path, and give the session its former path back."""
    validate_schema(schema)
    before = [_use_schema(schema).as_string(None)]
    if direction == "up":
        create = sql.SQL(Q.migration_create_schema).format(sql.Identifier(schema))
        before.insert(0, create.as_string(None))
    return before, [Q.migration_restore_search_path]


def script(
    direction: str = "up",
    *,
    first: int = 1,
    last: int | None = None,
    schema: str | None = None,
) -> str:
    """The SQL of every migration (of versions ``first`` to ``last``, both included; ``last``
    None: the newest), for teams that apply schema with their own tool. A migration to
    run outside a transaction says so in its heading comment. ``schema`` (QUEUE_SCHEMA):
    the script first creates it (up) and makes it the session's search_path."""
    parts: list[str] = []
    before, after = _schema_parts(schema, direction) if schema else ([], [])
    if before:
        parts.append(f"-- brooq's schema: {schema}\n" + "".join(s + ";\n" for s in before))
    for m in _chosen(direction, first, last):
        body = m.up if direction == "up" else m.down
        how = "" if m.transactional else "; run outside a transaction, statement by statement"
        parts.append(f"-- brooq migration {m.version:04d}_{m.name} ({direction}{how})\n{body}\n")
    parts.extend(s + ";\n" for s in after)
    return "\n".join(parts)


def script_parts(
    direction: str = "up",
    *,
    first: int = 1,
    last: int | None = None,
    schema: str | None = None,
) -> list[str]:
    """``script``'s SQL as pieces to run one after another on an autocommit connection, as
    ``migrations.RunSQL(sql=[...])`` in a Django migration with ``atomic = False`` does: a
    transactional migration is one piece (PostgreSQL runs a query of many statements in
    one implicit transaction, so it applies whole or not at all), a ``no-transaction`` one
    is a piece per statement (``CREATE INDEX CONCURRENTLY`` cannot run in a transaction).
    Unlike ``up``, nothing retries a statement that waits for a lock: on a big, busy
    ``job`` table use ``brooq migrate up``. ``schema`` (QUEUE_SCHEMA): the first pieces
    create it (up) and put it alone on the session's search_path, the last one gives the
    session its former search_path back (a failure in between leaves the schema on it:
    the connection is then best closed)."""
    before, after = _schema_parts(schema, direction) if schema else ([], [])
    parts: list[str] = list(before)
    for m in _chosen(direction, first, last):
        body = m.up if direction == "up" else m.down
        heading = f"-- brooq migration {m.version:04d}_{m.name} ({direction})"
        if m.transactional:
            parts.append(f"{heading}\n{body}\n")
        else:
            parts.extend(f"{heading}\n{statement}\n" for statement in statements(body))
    return parts + after
