"""Supervision with real processes and real signals: timeouts, crashes, drain, reload,
scaling, recycling, orphans, several masters."""

from __future__ import annotations

import os
import signal
import textwrap
import time
from pathlib import Path

import psycopg

import brooq
from tests.harness import (
    StartMaster,
    executions,
    process_alive,
    states,
    wait_for,
)


def row(db: psycopg.Connection, job_id: object) -> tuple:  # type: ignore[type-arg]
    found = db.execute(
        "SELECT state, attempts, last_error FROM job_all WHERE id = %s", (job_id,)
    ).fetchone()
    assert found is not None
    return tuple(found)


def test_soft_timeout_raises_attempt_timeout_in_the_handler(
    queue: brooq.Queue, db: psycopg.Connection, start_master: StartMaster
) -> None:
    m = start_master(workers=1)
    job_id, _ = queue.enqueue(brooq.Job("t.soft"))
    wait_for(lambda: row(db, job_id)[0] == "dead", what="dead after soft timeout")
    _, attempts, error = row(db, job_id)
    assert attempts == 1 and error == "AttemptTimeout: attempt_timeout 0.3s exceeded"
    notes = db.execute("SELECT note FROM execution WHERE job_id = %s ORDER BY at", (job_id,))
    assert [n[0] for n in notes] == ["", "cleanup"]  # the handler could clean up
    m.signal(signal.SIGTERM)
    assert m.wait() == 0


def test_hung_handler_is_killed_and_the_slot_serves_the_next_job(
    queue: brooq.Queue, db: psycopg.Connection, start_master: StartMaster
) -> None:
    m = start_master(workers=1)
    first_child = m.wait_ready(1)[0]
    job_id, _ = queue.enqueue(brooq.Job("t.spin"))
    wait_for(lambda: row(db, job_id)[0] == "processing", what="spinning")
    started = time.monotonic()
    wait_for(lambda: row(db, job_id)[1:] != (1, None), timeout=10, what="first kill recorded")
    assert time.monotonic() - started < 1.5 + 1.5
    assert not process_alive(first_child)
    error = row(db, job_id)[2]
    assert error.startswith("killed: max_execution_timeout 1.5s exceeded (ran ")
    assert "brooq_testapp.py" in error and "in spin" in error  # where it was stuck
    # max_attempts=2: killed twice, then dead.
    wait_for(lambda: row(db, job_id)[0] == "dead", timeout=15, what="dead")
    assert row(db, job_id)[1] == 2 and executions(db, job_id) == 2
    # A fresh child took the slot and serves the next job.
    next_id, _ = queue.enqueue(brooq.Job("t.ok"))
    wait_for(lambda: row(db, next_id)[0] == "done", timeout=5, what="next job")
    assert "reason=max_execution_timeout" in m.log()
    m.signal(signal.SIGTERM)
    assert m.wait() == 0


def test_slot_replaced_within_a_second_of_the_kill(
    queue: brooq.Queue, db: psycopg.Connection, start_master: StartMaster
) -> None:
    m = start_master(workers=1)
    old = m.wait_ready(1)[0]
    queue.enqueue(brooq.Job("t.spin"))
    wait_for(lambda: not process_alive(old), timeout=10, what="killed")
    killed_at = time.monotonic()
    wait_for(lambda: m.children() and m.children() != [old], timeout=5, what="replacement")
    assert time.monotonic() - killed_at < 1.0


def test_crashing_jobs_end_dead_after_exactly_max_attempts(
    queue: brooq.Queue, db: psycopg.Connection, start_master: StartMaster
) -> None:
    exit_id, _ = queue.enqueue(brooq.Job("t.exit"))
    segv_id, _ = queue.enqueue(brooq.Job("t.segv"))
    kill_id, _ = queue.enqueue(brooq.Job("t.selfkill"))
    ok_id, _ = queue.enqueue(brooq.Job("t.ok"))
    m = start_master(workers=2)
    for job_id in (exit_id, segv_id, kill_id):
        wait_for(lambda job_id=job_id: row(db, job_id)[0] == "dead", timeout=20, what="dead")
    assert row(db, exit_id) == ("dead", 3, "worker exited with status 7")
    assert executions(db, exit_id) == 3
    assert row(db, segv_id) == ("dead", 2, "worker died: SIGSEGV")
    assert executions(db, segv_id) == 2
    assert row(db, kill_id) == ("dead", 2, "worker died: SIGKILL")
    assert row(db, ok_id)[0] == "done"
    assert m.proc.poll() is None  # crashes do not take the master down
    m.signal(signal.SIGTERM)
    assert m.wait() == 0


