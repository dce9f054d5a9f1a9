"""The migration files of migrations/: finding them, reading and checking each, and
splitting a no-transaction part into its statements.

A file is ``NNNN_name.sql`` with one ``-- migrate:up`` part then one ``-- migrate:down``
part, both non-empty; ``-- migrate:no-transaction`` before the up part marks a file run
statement by statement (brooq.migrate says why and how): it is split at each ``;`` that
ends a line outside a quoted or dollar-quoted text and outside a comment, so a function's
``$$`` body stays whole. Versions run 1, 2, 3, ... without gaps.

A statement that names ``CONCURRENTLY`` (or is a ``VACUUM``) cannot run in a transaction
block (``needs_autocommit``); every other one runs in a transaction of its own with the
version's record (brooq.migrate). ``leaves`` reads the up parts for what each leaves in
the schema (its tables, indexes, functions, triggers, added columns and constraints,
less what a later up part drops): what ``brooq migrate up`` checks is there for every
version recorded as applied. Text inside quotes, dollar quotes (a ``DO`` block, a
function's body) and comments is not read.

Owns: ``Migration`` (one file, read), ``load``, ``migrations_dir``, ``statements``,
``needs_autocommit`` and ``leaves``.
Must never: touch a database (brooq.migrate applies what this reads).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from brooq.errors import MigrationError

_FILE = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")
_UP = "-- migrate:up"
_DOWN = "-- migrate:down"
_NO_TRANSACTION = "-- migrate:no-transaction"
# What the splitter steps over whole: a comment to its line's end, a quoted text ('' is a
# quote inside it), a dollar-quoted text ($$...$$ or $tag$...$tag$), or any other
# character; and a ";" that ends its line (spaces and tabs may follow), which ends a
# statement.
_TOKEN = re.compile(
    r"--[^\n]*|'(?:[^']|'')*'|(\$[A-Za-z_]*\$)[\s\S]*?\1|(?P<end>;[ \t]*(?:\n|$))|[\s\S]",
)
_INDEX_NAME = re.compile(
    r"\bINDEX\s+(?:CONCURRENTLY\s+)?(?:IF\s+(?:NOT\s+)?EXISTS\s+)?([a-z_][a-z0-9_]*)",
    re.IGNORECASE,
)


# What leaves or takes an object, in the up parts' words (read on text without comments,
# quotes or dollar-quoted bodies).
_OBJECT = re.compile(
    r"\b(?P<verb>CREATE(?:\s+OR\s+REPLACE)?(?:\s+UNIQUE|\s+CONSTRAINT(?=\s+TRIGGER))?|DROP|ADD)\s+"
    r"(?P<kind>TABLE|INDEX|FUNCTION|TRIGGER|COLUMN|CONSTRAINT)\s+"
    r"(?:CONCURRENTLY\s+)?(?:IF\s+(?:NOT\s+)?EXISTS\s+)?(?P<name>[a-z_][a-z0-9_]*)",
    re.IGNORECASE,
)
_ALTERED = re.compile(
    r"^\s*ALTER\s+TABLE\s+(?:IF\s+EXISTS\s+)?(?:ONLY\s+)?([a-z_][a-z0-9_]*)", re.IGNORECASE
)
# CALL: a procedure that commits between its batches (a down step's move of rows) cannot
# run in a transaction block.
_AUTOCOMMIT = re.compile(r"\bCONCURRENTLY\b|^\s*VACUUM\b|^\s*CALL\b", re.IGNORECASE)


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    up: str
    down: str
    # False: run statement by statement in autocommit (the no-transaction marker).
    transactional: bool = True

    def indexes(self) -> list[str]:
        """The index names the file's statements create or drop."""
        return sorted(set(_INDEX_NAME.findall(self.up + "\n" + self.down)))


def _bare(text: str) -> str:
    """``text`` without its comments, quoted texts and dollar-quoted bodies."""
    return "".join(
        " " if token.group(0)[:1] in ("'", "$") or token.group(0).startswith("--") else token[0]
        for token in _TOKEN.finditer(text)
    )


def needs_autocommit(statement: str) -> bool:
    """Whether ``statement`` cannot run inside a transaction block."""
    return bool(_AUTOCOMMIT.search(_bare(statement)))


def leaves(migrations: list[Migration]) -> dict[int, list[str]]:
    """For each of ``migrations`` (applied in this order), the objects its up part leaves
    that no later one of them drops: "table NAME", "index NAME", "function NAME",
    "trigger NAME", "constraint NAME", "column TABLE.NAME"."""
    owner: dict[str, int] = {}
    for m in migrations:
        for statement in statements(m.up):
            bare = _bare(statement)
            altered = _ALTERED.match(bare)
            for found in _OBJECT.finditer(bare):
                kind, name = found["kind"].lower(), found["name"]
                if kind == "column":
                    if altered is None:
                        continue
                    name = f"{altered.group(1)}.{name}"
                what = f"{kind} {name}"
                if found["verb"].upper() == "DROP":
                    owner.pop(what, None)
                    if kind == "table":  # a table's indexes and columns go with it
                        owner.pop(f"index {name}", None)
                else:
                    owner[what] = m.version
    left: dict[int, list[str]] = {m.version: [] for m in migrations}
    for what, version in owner.items():
        left[version].append(what)
    return left


def statements(text: str) -> list[str]:
    """A no-transaction part, split at every ``;`` ending a line outside quotes, dollar
    quotes and comments; comment-only pieces go."""
    pieces: list[str] = []
    start = 0
    for token in _TOKEN.finditer(text):
        if token.group("end") is not None:
            pieces.append(text[start : token.start()].strip())
            start = token.end()
    pieces.append(text[start:].strip())
    return [
        piece
        for piece in pieces
        if any(line.strip() and not line.strip().startswith("--") for line in piece.splitlines())
    ]


def migrations_dir() -> Path:
    """migrations/ inside the installed package, or at the root of a source checkout."""
    here = Path(__file__).resolve().parent.parent  # brooq/, installed or in a checkout
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
        transactional = _NO_TRANSACTION not in text[: text.index(_UP)]
        found.append(Migration(int(match.group(1)), match.group(2), up, down, transactional))
    versions = [m.version for m in found]
    if versions != list(range(1, len(found) + 1)):
        raise MigrationError(f"migration versions must run 1, 2, 3, ... without gaps: {versions}")
    return found
