"""The shape of the code, held by tests: every package's docstring map names exactly its
modules; docs/design.md's map names exactly brooq's module files; no import circle in
brooq/, between modules or between rooms (the packages and the top-level modules, each
taken whole); at most TOP_MODULES modules at brooq's top; a size budget (no module over
SOFT_LINES lines but those in LARGE, each with its reason; none under SMALL_LINES whose
docstring does not say why it stands alone); the claims' SKIP LOCKED written once.

Pure: reads the repository's files, imports nothing of brooq. Each check is a function of
a directory, so the second half of this file breaks each rule in a scratch tree and sees
the check catch it.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = "brooq"
# The size budget: a module of more than SOFT_LINES lines is named in LARGE with the
# reason it is read best whole; one of fewer than SMALL_LINES says in its docstring, on a
# line starting "Stands alone:", why it is not part of a neighbour.
SOFT_LINES = 700
SMALL_LINES = 30
LARGE: dict[str, str] = {
    "brooq/producer/insert.py": (
        "one insert path, read top to bottom: the public calls, one job, a batch, the keyed "
        "options, a graph, then the sync and async drivers each step runs on"
    ),
    "brooq/queue.py": (
        "the public Queue: one short method per door a user has (enqueue one, many or a "
        "stream, the reads and operations, stored schedules, waits), each over "
        "brooq.producer or brooq.operator"
    ),
    "brooq/page/reads.py": (
        "one read per page, each in the one read-only transaction it shares, and the "
        "overview's counts with their estimates (the table's sample, the history's), whose "
        "margins combine"
    ),
}
STANDS_ALONE = re.compile(r"^\s*Stands alone:", re.MULTILINE)
# brooq/*.py besides __init__ and __main__: what every room uses, and the public faces.
TOP_MODULES = 16

# A map line of a package's docstring: "- `name`: what it owns".
MAP_LINE = re.compile(r"^\s*- `([A-Za-z_][A-Za-z0-9_]*)`:", re.MULTILINE)
SKIP_LOCKED = re.compile(r"\bSKIP\s+LOCKED\b", re.IGNORECASE)


# -- the checks: each takes the tree to judge and returns what is wrong ---------------------


def packages(top: Path) -> Iterator[Path]:
    """Every package directory under (and including) top: those with an __init__.py."""
    for init in sorted(top.rglob("__init__.py")):
        if "__pycache__" not in init.parts:
            yield init.parent


def map_problems(top: Path) -> list[str]:
    """Each package's docstring map against the modules and subpackages present in it."""
    problems = []
    for package in packages(top):
        init = package / "__init__.py"
        doc = ast.get_docstring(ast.parse(init.read_text(encoding="utf-8"))) or ""
        listed = MAP_LINE.findall(doc)
        present = {
            p.stem for p in package.glob("*.py") if p.stem not in ("__init__", "__main__")
        } | {d.name for d in package.iterdir() if (d / "__init__.py").is_file()}
        name = package.relative_to(top.parent).as_posix()
        missing = sorted(present - set(listed))
        extra = sorted(set(listed) - present)
        twice = sorted({n for n in listed if listed.count(n) > 1})
        if missing:
            problems.append(f"{name}/__init__.py: the map lacks {missing}")
        if extra:
            problems.append(f"{name}/__init__.py: the map names what is not there: {extra}")
        if twice:
            problems.append(f"{name}/__init__.py: the map names twice: {twice}")
    return problems


def module_files(top: Path) -> set[str]:
    """Every .py file under top but the __init__.py files, as paths from top's parent."""
    return {
        p.relative_to(top.parent).as_posix()
        for p in top.rglob("*.py")
        if p.name != "__init__.py" and "__pycache__" not in p.parts
    }


