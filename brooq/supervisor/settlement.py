"""How a child ended, and what that means for its jobs and for the fleet.

Owns the rule that turns the end of one child -- killed by the master and why, asked to
stop or retiring and why, or dead on its own with an exit status or a signal -- together
with whether it had said ready and the job left on its board, into what happens next:
which job gets a failed attempt and with what cause, whether everything it held goes
back, whether the death counts in the crash streak (brooq.supervisor.respawn), the
restart label and the level of the child_exited log line. It also reads the retire
reason a child sends, in both spellings a child of any version may use.

Pure functions over typed inputs: no clock (``now`` is an argument), no database, no
process, no log line. It must never act: brooq.supervisor.fleet applies the result and
brooq.supervisor.accounting writes it to the table.
"""

from __future__ import annotations

import logging
import signal
import uuid
from dataclasses import dataclass
from typing import Literal

from brooq.ipc.board import Running
from brooq.ipc.reasons import (
    ASYNC,
    CRASH,
    DRAIN_TIMEOUT,
    EXIT,
    EXIT_APP_LOAD_ERROR,
    FATAL,
    LEASE_LOST,
    LOOP_BLOCKED,
    MAX_EXECUTION_TIMEOUT,
    MAX_JOBS,
    MAX_MEMORY,
    STALLED,
    SYNC,
    ChildKind,
    KillReason,
    RestartReason,
    RetireReason,
    StopReason,
)
from brooq.ipc.tracebacks import killed_stack
from brooq.supervisor.respawn import CrashStreak

# What a child may send in {"retire": ...}: the spelling of before 2026-12 (a child
# forked by an older master during a reload across versions) maps to today's.
_RETIRE_SPELLINGS: dict[str, RetireReason] = {
    MAX_JOBS: MAX_JOBS,
    MAX_MEMORY: MAX_MEMORY,
    "max-jobs": MAX_JOBS,
    "max-memory": MAX_MEMORY,
}


def retire_reason(said: object) -> RetireReason | None:
    """The retire reason a child sent, in today's spelling; None for an unknown one."""
    return _RETIRE_SPELLINGS.get(str(said))


@dataclass(frozen=True)
class ChildEnd:
    """Everything settle() looks at, read by the fleet when it reaped the child."""

    code: int  # os.waitstatus_to_exitcode(): the exit status, or minus the signal
    kill_reason: KillReason | None  # the master killed it (SIGKILL), and why
    retiring: StopReason | RetireReason | None  # asked to stop, or said it retires
    ready: bool  # it had said ready
    jobs: tuple[Running, ...]  # the jobs left on its board (one at most: a sync child)
    stopping: bool  # the master is draining
    now: float  # monotonic time of the reap
    kill_detail: str = ""  # the stack read before a hard-timeout kill
    kill_stack: str = ""  # the same stack, read whole for the error history
    kill_job: uuid.UUID | None = None  # the job the watchdog killed it for
    culprit: uuid.UUID | None = None  # an async child: the job it found blocking its loop
    kind: ChildKind = SYNC
    settling: uuid.UUID | None = None  # the job whose outcome it was writing (its board)

    @property
    def job(self) -> Running | None:
        """The job a sync child ran; for an async child the guilty one, if known."""
        if self.kind == SYNC or len(self.jobs) == 1:
            return self.jobs[0] if self.jobs else None
        guilty = self.kill_job or self.culprit
        return next((j for j in self.jobs if j.id == guilty), None)


@dataclass(frozen=True)
class SettleHeld:
    """The job it ran (``job``; None: none) gets a failed attempt with ``cause`` if the
    child still holds it; every other job it held goes back with the attempt refunded
    (``because`` says why in their log lines and brooq_jobs_returned_total). The
    ``suspects`` (an async child that died with several jobs in flight and no culprit)
    go back too but count a lease expiry each, the reaper's bound for a job that takes
    its worker down: refunding them for free would let one such job kill child after
    child for ever, charging them all would fail the innocent.
    The failed attempt's error history entry: ``kind`` (killed by the watchdog, or
    worker_died), ``summary`` (its one-line error; "" : the cause) and ``traceback`` (the
    stack read before the kill, brooq.ipc.tracebacks' cut; None: none)."""

    job: uuid.UUID | None
    cause: str
    suspects: tuple[uuid.UUID, ...] = ()
    because: str = ""
    kind: str = "worker_died"
    summary: str = ""
    traceback: str | None = None


@dataclass(frozen=True)
class ReturnAll:
    """Everything it held goes back with the attempt refunded, and counts as returned
    by the master (which then exits 1): nothing it held failed."""


JobsVerdict = SettleHeld | ReturnAll | None


