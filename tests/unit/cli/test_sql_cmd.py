"""`brooq sql list|show` (brooq.cli.sql): every statement of brooq/sql listed, each shown
as the process running it holds it, the claim's variants as the worker picks them, the
reference page current, and bad names or flags one line with exit 2. No database
(tests/db/test_sql_cmd.py has PostgreSQL parse every statement shown)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from psycopg._queries import PostgresQuery
from psycopg.adapt import Transformer

import brooq.sql
from brooq.cli import cli
from brooq.cli.sql import reference_page, sent_text
from brooq.settings import Settings
from brooq.sql import catalog, load, queries
from brooq.worker.roundtrip import _STATEMENTS, RoundTrips

ROOT = Path(__file__).resolve().parents[3]
SQL_DIR = Path(brooq.sql.__file__).parent
NAMES = list(load(SQL_DIR))  # the loader's own reading of the files
CLAIM = "job_finish_and_claim"


def invoke(*args: str, env: dict[str, str] | None = None) -> str:
    result = CliRunner().invoke(cli, list(args), env={"QUEUE_SCHEMA": None, **(env or {})})
    assert result.exit_code == 0, result.output
    return result.output


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`python -m brooq ARGS` with no database anywhere in its environment."""
    environ = {
        k: v for k, v in os.environ.items() if not k.startswith(("DATABASE_URL", "CRED", "QUEUE_"))
    }
    environ["PYTHONPATH"] = str(ROOT)
    environ.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "brooq", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=environ,
        cwd=ROOT,
    )


def worker_statements(schema: str | None) -> dict[str, tuple[str, str]]:
    """The claim statements of a child's round trips, by shape: what RoundTrips looks up
    in the schema's texts when a child starts (the database is not touched there)."""
    settings = Settings(schema=schema)
    unused: Any = None  # the connection, outcome writer and round order: not read here
    trips = RoundTrips(
        "w", settings, queries(schema), unused, unused, {}, [], [], unused, 1, print, print
    )
    return dict(trips.statements)


def test_list_names_every_statement_of_every_file() -> None:
    listed = json.loads(invoke("sql", "list", "--json"))["statements"]
    assert [s["name"] for s in listed] == NAMES
    headings = set()
    for path in SQL_DIR.glob("*.sql"):
        text = path.read_text()
        names = re.findall(r"^-- (?:name|variant): ([a-z_]+)", text, re.M)
        headings |= set(names)
        owned = {s["name"] for s in listed if s["owner"] == path.stem}
        assert owned == set(names), path.name
        assert all(s["file"] == f"brooq/sql/{path.name}" for s in listed if s["name"] in owned)
    assert headings == set(NAMES)
    by_name = {s["name"]: s for s in listed}
    assert by_name[f"{CLAIM}_limited"]["template"] == CLAIM
    assert by_name[f"{CLAIM}_limited"]["flags"] == ["limited", "queues"]
    assert by_name["job_get_held"]["template"] is None
    assert by_name["job_get_held"]["description"] == (
        "The job a dead worker was running, if it still holds it."
    )
    text = invoke("sql", "list")
    for name in NAMES:
        assert re.search(rf"^{name} ", text, re.M), name
    assert f"{len(NAMES)} statements" in text


@pytest.mark.parametrize("schema", [None, "brooq_x"])
def test_show_prints_each_statement_as_the_process_holds_it(schema: str | None) -> None:
    held = queries(schema)
    env = {"QUEUE_SCHEMA": schema} if schema else None
    for name in NAMES:
        assert invoke("sql", "show", name, env=env) == getattr(held, name) + "\n", name
    # --schema wins over QUEUE_SCHEMA, as for every command.
    shown = invoke("--schema", "other", "sql", "show", "job_get_held", env={"QUEUE_SCHEMA": "x"})
    assert shown == queries("other").job_get_held + "\n"
    assert 'FROM "other"."job"' in shown


