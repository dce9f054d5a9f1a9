"""Workflows with real brooq-masters: a three-level graph runs in dependency order, a
dead upstream job cancels its descendants while a "run" callback runs, a child SIGKILLed
inside the transaction of the last upstream outcome neither loses nor doubles the
release, nor does a host lost mid-job (its lease reaped by another master), and a
fan-in of 10,000 jobs releases its callback once, soon after the last.
The application is tests/apps/brooq_flowapp.py."""

from __future__ import annotations

import os
import signal
from datetime import datetime
from typing import Any

import psycopg
import pytest

import brooq
from tests.harness import StartMaster, wait_for

APP = "brooq_flowapp:queue"
Conn = psycopg.Connection[Any]


def notes(db: Conn) -> list[tuple[Any, str, datetime]]:
    rows = db.execute("SELECT job_id, note, at FROM execution ORDER BY at").fetchall()
    return [(r[0], r[1], r[2]) for r in rows]


def states(db: Conn, ids: list[Any]) -> list[str]:
    by_id = dict(db.execute("SELECT id, state FROM job_all WHERE id = ANY(%s)", (ids,)).fetchall())
    return [by_id.get(i, "") for i in ids]


def test_a_three_level_graph_runs_in_dependency_order(
    queue: brooq.Queue, db: Conn, start_master: StartMaster
) -> None:
    start_master(workers=3, app=APP)
    top = [brooq.Job("flow.step", {"n": n, "sleep": 0.05 * n}) for n in range(4)]
    middle = [
        brooq.Job("flow.step", {"m": 0}, after=top[:2]),
        brooq.Job("flow.step", {"m": 1}, after=top[2:]),
    ]
    bottom = brooq.Job("flow.merge", {"bind": True}, after=middle)
    ids = [i for i, _ in queue.enqueue_many([*top, *middle, bottom])]
    wait_for(lambda: states(db, ids) == ["done"] * 7, what="the graph done")
    seen = notes(db)
    started = {j: at for j, note, at in seen if note == "start"}
    ended = {j: at for j, note, at in seen if note == "end"}
    assert len(started) == 7 and len(ended) == 7
    for down, ups in ((ids[4], ids[0:2]), (ids[5], ids[2:4]), (ids[6], ids[4:6])):
        assert started[down] > max(ended[u] for u in ups)
    # claim.upstream: the records of the jobs it waited for, in the order named.
    record = queue.get(ids[6])
    assert record is not None and record.result == [
        {"id": str(ids[4]), "topic": "flow.step", "state": "done", "result": {"step": {"m": 0}}},
        {"id": str(ids[5]), "topic": "flow.step", "state": "done", "result": {"step": {"m": 1}}},
    ]


def test_a_dead_upstream_job_cancels_descendants_and_runs_callbacks(
    queue: brooq.Queue, db: Conn, start_master: StartMaster
) -> None:
    start_master(workers=2, app=APP)
    ok = brooq.Job("flow.step", {"ok": 1})
    bad = brooq.Job("flow.step", {"fail": True})
    merge = brooq.Job("flow.step", {"merge": 1}, after=[ok, bad])
    leaf = brooq.Job("flow.step", {"leaf": 1}, after=[merge])
    callback = brooq.Job("flow.step", {"cb": 1}, after=[ok, bad], on_upstream_failure="run")
    ids = [i for i, _ in queue.enqueue_many([ok, bad, merge, leaf, callback])]
    wait_for(
        lambda: states(db, ids) == ["done", "dead", "canceled", "canceled", "done"],
        what="the graph's ends",
    )
    ran = {j for j, note, _ in notes(db) if note == "start"}
    assert ran == {ids[0], ids[1], ids[4]}
    merged = queue.get(ids[2])
    assert merged is not None and merged.last_error == f"upstream job {ids[1]} ended dead"


@pytest.mark.parametrize(
    "rounds", [pytest.param(5, id="5"), pytest.param(50, id="50", marks=pytest.mark.slow)]
)
def test_a_child_killed_writing_the_last_upstream_outcome(
    queue: brooq.Queue, db: Conn, start_master: StartMaster, rounds: int
) -> None:
    """The last upstream job's child is SIGKILLed inside the transaction that writes its
    `done` (and the release): the master charges that attempt, the job runs again and
    the callback is released once, by that second write."""
    start_master(workers=2, app=APP)
    for _ in range(rounds):
        first = brooq.Job("flow.step", {"first": 1})
        last = brooq.Job("flow.kill", {})
        callback = brooq.Job("flow.step", {"cb": 1}, after=[first, last])
        ids = [i for i, _ in queue.enqueue_many([first, last, callback])]
        wait_for(lambda ids=ids: states(db, ids) == ["done"] * 3, what="the round done")
        starts = [j for j, note, _ in notes(db) if note == "start"]
        assert starts.count(ids[1]) == 2  # killed once, written by the second attempt
        assert starts.count(ids[2]) == 1
        assert starts.index(ids[2]) > max(i for i, j in enumerate(starts) if j == ids[1])