def test_sigkill_of_a_child_mid_job_loses_nothing(
    queue: brooq.Queue, db: psycopg.Connection, start_master: StartMaster
) -> None:
    m = start_master(workers=1)
    job_id, _ = queue.enqueue(brooq.Job("t.slow", {"seconds": 1}))
    pid = wait_for(
        lambda: db.execute("SELECT pid FROM execution WHERE job_id = %s", (job_id,)).fetchone(),
        what="the handler started",
    )
    os.kill(pid[0], signal.SIGKILL)
    wait_for(lambda: row(db, job_id)[0] == "done", timeout=20, what="done on retry")
    assert row(db, job_id)[1] == 2
    assert executions(db, job_id) == 2
    m.signal(signal.SIGTERM)
    assert m.wait() == 0


def test_drain_budget_exceeded_returns_the_job_with_the_attempt_refunded(
    queue: brooq.Queue, db: psycopg.Connection, start_master: StartMaster
) -> None:
    m = start_master(workers=2, env={"QUEUE_GRACEFUL_TIMEOUT": "1s"})
    job_id, _ = queue.enqueue(brooq.Job("t.slow", {"seconds": 30}))
    wait_for(lambda: executions(db, job_id) == 1, what="the handler started")
    sent = time.monotonic()
    m.signal(signal.SIGTERM)
    assert m.wait(timeout=10) == 1
    assert time.monotonic() - sent < 1 + 1.5
    state, attempts, _ = row(db, job_id)
    assert (state, attempts) == ("pending", 0)
    ready = db.execute(
        "SELECT available_at <= now() FROM job_all WHERE id = %s", (job_id,)
    ).fetchone()
    assert ready == (True,)  # claimable at once
    assert "jobs_returned=1" in m.log()


def test_sigquit_stops_at_once_and_returns_jobs(
    queue: brooq.Queue, db: psycopg.Connection, start_master: StartMaster
) -> None:
    m = start_master(workers=1)
    job_id, _ = queue.enqueue(brooq.Job("t.slow", {"seconds": 30}))
    wait_for(lambda: executions(db, job_id) == 1, what="the handler started")
    m.signal(signal.SIGQUIT)
    assert m.wait(timeout=5) == 1
    assert row(db, job_id)[:2] == ("pending", 0)


def test_sigkill_of_the_master_leaves_no_orphan_and_a_second_master_finishes(
    queue: brooq.Queue, db: psycopg.Connection, start_master: StartMaster
) -> None:
    ids = [queue.enqueue(brooq.Job("t.slow", {"seconds": 4}))[0] for _ in range(3)]
    first = start_master(workers=3)
    kids = first.wait_ready(3)
    wait_for(lambda: states(db).get("processing", 0) >= 2, what="jobs in flight")
    first.signal(signal.SIGKILL)
    first.wait(5)
    renew_period = 2 / 3
    wait_for(
        lambda: not any(process_alive(k) for k in kids),
        timeout=2 * renew_period + 0.5,
        what="children gone within two renewal periods",
    )
    second = start_master(workers=2)
    for job_id in ids:
        wait_for(lambda job_id=job_id: row(db, job_id)[0] == "done", timeout=20, what="done")
    second.signal(signal.SIGTERM)
    assert second.wait() == 0


