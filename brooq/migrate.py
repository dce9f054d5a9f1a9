"""Apply the SQL files of migrations/ in order, each in its own transaction, under an
advisory lock so that two deploy steps cannot race. Versions live in brooq_migration.

The files are the only schema truth. Each has an up part and a down part:

    -- migrate:up
    CREATE TABLE ...;
    -- migrate:down
    DROP TABLE ...;
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, cast

import psycopg
from psycopg import sql

from brooq.errors import MigrationError, SchemaMissing
from brooq.sql import Q

if TYPE_CHECKING:
    from typing_extensions import LiteralString

# "brooq" as a number: the key of the session advisory lock held while migrating.
LOCK_KEY = 0x62726F6F71
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


_CREATE_VERSION_TABLE = sql.SQL(
    "CREATE TABLE IF NOT EXISTS {} ("
    " version integer PRIMARY KEY,"
    " name text NOT NULL,"
    " applied_at timestamptz NOT NULL DEFAULT now())"
).format(sql.Identifier(VERSION_TABLE))


def _table_exists(conn: psycopg.Connection[tuple[object, ...]]) -> bool:
    row = conn.execute("SELECT to_regclass(%s) IS NOT NULL", (VERSION_TABLE,)).fetchone()
    return bool(row and row[0])


def _applied(conn: psycopg.Connection[tuple[object, ...]]) -> dict[int, datetime]:
    if not _table_exists(conn):
        return {}
    query = sql.SQL("SELECT version, applied_at FROM {} ORDER BY version").format(
        sql.Identifier(VERSION_TABLE)
    )
    return {int(cast(int, v)): cast(datetime, at) for v, at in conn.execute(query)}


@contextmanager
def _locked(dsn: str) -> Iterator[psycopg.Connection[tuple[object, ...]]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT pg_advisory_lock(%s)", (LOCK_KEY,))
        try:
            yield conn
        finally:
            conn.execute("SELECT pg_advisory_unlock(%s)", (LOCK_KEY,))


def _run(conn: psycopg.Connection[tuple[object, ...]], script: str) -> None:
    # The migration files are trusted SQL shipped with brooq, run as one script.
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
                conn.execute(_CREATE_VERSION_TABLE)
                _run(conn, m.up)
                conn.execute(
                    sql.SQL("INSERT INTO {} (version, name) VALUES (%s, %s)").format(
                        sql.Identifier(VERSION_TABLE)
                    ),
                    (m.version, m.name),
                )
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
                conn.execute(
                    sql.SQL("DELETE FROM {} WHERE version = %s").format(
                        sql.Identifier(VERSION_TABLE)
                    ),
                    (version,),
                )
                left = conn.execute(
                    sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(VERSION_TABLE))
                ).fetchone()
                if left is not None and left[0] == 0:
                    conn.execute(sql.SQL("DROP TABLE {}").format(sql.Identifier(VERSION_TABLE)))
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
)


def verify(conn: psycopg.Connection[tuple[object, ...]]) -> None:
    """Raise SchemaMissing unless the ``job`` table the connection's search_path finds is
    brooq's and, when the bookkeeping of ``brooq migrate`` is there, every migration this
    brooq ships is applied. A schema applied with one's own tool (``brooq migrate sql``)
    has no bookkeeping; its table is then checked alone."""
    row = conn.execute(Q.schema_check).fetchone()
    assert row is not None
    schema, columns, has_versions, search_path = row
    if schema is None:
        raise SchemaMissing(
            f"the brooq schema is not installed (no table job on the search_path "
            f"{search_path}): run `brooq migrate up` first"
        )
    lacking = [c for c in JOB_COLUMNS if c not in cast("list[str]", columns)]
    if lacking:
        raise SchemaMissing(
            f"the table {schema}.job is not brooq's (it lacks the columns "
            f"{', '.join(lacking)}; search_path {search_path}): run `brooq migrate up` "
            "against the schema brooq should use and give brooq that search_path "
            "(options in the DSN)"
        )
    if not has_versions:
        return
    applied = {int(cast(int, v)) for (v,) in conn.execute(Q.migration_versions)}
    expected = [m.version for m in load()]
    missing = [v for v in expected if v not in applied]
    if missing:
        at = max(applied, default=0)
        raise SchemaMissing(
            f"the brooq schema in {schema} is at version {at} but this brooq needs version "
            f"{expected[-1]} (missing: {', '.join(map(str, missing))}): run `brooq migrate up`"
        )


def script(direction: str = "up") -> str:
    """The SQL of every migration, for teams that apply schema with their own tool."""
    parts: list[str] = []
    for m in load() if direction == "up" else reversed(load()):
        body = m.up if direction == "up" else m.down
        parts.append(f"-- brooq migration {m.version:04d}_{m.name} ({direction})\n{body}\n")
    return "\n".join(parts)