def test_a_fan_in_of_ten_thousand_releases_its_callback_once(
    queue: brooq.Queue, db: Conn, start_master: StartMaster
) -> None:
    start_master(workers=2, app=APP)
    ups = [brooq.Job("flow.noop") for _ in range(10_000)]
    callback = brooq.Job("flow.step", {"cb": "fan-in"}, after=ups)
    ids = [i for i, _ in queue.enqueue_many([*ups, callback])]
    wait_for(lambda: states(db, ids[-1:]) == ["done"], timeout=120, what="the callback done")
    (last_up,) = db.execute(
        "SELECT max(updated_at) FROM job_all WHERE topic = 'flow.noop'"
    ).fetchone()  # type: ignore[misc]
    runs = [at for j, note, at in notes(db) if j == ids[-1] and note == "start"]
    assert len(runs) == 1
    # Released by the last upstream job's own outcome and started on its wake-up: well
    # within a lease (2 s here), the bound a release left to expiries would take.
    assert (runs[0] - last_up).total_seconds() < 1.5
    assert db.execute(
        "SELECT count(*) FROM job_all WHERE topic = 'flow.noop' AND state = 'done'"
    ).fetchone() == (10_000,)


def test_a_host_lost_mid_upstream_job_releases_once_after_the_reaper(
    queue: brooq.Queue, db: Conn, start_master: StartMaster
) -> None:
    """The master and its children SIGKILLed (a host lost) while the upstream job runs:
    its lease expires, another master's reaper returns it, it runs again, and its `done`
    releases the waiting job once; nothing ran the waiting job before."""
    lost = start_master(workers=1, app=APP, new_session=True)
    lost.wait_ready(1)
    up = brooq.Job("flow.step", {"sleep": 1.5})
    down = brooq.Job("flow.step", {"after": "up"}, after=[up])
    up_id, down_id = (i for i, _ in queue.enqueue_many([up, down]))
    wait_for(lambda: any(j == up_id for j, _, _ in notes(db)), what="the upstream job running")
    os.killpg(lost.pid, signal.SIGKILL)
    lost.wait()
    assert states(db, [up_id, down_id]) == ["processing", "waiting"]
    start_master(workers=1, app=APP)
    wait_for(lambda: states(db, [up_id, down_id]) == ["done", "done"], what="both done")
    seen = notes(db)
    assert [n for j, n, _ in seen if j == up_id] == ["start", "start", "end"]
    assert [n for j, n, _ in seen if j == down_id] == ["start", "end"]
    up_end = next(at for j, n, at in seen if j == up_id and n == "end")
    assert next(at for j, n, at in seen if j == down_id) > up_end


def test_many_graphs_at_once_each_job_once_and_in_order(
    queue: brooq.Queue, db: Conn, start_master: StartMaster
) -> None:
    """300 diamonds (two jobs, then one after both, then one after that) drained by two
    masters of two children: every job runs once, each after the ends of the jobs it
    names."""
    for _ in range(2):
        start_master(workers=2, app=APP)
    graphs = []
    for n in range(300):
        a, b = brooq.Job("flow.step", {"n": n}), brooq.Job("flow.step", {"n": n})
        c = brooq.Job("flow.step", {"n": n}, after=[a, b])
        graphs.append([a, b, c, brooq.Job("flow.step", {"n": n}, after=[c])])
    ids = [i for i, _ in queue.enqueue_many([job for g in graphs for job in g])]
    wait_for(
        lambda: (
            db.execute("SELECT count(*) FROM job_all WHERE state = 'done'").fetchone()
            == (len(ids),)
        ),
        timeout=120,
        what="every job done",
    )
    seen = notes(db)
    starts = [j for j, note, _ in seen if note == "start"]
    assert sorted(starts) == sorted(ids)  # each once
    started = {j: at for j, note, at in seen if note == "start"}
    ended = {j: at for j, note, at in seen if note == "end"}
    for k in range(0, len(ids), 4):
        a, b, c, d = ids[k : k + 4]
        assert started[c] > max(ended[a], ended[b]) and started[d] > ended[c]
