"""The fleet: the master's children, from fork to reap.

Owns the children (brooq.supervisor.childproc), forking a child and, in the child,
closing every descriptor of the master and of its siblings; reading what children say on
their pipes (brooq.supervisor.childmessages: the fleet is a source of the master's loop)
and post on their boards (brooq.ipc.board); reaping them
and applying how each one ended (brooq.supervisor.settlement); generations and reload;
the crash streak and its respawn backoff (brooq.supervisor.respawn); scaling up and
down; asking children to stop (SIGTERM) and killing them (SIGKILL of the process group).

It must never block: pipes are non-blocking, waitpid is WNOHANG, and a child that does
not read its pipe loses a message rather than stopping the master. It never writes to
the database itself (what a dead child owes goes to brooq.supervisor.accounting), never
holds a lock or runs a thread across fork, and never runs application code: this is the
one module of the master that imports brooq.worker, for the child's entry point and its
configuration at fork time.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import tempfile
import time
import uuid
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path

from brooq import metrics as metrics_mod
from brooq.declare.handlers import Handler, Middleware
from brooq.ipc import protocol
from brooq.ipc.board import Board
from brooq.ipc.reasons import (
    ASYNC,
    DRAIN,
    EXIT_BOOT_ERROR,
    RELOAD,
    RELOAD_FAILED,
    SCALE_DOWN,
    SYNC,
    ChildKind,
    KillReason,
    StopReason,
    killed_label,
)
from brooq.metrics import Metrics
from brooq.settings import Settings
from brooq.supervisor.accounting import Accounting
from brooq.supervisor.childmessages import StackAnswer, read_messages
from brooq.supervisor.childproc import ChildProc, killpg
from brooq.supervisor.respawn import STABLE_AFTER, CrashStreak
from brooq.supervisor.settlement import outside_job, settle, storm_verdict
from brooq.supervisor.source import Source

# The master's one import of the worker: what a child runs right after fork.
from brooq.worker.child import main as child_main
from brooq.worker.state import ChildConfig, identity_for

__all__ = ["MASTER_SIGNALS", "Fleet", "ForkSpec"]

log = logging.getLogger("brooq.master")


# What the master catches (each handler only wakes its loop); blocked across a fork.
MASTER_SIGNALS = (
    signal.SIGTERM,
    signal.SIGINT,
    signal.SIGQUIT,
    signal.SIGHUP,
    signal.SIGTTIN,
    signal.SIGTTOU,
    signal.SIGCHLD,
)


@dataclass(frozen=True)
class ForkSpec:
    """What every child of this master is forked with."""

    dsn: str
    settings: Settings
    handlers: dict[str, Handler]
    app_spec: str
    baseline: frozenset[str]  # sys.modules before the app: what a reload must not re-import
    metrics: Metrics | None
    middleware: tuple[Middleware, ...] = ()  # the Queue's (a reload takes the new Queue's)
    child_start: tuple[Callable[[], object], ...] = ()  # @queue.on_child_start, likewise


class Fleet(Source):
    """``master_fds`` gives the descriptors of the master (every source of its loop, the
    children's pipes included) that a forked child closes. A source of the master's loop
    itself: the children's pipes, read when readable."""

    def __init__(
        self, spec: ForkSpec, accounting: Accounting, master_fds: Callable[[], list[int]]
    ) -> None:
        self.spec = spec
        self.accounting = accounting
        self.metrics = spec.metrics
        self._master_fds = master_fds
        self.target = spec.settings.workers
        # Which kinds of child this application needs (docs/async.md: children are
        # split by kind, so neither kind starves the other).
        kinds = {h.is_async for h in spec.handlers.values()}
        self.mixed = kinds == {True, False}
        self.all_async = kinds == {True}
        if self.mixed and self.target < 2:
            log.warning(
                "event=workers_raised workers=2 reason='an application with sync and async "
                "handlers needs a child of each kind'"
            )
            self.target = 2
        self.children: dict[int, ChildProc] = {}
        self.generation = 0  # the generation new children belong to
        self.generations = 0  # every generation ever started, so numbers are never reused
        self.reload_from: int | None = None  # the old generation while a reload is pending
        self.stopping = False
        self.fatal: str | None = None
        self.crashes = CrashStreak()  # children dying outside any job
        self.runtime_dir = Path(tempfile.mkdtemp(prefix="brooq-master-"))
        self.other_reaped: Callable[[int], object] | None = None  # a pid not a worker's
        self.changed: Callable[[], object] = lambda: None  # a child forked or reaped
        # Stacks children sent for `brooq jobs stack`: (worker, job, text), to be written.
        self.stack_answers: list[StackAnswer] = []

    # -- the source: the children's pipes ------------------------------------------------

    def read_fds(self) -> list[int]:
        return [c.reader.fd for c in self.children.values()]

    def service(self, readable: Collection[int], writable: Collection[int] = ()) -> None:
        now = time.monotonic()
        for c in list(self.children.values()):
            if c.reader.fd in readable:
                self.read_child(c, now)

    def fds(self) -> list[int]:
        return [fd for c in self.children.values() for fd in c.fds]

    def close(self) -> None:
        for f in self.runtime_dir.glob("*"):
            f.unlink(missing_ok=True)
        self.runtime_dir.rmdir()

    # -- the target ----------------------------------------------------------------------

    def current(self) -> list[ChildProc]:
        return [
            c
            for c in self.children.values()
            if c.generation == self.generation and c.retiring is None
        ]

    def manage(self) -> bool:
        """Fork up to the target (after a crash streak's backoff), stop the extra ones,
        end a reload whose new generation is ready. Returns whether there were children of
        the current generation when the pass began, all of them ready."""
        current = self.current()
        now = time.monotonic()
        if self.crashes.count and any(now - c.born >= STABLE_AFTER for c in current):
            self.crashes.healthy()
        if now >= self.crashes.fork_at():  # after deaths outside a job: backoff
            for kind, wanted in self.targets().items():
                have = sum(1 for c in current if c.kind == kind)
                for _ in range(wanted - have):
                    self.spawn(kind)
        for kind, wanted in self.targets().items():
            mine = [c for c in current if c.kind == kind]
            if len(mine) > wanted:
                extra = sorted(mine, key=lambda c: (bool(c.jobs), -c.born))
                for c in extra[: len(mine) - wanted]:
                    self.ask_to_stop(c, SCALE_DOWN)
        if self.reload_from is not None:
            new = self.current()
            if len(new) >= self.target and all(c.ready for c in new):
                for c in list(self.children.values()):
                    if c.generation == self.reload_from and c.retiring is None:
                        self.ask_to_stop(c, RELOAD)
                log.info("event=reload_done generation=%d", self.generation)
                self.reload_from = None
        return bool(current) and all(c.ready for c in current)

    def targets(self) -> dict[ChildKind, int]:
        """Children per kind: all of one kind when the application has one; in a mixed
        one, async_workers async children (at most all but one) and the rest sync. The
        signals that scale (SIGTTIN, SIGTTOU) change the sync children of a mixed app."""
        if self.all_async:
            return {ASYNC: self.target}
        if not self.mixed:
            return {SYNC: self.target}
        async_n = max(1, min(self.spec.settings.async_workers, self.target - 1))
        return {ASYNC: async_n, SYNC: max(1, self.target - async_n)}

    def next_fork_at(self) -> float | None:
        """When a fork delayed by the crash streak is due, if one is."""
        if self.crashes.count and len(self.current()) < self.target:
            return self.crashes.fork_at()
        return None

    def start_reload(self) -> None:
        if self.reload_from is not None:
            log.warning("event=reload_ignored reason='a reload is already in progress'")
            return
        self.reload_from = self.generation
        self.generations += 1
        self.generation = self.generations
        log.info("event=reload_started generation=%d", self.generation)

    def busy(self) -> int:
        """Children running at least one job."""
        return sum(1 for c in self.children.values() if c.jobs)

    def running(self) -> int:
        """Jobs running in every child."""
        return sum(len(c.jobs) for c in self.children.values())

    def holding(self) -> bool:
        """A child holds jobs: it may start one at any moment without telling."""
        return any(c.held_ids or c.jobs for c in self.children.values())

    # -- fork ----------------------------------------------------------------------------

    def spawn(self, kind: ChildKind = SYNC) -> None:
        spec = self.spec
        c2m_r, c2m_w = os.pipe()
        m2c_r, m2c_w = os.pipe()
        identity_tag = uuid.uuid4().hex[:6]
        stack_file = str(self.runtime_dir / f"stack-{identity_tag}.txt")
        reload_baseline = spec.baseline if self.generation > 0 else None
        board = Board(spec.settings.concurrency if kind == ASYNC else 1)
        children = self.targets().get(kind, self.target)
        # Until the child has its own signal set-up it has the master's handlers and wakeup
        # fd: a signal it got there would wake the master as if the master had got it (a
        # SIGTERM meant for the child drained the master) and be lost to the child. Blocked
        # across fork, it stays pending in the child until the child's defaults are in place.
        masked = signal.pthread_sigmask(signal.SIG_BLOCK, MASTER_SIGNALS)
        pid = os.fork()
        if pid == 0:  # the child: never returns
            try:
                self._in_child_after_fork(close=[c2m_r, m2c_w])
                signal.pthread_sigmask(signal.SIG_SETMASK, masked)
                child_main(
                    ChildConfig(
                        identity=identity_for(os.getpid(), identity_tag),
                        dsn=spec.dsn,
                        settings=spec.settings,
                        handlers=spec.handlers,
                        to_master=c2m_w,
                        from_master=m2c_r,
                        stack_file=stack_file,
                        app_spec=spec.app_spec,
                        reload_baseline=reload_baseline,
                        metrics=spec.metrics,
                        board=board,
                        middleware=spec.middleware,
                        child_start=spec.child_start,
                        kind=kind,
                        children=children,
                    )
                )
            finally:
                os._exit(EXIT_BOOT_ERROR)
        signal.pthread_sigmask(signal.SIG_SETMASK, masked)
        os.close(c2m_w)
        os.close(m2c_r)
        os.set_blocking(c2m_r, False)
        os.set_blocking(m2c_w, False)
        identity = identity_for(pid, identity_tag)
        self.children[pid] = ChildProc(
            pid=pid,
            identity=identity,
            generation=self.generation,
            to_child=m2c_w,
            reader=protocol.LineReader(c2m_r),
            stack_file=stack_file,
            born=time.monotonic(),
            board=board,
            kind=kind,
            fds=[c2m_r, m2c_w],
            progress_at=time.monotonic(),
        )
        log.debug("event=child_spawned pid=%d worker=%s kind=%s", pid, identity, kind)
        self.changed()

    def _in_child_after_fork(self, close: list[int]) -> None:
        """Close what belongs to the master and the siblings. The master's database sockets
        are closed at the descriptor level only: the connection objects are never used or
        finalised here (the child leaves through os._exit), so nothing is sent on them."""
        signal.set_wakeup_fd(-1)
        for signum in (signal.SIGTERM, signal.SIGCHLD, signal.SIGQUIT):
            signal.signal(signum, signal.SIG_DFL)
        for c in self.children.values():
            c.board.close()  # a sibling's board is none of our business
        for fd in [*self._master_fds(), *close]:  # the siblings' pipes among them
            with contextlib.suppress(OSError):
                os.close(fd)

    # -- what children say -----------------------------------------------------------------

    def read_child(self, c: ChildProc, now: float) -> None:
        if stacks := read_messages(c, now):
            self.stack_answers.extend(stacks)

    def read_all(self, now: float) -> None:
        for c in self.children.values():
            self.read_child(c, now)

    def read_boards(self) -> None:
        """What each child runs now. A job that left the board takes the watchdog's notes
        about it along (a sync child's stack request too: its one job changed; an async
        child's is dropped by the enforcer once no limit applies)."""
        now = time.monotonic()
        for c in self.children.values():
            running = c.board.read_all()
            if running != c.jobs:
                if c.lease_lost:
                    # The same run still on the board, not the same job: a job claimed
                    # again (canceled, then retried) is a new run the notes do not concern.
                    ids = {j.id for j in running if j in c.jobs}
                    c.lease_lost = {i: t for i, t in c.lease_lost.items() if i in ids}
                if c.kind == SYNC:
                    c.stack_requested_at = None
                c.jobs = running
                c.progress_at = now
                if running and self.crashes.count:
                    self.crashes.healthy()  # children get as far as running jobs

    def wake_idle(self) -> None:
        # Every child not running a handler right now: one that has just found nothing to
        # claim may not have said so yet, and a wake-up it does not need costs it one
        # empty claim. One running a handler claims again when it is done anyway.
        self.read_boards()
        for c in self.children.values():
            if c.ready and not c.full and c.retiring is None:
                protocol.send(c.to_child, b"w\n")

    def ask_stack(self, job_id: uuid.UUID) -> bool:
        """Ask the child running ``job_id`` for its stack (it answers on its pipe); False
        when none of ours runs it (another master's, or it ended)."""
        self.read_boards()
        for c in self.children.values():
            if c.kill_reason is None and any(j.id == job_id for j in c.jobs):
                return protocol.send(c.to_child, f"where {job_id}\n".encode())
        return False

    # -- stop, kill, reap -----------------------------------------------------------------

    def ask_to_stop(self, c: ChildProc, why: StopReason) -> None:
        if c.retiring is None:
            c.retiring = why
        with contextlib.suppress(ProcessLookupError):
            os.kill(c.pid, signal.SIGTERM)

    def stop_all(self) -> None:
        for c in self.children.values():
            if c.kind == ASYNC:  # its deadline is graceful_timeout (brooq.worker.aio)
                protocol.send(c.to_child, b"drain\n")
            self.ask_to_stop(c, DRAIN)

    def kill_all(self, reason: KillReason) -> None:
        for c in self.children.values():
            if c.kill_reason is None:
                c.kill_reason = reason
                if self.metrics is not None and c.jobs:
                    self.metrics.killed.labels(killed_label(reason)).inc()
                killpg(c.pid)

    def reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            c = self.children.pop(pid, None)
            if c is not None:
                self._ended(c, status)
                self.changed()
            elif self.other_reaped is not None:
                self.other_reaped(pid)  # the page process (brooq.supervisor.pagekeeper)

    def _ended(self, c: ChildProc, status: int) -> None:
        # Read what it said and posted last (its held jobs may have changed).
        self.read_child(c, time.monotonic())
        c.jobs = c.board.read_all()  # a hung or crashed child's last jobs stay on its board
        code = os.waitstatus_to_exitcode(status)
        end = c.end(code, self.stopping, time.monotonic())  # read off its board: first
        c.board.close()
        for fd in c.fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        verdict = settle(end)
        if self.metrics is not None:
            metrics_mod.child_exited(c.pid)
            if verdict.count_restart:
                self.metrics.restarts.labels(verdict.label).inc()
        if verdict.jobs is not None:
            self.accounting.owe(c.identity, verdict.jobs)
        log.log(
            verdict.level,
            "event=child_exited pid=%d worker=%s %s reason=%s job=%s%s",
            c.pid,
            c.identity,
            verdict.exit,
            verdict.label,
            c.kill_job or (c.job.id if c.job and c.kind == SYNC else "-"),
            f" kind=async in_flight={len(c.jobs)}" if c.kind == ASYNC else "",
        )
        if verdict.outside_job:
            self._died_outside_job(c, code)
        with contextlib.suppress(OSError):
            os.unlink(c.stack_file)
        with contextlib.suppress(OSError):
            os.unlink(c.stack_file + ".await")
        self.accounting.flush()

    def _died_outside_job(self, c: ChildProc, code: int) -> None:
        """A child died before it was ready, or crashed outside any job: a streak of these
        delays each fork and ends the master (brooq.supervisor.respawn)."""
        kind = outside_job(code, c.generation, self.generation, self.reload_from)
        if kind == "stale":
            return  # a generation given up already (a failed reload)
        if kind == "reload_failed":
            assert self.reload_from is not None
            log.error(
                "event=reload_failed generation=%d: keeping the running workers", c.generation
            )
            for other in list(self.children.values()):
                if other.generation == c.generation:
                    self.ask_to_stop(other, RELOAD_FAILED)
            self.generation = self.reload_from
            self.reload_from = None
            return
        self.crashes.died(time.monotonic())
        fatal = storm_verdict(code, self.crashes)
        if fatal is not None:
            self.fatal = fatal
        else:
            log.warning(
                "event=respawn_delayed delay=%.1fs deaths_in_a_row=%d",
                self.crashes.delay(),
                self.crashes.count,
            )