@dataclass(frozen=True)
class Settlement:
    label: RestartReason  # child_exited's reason= and brooq_child_restarts_total{reason}
    exit: str  # "signal=SIGKILL" or "exit_status=3", as child_exited logs it
    count_restart: bool  # whether brooq_child_restarts_total counts it
    level: int  # of the child_exited log line
    jobs: JobsVerdict  # what happens to the jobs it held (None: nothing to settle)
    outside_job: bool  # a death outside any job: the crash streak hears of it


def settle(end: ChildEnd) -> Settlement:
    code, kill = end.code, end.kill_reason
    if kill == DRAIN_TIMEOUT and code == 0 and not end.jobs:
        # It ended its drain by itself, holding nothing, in the pass that found the budget
        # spent (a stop with none: SIGQUIT): the kill met a process already gone.
        kill = None
    label: RestartReason = kill or end.retiring or (CRASH if code else EXIT)
    jobs: JobsVerdict = None
    job = end.job
    siblings = f"sibling_of={job.id}" if job is not None and len(end.jobs) > 1 else ""
    if kill == MAX_EXECUTION_TIMEOUT and job is not None:
        summary = (
            f"killed: max_execution_timeout {job.max_execution_timeout:g}s "
            f"exceeded (ran {end.now - job.started:.1f}s)"
        )
        jobs = SettleHeld(
            job.id,
            summary + end.kill_detail,
            because=siblings,
            kind="killed",
            summary=summary,
            traceback=killed_stack(end.kill_stack) or None,
        )
    elif kill == LOOP_BLOCKED:
        if job is not None:
            summary = (
                f"killed: the event loop was blocked by this job (ran "
                f"{end.now - job.started:.1f}s without yielding)"
            )
            jobs = SettleHeld(
                job.id,
                summary + end.kill_detail,
                because=siblings,
                kind="killed",
                summary=summary,
                traceback=killed_stack(end.kill_stack) or None,
            )
        else:  # C code holding the GIL: nobody could be named
            jobs = SettleHeld(
                None,
                "killed: its event loop was blocked and no job could be named",
                tuple(j.id for j in end.jobs),
                "suspect",
            )
    elif kill in (DRAIN_TIMEOUT, FATAL, STALLED):
        # A stalled child ran none of what it held (or finished them unwritten).
        jobs = ReturnAll()
    elif kill == LEASE_LOST:
        # The running job is no longer ours; give back what else it held (a batch).
        jobs = SettleHeld(None, "")
    elif code != 0 and job is None and end.settling is not None:
        # It died writing that job's outcome (an on_success hook that ends the process):
        # that job is charged, as if its handler had; the others go back.
        jobs = SettleHeld(
            end.settling,
            f"{_died(code)} while writing this job's outcome",
            because=f"sibling_of={end.settling}" if end.jobs else "",
        )
    elif code != 0:
        if end.kind == ASYNC and job is None and end.jobs:
            jobs = SettleHeld(None, _died(code), tuple(j.id for j in end.jobs), "suspect")
        else:
            jobs = SettleHeld(job.id if job else None, _died(code), because=siblings)
    asked_to_stop = end.retiring is not None and code in (0, -signal.SIGTERM)
    return Settlement(
        label=label,
        exit=f"signal={signal.Signals(-code).name}" if code < 0 else f"exit_status={code}",
        count_restart=not end.stopping,
        level=logging.INFO if code == 0 and kill is None else logging.ERROR,
        jobs=jobs,
        outside_job=(
            not end.jobs
            and end.settling is None
            and kill is None
            and not end.stopping
            and not asked_to_stop
            and (code != 0 or not end.ready)
        ),
    )


def _died(code: int) -> str:
    if code < 0:
        return f"worker died: {signal.Signals(-code).name}"
    return f"worker exited with status {code}"


# -- a death outside any job ----------------------------------------------------------------

OutsideJob = Literal["stale", "reload_failed", "streak"]


def outside_job(
    code: int, child_generation: int, generation: int, reload_from: int | None
) -> OutsideJob:
    """What a death outside any job is about: a generation given up already (stale), the
    new generation of a reload that cannot load the application (reload_failed: keep the
    old one), or the fleet itself (streak: count it)."""
    if child_generation != generation:
        return "stale"
    if code == EXIT_APP_LOAD_ERROR and child_generation > 0 and reload_from is not None:
        return "reload_failed"
    return "streak"


def storm_verdict(code: int, streak: CrashStreak) -> str | None:
    """After the streak counted this death: why the master must give up, or None (fork
    again after the streak's backoff)."""
    if code == EXIT_APP_LOAD_ERROR:
        return "children cannot load the application"
    if streak.fatal:
        return (
            f"{streak.count} children in a row died before becoming ready or "
            "before running a job; not respawning forever"
        )
    return None
