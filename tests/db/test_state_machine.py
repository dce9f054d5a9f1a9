"""A Hypothesis state machine over the worker, master and operator SQL against a real
PostgreSQL: three worker identities (one connection each), a master (renewal, reaper,
release) and an operator (enqueue, cancel, retry) interleave at random, and after every
step the whole table is compared with what the step was allowed to change.

Checked after every step:
- a terminal row (done, dead, canceled) never changes, except by an operator retry;
- at most one holder per job, and a claim never hands out a job someone holds;
- attempts go up by exactly one per claim and only then, never below 0;
- a processing row always has a lease (holder and expiry);
- a worker's outcome write succeeds exactly when it holds the job (state processing and
  locked_by itself), whatever it believes;
- every other row is left exactly as it was (a frame check).
"""

from __future__ import annotations

import contextlib
import uuid
from datetime import datetime, timedelta, timezone
from typing import Any, ClassVar

import psycopg
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)
from psycopg.rows import dict_row

import brooq
from brooq.operator.changes import transition_params
from brooq.sql import Q

Conn = psycopg.Connection[Any]
Row = dict[str, Any]

WORKERS = ("w1", "w2", "w3")
TERMINAL = ("done", "dead", "canceled")
LEASE = 300.0  # long: a lease expires only when the machine forces it
FUTURE = 3600.0  # a delay that never passes during a run
MAX_JOBS = 6
# A row a step does not predict a change for must not change at all; a row it does predict
# must show the predicted values, and may change only these columns besides:
VOLATILE = ("updated_at", "available_at", "locked_until")
# In an expectation: the column holds the time of the statement that wrote it.
CLAIMED_NOW = object()


def history(row: dict[str, Any] | None) -> list[tuple[Any, ...]]:
    """The error history of a row without the times: (attempt, error, worker)."""
    return [(e["attempt"], e["error"], e["worker"]) for e in (row or {}).get("errors") or []]


