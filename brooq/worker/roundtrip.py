"""One claim round trip: the `done` of the jobs finished since the last, and the next
claims, in one statement; then what came back settled, and the master told what is held.

Owns the claim statement's shapes (one queue, several, a topic claimed apart in its
turn: brooq.worker.pacing says which and with what), the paused queues' reading, the
jobs finished with a plain `done` waiting for the next trip (`RoundTrips.keep_done`),
their write one by one when the database refuses the batch for what a result holds, the
order of the claims (a claim under a rate first, then the queues as tried, priority and
FIFO), the held list the master renews, and the release of claims given back. The sync
loop (brooq.worker.child) runs a trip whole (`exchange`); the async one
(brooq.worker.aio) takes the finished jobs, runs the statement in its DB thread and
settles on its loop (`take`, `run`, `settle`, `put_back`).

Must never write an outcome other than through the guarded statements, never run a
handler, and never hold a job the master was not told of before it runs.
"""

from __future__ import annotations

import functools
import logging
import time
import uuid
from collections.abc import Callable, Collection, Mapping, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, NamedTuple

import psycopg
from psycopg.rows import RowMaker

from brooq import logs
from brooq.db import prepared_mismatch
from brooq.declare.handlers import Policy
from brooq.job import Claim
from brooq.settings import Settings
from brooq.sql import Queries
from brooq.worker import execute
from brooq.worker.connection import ChildConnection
from brooq.worker.floors import Floors, Range
from brooq.worker.outcome import OutcomeWriter
from brooq.worker.pacing import Pacing, Turn
from brooq.worker.weights import RoundOrder

if TYPE_CHECKING:
    from typing_extensions import LiteralString

__all__ = ["Apart", "ClaimRow", "Finished", "Plan", "RoundTrips", "Trip", "claim_plan", "claim_row"]

log = logging.getLogger("brooq.child")


class ClaimRow(NamedTuple):
    """A row of job_finish_and_claim, its columns by name. A finished job whose `done`
    was not written (claimed false) carries only its id: the other columns are NULL."""

    claimed: bool
    id: uuid.UUID  # None in the held-back answer of a coordinated claim (brooq.worker.pacing)
    topic: str
    payload: Any
    attempts: int
    locked_by: str
    locked_until: datetime
    available_at: datetime
    queue: str
    priority: int

    def claim(self) -> Claim[Any]:
        """The Claim a handler gets for a claimed row."""
        # Positional: a call per claimed job, and keywords cost more to pass.
        return Claim(
            self.id,
            self.topic,
            self.payload,
            self.attempts,
            self.locked_by,
            self.locked_until,
            self.queue,
            self.priority,
        )


_CLAIM_COLUMNS = tuple(name.encode() for name in ClaimRow._fields)


def claim_row(cursor: psycopg.Cursor[Any]) -> RowMaker[ClaimRow]:
    """The row factory of the claim: a ClaimRow made from the values (as cheap as a
    tuple row, and typed), after checking once per result that the columns are the
    fields, by name."""
    res = cursor.pgresult
    names = tuple(map(res.fname, range(res.nfields))) if res is not None else ()
    if names != _CLAIM_COLUMNS:
        raise psycopg.ProgrammingError(f"job_finish_and_claim returned {names}")
    return _make_claim_row


# ClaimRow._make without its Python frame and length check (the names are checked above).
_make_claim_row: RowMaker[ClaimRow] = functools.partial(tuple.__new__, ClaimRow)


# A job finished with a plain `done`, written with the next claim: the claim, how long
# its handler ran, what it returned as JSON text. A bare tuple: one per job, built
# without a call.
Finished = tuple[Claim[Any], float, str | None]
# What was written for each finished job when the batched `done` was refused: the
# state (None: nothing) and the outcome written (brooq.worker.outcome.OutcomeWriter.write).
Apart = dict[uuid.UUID, tuple[str | None, execute.Outcome]]
# What a round trip's statement came to: its rows, the round's queues in order, and the
# writes apart (None unless the batched `done` was refused).
Trip = tuple[list[ClaimRow], list[str], Apart | None]

