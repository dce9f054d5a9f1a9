"""The master: the loop and its signal table.

Owns the arbiter's four verbs -- wait (one select on every source of the loop:
brooq.supervisor.source; the signal pipe, the children's pipes, the LISTEN connection,
the ops sockets, the page process's reports, the answer of a count or a VACUUM in
flight), handle what arrived (each source's service), reap dead children, then run what
is due (brooq.supervisor.duties), enforce the watchdog (brooq.supervisor.enforce) and
bring the fleet to its target (brooq.supervisor.fleet) -- and what each signal means:
TERM and INT drain within graceful_timeout, QUIT drains with no budget, HUP reloads the
application, TTIN and TTOU add or remove a child. Signal handlers only wake the loop
(brooq.supervisor.signalpipe); all work, logging included, happens in the loop. It wires
the other rooms of brooq.supervisor together and decides nothing they decide.

It must never block on a client or a child: every descriptor is non-blocking and waited
for in the one select, whose timeout is the nearest deadline. It must never hold a lock
or start a thread, because it forks (a lock held across fork stays held in the child for
ever), and never run application code: the application is imported once, before the
first fork, and no handler or hook runs here. The one exception is a periodic schedule's
``job`` callable (queue.periodic), called by the Periodic duty once per tick to build the
tick's Job; docs/design.md, "Decisions, and why", says why and what it must not do.
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
from brooq.db import NONE
from brooq.declare.handlers import Policy
from brooq.ipc.reasons import ASYNC, DRAIN_TIMEOUT, FATAL, SYNC
from brooq.opsport.hosts import HostRule
from brooq.queue import Queue
from brooq.settings import Settings
from brooq.supervisor.accounting import Accounting
from brooq.supervisor.admin import Admin, start_ops
from brooq.supervisor.admintoken import TokenWatch
from brooq.supervisor.cancels import CancelsHeard
from brooq.supervisor.connections import Connections
from brooq.supervisor.duties.beat import BEAT, Beat
from brooq.supervisor.duties.keys import KeyUpkeep
from brooq.supervisor.duties.periodic import Periodic
from brooq.supervisor.duties.progress import ProgressWrites
from brooq.supervisor.duties.reaper import Reaper
from brooq.supervisor.duties.reconnect import Reconnect
from brooq.supervisor.duties.renewal import RENEW, Renewal
from brooq.supervisor.duties.retention import Retention
from brooq.supervisor.duties.scheduler import Duty, Scheduler
from brooq.supervisor.duties.sdwatchdog import SdWatchdog
from brooq.supervisor.duties.snapshot import SnapshotWatch
from brooq.supervisor.duties.stats import Stats
from brooq.supervisor.duties.vacuum import Vacuum
from brooq.supervisor.enforce import Enforcer
from brooq.supervisor.fleet import MASTER_SIGNALS, Fleet, ForkSpec
from brooq.supervisor.leftovers import Leftovers
from brooq.supervisor.ops import OpsServer
from brooq.supervisor.options import HandlerOptions
from brooq.supervisor.pagekeeper import PageKeeper
from brooq.supervisor.sdnotify import Notifier
from brooq.supervisor.signalpipe import SignalPipe
from brooq.supervisor.source import Source
from brooq.supervisor.unhandled import Unhandled

log = logging.getLogger("brooq.master")

EXIT_FATAL = 3
WATCHDOG_TICK = 0.1


class Master:
    """One master. Its three DSNs: ``dsn``, the children's (through a pooler, maybe);
    ``listen_dsn``, the master's own connections and the status page's, direct
    (docs/poolers.md); ``read_dsn``, where the status page reads
    (QUEUE_READ_DATABASE_URL: a standby, say; None: the listen_dsn), never used by the
    master itself."""

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
        read_dsn: str | None = None,
    ) -> None:
        self.app_spec = app_spec
        self.settings = settings
        self.dsn = dsn
        self.listen_dsn = listen_dsn or dsn
        self.read_dsn = read_dsn
        self.drain_deadline = 0.0
        self.notifier = Notifier()
        self.ready_sent = False
        self.metrics = _build_metrics(queue, metrics_dir)
        self.admin_token = admin_token
        self.token_watch = _watch_token(admin_token_file, admin_token)
        self.ops: OpsServer | None = None
        self.pages: PageKeeper | None = None
        self.signals = SignalPipe(self._handle_signals)
        # What the loop waits on, in the order served (set in run, before any fork).
        self.sources: list[Source] = []
        self.conns = self._open_connections(schema_verified)
        self.accounting = self._build_accounting(queue)
        self.fleet = Fleet(self._fork_spec(queue, baseline), self.accounting, self._own_fds)
        self.enforcer = Enforcer(self.fleet, self.conns, settings, self.metrics)
        self.admin = Admin(self.fleet, self.conns, metrics_dir)
        self._build_off_loop_duties(queue)
        self.scheduler = Scheduler(self._build_duties(queue), time.monotonic())
        self.schedule_count = len(queue.schedules)

    # -- the parts, built once, before any fork ----------------------------------------------

    def _open_connections(self, schema_verified: bool) -> Connections:
        """The master's own connections (listen, maintenance), on the listen_dsn."""
        conns = Connections(
            self.listen_dsn,
            schema=self.settings.schema,
            schema_verified=schema_verified,
            wake=lambda: self.fleet.wake_idle(),
            reconnected=self._renew_now,
        )
        conns.stack_requested = self._stack_requested
        # A processing job canceled: the renewal that finds its lease lost runs now.
        self.cancels = CancelsHeard(self.settings.renew_period)
        conns.cancels_heard = self._cancels_heard
        return conns

    def _build_accounting(self, queue: Queue) -> Accounting:
        """The settlement of the children's outcomes, with each topic's retry policy."""
        settings = self.settings
        return Accounting(
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

    def _fork_spec(self, queue: Queue, baseline: frozenset[str]) -> ForkSpec:
        """What every child is forked with."""
        return ForkSpec(
            self.dsn,
            self.settings,
            queue.handlers,
            self.app_spec,
            baseline,
            self.metrics,
            tuple(queue.middlewares),
            tuple(queue.child_start_hooks),
        )

    def _build_off_loop_duties(self, queue: Queue) -> None:
        """The duties that are also sources of the loop, and what they share: the count
        (self.stats), this master's beat (self.beat), the handler options (self.options),
        the leftovers of dead children (self.leftovers) and the VACUUM (self.vacuum)."""
        settings, handlers = self.settings, queue.handlers
        # The count of the jobs runs off the loop, on a connection of its own.
        self.stats = Stats(
            self.conns,
            {t: h.queue for t, h in handlers.items()},
            settings,
            self.metrics,
            dsn=self.listen_dsn,
            limited=any(h.holds_back for h in handlers.values()),
        )
        # This master's row in brooq_master, and the ready jobs no live master handles.
        self.beat = Beat(self.conns, self.fleet, self.app_spec, handlers, settings, self.listen_dsn)
        self.fleet.changed = self._children_changed
        # Its handler options, from the children after a reload (brooq.supervisor.options).
        self.options = HandlerOptions(
            self.fleet, self.accounting, self.beat, self.stats, settings, handlers
        )
        # What a dead child's claim committed after its death (brooq.supervisor.leftovers).
        self.leftovers = Leftovers(
            self.conns,
            self.accounting,
            settings.lease,
            self.metrics,
            time.monotonic,
            follow=settings.pooler == NONE,
        )
        self.stats.unhandled = Unhandled(self.beat.live_pairs, self.metrics)
        self.vacuum = Vacuum(
            self.conns, self.listen_dsn, settings.vacuum_dead_tuples, settings.vacuum_period
        )

    def _build_duties(self, queue: Queue) -> list[Duty]:
        """What the scheduler runs when due, in this order."""
        settings = self.settings
        duties: list[Duty] = [SdWatchdog(self.notifier)] if self.notifier.watchdog_period else []
        duties += [
            Reconnect(self.conns, self.accounting),
            Renewal(self.fleet, self.conns, settings, self.metrics),
            ProgressWrites(self.fleet, self.conns),
            Reaper(self.conns, settings, self.metrics),
            self.beat,
            self.stats,
            SnapshotWatch(self.conns, settings.snapshot_warn, self.metrics),
            Retention(self.conns, settings, self.metrics),
            KeyUpkeep(self.conns, queue.handlers),
        ]
        if settings.vacuum_dead_tuples > 0:
            duties.append(self.vacuum)
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
        return duties

    def _open_ops_port(self) -> None:
        """The ops HTTP surface (self.ops), and the status page's process (self.pages)
        when it listens: the page renders in a process of its own, never in this loop."""
        hooks = self.admin.hooks(self.admin_token, HostRule.of(self.settings.ops_allowed_hosts))
        if self.settings.ops_addr:
            self.pages = PageKeeper(
                self.listen_dsn,
                self.admin_token,
                self._own_fds,
                MASTER_SIGNALS,
                self.settings.schema,
                hooks.hosts,
                self.read_dsn,
            )
            self.fleet.other_reaped = self.pages.reaped
            hooks.page = self.pages.hand
        self.ops = start_ops(self.settings.ops_addr, hooks)

    def _build_sources(self) -> list[Source]:
        """What the loop waits on, in the order served."""
        sources: list[Source] = [self.signals, self.fleet, self.conns]
        sources += [s for s in (self.ops, self.pages) if s is not None]
        # The duties whose statements run off the loop (brooq.supervisor.offloop).
        sources += [self.vacuum, self.stats, self.beat, self.leftovers]
        return sources

    # -- life cycle --------------------------------------------------------------------------

    def run(self) -> int:
        self.signals.open(MASTER_SIGNALS)
        self._title()
        gc.freeze()  # what the app imported stays in shared copy-on-write pages
        log.info(
            "event=master_started app=%s workers=%d lease=%gs pid=%d",
            self.app_spec,
            self.fleet.target,
            self.settings.lease,
            os.getpid(),
        )
        self._open_ops_port()
        self.sources = self._build_sources()
        self._set_configured()
        self.conns.connect()
        try:
            return self._loop()
        finally:
            self.beat.leave()  # drops out of the fleet at once, whatever the way out
            for source in reversed(self.sources):
                source.close()

    def _loop(self) -> int:
        fleet = self.fleet
        while True:
            self._manage()
            timeout = self._timeout()
            reads = [fd for source in self.sources for fd in source.read_fds()]
            writes = [fd for source in self.sources for fd in source.write_fds()]
            try:
                readable, writable, _ = select.select(reads, writes, [], timeout)
            except InterruptedError:
                readable = writable = []
            ready_r, ready_w = set(readable), set(writable)
            self._check_token(time.monotonic())  # a new token before this pass's requests
            for source in self.sources:
                # Never waits: what is not ready now waits for a later pass.
                source.service(ready_r, ready_w)
            if fleet.stack_answers:
                self._answer_stacks()
            if self.cancels.pending:
                self._match_cancels()
            self.options.check()  # before a death's settlement is written (reap)
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
        for source in self.sources:
            if (deadline := source.next_deadline()) is not None:
                nearest = min(nearest, deadline)
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

    def _children_changed(self) -> None:
        self.leftovers.children_changed(self.fleet.children)
        self.beat.children_changed()
        self.scheduler.due_now(BEAT)

    def _renew_now(self) -> None:
        # A renewal missed while the connection was down runs now, before the reaper,
        # not a whole period later: or short outages let our own leases run out.
        self.scheduler.due_now(RENEW)

    def _cancels_heard(self, payloads: list[str]) -> None:
        self.cancels.heard(payloads, time.monotonic())

    def _match_cancels(self) -> None:
        # Before _run_due in the same pass: the child hears `lost` within this pass.
        if self.cancels.match(self.fleet.children.values(), time.monotonic()):
            self.scheduler.due_now(RENEW)

    def _fatal(self) -> str | None:
        return self.fleet.fatal or self.conns.fatal

    def _own_fds(self) -> list[int]:
        """The descriptors of every source, closed in each process the master forks (a
        worker must see its master's end of a sibling's pipe close when it dies)."""
        return [fd for source in self.sources for fd in source.fds()]

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

    def _handle_signals(self, data: bytes) -> None:
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
        """`brooq jobs stack` asked for a job's stack (brooq.producer.stacks): if one of our
        children runs it, ask that child; its answer comes back on its pipe (_answer_stacks)."""
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


def _build_metrics(queue: Queue, metrics_dir: Path | None) -> metrics_mod.Metrics | None:
    """The master's metrics, every labelled series at zero; None when none is kept."""
    if metrics_dir is None:
        return None
    metrics = metrics_mod.Metrics()
    metrics.zero(queue.handlers)
    return metrics


def _watch_token(admin_token_file: str | None, token: bytes | None) -> TokenWatch | None:
    """The admin token's file, read again on SIGHUP and when it changes: a new token signs
    everyone out."""
    if admin_token_file is None:
        return None
    return TokenWatch(admin_token_file, token, time.monotonic())


def _execute(statement: Any, params: dict[str, Any], conn: psycopg.Connection[Any]) -> None:
    conn.execute(statement, params)