class QueueMachine(RuleBasedStateMachine):
    conns: ClassVar[dict[str, Conn]] = {}

    def __init__(self) -> None:
        super().__init__()
        self.op = self.conns["operator"]
        self.master = self.conns["master"]
        self.op.execute("DELETE FROM job")
        self.op.execute("DELETE FROM job_history")
        self.op.execute("DELETE FROM brooq_job_key")
        self.jobs: list[uuid.UUID] = []
        # What each worker believes it holds; beliefs may be stale, the database decides.
        self.held: dict[str, set[uuid.UUID]] = {w: set() for w in WORKERS}
        self.before, self.now = self.snapshot()
        self.begin_step()

    # -- bookkeeping ------------------------------------------------------------------

    def snapshot(self) -> tuple[dict[uuid.UUID, Row], datetime]:
        # Active jobs in job, finished ones in job_history: each in one of them.
        rows = self.op.execute("SELECT * FROM job_all").fetchall()
        now_row = self.op.execute("SELECT now() AS t").fetchone()
        assert now_row is not None
        return {row["id"]: row for row in rows}, now_row["t"]

    def begin_step(self) -> None:
        self.expected: dict[uuid.UUID, dict[str, Any]] = {}
        self.lease_touched: set[uuid.UUID] = set()
        self.claimed: set[uuid.UUID] = set()
        self.refunded: set[uuid.UUID] = set()
        self.retried: set[uuid.UUID] = set()
        self.added: set[uuid.UUID] = set()

    def pick(self, index: int) -> uuid.UUID:
        return self.jobs[index % len(self.jobs)]

    def holds(self, worker: str, job_id: uuid.UUID) -> bool:
        row = self.before[job_id]
        return bool(row["state"] == "processing" and row["locked_by"] == worker)

    def ready(self, row: Row) -> bool:
        return bool(row["state"] in ("pending", "failed") and row["available_at"] <= self.now)

    # -- the operator and producers ------------------------------------------------------

    @initialize(n=st.integers(1, 3))
    def some_ready_jobs(self, n: int) -> None:
        self.enqueue(n, [False] * n)

    @precondition(lambda self: len(self.jobs) < MAX_JOBS)
    @rule(
        n=st.integers(1, 3),
        later=st.lists(st.sampled_from([False, False, True]), min_size=3, max_size=3),
    )
    def enqueue(self, n: int, later: list[bool]) -> None:
        future = datetime.now(timezone.utc) + timedelta(seconds=FUTURE)
        jobs = [
            brooq.Job("t", {"n": len(self.jobs) + i}, available_at=future if later[i] else None)
            for i in range(n)
        ]
        # The producer's own statement, with ids that depend only on the order of creation
        # (not on uuid4), so that Hypothesis can replay a run: jobs of one statement share
        # available_at and are claimed in id order, which is scrambled here.
        ids = [
            uuid.UUID(int=((len(self.jobs) + i + 1) * 0x9E3779B97F4A7C15F39CC0605CEDC834) % 2**128)
            for i in range(n)
        ]
        rows = self.op.execute(
            Q.job_insert_many,
            {
                "ids": ids,
                "topics": [j.topic for j in jobs],
                "payloads": [j.payload_json for j in jobs],
                "keys": [j.idempotency_key for j in jobs],
                "available_ats": [j.available_at for j in jobs],
                "queues": ["default" for _ in jobs],
                "priorities": [j.priority for j in jobs],
                "groups": [j.group for j in jobs],
            },
        ).fetchall()
        assert sorted(row["id"] for row in rows) == sorted(ids)
        for job_id in ids:
            self.jobs.append(job_id)
            self.added.add(job_id)
            self.expected[job_id] = {"state": "pending", "attempts": 0, "locked_by": None}

    @precondition(lambda self: self.jobs)
    @rule(action=st.sampled_from(["cancel", "retry"]), index=st.integers(0, 10**6))
    def operator(self, action: str, index: int) -> None:
        """``brooq cancel ID`` or ``brooq retry ID`` (one rule: operators act rarely)."""
        job_id = self.pick(index)
        state = self.before[job_id]["state"]
        if action == "cancel":
            ok = self.op.execute(Q.job_cancel, transition_params("cancel", job_id)).fetchall() != []
            assert ok == (state in ("pending", "failed", "processing"))
            if ok:
                self.expected[job_id] = {"state": "canceled"}
            return
        ok = self.op.execute(Q.job_retry, transition_params("retry", job_id)).fetchall() != []
        assert ok == (state in ("dead", "canceled"))
        if ok:
            self.retried.add(job_id)
            self.expected[job_id] = {
                "state": "pending",
                "attempts": 0,
                "locked_by": None,
                "locked_until": None,
            }

    # -- workers -------------------------------------------------------------------------

    @rule(worker=st.sampled_from(WORKERS), limit=st.integers(1, 3))
    def claim(self, worker: str, limit: int) -> None:
        claimable = sorted(
            (row["available_at"], job_id) for job_id, row in self.before.items() if self.ready(row)
        )
        answer = (
            self.conns[worker]
            .execute(
                Q.job_finish_and_claim,
                {
                    "done": [],
                    "topics": ["t"],
                    "limit": limit,
                    "children": 1,
                    "worker": worker,
                    "lease": LEASE,
                    "queue": "default",
                },
            )
            .fetchall()
        )
        rows = [row for row in answer if row["claimed"]]
        got = {row["id"] for row in rows}
        assert got == {job_id for _, job_id in claimable[:limit]}, "not FIFO"
        for row in rows:
            job_id = row["id"]
            before = self.before[job_id]
            # Never a job that someone holds (or that is finished).
            assert before["state"] in ("pending", "failed"), before
            assert row["attempts"] == before["attempts"] + 1
            assert row["locked_by"] == worker
            self.claimed.add(job_id)
            self.held[worker].add(job_id)
            self.expected[job_id] = {
                "state": "processing",
                "attempts": before["attempts"] + 1,
                "locked_by": worker,
                "locked_until": row["locked_until"],
                "started_at": CLAIMED_NOW,  # the claim's own now(): set, never earlier
            }

    @precondition(lambda self: any(self.held.values()))
    @rule(
        worker=st.sampled_from(WORKERS),
        outcome=st.sampled_from(["done", "failed", "refund", "canceled"]),
        index=st.integers(0, 10**6),
        max_attempts=st.sampled_from([1, 3]),
        delay=st.sampled_from([0.0, 0.0, FUTURE]),
    )
    def outcome_of_a_believed_job(
        self, worker: str, outcome: str, index: int, max_attempts: int, delay: float
    ) -> None:
        """A worker writes the outcome of a job it believes it holds (the belief may be
        stale: its lease expired, the job was reaped, canceled or taken over)."""
        believers = [w for w in WORKERS if self.held[w]]
        worker = worker if self.held[worker] else believers[index % len(believers)]
        mine = sorted(self.held[worker])
        self.write_outcome(worker, mine[index % len(mine)], outcome, max_attempts, delay)

    @precondition(lambda self: self.jobs)
    @rule(
        worker=st.sampled_from(WORKERS),
        outcome=st.sampled_from(["done", "failed", "refund", "canceled"]),
        index=st.integers(0, 10**6),
        max_attempts=st.sampled_from([1, 3]),
        delay=st.sampled_from([0.0, FUTURE]),
    )
    def outcome_of_any_job(
        self, worker: str, outcome: str, index: int, max_attempts: int, delay: float
    ) -> None:
        """A confused worker writes the outcome of another job: one that is in flight or
        finished when there is one (a pending job is the dull case)."""
        taken = sorted(j for j, row in self.before.items() if row["state"] != "pending")
        job_id = taken[index % len(taken)] if taken else self.pick(index)
        self.write_outcome(worker, job_id, outcome, max_attempts, delay)

    def write_outcome(
        self, worker: str, job_id: uuid.UUID, outcome: str, max_attempts: int, delay: float
    ) -> None:
        conn = self.conns[worker]
        params = {"id": job_id, "worker": worker}
        if outcome == "done":
            ok = conn.execute(Q.job_set_done, {**params, "result": None}).rowcount == 1
        elif outcome == "canceled":
            ok = (
                conn.execute(
                    Q.job_set_canceled,
                    {
                        **params,
                        "error": "by handler",
                        "history_error": "by handler",
                        "kind": "canceled",
                        "traceback": None,
                    },
                ).rowcount
                == 1
            )
        else:
            row = conn.execute(
                Q.job_set_failed,
                {
                    **params,
                    "max_attempts": max_attempts,
                    "refund": outcome == "refund",
                    "delay": delay,
                    "error": f"{outcome} by {worker}",
                    "history_error": f"{outcome} by {worker}",
                    "kind": "raised",
                    "traceback": None,
                },
            ).fetchone()
            ok = row is not None
        # Succeeds exactly when it holds the job, whatever it believed.
        assert ok == self.holds(worker, job_id), (worker, outcome, self.before[job_id])
        self.held[worker].discard(job_id)  # written or refused, the worker is done with it
        if not ok:
            return
        attempts = self.before[job_id]["attempts"]
        if outcome == "done":
            self.expected[job_id] = {"state": "done"}
        elif outcome == "canceled":
            self.expected[job_id] = {
                "state": "canceled",
                "last_error": "by handler",
                "errors_added": (attempts, "by handler", worker),
            }
        elif outcome == "refund":
            self.refunded.add(job_id)
            self.expected[job_id] = {
                "state": "failed",
                "attempts": max(attempts - 1, 0),
                "last_error": f"refund by {worker}",
                "ready_in": delay,
                "errors_added": (attempts, f"refund by {worker}", worker),
            }
        else:
            self.expected[job_id] = {
                "state": "dead" if attempts >= max_attempts else "failed",
                "attempts": attempts,
                "last_error": f"failed by {worker}",
                "ready_in": delay,
                "errors_added": (attempts, f"failed by {worker}", worker),
            }

    # -- the master ------------------------------------------------------------------------

    @rule(children=st.sets(st.sampled_from(WORKERS), min_size=1))
    def renew(self, children: set[str]) -> None:
        """One statement for every job the master's children believe they hold. Several
        masters (hosts) may share the database: each renews only its own children."""
        pairs = [(job_id, w) for w in sorted(children) for job_id in sorted(self.held[w])]
        rows = self.master.execute(
            Q.job_renew_leases,
            {"ids": [j for j, _ in pairs], "workers": [w for _, w in pairs], "lease": LEASE},
        ).fetchall()
        valid = [(j, w) for j, w in pairs if self.holds(w, j)]
        assert sorted(row["id"] for row in rows) == sorted(j for j, _ in valid)
        for w in children:  # a job missing from the answer is a lost lease: abandon it
            self.held[w] = {j for j, holder in valid if holder == w}
        self.lease_touched.update(j for j, _ in valid)

    @precondition(lambda self: any(r["state"] == "processing" for r in self.before.values()))
    @rule(indexes=st.lists(st.integers(0, 10**6), min_size=1, max_size=4))
    def expire_leases(self, indexes: list[int]) -> None:
        """Test scaffolding: make some processing leases run out (a stuck renewal, a host
        that vanished)."""
        processing = sorted(j for j, row in self.before.items() if row["state"] == "processing")
        if not processing:
            return
        ids = [processing[i % len(processing)] for i in indexes]
        rows = self.op.execute(
            "UPDATE job SET locked_until = now() - interval '1 second' "
            "WHERE id = ANY(%s) AND state = 'processing' RETURNING id",
            [ids],
        ).fetchall()
        self.lease_touched.update(row["id"] for row in rows)

    @rule(indexes=st.lists(st.integers(0, 10**6), max_size=3))
    def reap(self, indexes: list[int]) -> None:
        """The reaper, after the leases of some jobs ran out (their holder vanished)."""
        if indexes:
            self.expire_leases(indexes)  # scaffolding: only locked_until of processing rows
            self.before, self.now = self.snapshot()
        expired = {
            job_id
            for job_id, row in self.before.items()
            if row["state"] == "processing" and row["locked_until"] < self.now
        }
        rows = self.master.execute(Q.job_reap_expired, {"max_expiries": 10**6}).fetchall()
        assert {row["id"] for row in rows} == expired
        for job_id in expired:
            self.refunded.add(job_id)
            old = self.before[job_id]
            expiry = (
                f"lease expired ({old['lease_expiries'] + 1} of {10**6}): "
                "back to pending, the attempt refunded"
            )
            self.expected[job_id] = {
                "errors_added": (old["attempts"], expiry, old["locked_by"]),
                "state": "pending",
                # An expired lease is a crash, not a failure: the attempt is refunded,
                # and the expiry counted (what bounds a job that takes hosts down).
                "attempts": max(self.before[job_id]["attempts"] - 1, 0),
                "lease_expiries": self.before[job_id]["lease_expiries"] + 1,
                "locked_by": None,
                "locked_until": None,
            }

    @rule(worker=st.sampled_from(WORKERS))
    def release(self, worker: str) -> None:
        """Drain budget exceeded: the worker's jobs go back without spending the attempt."""
        mine = {j for j in self.before if self.holds(worker, j)}
        rows = self.master.execute(Q.job_release, {"workers": [worker]}).fetchall()
        assert {row["id"] for row in rows} == mine
        self.held[worker].clear()
        for job_id in mine:
            self.refunded.add(job_id)
            self.expected[job_id] = {
                "state": "pending",
                "attempts": max(self.before[job_id]["attempts"] - 1, 0),
                "locked_by": None,
                "locked_until": None,
                "ready_in": 0.0,
            }

    # -- after every step -------------------------------------------------------------------

    @invariant()
    def check_step(self) -> None:
        after, now = self.snapshot()
        before = self.before
        assert set(after) == set(before) | self.added  # nothing vanishes, nothing appears

        for job_id, row in after.items():
            old = before.get(job_id)

            # A processing row always has a lease, held by a known worker.
            if row["state"] == "processing":
                assert row["locked_by"] in WORKERS and row["locked_until"] is not None, row

            # Attempts: +1 per claim and only then; down only by a refund (1) or a retry (0).
            assert row["attempts"] >= 0, row
            if old is not None:
                delta = row["attempts"] - old["attempts"]
                if job_id in self.claimed:
                    assert delta == 1, (old, row)
                elif job_id in self.retried:
                    assert row["attempts"] == 0, (old, row)
                elif job_id in self.refunded:
                    assert delta == -1 or old["attempts"] == row["attempts"] == 0, (old, row)
                else:
                    assert delta == 0, (old, row)

                # A terminal row never changes, except through an operator retry.
                if old["state"] in TERMINAL and job_id not in self.retried:
                    assert row == old, (old, row)

            # The frame: exactly the predicted changes, nothing else.
            expected = self.expected.get(job_id)
            if expected is None:
                assert old is not None
                if job_id in self.lease_touched:
                    assert {k: v for k, v in row.items() if k != "locked_until"} == {
                        k: v for k, v in old.items() if k != "locked_until"
                    }
                else:
                    assert row == old, (old, row)
                continue
            for column, value in expected.items():
                if column == "ready_in":
                    if value == 0.0:
                        assert row["available_at"] <= now
                    else:
                        assert row["available_at"] > now + timedelta(seconds=value / 2)
                elif value is CLAIMED_NOW:
                    assert row[column] is not None, (column, old, row)
                    earlier = old[column] if old is not None else None
                    assert earlier is None or row[column] >= earlier, (column, old, row)
                elif column == "errors_added":  # one history entry appended, the last 20 kept
                    assert history(row) == [*history(old), value][-20:], (old, row)
                else:
                    assert row[column] == value, (column, old, row)
            if old is not None:
                for column in row:
                    if column == "errors" and "errors_added" in expected:
                        continue
                    if column not in expected and column not in VOLATILE:
                        assert row[column] == old[column], (column, old, row)

        # At most one holder per job: among the workers that believe they hold a job, only
        # the one the row names can write its outcome.
        for job_id, row in after.items():
            believers = [w for w in WORKERS if job_id in self.held[w]]
            real = [w for w in believers if row["state"] == "processing" and row["locked_by"] == w]
            assert len(real) <= 1, (job_id, believers, row)

        self.before, self.now = after, now
        self.begin_step()


@pytest.mark.timeout(900)  # a failure shrinks for minutes; the passing run takes ~20 s
def test_queue_state_machine(dsn: str) -> None:
    with contextlib.ExitStack() as stack:
        conns: dict[str, Conn] = {}
        for name in (*WORKERS, "master", "operator"):
            conn = psycopg.connect(dsn, autocommit=True, row_factory=dict_row)
            stack.enter_context(conn)
            conn.execute("SET lock_timeout = '5s'")  # a wait is a bug here, not a hang
            conns[name] = conn
        QueueMachine.conns = conns
        try:
            run_state_machine_as_test(
                QueueMachine,
                settings=settings(
                    max_examples=150,
                    stateful_step_count=50,
                    deadline=None,
                    suppress_health_check=[HealthCheck.too_slow],
                ),
            )
        finally:
            QueueMachine.conns = {}
