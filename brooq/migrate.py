"""Apply the SQL files of migrations/ in order, each in its own transaction, under an
advisory lock so that two deploy steps cannot race. Versions live in brooq_migration.

The files are the only schema truth. Each has an up part and a down part:

    -- migrate:up
    CREATE TABLE ...;
    -- migrate:down
    DROP TABLE ...;

Owns: reading and checking the migration files, the version bookkeeping (its statements
are the migration_* ones of brooq/sql/queries.sql), and ``verify``, the check the master
and the CLI make that the schema on the search_path is brooq's and up to date.
Must never: run at start-up on its own (migrating is a deployment step), compose SQL with
string formatting, or run SQL other than queries.sql's and the migration files' own text.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import psycopg
from psycopg.rows import class_row, scalar_row

from brooq.errors import MigrationError, SchemaMissing
from brooq.sql import Q

if TYPE_CHECKING:
    from typing_extensions import LiteralString

# "brooq" as a number: the key of the session advisory lock held while migrating.
LOCK_KEY = 0x62726F6F71
# The version table, as queries.sql's migration_* statements and schema_check spell it.
VERSION_TABLE = "brooq_migration"
_FILE = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")
_UP = "-- migrate:up"
_DOWN = "-- migrate:down"


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    up: str
    down: str


@dataclass(frozen=True)
class Status:
    version: int
    name: str
    applied_at: datetime | None


def migrations_dir() -> Path:
    """migrations/ inside the installed package, or at the root of a source checkout."""
    here = Path(__file__).resolve().parent
    for candidate in (here / "migrations", here.parent / "migrations"):
        if candidate.is_dir() and any(candidate.glob("*.sql")):
            return candidate
    raise MigrationError(f"no migrations directory found next to {here}")


def load(directory: Path | None = None) -> list[Migration]:
    directory = directory or migrations_dir()
    found: list[Migration] = []
    for path in sorted(directory.glob("*.sql")):
        match = _FILE.match(path.name)
        if not match:
            raise MigrationError(f"{path.name}: expected NNNN_name.sql")
        text = path.read_text(encoding="utf-8")
        if text.count(_UP) != 1 or text.count(_DOWN) != 1 or text.index(_UP) > text.index(_DOWN):
            raise MigrationError(f"{path.name}: needs one '{_UP}' then one '{_DOWN}' section")
        up = text[text.index(_UP) + len(_UP) : text.index(_DOWN)].strip()
        down = text[text.index(_DOWN) + len(_DOWN) :].strip()
        if not up or not down:
            raise MigrationError(f"{path.name}: the up and the down part must not be empty")
        found.append(Migration(int(match.group(1)), match.group(2), up, down))
    versions = [m.version for m in found]
    if versions != list(range(1, len(found) + 1)):
        raise MigrationError(f"migration versions must run 1, 2, 3, ... without gaps: {versions}")
    return found


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


def _table_exists(conn: Conn) -> bool:
    return bool(conn.cursor(row_factory=scalar_row).execute(Q.migration_table_exists).fetchone())


def _versions(conn: Conn) -> dict[int, datetime]:
    """Applied version -> when; the version table must exist."""
    rows = conn.cursor(row_factory=class_row(_Applied)).execute(Q.migration_versions)
    return {row.version: row.applied_at for row in rows}


def _applied(conn: Conn) -> dict[int, datetime]:
    return _versions(conn) if _table_exists(conn) else {}


@contextmanager
def _locked(dsn: str) -> Iterator[Conn]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(Q.migration_lock, {"key": LOCK_KEY})
        try:
            yield conn
        finally:
            conn.execute(Q.migration_unlock, {"key": LOCK_KEY})


def _run(conn: Conn, script: str) -> None:
    # sql-outside: a migration file's own text, trusted SQL shipped with brooq and run as
    # one script; it cannot live in queries.sql, being the schema itself (migrations/).
    statement: LiteralString = script
    conn.execute(statement)


def up(dsn: str, target: int | None = None) -> list[Migration]:
    """Apply every migration not yet applied (up to ``target``); returns what was applied."""
    migrations = load()
    applied_now: list[Migration] = []
    with _locked(dsn) as conn:
        done = _applied(conn)
        for m in migrations:
            if m.version in done or (target is not None and m.version > target):
                continue
            with conn.transaction():
                conn.execute(Q.migration_create_table)
                _run(conn, m.up)
                conn.execute(Q.migration_insert, {"version": m.version, "name": m.name})
            applied_now.append(m)
    return applied_now


def down(dsn: str, steps: int = 1) -> list[Migration]:
    """Undo the last ``steps`` applied migrations. Undoing the first one also drops the
    version table, so nothing of brooq's is left."""
    by_version = {m.version: m for m in load()}
    undone: list[Migration] = []
    with _locked(dsn) as conn:
        applied = sorted(_applied(conn), reverse=True)
        for version in applied[:steps]:
            m = by_version.get(version)
            if m is None:
                raise MigrationError(
                    f"version {version} is applied but has no file in {migrations_dir()}"
                )
            with conn.transaction():
                _run(conn, m.down)
                conn.execute(Q.migration_delete, {"version": version})
                left = conn.cursor(row_factory=scalar_row).execute(Q.migration_count)
                if left.fetchone() == 0:
                    conn.execute(Q.migration_drop_table)
            undone.append(m)
    return undone


def status(dsn: str) -> list[Status]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        done = _applied(conn)
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
)


def verify(conn: Conn) -> None:
    """Raise SchemaMissing unless the ``job`` table the connection's search_path finds is
    brooq's and, when the bookkeeping of ``brooq migrate`` is there, every migration this
    brooq ships is applied. A schema applied with one's own tool (``brooq migrate sql``)
    has no bookkeeping; its table is then checked alone."""
    found = conn.cursor(row_factory=class_row(_SchemaCheck)).execute(Q.schema_check).fetchone()
    assert found is not None  # one row, whatever exists
    schema, search_path = found.job_schema, found.search_path
    if schema is None:
        raise SchemaMissing(
            f"the brooq schema is not installed (no table job on the search_path "
            f"{search_path}): run `brooq migrate up` first"
        )
    if found.has_versions:  # first: an older brooq schema lacks the newer columns too
        applied = set(_versions(conn))
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
            f"{', '.join(lacking)}; search_path {search_path}): run `brooq migrate up` "
            "against the schema brooq should use and give brooq that search_path "
            "(options in the DSN)"
        )


def script(direction: str = "up") -> str:
    """The SQL of every migration, for teams that apply schema with their own tool."""
    parts: list[str] = []
    for m in load() if direction == "up" else reversed(load()):
        body = m.up if direction == "up" else m.down
        parts.append(f"-- brooq migration {m.version:04d}_{m.name} ({direction})\n{body}\n")
    return "\n".join(parts)
