"""Queue.enqueue's own connection (brooq/producer/line.py) against a real PostgreSQL: the
row it writes is the pool path's row, every call is one execution of its prepared
statement, a busy line or a taken key falls back to the pool, and a connection the
server ended, lost mid-statement, or refused is handled as the pool's would be."""

from __future__ import annotations

import threading
import time
import uuid
from datetime import datetime, timedelta, timezone
from typing import Any
from zoneinfo import ZoneInfo

import psycopg
import pytest
from psycopg.rows import dict_row

import brooq
from brooq import migrate
from brooq.errors import DatabaseUnavailable
from brooq.producer import line as enqueue_line
from brooq.producer import poolcheck
from tests.harness import terminate_backend


def _line_conn(queue: brooq.Queue) -> psycopg.Connection[Any]:
    assert queue._line is not None and queue._line._conn is not None
    return queue._line._conn


def _executions(queue: brooq.Queue) -> int:
    """How many times the line's prepared statement ran (PostgreSQL counts each plan)."""
    row = (
        _line_conn(queue)
        .execute(
            "SELECT generic_plans + custom_plans FROM pg_prepared_statements WHERE name = %s",
            (enqueue_line.STATEMENT.decode(),),
        )
        .fetchone()
    )
    assert row is not None, "the line's statement is not prepared"
    return int(row[0])


def _row(db: psycopg.Connection[Any], job_id: uuid.UUID) -> dict[str, Any]:
    cur = db.cursor(row_factory=dict_row)
    row = cur.execute(
        "SELECT topic, payload, idempotency_key, available_at, queue, priority, state, "
        "attempts FROM job_all WHERE id = %s",
        (job_id,),
    ).fetchone()
    assert row is not None
    return row


def test_every_field_is_written_as_the_pool_path_writes_it(
    queue: brooq.Queue, db: psycopg.Connection[Any]
) -> None:
    queue.handler("line.declared", queue="mail")(lambda claim: None)
    at = datetime(2031, 3, 29, 2, 30, 0, 123456, tzinfo=ZoneInfo("Europe/Berlin"))
    jobs = [
        brooq.Job("line.plain"),
        brooq.Job(
            "line.full",
            {"name": "Zoë", "n": [1, 2.5, None, True], "nested": {"a": "\\u0000 text"}},
            idempotency_key="key-ü-1",
            available_at=at,
            queue="reports",
            priority=-32768,
        ),
        brooq.Job("line.declared", "just a string", priority=32767),
        brooq.Job("line.past", available_at=datetime(1990, 1, 1, tzinfo=timezone.utc)),
    ]
    for job in jobs:
        job_id, created = queue.enqueue(job)
        assert created is True and job_id.version == 7
        assert queue._line is not None
        with queue._line._lock:  # the line busy: the same job through the pool's path
            other, _ = queue.enqueue(
                brooq.Job(
                    job.topic,
                    job.payload,
                    idempotency_key=None if job.idempotency_key is None else "other",
                    available_at=job.available_at,
                    queue=job.queue,
                    priority=job.priority,
                )
            )
        mine, theirs = _row(db, job_id), _row(db, other)
        if job.idempotency_key is not None:
            assert mine.pop("idempotency_key") == "key-ü-1"
            theirs.pop("idempotency_key")
        if job.available_at is None:  # now(): each its own
            assert abs(mine.pop("available_at") - theirs.pop("available_at")) < timedelta(seconds=5)
        assert mine == theirs
    assert _row(db, queue.enqueue(jobs[1])[0])["queue"] == "reports"
    full = _row(db, queue.enqueue(brooq.Job("line.x", available_at=at))[0])
    assert full["available_at"] == at.astimezone(timezone.utc)  # the instant, to the µs


