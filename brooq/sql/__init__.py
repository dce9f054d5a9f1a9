"""Every SQL statement of brooq, named ``-- name: table_verb`` in the ``*.sql`` files here.

The package holds no module besides this loader; its statements are grouped in files by
who runs them: ``producer.sql`` (Queue.enqueue and its kin, Queue.wait), ``child.sql``
(a worker child's claim round trip and outcomes), ``master.sql`` (brooq-master's own
duties), ``operator.sql`` (Queue's inspection and bulk writes, the CLI, stacks asked for,
brooq.testing), ``page.sql`` (the status page's reads), ``durable.sql`` (durable handlers'
steps, sleeps, waits and events), ``migrate.sql`` (brooq.migrate) and ``session.sql``
(settings any connection reads or sets, and whether its server is a standby). Every
``*.sql`` file here is read; a name defined twice, in one file or in two, is refused
naming the file(s).
Parameters are psycopg named placeholders (so a ``%`` in a comment must be doubled);
arrays are bound in binary (the ``b`` placeholders: psycopg's text form escapes element
by element, far slower). Outcome writes are guarded by "still processing and
still mine": zero rows is a normal answer, never an error.

The files are parsed once; ``Q.job_get`` is the text of the statement named job_get,
comment lines included, with brooq's relations unqualified (they follow the connection's
search_path). A relation of brooq's is marked in the file: ``{job}`` is the table job,
``{job:name}`` the text of its name (for ``to_regclass``); RELATIONS lists what may be
marked. ``queries(schema)`` is the same set with every mark qualified by ``schema``
(QUEUE_SCHEMA), composed with psycopg.sql and rendered to text once per schema, then
cached: a caller holding the set pays for a statement what ``Q.name`` costs, a
dictionary look-up.

Templates: statements that differ in a few places are written once, as a template
expanded into its named variants when the files are parsed (before any schema is
rendered); each variant is then a statement like any other. The syntax::

    -- template: job_finish_and_claim           (names the template, not a statement)
    -- variant: job_finish_and_claim            (a variant with no flag)
    -- variant: job_finish_and_claim_queues: queues
    -- variant: job_finish_and_claim_limited: queues, limited
    ...the statement's lines...
    --#if queues            lines kept in the variants with the flag queues
    --#else                 (optional) lines kept in the others
    --#end
    --#if not limited       the same for the variants without it; sections nest
    FOR NO KEY UPDATE{if queues: OF job} SKIP LOCKED

``-- variant:`` lines come right after the heading, one per variant: its statement name,
then after a colon the flags it has, comma separated. A line that is ``--#if FLAG``,
``--#if not FLAG``, ``--#else`` or ``--#end`` (indentation allowed) opens, turns or
closes a section and is never part of a statement; ``{if FLAG:text}`` (or
``{if not FLAG:text}``) inside a line is ``text``, taken verbatim from after the colon,
in the variants it holds for, and nothing in the others. A flag no variant declares, an
``--#if`` left open, any other ``--#`` line, or a directive in a ``-- name:`` statement
is refused when the files are loaded.

``catalog()`` says where each statement comes from (its file, its template and flags),
for ``brooq sql`` and the reference page.

Owns: loading the ``*.sql`` files, expanding their templates, the marks and their
rendering, the catalog of the statements, the check of a schema name
(``validate_schema``) and handing out the statements by name.
Must never: compose a schema into SQL other than through psycopg.sql, render a statement
per call, or hold a statement that is defined twice.
"""

from __future__ import annotations

import re
import threading
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple, cast

from psycopg import sql

from brooq.errors import InvalidSettings

if TYPE_CHECKING:
    from typing_extensions import LiteralString
else:
    LiteralString = str

