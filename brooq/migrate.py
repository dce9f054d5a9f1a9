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
Such a file must be idempotent, its up part and its down part (either is re-run from the
top after a failure; brooq.schema.files splits it at each ``;`` ending a line outside
quotes, so a ``$$`` body stays whole) and, before it runs and after any failure, the
invalid indexes it names (left by a failed concurrent build, and skipped silently by
``CREATE INDEX CONCURRENTLY IF NOT EXISTS``) are dropped.

The record never says more than what is there. A transactional file runs with its
record in one transaction. In a no-transaction file, each statement that can run in a
transaction does, with the record: the first to change the schema records the version
as 'applying' (up) or 'reverting' (down), the last as 'applied' (or forgets it); a
``CONCURRENTLY`` statement runs alone, and the record follows it (after a failure, only
when it left its index changed). A statement that fails changes nothing of the record,
so a step that stops part-way is recorded as such, and one that stops at its first
statement is recorded as it was: the error says which. A down part that must see every
row (a guard) or must go whole puts its statements in one ``DO`` block that first takes
the lock that waits for writers in flight (0013's).

Owns: applying and reverting the files brooq.schema.files reads (the no-transaction
run included), writing the version records (brooq.schema.check reads them, checks the
schema against them and holds ``verify``, re-exported here, as ``script`` and
``script_parts`` of brooq.schema.script are), ``status`` and ``repair``. With
QUEUE_SCHEMA the files run with that schema alone on the search_path (created first).
Must never: run at start-up on its own (migrating is a deployment step), compose SQL with
string formatting, or run SQL other than brooq/sql's and the migration files' own text.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from functools import partial
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg import sql
from psycopg.rows import scalar_row

from brooq.dsn import without_driver
from brooq.errors import MigrationError
from brooq.schema.check import (
    APPLIED,
    APPLYING,
    JOB_COLUMNS,
    REVERTING,
    damaged,
    records,
    trouble,
    verify,
)
from brooq.schema.files import Migration, load, migrations_dir, needs_autocommit, statements
from brooq.schema.script import script, script_parts
from brooq.schema.script import use_schema as _use_schema
from brooq.sql import Q, Queries, queries

if TYPE_CHECKING:
    from typing_extensions import LiteralString

__all__ = [
    "JOB_COLUMNS",
    "MigrationError",
    "Status",
    "down",
    "load",
    "repair",
    "script",
    "script_parts",
    "status",
    "up",
    "verify",
]

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
    applied_at: datetime | None  # None unless applied whole (state "applied")
    # "applied", "pending", "applying" or "reverting" (stopped part-way), "damaged"
    # (recorded as applied, ``missing`` lacking: brooq.schema.check.damaged).
    state: str = "pending"
    missing: tuple[str, ...] = ()
    advice: str = ""  # for a version not "applied" nor "pending": what is wrong, what to run


Conn = psycopg.Connection[Any]


@contextmanager
def _locked(dsn: str, schema: str | None = None, *, create: bool = False) -> Iterator[Conn]:
    """The migrator's connection, under its advisory lock. With ``schema``, its
    search_path is that schema alone (created first when ``create``), so the migration
    files' bare names are brooq's relations there."""
    with psycopg.connect(without_driver(dsn), autocommit=True) as conn:
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
    Only the file's own names: another invalid index may be a build running right now.
    A drop that waits too long for its lock is left to the next run."""
    rows = conn.execute(Q.migration_invalid_indexes, {"names": m.indexes()}).fetchall()
    dropped: list[str] = []
    for schema, name in rows:
        log.warning("dropping the invalid index %s.%s left by a failed build", schema, name)
        try:
            conn.execute(sql.SQL(Q.migration_drop_index).format(sql.Identifier(schema, name)))
        except psycopg.errors.LockNotAvailable:
            # A DROP INDEX CONCURRENTLY that timed out leaves its index invalid, and
            # dropping that one waits for the same holder: the next run drops it.
            continue
        dropped.append(f"{schema}.{name}")
    return dropped


def _run_statement(
    conn: Conn, m: Migration, statement: str, record: Callable[[], None] | None
) -> None:
    """One statement of a no-transaction file, retried when it waits too long for a lock;
    with ``record``, in one transaction with it."""
    for attempt in range(1, LOCK_RETRIES + 1):
        try:
            if record is None:
                _run(conn, statement)
            else:
                with conn.transaction():
                    _run(conn, statement)
                    record()
            return
        except psycopg.errors.LockNotAvailable:
            dropped = _drop_invalid_indexes(conn, m)
            holders = conn.execute(Q.migration_lock_holders, {"waited": LOCK_TIMEOUT}).fetchall()
            if attempt == LOCK_RETRIES:
                raise MigrationError(
                    f"gave up after {attempt} waits of {LOCK_TIMEOUT} for a lock on job; "
                    "held by "
                    + (", ".join(f"pid {pid} ({what})" for pid, what in holders) or "nobody now")
                    + (f"; dropped the invalid index {', '.join(dropped)}" if dropped else "")
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


def _index_states(conn: Conn, statement: str) -> list[tuple[str, bool | None]]:
    names = Migration(0, "", statement, "").indexes()
    return conn.execute(Q.migration_index_states, {"names": names}).fetchall()


def _step(conn: Conn, m: Migration, direction: str, q: Queries) -> None:
    """Run m's up or down part and record it, so that the record never says more than
    what is there (the module's docstring says how); a failure raises MigrationError
    saying what is recorded and what to run."""
    between = APPLYING if direction == "up" else REVERTING

    def record(state: str | None) -> None:
        if state is None:
            _forget(conn, m.version, q)
        else:
            conn.execute(q.migration_record, {"version": m.version, "name": m.name, "state": state})

    done = APPLIED if direction == "up" else None
    marked = False  # whether the record says ``between`` (or done) by now
    try:
        if m.transactional:
            with conn.transaction():
                _run(conn, m.up if direction == "up" else m.down)
                record(done)
            return
        pieces = statements(m.up if direction == "up" else m.down)
        _drop_invalid_indexes(conn, m)
        conn.execute(Q.migration_set_lock_timeout, {"timeout": LOCK_TIMEOUT})
        try:
            for n, statement in enumerate(pieces, 1):
                last = n == len(pieces)
                if needs_autocommit(statement):
                    before = _index_states(conn, statement)
                    try:
                        _run_statement(conn, m, statement, None)
                    except (psycopg.Error, MigrationError):
                        if not marked and _index_states(conn, statement) != before:
                            record(between)
                            marked = True
                        raise
                    if last or not marked:
                        record(done if last else between)
                else:
                    then = partial(record, done if last else between)
                    _run_statement(conn, m, statement, then if last or not marked else None)
                marked = True
            if not pieces:
                record(done)
        finally:
            conn.execute(Q.migration_reset_lock_timeout)
    except (psycopg.Error, MigrationError) as exc:
        raise MigrationError(_stopped(m, direction, marked, exc)) from exc


def _stopped(m: Migration, direction: str, marked: bool, exc: Exception) -> str:
    label = f"{m.version:04d}_{m.name}"
    cause = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if marked:
        return f"{cause}; " + trouble(m, APPLYING if direction == "up" else REVERTING)
    if direction == "up":
        return (
            f"{label}: {cause}; nothing was applied, it is still pending: run "
            "`brooq migrate up` again once that is resolved"
        )
    return (
        f"{label}: {cause}; nothing was reverted, it is still applied: run "
        "`brooq migrate down` again once that is resolved"
    )


def _prepare(conn: Conn, q: Queries) -> None:
    """The version table as this brooq writes it (created, or given its state column)."""
    with conn.transaction():
        conn.execute(q.migration_create_table)
        conn.execute(q.migration_add_state)


def _troubles(conn: Conn, migrations: list[Migration], q: Queries) -> list[tuple[Migration, str]]:
    """The versions stopped part-way while reverting, and those damaged, with what to say."""
    recs = records(conn, q)
    broken = damaged(conn, migrations, recs)
    found: list[tuple[Migration, str]] = []
    for m in migrations:
        if m.version in broken:
            found.append((m, trouble(m, "damaged", broken[m.version])))
        elif m.version in recs and recs[m.version].state == REVERTING:
            found.append((m, trouble(m, REVERTING)))
    return found


def up(dsn: str, target: int | None = None, *, schema: str | None = None) -> list[Migration]:
    """Apply every migration not yet applied (up to ``target``; one stopped part-way
    while applying is finished); returns what was applied. Refuses (MigrationError) while
    a version is partly reverted or damaged: ``repair`` mends those. ``schema``
    (QUEUE_SCHEMA): everything goes into that schema, created if missing."""
    migrations = load()
    applied_now: list[Migration] = []
    q = queries(schema)
    with _locked(dsn, schema, create=True) as conn:
        _prepare(conn, q)
        if found := _troubles(conn, migrations, q):
            raise MigrationError("; ".join(text for _, text in found))
        recs = records(conn, q)
        for m in migrations:
            if target is not None and m.version > target:
                continue
            if m.version in recs and recs[m.version].state == APPLIED:
                continue
            _step(conn, m, "up", q)
            applied_now.append(m)
    return applied_now


def repair(dsn: str, *, schema: str | None = None) -> list[Migration]:
    """Run the up part again of every no-transaction migration partly reverted or
    damaged (each is idempotent); returns them. A damaged transactional one is refused:
    only a change made outside ``brooq migrate`` can have damaged it."""
    migrations = load()
    repaired: list[Migration] = []
    q = queries(schema)
    with _locked(dsn, schema, create=True) as conn:
        _prepare(conn, q)
        found = _troubles(conn, migrations, q)
        if refused := [text for m, text in found if m.transactional]:
            raise MigrationError("; ".join(refused))
        for m, _ in found:
            _step(conn, m, "up", q)
            repaired.append(m)
    return repaired


def down(
    dsn: str, steps: int = 1, *, schema: str | None = None, to: int | None = None
) -> list[Migration]:
    """Undo the last ``steps`` recorded migrations (with ``to``: every one above version
    ``to``), one stopped part-way included. Undoing the first one also drops the version
    table, so nothing of brooq's is left (a schema made by ``up`` stays: it may hold more
    than brooq's)."""
    by_version = {m.version: m for m in load()}
    undone: list[Migration] = []
    q = queries(schema)
    with _locked(dsn, schema) as conn:
        recs = records(conn, q)
        if recs:
            _prepare(conn, q)
        versions = sorted(recs, reverse=True)
        for version in versions[:steps] if to is None else [v for v in versions if v > to]:
            m = by_version.get(version)
            if m is None:
                raise MigrationError(
                    f"version {version} is applied but has no file in {migrations_dir()}"
                )
            _step(conn, m, "down", q)
            undone.append(m)
    return undone


def _forget(conn: Conn, version: int, q: Queries = Q) -> None:
    conn.execute(q.migration_delete, {"version": version})
    left = conn.cursor(row_factory=scalar_row).execute(q.migration_count)
    if left.fetchone() == 0:
        conn.execute(q.migration_drop_table)


def status(dsn: str, *, schema: str | None = None) -> list[Status]:
    """Each migration this brooq ships: applied (and checked against the schema),
    pending, or stopped part-way, with what to run."""
    q = queries(schema)
    migrations = load()
    with psycopg.connect(without_driver(dsn), autocommit=True) as conn:
        if schema is not None:
            conn.execute(_use_schema(schema))
        recs = records(conn, q)
        broken = damaged(conn, migrations, recs)
    found: list[Status] = []
    for m in migrations:
        rec = recs.get(m.version)
        if rec is None:
            found.append(Status(m.version, m.name, None))
        elif m.version in broken:
            missing = broken[m.version]
            text = trouble(m, "damaged", missing)
            found.append(Status(m.version, m.name, rec.applied_at, "damaged", tuple(missing), text))
        elif rec.state == APPLIED:
            found.append(Status(m.version, m.name, rec.applied_at, APPLIED))
        else:
            found.append(Status(m.version, m.name, None, rec.state, (), trouble(m, rec.state)))
    return found
