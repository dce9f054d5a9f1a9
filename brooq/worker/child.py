"""A worker process: set up after fork, then claim -> run the handler -> write the outcome.

One job at a time. The child opens its own connection after the fork. It talks to the
master over two pipes (brooq.protocol): it reports ready / busy / idle, and it hears
"wake" and "lost <id>" from a small reader thread. The master renews the leases; the
child never does.

Interruptions reach the handler as exceptions raised by signal handlers in the main
thread, and only while the handler runs:
  SIGALRM -> brooq.AttemptTimeout (attempt_timeout, the soft limit)
  SIGUSR1 -> brooq.LeaseLost      (the master found the job canceled, reaped or taken)
SIGTERM asks the child to finish its job and exit. SIGUSR2 dumps every thread's Python
stack (faulthandler) to a file the master reads before a hard kill.
"""

from __future__ import annotations

import contextlib
import faulthandler
import json
import logging
import os
import random
import resource
import select
import signal
import socket
import sys
import threading
import time
import traceback
import uuid
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING, Any

import psycopg
from psycopg.types.json import set_json_loads
from setproctitle import setproctitle

from brooq import logs
from brooq.dsn import session_options
from brooq.errors import InvalidPayload
from brooq.handlers import Handler, Policy
from brooq.ipc import protocol
from brooq.ipc.board import Board, Running
from brooq.job import AttemptTimeout, Claim, Interruption, LeaseLost
from brooq.metrics import Tally
from brooq.produce import enqueue_many
from brooq.settings import Settings
from brooq.sql import Q
from brooq.worker import execute

if TYPE_CHECKING:
    from brooq.metrics import Metrics

log = logging.getLogger("brooq.child")

EXIT_OK = 0
EXIT_CRASHED = 1
EXIT_BOOT_ERROR = 3
EXIT_APP_LOAD_ERROR = 4
EXIT_MASTER_GONE = 70

# A batch holds at most about BATCH_BUDGET seconds of recent average work, so that the
# round trip between jobs is paid once per batch while nothing waits long behind its
# batchmates; a job longer than LONG_JOB gives back the rest of its batch.
BATCH_BUDGET = 0.1
LONG_JOB = 0.5
PEAK_RSS_MAX_AGE = 0.25
TITLE_TICK = 0.25  # how often the control thread refreshes the process title


@dataclass
class ChildConfig:
    """What the master hands a child at fork time."""

    identity: str
    dsn: str
    settings: Settings
    handlers: dict[str, Handler]
    to_master: int  # write end
    from_master: int  # read end
    stack_file: str
    app_spec: str = ""
    reload_baseline: frozenset[str] | None = None  # set after SIGHUP: re-import the app
    metrics: Metrics | None = None
    board: Board | None = None  # shared with the master; a private one when alone


def identity_for(pid: int, tag: str) -> str:
    """locked_by of a child: unique on this host (hostname, pid) and across pid reuse (tag)."""
    return f"{socket.gethostname()}:{pid}:{tag}"


