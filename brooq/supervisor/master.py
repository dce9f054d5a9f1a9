"""The master: fork children, watch them, keep their leases, clean up after them.

The loop is the arbiter's four verbs: wait (select on signals, child pipes and the LISTEN
connection), handle what arrived, reap dead children, then run what is due (lease
renewal, reaper, retention, watchdog) and bring the number of children to the target.
Signal handlers do nothing but wake the loop (signal.set_wakeup_fd); all work, logging
included, happens in the loop. The master is single-threaded so that fork() is safe.
"""

from __future__ import annotations

import contextlib
import errno
import gc
import json
import logging
import os
import select
import signal
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from psycopg.rows import dict_row
from setproctitle import setproctitle

from brooq import metrics as metrics_mod
from brooq import migrate
from brooq.dsn import session_options
from brooq.errors import SchemaMissing
from brooq.handlers import Policy
from brooq.ipc import protocol
from brooq.ipc.board import Board, Running
from brooq.job import parse_job_id
from brooq.queue import Queue
from brooq.settings import Settings
from brooq.sql import Q
from brooq.supervisor import maintenance
from brooq.supervisor.ops import OpsHooks, OpsServer
from brooq.supervisor.respawn import STABLE_AFTER, CrashStreak
from brooq.supervisor.sdnotify import Notifier
from brooq.supervisor.watchdog import BusyChild, HoldingChild, decide, decide_stalled
from brooq.worker import child as child_mod

log = logging.getLogger("brooq.master")

EXIT_FATAL = 3
WATCHDOG_TICK = 0.1
# Maintenance statements never hold the loop for long: row locks are skipped (SKIP
# LOCKED) and a table lock (DDL without CONCURRENTLY) is waited for at most this long.
MASTER_STATEMENT_TIMEOUT_MS = 10_000
MASTER_LOCK_TIMEOUT_MS = 2_000
MASTER_CONNECT_TIMEOUT = 3


def master_options(dsn: str) -> str:
    """libpq options of the master's maintenance connection: the DSN's own (search_path,
    ...; else PGOPTIONS), then the two timeouts, which win over a value given there: the
    loop's liveness depends on them."""
    return session_options(
        dsn,
        {
            "statement_timeout": str(MASTER_STATEMENT_TIMEOUT_MS),
            "lock_timeout": str(MASTER_LOCK_TIMEOUT_MS),
        },
    )


@dataclass
class ChildProc:
    pid: int
    identity: str
    generation: int
    to_child: int
    reader: protocol.LineReader
    stack_file: str
    born: float
    ready: bool = False
    board: Board = field(default_factory=Board)  # what it runs now, shared memory
    job: Running | None = None  # the board as last read (_read_boards)
    held: list[uuid.UUID] = field(default_factory=list)  # every job it holds, job included
    retiring: str | None = None  # why it was asked to stop
    kill_reason: str | None = None
    kill_detail: str = ""
    stack_requested_at: float | None = None
    lease_lost_at: float | None = None
    fds: list[int] = field(default_factory=list)
    # Last visible progress (a job started or ended, a new held list): the stall rule.
    progress_at: float = 0.0
    gave_back_for: uuid.UUID | None = None  # the long job whose batchmates went back


