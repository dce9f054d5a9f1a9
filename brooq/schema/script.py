"""`brooq migrate sql` and the Django twin: the migration files' SQL as one text
(``script``) or as pieces to run one after another on an autocommit connection
(``script_parts``), for teams that apply schema with their own tool.

Owns: the text of the migrations for another tool, the schema's own statements around
it (``use_schema``: QUEUE_SCHEMA alone on the search_path).
Must never: touch a database, or compose SQL with string formatting.
"""

from __future__ import annotations

from psycopg import sql

from brooq.errors import MigrationError
from brooq.schema.files import Migration, load, statements
from brooq.sql import Q, validate_schema


def use_schema(schema: str) -> sql.Composed:
    """migration_use_schema for ``schema``: the migration files' bare names land there."""
    return sql.SQL(Q.migration_use_schema).format(
        sql.Literal(sql.Identifier(schema).as_string(None))
    )


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
    before = [use_schema(schema).as_string(None)]
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