def test_each_enqueue_is_one_execution_of_the_prepared_statement(queue: brooq.Queue) -> None:
    queue.enqueue(brooq.Job("line.warm"))
    before = _executions(queue)
    for i in range(25):
        queue.enqueue(brooq.Job("line.count", {"i": i}))
    assert _executions(queue) - before == 25
    assert queue._pools._pool is None  # the pool was never needed


def test_a_taken_key_answers_the_existing_job_through_the_pool(
    queue: brooq.Queue, db: psycopg.Connection[Any]
) -> None:
    first, created = queue.enqueue(brooq.Job("line.key", idempotency_key="k"))
    assert created is True
    again, created = queue.enqueue(brooq.Job("line.key", {"other": 1}, idempotency_key="k"))
    assert (again, created) == (first, False)
    assert db.execute("SELECT count(*) FROM job_all WHERE topic = 'line.key'").fetchone() == (1,)


def test_a_busy_line_sends_the_enqueue_through_the_pool(queue: brooq.Queue) -> None:
    queue.enqueue(brooq.Job("line.warm"))
    line = queue._line
    assert line is not None
    before = _executions(queue)
    with line._lock:  # another thread's enqueue in flight
        job_id, created = queue.enqueue(brooq.Job("line.busy"))
    assert created is True and queue.get(job_id) is not None
    assert queue._pools._pool is not None and queue._pools._pool.get_stats()["requests_num"] >= 1
    assert _executions(queue) == before  # not through the line


def test_threads_enqueueing_at_once_lose_nothing(
    queue: brooq.Queue, db: psycopg.Connection[Any]
) -> None:
    queue.enqueue(brooq.Job("line.warm"))
    before = _executions(queue)
    ids: list[uuid.UUID] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def produce(n: int) -> None:
        try:
            mine = [queue.enqueue(brooq.Job("line.t", {"t": n, "i": i}))[0] for i in range(150)]
            with lock:
                ids.extend(mine)
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=produce, args=(n,)) for n in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert len(set(ids)) == 900
    assert db.execute("SELECT count(*) FROM job_all WHERE topic = 'line.t'").fetchone() == (900,)
    # Six threads on one line: some enqueues found it busy and took the pool (with 900
    # calls whose I/O releases the GIL, some always do; 678 of 900 in one run).
    assert 0 < _executions(queue) - before < 900