class Master:
    def __init__(
        self,
        queue: Queue,
        app_spec: str,
        settings: Settings,
        dsn: str,
        baseline: frozenset[str] = frozenset(),
        *,
        metrics_dir: Path | None = None,
        admin_token: bytes | None = None,
        schema_verified: bool = False,
    ) -> None:
        self.queue = queue
        self.app_spec = app_spec
        self.settings = settings
        self.dsn = dsn
        self.target = settings.workers
        self.children: dict[int, ChildProc] = {}
        self.generation = 0  # the generation new children belong to
        self.generations = 0  # every generation ever started, so numbers are never reused
        self.reload_from: int | None = None  # the old generation while a reload is pending
        # sys.modules before the app was imported: what a reload must not re-import.
        self.baseline = baseline
        self.stopping = False
        self.drain_deadline = 0.0
        self.released = 0
        self.crashes = CrashStreak()  # children dying outside any job (brooq.respawn)
        self.fatal: str | None = None
        # (identity, the job it was running, cause) of children that died holding jobs
        self.pending_failures: list[tuple[str, uuid.UUID | None, str]] = []
        self.pending_releases: list[str] = []
        self.db: psycopg.Connection[Any] | None = None
        self.listener: psycopg.Connection[Any] | None = None
        self.db_retry_at = 0.0
        self.db_delay = 0.5
        # brooq-master checks the schema before it forks when the database answers; when
        # it did not, the first connection made here checks it.
        self.schema_verified = schema_verified
        self.notifier = Notifier()
        self.ready_sent = False
        now = time.monotonic()
        self.due = {
            "renew": now + settings.renew_period,
            "reap": now + 1.0,
            "retention": now + min(5.0, settings.effective_retention_period),
            "sd_watchdog": now,
        }
        self.policies = {t: h.policy(settings) for t, h in queue.handlers.items()}
        self.default_policy = Policy(
            settings.max_attempts,
            settings.attempt_timeout,
            settings.max_execution_timeout,
            settings.backoff_base,
            settings.backoff_max,
        )
        self.runtime_dir = Path(tempfile.mkdtemp(prefix="brooq-master-"))
        self.metrics_dir = metrics_dir
        self.metrics = metrics_mod.Metrics() if metrics_dir is not None else None
        self.admin_token = admin_token
        self.ops: OpsServer | None = None
        self.db_ok = False
        self.due["stats"] = now

    # -- life cycle --------------------------------------------------------------------------

    def run(self) -> int:
        self.sig_r, self.sig_w = os.pipe()
        for fd in (self.sig_r, self.sig_w):
            os.set_blocking(fd, False)
        signal.set_wakeup_fd(self.sig_w, warn_on_full_buffer=False)
        for signum in (
            signal.SIGTERM,
            signal.SIGINT,
            signal.SIGQUIT,
            signal.SIGHUP,
            signal.SIGTTIN,
            signal.SIGTTOU,
            signal.SIGCHLD,
        ):
            signal.signal(signum, _wake_only)
        self._title()
        gc.freeze()  # what the app imported stays in shared copy-on-write pages
        log.info(
            "event=master_started app=%s workers=%d lease=%gs pid=%d",
            self.app_spec,
            self.target,
            self.settings.lease,
            os.getpid(),
        )
        self._start_ops()
        if self.metrics is not None:
            self.metrics.configured.set(self.target)
        self._connect()
        try:
            return self._loop()
        finally:
            self._close_db()
            if self.ops is not None:
                self.ops.close()
            for f in self.runtime_dir.glob("*"):
                f.unlink(missing_ok=True)
            self.runtime_dir.rmdir()

    def _loop(self) -> int:
        while True:
            self._manage_children()
            timeout = self._timeout()
            fds = [self.sig_r, *(c.reader.fd for c in self.children.values())]
            if self.listener is not None:
                fds.append(self.listener.fileno())
            writes: list[int] = []
            if self.ops is not None:
                fds.extend(self.ops.read_fds())
                writes = self.ops.write_fds()
            try:
                readable, writable, _ = select.select(fds, writes, [], timeout)
            except InterruptedError:
                readable = writable = []
            now = time.monotonic()
            if self.sig_r in readable:
                self._handle_signals()
            for c in list(self.children.values()):
                if c.reader.fd in readable:
                    self._read_child(c, now)
            if self.listener is not None and self.listener.fileno() in readable:
                self._read_notifications()
            if self.ops is not None:
                # Never waits on a client: what is not ready now waits for a later pass.
                self.ops.service(set(readable), set(writable))
            self._reap_children()
            self._run_due(time.monotonic())
            self._read_boards()
            self._watchdog(time.monotonic())
            if self.fatal is not None:
                return self._die(self.fatal)
            if self.stopping:
                if not self.children:
                    self._flush_accounting()
                    return self._finish()
                if time.monotonic() >= self.drain_deadline:
                    self._kill_all("drain_timeout")

    def _timeout(self) -> float:
        now = time.monotonic()
        nearest = min(self.due.values())
        # A child holding jobs may start one at any moment without telling: keep looking.
        if any(c.held or c.job for c in self.children.values()) or self.stopping:
            nearest = min(nearest, now + WATCHDOG_TICK)
        if self.crashes.count and len(self._current()) < self.target:
            nearest = min(nearest, max(self.crashes.fork_at(), now))  # a delayed fork
        ops_deadline = self.ops.next_deadline() if self.ops is not None else None
        if ops_deadline is not None:
            nearest = min(nearest, ops_deadline)
        return max(0.0, min(nearest - now, 1.0))

    def _finish(self) -> int:
        if self.released:
            log.warning(
                "event=master_stopped jobs_returned=%d: unfinished jobs went back to pending "
                "with their attempt refunded",
                self.released,
            )
            return 1
        log.info("event=master_stopped jobs_returned=0")
        return 0

    def _die(self, reason: str) -> int:
        log.error("event=master_fatal reason=%r", reason)
        self._kill_all("fatal")
        deadline = time.monotonic() + 5
        while self.children and time.monotonic() < deadline:
            self._reap_children()
            time.sleep(0.05)
        self._flush_accounting()
        return EXIT_FATAL

    # -- signals ---------------------------------------------------------------------------

    def _handle_signals(self) -> None:
        try:
            data = os.read(self.sig_r, 4096)
        except BlockingIOError:
            return
        for signum in data:
            if signum in (signal.SIGTERM, signal.SIGINT):
                self._drain(signal.Signals(signum).name)
            elif signum == signal.SIGQUIT:
                self._drain("SIGQUIT", budget=0.0)
            elif signum == signal.SIGHUP:
                self._reload()
            elif signum == signal.SIGTTIN:
                self.target += 1
                log.info("event=workers_changed workers=%d by=SIGTTIN", self.target)
                self._title()
                self._set_configured()
            elif signum == signal.SIGTTOU:
                self.target = max(1, self.target - 1)
                log.info("event=workers_changed workers=%d by=SIGTTOU", self.target)
                self._title()
                self._set_configured()

    def _drain(self, why: str, budget: float | None = None) -> None:
        if budget is None:
            budget = self.settings.graceful_timeout
        if self.stopping:
            if budget == 0.0:
                self.drain_deadline = time.monotonic()
            return
        self.stopping = True
        self.drain_deadline = time.monotonic() + budget
        self.notifier.send("STOPPING=1", f"STATUS=draining ({why})")
        busy = sum(1 for c in self.children.values() if c.job)
        log.info("event=drain_started signal=%s busy_children=%d budget=%gs", why, busy, budget)
        self._title()
        for c in self.children.values():
            self._ask_to_stop(c, "drain")

    def _reload(self) -> None:
        if self.stopping:
            return
        if self.reload_from is not None:
            log.warning("event=reload_ignored reason='a reload is already in progress'")
            return
        self.reload_from = self.generation
        self.generations += 1
        self.generation = self.generations
        log.info("event=reload_started generation=%d", self.generation)

    # -- children ----------------------------------------------------------------------------

    def _current(self) -> list[ChildProc]:
        return [
            c
            for c in self.children.values()
            if c.generation == self.generation and c.retiring is None
        ]

    def _manage_children(self) -> None:
        if self.stopping or self.fatal:
            return
        current = self._current()
        now = time.monotonic()
        if self.crashes.count and any(now - c.born >= STABLE_AFTER for c in current):
            self.crashes.healthy()
        if now >= self.crashes.fork_at():  # after deaths outside a job: backoff
            for _ in range(self.target - len(current)):
                self._spawn()
        if len(current) > self.target:
            extra = sorted(current, key=lambda c: (c.job is not None, -c.born))
            for c in extra[: len(current) - self.target]:
                self._ask_to_stop(c, "scale_down")
        if self.reload_from is not None:
            new = self._current()
            if len(new) >= self.target and all(c.ready for c in new):
                for c in list(self.children.values()):
                    if c.generation == self.reload_from and c.retiring is None:
                        self._ask_to_stop(c, "reload")
                log.info("event=reload_done generation=%d", self.generation)
                self.reload_from = None
        if not self.ready_sent and current and all(c.ready for c in current):
            self.ready_sent = True
            self.notifier.send("READY=1", f"STATUS=running {self.target} workers")

    def _spawn(self) -> None:
        c2m_r, c2m_w = os.pipe()
        m2c_r, m2c_w = os.pipe()
        identity_tag = uuid.uuid4().hex[:6]
        stack_file = str(self.runtime_dir / f"stack-{identity_tag}.txt")
        reload_baseline = self.baseline if self.generation > 0 else None
        board = Board()
        pid = os.fork()
        if pid == 0:  # the child: never returns
            try:
                self._in_child_after_fork(close=[c2m_r, m2c_w])
                identity = child_mod.identity_for(os.getpid(), identity_tag)
                child_mod.main(
                    child_mod.ChildConfig(
                        identity=identity,
                        dsn=self.dsn,
                        settings=self.settings,
                        handlers=self.queue.handlers,
                        to_master=c2m_w,
                        from_master=m2c_r,
                        stack_file=stack_file,
                        app_spec=self.app_spec,
                        reload_baseline=reload_baseline,
                        metrics=self.metrics,
                        board=board,
                    )
                )
            finally:
                os._exit(child_mod.EXIT_BOOT_ERROR)
        os.close(c2m_w)
        os.close(m2c_r)
        os.set_blocking(c2m_r, False)
        os.set_blocking(m2c_w, False)
        identity = child_mod.identity_for(pid, identity_tag)
        self.children[pid] = ChildProc(
            pid=pid,
            identity=identity,
            generation=self.generation,
            to_child=m2c_w,
            reader=protocol.LineReader(c2m_r),
            stack_file=stack_file,
            born=time.monotonic(),
            board=board,
            fds=[c2m_r, m2c_w],
            progress_at=time.monotonic(),
        )
        log.debug("event=child_spawned pid=%d worker=%s", pid, identity)

    def _in_child_after_fork(self, close: list[int]) -> None:
        """Close what belongs to the master and the siblings. The master's database sockets
        are closed at the descriptor level only: the connection objects are never used or
        finalised here (the child leaves through os._exit), so nothing is sent on them."""
        signal.set_wakeup_fd(-1)
        for signum in (signal.SIGTERM, signal.SIGCHLD, signal.SIGQUIT):
            signal.signal(signum, signal.SIG_DFL)
        fds = [self.sig_r, self.sig_w, *close]
        if self.ops is not None:
            fds.extend(self.ops.fds())  # the listening socket and any client's
        for c in self.children.values():
            fds.extend(c.fds)
            c.board.close()  # a sibling's board is none of our business
        for conn in (self.db, self.listener):
            if conn is not None and not conn.closed:
                fds.append(conn.fileno())
        for fd in fds:
            with contextlib.suppress(OSError):
                os.close(fd)

    def _ask_to_stop(self, c: ChildProc, why: str) -> None:
        if c.retiring is None:
            c.retiring = why
        with contextlib.suppress(ProcessLookupError):
            os.kill(c.pid, signal.SIGTERM)

    def _read_child(self, c: ChildProc, now: float) -> None:
        for line in c.reader.read():
            try:
                msg = json.loads(line)
            except ValueError:
                log.warning("event=bad_message pid=%d line=%r", c.pid, line[:100])
                continue
            if "held" in msg:
                c.held = [uuid.UUID(h) for h in msg["held"]]
                c.progress_at = now
                if c.job is None:
                    c.stack_requested_at = None  # a stall's stack request is moot now
            elif "ready" in msg:
                c.ready = True
                c.progress_at = now
            elif "retire" in msg:
                c.retiring = str(msg["retire"])
                log.info("event=child_retiring pid=%d reason=%s", c.pid, c.retiring)

    def _read_boards(self) -> None:
        """What each child runs now. A new job (or none) clears the watchdog's notes
        about the previous one."""
        now = time.monotonic()
        for c in self.children.values():
            running = c.board.read()
            if running != c.job:
                c.lease_lost_at = None
                c.stack_requested_at = None
                c.job = running
                c.progress_at = now
                if running is not None and self.crashes.count:
                    self.crashes.healthy()  # children get as far as running jobs

    def _wake_idle(self) -> None:
        # Every child not running a handler right now: one that has just found nothing to
        # claim may not have said so yet, and a wake-up it does not need costs it one
        # empty claim. One running a handler claims again when it is done anyway.
        self._read_boards()
        for c in self.children.values():
            if c.ready and c.job is None and c.retiring is None:
                protocol.send(c.to_child, b"w\n")

    def _reap_children(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            c = self.children.pop(pid, None)
            if c is not None:
                self._on_child_exit(c, status)

    def _on_child_exit(self, c: ChildProc, status: int) -> None:
        # Read what it said and posted last (its held jobs may have changed).
        self._read_child(c, time.monotonic())
        c.job = c.board.read()  # a hung or crashed child's last job stays on its board
        c.board.close()
        for fd in c.fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        code = os.waitstatus_to_exitcode(status)
        how = f"signal={signal.Signals(-code).name}" if code < 0 else f"exit_status={code}"
        if self.metrics is not None:
            metrics_mod.child_exited(c.pid)
            if not self.stopping:
                self.metrics.restarts.labels(
                    c.kill_reason or c.retiring or ("crash" if code else "exit")
                ).inc()
        cause: str | None = None
        if c.kill_reason == "max_execution_timeout" and c.job is not None:
            cause = (
                f"killed: max_execution_timeout {c.job.max_execution_timeout:g}s "
                f"exceeded (ran {time.monotonic() - c.job.started:.1f}s){c.kill_detail}"
            )
        elif c.kill_reason in ("drain_timeout", "fatal", "stalled"):
            # A stalled child ran none of what it held (or finished them unwritten):
            # everything goes back with the attempt refunded.
            self.pending_releases.append(c.identity)
        elif c.kill_reason == "lease_lost":
            # The running job is no longer ours; give back what else it held (a batch).
            self.pending_failures.append((c.identity, None, ""))
        elif code != 0:
            cause = (
                f"worker died: {signal.Signals(-code).name}"
                if code < 0
                else (f"worker exited with status {code}")
            )
        if cause is not None:
            self.pending_failures.append((c.identity, c.job.id if c.job else None, cause))
        level = logging.INFO if code == 0 and c.kill_reason is None else logging.ERROR
        log.log(
            level,
            "event=child_exited pid=%d worker=%s %s reason=%s job=%s",
            c.pid,
            c.identity,
            how,
            c.kill_reason or c.retiring or ("crash" if code else "exit"),
            c.job.id if c.job else "-",
        )
        asked_to_stop = c.retiring is not None and code in (0, -signal.SIGTERM)
        if (
            c.job is None
            and c.kill_reason is None
            and not self.stopping
            and not asked_to_stop
            and (code != 0 or not c.ready)
        ):
            self._on_death_outside_job(c, code)
        with contextlib.suppress(OSError):
            os.unlink(c.stack_file)
        self._flush_accounting()

    def _on_death_outside_job(self, c: ChildProc, code: int) -> None:
        """A child died before it was ready, or crashed outside any job: a streak of these
        delays each fork and ends the master (brooq.respawn)."""
        if c.generation != self.generation:
            return  # a generation given up already (a failed reload)
        if (
            code == child_mod.EXIT_APP_LOAD_ERROR
            and c.generation > 0
            and self.reload_from is not None
        ):
            log.error(
                "event=reload_failed generation=%d: keeping the running workers", c.generation
            )
            for other in list(self.children.values()):
                if other.generation == c.generation:
                    self._ask_to_stop(other, "reload_failed")
            self.generation = self.reload_from
            self.reload_from = None
            return
        self.crashes.died(time.monotonic())
        if code == child_mod.EXIT_APP_LOAD_ERROR:
            self.fatal = "children cannot load the application"
        elif self.crashes.fatal:
            self.fatal = (
                f"{self.crashes.count} children in a row died before becoming ready or "
                "before running a job; not respawning forever"
            )
        else:
            log.warning(
                "event=respawn_delayed delay=%.1fs deaths_in_a_row=%d",
                self.crashes.delay(),
                self.crashes.count,
            )

    def _kill_all(self, reason: str) -> None:
        for c in self.children.values():
            if c.kill_reason is None:
                c.kill_reason = reason
                if self.metrics is not None and c.job is not None:
                    self.metrics.killed.labels(reason).inc()
                _killpg(c.pid)

    # -- watchdog ----------------------------------------------------------------------------

    def _watchdog(self, now: float) -> None:
        busy = [
            BusyChild(
                pid=c.pid,
                started=c.job.started,
                max_execution_timeout=c.job.max_execution_timeout,
                lease_lost_at=c.lease_lost_at,
                stack_requested_at=c.stack_requested_at,
            )
            for c in self.children.values()
            if c.job is not None and c.kill_reason is None
        ]
        decisions = decide(busy, now, self.settings.effective_watchdog_grace)
        decisions += decide_stalled(self._holding(now), now, self.settings.lease)
        for d in decisions:
            c = self.children[d.pid]
            if d.action == "dump_stack":
                c.stack_requested_at = now
                with contextlib.suppress(ProcessLookupError):
                    os.kill(c.pid, signal.SIGUSR2)
                continue
            c.kill_reason = d.reason
            if d.reason == "stalled":
                self._kill_stalled(c, now)
                continue
            if self.metrics is not None:
                self.metrics.killed.labels(
                    "max_execution_timeout" if d.reason == "max_execution_timeout" else "hung"
                ).inc()
            stack = _read_stack(c.stack_file)
            c.kill_detail = f"; stack (most recent call first):\n{stack}" if stack else ""
            assert c.job is not None
            if d.reason == "max_execution_timeout":
                log.error(
                    "event=child_killed pid=%d job=%s topic=%s reason=max_execution_timeout "
                    "limit=%gs ran=%.1fs\n%s",
                    c.pid,
                    c.job.id,
                    c.job.topic,
                    c.job.max_execution_timeout,
                    now - c.job.started,
                    stack,
                )
            else:
                log.error(
                    "event=child_killed pid=%d job=%s topic=%s reason=hung_after_lease_lost "
                    "grace=%gs\n%s",
                    c.pid,
                    c.job.id,
                    c.job.topic,
                    self.settings.effective_watchdog_grace,
                    stack,
                )
            _killpg(c.pid)
        self._give_back_batchmates(now)

    def _holding(self, now: float) -> list[HoldingChild]:
        """Children holding jobs outside any handler, for the stall rule. While the master
        cannot reach the database either, nobody is stalled: it is an outage, and the
        clock starts again when the database is back."""
        holding = []
        for c in self.children.values():
            if not c.held or c.job is not None or c.kill_reason is not None:
                continue
            if not self.db_ok or c.board.in_hooks():  # an outage; the application's hooks
                c.progress_at = now
                continue
            holding.append(HoldingChild(c.pid, c.progress_at, c.stack_requested_at))
        return holding

    def _kill_stalled(self, c: ChildProc, now: float) -> None:
        if self.metrics is not None:
            self.metrics.killed.labels("stalled").inc()
        stack = _read_stack(c.stack_file)
        log.error(
            "event=child_killed pid=%d worker=%s reason=stalled held=%d idle=%.1fs: it held "
            "jobs outside any handler for longer than the lease; they go back with the "
            "attempt refunded\n%s",
            c.pid,
            c.identity,
            len(c.held),
            now - c.progress_at,
            stack,
        )
        _killpg(c.pid)

    def _give_back_batchmates(self, now: float) -> None:
        """A job running for LONG_JOB gives back the jobs claimed after it in its batch
        now, not when it returns, so that other children run them meanwhile. The child
        gives them back again when the job returns; the guard makes that a no-op."""
        for c in self.children.values():
            job = c.job
            if job is None or c.kill_reason is not None or c.gave_back_for == job.id:
                continue
            if now - job.started < child_mod.LONG_JOB or job.id not in c.held:
                continue
            rest = c.held[c.held.index(job.id) + 1 :]
            c.gave_back_for = job.id
            if not rest:
                continue
            released = self._with_db(
                "give_back",
                lambda conn, rest=rest, worker=c.identity: maintenance.release_ids(
                    conn, rest, worker
                ),
            )
            if released is None:
                continue
            gone = set(rest)  # not ours any more either way: never renew or report them
            c.held = [i for i in c.held if i not in gone]
            log.info(
                "event=batch_given_back pid=%d job=%s count=%d: running for more than %gs",
                c.pid,
                job.id,
                len(released),
                child_mod.LONG_JOB,
            )

    # -- database ------------------------------------------------------------------------

    def _connect(self) -> bool:
        if self.db is not None and self.listener is not None:
            return True
        if time.monotonic() < self.db_retry_at:
            return False
        try:
            if self.db is None:
                self.db = psycopg.connect(
                    self.dsn,
                    autocommit=True,
                    connect_timeout=MASTER_CONNECT_TIMEOUT,
                    options=master_options(self.dsn),
                    application_name="brooq-master",
                )
                if not self.schema_verified:
                    # The database was down when brooq-master checked before forking:
                    # without the schema every child would crash on its first claim.
                    migrate.verify(self.db)
                    self.schema_verified = True
            if self.listener is None:
                self.listener = psycopg.connect(
                    self.dsn,
                    autocommit=True,
                    connect_timeout=MASTER_CONNECT_TIMEOUT,
                    application_name="brooq-master-listen",
                )
                self.listener.execute(Q.listen_jobs)
                # Anything enqueued while we were not listening: have a look now.
                self._wake_idle()
        except SchemaMissing as exc:
            self.fatal = str(exc)
            self._close_db()
            return False
        except psycopg.Error as exc:
            self._db_failed("connect", exc)
            return False
        self.db_ok = True
        if self.db_delay > 0.5:
            log.info("event=db_reconnected who=master")
            # A renewal missed while the connection was down runs now, before the reaper,
            # not a whole period later: or short outages let our own leases run out.
            self.due["renew"] = float("-inf")
        self.db_delay = 0.5
        return True

    def _db_failed(self, what: str, exc: BaseException) -> None:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        log.warning(
            "event=db_error who=master during=%s retry_in=%.1fs error=%r",
            what,
            self.db_delay,
            first,
        )
        self._close_db()
        self.db_ok = False
        self.db_retry_at = time.monotonic() + self.db_delay
        self.db_delay = min(self.db_delay * 2, 10.0)

    def _close_db(self) -> None:
        for conn in (self.db, self.listener):
            if conn is not None:
                with contextlib.suppress(Exception):  # closing a broken connection
                    conn.close()
        self.db = self.listener = None

    def _read_notifications(self) -> None:
        assert self.listener is not None
        try:
            got = any(True for _ in self.listener.notifies(timeout=0))
        except psycopg.Error as exc:
            self._db_failed("listen", exc)
            return
        if got:
            self._wake_idle()

    def _with_db(self, what: str, fn: Any) -> Any:
        if not self._connect():
            return None
        assert self.db is not None
        try:
            return fn(self.db)
        except psycopg.OperationalError as exc:
            self._db_failed(what, exc)
        except psycopg.Error as exc:
            log.error("event=maintenance_error during=%s error=%r", what, str(exc).strip())
        return None

    def _flush_accounting(self) -> None:
        while self.pending_failures:
            identity, running, cause = self.pending_failures[0]

            def settle(
                conn: psycopg.Connection[Any],
                identity: str = identity,
                running: uuid.UUID | None = running,
                cause: str = cause,
            ) -> tuple[list[tuple[uuid.UUID, str, str]], list[tuple[uuid.UUID, str]]]:
                return maintenance.settle_dead_worker(
                    conn, identity, running, cause, self.policies, self.default_policy
                )

            result = self._with_db("crash_accounting", settle)
            if result is None:
                return  # database unreachable: try again on the next pass
            self.pending_failures.pop(0)
            failed, released = result
            for job_id, topic, state in failed:
                if self.metrics is not None:
                    self.metrics.outcomes.labels(topic, state).inc()
                log.error(
                    "event=attempt_failed_by_master job=%s topic=%s state=%s cause=%r",
                    job_id,
                    topic,
                    state,
                    cause.splitlines()[0],
                )
            for job_id, topic in released:
                log.info("event=job_returned job=%s topic=%s attempt_refunded=1", job_id, topic)
        if self.pending_releases:
            workers = list(self.pending_releases)
            released = self._with_db(
                "release", lambda conn: maintenance.release_held(conn, workers)
            )
            if released is None:
                return
            self.pending_releases.clear()
            self.released += len(released)
            for job_id, topic in released:
                log.warning("event=job_returned job=%s topic=%s attempt_refunded=1", job_id, topic)

    # -- periodic work ---------------------------------------------------------------------

    def _run_due(self, now: float) -> None:
        s = self.settings
        if self.notifier.watchdog_period and now >= self.due["sd_watchdog"]:
            self.notifier.send("WATCHDOG=1")
            self.due["sd_watchdog"] = now + self.notifier.watchdog_period
        elif not self.notifier.watchdog_period:
            self.due["sd_watchdog"] = now + 3600
        if (self.db is None or self.listener is None) and self._connect():
            self._flush_accounting()
        if now >= self.due["renew"]:
            self.due["renew"] = now + s.renew_period
            self._renew(now)
        if now >= self.due["reap"]:
            self.due["reap"] = now + s.effective_reaper_period
            result = self._with_db(
                "reaper",
                lambda conn: maintenance.reap_expired(conn, s.max_lease_expiries),
            )
            reaped, dead = result if result is not None else (None, [])
            for job_id, topic, expiries in dead:
                if self.metrics is not None:
                    self.metrics.outcomes.labels(topic, "dead").inc()
                log.error(
                    "event=job_dead job=%s topic=%s reason=lease_expired expiries=%d: the "
                    "workers running it vanished that many times",
                    job_id,
                    topic,
                    expiries,
                )
            if reaped:
                if self.metrics is not None:
                    for topic, n in reaped.items():
                        self.metrics.reaped.labels(topic).inc(n)
                log.info(
                    "event=jobs_reaped count=%d topics=%s",
                    sum(reaped.values()),
                    ",".join(sorted(reaped)),
                )
        if now >= self.due["stats"]:
            self.due["stats"] = now + s.stats_period
            self._refresh_stats()
        if now >= self.due["retention"]:
            self.due["retention"] = now + s.effective_retention_period
            if s.retention_ttl > 0:
                result = self._with_db(
                    "retention",
                    lambda conn: maintenance.delete_expired(
                        conn, s.retention_ttl, s.retention_batch
                    ),
                )
                if result:
                    deleted, more = result
                    if deleted and self.metrics is not None:
                        for topic, n in deleted.items():
                            self.metrics.retention_deleted.labels(topic).inc(n)
                    if deleted:
                        log.info("event=retention_deleted count=%d", sum(deleted.values()))
                    if more:
                        log.warning(
                            "event=retention_behind: %d batches were not enough; "
                            "the rest waits for the next tick",
                            maintenance.RETENTION_MAX_BATCHES,
                        )

    def _renew(self, now: float) -> None:
        # Read what children said first, so a job just finished is not taken for lost.
        self._read_children(now)
        held = [
            (job_id, c.identity)
            for c in self.children.values()
            if c.kill_reason is None
            for job_id in c.held
        ]
        if not held:
            return
        still = self._with_db(
            "renew", lambda conn: maintenance.renew_leases(conn, held, self.settings.lease)
        )
        if still is None:
            return
        # A job missing from the answer was canceled, reaped or taken over -- unless the
        # child settled it meanwhile: look at what the children said and run since.
        self._read_children(now)
        self._read_boards()
        missing = {job_id for job_id, _ in held} - still
        for c in self.children.values():
            for job_id in c.held:
                running = c.job is not None and c.job.id == job_id
                if job_id not in missing or (running and c.lease_lost_at is not None):
                    continue
                protocol.send(c.to_child, f"lost {job_id}\n".encode())
                if not running or c.job is None:
                    continue  # not started yet (the child will skip it) or already settled
                c.lease_lost_at = now
                if self.metrics is not None:
                    self.metrics.lease_lost.labels(c.job.topic).inc()
                log.info(
                    "event=lease_lost job=%s topic=%s pid=%d: canceled, reaped or taken over",
                    c.job.id,
                    c.job.topic,
                    c.pid,
                )

    def _read_children(self, now: float) -> None:
        for c in self.children.values():
            self._read_child(c, now)

    def _refresh_stats(self) -> None:
        """Jobs by topic and state, oldest ready age: read from the table on a timer, so
        the scrape rate never multiplies the database load."""
        if self.metrics is None:
            return

        def read(conn: psycopg.Connection[Any]) -> list[Any]:
            return conn.cursor(row_factory=dict_row).execute(Q.job_stats_by_topic).fetchall()

        rows = self._with_db("stats", read)
        if rows is None:
            return
        by_topic = {r["topic"]: r for r in rows}
        for topic in set(self.queue.handlers) | set(by_topic):
            r = by_topic.get(topic, {})
            for state in ("pending", "processing", "failed", "dead"):
                self.metrics.jobs.labels(topic, state).set(r.get(state, 0))
            self.metrics.oldest_ready.labels(topic).set(float(r.get("oldest_ready_age", 0.0)))

    def _set_configured(self) -> None:
        if self.metrics is not None:
            self.metrics.configured.set(self.target)

    # -- ops surface ------------------------------------------------------------------------

    def _start_ops(self) -> None:
        addr = self.settings.ops_addr
        if not addr:
            return
        hooks = OpsHooks(
            ready=self._readiness,
            metrics=self._scrape,
            admin=self._admin,
            token=self.admin_token,
        )
        try:
            self.ops = OpsServer(addr, hooks)
        except OSError as exc:
            log.error("event=ops_bind_failed addr=%s error=%r", addr, exc.strerror)
            return
        log.info("event=ops_listening addr=%s", self.ops.address)

    def _readiness(self) -> tuple[bool, str]:
        if self.stopping:
            return False, "draining"
        if not self.db_ok:
            return False, "database unreachable"
        if not any(c.ready for c in self.children.values()):
            return False, "no worker ready yet"
        return True, "ready"

    def _scrape(self) -> bytes:
        if self.metrics_dir is None:
            return b"# metrics are off\n"
        return metrics_mod.render(self.metrics_dir)

    def _admin(self, action: str, raw_id: str) -> tuple[int, dict[str, Any]]:
        try:
            job_id = parse_job_id(raw_id)
        except ValueError as exc:
            return 400, {"error": str(exc)}
        query = Q.job_cancel if action == "cancel" else Q.job_retry
        row = self._with_db(
            f"admin_{action}", lambda conn: conn.execute(query, {"id": job_id}).fetchone()
        )
        if row is not None:
            log.info("event=admin_%s job=%s", action, job_id)
            return 200, {"id": str(job_id), "action": action, "ok": True}
        if not self.db_ok:
            return 503, {"error": "database unreachable"}
        found = self._with_db(
            "admin_get", lambda conn: conn.execute(Q.job_get, {"id": job_id}).fetchone()
        )
        if found is None:
            return 404, {"error": f"no job with id {job_id}"}
        state = found[3]
        rule = {
            "cancel": "only pending, failed or processing jobs can be canceled",
            "retry": "only dead or canceled jobs can be retried",
        }[action]
        return 409, {"error": f"job is {state}; {rule}", "state": state}

    def _title(self) -> None:
        state = " draining" if self.stopping else ""
        setproctitle(f"brooq-master: app={self.app_spec} workers={self.target}{state}")


def _wake_only(signum: int, frame: object) -> None:
    """Signal handlers only wake the loop (through the wakeup fd)."""


def _killpg(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    except PermissionError:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    except OSError as exc:
        if exc.errno != errno.ESRCH:
            raise


def _read_stack(path: str, limit: int = 1500) -> str:
    try:
        text = Path(path).read_text(errors="replace").strip()
    except OSError:
        return ""
    return text if len(text) <= limit else text[:limit] + "\n..."
