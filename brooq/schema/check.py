"""What brooq_migration records, and whether the schema is what it records.

A version's row says 'applied', or, for a no-transaction file whose statements stopped
part-way, 'applying' (its up part) or 'reverting' (its down part): brooq.migrate writes
that state in the transaction of the first statement that changes the schema, so a
row never says more than what is there. A version recorded as applied whose objects
are not all there (what brooq.schema.files.leaves reads in the up parts: a revert
interrupted by an older brooq, a change made by hand) is damaged; ``up`` refuses both
with the command that mends them.

Owns: ``records`` (the rows, with their states, an older brooq's table read too),
``damaged`` (the missing objects of each version recorded as applied), ``trouble``
(the sentence, with its advice, for a version stopped part-way or damaged), ``verify``
(the master's and the CLI's check that the schema is brooq's and up to date) and
``JOB_COLUMNS``.
Must never: change the schema or the records (brooq.migrate does), or compose SQL with
string formatting.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, NamedTuple

import psycopg
from psycopg.rows import class_row, scalar_row

from brooq.errors import SchemaMissing
from brooq.schema.files import Migration, leaves, load
from brooq.sql import Q, Queries, queries

APPLIED, APPLYING, REVERTING = "applied", "applying", "reverting"

Conn = psycopg.Connection[Any]


class Record(NamedTuple):
    """A row of migration_versions."""

    version: int
    applied_at: datetime
    state: str


class _SchemaCheck(NamedTuple):
    """The row of schema_check."""

    job_schema: str | None
    job_columns: list[str]
    has_versions: bool
    search_path: str


def table_exists(conn: Conn, q: Queries = Q) -> bool:
    return bool(conn.cursor(row_factory=scalar_row).execute(q.migration_table_exists).fetchone())


def records(conn: Conn, q: Queries = Q) -> dict[int, Record]:
    """Version -> its row; empty when there is no version table."""
    if not table_exists(conn, q):
        return {}
    rows = conn.cursor(row_factory=class_row(Record)).execute(q.migration_versions)
    return {row.version: row for row in rows}


def damaged(
    conn: Conn, migrations: list[Migration], recs: dict[int, Record]
) -> dict[int, list[str]]:
    """For each version recorded as applied, the objects its up part leaves that the
    schema the connection creates in (its current_schema) lacks; only versions with some."""
    recorded = [m for m in migrations if m.version in recs]
    expected = leaves(recorded)
    found: dict[int, list[str]] = {}
    for m in recorded:
        if recs[m.version].state != APPLIED or not expected[m.version]:
            continue
        rows = conn.cursor(row_factory=scalar_row).execute(
            Q.migration_missing, {"objects": expected[m.version]}
        )
        if missing := [str(what) for what in rows]:
            found[m.version] = missing
    return found


def trouble(m: Migration, state: str, missing: list[str] | None = None) -> str:
    """What is wrong with ``m`` in the schema, and the command that mends it."""
    label = f"{m.version:04d}_{m.name}"
    again = (
        f"`brooq migrate up --repair` runs its up part again (each statement of it is "
        f"idempotent); `brooq migrate down --to {m.version - 1}` reverts it and what follows"
        if not m.transactional
        else "it is applied in one transaction, so this was done outside `brooq migrate`: "
        "restore what is missing (`brooq migrate sql` prints its SQL)"
    )
    if state == REVERTING:
        return (
            f"{label} is partly reverted (a `brooq migrate down` stopped part-way): run "
            f"`brooq migrate down --to {m.version - 1}` to finish reverting it, or "
            "`brooq migrate up --repair` to apply it again"
        )
    if state == APPLYING:
        return (
            f"{label} is partly applied (a `brooq migrate up` stopped part-way): run "
            f"`brooq migrate up` to finish it, or `brooq migrate down --to {m.version - 1}` "
            "to revert what it did"
        )
    return (
        f"{label} is recorded as applied but is damaged, it lacks "
        f"{', '.join(missing or [])}: {again}"
    )


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
    "started_at",  # 0019
    "ordering_key",  # 0026
)


def verify(conn: Conn, schema: str | None = None) -> str:
    """Raise SchemaMissing unless the ``job`` table the connection's search_path finds
    (with ``schema``, QUEUE_SCHEMA: the one in that schema) is brooq's and, when the
    bookkeeping of ``brooq migrate`` is there, every migration this brooq ships is
    applied, none of them part-way. A schema applied with one's own tool (``brooq
    migrate sql``) has no bookkeeping; its table is then checked alone. Returns the
    schema the table is in."""
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
        recs = records(conn, q)
        every = load()
        halfway = [m for m in every if m.version in recs and recs[m.version].state != APPLIED]
        if halfway:
            m = halfway[0]
            raise SchemaMissing(
                f"the brooq schema in {schema}: {trouble(m, recs[m.version].state)}"
            )
        expected = [m.version for m in every]
        missing = [v for v in expected if v not in recs]
        if missing:
            at = max(recs, default=0)
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
