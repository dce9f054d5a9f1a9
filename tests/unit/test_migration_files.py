"""A no-transaction migration split into its statements: at each ';' that ends a line
outside quotes, dollar quotes and comments (brooq.schema.files.statements), so that a
function's $$ body stays whole; and every shipped file read so."""

from __future__ import annotations

from brooq.schema import files as migration_files
from brooq.schema.files import statements


def test_a_function_body_stays_whole() -> None:
    text = """
ALTER TABLE job ADD COLUMN x text;

-- a comment; with a semicolon;
CREATE FUNCTION f() RETURNS int LANGUAGE plpgsql AS $$
BEGIN
    RETURN 1;
END;
$$;

CREATE FUNCTION g() RETURNS int LANGUAGE sql AS $body$
    SELECT 2;
$body$;
SELECT 'it''s;
still one;'; -- the quote spans lines
SELECT 1; -- a ';' followed by a comment does not end a statement here
SELECT 2
"""
    assert statements(text) == [
        "ALTER TABLE job ADD COLUMN x text",
        "-- a comment; with a semicolon;\nCREATE FUNCTION f() RETURNS int LANGUAGE plpgsql AS "
        "$$\nBEGIN\n    RETURN 1;\nEND;\n$$",
        "CREATE FUNCTION g() RETURNS int LANGUAGE sql AS $body$\n    SELECT 2;\n$body$",
        "SELECT 'it''s;\nstill one;'; -- the quote spans lines\n"
        "SELECT 1; -- a ';' followed by a comment does not end a statement here\nSELECT 2",
    ]


def test_comment_only_pieces_go() -> None:
    assert statements("-- only a comment;\n") == []
    assert statements("SELECT 1;\n-- trailing\n") == ["SELECT 1"]


def test_the_shipped_no_transaction_files_split_into_whole_statements() -> None:
    for m in migration_files.load():
        if m.transactional:
            continue
        for part in (m.up, m.down):
            for statement in statements(part):
                assert statement.count("$$") % 2 == 0, (m.name, statement[:80])


def test_what_runs_outside_a_transaction_block() -> None:
    needs = migration_files.needs_autocommit
    assert needs("CREATE INDEX CONCURRENTLY i ON job (id)")
    assert needs("-- a batch per transaction\nCALL brooq_history_move_back(10000)")
    assert needs("VACUUM job")
    assert not needs("CREATE PROCEDURE p() LANGUAGE plpgsql AS $$ BEGIN CALL q(); END $$")
    assert not needs("SELECT 'CALL me' AS text")
    assert not needs("ALTER TABLE job ADD COLUMN concurrently_seen int")