def test_a_line_connection_the_server_ended_is_replaced_before_the_next_enqueue(
    queue: brooq.Queue, connect: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(poolcheck, "IDLE_CHECK_S", 3600.0)  # only the socket can tell
    queue.enqueue(brooq.Job("line.t"))
    pid = _line_conn(queue).info.backend_pid
    terminate_backend(connect(autocommit=True), pid)
    job_id, created = queue.enqueue(brooq.Job("line.t"))  # not DatabaseUnavailable
    assert created is True and queue.get(job_id) is not None
    assert _line_conn(queue).info.backend_pid != pid
    assert _executions(queue) == 1  # prepared again on the new connection


def test_an_idle_line_gets_the_round_trip_and_a_busy_one_only_the_look(
    queue: brooq.Queue, connect: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(poolcheck, "IDLE_CHECK_S", 3600.0)
    queue.enqueue(brooq.Job("line.t"))
    line = queue._line
    assert line is not None
    checks: list[int] = []  # each time the line found its connection suspect
    real_ready = line._ready
    monkeypatch.setattr(line, "_ready", lambda: checks.append(1) or real_ready())
    pid = _line_conn(queue).info.backend_pid
    queue.enqueue(brooq.Job("line.t"))
    assert checks == []  # used a moment ago, nothing to read: no round trip
    monkeypatch.setattr(poolcheck, "IDLE_CHECK_S", 0.0)
    time.sleep(0.01)
    queue.enqueue(brooq.Job("line.t"))
    assert checks == [1]  # idle longer than IDLE_CHECK_S: the round trip
    assert _line_conn(queue).info.backend_pid == pid  # it answered: the connection kept
    monkeypatch.setattr(poolcheck, "IDLE_CHECK_S", 3600.0)
    terminate_backend(connect(autocommit=True), pid)
    queue.enqueue(brooq.Job("line.t"))
    assert checks == [1, 1]  # the FATAL message / end of stream waited on the socket
    assert _line_conn(queue).info.backend_pid != pid


def test_a_session_lost_during_the_statement_is_unreachable_then_recovers(
    queue: brooq.Queue, connect: Any
) -> None:
    queue.enqueue(brooq.Job("line.t"))
    pid = _line_conn(queue).info.backend_pid
    admin = connect(autocommit=True)
    blocker = connect(autocommit=False)
    blocker.execute("LOCK TABLE job IN EXCLUSIVE MODE")  # the INSERT waits for it
    killer = threading.Timer(0.5, terminate_backend, (admin, pid))
    killer.start()
    try:
        with pytest.raises(DatabaseUnavailable, match="cannot reach the database"):
            queue.enqueue(brooq.Job("line.lost"))
    finally:
        killer.join()
        blocker.rollback()
    job_id, created = queue.enqueue(brooq.Job("line.after"))
    assert created is True and queue.get(job_id) is not None
    assert _line_conn(queue).info.backend_pid != pid


def test_an_answer_from_a_live_server_keeps_its_type_and_the_line(dsn: str, connect: Any) -> None:
    q = brooq.Queue(with_options(dsn, "-c lock_timeout=200ms"))
    try:
        q.enqueue(brooq.Job("line.t"))
        pid = _line_conn(q).info.backend_pid
        blocker = connect(autocommit=False)
        blocker.execute("LOCK TABLE job IN EXCLUSIVE MODE")
        with pytest.raises(psycopg.errors.LockNotAvailable):
            q.enqueue(brooq.Job("line.waits"))
        blocker.rollback()
        assert q.enqueue(brooq.Job("line.t"))[1] is True
        assert _line_conn(q).info.backend_pid == pid  # the same connection, still good
    finally:
        q.close()


def with_options(dsn: str, options: str) -> str:
    return psycopg.conninfo.make_conninfo(dsn, options=options)


def test_an_unmigrated_database_says_to_migrate_and_works_once_migrated(empty_dsn: str) -> None:
    q = brooq.Queue(empty_dsn)
    try:
        with pytest.raises(brooq.BrooqError, match="migrate"):
            q.enqueue(brooq.Job("line.t"))
        migrate.up(empty_dsn)
        job_id, created = q.enqueue(brooq.Job("line.t"))
        assert created is True and q.get(job_id) is not None
    finally:
        q.close()


def test_close_ends_the_line_and_the_next_enqueue_opens_another(queue: brooq.Queue) -> None:
    queue.enqueue(brooq.Job("line.t"))
    conn = _line_conn(queue)
    queue.close()
    assert conn.closed and queue._line is None
    assert queue.enqueue(brooq.Job("line.t"))[1] is True


def test_a_latin1_database_keeps_what_it_can_hold_and_refuses_the_rest(latin1_dsn: str) -> None:
    """brooq's connections talk UTF-8 (dsn.CLIENT_ENCODING) whatever the database's
    encoding: the server converts, so what LATIN1 holds is stored and read back as given
    on every path (psycopg decodes jsonb as UTF-8 whatever the connection's encoding),
    and what it cannot hold is refused by the server, naming the character, with nothing
    written."""
    q = brooq.Queue(latin1_dsn)
    try:
        job_id, _ = q.enqueue(brooq.Job("line.l1", {"s": "café"}, idempotency_key="clé"))
        with psycopg.connect(latin1_dsn) as conn:  # the database holds LATIN1 text
            row = conn.execute(
                "SELECT payload->>'s' = 'café', idempotency_key, "
                "convert_to(payload->>'s', 'LATIN1') FROM job_all WHERE id = %s",
                (job_id,),
            ).fetchone()
        assert row == (True, "clé", b"caf\xe9")
        record = q.get(job_id)  # read back through brooq: decodes
        assert record is not None and record.payload == {"s": "café"}
        assert q.list_jobs(topic="line.l1")[0].payload == {"s": "café"}
        again, created = q.enqueue(brooq.Job("line.l1", {"s": "x"}, idempotency_key="clé"))
        assert (again, created) == (job_id, False)  # the pool's path finds the key
        with pytest.raises(psycopg.errors.UntranslatableCharacter, match="LATIN1"):
            q.enqueue(brooq.Job("line.l1", {"s": "€"}))
        with pytest.raises(psycopg.errors.UntranslatableCharacter), q.transaction() as conn:
            brooq.enqueue(conn, brooq.Job("line.l1", {"s": "€"}))
        with pytest.raises(psycopg.errors.UntranslatableCharacter):
            q.enqueue_many([brooq.Job("line.l1", {"s": "ok"}), brooq.Job("line.l1", {"s": "€"})])
        assert q.enqueue(brooq.Job("line.l1", {"s": "ok"}))[1] is True
        with psycopg.connect(latin1_dsn) as conn:
            assert conn.execute("SELECT count(*) FROM job_all").fetchone() == (2,)
    finally:
        q.close()


def test_a_latin1_database_under_a_master(latin1_dsn: str, tmp_path: Any) -> None:
    """A child decodes the payload and writes its handler's result; the CLI reads both."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    from tests.harness import MasterProcess, prepare, wait_for

    prepare(latin1_dsn)
    q = brooq.Queue(latin1_dsn)
    m = MasterProcess(latin1_dsn, tmp_path / "m.log")
    try:
        job_id, _ = q.enqueue(brooq.Job("t.echo", {"s": "café ÿ"}))
        wait_for(lambda: q.get(job_id).state == "done", what="done")  # type: ignore[union-attr]
        done = q.get(job_id)
        assert done is not None and done.result == {"s": "café ÿ"}, done
        listed = subprocess.run(
            [
                sys.executable,
                "-m",
                "brooq",
                "--database",
                latin1_dsn,
                "jobs",
                "show",
                str(job_id),
                "--json",
            ],
            capture_output=True,
            text=True,
            timeout=60,
            env={k: v for k, v in os.environ.items() if not k.startswith("QUEUE_")},
            cwd=Path(__file__).resolve().parents[2],
        )
        assert listed.returncode == 0, listed.stderr
        shown = json.loads(listed.stdout)
        assert shown["payload"] == {"s": "café ÿ"} and shown["result"] == {"s": "café ÿ"}
    finally:
        m.stop()
        q.close()
    assert "event=db_error" not in m.log()


def test_a_fork_while_an_enqueue_holds_the_line_gives_the_child_a_line_of_its_own(
    queue: brooq.Queue,
) -> None:
    import os

    queue.enqueue(brooq.Job("line.t"))
    line = queue._line
    assert line is not None
    parent_backend = _line_conn(queue).info.backend_pid
    with line._lock, queue._pools.lock:  # a parent's thread mid-enqueue, mid-open at the fork
        pid = os.fork()
        if pid == 0:
            codes = [1]

            def child() -> None:
                queue.enqueue(brooq.Job("line.child"))
                conn = queue._line._conn if queue._line is not None else None
                if conn is None or conn.info.backend_pid == parent_backend:
                    codes.append(3)
                queue.get(uuid.uuid4())  # the pool opens: the open lock is free here
                queue.close()  # and does not wait for the parent's thread
                codes.append(0)

            try:
                worker = threading.Thread(target=child, daemon=True)
                worker.start()
                worker.join(10)  # a lock inherited held would hang it
                code = 5 if worker.is_alive() else 3 if 3 in codes else codes[-1]
            finally:
                os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert _line_conn(queue).info.backend_pid == parent_backend
    assert queue.enqueue(brooq.Job("line.t"))[1] is True
