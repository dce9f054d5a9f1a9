"""The master: the loop and its signal table.

Owns the arbiter's four verbs -- wait (one select on the signal pipe, the children's
pipes, the LISTEN connection, the ops sockets, the page process's reports and the answer
of a VACUUM in flight), handle what arrived, reap dead
children, then run what is due (brooq.supervisor.duties), enforce the watchdog
(brooq.supervisor.enforce) and bring the fleet to its target (brooq.supervisor.fleet) --
and what each signal means: TERM and INT drain within graceful_timeout, QUIT drains with
no budget, HUP reloads the application, TTIN and TTOU add or remove a child. Signal
handlers only wake the loop (signal.set_wakeup_fd); all work, logging included, happens
in the loop. It wires the other rooms of brooq.supervisor together and decides nothing
they decide.

It must never block on a client or a child: every descriptor is non-blocking and waited
for in the one select, whose timeout is the nearest deadline. It must never hold a lock
or start a thread, because it forks (a lock held across fork stays held in the child for
ever), and never run application code: the application is imported once, before the
first fork, and no handler or hook runs here. The one exception is a periodic schedule's
``job`` callable (queue.periodic), called by the Periodic duty once per tick to build the
tick's Job; docs/design.md, "Departures", says why and what it must not do.
"""

from __future__ import annotations

import gc
import logging
import os
import select
import signal
import time
import uuid
from functools import partial
from pathlib import Path
from typing import Any

import psycopg
from setproctitle import setproctitle

from brooq import metrics as metrics_mod
from brooq.handlers import Policy
from brooq.ipc.reasons import ASYNC, DRAIN_TIMEOUT, FATAL, SYNC
from brooq.queue import Queue
from brooq.settings import Settings
from brooq.supervisor.accounting import Accounting
from brooq.supervisor.admin import Admin, start_ops
from brooq.supervisor.admintoken import TokenWatch
from brooq.supervisor.connections import Connections
from brooq.supervisor.duties import (
    RENEW,
    Duty,
    Periodic,
    Reaper,
    Reconnect,
    Renewal,
    Retention,
    Scheduler,
    SdWatchdog,
    Stats,
)
from brooq.supervisor.enforce import Enforcer
from brooq.supervisor.fleet import MASTER_SIGNALS, Fleet, ForkSpec
from brooq.supervisor.hosts import HostRule
from brooq.supervisor.ops import OpsServer
from brooq.supervisor.pages import PageProcess
from brooq.supervisor.sdnotify import Notifier
from brooq.supervisor.vacuum import Vacuum

log = logging.getLogger("brooq.master")

