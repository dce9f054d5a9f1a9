"""A brooq statement as a worker child's session plans it, for the EXPLAIN tools of the
tests and benchmarks (the held snapshot's plans, the claim's access path).

A child binds every statement with psycopg's named placeholders, prepared, under
``plan_cache_mode=force_generic_plan`` and without bitmap scans, sequential scans or
sorts (brooq.worker.connection says why). ``prepare`` turns a statement's placeholders
into PostgreSQL's $n, each typed as the child binds it (PARAM_TYPES), and PREPAREs it,
so that EXPLAIN EXECUTE shows the generic plan a child runs; CHILD_OPTIONS are the
child's planner settings as libpq options.

Owns the parameter types of the child's statements as the child binds them. Must never
run in a child or a master: it is a tool for looking at plans.
"""

from __future__ import annotations

import re
from typing import Any

import psycopg
from psycopg import sql

__all__ = ["CHILD_OPTIONS", "PARAM_TYPES", "numbered", "prepare"]

CHILD_OPTIONS = (
    "-c plan_cache_mode=force_generic_plan -c enable_bitmapscan=off -c enable_seqscan=off"
    " -c enable_sort=off"
)

# The claim's and the outcomes' parameters, as psycopg binds them from a child
# (brooq.worker.roundtrip, brooq.worker.outcome).
PARAM_TYPES = {
    "done": "uuid[]",
    "results": "text[]",
    "reported": "uuid[]",
    "fractions": "float8[]",
    "messages": "text[]",
    "progress": "float8",
    "progress_message": "text",
    "ids": "uuid[]",
    "id": "uuid",
    "result": "text",
    "worker": "text",
    "queue": "text",
    "topics": "text[]",
    "limit": "int8",
    "children": "int8",
    "lease": "float8",
    "queues": "text[]",
    "lows": "int2[]",
    "highs": "int2[]",
    "floors": "timestamptz[]",
    "floor_ids": "uuid[]",
    "refund": "bool",
    "max_attempts": "int4",
    "delay": "float8",
    "error": "text",
    "history_error": "text",
    "kind": "text",
    "traceback": "text",
}

_PLACEHOLDER = re.compile(r"%\((\w+)\)[sb]")


def numbered(statement: str) -> tuple[str, list[str]]:
    """``statement`` with its named placeholders as $1, $2, ... and the names in that
    order (a name used twice keeps its number)."""
    names: list[str] = []

    def number(found: re.Match[str]) -> str:
        if found.group(1) not in names:
            names.append(found.group(1))
        return f"${names.index(found.group(1)) + 1}"

    return _PLACEHOLDER.sub(number, statement).replace("%%", "%"), names


def prepare(conn: psycopg.Connection[Any], name: str, statement: str) -> list[str]:
    """PREPARE ``statement`` as ``name`` with the child's parameter types; the parameter
    names in the order EXECUTE takes their values."""
    body, names = numbered(statement)
    types = sql.SQL(", ").join(sql.SQL(PARAM_TYPES[n]) for n in names)
    conn.execute(
        sql.SQL("PREPARE {} ({}) AS {}").format(sql.Identifier(name), types, sql.SQL(body))
    )
    return names
