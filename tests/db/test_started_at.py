"""When each attempt started (job.started_at, migration 0019): set to the claim's time by
every claim door, whatever the variant of the claim statement (the sync and the async
child send the same), and by the database functions that claim a topic under
global_limit, rate_limit or group limits, which also start the attempt with no
progress; a retry's claim writes its own start. Each claim is the real statement against
a real PostgreSQL; the children's own claims are tests/process/test_started_at.py."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import psycopg
import pytest

import brooq
from brooq.declare.handlers import Handler
from brooq.sql import Q, catalog
from brooq.worker.floors import WHOLE
from brooq.worker.pacing import turns

Conn = psycopg.Connection[Any]

# The limited topic's options, per flag set: brooq_claim_limited for global_limit alone,
# brooq_claim_batch for a rate or a group limit.
LIMITS = {
    "limited": {"global_limit": 2},
    "coordinated": {"rate_limit": "100/s", "group_limit": 1},
}


@pytest.fixture
def db(connect: Callable[..., Conn]) -> Conn:
    return connect()


def _handler(topic: str, **options: Any) -> Handler:
    q = brooq.Queue(dsn="postgresql://x@127.0.0.1:1/x")
    q.handler(topic, **options)(lambda claim: None)
    return q.handlers[topic]


def _variants() -> list[Any]:
    found = [
        pytest.param(s.name, s.flags, id=s.name)
        for s in catalog()
        if s.template == "job_finish_and_claim"
    ]
    assert len(found) == 10, found  # the template's every variant is tried below
    return found


def _params(flags: frozenset[str], topic: str) -> dict[str, Any]:
    params: dict[str, Any] = {
        "done": [],
        "topics": [topic],
        "limit": 4,
        "children": 1,
        "worker": "h:1:w",
        "lease": 30.0,
        "queue": "default",
        "queues": ["default"],
    }
    if "floored" in flags:
        params.update(lows=[-32768], highs=[32767], floors=[WHOLE[0]], floor_ids=[WHOLE[1]])
    if "results" in flags:
        params.update(results=[], reported=[], fractions=[], messages=[])
    if "limited" in flags:
        kind = "coordinated" if "coordinated" in flags else "limited"
        [turn] = turns({topic: _handler(topic, **LIMITS[kind])})
        assert turn.shape == kind
        params.update(
            turn.params, topics=[], batch=4
        )  # the limited topic goes through its function
    return params


def _retry_of_an_earlier_attempt(db: Conn, topic: str) -> tuple[uuid.UUID, datetime]:
    """A job whose first attempt started an hour ago, reported 40 % and failed: due again
    a minute ago."""
    job_id = uuid.uuid4()
    row = db.execute(
        "INSERT INTO job (id, topic, state, attempts, available_at, started_at, updated_at, "
        "progress, progress_message, group_key) "
        "VALUES (%s, %s, 'failed', 1, now() - interval '1 minute', now() - interval '1 hour', "
        "now() - interval '59 minutes', 0.4, 'the first attempt''s', 'g') RETURNING started_at",
        (job_id, topic),
    ).fetchone()
    assert row is not None
    return job_id, row["started_at"]


@pytest.mark.parametrize(("name", "flags"), _variants())
def test_every_claim_sets_started_at_and_clears_the_progress(
    db: Conn, name: str, flags: frozenset[str]
) -> None:
    topic = "lim" if "limited" in flags else "t"
    job_id, earlier = _retry_of_an_earlier_attempt(db, topic)
    with db.transaction():
        rows = db.execute(getattr(Q, name), _params(flags, topic)).fetchall()
        now = db.execute("SELECT now() AS now").fetchone()
    assert [r["id"] for r in rows if r["claimed"]] == [job_id], name
    row = db.execute(
        "SELECT state, attempts, started_at, updated_at, progress, progress_message "
        "FROM job WHERE id = %s",
        (job_id,),
    ).fetchone()
    assert row is not None and now is not None
    assert (row["state"], row["attempts"]) == ("processing", 2)
    # The claim's own time (as updated_at), not the first attempt's: the retry keeps its
    # own start. The transaction's now(); a claim of a topic claimed apart in batches
    # writes its stamp, the clock time under the topic's lock that its rate windows'
    # places carry (a late start's give-back finds them by it), at or after now().
    if "coordinated" in flags:
        assert row["started_at"] == row["updated_at"] >= now["now"]
        assert row["started_at"] > earlier
    else:
        assert row["started_at"] == row["updated_at"] == now["now"] > earlier
    assert (row["progress"], row["progress_message"]) == (None, None)


@pytest.mark.parametrize("kind", ["limited", "coordinated"])
def test_a_limited_topics_retry_starts_with_no_progress_and_its_own_start(
    db: Conn, kind: str
) -> None:
    """The functions themselves (brooq_claim_limited, brooq_claim_batch), called as
    the claim statement calls them: the first attempt reports and fails, the retry's
    claim shows no progress and its own start; the history entry keeps the first's."""
    topic = f"lim.{kind}"
    params = _params(frozenset({"queues", "limited", kind}), topic)
    statement = getattr(Q, f"job_finish_and_claim_{kind}")
    job_id = uuid.uuid4()
    db.execute("INSERT INTO job (id, topic, group_key) VALUES (%s, %s, 'g')", (job_id, topic))
    [first] = [r for r in db.execute(statement, params).fetchall() if r["claimed"]]
    assert first["id"] == job_id
    db.execute(  # the first attempt reports (as the master's progress tick writes it)
        "UPDATE job SET progress = 0.4, progress_message = 'first try' WHERE id = %s",
        (job_id,),
    )
    started = db.execute("SELECT started_at FROM job WHERE id = %s", (job_id,)).fetchone()
    assert started is not None and started["started_at"] is not None
    state = db.execute(
        Q.job_set_failed,
        {"id": job_id, "worker": "h:1:w", "refund": False, "max_attempts": 3, "delay": 0.0,
         "error": "E", "history_error": "E", "kind": "raised", "traceback": None},
    ).fetchone()  # fmt: skip
    assert state is not None and state["state"] == "failed"
    failed = db.execute(
        "SELECT progress, progress_message, errors FROM job WHERE id = %s", (job_id,)
    ).fetchone()
    assert failed is not None and (failed["progress"], failed["progress_message"]) == (
        0.4,
        "first try",
    )  # the failed attempt's report stays on the row until the retry's claim
    [second] = [r for r in db.execute(statement, params).fetchall() if r["claimed"]]
    assert (second["id"], second["attempts"]) == (job_id, 2)
    row = db.execute(
        "SELECT progress, progress_message, started_at, updated_at, errors FROM job WHERE id = %s",
        (job_id,),
    ).fetchone()
    assert row is not None
    assert (row["progress"], row["progress_message"]) == (None, None)
    assert row["started_at"] == row["updated_at"] > started["started_at"]
    assert datetime.fromisoformat(row["errors"][0]["started_at"]) == started["started_at"]


def test_a_claim_leaves_started_at_of_rows_it_does_not_claim(db: Conn) -> None:
    """Only the rows claimed are written: a done job keeps the start of its last attempt,
    and a job not yet claimed has none."""
    done = uuid.uuid4()
    db.execute(
        "INSERT INTO job (id, topic, state, attempts, started_at, updated_at) "
        "VALUES (%s, 't', 'done', 1, now() - interval '2 minutes', now() - interval '1 minute')",
        (done,),
    )
    waiting = uuid.uuid4()
    db.execute(
        "INSERT INTO job (id, topic, available_at) VALUES (%s, 't', now() + interval '1 hour')",
        (waiting,),
    )
    assert db.execute(Q.job_finish_and_claim, _params(frozenset(), "t")).fetchall() == []
    rows = db.execute(
        "SELECT id, now() - started_at AS ago FROM job ORDER BY created_at"
    ).fetchall()
    ago = {r["id"]: r["ago"] for r in rows}
    assert ago[waiting] is None
    assert ago[done] >= timedelta(minutes=2)
