"""What `brooq sql show` prints is what runs: every statement and every variant shown,
in the form psycopg sends it (``--as-sent``), is prepared by PostgreSQL (parsed and
analysed against brooq's tables, nothing executed) on a migrated database, with
brooq's relations unqualified and qualified by a schema of their own."""

from __future__ import annotations

import re
from collections.abc import Iterator

import psycopg
import pytest
from click.testing import CliRunner
from psycopg import pq, sql

from brooq import migrate
from brooq.cli import cli
from brooq.sql import catalog

# The statements the migrations compose further with psycopg.sql before running them
# (the placeholder ``{}``), filled here as brooq.migrate fills it.
COMPOSED = {"migration_create_schema", "migration_use_schema", "migration_drop_index"}


def shown(name: str, schema: str | None) -> str:
    args = ["--schema", schema] if schema else []
    result = CliRunner().invoke(
        cli, [*args, "sql", "show", name, "--as-sent"], env={"QUEUE_SCHEMA": None}
    )
    assert result.exit_code == 0, result.output
    assert result.output.endswith("\n")
    return result.output[:-1]


def composed(name: str, text: str, schema: str) -> str:
    filler: sql.Composable = sql.Identifier(schema)
    if name == "migration_use_schema":
        filler = sql.Literal(sql.Identifier(schema).as_string(None))
    elif name == "migration_drop_index":
        filler = sql.Identifier(schema, "job_ready")
    done = sql.SQL(text).format(filler).as_string(None)
    if name == "migration_use_schema":
        assert done == migrate._use_schema(schema).as_string(None)
    return done


@pytest.fixture
def schema_dsn(empty_dsn: str) -> Iterator[str]:
    migrate.up(empty_dsn, schema="brooq_x")
    yield empty_dsn


def prepare_all(dsn: str, schema: str | None, search_path: str | None) -> list[str]:
    """Each statement shown, prepared on one connection: the names it refused, with why."""
    refused: list[str] = []
    with psycopg.connect(dsn, autocommit=True) as conn:
        if search_path:
            conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(search_path)))
        for i, statement in enumerate(catalog()):
            text = shown(statement.name, schema)
            if "{}" in re.sub(r"'\{\}'", "", text):
                assert statement.name in COMPOSED, statement.name
                text = composed(statement.name, text, schema or "public")
            answer = conn.pgconn.prepare(f"brooq_s{i}".encode(), text.encode())
            if answer.status != pq.ExecStatus.COMMAND_OK:
                refused.append(f"{statement.name}: {(answer.error_message or b'').decode()}")
    return refused


def test_every_statement_shown_is_prepared_by_postgresql(dsn: str) -> None:
    assert prepare_all(dsn, None, None) == []


def test_every_statement_shown_for_a_schema_is_prepared_there(schema_dsn: str) -> None:
    # pg_catalog alone on the search_path: only the qualified names can find the tables.
    assert prepare_all(schema_dsn, "brooq_x", "pg_catalog") == []


def test_an_unqualified_statement_needs_the_tables_on_the_search_path(schema_dsn: str) -> None:
    # The check above can fail: unqualified, the same statements find no table there.
    refused = prepare_all(schema_dsn, None, "pg_catalog")
    assert any(r.startswith("job_finish_and_claim: ") and "job" in r for r in refused)
