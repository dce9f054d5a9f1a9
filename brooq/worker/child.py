"""A sync worker process: claim -> run the handler -> write the outcome, one job at a time.

The child's parts are set up after fork by brooq.worker.process (connection, board,
meter, link to the master); one round trip writes the finished jobs' `done` and claims
the next (brooq.worker.roundtrip); each attempt's bookkeeping around the handler call is
brooq.worker.attempt's, and the call itself, with its interruptions armed,
brooq.worker.attempt's. This module owns `Child`, the sync loop with its adaptive
batches and what it answers the control thread (brooq.worker.control: a lost lease is a
SIGUSR1 to the main thread, a stack is the main thread's frames), and `main`, the entry
point after fork, which runs a sync child here or an async one (brooq.worker.aio).

Must never renew a lease (the master does), never write an outcome other than through
the guarded statements (the batched `done` of job_finish_and_claim or OutcomeWriter),
and never let an exception raised outside a handler pass as the handler's.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
import traceback
import uuid
from collections.abc import Sequence

import psycopg

from brooq import logs, tracing
from brooq.ipc.reasons import ASYNC, EXIT_APP_LOAD_ERROR, EXIT_BOOT_ERROR, EXIT_CRASHED, EXIT_OK
from brooq.job import Claim
from brooq.rules import LONG_JOB
from brooq.worker import attempt, joblogs
from brooq.worker.aio import AsyncLoop
from brooq.worker.connection import Stop
from brooq.worker.process import ChildProcess
from brooq.worker.state import BATCH_BUDGET, ChildConfig
from brooq.worker.traces import format_frames

__all__ = ["Child", "main"]

log = logging.getLogger("brooq.child")


class Child(ChildProcess):
    """A sync child: its loop, and its answers to the control thread."""

    def __init__(self, config: ChildConfig) -> None:
        super().__init__(config)
        self.batch = 1
        self._main_thread = threading.get_ident()
        self._gave_back_at: float | None = None  # the start of the job whose batch went back
        self.state.loop = self

    # -- the loop ---------------------------------------------------------------------------
    #
    # Claims are adaptive: one job at a time by default; while recent jobs are short and
    # the queue keeps the batch full, a few at once (up to claim_batch_max), so one round
    # trip writes the finished jobs' `done` and claims the next ones. A long job drops the
    # batch back to one and gives back what it had claimed beyond the job it runs.

    def run(self) -> int:
        try:
            while not self.state.stopping:
                claims = self._flush_and_claim(self.batch)
                if not claims:
                    self.state.sleep(self.trips.idle_wait())
                    continue
                if self._run_batch(claims):
                    break
        except Stop:
            pass
        finally:
            self._finish_up()
        return EXIT_OK

    def _finish_up(self) -> None:
        """Before exiting: give back what was not started, write what finished. Also when
        the master is gone: the database may well be up, and a finished job whose `done`
        is not written runs again once its lease expires."""
        trips = self.trips
        try:
            unstarted = trips.unstarted()
            if unstarted:
                self._release(unstarted)
            if trips.owed:
                self._flush_and_claim(0)
        except (Stop, psycopg.Error):
            pass  # the leases expire and the reaper returns the jobs
        self.meter.flush()

    def _run_batch(self, claims: list[Claim]) -> bool:
        """Run claimed jobs in order; True when the child must retire."""
        elapsed = 0.0
        start_by = self.trips.start_by  # claims under a rate: a start deadline each
        gone: set[uuid.UUID] = set()  # given back late with an earlier claim of the batch
        for i, claim in enumerate(claims):
            if gone and claim.id in gone:  # a UUID hashes in Python code: not per job
                continue
            if self.state.stopping:
                self._release([c.id for c in claims[i:] if c.id not in gone])
                return False
            if start_by and self.trips.late(claim.id):
                overdue = self.trips.overdue([c.id for c in claims[i + 1 :]])
                gone.update(overdue)
                self._give_back_late(claim, overdue)
                continue
            duration = self._run_one(claim, claims, i + 1)
            elapsed += duration
            # The rest of the batch is sliced only when it goes back (not per job).
            if duration >= LONG_JOB and i + 1 < len(claims):
                # Others may run them sooner. The control thread asked the master to give
                # them back already, at LONG_JOB into the job: this is a no-op for those.
                self._release([c.id for c in claims[i + 1 :]])
                self.batch = 1
                return self.should_retire()
            if self.may_retire and self.should_retire():
                self._release([c.id for c in claims[i + 1 :]])
                return True
        self._adapt(len(claims), elapsed / len(claims))
        return False

    def _adapt(self, claimed: int, mean: float) -> None:
        cap = max(1, self.settings.claim_batch_max)
        fits = int(BATCH_BUDGET / mean) if mean > 0 else cap
        target = max(1, min(cap, fits))
        if claimed >= self.batch:  # the queue filled the batch: it may grow
            self.batch = min(self.batch * 2, target)
        else:  # the queue runs shallow: shrink
            self.batch = max(1, min(self.batch // 2, target))

    def _flush_and_claim(self, limit: int) -> list[Claim]:
        """Write `done` for the finished jobs and claim up to ``limit`` new ones, in one
        statement. Tells the master the new state: busy comes with each job, idle here."""
        self.attempts.forget_cpu()  # the round trip is not the next attempt's
        claims = self.trips.exchange(0 if self.state.stopping else limit)
        if claims is None:
            return []
        # What the master said was lost concerned earlier claims: every job held now was
        # just claimed, and is ours even if it is a job claimed before (canceled, then
        # retried). A notice about a new claim comes again at the next renewal.
        self.state.lost.clear()
        # The master renews what we hold: it must know before any of these jobs runs.
        self.trips.hold([c.id for c in claims])
        self.meter.claimed(claims)
        if self.spans is not None:
            self.spans.fetch(claims)
        return claims

    def _give_back_late(self, claim: Claim, overdue: list[uuid.UUID]) -> None:
        """A claim under a rate that could not start within its allowance: started now,
        it could break the rate the handlers see (brooq.worker.pacing); the ``overdue``
        ones of its batch go back with it, in one round trip."""
        log.info(
            "event=job_returned job=%s topic=%s attempt_refunded=1 because=late_start%s",
            claim.id,
            claim.topic,
            f" with={len(overdue)}" if overdue else "",
        )
        self._release([claim.id, *overdue], late_topic=claim.topic)

    def _release(self, ids: list[uuid.UUID], late_topic: str | None = None) -> None:
        if not ids:
            return
        self.attempts.forget_cpu()
        try:
            self.trips.release(ids, late_topic)
        except psycopg.OperationalError as exc:
            self.db.failed("release", exc)  # the reaper returns them after the lease
        self.trips.let_go(ids)

    def _run_one(self, claim: Claim, batch: Sequence[Claim] = (), after: int = 0) -> float:
        """Run one claimed job; write its outcome, or keep a plain `done` for the next
        round trip. Returns how long the handler ran."""
        policy = self.policies[claim.topic]
        state = self.state
        started = state.started = time.monotonic()
        state.running = claim
        # No list is made per job: the control thread slices batch[after:] if it must.
        state.tail = (started, batch, after) if after < len(batch) else None
        if log.isEnabledFor(logging.DEBUG):
            log.debug(
                "event=job_claimed job=%s topic=%s attempt=%d",
                claim.id,
                claim.topic,
                claim.attempt,
            )
        attempts = self.attempts
        refused = attempts.begin(claim, policy, started)
        kept = None
        if refused is None:
            # The handler's own log records name its job (brooq.logs); a keep_logs
            # handler's are kept for it too (brooq.worker.joblogs).
            context = logs.current_job.set((claim.id, claim.topic))
            if self.keeps and claim.topic in self.keeps:
                kept = joblogs.Kept(self.keeps[claim.topic])
                kept_context = joblogs.current.set(kept)
            try:
                if self.spans is None:
                    error, value = attempt.call(self.runners[claim.topic], claim, policy, state)
                else:  # the attempt's span is current while the handler runs
                    with self.spans.attempt(claim) as span:
                        error, value = attempt.call(self.runners[claim.topic], claim, policy, state)
            finally:
                logs.current_job.reset(context)
                if kept is not None:
                    joblogs.current.reset(kept_context)
        else:  # the handler and its middleware run zero times
            error, value = refused, None
        state.tail = None  # before the duration is taken: see ChildState.tail
        outcome, result, tb, duration = attempts.end(claim, policy, error, value, refused, started)
        if self.spans is not None:
            self.attempts.forget_cpu()  # a span's end is the tracer's work, not the job's
            if refused is None:
                self.spans.end(span, error, outcome.kind, outcome.error)
        state.running = None
        self.jobs_done += 1
        text = None if kept is None else kept.text()
        if text is None and self.trips.keep_done(claim, outcome, duration, result):
            return duration  # written with the next claim
        self.attempts.forget_cpu()  # the write is not the next attempt's
        written_state, written = self.outcomes.write(claim, policy, outcome, result, text)
        if outcome.kind != "abandon":
            self.outcomes.settled(claim, written_state, duration, written, tb)
        # Tell the master at once (outcomes other than a plain done are rare): a renewal
        # that finds this job settled would report its lease lost, and the report could
        # reach us after the job, retried, was claimed again.
        self.trips.let_go((claim.id,))
        return duration

    # -- the control thread's questions (brooq.worker.control) ------------------------------

    def on_lost(self, job_id: uuid.UUID) -> None:
        running = self.state.running
        if running is not None and running.id == job_id:
            # The signal handler (brooq.worker.attempt) raises only inside the handler.
            signal.pthread_kill(self._main_thread, signal.SIGUSR1)

    def on_drain(self) -> None:
        pass  # the job running finishes; SIGTERM already stops the loop after it

    def await_chain(self, job_id: uuid.UUID) -> str:
        return ""  # the main thread's stack, in the thread stacks, is the job's

    def stack_text(self, job_id: uuid.UUID) -> str:
        """The main thread's frames, read from the control thread (sys._current_frames)."""
        running = self.state.running
        if running is None or running.id != job_id:
            return ""
        frame = sys._current_frames().get(self._main_thread)
        return format_frames(traceback.extract_stack(frame)) if frame else ""

    def batchmates_due(self, now: float) -> list[uuid.UUID]:
        """The batchmates of a job running LONG_JOB, once per job: the main thread will
        not run them (see ChildState.tail)."""
        tail = self.state.tail
        if tail is None or tail[0] == self._gave_back_at:
            return []
        started, batch, after = tail
        if now - started < LONG_JOB:
            return []
        self._gave_back_at = started
        return [c.id for c in batch[after:]]

    def watch(self, now: float) -> None:
        pass  # a blocked main thread is the watchdog's: its board entry ages

    def title(self) -> str:
        claim, started = self.state.running, self.state.started
        if claim is None:
            return "brooq-child: idle"
        return (
            f"brooq-child: {claim.topic} {claim.id} attempt {claim.attempt} "
            f"running {time.monotonic() - started:.0f}s"
        )


def main(config: ChildConfig) -> None:
    """Entry point right after fork(); never returns."""
    from brooq.errors import AppLoadError

    try:
        child = ChildProcess(config) if config.kind == ASYNC else Child(config)
        child.setup()
    except BaseException as exc:
        log.error("event=child_boot_failed error=%r", f"{type(exc).__name__}: {exc}")
        os._exit(EXIT_APP_LOAD_ERROR if isinstance(exc, AppLoadError) else EXIT_BOOT_ERROR)
    code = EXIT_CRASHED
    try:
        code = child.run() if isinstance(child, Child) else AsyncLoop(child).run()
    except BaseException:
        log.exception("event=child_crashed")
    finally:
        tracing.flush()  # the spans a provider still holds: os._exit runs no atexit hook
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