class Child:
    def __init__(self, config: ChildConfig) -> None:
        self.config = config
        self.settings = config.settings
        self.handlers = config.handlers
        self.policies: dict[str, Policy] = {}
        self.conn: psycopg.Connection[Any] | None = None
        self.stopping = False
        self.master_gone = False
        self.jobs_done = 0
        self.current_claim: Claim | None = None  # the job whose handler runs now
        self.current_started = 0.0
        self.title = ""
        self.batch = 1
        self.held: list[uuid.UUID] = []  # claimed and not yet settled, in claim order
        self.told_held: list[uuid.UUID] = []  # what the master was last told we hold
        self.board = config.board or Board()
        self.tally = Tally()  # metrics, written once per round trip
        self.peak_rss = 0.0
        self.peak_rss_at = -PEAK_RSS_MAX_AGE
        self.busy_gauge = False
        self.unwritten: list[_Finished] = []  # finished with `done`, written next trip
        self.last_traceback = ""
        self.in_handler = False
        self.lost: set[uuid.UUID] = set()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._main_thread = threading.get_ident()
        self._stack_fh: IO[str] | None = None

    # -- setup -------------------------------------------------------------------------

    def setup(self) -> None:
        os.setpgrp()  # the master kills our whole group, grandchildren included
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the master's business
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        signal.signal(signal.SIGTTIN, signal.SIG_IGN)
        signal.signal(signal.SIGTTOU, signal.SIG_IGN)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.signal(signal.SIGQUIT, signal.SIG_DFL)
        signal.signal(signal.SIGTERM, self._on_term)
        signal.signal(signal.SIGALRM, self._on_alarm)
        signal.signal(signal.SIGUSR1, self._on_lease_lost)
        signal.set_wakeup_fd(self._wake_w, warn_on_full_buffer=False)
        self._stack_fh = open(self.config.stack_file, "w")  # noqa: SIM115 - lives with us
        faulthandler.register(signal.SIGUSR2, file=self._stack_fh, all_threads=True)
        self._to_master = _ToMaster(self.config.to_master)  # never blocks, see there
        os.set_blocking(self.config.from_master, True)
        if self.config.reload_baseline is not None:
            self._reload_app()
        self.policies = {t: h.policy(self.settings) for t, h in self.handlers.items()}
        self.topics = sorted(self.handlers)
        threading.Thread(target=self._read_master, name="brooq-control", daemon=True).start()
        self._update_title()
        self._tell({"ready": 1})

    def _reload_app(self) -> None:
        from brooq.app import forget_user_modules, load

        assert self.config.reload_baseline is not None
        forget_user_modules(set(self.config.reload_baseline))
        queue = load(self.config.app_spec)
        self.handlers = queue.handlers

    # -- signals (main thread, between bytecodes) ----------------------------------------

    def _on_term(self, signum: int, frame: object) -> None:
        self.stopping = True

    def _on_alarm(self, signum: int, frame: object) -> None:
        if self.in_handler:
            self.in_handler = False
            raise AttemptTimeout("attempt_timeout exceeded")

    def _on_lease_lost(self, signum: int, frame: object) -> None:
        claim = self.current_claim
        if self.in_handler and claim is not None and claim.id in self.lost:
            self.in_handler = False
            raise LeaseLost(f"lease of job {claim.id} lost")

    # -- the master's pipe (reader thread) -----------------------------------------------

    def _read_master(self) -> None:
        reader = protocol.LineReader(self.config.from_master)
        while True:
            ready, _, _ = select.select([self.config.from_master], [], [], TITLE_TICK)
            if ready:
                for line in reader.read():
                    if line == b"w":
                        protocol.send(self._wake_w, b"w")
                    elif line.startswith(b"lost "):
                        job_id = uuid.UUID(line[5:].decode())
                        self.lost.add(job_id)
                        running = self.current_claim
                        if running is not None and running.id == job_id:
                            signal.pthread_kill(self._main_thread, signal.SIGUSR1)
                if reader.eof:
                    self._on_master_gone()
                    return
            # What waited for room in a full pipe goes out once the master reads again.
            if not self.master_gone and not self._to_master.flush():
                self.master_gone = True
                self.stopping = True
                protocol.send(self._wake_w, b"x")
            self._update_title()

    def _on_master_gone(self) -> None:
        # Without a master nobody renews our lease: finish within one renewal period or go.
        self.master_gone = True
        self.stopping = True
        protocol.send(self._wake_w, b"x")
        time.sleep(self.settings.renew_period)
        os._exit(EXIT_MASTER_GONE)

    def _tell(self, message: dict[str, Any]) -> None:
        if not self._to_master.send(message):
            self.master_gone = True
            self.stopping = True

    def _update_title(self) -> None:
        """The process title shows the running job or idle. This thread keeps it, a few
        times a second, rather than the main thread twice per job: setting it costs
        about as much as a short job, and a job too short to be seen needs no title."""
        claim, started = self.current_claim, self.current_started
        if claim is None:
            title = "brooq-child: idle"
        else:
            title = (
                f"brooq-child: {claim.topic} {claim.id} attempt {claim.attempt} "
                f"running {time.monotonic() - started:.0f}s"
            )
        if title != self.title:
            self.title = title
            setproctitle(title)

    # -- database --------------------------------------------------------------------------

    def _connection(self) -> psycopg.Connection[Any]:
        delay = 0.1
        while self.conn is None or self.conn.closed:
            if self.stopping:
                raise _Stop
            try:
                self.conn = psycopg.connect(
                    self.config.dsn,
                    autocommit=True,
                    connect_timeout=5,
                    application_name=f"brooq-child {self.config.identity}"[:63],
                    # No bitmap scans for brooq's own statements: before the job table's
                    # first ANALYZE the planner would read every ready row of the ready
                    # index and sort them for each claim (22 ms instead of 1.3 ms for a
                    # 32-job claim on 20,000 rows). Users' on_success writes get them back.
                    # Added to the DSN's own options (search_path, ...), never instead.
                    options=session_options(
                        self.config.dsn,
                        {
                            "synchronous_commit": self.settings.worker_synchronous_commit,
                            "enable_bitmapscan": "off",
                        },
                    ),
                )
                # A payload that cannot be decoded (inserted by hand, nested too deep)
                # must fail its job, not crash the child on every claim.
                set_json_loads(_decode_payload, self.conn)
            except psycopg.OperationalError as exc:
                log.warning(
                    "event=db_unreachable who=child worker=%s retry_in=%.1fs error=%r",
                    self.config.identity,
                    delay,
                    str(exc).strip().splitlines()[0],
                )
                self._sleep(delay)
                delay = min(delay * 2, 5.0)
        return self.conn

    def _drop_connection(self) -> None:
        if self.conn is not None:
            # A broken connection may fail to close; it is gone either way.
            with contextlib.suppress(Exception):
                self.conn.close()
        self.conn = None

    def _sleep(self, seconds: float) -> None:
        """Wait for a wake-up, a signal or the timeout."""
        ready, _, _ = select.select([self._wake_r], [], [], seconds)
        if ready:
            try:
                while os.read(self._wake_r, 4096):
                    pass
            except BlockingIOError:
                pass

    # -- the loop ---------------------------------------------------------------------------
    #
    # Claims are adaptive: one job at a time by default; while recent jobs are short and
    # the queue keeps the batch full, a few at once (up to claim_batch_max), so one round
    # trip writes the finished jobs' `done` and claims the next ones. A long job drops the
    # batch back to one and gives back what it had claimed beyond the job it runs.

    def run(self) -> int:
        try:
            while not self.stopping:
                claims = self._flush_and_claim(self.batch)
                if not claims:
                    self._sleep(self.settings.poll_interval)
                    continue
                if self._run_batch(claims):
                    break
        except _Stop:
            pass
        finally:
            self._finish_up()
        return EXIT_OK

    def _finish_up(self) -> None:
        """Before exiting: give back what was not started, write what finished. Also when
        the master is gone: the database may well be up, and a finished job whose `done`
        is not written runs again once its lease expires."""
        try:
            unstarted = [i for i in self.held if i not in {f.claim.id for f in self.unwritten}]
            if unstarted:
                self._release(unstarted)
            if self.unwritten:
                self._flush_and_claim(0)
        except (_Stop, psycopg.Error):
            pass  # the leases expire and the reaper returns the jobs
        self.tally.flush()

    def _run_batch(self, claims: list[Claim]) -> bool:
        """Run claimed jobs in order; True when the child must retire."""
        elapsed = 0.0
        for i, claim in enumerate(claims):
            if self.stopping:
                self._release([c.id for c in claims[i:]])
                return False
            duration = self._run_one(claim)
            elapsed += duration
            rest = claims[i + 1 :]
            if rest and duration >= LONG_JOB:
                self._release([c.id for c in rest])  # others may run them sooner
                self.batch = 1
                return self._should_retire()
            if self._should_retire():
                self._release([c.id for c in rest])
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
        finished = self.unwritten
        if not finished and limit == 0:
            return []
        if self.stopping:
            limit = 0
        try:
            conn = self._connection()
            rows = conn.execute(
                Q.job_finish_and_claim,
                {
                    "done": [f.claim.id for f in finished],
                    "topics": self.topics,
                    "limit": limit,
                    "children": max(1, self.settings.workers),
                    "worker": self.config.identity,
                    "lease": self.settings.lease,
                },
                prepare=True,
            ).fetchall()
        except psycopg.OperationalError as exc:
            # Not known whether it committed. The finished jobs stay held and are written
            # again on the next pass (the guard makes that harmless); claims it may have
            # made come back through the reaper.
            self._on_db_error("claim", exc)
            return []
        self.unwritten = []
        written = {r[1] for r in rows if not r[0]}
        with logs.batch(log):  # the round trip's job_done lines in one write
            for f in finished:
                self._settled(f.claim, "done" if f.claim.id in written else None, f.duration)
        claimed = sorted((r for r in rows if r[0]), key=lambda r: (r[7], r[1]))
        claims = [
            Claim(
                id=r[1], topic=r[2], payload=r[3], attempt=r[4], locked_by=r[5], locked_until=r[6]
            )
            for r in claimed
        ]
        self.held = [c.id for c in claims]
        self.lost.intersection_update(self.held)
        # The master renews what we hold: it must know before any of these jobs runs.
        self._tell_held()
        self._count_claims(claims)
        return claims

    def _count_claims(self, claims: list[Claim]) -> None:
        """Count the claims, set the busy gauge once per batch and write what the last
        batch tallied."""
        metrics = self.config.metrics
        if metrics is None:
            return
        for c in claims:
            self.tally.inc(metrics.claims, c.topic)
        if bool(claims) != self.busy_gauge:
            self.busy_gauge = bool(claims)
            metrics.busy.set(1 if claims else 0)
        self.tally.flush()

    def _tell_held(self) -> None:
        if self.held != self.told_held:
            self._tell({"held": [str(i) for i in self.held]})
            self.told_held = list(self.held)

    def _release(self, ids: list[uuid.UUID]) -> None:
        if not ids:
            return
        try:
            conn = self._connection()
            conn.execute(Q.job_release_ids, {"ids": ids, "worker": self.config.identity})
        except psycopg.OperationalError as exc:
            self._on_db_error("release", exc)  # the reaper returns them after the lease
        self.held = [i for i in self.held if i not in ids]
        self._tell_held()

    def _on_db_error(self, what: str, exc: BaseException) -> None:
        log.warning(
            "event=db_error who=child worker=%s during=%s error=%r",
            self.config.identity,
            what,
            str(exc).strip().splitlines()[0] if str(exc) else exc,
        )
        self._drop_connection()

    def _run_one(self, claim: Claim) -> float:
        """Run one claimed job; write its outcome, or keep a plain `done` for the next
        round trip. Returns how long the handler ran."""
        policy = self.policies[claim.topic]
        self.current_started = time.monotonic()
        self.current_claim = claim
        if log.isEnabledFor(logging.DEBUG):
            log.debug(
                "event=job_claimed job=%s topic=%s attempt=%d",
                claim.id,
                claim.topic,
                claim.attempt,
            )
        metrics = self.config.metrics
        cpu_before = time.process_time() if metrics is not None else 0.0
        self.board.post(
            Running(
                id=claim.id,
                topic=claim.topic,
                attempt=claim.attempt,
                started=self.current_started,
                max_execution_timeout=policy.max_execution_timeout,
            )
        )
        error = self._call(self.handlers[claim.topic], claim, policy)
        self.board.clear()  # from here on the watchdog leaves us alone
        duration = time.monotonic() - self.current_started
        self.last_traceback = ""
        if error is not None and not isinstance(error, Interruption):
            self.last_traceback = "\n" + "".join(traceback.format_exception(error)).rstrip()
        outcome = execute.decide(error, claim.attempt, policy, random.random())
        if claim.id in self.lost:
            outcome = execute.Outcome("abandon")
        if metrics is not None:
            cpu = time.process_time() - cpu_before
            self.tally.observe(metrics.attempt_duration, claim.topic, duration)
            self.tally.observe(metrics.attempt_cpu, claim.topic, cpu)
            self.tally.observe(metrics.attempt_rss, claim.topic, self._peak_rss(duration))
        self.current_claim = None
        self.jobs_done += 1
        if outcome.kind == "done" and not claim.chained and not claim.success_hooks:
            self.unwritten.append(_Finished(claim, duration))  # written with the next claim
            return duration
        state, written = self._write(claim, policy, outcome)
        if outcome.kind != "abandon":
            self._settled(claim, state, duration, written)
        # Tell the master at once (outcomes other than a plain done are rare): a renewal
        # that finds this job settled would report its lease lost, and the report could
        # reach us after the job, retried, was claimed again.
        self.held = [i for i in self.held if i != claim.id]
        self._tell_held()
        return duration

    def _peak_rss(self, duration: float) -> float:
        """The child's peak resident memory in bytes. getrusage costs more than a short
        job, so after short attempts a reading up to PEAK_RSS_MAX_AGE old is reused (the
        peak moves slowly and never down)."""
        now = time.monotonic()
        if duration >= PEAK_RSS_MAX_AGE or now - self.peak_rss_at >= PEAK_RSS_MAX_AGE:
            self.peak_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024.0
            self.peak_rss_at = now
        return self.peak_rss

    def _call(self, handler: Handler, claim: Claim, policy: Policy) -> BaseException | None:
        """Run the handler with the soft timeout armed; return what it raised, if anything."""
        error: BaseException | None = None
        try:
            try:
                signal.setitimer(signal.ITIMER_REAL, policy.attempt_timeout)
                self.in_handler = True
                if claim.id in self.lost:
                    raise LeaseLost(f"lease of job {claim.id} lost")
                if isinstance(claim.payload, Undecodable):
                    raise InvalidPayload(f"the stored payload cannot be decoded: {claim.payload}")
                handler.fn(claim)
            except BaseException as exc:
                error = exc
            finally:
                self.in_handler = False
                signal.setitimer(signal.ITIMER_REAL, 0)
        except Interruption as exc:  # landed between the handler's return and the finally
            error = exc
        if isinstance(error, KeyboardInterrupt | SystemExit):
            log.warning("event=handler_exit job=%s raised=%s", claim.id, type(error).__name__)
        return error

    # -- outcomes -----------------------------------------------------------------------------

    def _write(
        self, claim: Claim, policy: Policy, outcome: execute.Outcome
    ) -> tuple[str | None, execute.Outcome]:
        """Write the outcome: the state written (None when nothing was) and the outcome
        actually written (a failing on_success turns done into failed)."""
        if outcome.kind == "abandon":
            log.info("event=lease_lost job=%s topic=%s: nothing written", claim.id, claim.topic)
            return None, outcome
        # The connection may drop mid-write: reconnect and write again. The guard makes
        # a second write harmless (a committed first one left the row not 'processing').
        for attempt in range(5):
            try:
                return self._write_once(claim, policy, outcome)
            except psycopg.OperationalError as exc:
                self._on_db_error("outcome", exc)
                if attempt == 4 or self.master_gone:
                    break
                self._sleep(min(0.2 * 2**attempt, 2.0))
            except _Stop:
                break
        log.error(
            "event=outcome_not_written job=%s topic=%s: the lease will expire and the reaper "
            "returns the job",
            claim.id,
            claim.topic,
        )
        return None, outcome

    def _write_once(
        self, claim: Claim, policy: Policy, outcome: execute.Outcome
    ) -> tuple[str | None, execute.Outcome]:
        conn = self._connection()
        who = {"id": claim.id, "worker": self.config.identity}
        if outcome.kind == "done":  # with chained jobs or on_success hooks
            try:
                with conn.transaction():
                    cur = conn.execute(Q.job_set_done, who, prepare=True)
                    if cur.rowcount == 0:
                        raise _NotOurs
                    enqueue_many(
                        conn, claim.chained, max_payload_bytes=self.settings.max_payload_bytes
                    )
                    if claim.success_hooks:
                        conn.execute(Q.session_planner_defaults)
                        self.board.hooks_running(True)  # the stall rule leaves us alone
                        try:
                            for hook in claim.success_hooks:
                                hook(conn)
                        finally:
                            self.board.hooks_running(False)
                return "done", outcome
            except _NotOurs:
                return None, outcome
            except psycopg.OperationalError:
                raise
            except Exception as exc:
                log.warning(
                    "event=success_rolled_back job=%s topic=%s error=%r",
                    claim.id,
                    claim.topic,
                    execute.describe(exc),
                )
                outcome = execute.decide(exc, claim.attempt, policy, random.random())
                outcome = execute.Outcome(
                    "failed",
                    delay=outcome.delay,
                    error=execute.bounded("on success: " + (outcome.error or "")),
                )
        if outcome.kind == "canceled":
            cur = conn.execute(Q.job_set_canceled, {**who, "error": outcome.error})
            return ("canceled" if cur.rowcount else None), outcome
        row = conn.execute(
            Q.job_set_failed,
            {
                **who,
                "refund": outcome.refund,
                "max_attempts": policy.max_attempts,
                "delay": outcome.delay,
                "error": outcome.error,
            },
            prepare=True,
        ).fetchone()
        return (str(row[0]) if row else None), outcome

    def _settled(
        self,
        claim: Claim,
        state: str | None,
        elapsed: float,
        outcome: execute.Outcome | None = None,
    ) -> None:
        """Log (and count) what was written for one job; None means nothing was."""
        metrics = self.config.metrics
        if metrics is not None and state is not None:
            self.tally.inc(metrics.outcomes, claim.topic, state)
        if state is None:
            log.info(
                "event=outcome_skipped job=%s topic=%s: no longer ours (canceled or reaped)",
                claim.id,
                claim.topic,
            )
        elif state == "dead":
            log.error(
                "event=job_dead job=%s topic=%s attempt=%d error=%r%s",
                claim.id,
                claim.topic,
                claim.attempt,
                outcome.error if outcome else None,
                self.last_traceback,
            )
        elif state == "failed":
            log.warning(
                "event=job_failed job=%s topic=%s attempt=%d retry_in=%.1fs error=%r%s",
                claim.id,
                claim.topic,
                claim.attempt,
                outcome.delay if outcome else 0,
                outcome.error if outcome else None,
                self.last_traceback,
            )
        elif log.isEnabledFor(logging.INFO):
            _log_quick(
                logging.INFO,
                "event=job_%s job=%s topic=%s attempt=%d duration=%.3fs",
                state,
                claim.id,
                claim.topic,
                claim.attempt,
                elapsed,
            )

    def _should_retire(self) -> bool:
        s = self.settings
        if s.max_jobs_per_child and self.jobs_done >= s.max_jobs_per_child:
            self._tell({"retire": "max-jobs"})
            return True
        if s.max_memory_per_child and resident_mib() > s.max_memory_per_child:
            self._tell({"retire": "max-memory"})
            return True
        return False