EXIT_FATAL = 3
WATCHDOG_TICK = 0.1


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
        admin_token_file: str | None = None,
        schema_verified: bool = False,
        listen_dsn: str | None = None,
    ) -> None:
        self.app_spec = app_spec
        self.settings = settings
        self.dsn = dsn  # the children's (through a pooler, maybe)
        # The master's own connections and the status page's: direct (docs/poolers.md).
        self.listen_dsn = listen_dsn or dsn
        self.drain_deadline = 0.0
        self.notifier = Notifier()
        self.ready_sent = False
        self.metrics = metrics_mod.Metrics() if metrics_dir is not None else None
        self.admin_token = admin_token
        # Read again on SIGHUP and when the file changes: a new token signs everyone out.
        self.token_watch = (
            TokenWatch(admin_token_file, admin_token, time.monotonic())
            if admin_token_file is not None
            else None
        )
        self.ops: OpsServer | None = None
        self.pages: PageProcess | None = None
        self.sig_r = self.sig_w = -1
        self.conns = Connections(
            self.listen_dsn,
            schema=settings.schema,
            schema_verified=schema_verified,
            wake=lambda: self.fleet.wake_idle(),
            reconnected=self._renew_now,
        )
        self.conns.stack_requested = self._stack_requested
        self.accounting = Accounting(
            self.conns,
            {t: h.policy(settings) for t, h in queue.handlers.items()},
            Policy(
                settings.max_attempts,
                settings.attempt_timeout,
                settings.max_execution_timeout,
                settings.backoff_base,
                settings.backoff_max,
            ),
            self.metrics,
            settings.max_lease_expiries,
        )
        spec = ForkSpec(
            dsn,
            settings,
            queue.handlers,
            app_spec,
            baseline,
            self.metrics,
            tuple(queue.middlewares),
        )
        self.fleet = Fleet(spec, self.accounting, self._own_fds)
        self.enforcer = Enforcer(self.fleet, self.conns, settings, self.metrics)
        self.admin = Admin(self.fleet, self.conns, metrics_dir)
        # The count of the jobs runs off the loop, on a connection of its own.
        self.stats = Stats(
            self.conns,
            {t: h.queue for t, h in queue.handlers.items()},
            settings,
            self.metrics,
            dsn=self.listen_dsn,
        )
        duties: list[Duty] = [SdWatchdog(self.notifier)] if self.notifier.watchdog_period else []
        duties += [
            Reconnect(self.conns, self.accounting),
            Renewal(self.fleet, self.conns, settings, self.metrics),
            Reaper(self.conns, settings, self.metrics),
            self.stats,
            Retention(self.conns, settings, self.metrics),
        ]
        self.vacuum = Vacuum(
            self.conns, self.listen_dsn, settings.vacuum_dead_tuples, settings.vacuum_period
        )
        if settings.vacuum_dead_tuples > 0:
            duties.append(self.vacuum)
        # The duties whose statements run off the loop (brooq.supervisor.offloop): their
        # sockets are in the select, their answers read when readable.
        self.off_loop: list[Stats | Vacuum] = [self.vacuum, self.stats]
        if queue.schedules:
            duties.append(
                Periodic(
                    self.conns,
                    queue.schedules,
                    queue.handlers,
                    settings,
                    self.metrics,
                    draining=lambda: self.fleet.stopping,
                )
            )
        self.scheduler = Scheduler(duties, time.monotonic())
        self.schedule_count = len(queue.schedules)

    # -- life cycle --------------------------------------------------------------------------

    def run(self) -> int:
        self.sig_r, self.sig_w = os.pipe()
        for fd in (self.sig_r, self.sig_w):
            os.set_blocking(fd, False)
        signal.set_wakeup_fd(self.sig_w, warn_on_full_buffer=False)
        for signum in MASTER_SIGNALS:
            signal.signal(signum, _wake_only)
        self._title()
        gc.freeze()  # what the app imported stays in shared copy-on-write pages
        log.info(
            "event=master_started app=%s workers=%d lease=%gs pid=%d",
            self.app_spec,
            self.fleet.target,
            self.settings.lease,
            os.getpid(),
        )
        hooks = self.admin.hooks(self.admin_token, HostRule.of(self.settings.ops_allowed_hosts))
        if self.settings.ops_addr:
            # The status page renders in a process of its own, never in this loop.
            self.pages = PageProcess(
                self.listen_dsn,
                self.admin_token,
                self._fds_for_pages,
                MASTER_SIGNALS,
                self.settings.schema,
                hooks.hosts,
            )
            self.fleet.other_reaped = self.pages.reaped
            hooks.page = self.pages.hand
        self.ops = start_ops(self.settings.ops_addr, hooks)
        self._set_configured()
        self.conns.connect()
        try:
            return self._loop()
        finally:
            if self.pages is not None:
                self.pages.stop()
            for duty in self.off_loop:
                duty.close()
            self.conns.close()
            if self.ops is not None:
                self.ops.close()
            self.fleet.close()

    def _loop(self) -> int:
        fleet = self.fleet
        while True:
            self._manage()
            timeout = self._timeout()
            fds = [self.sig_r, *(c.reader.fd for c in fleet.children.values())]
            if (listen := self.conns.listen_fd()) is not None:
                fds.append(listen)
            writes: list[int] = []
            if self.ops is not None:
                fds.extend(self.ops.read_fds())
                writes = self.ops.write_fds()
            if self.pages is not None:
                fds.extend(self.pages.read_fds())  # its reports: start, writing, end
            for duty in self.off_loop:
                fds.extend(duty.read_fds())  # the answer of a VACUUM or a count in flight
            try:
                readable, writable, _ = select.select(fds, writes, [], timeout)
            except InterruptedError:
                readable = writable = []
            now = time.monotonic()
            if self.sig_r in readable:
                self._handle_signals()
            self._check_token(now)
            for c in list(fleet.children.values()):
                if c.reader.fd in readable:
                    fleet.read_child(c, now)
            if (listen := self.conns.listen_fd()) is not None and listen in readable:
                self.conns.read_notifications()
            if fleet.stack_answers:
                self._answer_stacks()
            if self.ops is not None:
                # Never waits on a client: what is not ready now waits for a later pass.
                self.ops.service(set(readable), set(writable))
            if self.pages is not None:
                # Reads its reports; kills it when a request runs over its limit.
                self.pages.service(set(readable), time.monotonic())
            for duty in self.off_loop:
                duty.service(set(readable))
            fleet.reap()
            self._run_due(time.monotonic())
            fleet.read_boards()
            self.enforcer.run(time.monotonic())
            if (fatal := self._fatal()) is not None:
                return self._die(fatal)
            if fleet.stopping:
                if not fleet.children:
                    self.accounting.flush()
                    return self._finish()
                if time.monotonic() >= self.drain_deadline:
                    fleet.kill_all(DRAIN_TIMEOUT)

    def _timeout(self) -> float:
        now = time.monotonic()
        nearest = self.scheduler.next_at()
        # A child holding jobs may start one at any moment without telling: keep looking.
        if self.fleet.holding() or self.fleet.stopping:
            nearest = min(nearest, now + WATCHDOG_TICK)
        fork_at = self.fleet.next_fork_at()
        if fork_at is not None:
            nearest = min(nearest, max(fork_at, now))  # a fork delayed by a crash streak
        ops_deadline = self.ops.next_deadline() if self.ops is not None else None
        if ops_deadline is not None:
            nearest = min(nearest, ops_deadline)
        if self.pages is not None and (page_deadline := self.pages.next_deadline()) is not None:
            nearest = min(nearest, page_deadline)
        return max(0.0, min(nearest - now, 1.0))

    def _manage(self) -> None:
        if self.fleet.stopping or self._fatal():
            return
        all_ready = self.fleet.manage()
        if not self.ready_sent and all_ready:
            self.ready_sent = True
            self.notifier.send("READY=1", f"STATUS=running {self.fleet.target} workers")

    def _run_due(self, now: float) -> None:
        for duty in self.scheduler.due(now):
            duty.run_once(now)

    def _renew_now(self) -> None:
        # A renewal missed while the connection was down runs now, before the reaper,
        # not a whole period later: or short outages let our own leases run out.
        self.scheduler.due_now(RENEW)

    def _fatal(self) -> str | None:
        return self.fleet.fatal or self.conns.fatal

    def _own_fds(self) -> list[int]:
        """The master's own descriptors, which a forked child closes."""
        ops = self.ops.fds() if self.ops is not None else []  # listening socket, clients
        pages = self.pages.fds() if self.pages is not None else []
        return [
            self.sig_r,
            self.sig_w,
            *ops,
            *pages,
            *self.conns.fds(),
            *(fd for duty in self.off_loop for fd in duty.fds()),
        ]

    def _fds_for_pages(self) -> list[int]:
        """What the page process closes: the master's descriptors and every worker's
        pipes (a worker must see its master's end of the pipe close when it dies)."""
        return [*self._own_fds(), *(fd for c in self.fleet.children.values() for fd in c.fds)]

    def _finish(self) -> int:
        if self.accounting.released:
            log.warning(
                "event=master_stopped jobs_returned=%d: unfinished jobs went back to pending "
                "with their attempt refunded",
                self.accounting.released,
            )
            return 1
        log.info("event=master_stopped jobs_returned=0")
        return 0

    def _die(self, reason: str) -> int:
        log.error("event=master_fatal reason=%r", reason)
        self.fleet.kill_all(FATAL)
        deadline = time.monotonic() + 5
        while self.fleet.children and time.monotonic() < deadline:
            self.fleet.reap()
            time.sleep(0.05)
        self.accounting.flush()
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
                self._check_token(time.monotonic(), reread=True)
                if not self.fleet.stopping:
                    self.fleet.start_reload()
                    if self.schedule_count:
                        # The master never re-imports the application (docs/design.md).
                        log.warning(
                            "event=reload_keeps_schedules schedules=%d: periodic schedules "
                            "are read once, when the master starts; restart it to change "
                            "them",
                            self.schedule_count,
                        )
            elif signum == signal.SIGTTIN:
                self._set_target(self.fleet.target + 1, "SIGTTIN")
            elif signum == signal.SIGTTOU:
                self._set_target(max(1, self.fleet.target - 1), "SIGTTOU")

    def _check_token(self, now: float, *, reread: bool = False) -> None:
        """A changed admin token takes effect at once, here and in the page process."""
        watch = self.token_watch
        if watch is None or not (watch.reload(now) if reread else watch.poll(now)):
            return
        self.admin_token = watch.token
        if self.ops is not None:
            self.ops.hooks.token = watch.token
        if self.pages is not None:
            self.pages.set_token(watch.token)

    def _drain(self, why: str, budget: float | None = None) -> None:
        if budget is None:
            budget = self.settings.graceful_timeout
        if self.fleet.stopping:
            if budget == 0.0:
                self.drain_deadline = time.monotonic()
            return
        self.fleet.stopping = True
        self.drain_deadline = time.monotonic() + budget
        self.notifier.send("STOPPING=1", f"STATUS=draining ({why})")
        self.fleet.read_boards()  # what runs at this moment, not at the last tick
        busy = self.fleet.busy()
        log.info(
            "event=drain_started signal=%s busy_children=%d in_flight=%d budget=%gs",
            why,
            busy,
            self.fleet.running(),
            budget,
        )
        self._title()
        self.fleet.stop_all()

    def _stack_requested(self, payload: str) -> None:
        """`brooq jobs stack` asked for a job's stack (brooq.stacks): if one of our children
        runs it, ask that child; its answer comes back on its pipe (_answer_stacks)."""
        try:
            job_id = uuid.UUID(payload)
        except ValueError:
            return
        if self.fleet.ask_stack(job_id):
            log.info("event=stack_requested job=%s", job_id)

    def _answer_stacks(self) -> None:
        """Write the stacks children sent into the waiting requests (one short statement
        each on the maintenance connection, like every duty's)."""
        answers, self.fleet.stack_answers = self.fleet.stack_answers, []
        for worker, job_id, text in answers:
            params: dict[str, Any] = {"job_id": job_id, "worker": worker, "stack": text}
            self.conns.with_db("stack_answer", partial(_execute, self.conns.q.stack_answer, params))

    def _set_target(self, workers: int, by: str) -> None:
        self.fleet.target = workers
        log.info("event=workers_changed workers=%d by=%s", workers, by)
        self._title()
        self._set_configured()

    def _set_configured(self) -> None:
        if self.metrics is not None:
            self.metrics.configured.set(self.fleet.target)

    def _title(self) -> None:
        state = " draining" if self.fleet.stopping else ""
        targets = self.fleet.targets()
        kinds = ""
        if ASYNC in targets:
            concurrency = self.settings.concurrency
            sync = f"{targets[SYNC]} sync, " if SYNC in targets else ""
            kinds = f" ({sync}{targets[ASYNC]} async x {concurrency})"
        setproctitle(f"brooq-master: app={self.app_spec} workers={self.fleet.target}{kinds}{state}")


def _execute(statement: Any, params: dict[str, Any], conn: psycopg.Connection[Any]) -> None:
    conn.execute(statement, params)


def _wake_only(signum: int, frame: object) -> None:
    """Signal handlers only wake the loop (through the wakeup fd)."""
