"""A master pointed at a database the server does not have: refused at start-up with one
line naming the database (nothing forked), while a server out of reach is still waited
for; and a server that comes up without that database ends the master."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from psycopg import conninfo

from tests.harness import StartMaster, wait_for
from tests.process.test_startup_checks import Gate, assert_refused_before_forking, run_master


def missing(dsn: str) -> tuple[str, str]:
    name = f"brooq_absent_{uuid.uuid4().hex[:8]}"
    return name, conninfo.make_conninfo(dsn, dbname=name)


def test_a_master_against_a_database_that_does_not_exist_refuses_to_start(dsn: str) -> None:
    name, absent = missing(dsn)
    code, err = run_master(absent)
    assert_refused_before_forking(code, err, f'the database "{name}" does not exist')
    assert err.startswith("brooq-master: cannot start: ")


@pytest.fixture
def gated_absent(dsn: str) -> Iterator[tuple[Gate, str, str]]:
    name, absent = missing(dsn)
    params = conninfo.conninfo_to_dict(absent)
    g = Gate(str(params.get("host") or "/var/run/postgresql"), int(params.get("port") or 5432))
    yield g, name, conninfo.make_conninfo(absent, host="127.0.0.1", port=str(g.port))
    g.close()


def test_a_server_out_of_reach_is_retried_and_one_without_the_database_ends_the_master(
    gated_absent: tuple[Gate, str, str], start_master: StartMaster
) -> None:
    g, name, gated = gated_absent
    master = start_master(dsn=gated)
    # Out of reach: not refused, the master starts and keeps trying.
    wait_for(lambda: master.log().count("event=db_error who=master") >= 2, 15, what="retries")
    assert master.proc.poll() is None
    g.open()
    code = master.wait(30)
    log = master.log()
    assert code == 3, log[-3000:]
    assert f'event=master_fatal reason=\'the database "{name}" does not exist' in log
