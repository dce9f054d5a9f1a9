"""A failover under load, counted: what test_failover.py (a streaming pair, promoted by the
test) and test_patroni.py (promoted by Patroni) share.

`FailoverRun` starts two brooq-masters (two sync children and one async child each, the
status page on) on the multi-host DSN, producers that enqueue one by one through
Queue.enqueue's own connection, the sync pool (a caller's transaction) and the async
pool, and in bulk (enqueue_many, sync and async), and two waits (queue.wait and
wait_async) on a job due after the failover. The test kills the primary; between the
kill and the promotion the standby, still read-only, holds every commit the primary
ever made (its replication is synchronous, and so are the children's commits here), and
the run reads there which jobs were in flight (processing) and which outcomes were
written. After the promotion it measures how soon each master claims again, each
producer enqueues again and each status page answers again, drains the queue, runs
`brooq stats`, proves that both masters LISTEN on the new primary, and counts.

Every run of a handler is a line in a file (tests/apps/brooq_haapp.py), outside the
database. Outcomes are logged by triggers (tests/audit.py), so a terminal state written
twice or reopened is seen.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg

import brooq
from brooq import migrate
from brooq.supervisor.connections import RETRY_MAX
from tests import audit
from tests.harness import APPS, MasterProcess, wait_for

APP = "brooq_haapp:queue"
TERMINAL = ("done", "dead", "canceled")
# The masters' settings: leases and polls long enough that a claim is renewed across a
# short failover, and that a job picked up at once after it was enqueued (the probe)
# can only have been woken through LISTEN/NOTIFY.
MASTER_ENV = {
    "QUEUE_LEASE": "6s",
    "QUEUE_POLL_INTERVAL": "3s",
    "QUEUE_REAPER_PERIOD": "500ms",
    # Outcomes wait for the synchronous standby, as enqueues always do: an outcome a
    # child was told is written survives the failover (docs/how-to/high-availability.md).
    "QUEUE_WORKER_SYNCHRONOUS_COMMIT": "on",
}
WORKERS = 3  # two sync children and one async child (QUEUE_ASYNC_WORKERS=1)
# Seconds after the promotion within which each master claims again, each producer
# enqueues again and each status page answers again. The target is 10 s; the bound has
# margin for a loaded machine.
FLOW_BOUND = 10.0
# Enqueue errors expected while no primary answers: brooq's own, or psycopg's.
EXPECTED_ERRORS = ("DatabaseUnavailable", "OperationalError")
# The two waits under way through the failover, each on a job of its own.
WAITS = ("wait", "wait_async")


def job(n: int, topic: str = "ha.work") -> brooq.Job:
    """Every tenth job runs 1 s; the others return at once."""
    return brooq.Job(topic, {"n": n, "sleep": 1} if n % 10 == 0 else {"n": n})


# -- the producers -------------------------------------------------------------------------


@dataclass
class Produced:
    """What one producer got: the ids returned (with the monotonic time of the return)
    and the errors raised (time, class name)."""

    ids: list[tuple[uuid.UUID, float]] = field(default_factory=list)
    errors: list[tuple[float, str]] = field(default_factory=list)

    def first_success_after(self, moment: float) -> float | None:
        return next((t for _, t in self.ids if t > moment), None)


class Producers:
    """Threads enqueueing until stopped: ``line`` (Queue.enqueue), ``pool`` (brooq.enqueue
    in Queue.transaction), ``bulk`` (enqueue_many), and in one asyncio thread ``async``
    (enqueue_async) and ``async_bulk`` (enqueue_many_async); plus the waits."""

    KINDS = ("line", "pool", "bulk", "async", "async_bulk")

    def __init__(self, dsn: str) -> None:
        self.queue = brooq.Queue(dsn, pool_size=2)
        self.got = {kind: Produced() for kind in self.KINDS}
        self.stopping = threading.Event()
        self.loop: asyncio.AbstractEventLoop | None = None
        self._loop_ready = threading.Event()
        self.threads = [
            threading.Thread(target=self._run, args=("line", self._line, 0.04), daemon=True),
            threading.Thread(target=self._run, args=("pool", self._pool, 0.1), daemon=True),
            threading.Thread(target=self._run, args=("bulk", self._bulk, 0.5), daemon=True),
            threading.Thread(target=self._async_thread, daemon=True),
        ]
        self._n = 0
        self._n_lock = threading.Lock()

    def next_n(self) -> int:
        with self._n_lock:
            self._n += 1
            return self._n

    def start(self) -> None:
        for t in self.threads:
            t.start()
        assert self._loop_ready.wait(10), "the asyncio producer did not start"

    def stop(self) -> None:
        self.stopping.set()
        for t in self.threads:
            t.join(30)
            assert not t.is_alive(), f"producer {t.name} did not stop"
        self.queue.close()

    @property
    def all_ids(self) -> set[uuid.UUID]:
        return {i for got in self.got.values() for i, _ in got.ids}

    # -- the sync producers ------------------------------------------------------------

    def _line(self) -> list[uuid.UUID]:
        return [self.queue.enqueue(job(self.next_n()))[0]]

    def _pool(self) -> list[uuid.UUID]:
        with self.queue.transaction() as conn:
            return [brooq.enqueue(conn, job(self.next_n()))[0]]

    def _bulk(self) -> list[uuid.UUID]:
        return [i for i, _ in self.queue.enqueue_many([job(self.next_n()) for _ in range(10)])]

    def _run(self, kind: str, call: Callable[[], list[uuid.UUID]], pause: float) -> None:
        got = self.got[kind]
        while not self.stopping.is_set():
            try:
                ids = call()
            except Exception as exc:
                got.errors.append((time.monotonic(), type(exc).__name__))
                time.sleep(0.1)
                continue
            now = time.monotonic()
            got.ids.extend((i, now) for i in ids)
            time.sleep(pause)

    # -- the asyncio producers ---------------------------------------------------------

    def _async_thread(self) -> None:
        asyncio.run(self._async_main())

    async def _async_main(self) -> None:
        self.loop = asyncio.get_running_loop()
        self._loop_ready.set()
        try:
            await asyncio.gather(
                self._async_run("async", self._async_one, 0.1),
                self._async_run("async_bulk", self._async_bulk, 0.7),
            )
        finally:
            await self.queue.close_async()

    async def _async_one(self) -> list[uuid.UUID]:
        n = self.next_n()
        topic = "ha.awork" if n % 2 else "ha.work"
        return [(await self.queue.enqueue_async(job(n, topic)))[0]]

    async def _async_bulk(self) -> list[uuid.UUID]:
        jobs = [job(self.next_n(), "ha.awork") for _ in range(5)]
        return [i for i, _ in await self.queue.enqueue_many_async(jobs)]

    async def _async_run(self, kind: str, call: Any, pause: float) -> None:
        got = self.got[kind]
        while not self.stopping.is_set():
            try:
                ids = await call()
            except Exception as exc:
                got.errors.append((time.monotonic(), type(exc).__name__))
                await asyncio.sleep(0.1)
                continue
            now = time.monotonic()
            got.ids.extend((i, now) for i in ids)
            await asyncio.sleep(pause)

    # -- the waits ---------------------------------------------------------------------

    def wait_sync(self, job_id: uuid.UUID, timeout: float) -> Future[brooq.JobRecord]:
        """queue.wait in a thread of its own, as a future."""
        future: Future[brooq.JobRecord] = Future()

        def run() -> None:
            try:
                future.set_result(self.queue.wait(job_id, timeout=timeout))
            except BaseException as exc:
                future.set_exception(exc)

        threading.Thread(target=run, daemon=True).start()
        return future

    def wait_async(self, job_id: uuid.UUID, timeout: float) -> Future[brooq.JobRecord]:
        """queue.wait_async on the asyncio producers' loop, as a future."""
        assert self.loop is not None
        return asyncio.run_coroutine_threadsafe(
            self.queue.wait_async(job_id, timeout=timeout), self.loop
        )


