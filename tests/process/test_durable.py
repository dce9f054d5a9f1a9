"""Durable handlers under a real brooq-master: a handler of five steps whose child is
SIGKILLed at random moments resumes from its records (no step body runs once its result
was recorded; the writes of a step in its recording transaction land once; the result is
an unkilled run's), and a durable sleep parks the job holding no child, then resumes."""

from __future__ import annotations

import contextlib
import os
import random
import signal
import threading
import time
import uuid
from typing import Any

import psycopg
import pytest

import brooq
from tests.harness import StartMaster, wait_for

APP = "brooq_durableapp:queue"
STEPS = 5


def tables(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE IF NOT EXISTS step_body (job_id uuid, step int, pid int, "
            "recorded_before boolean, at timestamptz DEFAULT clock_timestamp())"
        )
        conn.execute("CREATE TABLE IF NOT EXISTS ledger (job_id uuid, step int)")


def expected(seed: int) -> dict[str, Any]:
    results = [seed * 10 + i for i in range(STEPS)]
    return {"results": results, "sum": sum(results)}


def kill_rounds(start_master: StartMaster, dsn: str, kills: int, timeout: float) -> None:
    tables(dsn)
    workers = 3
    master = start_master(app=APP, workers=workers, env={"QUEUE_LEASE": "3s"})
    master.wait_ready(workers)
    producer = brooq.Queue(dsn)
    rng = random.Random()
    seeds: dict[uuid.UUID, int] = {}
    killed = 0
    deadline = time.monotonic() + timeout
    with psycopg.connect(dsn, autocommit=True) as db:
        while killed < kills:
            assert time.monotonic() < deadline, f"{killed} kills of {kills} in {timeout}s"
            open_jobs = db.execute(
                "SELECT count(*) FROM job_all WHERE topic = 'durable.five' "
                "AND state NOT IN ('done', 'dead', 'canceled')"
            ).fetchone()
            assert open_jobs is not None
            for _ in range(max(0, workers - int(open_jobs[0]))):
                seed = rng.randrange(1000)
                job_id, _ = producer.enqueue(brooq.Job("durable.five", {"seed": seed}))
                seeds[job_id] = seed
            # The child running a job's step now: its pid, from the newest body row.
            rows = db.execute(
                "SELECT DISTINCT ON (b.job_id) b.pid FROM step_body b "
                "JOIN job_all j ON j.id = b.job_id WHERE j.state = 'processing' "
                "ORDER BY b.job_id, b.at DESC"
            ).fetchall()
            pids = [r[0] for r in rows if r[0] in master.children()]
            if not pids:
                time.sleep(0.01)
                continue
            time.sleep(rng.uniform(0, 0.05))  # inside a body, after it, between steps
            with contextlib.suppress(ProcessLookupError):
                os.kill(rng.choice(pids), signal.SIGKILL)
                killed += 1
        wait_for(
            lambda: (
                db.execute(
                    "SELECT count(*) = 0 FROM job_all "
                    "WHERE topic = 'durable.five' AND state <> 'done'"
                ).fetchone()
                == (True,)
            ),
            timeout=120,
            what="every job done",
        )
        results = dict(
            db.execute("SELECT id, result FROM job_all WHERE topic = 'durable.five'").fetchall()
        )
        assert results == {job_id: expected(seed) for job_id, seed in seeds.items()}
        again = db.execute("SELECT job_id, step FROM step_body WHERE recorded_before").fetchall()
        assert again == [], "a step body ran after its result was recorded"
        ledger = db.execute(
            "SELECT count(*), count(DISTINCT (job_id, step)) FROM ledger"
        ).fetchone()
        assert ledger == (len(seeds) * 3, len(seeds) * 3)  # steps 0, 2, 4: once each
        resumed = db.execute(
            "SELECT count(*) FROM job_all WHERE topic = 'durable.five' AND attempts > 1"
        ).fetchone()
        assert resumed is not None and resumed[0] > 0  # kills landed in handlers


def test_a_five_step_handler_killed_20_times_resumes_from_its_records(
    start_master: StartMaster, dsn: str
) -> None:
    kill_rounds(start_master, dsn, kills=20, timeout=180)


@pytest.mark.slow
def test_a_five_step_handler_killed_200_times_resumes_from_its_records(
    start_master: StartMaster, dsn: str
) -> None:
    kill_rounds(start_master, dsn, kills=200, timeout=900)


def test_a_sleep_holds_no_child_and_resumes(start_master: StartMaster, dsn: str) -> None:
    tables(dsn)
    master = start_master(app=APP, workers=1)
    master.wait_ready(1)
    job_id, _ = brooq.Queue(dsn).enqueue(brooq.Job("durable.sleep", {"for": "3s"}))
    with psycopg.connect(dsn, autocommit=True) as db:

        def parked() -> Any:
            return db.execute(
                "SELECT state, locked_by, attempts, parked FROM job_all WHERE id = %s", (job_id,)
            ).fetchone()

        assert wait_for(lambda: parked() == ("pending", None, 0, "sleep"), what="parked")
        # The line is logged once the park committed: right after the row reads parked.
        wait_for(lambda: "event=job_parked" in master.log(), what="the park logged")
        assert "reason=sleep" in master.log()
        wait_for(
            lambda: (
                db.execute("SELECT state FROM job_all WHERE id = %s", (job_id,)).fetchone()
                == ("done",)
            ),
            what="done after the sleep",
        )
        row = db.execute(
            "SELECT attempts, result, parked FROM job_all WHERE id = %s", (job_id,)
        ).fetchone()
        assert row is not None and row[0] == 1 and row[1] == "woke"
        runs = db.execute(
            "SELECT count(*) FROM step_body WHERE job_id = %s AND step = -1", (job_id,)
        ).fetchone()
        assert runs == (2,)  # the code before the sleep runs again; the sleep returns


def emits_and_waits(start_master: StartMaster, dsn: str, jobs: int) -> None:
    """``jobs`` jobs wait on as many keys; a fifth of the keys is emitted before the
    waits, every key twice (by two of 4 threads) while two masters run the waits: each
    key's first emit wins once, each job is released once with that emit's payload."""
    tables(dsn)
    producer = brooq.Queue(dsn)
    keys = [f"key-{i}" for i in range(jobs)]
    wins: list[str] = []
    lock = threading.Lock()
    for key in keys[: jobs // 5]:
        assert producer.emit_event(key, {"key": key, "by": "early"})
        wins.append(key)
    masters = [start_master(app=APP, workers=2) for _ in range(2)]
    for master in masters:
        master.wait_ready(2)
    ids = {
        job_id: key
        for (job_id, _), key in zip(
            producer.enqueue_many([brooq.Job("durable.event", {"key": k}) for k in keys]),
            keys,
            strict=True,
        )
    }

    def emitter(n: int) -> None:
        mine = [k for i, k in enumerate(keys) if i % 4 in (n, (n + 1) % 4)]
        rng = random.Random(n)
        rng.shuffle(mine)
        for key in mine:
            if producer.emit_event(key, {"key": key, "by": n}):
                with lock:
                    wins.append(key)
            time.sleep(rng.uniform(0, 0.002))

    with psycopg.connect(dsn, autocommit=True) as db:  # some waits park before the emits
        wait_for(
            lambda: (
                db.execute(
                    "SELECT count(*) >= %s FROM job_all WHERE topic = 'durable.event' "
                    "AND state = 'waiting'",
                    (jobs // 4,),
                ).fetchone()
                == (True,)
            ),
            what="waits parked",
        )
    threads = [threading.Thread(target=emitter, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(wins) == sorted(keys)  # each key's first emit won, once
    with psycopg.connect(dsn, autocommit=True) as db:
        wait_for(
            lambda: (
                db.execute(
                    "SELECT count(*) FROM job_all WHERE topic = 'durable.event' AND state = 'done'"
                ).fetchone()
                == (jobs,)
            ),
            timeout=120,
            what="every waiting job done",
        )
        events = dict(db.execute("SELECT key, payload FROM brooq_event").fetchall())
        rows = db.execute(
            "SELECT id, result, attempts FROM job_all WHERE topic = 'durable.event'"
        ).fetchall()
        assert {r[0]: r[1] for r in rows} == {job_id: events[key] for job_id, key in ids.items()}
        assert {r[2] for r in rows} == {1}  # parking spent no attempt
        assert db.execute("SELECT count(*) FROM brooq_event_wait").fetchone() == (0,)
        # Released once: a job ran at most twice (parked once, then woken once).
        runs = db.execute(
            "SELECT max(n) FROM (SELECT count(*) AS n FROM step_body WHERE step = -2 "
            "GROUP BY job_id) AS r"
        ).fetchone()
        assert runs is not None and runs[0] == 2


def test_200_jobs_wait_on_200_keys_emitted_from_4_threads_under_two_masters(
    start_master: StartMaster, dsn: str
) -> None:
    emits_and_waits(start_master, dsn, 200)


@pytest.mark.slow
def test_1000_jobs_wait_on_1000_keys_emitted_from_4_threads_under_two_masters(
    start_master: StartMaster, dsn: str
) -> None:
    emits_and_waits(start_master, dsn, 1000)


def test_a_parent_killed_after_spawning_makes_its_children_once_and_is_woken_once(
    start_master: StartMaster, dsn: str
) -> None:
    tables(dsn)
    master = start_master(app=APP, workers=3)
    master.wait_ready(3)
    producer = brooq.Queue(dsn)
    killed, _ = producer.enqueue(brooq.Job("durable.parent", {"children": 20, "die": True}))
    wide, _ = producer.enqueue(brooq.Job("durable.parent", {"children": 300, "gate": "open"}))
    with psycopg.connect(dsn, autocommit=True) as db:
        # Every child of the wide parent parks on the gate, the parent on its children.
        wait_for(
            lambda: (
                db.execute(
                    "SELECT (SELECT parked FROM job_all WHERE id = %s) = 'jobs' AND count(*) = 300 "
                    "FROM job_all WHERE topic = 'durable.child' AND parked = 'event' "
                    "AND state = 'waiting'",
                    (wide,),
                ).fetchone()
                == (True,)
            ),
            timeout=60,
            what="the wide parent and its children parked",
        )
        assert producer.emit_event("open")
        for job_id in (killed, wide):
            wait_for(
                lambda job_id=job_id: (
                    db.execute("SELECT state FROM job_all WHERE id = %s", (job_id,)).fetchone()
                    == ("done",)
                ),
                timeout=60,
                what="the parent done",
            )
        results = dict(
            db.execute(
                "SELECT id, result FROM job_all WHERE id IN (%s, %s)", (killed, wide)
            ).fetchall()
        )
        assert results[killed] == {"sum": sum(range(20)), "states": ["done"]}
        assert results[wide] == {"sum": sum(range(300)), "states": ["done"]}
        assert db.execute(
            "SELECT count(*) FROM job_all WHERE topic = 'durable.child'"
        ).fetchone() == (320,)  # the killed parent's resumed attempt made no second child
        runs = dict(
            db.execute(
                "SELECT job_id, count(*) FROM step_body WHERE step = -3 GROUP BY job_id"
            ).fetchall()
        )
        # The killed one: killed, then resumed (and parked and woken, unless its children
        # had all ended by then); the wide one: parked, woken once by its last child.
        assert runs[killed] in (2, 3) and runs[wide] == 2
        assert "event=job_parked" in master.log()


def test_an_async_handler_awaits_its_steps_sleeps_and_waits(
    start_master: StartMaster, dsn: str
) -> None:
    tables(dsn)
    master = start_master(app=APP, workers=2, args=("--concurrency", "4"))
    master.wait_ready(2)
    producer = brooq.Queue(dsn)
    job_id, _ = producer.enqueue(brooq.Job("durable.async", {"key": "async-key"}))
    with psycopg.connect(dsn, autocommit=True) as db:

        def state() -> Any:
            return db.execute(
                "SELECT state, parked, attempts FROM job_all WHERE id = %s", (job_id,)
            ).fetchone()

        wait_for(lambda: state() == ("waiting", "event", 0), what="parked on its event")
        assert producer.emit_event("async-key", "go")
        wait_for(lambda: state() == ("done", "event", 1), what="done")
        result = db.execute("SELECT result FROM job_all WHERE id = %s", (job_id,)).fetchone()
        assert result == ([42, "go"],)
        runs = db.execute(
            "SELECT count(*) FROM step_body WHERE job_id = %s AND step = -4", (job_id,)
        ).fetchone()
        assert runs == (1,)  # the step ran once through a sleep and a wait


def test_retention_removes_the_events_no_job_waits_on(start_master: StartMaster, dsn: str) -> None:
    tables(dsn)
    producer = brooq.Queue(dsn)
    with psycopg.connect(dsn, autocommit=True) as db:
        # A job waits on "held" (parked by hand, as brooq_park_event leaves it).
        job_id, _ = producer.enqueue(brooq.Job("durable.event", {"key": "held"}))
        db.execute("UPDATE job SET state = 'waiting', parked = 'event' WHERE id = %s", (job_id,))
        db.execute("INSERT INTO brooq_event_wait (job_id, key) VALUES (%s, 'held')", (job_id,))
        db.execute(
            "INSERT INTO brooq_event (key, payload, emitted_at) VALUES "
            "('old', '1', now() - interval '1 hour'), ('held', '2', now() - interval '1 hour'), "
            "('new', '3', now() + interval '1 hour')"
        )
        start_master(
            app=APP,
            workers=1,
            env={"QUEUE_RETENTION_TTL": "1m", "QUEUE_RETENTION_PERIOD": "100ms"},
        )
        wait_for(
            lambda: (
                db.execute("SELECT array_agg(key ORDER BY key) FROM brooq_event").fetchone()
                == (["held", "new"],)
            ),
            what="the old event deleted, the one a job waits on kept",
        )
