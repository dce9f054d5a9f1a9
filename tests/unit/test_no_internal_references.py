"""The code, the SQL, the tests and the documents speak of the product: no numbered
issue, no link into planning documents that are not shipped, no path outside the
repository. Pure: reads the repository's text files."""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCANNED = ("brooq", "tests", "docs", "examples", "migrations")
FILES = ("README.md", "RELIABILITY.md", "CHANGELOG.md")
SUFFIXES = {".py", ".sql", ".md", ".txt", ".toml", ".cfg", ".ini", ".html", ".sh", ".service"}

# Assembled from pieces so that this file's own text matches none of them.
_I = "iss" + "ue"
PATTERNS = [
    re.compile(_I + r"[ -]?\d", re.IGNORECASE),
    re.compile(r"\b" + _I + r"s? #?\d", re.IGNORECASE),
    re.compile("docs/" + "plans", re.IGNORECASE),
    re.compile(r"\.\./" + "shared/", re.IGNORECASE),
    re.compile("red" + " team", re.IGNORECASE),
]


def _files() -> list[Path]:
    found = [ROOT / name for name in FILES]
    for top in SCANNED:
        for path in sorted((ROOT / top).rglob("*")):
            parts = path.relative_to(ROOT).parts
            if "__pycache__" in parts or any(p.startswith(".") for p in parts):
                continue
            if path.is_file() and path.suffix in SUFFIXES:
                found.append(path)
    return found


def test_the_scan_sees_the_files_it_should() -> None:
    names = {p.relative_to(ROOT).as_posix() for p in _files()}
    for expected in (
        "README.md",
        "brooq/sql/child.sql",
        "migrations/0001_job.sql",
        "docs/design.md",
        "tests/conftest.py",
        "tests/unit/test_no_internal_references.py",
        "tests/unit/supervisor/test_watchdog.py",
        "tests/db/test_migrate.py",
        "tests/process/test_master.py",
        "tests/apps/brooq_testapp.py",
    ):
        assert expected in names, expected


def test_the_patterns_catch_what_they_are_for() -> None:
    caught = [
        "(" + _I + " 15)",
        _I.capitalize() + "-13",
        "see " + _I + "s #21",
        "docs/" + "plans/queues.md",
        "../" + "shared/x",
        "the Red" + " Team found",
    ]
    for text in caught:
        assert any(p.search(text) for p in PATTERNS), text
    for text in ("a database session", "color:#666", "the plan of a query", "issued 3 tokens"):
        assert not any(p.search(text) for p in PATTERNS), text


def test_no_internal_references() -> None:
    hits = []
    for path in _files():
        text = path.read_text(encoding="utf-8", errors="replace")
        for number, line in enumerate(text.splitlines(), 1):
            name = path.relative_to(ROOT).as_posix()
            for pattern in PATTERNS:
                if pattern.search(line):
                    hits.append(f"{name}:{number}: {line.strip()[:120]}")
                    break
    assert not hits, "internal references:\n" + "\n".join(hits)


# -- measurements stay out of the code -------------------------------------------------------
# A figure measured (a timing, a throughput) belongs in docs/benchmarks.md with how it was
# taken; a comment or docstring keeps the reason it supports, never the figure. Caught in
# comments and docstrings only: code may name units (timeout_ms = 5), and a figure after
# a bound ("at most 100 ms"), a duration as written ("250ms", per=100ms) or a unit alone
# ("in ms") is a rule, not a measurement.
_FIGURE = re.compile(
    r"(?P<before>\S*\s*\S*\s*)(?<![\w.\"'`=])(?:~|≈)?\d[\d,]*(?:\.\d+)?(?:-\d[\d,]*(?:\.\d+)?)?"
    r" ?(?:µs|us|ns|ms|jobs/s)(?![\w\"'`])"
)
_BOUNDS = re.compile(
    r"\b(?:at most|at least|up to|within|every|under|no more than|less than|more than|"
    r"longer than|shorter than)(?: about)?\s*$",
    re.IGNORECASE,
)
_MEASURED = re.compile(r"\bmeasured\b", re.IGNORECASE)


def measurement(line: str) -> bool:
    """Whether a line of a comment or docstring carries a measurement."""
    if _MEASURED.search(line):
        return True
    for found in _FIGURE.finditer(line):
        if not _BOUNDS.search(line[: found.start("before") + len(found.group("before"))]):
            return True
    return False


def prose(source: str) -> list[tuple[int, str]]:
    """The comments and docstrings of a Python source, line by line (line number, text)."""
    lines: list[tuple[int, str]] = []
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            lines.append((token.start[0], token.string))
    nodes = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, nodes) and node.body:
            first = node.body[0]
            if (
                isinstance(first, ast.Expr)
                and isinstance(first.value, ast.Constant)
                and isinstance(first.value.value, str)
            ):
                for offset, text in enumerate(first.value.value.splitlines()):
                    lines.append((first.lineno + offset, text))
    return sorted(lines)


def test_the_measurement_rule_catches_figures_and_passes_units() -> None:
    planted = '''"""A claim took 22 ms instead of 1.3 ms on 20,000 rows."""
TIMEOUT_MS = 5  # in ms: the statement's budget
LOCK = "500ms"


def decode(p):
    """Decode ``p``. Cost: 0.51-0.56 µs a call (a first version: 0.69 µs)."""
    # the drain ran at 4,700 jobs/s
    # two thread hops fewer (~0.3 ms each)
    # each layer is one Python call (measured)
    return p


def wait(timeout_ms: int = 100) -> None:
    """Wait at most ``timeout_ms`` (in ms), at most 100 ms, up to 5 ms late."""
    # A duration as written: "250ms", Rate(1, per=100ms); the grain, in ms.
'''
    flagged = sorted(n for n, text in prose(planted) if measurement(text))
    assert flagged == [1, 7, 8, 9, 10], flagged
    for text in ("every 5 ms", "within 50 ms", "a timeout_ms of its own", "(45 % margin)"):
        assert not measurement(text), text


def test_no_measurements_in_code_comments() -> None:
    hits = []
    for path in sorted((ROOT / "brooq").rglob("*.py")):
        if "__pycache__" in path.parts:
            continue
        for number, text in prose(path.read_text(encoding="utf-8")):
            if measurement(text):
                hits.append(f"{path.relative_to(ROOT).as_posix()}:{number}: {text.strip()[:120]}")
    assert not hits, "measurements in comments (they belong in docs/benchmarks.md):\n" + (
        "\n".join(hits)
    )