# The claim statement of a round trip: (without results, with results), by the shape of
# the round (one queue, several, a topic under global_limit, one under a rate or a limit
# per group); looked up once in the schema's texts.
_STATEMENTS = {
    "one": ("job_finish_and_claim", "job_finish_and_claim_results"),
    "queues": ("job_finish_and_claim_queues", "job_finish_and_claim_queues_results"),
    "limited": ("job_finish_and_claim_limited", "job_finish_and_claim_limited_results"),
    "coordinated": (
        "job_finish_and_claim_coordinated",
        "job_finish_and_claim_coordinated_results",
    ),
    "floored": ("job_finish_and_claim_floored", "job_finish_and_claim_floored_results"),
}


class Plan(NamedTuple):
    """What a round trip's statement is: its shape (a key of _STATEMENTS), whether the
    finished jobs' results are written with it (the statement ``_results``), the round's
    queues in claim order, the claim's limit (0: a trip that only writes) and the
    statement's parameters."""

    shape: str
    with_results: bool
    queues: list[str]
    limit: int
    params: dict[str, Any]

    @property
    def statement(self) -> str:
        """The name of the statement in brooq/sql."""
        return _STATEMENTS[self.shape][self.with_results]


def claim_plan(
    finished: Sequence[Finished],
    with_results: bool,
    limit: int,
    queues: list[str],
    common: Mapping[str, Any],
    turn: Turn | None = None,
    ranges: Sequence[Range] | None = None,
    batch: int | None = None,
) -> Plan:
    """The plan of a round trip, from what the trip settled before it: the ``finished``
    jobs to write as `done` (with their results and last progress reports if
    ``with_results``), the claim's
    ``limit``, the ``queues`` in claim order, the child's ``common`` parameters (topics,
    children, worker, lease), the pacing's ``turn`` when a topic is claimed apart (the
    first turn on a trip that only writes) with the ``batch`` its claim may take (the
    pacing's; None: as many as the limit) and the floors' ``ranges`` when the ready index
    is read from floors. The shape: the turn's; else floored when there are ranges (reading
    the whole ready index has become expensive); else one queue or several. No I/O and no
    state: the same arguments, the same plan."""
    params: dict[str, Any] = {"done": [f[0].id for f in finished], "limit": limit, **common}
    if turn is not None:
        shape = turn.shape
        params.update(turn.params)
        params["queues"] = queues
        if shape == "coordinated":
            params["batch"] = limit if batch is None else batch
    elif ranges is not None:
        shape = "floored"
        params["queues"] = [r[0] for r in ranges]
        params["lows"] = [r[1] for r in ranges]
        params["highs"] = [r[2] for r in ranges]
        params["floors"] = [r[3] for r in ranges]
        params["floor_ids"] = [r[4] for r in ranges]
    elif len(queues) == 1:
        shape = "one"
        params["queue"] = queues[0]
    else:
        shape = "queues"
        params["queues"] = queues
    if with_results:  # and the last progress of the jobs that reported one
        params["results"] = [f[2] for f in finished]
        reported = [f[0] for f in finished if f[0].reported is not None]
        params["reported"] = [c.id for c in reported]
        params["fractions"] = [c.reported[0] for c in reported]  # type: ignore[index]
        params["messages"] = [c.reported[1] for c in reported]  # type: ignore[index]
    return Plan(shape, with_results, queues, limit, params)