def test_two_masters_share_the_work(
    queue: brooq.Queue, db: psycopg.Connection, start_master: StartMaster
) -> None:
    a = start_master(workers=2)
    b = start_master(workers=2)
    a.wait_ready(2)
    b.wait_ready(2)
    queue.enqueue_many([brooq.Job("t.ok", {"sleep": 0.01}) for _ in range(400)])
    wait_for(lambda: states(db) == {"done": 400}, timeout=60, what="all done")
    assert executions(db) == 400
    per_master = db.execute("SELECT count(DISTINCT pid) FROM execution").fetchone()
    assert per_master is not None and per_master[0] == 4
    for m in (a, b):
        m.signal(signal.SIGTERM)
    assert a.wait() == 0 and b.wait() == 0
    for m in (a, b):
        assert "level=error" not in m.log()


def test_sighup_reloads_changed_handler_code(
    queue: brooq.Queue, db: psycopg.Connection, start_master: StartMaster, tmp_path: Path
) -> None:
    app = tmp_path / "reloadable_app.py"

    def write(version: str) -> None:
        app.write_text(
            textwrap.dedent(
                f"""
                import os, psycopg, brooq
                queue = brooq.Queue()

                @queue.handler("t.version")
                def version(claim):
                    with psycopg.connect(os.environ["DATABASE_URL"], autocommit=True) as c:
                        c.execute("INSERT INTO execution (job_id, pid, attempt, note) "
                                  "VALUES (%s, %s, %s, %s)",
                                  (claim.id, os.getpid(), claim.attempt, "{version}"))
                """
            )
        )
        # Each version a later whole second than the last: a .pyc is checked against its
        # source's size and mtime in seconds, and v1 and v2 have the same size.
        later = time.time() + (2 if version == "v2" else 1)
        os.utime(app, (later, later))

    write("v1")
    m = start_master(workers=2, app="reloadable_app:queue", cwd=tmp_path)
    old = m.wait_ready(2)
    first, _ = queue.enqueue(brooq.Job("t.version"))
    wait_for(lambda: row(db, first)[0] == "done", what="v1 done")
    write("v2")
    m.signal(signal.SIGHUP)
    wait_for(lambda: "event=reload_done" in m.log(), what="reload done")
    wait_for(lambda: not any(process_alive(p) for p in old), what="old children gone")
    second, _ = queue.enqueue(brooq.Job("t.version"))
    wait_for(lambda: row(db, second)[0] == "done", what="v2 done")
    notes = dict(db.execute("SELECT job_id, note FROM execution").fetchall())
    assert notes == {first: "v1", second: "v2"}

    # A broken reload keeps the running workers.
    app.write_text("this is not python\n")
    os.utime(app, (time.time() + 3, time.time() + 3))
    running = m.children()
    m.signal(signal.SIGHUP)
    wait_for(lambda: "event=reload_failed" in m.log(), what="reload failed")
    third, _ = queue.enqueue(brooq.Job("t.version"))
    wait_for(lambda: row(db, third)[0] == "done", what="still served")
    assert all(process_alive(p) for p in running)
    m.signal(signal.SIGTERM)
    assert m.wait() == 0


def test_sigterm_to_a_child_just_forked_does_not_drain_the_master(
    queue: brooq.Queue, db: psycopg.Connection, start_master: StartMaster, tmp_path: Path
) -> None:
    """Between fork and the child's own signal set-up, the child still has the master's
    handlers and wakeup fd: a SIGTERM it got there (the master stopping a reload that
    failed, an operator's kill) used to reach the master's pipe and drain the master. The
    application's at-fork hook (libraries register them) makes that window wide here."""
    (tmp_path / "slow_fork_app.py").write_text(
        textwrap.dedent(
            """
            import os, time, brooq
            queue = brooq.Queue()
            os.register_at_fork(after_in_child=lambda: time.sleep(0.5))

            @queue.handler("t.forked")
            def forked(claim):
                pass
            """
        )
    )
    m = start_master(workers=1, app="slow_fork_app:queue", cwd=tmp_path)
    first = wait_for(m.children, what="a child forked")[0]
    os.kill(first, signal.SIGTERM)  # inside its at-fork hook
    wait_for(lambda: not process_alive(first), what="the child ended")
    job_id, _ = queue.enqueue(brooq.Job("t.forked"))
    wait_for(lambda: row(db, job_id)[0] == "done", what="a new child ran the job")
    assert "event=drain_started" not in m.log()
    m.signal(signal.SIGTERM)
    assert m.wait() == 0


