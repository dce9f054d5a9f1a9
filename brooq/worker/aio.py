"""An async child: one event loop running up to `concurrency` jobs of `async def` handlers.

The decisions behind it are in docs/decisions.md; the user's view is docs/async.md.
The loop runs in the main thread. brooq's own statements run in one DB thread on the
child's sync connection (brooq.worker.connection, brooq.worker.outcome unchanged), so the
loop never waits on the network for them while jobs run; an idle child (nothing in
flight) runs its round trip on the loop, since nothing would wait behind it. One
coroutine, the claimer, makes one round trip at a time: the `done` of the jobs finished
meanwhile and a claim of up to the free slots and half as many more, in the one statement of
the sync child (brooq.worker.roundtrip); again at once while claims come back non-empty,
else on a completion, a wake from the master or poll_interval. The claims beyond the free
slots start as slots free, without waiting for a trip (brooq.worker.tasks.Ahead); while
at least half of them wait, the claimer waits too. Each attempt's bookkeeping around
its task is the sync child's too (brooq.worker.attempt); what the control thread asks
(brooq.worker.control) is posted into the loop.

Interruptions are per task, never signals (a signal would land in whatever the loop runs
at that moment): the soft limit and a lost lease cancel that job's task with the reason,
which then becomes the attempt's exception (AttemptTimeout) or writes nothing (LeaseLost),
while its siblings go on. The hard limits stay the master's: a job past its
max_execution_timeout, or a loop that stops beating on the board (a coroutine that never
yields), gets the child killed and only the guilty job charged (brooq.supervisor).

Must never: run a sync handler (a sync child does), raise into a task from another
thread (the control thread posts into the loop), cancel a task outside its handler (the
outcome write after it is brooq's), or write an outcome other than through the guarded
statements.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
import traceback
import uuid
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import psycopg

from brooq.ipc.board import LOOP_BEAT
from brooq.ipc.reasons import EXIT_CRASHED, EXIT_OK
from brooq.job import Claim, LeaseLost
from brooq.worker import joblogs
from brooq.worker.connection import Stop
from brooq.worker.culprit import Culprit, title
from brooq.worker.process import ChildProcess
from brooq.worker.spans import Spans
from brooq.worker.tasks import AHEAD_SLOW, Ahead, Slot, SoftLimits
from brooq.worker.traces import await_frames, format_await_chain, format_frames

log = logging.getLogger("brooq.child")

# On a drain, what still runs this long before graceful_timeout is cancelled and given
# back by the child itself, so the jobs that finished are written (the master's kill at
# the deadline would return them too).
DRAIN_MARGIN = 1.0


class _Shutdown(BaseException):
    """The reason of a task cancelled by a drain: its job goes back, attempt refunded."""


class AsyncLoop:
    """An async child's loop, and its answers to the control thread."""

    def __init__(self, child: ChildProcess) -> None:
        self.child = child
        self.settings = child.settings
        self.capacity = max(1, child.settings.concurrency)
        self.free = list(range(self.capacity - 1, -1, -1))  # pop() gives the lowest slot
        self.in_flight: dict[uuid.UUID, Slot] = {}
        self.by_task: dict[asyncio.Task[None], Slot] = {}
        self.db = ThreadPoolExecutor(1, thread_name_prefix="brooq-db")
        self.retiring = False
        self.crashed: BaseException | None = None
        self.to_release: list[uuid.UUID] = []
        self.ahead = Ahead(self.capacity, child.trips.pacing is not None)
        self._waiter: asyncio.Future[None] | None = None  # the claimer's, while it waits
        self._loop: asyncio.AbstractEventLoop | None = None
        self.limits: SoftLimits | None = None  # the loop's soft-limit timers
        self.culprit = Culprit()  # the control thread's: who blocks the loop

    # -- the process --------------------------------------------------------------------

    def run(self) -> int:
        code = EXIT_OK
        try:
            code = asyncio.run(self._main())
        except Stop:
            pass
        finally:
            self.db.shutdown(wait=False)
            self.child.meter.flush()
        return code

    async def _main(self) -> int:
        loop = asyncio.get_running_loop()
        self._loop = loop
        self.limits = SoftLimits(loop)
        state = self.child.state
        # SIGTERM keeps the child's own handler (brooq.worker.attempt: it sets
        # state.stopping, and Python's wakeup fd writes to the wake pipe, read here), not
        # loop.add_signal_handler: a round trip run on the loop (an idle child's, below)
        # or a reconnect's backoff then sees the stop at once, as in a sync child.
        loop.add_reader(state.wake_r, self._on_wake_pipe)
        state.loop = self  # the control thread posts into the loop through it
        self._beat()
        try:
            await self._claim_loop()
        finally:
            await self._finish_up()
            state.loop = None
        return EXIT_CRASHED if self.crashed is not None else EXIT_OK

    def _on_wake_pipe(self) -> None:
        state = self.child.state
        try:
            while os.read(state.wake_r, 4096):
                pass
        except BlockingIOError:
            pass
        self._poke()

    def _poke(self) -> None:
        """Wake the claimer if it waits. Pokes come from loop callbacks only, and the
        claimer looks at what is owed right before it waits, so none is lost."""
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _beat(self) -> None:
        assert self._loop is not None
        self.child.board.beat(time.monotonic())
        self._loop.call_later(LOOP_BEAT, self._beat)
        if self.ahead.claims:
            self._poke()  # the claimer looks at how long they have waited

    # -- claiming -----------------------------------------------------------------------

    async def _claim_loop(self) -> None:
        child, state = self.child, self.child.state
        shallow = False
        while self.crashed is None:
            stopping = state.stopping or self.retiring
            if self.ahead.claims and (state.stopping or self.ahead.stale(time.monotonic())):
                self.ahead.on = False  # no slot freed in time, or a stop: given back
                self.to_release += self.ahead.take_all()
                await self._give_back("drain" if state.stopping else "no_slot_freed")
                continue
            # A slot frees when its task is done; claims ahead wait for one (tasks.Ahead).
            limit = 0 if stopping else len(self.free) + self.ahead.room()
            want = limit > 0 and not shallow
            if want or child.trips.owed:
                if self.ahead.full_enough() and not self.free and not stopping:
                    await self._wait(None)  # the next trip once half is used (or _beat)
                    continue
                claims = await self._round_trip(limit if want else 0)
                if claims is None:  # the database failed: back off a little
                    shallow = True
                    await self._wait(min(1.0, self.settings.poll_interval))
                    continue
                if want:
                    # Only an empty claim means the queue is empty: a short one may be
                    # the fair share (ceil(ready / children)), and more are ready.
                    shallow = not claims
                self._start(claims)
                continue
            if stopping and not self.in_flight and not self.to_release and not self.ahead.claims:
                return
            if self.to_release:
                await self._give_back()
                continue
            self._set_busy()  # once per pass, not per completion
            await self._wait(None if stopping else child.trips.idle_wait())
            shallow = False  # a completion, a wake-up or poll_interval: claim again

    async def _wait(self, timeout: float | None) -> None:
        """Until a poke or ``timeout``: a bare future and a timer, not asyncio.wait_for
        (a task per wait, loop iterations on the pickup path)."""
        assert self._loop is not None
        waiter = self._loop.create_future()
        self._waiter = waiter
        timer = None
        if timeout is not None:
            timer = self._loop.call_later(timeout, self._poke)
        try:
            await waiter
        finally:
            self._waiter = None
            if timer is not None:
                timer.cancel()

    async def _round_trip(self, limit: int) -> list[Claim[Any]] | None:
        child, trips = self.child, self.child.trips
        finished, with_results = trips.take()
        loop = asyncio.get_running_loop()
        try:
            if self.in_flight:  # the loop runs jobs: the statement waits in the DB thread
                trip = await loop.run_in_executor(self.db, trips.run, finished, with_results, limit)
            else:
                # Nothing runs that a wait on the loop could hold up: two thread hops
                # fewer, which is an idle child's pickup latency. The board is empty, so
                # the master ignores the beat.
                trip = trips.run(finished, with_results, limit)
        except Stop:
            # Stopping while the database is unreachable: what is held comes back through
            # the master (its drain deadline) or the reaper.
            trips.put_back(finished, with_results)
            raise
        if trip is None:  # not known whether it committed: written again next time
            trips.put_back(finished, with_results)
            return None
        claims = trips.settle(finished, *trip)
        lost = child.state.lost
        if lost:  # (a UUID's hash is Python code: not per job when none is lost)
            for claim in claims:
                lost.discard(claim.id)  # claimed again: ours now
        self._tell_held(claims)
        if lost:
            lost.intersection_update(trips.held)
        child.meter.counted(claims)
        if child.spans is not None and claims:  # their trace context: brooq.worker.spans
            await loop.run_in_executor(self.db, child.spans.fetch, claims)
        return claims

    def _tell_held(self, new: Sequence[Claim[Any]] = ()) -> None:
        """The master renews what we hold: in flight, finished unwritten, just claimed.
        Sent before the new jobs start."""
        trips = self.child.trips
        held = [
            *(i for i, s in self.in_flight.items() if not s.settled),
            *trips.unwritten_ids(),
            *(c.id for c in new),
            *self.ahead.ids(),
            *self.to_release,
        ]
        # Each once, in order; by the id's int (hashed in C, a UUID's hash is Python).
        trips.hold(list({i.int: i for i in held}.values()))

    def _set_busy(self) -> None:
        self.child.meter.running(len(self.in_flight))

    # -- running jobs -------------------------------------------------------------------

    def _start(self, claims: list[Claim[Any]]) -> None:
        loop = self._loop
        assert loop is not None
        now = time.monotonic()
        for claim in claims:
            if not self.free:  # claimed ahead: started when a slot frees (_done)
                self.ahead.claims.append((claim, now))
                continue
            slot = Slot(self.free.pop(), claim, limits=self.limits)
            self.in_flight[claim.id] = slot
            task = loop.create_task(self._run_one(slot))
            slot.task = task
            self.by_task[task] = slot
            task.add_done_callback(self._done)
        self._set_busy()

    async def _run_one(self, slot: Slot) -> None:
        child = self.child
        claim = slot.claim
        policy = child.policies[claim.topic]
        if child.trips.start_by and child.trips.late(claim.id):
            # Under a rate, and not started within its allowance (brooq.worker.pacing).
            log.info(
                "event=job_returned job=%s topic=%s attempt_refunded=1 because=late_start",
                claim.id,
                claim.topic,
            )
            with contextlib.suppress(Stop, psycopg.Error):  # else the reaper returns it
                await asyncio.get_running_loop().run_in_executor(
                    self.db, child.trips.release, [claim.id], claim.topic
                )
            slot.settled = True
            self._tell_held()
            return
        slot.started = time.monotonic()
        refused = child.attempts.begin(claim, policy, slot.started, slot.index)
        error: BaseException | None = refused
        value: Any = None
        kept = span = None
        if refused is None:
            if child.keeps and claim.topic in child.keeps:
                kept = joblogs.Kept(child.keeps[claim.topic])
                joblogs.current.set(kept)  # this task's own context
            if child.state.lost and claim.id in child.state.lost:
                error = LeaseLost(f"lease of job {claim.id} lost")
            elif child.spans is None:
                error, value = await slot.call(child.runners[claim.topic], policy.attempt_timeout)
            else:  # the attempt's span is current in this task while the handler runs
                with child.spans.attempt(claim) as span:
                    error, value = await slot.call(
                        child.runners[claim.topic], policy.attempt_timeout
                    )
        if isinstance(slot.reason, _Shutdown):
            if span is not None:
                Spans.end(span, None, "given back", None)
            child.board.clear(slot.index)
            self.to_release.append(claim.id)  # given back by the claimer, attempt refunded
            return
        if error is not None and isinstance(error, KeyboardInterrupt | SystemExit):
            log.warning("event=handler_exit job=%s raised=%s", claim.id, type(error).__name__)
        outcome, result, tb, duration = child.attempts.end(
            claim, policy, error, value, refused, slot.started, slot.index
        )
        if span is not None:
            Spans.end(span, error, outcome.kind, outcome.error)
        self.ahead.slow = duration >= AHEAD_SLOW
        text = None if kept is None else kept.text()
        if text is None and child.trips.keep_done(claim, outcome, duration, result):
            return
        try:
            written_state, written = await asyncio.get_running_loop().run_in_executor(
                self.db, child.outcomes.write, claim, policy, outcome, result, text
            )
        except Stop:
            return  # the lease expires and the reaper returns it
        if outcome.kind != "abandon":
            child.outcomes.settled(claim, written_state, duration, written, tb)
        # Tell the master at once, as a sync child does: a renewal that finds the job
        # settled would report its lease lost after it may have been claimed again.
        slot.settled = True
        self._tell_held()

    def _done(self, task: asyncio.Task[None]) -> None:
        slot = self.by_task.pop(task)
        self.in_flight.pop(slot.claim.id, None)
        self.free.append(slot.index)
        if not task.cancelled() and task.exception() is not None:
            # brooq's own code failed around the handler: like a sync child's crash.
            exc = task.exception()
            assert exc is not None
            log.error(
                "event=child_crashed job=%s\n%s",
                slot.claim.id,
                "".join(traceback.format_exception(exc)).rstrip(),
            )
            self.crashed = exc
        self.child.jobs_done += 1
        if not self.retiring and self.child.may_retire and self.child.should_retire():
            self.retiring = True
        self.ahead.on = True
        if self.ahead.claims and not (self.crashed or self.child.state.stopping):
            self._start([self.ahead.claims.popleft()[0]])  # the slot waits for no trip
        if not self.ahead.full_enough():  # else the claimer has nothing to do yet
            self._poke()

    # -- interruptions --------------------------------------------------------------------

    def on_lost(self, job_id: uuid.UUID) -> None:
        """The control thread heard `lost <id>` (state.lost has it already)."""
        assert self._loop is not None
        self._loop.call_soon_threadsafe(self._lost, job_id)

    def _lost(self, job_id: uuid.UUID) -> None:
        slot = self.in_flight.get(job_id)
        if slot is not None:
            slot.interrupt(LeaseLost(f"lease of job {job_id} lost"))

    def on_drain(self) -> None:
        """The master said this stop is a drain: its deadline is graceful_timeout."""
        assert self._loop is not None
        self._loop.call_soon_threadsafe(self._arm_drain_deadline)

    def _arm_drain_deadline(self) -> None:
        assert self._loop is not None
        delay = max(0.0, self.settings.graceful_timeout - DRAIN_MARGIN)
        self._loop.call_later(delay, self._drain_deadline)

    def _drain_deadline(self) -> None:
        for slot in list(self.in_flight.values()):
            slot.interrupt(_Shutdown("brooq: shutting down"))

    async def _give_back(self, because: str = "drain") -> None:
        ids, self.to_release = self.to_release, []
        child = self.child
        loop = asyncio.get_running_loop()
        with contextlib.suppress(Stop, psycopg.Error):  # else the reaper returns them
            await loop.run_in_executor(self.db, child.trips.release, ids)
        for job_id in ids:
            log.warning("event=job_returned job=%s attempt_refunded=1 because=%s", job_id, because)
        self._tell_held()

    async def _finish_up(self) -> None:
        """Before exiting: write what finished (also when the master is gone: a finished
        job whose `done` is not written runs again once its lease expires). Jobs still in
        flight here (only after brooq's own code failed) are given back, never failed."""
        tasks = [s.task for s in self.in_flight.values() if s.task is not None]
        for slot in list(self.in_flight.values()):
            slot.interrupt(_Shutdown("brooq: the child is stopping"))
        if tasks:
            await asyncio.wait(tasks, timeout=1.0)
        if self.child.trips.owed:
            await self._round_trip(0)
        self.to_release += self.ahead.take_all()
        if self.to_release:
            await self._give_back()

    # -- the control thread's view ----------------------------------------------------------

    def watch(self, now: float) -> None:
        """Called by the control thread every TITLE_TICK (brooq.worker.culprit)."""
        self.culprit.watch(self.child.board, self._loop, self.by_task, now)

    def await_chain(self, job_id: uuid.UUID) -> str:
        """The await chain of a job's task, outermost first, as a traceback reads (the
        thread stacks show only the loop while a task is suspended)."""
        slot = self.in_flight.get(job_id)
        if slot is None or slot.task is None:
            return ""
        return format_await_chain(slot.task)

    def stack_text(self, job_id: uuid.UUID) -> str:
        """`brooq jobs stack`: the job's await chain as a traceback ("" if not here)."""
        slot = self.in_flight.get(job_id)
        if slot is None or slot.task is None:
            return ""
        return format_frames(await_frames(slot.task))

    def batchmates_due(self, now: float) -> list[uuid.UUID]:
        return []  # every job claimed starts at once: none waits behind another

    def title(self) -> str:
        """The jobs in flight, per topic, and the oldest's age."""
        return title(list(self.in_flight.values()), self.capacity)