class _ToMaster:
    """The child's end of its pipe to the master, written without ever blocking: a master
    that does not read (busy, stopped, frozen) must not stop the child. Every message is
    a state -- ready, the held list, retire -- so when the pipe is full the latest of each
    kind waits here, replacing an older one of its kind, and goes out on a later send or
    flush (the control thread flushes every TITLE_TICK). A line partly written is always
    finished first, so the master only ever reads whole lines. The main thread and the
    control thread both write: one lock around the buffer and the write."""

    def __init__(self, fd: int) -> None:
        os.set_blocking(fd, False)
        self.fd = fd
        self.gone = False  # EPIPE: the master is gone
        self._lock = threading.Lock()
        self._partial = b""  # the rest of a line already partly written
        self._pending: dict[str, bytes] = {}  # kind -> its latest line, none of it written

    def send(self, message: dict[str, Any]) -> bool:
        """Write the message, or keep it for later; False once the master is gone."""
        kind = next(iter(message))
        with self._lock:
            self._pending[kind] = protocol.encode(message)
            return self._flush()

    def flush(self) -> bool:
        with self._lock:
            return self._flush()

    def _flush(self) -> bool:
        while not self.gone:
            if not self._partial:
                if not self._pending:
                    break
                self._partial = self._pending.pop(next(iter(self._pending)))
            try:
                written = os.write(self.fd, self._partial)
            except BlockingIOError:
                break  # the pipe is full: the rest waits
            except OSError:
                self.gone = True
                break
            self._partial = self._partial[written:]
        return not self.gone