_HEADING = re.compile(r"^-- (name|template): ([a-z_]+)\s*$", re.MULTILINE)
_VARIANT = re.compile(r"^-- variant: ([a-z_]+)(?:: ([a-z_, ]+))?\s*$")
_DIRECTIVE = re.compile(r"^[ \t]*--#(if|else|end)(?: (not )?([a-z_]+))?[ \t]*$")
_ANY_DIRECTIVE = re.compile(r"^[ \t]*--#", re.MULTILINE)
_INLINE = re.compile(r"\{if (not )?([a-z_]+):([^{}]*)\}")
# brooq's relations (and the functions called by name): the only names a mark holds.
RELATIONS = (
    "job",
    "brooq_queue",
    "brooq_periodic",
    "brooq_stack_request",
    "brooq_migration",
    "brooq_claim_limited",
    "brooq_master",
    "brooq_job_promote",
    "brooq_claim_coordinated",
    "brooq_claim_groups",
    "brooq_claim_batch",
    "brooq_group_limit",
    "brooq_schedule",
    "brooq_key_block",
    "brooq_order_next",
    "brooq_rate_slot",
    "brooq_window_sweep",
    "brooq_window_give_back",
    "brooq_job_edge",
    "brooq_job_after",
    "brooq_job_step",
    "brooq_event",
    "brooq_event_wait",
    "brooq_emit_event",
    "brooq_park_event",
    "brooq_park_jobs",
    "brooq_errors_append",
    "job_history",
    "job_all",
    "brooq_job_key",
    "brooq_history_prepare",
    "brooq_history_expired",
    "brooq_history_release",
    "brooq_history_release_keys",
    "brooq_history_release_links",
    "brooq_history_drop",
    "brooq_history_expire_default",
    "brooq_history_floor",
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


def parse(text: str, source: str = "<text>") -> dict[str, str]:
    """The statements of one file by name: each ``-- name:`` section, and each variant of
    each ``-- template:`` section expanded (see the module docstring)."""
    parts = _HEADING.split(text)
    found: dict[str, str] = {}
    for kind, name, body in zip(parts[1::3], parts[2::3], parts[3::3], strict=True):
        if kind == "name":
            if _ANY_DIRECTIVE.search(body) or _INLINE.search(body):
                raise ValueError(f"{source}: statement {name!r} holds a template directive")
            statements = {name: body.strip()}
        else:
            statements = expand(name, body, source)
        for statement, statement_text in statements.items():
            if statement in found:
                raise ValueError(f"{source}: query {statement!r} is defined twice")
            found[statement] = statement_text
    return found


def expand(template: str, body: str, source: str = "<text>") -> dict[str, str]:
    """Each variant of the template ``template`` (its text after the heading): the lines
    its flags keep, the inline ``{if ...}`` of its flags written in."""
    lines = body.strip().split("\n")
    variants = _variants(lines)
    where = f"{source}: template {template!r}"
    if not variants:
        raise ValueError(f"{where} declares no variant")
    known = frozenset().union(*variants.values())

    def holds(negated: str | None, flag: str, flags: frozenset[str]) -> bool:
        if flag not in known:
            raise ValueError(f"{where} tests {flag!r}, a flag no variant has")
        return (flag in flags) != bool(negated)

    def inline(found: re.Match[str], flags: frozenset[str]) -> str:
        return found.group(3) if holds(found.group(1), found.group(2), flags) else ""

    expanded: dict[str, str] = {}
    for variant, flags in variants.items():
        kept: list[str] = []
        stack: list[tuple[bool, bool]] = []  # (this section kept, the enclosing one kept)
        for line in lines:
            directive = _DIRECTIVE.match(line)
            if directive is None and _ANY_DIRECTIVE.match(line):
                raise ValueError(f"{where}: malformed {line.strip()!r}")
            if directive is None:
                if all(keep for keep, _ in stack):
                    kept.append(_INLINE.sub(partial(inline, flags=flags), line))
                continue
            word, negated, flag = directive.group(1), directive.group(2), directive.group(3)
            if word == "if" and flag:
                stack.append((holds(negated, flag, flags), all(k for k, _ in stack)))
            elif word == "else" and stack and not flag:
                stack[-1] = (not stack[-1][0], stack[-1][1])
            elif word == "end" and stack and not flag:
                stack.pop()
            else:
                raise ValueError(f"{where}: misplaced or malformed {line.strip()!r}")
        if stack:
            raise ValueError(f"{where}: an --#if without its --#end")
        expanded[variant] = "\n".join(kept).strip()
    return expanded


def _variants(lines: list[str]) -> dict[str, frozenset[str]]:
    """The variants declared at the head of a template's ``lines`` (taken off them):
    each one's flags by statement name."""
    variants: dict[str, frozenset[str]] = {}
    while lines and (declared := _VARIANT.match(lines[0])):
        flags = declared.group(2) or ""
        variants[declared.group(1)] = frozenset(f.strip() for f in flags.split(",") if f.strip())
        lines.pop(0)
    return variants


class Statement(NamedTuple):
    """Where a statement comes from: its file (``child.sql``), and for a template's
    variant the template's name and the variant's flags (None and no flags otherwise)."""

    name: str
    file: str
    template: str | None
    flags: frozenset[str]


def catalog(directory: Path | None = None) -> list[Statement]:
    """Every statement of the ``*.sql`` files of ``directory`` (default: brooq's), in
    the order ``load`` reads them: file by file, as written. Their text is ``load``'s."""
    found: list[Statement] = []
    for path in sorted((directory or Path(__file__).parent).glob("*.sql")):
        parts = _HEADING.split(path.read_text(encoding="utf-8"))
        for kind, name, body in zip(parts[1::3], parts[2::3], parts[3::3], strict=True):
            if kind == "name":
                found.append(Statement(name, path.name, None, frozenset()))
                continue
            for variant, flags in _variants(body.strip().split("\n")).items():
                found.append(Statement(variant, path.name, name, flags))
    return found


def load(directory: Path) -> dict[str, str]:
    """Every statement of the ``*.sql`` files of ``directory``; a name defined in two
    files is refused, naming both."""
    found: dict[str, str] = {}
    source: dict[str, str] = {}
    for path in sorted(directory.glob("*.sql")):
        for name, text in parse(path.read_text(encoding="utf-8"), path.name).items():
            if name in found:
                raise ValueError(
                    f"query {name!r} is defined twice: in {source[name]} and in {path.name}"
                )
            found[name], source[name] = text, path.name
    return found


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
            raise ValueError(f"brooq/sql may not name a statement {sorted(taken)[0]!r}")
        self.schema = schema
        # Plain attributes: a look-up costs what any attribute does (a __getattr__ that
        # reads a dictionary costs more per statement: an AttributeError first).
        self.__dict__.update(queries)
        self._names = sorted(queries)

    def __getattr__(self, name: str) -> LiteralString:
        # Only reached for a name that is not a statement.
        raise AttributeError(f"no query named {name!r} in brooq/sql")

    def names(self) -> list[str]:
        return list(self._names)


_TEXT = load(Path(__file__).parent)
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
