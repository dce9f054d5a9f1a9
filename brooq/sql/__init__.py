"""Every SQL statement of brooq lives in queries.sql, named ``-- name: table_verb``.

The file is parsed once; ``Q.job_get`` is the text of the statement named job_get, with
brooq's relations unqualified (they follow the connection's search_path). A relation of
brooq's is marked in the file: ``{job}`` is the table job, ``{job:name}`` the text of its
name (for ``to_regclass``); RELATIONS lists what may be marked. ``queries(schema)`` is
the same set with every mark qualified by ``schema`` (QUEUE_SCHEMA), composed with
psycopg.sql and rendered to text once per schema, then cached: a caller holding the set
pays for a statement what ``Q.name`` costs, a dictionary look-up.

Owns: loading queries.sql, the marks and their rendering, the check of a schema name
(``validate_schema``) and handing out the statements by name.
Must never: compose a schema into SQL other than through psycopg.sql, render a statement
per call, or hold a statement that is defined twice.
"""

from __future__ import annotations

import re
import threading
from pathlib import Path
from typing import TYPE_CHECKING, cast

from psycopg import sql

from brooq.errors import InvalidSettings

if TYPE_CHECKING:
    from typing_extensions import LiteralString
else:
    LiteralString = str

_NAME = re.compile(r"^-- name: ([a-z_]+)\s*$", re.MULTILINE)
# brooq's relations (and its one function called by name): the only names a mark holds.
RELATIONS = (
    "job",
    "brooq_queue",
    "brooq_periodic",
    "brooq_stack_request",
    "brooq_migration",
    "brooq_claim_limited",
    "brooq_master",
)
_MARK = re.compile(r"\{(" + "|".join(RELATIONS) + r")(:name)?\}")
# The schema names QUEUE_SCHEMA takes: PostgreSQL's unquoted lower-case identifiers, so
# that the name means the same in psql, in a DSN's search_path and to brooq. 63 bytes is
# PostgreSQL's limit (NAMEDATALEN - 1); pg_* is reserved for the system.
SCHEMA_MAX_BYTES = 63
_SCHEMA = re.compile(r"^[a-z_][a-z0-9_]*$")


def schema_problem(name: str) -> str:
    """What is wrong with ``name`` as brooq's schema; "" when nothing is."""
    problem = ""
    if not _SCHEMA.match(name):
        problem = (
            "a schema name is lower-case letters, digits and underscores, not starting with a digit"
        )
    elif len(name.encode()) > SCHEMA_MAX_BYTES:
        problem = f"a schema name holds at most {SCHEMA_MAX_BYTES} bytes (PostgreSQL's limit)"
    elif name.startswith("pg_"):
        problem = "names starting with pg_ are reserved for PostgreSQL's own schemas"
    return problem


def validate_schema(name: str, source: str = "QUEUE_SCHEMA") -> str:
    """``name`` if PostgreSQL can hold it as brooq's schema; InvalidSettings otherwise."""
    problem = schema_problem(name)
    if problem:
        shown = name if len(name) <= 80 else name[:80] + "..."
        raise InvalidSettings([f"{source}={shown!r}: {problem}"])
    return name


def parse(text: str) -> dict[str, str]:
    parts = _NAME.split(text)
    queries: dict[str, str] = {}
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        if name in queries:
            raise ValueError(f"query {name!r} is defined twice")
        queries[name] = body.strip()
    return queries


def render(text: str, schema: str | None) -> LiteralString:
    """``text`` with its marks turned into brooq's relations: bare names when ``schema``
    is None (the text is then today's, character for character), else qualified."""
    pieces = _MARK.split(text)  # text, relation, ":name" or None, text, ...
    parts: list[sql.Composable] = []
    for i in range(0, len(pieces), 3):
        parts.append(sql.SQL(cast("LiteralString", pieces[i])))
        if i + 1 >= len(pieces):
            break
        relation, as_name = pieces[i + 1], pieces[i + 2] is not None
        ident: sql.Composable = (
            sql.SQL(cast("LiteralString", relation))  # one of RELATIONS, not input
            if schema is None
            else sql.Identifier(schema, relation)
        )
        parts.append(sql.Literal(ident.as_string(None)) if as_name else ident)
    rendered: LiteralString = sql.Composed(parts).as_string(None)
    return rendered


class Queries:
    """One schema's statements, as attributes: ``q.job_insert``."""

    def __init__(self, queries: dict[str, LiteralString], schema: str | None) -> None:
        taken = set(queries) & {"schema", "names", "_names"}
        if taken:
            raise ValueError(f"queries.sql may not name a statement {sorted(taken)[0]!r}")
        self.schema = schema
        # Plain attributes: a look-up costs what any attribute does (a __getattr__ that
        # reads a dictionary costs about 1 µs more per statement: an AttributeError first).
        self.__dict__.update(queries)
        self._names = sorted(queries)

    def __getattr__(self, name: str) -> LiteralString:
        # Only reached for a name that is not a statement.
        raise AttributeError(f"no query named {name!r} in queries.sql")

    def names(self) -> list[str]:
        return list(self._names)


_TEXT = parse((Path(__file__).parent / "queries.sql").read_text(encoding="utf-8"))
_SETS: dict[str | None, Queries] = {}
_LOCK = threading.Lock()


def queries(schema: str | None = None) -> Queries:
    """The statements for ``schema`` (None: unqualified), rendered on first use."""
    found = _SETS.get(schema)
    if found is not None:
        return found
    if schema is not None:
        validate_schema(schema)
    with _LOCK:
        found = _SETS.get(schema)
        if found is None:
            found = Queries({n: render(t, schema) for n, t in _TEXT.items()}, schema)
            _SETS[schema] = found
    return found


Q = queries(None)