@pytest.mark.parametrize("schema", [None, "brooq_x"])
def test_the_claims_flags_show_the_text_the_worker_sends(schema: str | None) -> None:
    statements = worker_statements(schema)
    assert set(statements) == set(_STATEMENTS)
    by_name = {s.name: s for s in catalog()}
    chosen: set[str] = set()
    prefix = ["--schema", schema] if schema else []
    for shape, names in _STATEMENTS.items():
        for name, sent in zip(names, statements[shape], strict=True):
            flags = [a for f in sorted(by_name[name].flags) for a in ("--flag", f)]
            assert invoke(*prefix, "sql", "show", CLAIM, *flags) == sent + "\n", (shape, name)
            chosen.add(name)
    # Every variant of the template is one a worker picks; --all-variants shows each.
    variants = [s.name for s in catalog() if s.template == CLAIM]
    assert set(variants) == chosen
    shown = json.loads(invoke(*prefix, "sql", "show", CLAIM, "--all-variants", "--json"))
    texts = {s["name"]: s["text"] for s in shown["statements"]}
    assert list(texts) == variants
    assert all(texts[n] == getattr(queries(schema), n) for n in variants)
    text = invoke("sql", "show", CLAIM, "--all-variants")
    assert text.count("-- ==== ") == len(variants)
    assert f"-- ==== {CLAIM}_limited (flags: limited, queues) ====" in text
    # No flag: what a master working one queue, no limits, sends.
    assert invoke(*prefix, "sql", "show", CLAIM) == statements["one"][0] + "\n"
    assert invoke("sql", "show", CLAIM, "--flag", "queues,limited") == (
        queries(None).job_finish_and_claim_limited + "\n"
    )


def test_a_template_alone_is_its_variant_without_flags() -> None:
    assert invoke("sql", "show", "limits_held") == queries(None).topic_limits_held + "\n"
    shown = json.loads(invoke("sql", "show", "job_held_by_topic", "--all-variants", "--json"))
    assert [s["name"] for s in shown["statements"]] == ["topic_limits_held", "job_held_by_topic"]


def test_as_sent_is_what_psycopg_sends() -> None:
    held = queries(None)
    converted = 0
    for name in NAMES:
        text = getattr(held, name)
        if not re.search(r"%\(\w+\)[sbt]", text):
            assert sent_text(text) == text  # run without parameters: sent as written
            continue
        names = dict.fromkeys(re.findall(r"%\((\w+)\)", text))
        query = PostgresQuery(Transformer())
        query.convert(text, {n: None for n in names})
        assert sent_text(text) == query.query.decode(), name
        converted += 1
    assert converted > 50
    shown = invoke("sql", "show", "job_get_held", "--as-sent")
    assert "WHERE id = $1 AND state = 'processing' AND locked_by = $2" in shown


def test_the_reference_page_is_current() -> None:
    page = ROOT / "docs" / "reference" / "sql.md"
    assert page.read_text() == reference_page(), (
        "docs/reference/sql.md is stale: python -m brooq sql list --markdown > "
        "docs/reference/sql.md"
    )
    for name in NAMES:
        assert f"| `{name}` |" in page.read_text()


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (
            ["show", "claim"],
            "error: no statement or template named 'claim'; near matches: "
            "job_finish_and_claim, periodic_claim",
        ),
        (["show", "job_get_hld"], "near matches: job_get_held"),
        (["show", CLAIM, "--flag", "queue"], "has no flag 'queue'; its flags: coordinated, "),
        (["show", CLAIM, "--flag", "limited"], "the variants with them: job_finish_and_claim_"),
        (["show", "job_get_held", "--flag", "x"], "job_get_held is not a template"),
        (["show", CLAIM, "--flag", "queues", "--all-variants"], "do not go together"),
    ],
)
def test_a_bad_name_or_flag_is_one_line_and_exit_2(args: list[str], error: str) -> None:
    done = run("sql", *args)
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.count("\n") == 1 and error in done.stderr
    assert "Traceback" not in done.stderr


def test_show_needs_no_database() -> None:
    # A database configured but unreachable is never dialled.
    env = {"DATABASE_URL": "postgresql://nobody@127.0.0.1:1/none", "QUEUE_SCHEMA": "jobs"}
    done = run("sql", "show", "job_get_held", env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout == queries("jobs").job_get_held + "\n"


def _keys(value: Any) -> set[str]:
    return set(value) if isinstance(value, dict) else set()


def test_show_json_says_what_and_where() -> None:
    shown = json.loads(invoke("--schema", "jobs", "sql", "show", f"{CLAIM}_queues", "--json"))
    assert _keys(shown) == {"name", "file", "template", "flags", "schema", "text"}
    assert shown["file"] == "brooq/sql/child.sql"
    assert shown["flags"] == ["queues"] and shown["schema"] == "jobs"
