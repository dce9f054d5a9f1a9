"""CONTRIBUTING.md names files and tests that exist: every backticked path in its text (a
file or a folder of the repository), and every ``path::test_name`` names a test defined
in that file. A path with a placeholder (``migrations/NNNN_<name>.sql``) names its folder,
which must exist. Pure: reads the repository's files.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "CONTRIBUTING.md"

FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)
INLINE = re.compile(r"`([^`\n]+)`")
# A file of the repository by its ending; anything else with a slash is a path too.
SUFFIXES = (".py", ".md", ".sql", ".yml", ".yaml", ".json", ".toml", ".txt", ".cfg", ".sh")
PLACEHOLDER = re.compile(r"[<*]|NNNN")


def named(text: str) -> list[str]:
    """The backticked spans of ``text`` (fenced blocks aside) that name a path: no space,
    no URL, and a slash or a file's ending."""
    found = []
    for span in INLINE.findall(FENCE.sub("", text)):
        if any(c.isspace() for c in span) or "://" in span:
            continue
        path = span.split("::")[0]
        if "/" in path or path.endswith(SUFFIXES):
            found.append(span)
    return found


def defined_tests(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return {
        node.name
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name.startswith("test")
    }


def problems(text: str, root: Path) -> list[str]:
    """What ``text`` names that ``root`` does not hold."""
    found = []
    for span in named(text):
        path, _, test = span.partition("::")
        if PLACEHOLDER.search(path):
            folder = PLACEHOLDER.split(path)[0].rpartition("/")[0]
            if not (root / folder).is_dir():
                found.append(f"{span}: no folder {folder}/")
            continue
        target = root / path.rstrip("/")
        if not target.exists():
            found.append(f"{span}: not in the repository")
        elif test and (not target.is_file() or test not in defined_tests(target)):
            found.append(f"{span}: no test {test} in {path}")
    return found


def test_every_path_and_test_contributing_names_exists() -> None:
    found = problems(PAGE.read_text(encoding="utf-8"), ROOT)
    assert not found, "CONTRIBUTING.md names what is not there:\n" + "\n".join(found)


def test_the_page_names_enough_to_be_checked() -> None:
    spans = named(PAGE.read_text(encoding="utf-8"))
    assert len(spans) > 100 and sum("::" in s for s in spans) >= 5


def test_the_check_catches_a_missing_file_a_missing_test_and_a_missing_folder(
    tmp_path: Path,
) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "a.py").write_text("def test_one():\n    pass\n")
    (tmp_path / "migrations").mkdir()
    good = (
        "Read `pkg/a.py`, `pkg/`, `pkg/a.py::test_one`, `migrations/NNNN_<name>.sql`;\n"
        "not paths: `make test`, `QUEUE_LEASE`, `brooq.job`, `postgresql://h/db`, `a b/c`.\n"
        "```\nignored/in/a/fence.py\n`fenced/too.py`\n```\n"
    )
    assert problems(good, tmp_path) == []
    assert problems("`pkg/b.py`", tmp_path) == ["pkg/b.py: not in the repository"]
    assert problems("`pkg/a.py::test_two`", tmp_path) == [
        "pkg/a.py::test_two: no test test_two in pkg/a.py"
    ]
    assert problems("`pkg/::test_one`", tmp_path) == ["pkg/::test_one: no test test_one in pkg/"]
    assert problems("`other/NNNN_<x>.sql`", tmp_path) == ["other/NNNN_<x>.sql: no folder other/"]
    assert problems("`CONTRIBUTING.md`", tmp_path) == ["CONTRIBUTING.md: not in the repository"]