def test_reload_loses_and_repeats_nothing(
    queue: brooq.Queue, db: psycopg.Connection, start_master: StartMaster
) -> None:
    m = start_master(workers=2)
    m.wait_ready(2)
    queue.enqueue_many([brooq.Job("t.ok", {"sleep": 0.02}) for _ in range(300)])
    for _ in range(3):
        time.sleep(0.4)
        m.signal(signal.SIGHUP)
        wait_for(lambda: m.log().count("event=reload_done") >= 1, what="reload")
    wait_for(lambda: states(db) == {"done": 300}, timeout=60, what="all done")
    assert executions(db) == 300
    m.signal(signal.SIGTERM)
    assert m.wait() == 0


def test_ttin_and_ttou_add_and_remove_a_child(start_master: StartMaster) -> None:
    m = start_master(workers=2)
    m.wait_ready(2)
    m.signal(signal.SIGTTIN)
    wait_for(lambda: len(m.children()) == 3, what="three children")
    # Signals of one kind sent back to back may merge into one: wait between them.
    m.signal(signal.SIGTTOU)
    wait_for(lambda: len(m.children()) == 2, what="two children")
    m.signal(signal.SIGTTOU)
    wait_for(lambda: len(m.children()) == 1, what="one child")
    m.signal(signal.SIGTERM)
    assert m.wait() == 0


def test_recycling_by_job_count(
    queue: brooq.Queue, db: psycopg.Connection, start_master: StartMaster
) -> None:
    m = start_master(workers=1, args=("--max-jobs-per-child", "3"))
    queue.enqueue_many([brooq.Job("t.ok") for _ in range(10)])
    wait_for(lambda: states(db) == {"done": 10}, timeout=30, what="done")
    per_pid = [n for _, n in db.execute("SELECT pid, count(*) FROM execution GROUP BY pid")]
    assert sorted(per_pid) == [1, 3, 3, 3]
    assert "reason=max_jobs" in m.log()
    m.signal(signal.SIGTERM)
    assert m.wait() == 0


def test_recycling_by_memory(
    queue: brooq.Queue, db: psycopg.Connection, start_master: StartMaster
) -> None:
    m = start_master(workers=1, args=("--max-memory-per-child", "80"))
    first, _ = queue.enqueue(brooq.Job("t.memory", {"mib": 120}))
    wait_for(lambda: row(db, first)[0] == "done", what="first done")
    second, _ = queue.enqueue(brooq.Job("t.ok"))
    wait_for(lambda: row(db, second)[0] == "done", what="second done")
    pids = db.execute("SELECT job_id, pid FROM execution").fetchall()
    by_job = dict(pids)
    assert by_job[first] != by_job[second]  # the heavy child was retired
    assert "reason=max_memory" in m.log()
    m.signal(signal.SIGTERM)
    assert m.wait() == 0


def test_sighup_says_the_periodic_schedules_stay_as_loaded(start_master: StartMaster) -> None:
    """The master never re-imports the application: a reload keeps its schedules, and
    says so in the log instead of leaving an edited schedule silently unapplied."""
    m = start_master(workers=1, app="brooq_periodicapp:queue")
    m.wait_ready(1)
    m.signal(signal.SIGHUP)
    wait_for(lambda: "event=reload_done" in m.log(), what="reload done")
    assert "event=reload_keeps_schedules schedules=3: periodic schedules are read once" in m.log()
    plain = start_master(workers=1)  # no schedules: nothing to say
    plain.wait_ready(1)
    plain.signal(signal.SIGHUP)
    wait_for(lambda: "event=reload_done" in plain.log(), what="reload done")
    assert "reload_keeps_schedules" not in plain.log()
