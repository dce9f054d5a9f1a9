"""Ordered keys under running masters: two masters of two children each run many keys'
jobs at once, yet one key's jobs one at a time, in enqueue order, a retry holding its key;
a dead job blocks its key until an operator unblocks it, or, for a topic with
ordering_skip_dead=True, the masters' keys duty hands the key on."""

from __future__ import annotations

import uuid
from typing import Any

import psycopg

import brooq
from tests.harness import StartMaster, wait_for

KEYS = 8
PER_KEY = 6


def _state(db: psycopg.Connection[Any], job_id: uuid.UUID) -> str:
    row = db.execute("SELECT state FROM job_all WHERE id = %s", (job_id,)).fetchone()
    assert row is not None
    return str(row[0])


def _all_ended(db: psycopg.Connection[Any], ids: list[uuid.UUID]) -> bool:
    row = db.execute(
        "SELECT count(*) FROM job_all WHERE id = ANY(%s) AND state IN ('done', 'dead')", (ids,)
    ).fetchone()
    return row is not None and row[0] == len(ids)


def test_two_masters_run_each_key_one_job_at_a_time_in_order_through_retries(
    queue: brooq.Queue, db: psycopg.Connection[Any], start_master: StartMaster
) -> None:
    masters = [start_master(workers=2) for _ in range(2)]
    for m in masters:
        m.wait_ready(2)
    # The keys interleaved, one enqueue_many per round plus single enqueues: every
    # second job of a key fails its first attempt (its retry must come before the next).
    by_key: dict[str, list[uuid.UUID]] = {f"k{k}": [] for k in range(KEYS)}
    for n in range(PER_KEY):
        jobs = [
            brooq.Job("t.ordered", {"n": n, "fail_once": n % 2 == 1}, ordering_key=key)
            for key in by_key
        ]
        if n % 3 == 0:
            ids = [queue.enqueue(job)[0] for job in jobs]
        else:
            ids = [i for i, _ in queue.enqueue_many(jobs)]
        for key, job_id in zip(by_key, ids, strict=True):
            by_key[key].append(job_id)
    every = [i for ids in by_key.values() for i in ids]
    wait_for(lambda: _all_ended(db, every), timeout=60, what="every ordered job ended")
    assert {_state(db, i) for i in every} == {"done"}
    rows = db.execute(
        "SELECT job_id, attempt, note, at FROM execution WHERE job_id = ANY(%s) ORDER BY at",
        (every,),
    ).fetchall()
    pids = db.execute(
        "SELECT count(DISTINCT pid) FROM execution WHERE job_id = ANY(%s)", (every,)
    ).fetchone()
    assert pids is not None and pids[0] >= 3  # the keys ran on several children at once
    for key, ids in by_key.items():
        position = {job_id: n for n, job_id in enumerate(ids)}
        mine = [(position[j], attempt, note, at) for j, attempt, note, at in rows if j in position]
        # One at a time: the key's records alternate start, end, start, end ...
        assert [note for _, _, note, _ in mine] == ["start", "end"] * (len(mine) // 2), key
        # ... in enqueue order, each failed first attempt followed by its retry.
        runs = [(n, attempt) for n, attempt, note, _ in mine if note == "start"]
        expected = [(n, a) for n in range(PER_KEY) for a in ((1, 2) if n % 2 else (1,))]
        assert runs == expected, key
    for m in masters:
        m.stop()


def test_a_dead_job_blocks_its_key_until_unblocked_or_skipped_by_its_handler(
    queue: brooq.Queue, db: psycopg.Connection[Any], start_master: StartMaster
) -> None:
    m = start_master(workers=2)
    m.wait_ready(2)
    blocked = [
        i
        for i, _ in queue.enqueue_many(
            [
                brooq.Job("t.ordered_dead", {"die": True}, ordering_key="acct"),
                brooq.Job("t.ordered_dead", {"n": 1}, ordering_key="acct"),
            ]
        )
    ]
    skipped = [
        i
        for i, _ in queue.enqueue_many(
            [
                brooq.Job("t.ordered_skip", {"die": True}, ordering_key="acct"),
                brooq.Job("t.ordered_skip", {"n": 1}, ordering_key="acct"),
            ]
        )
    ]
    # ordering_skip_dead: the keys duty (every second) hands the key on.
    wait_for(lambda: _state(db, skipped[1]) == "done", what="the skipping topic's next job")
    assert _state(db, skipped[0]) == "dead"
    # Without it the key stays blocked, and is listed so, until unblocked.
    wait_for(lambda: _state(db, blocked[0]) == "dead", what="the first job of the key dead")
    [key] = queue.blocked_keys()
    assert (key.topic, key.ordering_key, key.reason, key.job_id, key.waiting) == (
        "t.ordered_dead",
        "acct",
        "dead",
        blocked[0],
        1,
    )
    assert _state(db, blocked[1]) == "waiting"
    assert queue.unblock_key("t.ordered_dead", "acct") == blocked[1]
    wait_for(lambda: _state(db, blocked[1]) == "done", what="the unblocked key's next job")
    assert queue.blocked_keys() == [] and _state(db, blocked[0]) == "dead"
    m.stop()
