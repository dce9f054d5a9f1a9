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
from setproctitle import setproctitle

from brooq import execute, protocol
from brooq.handlers import Handler, Policy
from brooq.job import AttemptTimeout, Claim, Interruption, LeaseLost
from brooq.produce import enqueue_many
from brooq.settings import Settings
from brooq.sql import Q

if TYPE_CHECKING:
    from brooq.metrics import Metrics

log = logging.getLogger("brooq.child")

EXIT_OK = 0
EXIT_CRASHED = 1
EXIT_BOOT_ERROR = 3
EXIT_APP_LOAD_ERROR = 4
EXIT_MASTER_GONE = 70


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
        self.current: uuid.UUID | None = None
        self.current_started = 0.0
        self.current_title = "idle"
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
        os.set_blocking(self.config.to_master, True)
        os.set_blocking(self.config.from_master, True)
        if self.config.reload_baseline is not None:
            self._reload_app()
        self.policies = {t: h.policy(self.settings) for t, h in self.handlers.items()}
        self.topics = sorted(self.handlers)
        threading.Thread(target=self._read_master, name="brooq-control", daemon=True).start()
        self._title("idle")
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
        if self.in_handler and self.current in self.lost:
            self.in_handler = False
            raise LeaseLost(f"lease of job {self.current} lost")

    # -- the master's pipe (reader thread) -----------------------------------------------

    def _read_master(self) -> None:
        reader = protocol.LineReader(self.config.from_master)
        while True:
            ready, _, _ = select.select([self.config.from_master], [], [], 1.0)
            if ready:
                for line in reader.read():
                    if line == b"w":
                        protocol.send(self._wake_w, b"w")
                    elif line.startswith(b"lost "):
                        job_id = uuid.UUID(line[5:].decode())
                        self.lost.add(job_id)
                        if self.current == job_id:
                            signal.pthread_kill(self._main_thread, signal.SIGUSR1)
                if reader.eof:
                    self._on_master_gone()
                    return
            if self.current is not None:
                self._title(self.current_title, time.monotonic() - self.current_started)

    def _on_master_gone(self) -> None:
        # Without a master nobody renews our lease: finish within one renewal period or go.
        self.master_gone = True
        self.stopping = True
        protocol.send(self._wake_w, b"x")
        time.sleep(self.settings.renew_period)
        os._exit(EXIT_MASTER_GONE)

    def _tell(self, message: dict[str, Any]) -> None:
        if not protocol.send(self.config.to_master, protocol.encode(message)):
            self.master_gone = True
            self.stopping = True

    def _title(self, what: str, running: float | None = None) -> None:
        suffix = f" running {running:.0f}s" if running is not None else ""
        setproctitle(f"brooq-child: {what}{suffix}")

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
                )
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

    def run(self) -> int:
        try:
            while not self.stopping:
                claims = self._claim()
                if not claims:
                    self._sleep(self.settings.poll_interval)
                    continue
                for claim in claims:
                    self._run_one(claim)
                    if self._should_retire():
                        return EXIT_OK
        except _Stop:
            pass
        return EXIT_OK

    def _claim(self) -> list[Claim]:
        try:
            conn = self._connection()
            rows = conn.execute(
                Q.job_claim,
                {
                    "topics": self.topics,
                    "limit": 1,
                    "worker": self.config.identity,
                    "lease": self.settings.lease,
                },
                prepare=True,
            ).fetchall()
        except psycopg.OperationalError as exc:
            self._on_db_error("claim", exc)
            return []
        return [
            Claim(
                id=r[0], topic=r[1], payload=r[2], attempt=r[3], locked_by=r[4], locked_until=r[5]
            )
            for r in rows
        ]

    def _on_db_error(self, what: str, exc: BaseException) -> None:
        log.warning(
            "event=db_error who=child worker=%s during=%s error=%r",
            self.config.identity,
            what,
            str(exc).strip().splitlines()[0] if str(exc) else exc,
        )
        self._drop_connection()

    def _run_one(self, claim: Claim) -> None:
        policy = self.policies[claim.topic]
        self.current, self.current_started = claim.id, time.monotonic()
        self.current_title = f"{claim.topic} {claim.id} attempt {claim.attempt}"
        self._title(self.current_title, 0)
        self.lost.clear()
        if log.isEnabledFor(logging.DEBUG):
            log.debug(
                "event=job_claimed job=%s topic=%s attempt=%d",
                claim.id,
                claim.topic,
                claim.attempt,
            )
        metrics = self.config.metrics
        if metrics is not None:
            metrics.claims.labels(claim.topic).inc()
            metrics.busy.set(1)
        usage_before = resource.getrusage(resource.RUSAGE_SELF)
        self._tell(
            {
                "busy": str(claim.id),
                "topic": claim.topic,
                "attempt": claim.attempt,
                "policy": protocol.policy_to_list(policy),
            }
        )
        error = self._call(self.handlers[claim.topic], claim, policy)
        self.last_traceback = ""
        if error is not None and not isinstance(error, Interruption):
            self.last_traceback = "\n" + "".join(traceback.format_exception(error)).rstrip()
        outcome = execute.decide(error, claim.attempt, policy, random.random())
        if claim.id in self.lost:
            outcome = execute.Outcome("abandon")
        state = self._write(claim, policy, outcome)
        if metrics is not None:
            usage = resource.getrusage(resource.RUSAGE_SELF)
            cpu = (usage.ru_utime - usage_before.ru_utime) + (
                usage.ru_stime - usage_before.ru_stime
            )
            metrics.attempt_duration.labels(claim.topic).observe(
                time.monotonic() - self.current_started
            )
            metrics.attempt_cpu.labels(claim.topic).observe(cpu)
            metrics.attempt_rss.labels(claim.topic).observe(usage.ru_maxrss * 1024)
            if state is not None:
                metrics.outcomes.labels(claim.topic, state).inc()
            metrics.busy.set(0)
        self.lost.discard(claim.id)
        self.current = None
        self.jobs_done += 1
        self._title("idle")
        self._tell({"idle": 1})

    def _call(self, handler: Handler, claim: Claim, policy: Policy) -> BaseException | None:
        """Run the handler with the soft timeout armed; return what it raised, if anything."""
        error: BaseException | None = None
        try:
            try:
                signal.setitimer(signal.ITIMER_REAL, policy.attempt_timeout)
                self.in_handler = True
                if claim.id in self.lost:
                    raise LeaseLost(f"lease of job {claim.id} lost")
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

    def _write(self, claim: Claim, policy: Policy, outcome: execute.Outcome) -> str | None:
        """Write the outcome; the state written, or None when nothing was written."""
        if outcome.kind == "abandon":
            log.info("event=lease_lost job=%s topic=%s: nothing written", claim.id, claim.topic)
            return None
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
        return None

    def _write_once(self, claim: Claim, policy: Policy, outcome: execute.Outcome) -> str | None:
        conn = self._connection()
        who = {"id": claim.id, "worker": self.config.identity}
        if outcome.kind == "done":
            if not claim.chained and not claim.success_hooks:
                cur = conn.execute(Q.job_set_done, who, prepare=True)
                return self._log_outcome(claim, "done" if cur.rowcount else None)
            try:
                with conn.transaction():
                    cur = conn.execute(Q.job_set_done, who, prepare=True)
                    if cur.rowcount == 0:
                        raise _NotOurs
                    enqueue_many(
                        conn, claim.chained, max_payload_bytes=self.settings.max_payload_bytes
                    )
                    for hook in claim.success_hooks:
                        hook(conn)
                return self._log_outcome(claim, "done")
            except _NotOurs:
                return self._log_outcome(claim, None)
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
            return self._log_outcome(claim, "canceled" if cur.rowcount else None)
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
        return self._log_outcome(claim, row[0] if row else None, outcome)

    def _log_outcome(
        self, claim: Claim, state: str | None, outcome: execute.Outcome | None = None
    ) -> str | None:
        elapsed = time.monotonic() - self.current_started
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
        else:
            log.info(
                "event=job_%s job=%s topic=%s attempt=%d duration=%.3fs",
                state,
                claim.id,
                claim.topic,
                claim.attempt,
                elapsed,
            )
        return state

    def _should_retire(self) -> bool:
        s = self.settings
        if s.max_jobs_per_child and self.jobs_done >= s.max_jobs_per_child:
            self._tell({"retire": "max-jobs"})
            return True
        if s.max_memory_per_child and resident_mib() > s.max_memory_per_child:
            self._tell({"retire": "max-memory"})
            return True
        return False


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