def design_map_problems(design: Path, top: Path) -> list[str]:
    """The table under docs/design.md's "## The map" against the module files present."""
    text = design.read_text(encoding="utf-8") if design.is_file() else ""
    section = re.search(r"^## The map[ \t]*\n(.*?)(?=^## |\Z)", text, re.MULTILINE | re.DOTALL)
    if section is None:
        return [f"{design.name}: no section headed '## The map'"]
    rows = [line for line in section.group(1).splitlines() if line.lstrip().startswith("|")]
    # a module file of the map: a backticked path under the package, `brooq/worker/child.py`
    path = re.compile(rf"`({re.escape(top.name)}/[A-Za-z0-9_/]+\.py)`")
    named = [m for line in rows for m in path.findall(line)]
    present = module_files(top)
    problems = []
    if missing := sorted(present - set(named)):
        problems.append(f"{design.name}'s map lacks {missing}")
    if extra := sorted(set(named) - present):
        problems.append(f"{design.name}'s map names files that are not there: {extra}")
    if twice := sorted({n for n in named if named.count(n) > 1}):
        problems.append(f"{design.name}'s map names twice: {twice}")
    return problems


def module_names(top: Path) -> dict[str, Path]:
    """Dotted name -> file, for every module and package under top (top is a package)."""
    names = {}
    for path in top.rglob("*.py"):
        if "__pycache__" in path.parts:
            continue
        parts = list(path.relative_to(top.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        names[".".join(parts)] = path
    return names


def imports_of(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The modules of the package that this module imports, anywhere in its text: at module
    level, in functions, under TYPE_CHECKING. `from P import X` imports the package P (its
    __init__ runs and is asked for X), and P.X too when X is a module; relative imports are
    resolved against the module's package."""
    is_package = path.name == "__init__.py"
    own_package = name if is_package else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in known:
                    found.add(alias.name)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base_parts = own_package.split(".")
                if node.level > 1:
                    base_parts = base_parts[: len(base_parts) - (node.level - 1)]
                base = ".".join(base_parts + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            if base in known:
                found.add(base)
            for alias in node.names:
                if f"{base}.{alias.name}" in known:
                    found.add(f"{base}.{alias.name}")
    found.discard(name)
    return found


def import_graph(top: Path) -> dict[str, set[str]]:
    known = module_names(top)
    return {name: imports_of(name, path, known) for name, path in known.items()}


def import_circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One circle per strongly connected group of modules (Tarjan), each as the path
    a -> b -> ... -> a."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []
    counter = 0

    def visit(node: str) -> None:  # recursive: the package is a few hundred modules
        nonlocal counter
        index[node] = low[node] = counter
        counter += 1
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return [_circle_in(group, graph) for group in groups]


def _circle_in(group: list[str], graph: dict[str, set[str]]) -> list[str]:
    """A shortest way from the group's first module back to itself, inside the group."""
    start, members = group[0], set(group)
    paths = {start: [start]}
    queue = [start]
    while queue:
        node = queue.pop(0)
        for target in sorted(graph[node] & members):
            if target == start:
                return [*paths[node], start]
            if target not in paths:
                paths[target] = [*paths[node], target]
                queue.append(target)
    return group  # unreachable for a strongly connected group


def line_count(path: Path) -> int:
    return path.read_bytes().count(b"\n")  # as wc -l counts


def budget_problems(
    top: Path,
    large: dict[str, str] | None = None,
    soft: int = SOFT_LINES,
    small: int = SMALL_LINES,
) -> list[str]:
    """Every module over ``soft`` lines that ``large`` does not name with a reason, every
    one ``large`` names that is no longer over, and every module under ``small`` lines
    (an __init__ or __main__ aside) whose docstring does not say why it stands alone."""
    large = LARGE if large is None else large
    found = []
    for path in sorted(top.rglob("*.py")):
        if "__pycache__" in path.parts:
            continue
        name = path.relative_to(top.parent).as_posix()
        lines = line_count(path)
        if lines > soft and not large.get(name, "").strip():
            found.append(f"{name}: {lines} lines, over {soft} without a reason in LARGE")
        elif lines <= soft and name in large:
            found.append(f"{name}: {lines} lines, within {soft}: take it out of LARGE")
        if lines < small and path.name not in ("__init__.py", "__main__.py"):
            doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
            if not STANDS_ALONE.search(doc):
                found.append(f"{name}: {lines} lines, and no 'Stands alone:' in its docstring")
    return found


def top_modules(top: Path) -> list[str]:
    return sorted(p.stem for p in top.glob("*.py") if p.stem not in ("__init__", "__main__"))


def room_of(name: str) -> str:
    """The room of a dotted module name: its first package under the top, or the top-level
    module itself (``brooq.worker.child`` -> ``brooq.worker``, ``brooq.job`` -> itself)."""
    return ".".join(name.split(".")[:2])


def room_graph(graph: dict[str, set[str]], top_name: str) -> dict[str, set[str]]:
    """The import graph with each room taken whole. The top package itself (its
    __init__, which names what applications use) is left out: it imports from every room
    and nothing inside imports it."""
    rooms: dict[str, set[str]] = {}
    for source, targets in graph.items():
        if source == top_name:
            continue
        room = rooms.setdefault(room_of(source), set())
        for target in targets:
            if target != top_name and room_of(target) != room_of(source):
                room.add(room_of(target))
    return rooms


def claim_skip_locked(sql_dir: Path) -> dict[str, int]:
    """SKIP LOCKED outside comments, per named statement (`-- name: X`) or template
    (`-- template: X`, expanded by the loader into its variants) of the .sql files under
    sql_dir whose name says it claims (holds "claim"): the claim's way past locked
    rows, which must be written once. Other statements (the reaper, retention, the bulk
    batches) skip locked rows for their own reasons and are not counted."""
    counts: dict[str, int] = {}
    for path in sorted(sql_dir.rglob("*.sql")):
        text = path.read_text(encoding="utf-8")
        for block in re.split(r"^(?=--\s*(?:name|template):)", text, flags=re.MULTILINE):
            named = re.match(r"--\s*(?:name|template):\s*(\S+)", block)
            if named is None or "claim" not in named.group(1):
                continue
            code = re.sub(r"/\*.*?\*/", "", re.sub(r"--[^\n]*", "", block), flags=re.DOTALL)
            if n := len(SKIP_LOCKED.findall(code)):
                counts[f"{path.relative_to(sql_dir).as_posix()}:{named.group(1)}"] = n
    return counts


# -- the rules, on the repository ------------------------------------------------------------


def test_every_package_map_names_exactly_its_modules() -> None:
    problems = map_problems(ROOT / PACKAGE)
    assert not problems, "\n".join(problems)


def test_the_design_map_names_exactly_the_module_files() -> None:
    problems = design_map_problems(ROOT / "docs" / "design.md", ROOT / PACKAGE)
    assert not problems, "\n".join(problems)


def test_no_import_circle() -> None:
    circles = import_circles(import_graph(ROOT / PACKAGE))
    assert not circles, "import circles:\n" + "\n".join(" -> ".join(c) for c in circles)


def test_no_room_imports_a_room_that_imports_it_back() -> None:
    circles = import_circles(room_graph(import_graph(ROOT / PACKAGE), PACKAGE))
    assert not circles, "rooms importing each other:\n" + "\n".join(" -> ".join(c) for c in circles)


def test_every_module_keeps_to_the_size_budget() -> None:
    found = budget_problems(ROOT / PACKAGE)
    assert not found, "\n".join(found)


def test_the_top_level_keeps_at_most_its_share_of_modules() -> None:
    found = top_modules(ROOT / PACKAGE)
    assert len(found) <= TOP_MODULES, f"{len(found)} modules at brooq/: {found}"


def test_the_claims_skip_locked_is_written_once() -> None:
    counts = claim_skip_locked(ROOT / PACKAGE / "sql")
    assert sum(counts.values()) == 1, f"the claims' SKIP LOCKED in brooq/sql: {counts}"


# -- the checks themselves, on scratch trees that break each rule ---------------------------


def write(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return root / "pkg"


def test_a_true_map_passes_and_each_kind_of_lie_is_caught(tmp_path: Path) -> None:
    true = '"""The package.\n\n- `a`: one\n- `sub`: two\n"""\n'
    top = write(
        tmp_path,
        {
            "pkg/__init__.py": true,
            "pkg/a.py": "",
            "pkg/__main__.py": "",
            "pkg/sub/__init__.py": '"""Sub.\n\n- `b`: b\n"""\n',
            "pkg/sub/b.py": "",
            "pkg/data/notes.txt": "",  # a folder that is no package is not in the map
        },
    )
    assert map_problems(top) == []

    (top / "c.py").write_text("")
    assert map_problems(top) == ["pkg/__init__.py: the map lacks ['c']"]
    (top / "c.py").unlink()

    (top / "sub" / "b.py").unlink()
    assert map_problems(top) == ["pkg/sub/__init__.py: the map names what is not there: ['b']"]
    (top / "sub" / "b.py").write_text("")

    (top / "__init__.py").write_text(true.replace("- `sub`", "- `a`: again\n- `sub`"))
    assert map_problems(top) == ["pkg/__init__.py: the map names twice: ['a']"]

    (top / "__init__.py").write_text('"""No map at all."""\n')
    assert map_problems(top) == ["pkg/__init__.py: the map lacks ['a', 'sub']"]


def test_the_design_map_check_catches_a_missing_an_extra_and_no_section(tmp_path: Path) -> None:
    top = write(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/a.py": "",
            "pkg/w/__init__.py": "",
            "pkg/w/b.py": "",
            "pkg/__main__.py": "",
        },
    )
    design = tmp_path / "design.md"
    rows = "| `pkg/a.py` | a |\n| `pkg/w/b.py` | b |\n| `pkg/__main__.py` | main |\n"
    good = f"# Design\n\n## The map\n\n| file | role |\n|---|---|\n{rows}\n## Next\n\n`pkg/x.py`\n"
    design.write_text(good)
    assert design_map_problems(design, top) == []

    design.write_text(good.replace("| `pkg/w/b.py` | b |\n", ""))
    assert design_map_problems(design, top) == ["design.md's map lacks ['pkg/w/b.py']"]

    design.write_text(good.replace(rows, rows + "| `pkg/gone.py` | gone |\n"))
    assert design_map_problems(design, top) == [
        "design.md's map names files that are not there: ['pkg/gone.py']"
    ]

    design.write_text(good.replace("## The map", "## A map"))
    assert design_map_problems(design, top) == ["design.md: no section headed '## The map'"]

    # a path outside the table (prose, another section) does not count
    design.write_text(good.replace(rows, "| `pkg/a.py` | a |\n") + "`pkg/w/b.py`\n")
    assert design_map_problems(design, top) == [
        "design.md's map lacks ['pkg/__main__.py', 'pkg/w/b.py']"
    ]


def test_the_design_map_check_reads_brooq_paths(tmp_path: Path) -> None:
    write(tmp_path, {"brooq/__init__.py": "", "brooq/w/__init__.py": "", "brooq/w/c.py": ""})
    design = tmp_path / "design.md"
    design.write_text("## The map\n\n| `brooq/w/c.py` | the child |\n| `pkg/w/c.py` | no |\n")
    assert design_map_problems(design, tmp_path / "brooq") == []


def test_a_circle_is_found_and_named(tmp_path: Path) -> None:
    top = write(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/a.py": "import pkg.b\n",
            "pkg/b.py": "def f():\n    from pkg.c import g\n",
            "pkg/c.py": (
                "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from . import a\n"
            ),
            "pkg/d.py": "import pkg.a\n",  # into the circle, not part of it
        },
    )
    assert import_circles(import_graph(top)) == [["pkg.a", "pkg.b", "pkg.c", "pkg.a"]]

    (top / "c.py").write_text("import os\n")
    assert import_circles(import_graph(top)) == []


def test_importing_from_the_package_counts_as_importing_its_init(tmp_path: Path) -> None:
    top = write(
        tmp_path,
        {
            "pkg/__init__.py": "from pkg.job import Job\n",
            "pkg/job.py": "from pkg import errors\n",
            "pkg/errors.py": "",
        },
    )
    graph = import_graph(top)
    assert graph["pkg.job"] == {"pkg", "pkg.errors"}
    assert import_circles(graph) == [["pkg", "pkg.job", "pkg"]]

    (top / "job.py").write_text("from pkg.errors import E\n")
    assert import_circles(import_graph(top)) == []


def test_relative_imports_resolve_against_the_package(tmp_path: Path) -> None:
    top = write(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/w/__init__.py": "from .child import run\n",
            "pkg/w/child.py": "from ..s import master\nfrom . import state\n",
            "pkg/w/state.py": "",
            "pkg/s/__init__.py": "",
            "pkg/s/master.py": "from ..w import child\n",
        },
    )
    graph = import_graph(top)
    assert graph["pkg.w"] == {"pkg.w.child"}
    assert graph["pkg.w.child"] == {"pkg.s", "pkg.s.master", "pkg.w", "pkg.w.state"}
    assert graph["pkg.s.master"] == {"pkg.w", "pkg.w.child"}
    assert import_circles(graph) == [["pkg.s.master", "pkg.w.child", "pkg.s.master"]]


def test_the_budget_names_a_long_module_a_stale_reason_and_a_lone_small_one(
    tmp_path: Path,
) -> None:
    body = '"""A module."""\n' + "x = 1\n" * 40
    top = write(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/fits.py": body,
            "pkg/w/long.py": body + "x = 1\n" * 100,
            "pkg/tiny.py": '"""Tiny."""\n',
            "pkg/alone.py": '"""Tiny.\n\nStands alone: both processes import it."""\n',
        },
    )
    assert budget_problems(top, {}, soft=100, small=30) == [
        "pkg/tiny.py: 1 lines, and no 'Stands alone:' in its docstring",
        "pkg/w/long.py: 141 lines, over 100 without a reason in LARGE",
    ]
    reasons = {"pkg/w/long.py": "read whole", "pkg/fits.py": "was long"}
    assert budget_problems(top, reasons, soft=100, small=1) == [
        "pkg/fits.py: 41 lines, within 100: take it out of LARGE"
    ]


def test_rooms_are_taken_whole_and_a_room_circle_is_named(tmp_path: Path) -> None:
    top = write(
        tmp_path,
        {
            "pkg/__init__.py": "from pkg.queue import Q\n",
            "pkg/queue.py": "from pkg.producer.insert import f\n",
            "pkg/job.py": "",
            "pkg/producer/__init__.py": "",
            "pkg/producer/insert.py": "from pkg.job import J\nfrom pkg.declare.rates import r\n",
            "pkg/declare/__init__.py": "",
            "pkg/declare/rates.py": "from pkg.job import J\n",
            "pkg/declare/other.py": "",
        },
    )
    rooms = room_graph(import_graph(top), "pkg")
    assert rooms["pkg.producer"] == {"pkg.job", "pkg.declare"}
    assert import_circles(rooms) == []
    # no module circle, but the rooms import each other back
    (top / "declare" / "other.py").write_text("from pkg.producer import insert\n")
    assert import_circles(import_graph(top)) == []
    assert import_circles(room_graph(import_graph(top), "pkg")) == [
        ["pkg.declare", "pkg.producer", "pkg.declare"]
    ]


def test_the_claims_skip_locked_is_counted_outside_comments(tmp_path: Path) -> None:
    sql = tmp_path / "sql"
    write(
        tmp_path,
        {
            "sql/queries.sql": (
                "-- name: job_claim\n-- the claim: FOR UPDATE SKIP LOCKED, once\n"
                "SELECT id FROM job FOR NO KEY UPDATE SKIP LOCKED;\n/* skip locked */\n\n"
                "-- name: job_reap_expired\nSELECT id FROM job FOR UPDATE SKIP LOCKED;\n"
            ),
            "sql/more.sql": "-- name: job_count\nSELECT 1;\n",
        },
    )
    assert claim_skip_locked(sql) == {"queries.sql:job_claim": 1}
    (sql / "more.sql").write_text(
        "-- name: job_finish_and_claim\nSELECT id FROM job FOR UPDATE\n    skip  locked;\n"
    )
    assert claim_skip_locked(sql) == {
        "more.sql:job_finish_and_claim": 1,
        "queries.sql:job_claim": 1,
    }
    # A template the loader expands into variants counts once, as the one text it is.
    (sql / "more.sql").write_text(
        "-- template: job_finish_and_claim\n-- variant: job_finish_and_claim\n"
        "-- variant: job_finish_and_claim_queues: queues\n"
        "SELECT id FROM job FOR NO KEY UPDATE{if queues: OF job} SKIP LOCKED;\n"
    )
    assert claim_skip_locked(sql) == {
        "more.sql:job_finish_and_claim": 1,
        "queries.sql:job_claim": 1,
    }
