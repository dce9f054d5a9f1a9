"""The commands that read, on a read target that is a standby behind its primary
(tests/pgpair.py, its replay paused while the primary writes on): `brooq jobs show` and
`jobs logs` of a job the standby has not replayed yet say they read a standby and how
far behind it is, and `brooq fleet` counts the masters alive as of what the standby
replayed, not as of its clock: a standby behind by more than three beats showed none.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

import brooq
from tests.ha.test_replica_reads import (
    NOWHERE,
    behind,
    brooq_cli,
    database,
    one_line_error,
    replay_paused,
    state_on,
)
from tests.harness import wait_for
from tests.pgpair import PostgresPair

__all__ = ["database"]  # the fixture, shared with test_replica_reads


@pytest.fixture(scope="module")
def pair() -> Iterator[PostgresPair]:
    with PostgresPair() as made:
        yield made


def lag_on(dsn: str) -> float:
    """How far behind the standby is (what brooq stats reads there)."""
    with psycopg.connect(dsn, connect_timeout=3) as conn:
        row = conn.execute(
            "SELECT extract(epoch FROM clock_timestamp() - pg_last_xact_replay_timestamp())"
        ).fetchone()
    assert row is not None
    return float(row[0] or 0)


def test_a_job_the_standby_lacks_is_said_to_be_read_on_a_standby(
    pair: PostgresPair, database: str
) -> None:
    primary, standby = pair.primary.dsn(database), pair.standby.dsn(database)
    queue = brooq.Queue(primary)
    try:
        first, _ = queue.enqueue(brooq.Job("lag.first"))
        wait_for(lambda: state_on(standby, first) == "pending", what="the job on the standby")
        reads = ("--database", NOWHERE, "--read-database-url", standby)
        with replay_paused(pair):
            second, _ = queue.enqueue(brooq.Job("lag.second"))
            wait_for(lambda: lag_on(standby) >= 1.0, what="the standby a second behind")
            line = one_line_error(brooq_cli(*reads, "jobs", "show", str(second)), 1)
            assert f"no job with id {second}" in line
            assert f"read from postgres@127.0.0.1:{pair.standby.port}/{database}" in line
            assert behind(line) >= 1.0
            line = one_line_error(brooq_cli(*reads, "jobs", "logs", str(second)), 1)
            assert str(second) in line and behind(line) >= 1.0
            # A job it has: no word of a standby.
            out = brooq_cli(*reads, "jobs", "show", str(first))
            assert out.returncode == 0 and "standby" not in out.stdout, out.stderr
        # On the primary, a job that does not exist is only that.
        missing = uuid.uuid4()
        line = one_line_error(brooq_cli("--database", primary, "jobs", "show", str(missing)), 1)
        assert line == f"error: no job with id {missing}"
    finally:
        queue.close()


def fleet(*args: str) -> dict[str, Any]:
    out = brooq_cli(*args, "fleet", "--json")
    assert out.returncode == 0, out.stderr
    found: dict[str, Any] = json.loads(out.stdout)
    return found


def test_the_fleet_on_a_standby_behind_counts_the_masters_it_replayed_alive(
    pair: PostgresPair, database: str
) -> None:
    primary, standby = pair.primary.dsn(database), pair.standby.dsn(database)
    with psycopg.connect(primary, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO brooq_master (id, host, pid, version, app, queues, topics, "
            "beat_seconds, started_at, seen_at) VALUES (%s, 'h', 1, '0', 'a:q', "
            "ARRAY['default'], ARRAY['t'], 1, now(), now())",
            (uuid.uuid4(),),
        )
    reads = ("--database", NOWHERE, "--read-database-url", standby)

    def replayed() -> bool:
        with psycopg.connect(standby, connect_timeout=3) as conn:
            try:
                return conn.execute("SELECT count(*) FROM brooq_master").fetchone() == (1,)
            except psycopg.errors.UndefinedTable:  # the migrations not all replayed yet
                return False

    wait_for(replayed, what="the master's row on the standby")
    queue = brooq.Queue(primary)
    try:
        with replay_paused(pair):
            with psycopg.connect(primary, autocommit=True) as conn:  # its next beat
                conn.execute("UPDATE brooq_master SET seen_at = now()")
            queue.enqueue(brooq.Job("t"))
            # The master's row, as the standby has it, is older than three of its beats
            # by the standby's clock: as of what the standby replayed, it is alive.
            wait_for(lambda: lag_on(standby) >= 4.0, timeout=30, what="the standby 4 s behind")
            masters = fleet(*reads)["masters"]
            assert [m["host"] for m in masters] == ["h"], masters
            out = brooq_cli(*reads, "fleet")
            assert out.returncode == 0, out.stderr
            last = out.stdout.splitlines()[-1]
            assert last.startswith(f"read from postgres@127.0.0.1:{pair.standby.port}/"), last
            assert behind(last) >= 4.0
    finally:
        queue.close()
