"""Carrying out the watchdog's decisions on the fleet, each pass of the master's loop.

Owns the side of the watchdog that acts: asking a child for its stack (SIGUSR2), killing
it (SIGKILL of its process group) with the log line and the brooq_children_killed_total
count that go with each reason, and giving back the batchmates of a job that runs long
so that other children run them meanwhile. What to do, and when, is decided by the pure
functions of brooq.supervisor.watchdog; what a killed child's jobs become is settled
when it is reaped (brooq.supervisor.settlement).

It must never wait: no signal is waited for, a stack not written in time is logged
empty, and a give-back that cannot reach the database is left to the child, which gives
its batchmates back itself when the long job returns.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
from functools import partial

from brooq.ipc import protocol
from brooq.ipc.reasons import ASYNC, LOOP_BLOCKED, MAX_EXECUTION_TIMEOUT, STALLED, killed_label
from brooq.metrics import Metrics
from brooq.rules import LONG_JOB
from brooq.settings import Settings
from brooq.supervisor import maintenance
from brooq.supervisor.childproc import ChildProc, empty_stack, killpg, read_stack
from brooq.supervisor.connections import Connections
from brooq.supervisor.fleet import Fleet
from brooq.supervisor.watchdog import (
    STACK_GRACE,
    BusyChild,
    HoldingChild,
    LoopView,
    decide,
    decide_stalled,
)

log = logging.getLogger("brooq.master")

STACK_READ_MAX = 65536  # characters of each part of a killed child's stack file read


class Enforcer:
    def __init__(
        self, fleet: Fleet, conns: Connections, settings: Settings, metrics: Metrics | None
    ) -> None:
        self.fleet = fleet
        self.conns = conns
        self.settings = settings
        self.metrics = metrics

    def run(self, now: float) -> None:
        children = self.fleet.children
        busy = [self._busy(c) for c in children.values() if c.jobs and c.kill_reason is None]
        decisions = decide(busy, now, self.settings.effective_watchdog_grace)
        decisions += decide_stalled(self._holding(now), now, self.settings.lease)
        decided = {d.pid for d in decisions}
        for c in children.values():
            asked = c.stack_requested_at
            if asked is not None and now - asked >= STACK_GRACE and c.pid not in decided:
                # Past the grace a limit still hit would be a kill: what asked is over (an
                # async child's job ended, its loop beats again). Ask afresh next time.
                c.stack_requested_at = None
        for d in decisions:
            c = children[d.pid]
            if d.action == "dump_stack":
                c.stack_requested_at = now
                empty_stack(c.stack_file)
                if c.kind == ASYNC and d.job is not None:
                    # A suspended job shows only the loop in the thread stacks: ask its
                    # control thread for the job's await chain as well.
                    protocol.send(c.to_child, f"stack {d.job}\n".encode())
                with contextlib.suppress(ProcessLookupError):
                    os.kill(c.pid, signal.SIGUSR2)
                continue
            c.kill_reason = d.reason
            c.kill_job = d.job
            if d.reason == STALLED:
                self._kill_stalled(c, now)
            else:
                self._kill_busy(c, now)
        self._give_back_batchmates()

    def _busy(self, c: ChildProc) -> BusyChild:
        loop = None
        if c.kind == ASYNC:
            culprit = c.board.culprit()
            loop = LoopView(
                beat=c.board.loop_beat(),
                culprit=culprit[0] if culprit else None,
                block_timeout=self.settings.loop_block_timeout,
            )
        return BusyChild(
            pid=c.pid,
            jobs=c.jobs,
            stack_requested_at=c.stack_requested_at,
            lease_lost=c.lease_lost,
            loop=loop,
        )

    def _kill_busy(self, c: ChildProc, now: float) -> None:
        assert c.kill_reason is not None
        if self.metrics is not None:
            self.metrics.killed.labels(killed_label(c.kill_reason)).inc()
        stack = read_stack(c.stack_file, 4000 if c.kind == ASYNC else 1500)
        c.kill_detail = f"; stack (most recent call first):\n{stack}" if stack else ""
        # Read again whole for the failed attempt's error history entry, where it is cut
        # so that the handler's frames show (brooq.ipc.tracebacks.killed_stack).
        c.kill_stack = read_stack(c.stack_file, STACK_READ_MAX)
        job = next((j for j in c.jobs if j.id == c.kill_job), c.job)
        others = f" in_flight={len(c.jobs)}" if c.kind == ASYNC else ""
        if c.kill_reason == MAX_EXECUTION_TIMEOUT and job is not None:
            log.error(
                "event=child_killed pid=%d job=%s topic=%s reason=max_execution_timeout "
                "limit=%gs ran=%.1fs%s\n%s",
                c.pid,
                job.id,
                job.topic,
                job.max_execution_timeout,
                now - job.started,
                others,
                stack,
            )
        elif c.kill_reason == LOOP_BLOCKED:
            log.error(
                "event=child_killed pid=%d job=%s topic=%s reason=loop_blocked blocked=%.1fs%s: "
                "a coroutine held the event loop without yielding; only it is charged, the "
                "other jobs go back with the attempt refunded\n%s",
                c.pid,
                job.id if job is not None and c.kill_job else "-",
                job.topic if job is not None and c.kill_job else "-",
                now - c.board.loop_beat(),
                others,
                stack,
            )
        else:
            log.error(
                "event=child_killed pid=%d job=%s topic=%s reason=hung_after_lease_lost "
                "grace=%gs%s\n%s",
                c.pid,
                job.id if job is not None else "-",
                job.topic if job is not None else "-",
                self.settings.effective_watchdog_grace,
                others,
                stack,
            )
        killpg(c.pid)

    def _holding(self, now: float) -> list[HoldingChild]:
        """Children holding jobs outside any handler, for the stall rule. While the master
        cannot reach the database either, nobody is stalled: it is an outage, and the
        clock starts again when the database is back."""
        holding = []
        for c in self.fleet.children.values():
            if not c.held_ids or c.jobs or c.kill_reason is not None:
                continue
            if not self.conns.ok or c.board.in_hooks():  # an outage; the application's hooks
                c.progress_at = now
                continue
            holding.append(HoldingChild(c.pid, c.progress_at, c.stack_requested_at))
        return holding

    def _kill_stalled(self, c: ChildProc, now: float) -> None:
        if self.metrics is not None:
            self.metrics.killed.labels(killed_label(STALLED)).inc()
        stack = read_stack(c.stack_file)
        log.error(
            "event=child_killed pid=%d worker=%s reason=stalled held=%d idle=%.1fs: it held "
            "jobs outside any handler for longer than the lease; they go back with the "
            "attempt refunded\n%s",
            c.pid,
            c.identity,
            len(c.held_ids),
            now - c.progress_at,
            stack,
        )
        killpg(c.pid)

    def _give_back_batchmates(self) -> None:
        """The batchmates a child will not run (they waited behind a job running for
        LONG_JOB; the child decided, see Child.batchmates_due) go back now, so that other
        children run them meanwhile. The child releases them again when the long job
        returns; the guard makes that a no-op."""
        for c in self.fleet.children.values():
            if not c.to_release or c.kill_reason is not None:
                continue
            ids, c.to_release = c.to_release, []
            released = self.conns.with_db(
                "give_back",
                partial(maintenance.release_ids, ids=ids, worker=c.identity, q=self.conns.q),
            )
            if released is None:
                continue  # the child gives them back itself when the long job returns
            gone = set(ids)  # not ours any more either way: never renew or report them
            c.held = [i for i in c.held if i not in gone]
            log.info(
                "event=batch_given_back pid=%d job=%s count=%d: running for more than %gs",
                c.pid,
                c.job.id if c.job is not None else "-",
                len(released),
                LONG_JOB,
            )
