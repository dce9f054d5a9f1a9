"""No content of a job can make brooq's own outcome write fail.

A handler's exception whose text holds a NUL or a lone surrogate, a CancelJob carrying
one, an exception whose str() raises, and on a LATIN1 database a character LATIN1 lacks,
in an error or in a result: each is written as a faithful, bounded rendering, the job is
charged its own attempts and ends dead (or canceled) with a readable last_error, the
child lives on, and the jobs beside it (in the same batch, or the same async child) run
once each. The pure part (storable, describe) is unit-tested in
tests/unit/worker/test_execute.py.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

import brooq
from brooq.worker import execute
from tests.harness import MasterProcess, prepare, wait_for

APP = "brooq_poisonapp:queue"
ASYNC_APP = "brooq_poisonapp:aio"


# -- under a real master ----------------------------------------------------------------


def _job(db: psycopg.Connection[Any], job_id: uuid.UUID) -> tuple[str, int, str | None]:
    row = db.execute(
        "SELECT state, attempts, last_error FROM job_all WHERE id = %s", (job_id,)
    ).fetchone()
    assert row is not None
    return row[0], row[1], row[2]


def _runs(db: psycopg.Connection[Any]) -> dict[uuid.UUID, int]:
    rows = db.execute("SELECT job_id, count(*) FROM execution GROUP BY job_id").fetchall()
    return {r[0]: r[1] for r in rows}


def _settled(db: psycopg.Connection[Any], ids: list[uuid.UUID]) -> bool:
    row = db.execute(
        "SELECT count(*) FROM job_all WHERE id = ANY(%s) AND state IN ('done', 'dead', 'canceled')",
        (ids,),
    ).fetchone()
    return row is not None and row[0] == len(ids)


def _assert_master_unharmed(m: MasterProcess) -> None:
    assert m.proc.poll() is None, "the master exited"
    log = m.log()
    assert "event=child_crashed" not in log
    assert "event=child_exited" not in log  # no child died or was replaced


def test_poisoned_errors_are_written_and_charged_to_their_own_job(
    start_master: Callable[..., MasterProcess], queue: brooq.Queue, db: psycopg.Connection[Any]
) -> None:
    kinds = ["nul", "surrogate", "cancel", "unprintable"]
    poisoned = {k: queue.enqueue(brooq.Job("p.fail", {"kind": k}))[0] for k in kinds}
    fine = [queue.enqueue(brooq.Job("p.ok", {"n": i}))[0] for i in range(30)]
    m = start_master(workers=1, app=APP)
    wait_for(lambda: _settled(db, [*poisoned.values(), *fine]), timeout=30, what="all settled")
    expected = {
        "nul": ("dead", 2, "ValueError: before\\x00after"),
        "surrogate": ("dead", 2, "ValueError: lone \\udc80 surrogate"),
        "cancel": ("canceled", 1, "CancelJob: stop\\x00here"),
        "unprintable": ("dead", 2, "Unprintable: <str() raised RuntimeError>"),
    }
    runs = _runs(db)
    for kind, job_id in poisoned.items():
        state, attempts, error = _job(db, job_id)
        want_state, want_attempts, want_error = expected[kind]
        assert (state, attempts) == (want_state, want_attempts), kind
        assert error is not None and error.endswith(want_error), (kind, error)
        assert runs[job_id] == want_attempts, kind  # its own attempts, not more
    errors = db.execute("SELECT errors FROM job_all WHERE id = %s", (poisoned["nul"],)).fetchone()
    assert (
        errors is not None
        and [e["error"] for e in errors[0]] == ["ValueError: before\\x00after"] * 2
    )
    assert all(_job(db, i)[0] == "done" and runs[i] == 1 for i in fine)
    _assert_master_unharmed(m)


def test_a_latin1_database_gets_escapes_for_what_it_lacks(
    start_master: Callable[..., MasterProcess], latin1_dsn: str
) -> None:
    prepare(latin1_dsn)
    q = brooq.Queue(latin1_dsn)
    try:
        euro = q.enqueue(brooq.Job("p.fail", {"kind": "euro"}))[0]
        # Results in the batched `done` of a round trip: one LATIN1 cannot hold among
        # others it can, so the whole statement is refused and written apart.
        bad_result = q.enqueue(brooq.Job("p.result", {"euro": True}))[0]
        good_results = [q.enqueue(brooq.Job("p.result", {"s": f"é{i}"}))[0] for i in range(20)]
        fine = [q.enqueue(brooq.Job("p.ok"))[0] for _ in range(20)]
        m = start_master(workers=1, app=APP, dsn=latin1_dsn)
        with psycopg.connect(latin1_dsn, autocommit=True) as db:
            ids = [euro, bad_result, *good_results, *fine]
            wait_for(lambda: _settled(db, ids), timeout=30, what="all settled")
            runs = _runs(db)
            state, attempts, error = _job(db, euro)
            assert (state, attempts) == ("dead", 2) and runs[euro] == 2
            assert error == "ValueError: costs 5 \\u20ac au café"  # what LATIN1 lacks, escaped
            state, attempts, error = _job(db, bad_result)
            assert (state, attempts) == ("dead", 2) and runs[bad_result] == 2
            assert error is not None and error.startswith("result not stored: ")
            assert "LATIN1" in error
        for i, job_id in enumerate(good_results):
            record = q.get(job_id)
            assert record is not None and record.state == "done"
            assert record.result == {"s": f"é{i}"} and runs[job_id] == 1
        assert all(runs[i] == 1 for i in fine)
        _assert_master_unharmed(m)
    finally:
        q.close()


def test_a_poisoned_async_job_leaves_its_siblings_alone(
    start_master: Callable[..., MasterProcess], queue: brooq.Queue, db: psycopg.Connection[Any]
) -> None:
    siblings = [queue.enqueue(brooq.Job("a.ok", {"s": 0.2}))[0] for _ in range(400)]
    poisoned = [
        queue.enqueue(brooq.Job("a.fail", {"kind": k}))[0]
        for k in ("nul", "surrogate", "cancel", "unprintable")
    ]
    m = start_master(workers=1, app=ASYNC_APP, args=("--concurrency", "100"))
    wait_for(lambda: _settled(db, [*siblings, *poisoned]), timeout=60, what="all settled")
    runs = _runs(db)
    assert all(_job(db, i)[0] == "done" for i in siblings)
    assert sorted({runs[i] for i in siblings}) == [1]  # each sibling ran once
    states = [_job(db, i)[:2] for i in poisoned]
    assert states == [("dead", 2), ("dead", 2), ("canceled", 1), ("dead", 2)]
    assert [runs[i] for i in poisoned] == [2, 2, 1, 2]
    _assert_master_unharmed(m)


def test_a_child_dying_while_writing_an_outcome_charges_that_job(
    start_master: Callable[..., MasterProcess], queue: brooq.Queue, db: psycopg.Connection[Any]
) -> None:
    """The master cannot read a crash in the write from the job's board slot (the handler
    has returned); the board's settling mark names the job: it is charged its attempts
    and ends dead, the death is not taken for a crash outside any job (five of those in
    a row end the master), and the jobs beside it are not charged."""
    doomed = queue.enqueue(brooq.Job("p.hook_exit"))[0]
    fine = [queue.enqueue(brooq.Job("p.ok", {"n": i}))[0] for i in range(20)]
    m = start_master(workers=1, app=APP)
    wait_for(lambda: _settled(db, [doomed, *fine]), timeout=30, what="all settled")
    state, attempts, error = _job(db, doomed)
    assert (state, attempts) == ("dead", 2)
    assert error == "worker exited with status 7 while writing this job's outcome"
    runs = _runs(db)
    assert runs[doomed] == 2
    # The jobs beside it are never charged: each done with its one attempt. One that had
    # finished in the same batch, its `done` still to be written with the next claim,
    # went back with the child and ran again (at least once).
    assert all(_job(db, i)[:2] == ("done", 1) and runs[i] <= 2 for i in fine)
    assert m.proc.poll() is None and "master_fatal" not in m.log()


def test_the_codec_is_the_databases_own(dsn: str, latin1_dsn: str) -> None:
    from brooq.dsn import server_codec

    with psycopg.connect(dsn) as conn:
        assert server_codec(conn) is None  # UTF8: nothing to escape but NUL and surrogates
    with psycopg.connect(latin1_dsn) as conn:
        assert server_codec(conn) == "iso8859-1"
    assert execute.storable("café €", "iso8859-1") == "café \\u20ac"


@pytest.mark.parametrize("codec", [None, "iso8859-1"])
def test_the_escapes_fit_a_real_database(codec: str | None, dsn: str, latin1_dsn: str) -> None:
    """What storable gives is what the server takes, in last_error and the history."""
    target = latin1_dsn if codec else dsn
    text = execute.storable("x\x00 \udc80 € 中 é", codec)
    with psycopg.connect(target, autocommit=True, client_encoding="UTF8") as conn:
        got = conn.execute(
            "SELECT %s::text, jsonb_build_object('e', %s::text)->>'e'", (text, text)
        ).fetchone()
    assert got == (text, text)
