"""The lease renewal that carries progress (job_renew_leases_progress): each held job's
last report written with its lease, a job without one left as it is, and the plain
statement when no held job reported."""

from __future__ import annotations

import uuid
from typing import Any

import psycopg

from brooq.sql import Q
from brooq.supervisor import maintenance


def _job(db: psycopg.Connection[Any], worker: str) -> uuid.UUID:
    job_id = uuid.uuid4()
    db.execute(
        "INSERT INTO job (id, topic, state, attempts, locked_by, locked_until) "
        "VALUES (%s, 't', 'processing', 1, %s, now() + interval '1 second')",
        (job_id, worker),
    )
    return job_id


def _progress(db: psycopg.Connection[Any], job_id: uuid.UUID) -> tuple[Any, ...] | None:
    return db.execute(
        "SELECT progress, progress_message, locked_until > now() + interval '20 seconds' "
        "FROM job WHERE id = %s",
        (job_id,),
    ).fetchone()


def test_renewal_writes_the_reports_it_is_given(db: psycopg.Connection[Any]) -> None:
    a, b, c = _job(db, "w1"), _job(db, "w1"), _job(db, "w2")
    held = [(a, "w1"), (b, "w1"), (c, "w1")]  # c is someone else's: not renewed
    reports = {a: (0.5, "résumé, half"), c: (0.9, "not ours")}
    assert maintenance.renew_leases(db, held, 30, Q, reports) == {a, b}
    assert _progress(db, a) == (0.5, "résumé, half", True)
    assert _progress(db, b) == (None, None, True)  # renewed, no report
    assert _progress(db, c) == (None, None, False)  # not its holder: untouched
    # A renewal without reports keeps what the row has; a later report replaces it.
    assert maintenance.renew_leases(db, held[:2], 30, Q, {}) == {a, b}
    assert _progress(db, a) == (0.5, "résumé, half", True)
    assert maintenance.renew_leases(db, held[:2], 30, Q, {a: (1.0, "")}) == {a, b}
    assert _progress(db, a) == (1.0, "", True)
    # Reports of jobs this renewal does not hold: the plain statement, nothing written.
    assert maintenance.renew_leases(db, [(b, "w1")], 30, Q, {uuid.uuid4(): (0.1, "x")}) == {b}
    assert _progress(db, b) == (None, None, True)