# -- the runs of the handlers --------------------------------------------------------------


@dataclass(frozen=True)
class Run:
    kind: str  # start or end
    job: uuid.UUID
    child: int
    master: int
    attempt: int
    at: float  # unix time


def runs(path: Path) -> list[Run]:
    if not path.exists():
        return []
    found = []
    for line in path.read_text().splitlines():
        kind, job_id, child, master, attempt, at = line.split()
        found.append(Run(kind, uuid.UUID(job_id), int(child), int(master), int(attempt), float(at)))
    return found


# -- the status page -----------------------------------------------------------------------


def ops_addr(m: MasterProcess) -> tuple[str, int]:
    found = wait_for(lambda: re.search(r"event=ops_listening addr=(\S+)", m.log()), what="ops")
    host, _, port = found.group(1).rpartition(":")
    return host, int(port)


def page_status(addr: tuple[str, int]) -> int:
    """The status of GET / (the status page's overview), 0 when nothing came back."""
    try:
        with socket.create_connection(addr, timeout=5) as s:
            s.sendall(b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n")
            data = b""
            while chunk := s.recv(65536):
                data += chunk
    except OSError:
        return 0
    head = data.split(b"\r\n", 1)[0]
    return int(head.split()[1]) if head.startswith(b"HTTP/") else 0


class PageWatch:
    """Asks a master's status page for GET / every 0.2 s from ``since`` until it answers
    200 (the page process reads the database for it); counts the 503s meanwhile."""

    def __init__(self, addr: tuple[str, int], since: float) -> None:
        self.addr = addr
        self.since = since
        self.unavailable = 0
        self.ok_at: float | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        deadline = self.since + 120
        while time.monotonic() < deadline:
            status = page_status(self.addr)
            if status == 200:
                self.ok_at = time.monotonic()
                return
            if status == 503:
                self.unavailable += 1
            time.sleep(0.2)

    def answered(self, timeout: float) -> float:
        """The monotonic time of the first 200."""
        self.thread.join(timeout)
        assert self.ok_at is not None, f"the status page at {self.addr} never answered 200"
        return self.ok_at


# -- the run -------------------------------------------------------------------------------


@contextmanager
def connection(dsn: str) -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(dsn, autocommit=True, connect_timeout=3) as conn:
        yield conn


@dataclass
class AtFailover:
    """What the standby held between the kill and the promotion."""

    states: dict[uuid.UUID, str]

    @property
    def in_flight(self) -> set[uuid.UUID]:
        return {i for i, s in self.states.items() if s == "processing"}

    @property
    def outcomes(self) -> dict[uuid.UUID, str]:
        return {i: s for i, s in self.states.items() if s in TERMINAL}


def read_standby(dsn: str, timeout: float = 20.0) -> AtFailover:
    """The job table as the standby holds it once it has replayed all it received, read
    while it is still in recovery (nothing else can have written)."""
    deadline = time.monotonic() + timeout
    with connection(dsn) as conn:
        while True:
            caught_up = conn.execute(
                "SELECT pg_last_wal_replay_lsn() >= pg_last_wal_receive_lsn()"
            ).fetchone()
            if caught_up and caught_up[0]:
                break
            assert time.monotonic() < deadline, "the standby did not replay what it received"
            time.sleep(0.02)
        with conn.transaction():
            rows = conn.execute("SELECT id, state FROM job_all").fetchall()
            recovery = conn.execute("SELECT pg_is_in_recovery()").fetchone()
    assert recovery == (True,), "the standby was promoted before it was read"
    return AtFailover({r[0]: r[1] for r in rows})


class FailoverRun:
    """Two masters and the producers on ``dsn`` (multi-host, target_session_attrs=
    read-write). ``start``, then ``fail_over`` with the test's kill and promotion, then
    ``finish``: the figures, asserted by ``check``."""

    def __init__(
        self,
        dsn: str,
        tmp_path: Path,
        *,
        outage: float = 0.0,
        env: dict[str, str] | None = None,
    ) -> None:
        self.dsn = dsn
        self.env = {**MASTER_ENV, **(env or {})}  # the masters' settings
        # Seconds between the kill and the promotion, at least (the test's own
        # promotion; Patroni takes the time it takes).
        self.outage = outage
        self.tmp = tmp_path
        self.runs_path = tmp_path / "runs.txt"
        self.masters: list[MasterProcess] = []
        self.producers = Producers(dsn)
        self.figures: dict[str, Any] = {}
        self.waited: dict[str, uuid.UUID] = {}
        self.waits: dict[str, Future[brooq.JobRecord]] = {}
        self.addrs: list[tuple[str, int]] = []
        self.page_pids: list[int | None] = []
        self.probes: list[uuid.UUID] = []  # enqueued after the drain (LISTEN's proof)

    # -- before ------------------------------------------------------------------------

    def start(self) -> None:
        migrate.up(self.dsn)
        with connection(self.dsn) as conn:
            audit.install(conn)
        env = {**self.env, "BROOQ_HA_RUNS": str(self.runs_path)}
        for i in range(2):
            self.masters.append(
                MasterProcess(
                    self.dsn, self.tmp / f"master-{i}.log", workers=WORKERS, app=APP, env=env
                )
            )
        for m in self.masters:
            m.wait_ready(WORKERS, timeout=30)
        self.addrs = [ops_addr(m) for m in self.masters]
        for addr in self.addrs:  # the page process is forked at the first page request
            wait_for(lambda a=addr: page_status(a) == 200, 20, what="the status page")
        self.page_pids = [self._page_pid(m) for m in self.masters]
        self.producers.start()
        # Load for a while: every kind of producer has enqueued and both masters run jobs.
        wait_for(
            lambda: (
                all(len(g.ids) >= 10 for g in self.producers.got.values())
                and {r.master for r in runs(self.runs_path)} >= {m.pid for m in self.masters}
            ),
            60,
            what="every producer enqueueing and both masters running jobs",
        )
        # A job each, due after the failover, waited for by queue.wait and wait_async: its
        # own flag says that wait's first read reached the database.
        later = dt.datetime.now(dt.timezone.utc) + dt.timedelta(seconds=4)
        jobs = self.producers.queue.enqueue_many(
            [brooq.Job("ha.work", {"waited": name}, available_at=later) for name in WAITS]
        )
        self.waited = {name: job_id for name, (job_id, _) in zip(WAITS, jobs, strict=True)}
        self.waits = {
            "wait": self.producers.wait_sync(self.waited["wait"], 90),
            "wait_async": self.producers.wait_async(self.waited["wait_async"], 90),
        }
        self.wait_ended: dict[str, float] = {}
        for name, future in self.waits.items():
            future.add_done_callback(
                lambda _, n=name: self.wait_ended.setdefault(n, time.monotonic())
            )
        # Both waits subscribed on the shared listener, and each row flagged by its first read.
        listener = self.producers.queue._waits._outcomes()

        def waiting() -> bool:
            with connection(self.dsn) as conn:
                rows = conn.execute(
                    "SELECT count(*) FROM job_all WHERE id = ANY(%s) AND waited",
                    (list(self.waited.values()),),
                )
                flagged = rows.fetchone() == (len(WAITS),)
            return flagged and listener.waiting == len(WAITS) and listener.listening

        wait_for(waiting, 20, what="both waits under way")

    def _page_pid(self, m: MasterProcess) -> int | None:
        for pid in m.children():
            try:
                if Path(f"/proc/{pid}/cmdline").read_bytes().startswith(b"brooq-pages"):
                    return pid
            except OSError:
                continue
        return None

    # -- the failover ------------------------------------------------------------------

    def fail_over(
        self, kill: Callable[[], None], standby_dsn: str, promoted: Callable[[], float]
    ) -> None:
        """``kill`` stops the primary hard; the standby is read at ``standby_dsn``;
        ``promoted`` waits for the promotion and returns its monotonic time."""
        waits_pending = [name for name, f in self.waits.items() if not f.done()]
        kill()
        self.killed_at = time.monotonic()  # from now on no primary answers
        self.killed_wall = time.time()
        self.page_watch = [PageWatch(addr, self.killed_at) for addr in self.addrs]
        self.at_failover = read_standby(standby_dsn)
        # No primary for a while, as when a failover manager takes its time to decide:
        # every client meets refused connections and backs off meanwhile.
        time.sleep(max(0.0, self.killed_at + self.outage - time.monotonic()))
        self.promoted_at = promoted()
        self.promoted_wall = time.time() - (time.monotonic() - self.promoted_at)
        self.figures["waits_in_progress_at_failover"] = waits_pending
        self.figures["no_primary_s"] = round(self.promoted_at - self.killed_at, 2)

    # -- after -------------------------------------------------------------------------

    def _claimed_again(self) -> dict[int, float]:
        """Per master: seconds from the promotion to its first new claim (the start of a
        job that was not in flight at the failover)."""
        first: dict[int, float] = {}
        for r in runs(self.runs_path):
            if r.kind == "start" and r.at > self.promoted_wall and r.job not in self.in_flight:
                first.setdefault(r.master, r.at - self.promoted_wall)
        return first

    def _reconnected(self) -> list[float | None]:
        """Per master: seconds from the promotion to its log's first event=db_reconnected
        after it (its maintenance and LISTEN connections both back)."""
        found: list[float | None] = []
        for m in self.masters:
            at = None
            for stamp in re.findall(r"^time=(\S+) .*event=db_reconnected", m.log(), re.M):
                moment = dt.datetime.fromisoformat(stamp).timestamp()
                if moment > self.promoted_wall:
                    at = moment - self.promoted_wall
                    break
            found.append(at)
        return found

    @property
    def in_flight(self) -> set[uuid.UUID]:
        return self.at_failover.in_flight

    def finish(self) -> dict[str, Any]:
        """Measure the recovery, stop the producers, drain, and count."""
        f = self.figures
        pids = [m.pid for m in self.masters]
        claimed = wait_for(
            lambda: (c := self._claimed_again()) and set(c) >= set(pids) and c,
            60,
            what="both masters claiming again",
        )
        f["claims_again_s"] = {f"master{i}": round(claimed[p], 2) for i, p in enumerate(pids)}
        reconnected = wait_for(
            lambda: (r := self._reconnected()) and all(t is not None for t in r) and r,
            60,
            what="both masters reconnected",
        )
        f["masters_reconnected_s"] = [round(t, 2) for t in reconnected]
        got = self.producers.got
        wait_for(
            lambda: all(g.first_success_after(self.killed_at) for g in got.values()),
            60,
            what="every producer enqueueing again",
        )
        f["enqueues_again_s"] = {
            kind: round(g.first_success_after(self.killed_at) - self.promoted_at, 2)  # type: ignore[operator]
            for kind, g in got.items()
        }
        f["page_answers_again_s"] = [
            round(w.answered(60) - self.promoted_at, 2) for w in self.page_watch
        ]
        f["page_unavailable_answers"] = [w.unavailable for w in self.page_watch]
        f["page_process_replaced"] = [
            self._page_pid(m) != pid for m, pid in zip(self.masters, self.page_pids, strict=True)
        ]
        self._cli()  # while the producers still enqueue: jobs are waiting
        waited, returned = {}, {}
        for name, future in self.waits.items():
            try:
                waited[name] = future.result(timeout=90).state
            except Exception as exc:
                waited[name] = f"{type(exc).__name__}: {exc}"
            returned[name] = round(self.wait_ended[name] - self.promoted_at, 2)
        f["waits"] = waited
        f["waits_returned_s"] = returned
        time.sleep(2)  # load on the new primary for a while
        self.producers.stop()
        self._drain()
        self._listening()
        self._count()
        return f

    def _drain(self) -> None:
        def left() -> int:
            with connection(self.dsn) as conn:
                row = conn.execute(
                    "SELECT count(*) FROM job_all WHERE state NOT IN ('done', 'dead', 'canceled')"
                ).fetchone()
            return int(row[0]) if row else -1

        wait_for(lambda: left() == 0, 90, interval=0.2, what="every job terminal")

    def _cli(self) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("QUEUE_")}
        env["DATABASE_URL"] = self.dsn
        env["PYTHONPATH"] = os.pathsep.join([str(APPS), str(APPS.parent.parent)])
        done = subprocess.run(
            [sys.executable, "-m", "brooq", "stats", "--json"],
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
            check=False,
        )
        self.figures["cli_stats_exit"] = done.returncode
        assert done.returncode == 0, f"brooq stats: {done.returncode} {done.stderr}"
        topics = {row["topic"] for row in json.loads(done.stdout)["topics"]}
        assert topics & {"ha.work", "ha.awork"}, done.stdout

    def _listening(self) -> None:
        """Both masters LISTEN on the new primary, and a job enqueued while their children
        are idle (polling every 3 s) is picked up sooner than a poll would."""
        with connection(self.dsn) as conn:
            listeners = conn.execute(
                "SELECT application_name, state, query FROM pg_stat_activity WHERE "
                "application_name LIKE 'brooq-master%'"
            ).fetchall()
        self.figures["master_listen_connections"] = sum(
            1 for r in listeners if r[0] == "brooq-master-listen" and "LISTEN" in r[2]
        )
        latencies = []
        for _ in range(3):
            time.sleep(0.5)
            q = brooq.Queue(self.dsn, pool_size=1)
            try:
                began = time.monotonic()
                job_id, _ = q.enqueue(brooq.Job("ha.work", {"probe": True}))
                self.probes.append(job_id)
                record = q.wait(job_id, timeout=30)
                latencies.append(round(time.monotonic() - began, 3))
                assert record.state == "done"
            finally:
                q.close()
        self.figures["probe_pickup_s"] = latencies

    def _count(self) -> None:
        f = self.figures
        with connection(self.dsn) as conn:
            table = {r[0]: r[1] for r in conn.execute("SELECT id, state FROM job_all").fetchall()}
            into_terminal = Counter(
                r[0]
                for r in conn.execute(
                    "SELECT job_id FROM outcome_log WHERE op = 'UPDATE' AND new_state IN "
                    "('done', 'dead', 'canceled')"
                ).fetchall()
            )
            reopened = conn.execute(
                "SELECT count(*) FROM outcome_log WHERE op = 'UPDATE' AND old_state IN "
                "('done', 'dead', 'canceled')"
            ).fetchone()
        # Outcomes the children were told are written (their job_done line follows the
        # commit) before the primary was gone: each must be on the standby.
        told_done = {
            uuid.UUID(job_id)
            for m in self.masters
            for stamp, job_id in re.findall(
                r"^time=(\S+) .*event=job_done job=(\S+)", m.log(), re.M
            )
            if dt.datetime.fromisoformat(stamp).timestamp() < self.killed_wall
        }
        starts: dict[uuid.UUID, list[Run]] = defaultdict(list)
        for r in runs(self.runs_path):
            if r.kind == "start":
                starts[r.job].append(r)
        returned = self.producers.all_ids
        at = self.at_failover
        twice = {i for i, rs in starts.items() if len(rs) > 1}
        f.update(
            enqueued={kind: len(g.ids) for kind, g in self.producers.got.items()},
            enqueue_errors={
                kind: dict(Counter(name for _, name in g.errors))
                for kind, g in self.producers.got.items()
            },
            jobs=len(table),
            # Enqueues that raised although their job was written (the commit happened,
            # its answer was lost with the server): allowed, counted.
            rows_without_a_returned_id=len(
                set(table) - returned - {*self.waited.values(), *self.probes}
            ),
            returned_missing=len(returned - set(table)),
            returned_not_done=sum(1 for i in returned if table.get(i) != "done"),
            returned_never_run=len(returned - set(starts)),
            not_terminal=sum(1 for s in table.values() if s not in TERMINAL),
            runs=sum(len(rs) for rs in starts.values()),
            in_flight_at_failover=len(at.in_flight),
            outcomes_before_failover=len(at.outcomes),
            done_logged_before_failover=len(told_done),
            done_logged_but_lost=len(told_done - set(at.outcomes)),
            outcomes_changed=sum(1 for i, s in at.outcomes.items() if table.get(i) != s),
            outcomes_run_again=sum(
                1 for i in at.outcomes if any(r.at > self.killed_wall for r in starts.get(i, []))
            ),
            ran_twice=len(twice),
            ran_twice_in_flight=len(twice & at.in_flight),
            ran_twice_not_in_flight=len(twice - at.in_flight),
            written_twice=sum(1 for n in into_terminal.values() if n > 1),
            terminal_reopened=int(reopened[0]) if reopened else -1,
            masters_alive=[m.proc.poll() is None for m in self.masters],
            children_now=[len(m.children()) for m in self.masters],
            children_crashed=sum(m.log().count("event=child_crashed") for m in self.masters),
            master_reconnects=[m.log().count("event=db_reconnected") for m in self.masters],
        )

    # -- the verdict -------------------------------------------------------------------

    def check(self) -> None:
        """Assert what the failover must keep; every message carries the figures."""
        f = self.figures
        said = f"figures: {f}"
        assert f["masters_alive"] == [True, True], said
        assert all(n >= WORKERS for n in f["children_now"]), said
        assert f["children_crashed"] == 0, said
        assert f["returned_missing"] == 0, said
        assert f["returned_never_run"] == 0, said
        assert f["returned_not_done"] == 0, said
        assert f["not_terminal"] == 0, said
        assert f["outcomes_before_failover"] > 0, said
        assert f["done_logged_before_failover"] > 0, said
        assert f["done_logged_but_lost"] == 0, said
        assert f["outcomes_changed"] == 0, said
        assert f["outcomes_run_again"] == 0, said
        assert f["ran_twice_not_in_flight"] == 0, said
        assert f["written_twice"] == 0, said
        assert f["terminal_reopened"] == 0, said
        assert f["waits_in_progress_at_failover"] == ["wait", "wait_async"], said
        assert f["waits"] == {"wait": "done", "wait_async": "done"}, said
        for kind, errors in f["enqueue_errors"].items():
            assert set(errors) <= set(EXPECTED_ERRORS), f"{kind}: {said}"
        assert max(f["claims_again_s"].values()) <= FLOW_BOUND, said
        assert max(f["enqueues_again_s"].values()) <= FLOW_BOUND, said
        assert max(f["page_answers_again_s"]) <= FLOW_BOUND, said
        assert max(f["waits_returned_s"].values()) <= FLOW_BOUND, said
        assert f["master_listen_connections"] == 2, said
        # Idle children poll every 3 s: a pickup under 1.5 s each time came through NOTIFY.
        assert max(f["probe_pickup_s"]) < 1.5, said
        assert all(n >= 1 for n in f["master_reconnects"]), said
        # A master tries again every RETRY_MAX at most: back within that, and the connect.
        assert max(f["masters_reconnected_s"]) <= RETRY_MAX + 3, said

    def close(self) -> None:
        if not self.producers.stopping.is_set():
            self.producers.stopping.set()
            for t in self.producers.threads:
                t.join(10)
        for m in self.masters:
            m.stop()
        for m in self.masters:  # captured: pytest shows it when the test failed
            print(f"---- {m.log_path.name}\n{m.log()[-15000:]}")