class RoundTrips:
    """The round trips of one child, and what it holds between them."""

    def __init__(
        self,
        identity: str,
        settings: Settings,
        q: Queries,
        db: ChildConnection,
        outcomes: OutcomeWriter,
        policies: dict[str, Policy],
        topics: list[str],
        turns: list[Turn],
        order: RoundOrder,
        children: int,
        tell: Callable[[dict[str, Any]], None],
        tell_held: Callable[[list[uuid.UUID]], None],
    ) -> None:
        self.identity = identity
        self.settings = settings
        self.q = q
        self.statements: dict[str, tuple[LiteralString, LiteralString]] = {
            shape: (getattr(q, plain), getattr(q, with_results))
            for shape, (plain, with_results) in _STATEMENTS.items()
        }
        self.db = db
        self.outcomes = outcomes
        self.policies = policies
        self.topics = topics  # the topics claimed without a limit of the fleet
        # The others, one per round in turn (None: there are none).
        self.pacing = Pacing(turns) if turns else None
        # The claims whose handler must start by a deadline (the pacing's, shared).
        self.start_by: dict[uuid.UUID, float] = self.pacing.start_by if self.pacing else {}
        self._turn: Turn | None = None  # the last round's turn
        self._sent_at = 0.0  # when its statement was sent (time.monotonic)
        self.order = order
        self.children = children
        self._tell = tell
        self._tell_held = tell_held
        self.paused: frozenset[str] = frozenset()  # worked queues found paused
        self._paused_read = float("-inf")  # monotonic time of that reading
        self._held: list[uuid.UUID] = []  # what the master renews
        self._unwritten: list[Finished] = []  # finished with `done`, written next trip
        self._results_unwritten = False  # one of them has a result to store
        self.claims_failing = False  # the master was told the last claim failed
        self.floors = Floors()  # where the claims enter the ready index

    # -- the finished jobs waiting for a trip ------------------------------------------

    def keep_done(
        self, claim: Claim[Any], outcome: execute.Outcome, duration: float, result: str | None
    ) -> bool:
        """Keep a plain `done` for the next round trip (True); False when the outcome is
        written on its own (not done, or done with chained jobs or on_success hooks). A
        job that reported progress goes with a result's (the _results statement writes
        its last report with the done)."""
        if outcome.kind != "done" or claim.chained or claim.success_hooks:
            return False
        self._unwritten.append((claim, duration, result))
        if result is not None or claim.reported is not None:
            self._results_unwritten = True
        return True

    @property
    def owed(self) -> bool:
        """Some finished job's `done` waits for a round trip."""
        return bool(self._unwritten)

    def unwritten_ids(self) -> list[uuid.UUID]:
        return [f[0].id for f in self._unwritten]

    def take(self) -> tuple[list[Finished], bool]:
        """The finished jobs to write now, and whether one has a result; the next ones
        finished wait for the trip after."""
        taken = self._unwritten, self._results_unwritten
        self._unwritten, self._results_unwritten = [], False
        return taken

    def put_back(self, finished: list[Finished], with_results: bool) -> None:
        """A trip that failed: not known whether it committed, written again next time
        (the guard makes that harmless)."""
        self._unwritten = finished + self._unwritten
        self._results_unwritten = with_results or self._results_unwritten

    # -- the trip --------------------------------------------------------------------------

    def exchange(self, limit: int) -> list[Claim[Any]] | None:
        """A whole round trip: write what finished, claim up to ``limit``; the claims in
        order, or None when the database failed (what finished is written next time)."""
        finished = self._unwritten
        trip = self.run(finished, self._results_unwritten, limit)
        if trip is None:
            return None
        self._unwritten = []
        self._results_unwritten = False
        return self.settle(finished, *trip)

    def run(self, finished: list[Finished], with_results: bool, limit: int) -> Trip | None:
        """The claim statement: write ``finished`` as `done`, claim up to ``limit``. Its
        rows, the round's queues in order, and None, or, when the database refused the
        statement for what a result holds, no rows and what was written for each finished
        job on its own (``Apart``); None when the database failed (not known whether it
        committed: the finished jobs stay held and are written again on the next pass,
        the guard makes that harmless; claims it may have made come back through the
        reaper). Only the database here: an async child runs it in its DB thread while
        jobs run (brooq.worker.aio)."""
        plan = self._plan(finished, with_results, limit)
        if plan is None:  # nothing to claim from and nothing to write
            return [], [], None
        return self._execute(plan, finished)

    def _plan(self, finished: list[Finished], with_results: bool, limit: int) -> Plan | None:
        """This trip's plan, once the child's state it depends on is read and moved on:
        the paused queues, the pacing's turn, the floors' ranges. None: nothing to do."""
        self._turn = None  # set below when this trip claims a topic in its turn
        queues = self._claimable_queues() if limit else []
        if limit and not queues and self.pacing is not None:
            self.pacing.claimed(False, every_turn=True)  # every queue paused: sleep
        if not queues:  # nothing to claim from: only write what finished
            if not finished:
                return None
            limit, queues = 0, self.order.names[:1]
        turn: Turn | None = None
        ranges: list[Range] | None = None
        if self.pacing is not None:  # one topic claimed apart per round, in turn
            # A trip that only writes takes no turn (and tells nothing of a window).
            turn = self.pacing.next_turn() if limit else self.pacing.turns[0]
            self._turn = turn if limit else None
        elif limit:
            ranges = self.floors.start(queues, time.monotonic())
        common = {
            "topics": self.topics,
            "children": self.children,
            "worker": self.identity,
            "lease": self.settings.lease,
        }
        batch = self.pacing.batch(turn) if self.pacing is not None and turn is not None else None
        return claim_plan(finished, with_results, limit, queues, common, turn, ranges, batch)

    def _execute(self, plan: Plan, finished: list[Finished]) -> Trip | None:
        """Run ``plan``'s statement; what ``run`` returns."""
        statement = self.statements[plan.shape][plan.with_results]
        started = time.monotonic()
        try:
            conn = self.db.get()
            if self._turn is not None:  # a rated claim's start deadline counts from here
                self._sent_at = time.monotonic()
            cur = conn.cursor(row_factory=claim_row)
            if self.db.local is None:
                rows = cur.execute(statement, plan.params, prepare=True).fetchall()
            else:  # behind a transaction pooler: its settings first, in the same round trip
                with self.db.scoped(conn):
                    rows = cur.execute(statement, plan.params).fetchall()
        except psycopg.OperationalError as exc:
            self.db.failed("claim", exc)
            self._claims_fail(exc)
            self.floors.forget()
            return None
        except (
            psycopg.errors.InvalidSqlStatementName,
            psycopg.errors.DuplicatePreparedStatement,
        ) as exc:  # the child crashes either way: say why (brooq.db)
            raise prepared_mismatch(exc) or exc from None
        except psycopg.Error as exc:
            if not plan.with_results:
                raise  # no job's content in it: brooq's own fault, the child crashes
            # A result the database cannot hold (a character its encoding lacks) fails
            # the whole statement, which wrote nothing: each finished job is written on
            # its own, so that only the job whose result is refused is charged.
            log.warning(
                "event=done_refused jobs=%d error=%r: writing each on its own",
                len(finished),
                execute.describe(exc),
            )
            return [], plan.queues, self._write_apart(finished)
        if plan.limit and self.pacing is None:
            ended = time.monotonic()
            claimed = [(r.queue, r.priority, r.available_at, r.id) for r in rows if r.claimed]
            # The statement's now(), from a lease it gave: locked_until = now() + lease.
            at = next((r.locked_until for r in rows if r.claimed), None)
            claimed_at = None if at is None else at - timedelta(seconds=self.settings.lease)
            self.floors.end(claimed, claimed_at, started, ended)
        if self.claims_failing:
            self.claims_failing = False
            self._tell({"claims": "ok"})
        return rows, plan.queues, None

    def _claims_fail(self, exc: BaseException) -> None:
        """Tell the master once that claims fail, and why (its /readyz says so while every
        child's do): the database answers, but refuses them (a disk full, say)."""
        if not self.claims_failing:
            self.claims_failing = True
            first = str(exc).strip().splitlines()
            self._tell({"claims": "failing", "error": first[0] if first else type(exc).__name__})

    def _write_apart(self, finished: list[Finished]) -> Apart:
        """Write each finished job's `done` (and result) in a statement of its own."""
        apart: Apart = {}
        for claim, _, result in finished:
            policy = self.policies[claim.topic]
            apart[claim.id] = self.outcomes.write(claim, policy, execute.DONE, result)
        return apart

    def settle(
        self,
        finished: list[Finished],
        rows: list[ClaimRow],
        queues: list[str],
        apart: Apart | None = None,
    ) -> list[Claim[Any]]:
        """After a round trip: log and count the `done` written (or what was written for
        each on its own), and the claims in the order of the round (the queues as tried,
        then priority, then FIFO)."""
        if apart is not None:
            for claim, duration, _ in finished:
                state, outcome = apart[claim.id]
                self.outcomes.settled(claim, state, duration, outcome)
            return []
        turn = self._turn
        if turn is not None and turn.shape == "coordinated":
            assert self.pacing is not None
            rows = self.pacing.sift(rows, turn, self._sent_at)
        # Ids by their int here: a UUID's hash and comparisons are Python code, an
        # int's are not (and order the same).
        if finished:
            unwritten = {r.id.int for r in rows if not r.claimed}
            with logs.batch(log):  # the round trip's job_done lines in one write
                self.outcomes.settled_done(finished, unwritten)
        rank = {name: i for i, name in enumerate(queues)}
        claimed = sorted(
            (r for r in rows if r.claimed),
            key=lambda r: (rank.get(r.queue, 0), -r.priority, r.available_at, r.id.int),
        )
        if self.pacing is not None:
            if turn is not None:  # a claim, not a trip that only wrote
                self.pacing.claimed(bool(claimed))
            if self.start_by:  # a claim under a rate starts first: its deadline is near
                claimed.sort(key=lambda r: r.id not in self.start_by)
        return [r.claim() for r in claimed]

    def idle_wait(self) -> float:
        """How long an idle child sleeps before its next claim: poll_interval, or until
        a topic's window has room again if sooner."""
        if self.pacing is None:
            return self.settings.poll_interval
        return self.pacing.idle_wait(self.settings.poll_interval)

    def overdue(self, ids: list[uuid.UUID]) -> list[uuid.UUID]:
        """Those of ``ids`` past their start deadline now (brooq.worker.pacing)."""
        return [] if self.pacing is None else self.pacing.overdue(ids)

    def late(self, job_id: uuid.UUID) -> bool:
        """Whether a claim under a rate is past its start deadline: it must be given
        back unstarted (brooq.worker.pacing). Asked right before its start."""
        return self.pacing is not None and self.pacing.late(job_id)

    def _claimable_queues(self) -> list[str]:
        """This round's queues in order, without the paused ones. The pauses are read
        again once poll_interval has passed since the last reading, so an operator's pause
        holds for this child within poll_interval; if the read fails, the last one holds."""
        now = time.monotonic()
        if now - self._paused_read >= self.settings.poll_interval:
            try:
                rows = self.db.get().execute(
                    self.q.queue_paused_names, {"queues": self.order.names}, prepare=True
                )
                self.paused = frozenset(row[0] for row in rows)
                self._paused_read = now
            except psycopg.OperationalError as exc:
                self.db.failed("paused queues", exc)
        return [name for name in self.order.next() if name not in self.paused]

    # -- what is held ----------------------------------------------------------------------

    @property
    def held(self) -> Sequence[uuid.UUID]:
        """What we hold (claimed, running, finished unwritten), as the master was told."""
        return self._held

    def hold(self, held: list[uuid.UUID]) -> None:
        """What we hold now (the master renews those leases): told if it changed."""
        self._held = held
        self._tell_held(held)

    def let_go(self, ids: Collection[uuid.UUID]) -> None:
        """No longer hold ``ids`` (written, or given back): the master is told."""
        self.hold([i for i in self._held if i not in ids])

    def unstarted(self) -> list[uuid.UUID]:
        """What is held but neither finished nor written: the claims not started."""
        unwritten = {f[0].id for f in self._unwritten}
        return [i for i in self._held if i not in unwritten]

    def release(self, ids: list[uuid.UUID], late_topic: str | None = None) -> None:
        """Give back claims not started (pending, attempt refunded). Only the database:
        the caller says what it holds after. ``late_topic``: they are claims of that rated
        topic given back for a late start, and the places they took in its windows are
        set free again (job_release_ids_rated)."""
        if self.start_by and self.pacing is not None:
            for job_id in ids:
                self.pacing.forget(job_id)
        conn = self.db.get()
        turn = None if late_topic is None or self.pacing is None else self.pacing.turn(late_topic)
        if turn is not None and turn.allowance is not None:
            p = turn.params
            conn.execute(
                self.q.job_release_ids_rated,
                {
                    "ids": ids,
                    "worker": self.identity,
                    "topic": late_topic,
                    "rate": p["rate"],
                    "window": p["window"],
                    "group_rate": p["group_rate"],
                    "group_window": p["group_window"],
                    "allowance": turn.allowance,
                },
            )
        else:
            conn.execute(self.q.job_release_ids, {"ids": ids, "worker": self.identity})
        # They keep their place in line, behind this child's floors: its next claim reads
        # the ready index whole, so it takes them first.
        self.floors.forget()
