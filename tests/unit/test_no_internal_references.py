"""The code, the SQL, the tests and the documents speak of the product: no numbered
issue, no link into planning documents that are not shipped, no path outside the
repository. Pure: reads the repository's text files."""

from __future__ import annotations

import re
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