def _log_quick(level: int, msg: str, *args: object) -> None:
    """log.log() for the per-job lines: inside logs.batch(log) without a LogRecord when
    brooq's own handler alone formats them (logs.emit_plain), else without
    Logger.findCaller (walking the stack for the caller's file and line costs more than
    a short job, and brooq's log formats do not show them)."""
    if logs.emit_plain(log, level, msg, args):
        return
    log.handle(log.makeRecord(log.name, level, __file__, 0, msg, args, None))


class Undecodable:
    """Stands for a payload that json could not decode; the job fails with the reason."""

    def __init__(self, reason: str) -> None:
        self.reason = reason

    def __str__(self) -> str:
        return self.reason


def _decode_payload(data: bytes | str) -> Any:
    try:
        return json.loads(data)
    except (ValueError, RecursionError) as exc:
        return Undecodable(f"{type(exc).__name__}: {str(exc)[:200]}")


@dataclass
class _Finished:
    claim: Claim
    duration: float


class _Stop(Exception):
    """Leave the loop: the child is stopping while it waits for the database."""


class _NotOurs(Exception):
    """The done write matched no row: roll back the chain, write nothing."""


def resident_mib() -> float:
    """Current resident set size in MiB (Linux /proc), else the peak from getrusage."""
    try:
        with open("/proc/self/statm") as f:
            pages = int(f.read().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE") / (1024 * 1024)
    except (OSError, ValueError, IndexError):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main(config: ChildConfig) -> None:
    """Entry point right after fork(); never returns."""
    from brooq.errors import AppLoadError

    try:
        child = Child(config)
        child.setup()
    except BaseException as exc:
        log.error("event=child_boot_failed error=%r", f"{type(exc).__name__}: {exc}")
        os._exit(EXIT_APP_LOAD_ERROR if isinstance(exc, AppLoadError) else EXIT_BOOT_ERROR)
    code = EXIT_CRASHED
    try:
        code = child.run()
    except BaseException:
        log.exception("event=child_crashed")
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
