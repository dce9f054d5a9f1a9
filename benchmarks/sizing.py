"""What one job costs one PostgreSQL server, and how many jobs/s one server sustains.

    python benchmarks/sizing.py measure --pg-data DIR [--dsn ADMIN_DSN] [--server-cpus 0]
        [--client-cpus 1] [--rounds 3] [--quick-rounds 0] [--sync on,off] [--single 5000]
        [--bulk 95000] [--workers 2] [--quiet-wait SECONDS] [--no-trips] [--out FILE.json]
    python benchmarks/sizing.py report FILE.json ... [--md OUT.md] [--json OUT.json]
    python benchmarks/sizing.py model --server-us 60 [--cores 2,8,32,96] [--fsync-ms 1]
        [--committers 8] [--commits-per-job 0.01]

measure: against a PostgreSQL cluster of its own (DIR its data directory: the driver
reads the postmaster's pid there and pins it and every process it forks to
`--server-cpus`; the driver and what it starts run on `--client-cpus`), one fresh
database per round and per `synchronous_commit` setting, the phases of a job's life
through brooq's own code:

- enqueue, single: `Queue.enqueue`, one call per job (its own prepared statement in
  autocommit);
- enqueue, bulk: `Queue.enqueue_many` of 1,000 jobs a call (COPY);
- claim and done: the drain of every job by a real `brooq-master --workers 2` of no-op
  handlers (the claim and the done of a job travel in one statement,
  job_finish_and_claim); apart, for the record, that statement claiming only, then
  writing only, 256 jobs a statement from the driver, and a claim that finds nothing;
- retention: with job_history (migration 0020), the release and drop of the partitions
  that hold the done jobs (brooq_history_release, brooq_history_drop, each in its own
  transaction; the partitions made ahead by brooq_history_prepare); before it, the
  master's row-by-row retention (brooq.supervisor.maintenance.delete_expired).

`--quick-rounds`: more rounds of the bulk enqueue and the drain only, for the model's
check. During each drain the driver also samples the other programs' sessions ready to
run (others_runnable): the machine's share the drain had.

For each phase: jobs/s, the server's CPU per job (utime + stime of every process of the
cluster from /proc, those that exited included, through the postmaster's cutime/cstime;
the driver's own polling backend left out), WAL bytes (pg_current_wal_lsn), WAL writes
and fsyncs (pg_stat_wal), commits (pg_stat_database), the clients' CPU per job. Round
trips are counted apart, in a short pass of each phase through a counting TCP proxy: a
round trip is every turn of a connection's conversation from the server back to the
client.

`synchronous_commit` on and off: producers and the driver set it on their session
(`options=-c synchronous_commit=...`), the master's children through
QUEUE_WORKER_SYNCHRONOUS_COMMIT.

report: the medians, best and spread of the rounds of one or more runs (several
pinnings), the model beside the drains measured (closed_loop: the master's few children
against the server's and the clients' CPUs), and the table for 2, 8, 32 and 96 cores.
model: the formula alone, from figures given on the command line.

The model (docs/explanation/one-server.md): the jobs/s of one server is the least of

- the CPU bound, cores x 1e6 / (server CPU us per job), summed over the phases a job
  goes through; where the clients share the server's cores (this machine), the clients'
  CPU per job counts on those cores too;
- the commit bound, committers x 1e3 / fsync_ms / (synchronous commits per job): a
  connection waits one WAL flush per synchronous commit, and group commit lets every
  waiting connection share a flush;
- the WAL bound, when a bandwidth is given: bytes/s / (WAL bytes per job).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import socket
import statistics
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR))

CORES = (2, 8, 32, 96)
PHASES = ("enqueue_single", "enqueue_bulk", "claim", "done", "drain", "retention")
# A job's life as brooq runs it: enqueued (one way or the other), claimed and done in the
# one statement of the drain, deleted by retention.
LIFE = {
    "single": ("enqueue_single", "drain", "retention"),
    "bulk": ("enqueue_bulk", "drain", "retention"),
}
BULK_CHUNK = 1000
SPLIT_BATCH = 256  # jobs per statement of the claim-only and done-only pass: claim_batch_max
# Jobs of the round-trip pass: single enqueues, then bulk ones (which the drain, retention
# and the claim and done apart then take: enough for the claims' small fair shares at
# the end of a drain not to weigh).
TRIP_JOBS = 2000
TRIP_BULK = 40000
EMPTY_CLAIMS = 2000  # claims of an empty queue, one after the other


# -- the model (pure: plain numbers in, plain numbers out) ---------------------------------


@dataclass(frozen=True)
class Phase:
    """What one job costs the server in one phase of its life."""

    server_us: float  # server CPU per job (all of the cluster's processes)
    commits_per_job: float = 0.0  # commits of the phase per job
    sync_commit: bool = True  # do those commits wait for the WAL flush?
    wal_bytes: float = 0.0
    client_us: float = 0.0  # the clients' CPU per job (producers, masters and children)


@dataclass(frozen=True)
class Estimate:
    jobs_s: float
    limit: str  # the bound that decides: "cpu", "commit" or "wal"
    bounds: dict[str, float] = field(default_factory=dict)


def cpu_bound(cores: float, us_per_job: float) -> float:
    """Jobs/s that ``cores`` cores give at ``us_per_job`` microseconds of CPU per job."""
    if cores <= 0:
        raise ValueError(f"cores must be positive, got {cores!r}")
    if us_per_job <= 0:
        return math.inf
    return cores * 1e6 / us_per_job


def commit_bound(fsync_ms: float, committers: float, sync_commits_per_job: float) -> float:
    """Jobs/s that synchronous commits allow: each committing connection waits one WAL
    flush (``fsync_ms``) per commit, and one flush serves every connection waiting on it
    (group commit), so ``committers`` connections commit at most committers / fsync times
    a second between them."""
    if fsync_ms <= 0:
        raise ValueError(f"fsync_ms must be positive, got {fsync_ms!r}")
    if committers <= 0:
        raise ValueError(f"committers must be positive, got {committers!r}")
    if sync_commits_per_job <= 0:
        return math.inf
    return committers * 1e3 / fsync_ms / sync_commits_per_job


def sustained(
    phases: Sequence[Phase],
    cores: float,
    *,
    fsync_ms: float,
    committers: float,
    shared_client_cores: bool = False,
    wal_mb_s: float | None = None,
) -> Estimate:
    """The jobs/s one server of ``cores`` cores sustains for jobs that go through every
    phase of ``phases``: the least of the CPU, commit and (given a bandwidth) WAL bounds.
    ``shared_client_cores``: the clients run on the same cores (their CPU counts too)."""
    server_us = sum(p.server_us for p in phases)
    if shared_client_cores:
        server_us += sum(p.client_us for p in phases)
    bounds = {"cpu": cpu_bound(cores, server_us)}
    sync = sum(p.commits_per_job for p in phases if p.sync_commit)
    bounds["commit"] = commit_bound(fsync_ms, committers, sync)
    if wal_mb_s is not None:
        wal = sum(p.wal_bytes for p in phases)
        bounds["wal"] = wal_mb_s * 1e6 / wal if wal > 0 else math.inf
    limit = min(bounds, key=lambda k: bounds[k])
    return Estimate(bounds[limit], limit, bounds)


def split_cpu_bound(
    server_cores: float, server_us: float, client_cores: float, client_us: float
) -> float:
    """Jobs/s when the server and its clients each have cores of their own (this
    machine's one-core check: the server on one CPU, the clients on the other)."""
    return min(cpu_bound(server_cores, server_us), cpu_bound(client_cores, client_us))


@dataclass(frozen=True)
class Station:
    """A set of CPUs that a job's work waits for: ``cores`` of them, ``us_per_job`` of
    work on them per job."""

    name: str
    cores: int
    us_per_job: float


def _check_loop(stations: Sequence[Station], customers: int) -> None:
    """A closed loop needs a worker and stations with cores and no negative work."""
    if customers < 1:
        raise ValueError(f"customers must be at least 1, got {customers!r}")
    for st in stations:
        if st.cores < 1 or st.us_per_job < 0:
            raise ValueError(f"station {st.name!r}: cores >= 1 and work >= 0, got {st!r}")


def closed_loop(stations: Sequence[Station], customers: int) -> float:
    """Jobs/s of ``customers`` workers (a master's children) that each, in turn, have
    their statement run by the server and then run the jobs it claimed: exact mean value
    analysis of a closed network, each station with as many servers as it has cores.
    With few workers it stays below the bounds above (a worker waits while the server
    runs its statement, and the server waits while every worker runs jobs); as workers
    are added it rises to the least of them, cores x 1e6 / (work per job)."""
    _check_loop(stations, customers)
    # p[k][j]: the probability that j customers are at station k (load-dependent MVA).
    p = [[1.0] + [0.0] * customers for _ in stations]
    x = 0.0
    for n in range(1, customers + 1):
        times = []
        for k, st in enumerate(stations):
            times.append(
                sum(j / min(j, st.cores) * st.us_per_job * p[k][j - 1] for j in range(1, n + 1))
            )
        x = n / sum(times)  # jobs per microsecond
        for k, st in enumerate(stations):
            new = [0.0] * (customers + 1)
            for j in range(1, n + 1):
                new[j] = st.us_per_job / min(j, st.cores) * x * p[k][j - 1]
            new[0] = max(0.0, 1.0 - sum(new[1:]))
            p[k] = new
    return x * 1e6


def in_step(stations: Sequence[Station], customers: int) -> float:
    """Jobs/s of ``customers`` workers that move in step: every worker's statement
    reaches the server at about the same moment, the scheduler shares the server's cores
    among those backends (a core is time-shared, not first come first served), so their
    statements end together, and then their children share the clients' cores in the same
    way and send the next statements together. Once in step they stay so (nothing in a
    time-shared loop of equal work pulls them apart): per cycle each station works for
    all the customers in turn, min(customers, cores) at once, while the others wait.
    The few children of one master on a small machine do this (measured: each backend
    waits on its core's run queue as long as it runs, the cores half idle); closed_loop
    (workers that arrive at random) is the other end, which many workers approach."""
    _check_loop(stations, customers)
    cycle = sum(st.us_per_job / min(customers, st.cores) for st in stations)
    return 1e6 / cycle if cycle > 0 else math.inf


def error_pct(measured: float, modelled: float) -> float:
    """How far the model is from the measure, as a percentage of the measure."""
    return (modelled - measured) / measured * 100.0


# -- readings of the cluster ---------------------------------------------------------------

_CLK = os.sysconf("SC_CLK_TCK")


def _stat_fields(pid: int) -> list[str] | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def postmaster_pid(data_dir: Path) -> int:
    pid_file = data_dir / "postmaster.pid"
    try:
        return int(pid_file.read_text().split("\n", 1)[0])
    except (OSError, ValueError) as exc:
        raise SystemExit(
            f"--pg-data: cannot read the postmaster's pid in {pid_file}: {exc}"
        ) from None


def cluster_pids(postmaster: int, zombies: bool = False) -> list[int]:
    """The postmaster and every process it forked that it has not reaped yet (an exited
    one, a zombie, only if ``zombies``: its times are still its own until reaped)."""
    pids = [postmaster]
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            fields = _stat_fields(int(entry.name))
            if fields and int(fields[1]) == postmaster and (zombies or fields[0] != "Z"):
                pids.append(int(entry.name))
    return pids


def cluster_cpu(postmaster: int, leave_out: Sequence[int] = ()) -> float:
    """CPU seconds of the whole cluster so far: the postmaster's own and its reaped
    children's (cutime, cstime), then every live child's (a child that exits moves from
    the second sum into the first)."""
    fields = _stat_fields(postmaster)
    if fields is None:
        raise RuntimeError(f"the postmaster (pid {postmaster}) is gone")
    ticks = sum(int(fields[i]) for i in (11, 12, 13, 14))
    for pid in cluster_pids(postmaster, zombies=True)[1:]:
        if pid in leave_out:
            continue
        f = _stat_fields(pid)
        if f is not None:
            ticks += int(f[11]) + int(f[12])
    return ticks / _CLK


def _busy(line: str) -> float:
    fields = [int(x) for x in line.split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return (sum(fields[:8]) - idle) / _CLK


def machine_cpu() -> float:
    """CPU seconds spent so far by the whole machine (every CPU, idle and iowait left
    out), from /proc/stat."""
    return _busy(Path("/proc/stat").read_text().split("\n", 1)[0])


def cpus_busy() -> tuple[float, ...]:
    """The same, CPU by CPU (cpu0, cpu1, ...)."""
    lines = Path("/proc/stat").read_text().split("\n")
    return tuple(_busy(x) for x in lines if x.startswith("cpu") and x[3:4].isdigit())


def wait_quiet(patience: float, limit: float = 0.3) -> float:
    """Wait at most ``patience`` seconds for a second in which the whole machine is busy
    less than ``limit`` cores (nothing of ours runs between rounds); the last second's."""
    deadline = time.monotonic() + patience
    while True:
        before = machine_cpu()
        time.sleep(1.0)
        busy = machine_cpu() - before
        if busy < limit or time.monotonic() > deadline:
            return busy


def pin_cluster(postmaster: int, cpus: set[int]) -> None:
    """Every process of the cluster on ``cpus``; backends forked later inherit it."""
    for pid in cluster_pids(postmaster):
        with contextlib.suppress(ProcessLookupError):
            os.sched_setaffinity(pid, cpus)


@dataclass
class Reading:
    t: float
    server_cpu: float
    lsn: int
    wal_write: int
    wal_sync: int
    wal_sync_ms: float
    commits: int
    client_cpu: float
    machine_cpu: float  # CPU seconds of every process of the machine so far (/proc/stat)
    cpus: tuple[float, ...] = ()  # the same, CPU by CPU
    # pid -> (ns on a CPU, ns ready but waiting for one), /proc/<pid>/schedstat: of the
    # cluster's live processes, of the clients' (when the phase names them).
    server_sched: dict[int, tuple[int, int]] = field(default_factory=dict)
    client_sched: dict[int, tuple[int, int]] = field(default_factory=dict)


def sched(pids: Sequence[int]) -> dict[int, tuple[int, int]]:
    """pid -> (ns run, ns waited on a run queue) so far, of the processes still there."""
    out = {}
    for pid in pids:
        try:
            run, wait = Path(f"/proc/{pid}/schedstat").read_text().split()[:2]
        except (OSError, ValueError):
            continue
        out[pid] = (int(run), int(wait))
    return out


def others_runnable(postmaster: int, master: int) -> float:
    """Other programs' scheduling groups ready to run now, per CPU. With autogroups (the
    kernel's default on a desktop or a server started from sessions), the scheduler
    shares a CPU evenly among the sessions that have a process ready on it, whatever
    their processes' count; so a session of ours (the cluster, the master and its
    children), when ready, gets 1 / (1 + this) of a CPU. The groups: of every process in
    state R (/proc/<pid>/stat) but ours, by /proc/<pid>/autogroup (by session when there
    is no such file), spread over the machine's CPUs."""
    ours = {postmaster, master, os.getpid()}
    groups = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        fields = _stat_fields(pid)
        if not fields or fields[0] != "R" or pid in ours:
            continue
        if int(fields[1]) in ours or int(fields[3]) in (master, os.getsid(0)):
            continue  # a backend of the cluster, a child of the master
        try:
            group = Path(f"/proc/{pid}/autogroup").read_text().split()[0]
        except (OSError, IndexError):
            group = f"session {fields[3]}"
        groups.add(group)
    return len(groups) / (os.cpu_count() or 1)


def slowdown(a: dict[int, tuple[int, int]], b: dict[int, tuple[int, int]]) -> float:
    """How much longer the processes' work took than their CPU time because others ran
    on their CPUs meanwhile: (run + waited) / run, over the processes of both readings.
    1.0 on an idle machine; nan with no run time to go by."""
    run = wait = 0
    for pid, (r1, w1) in b.items():
        if pid in a:
            run += r1 - a[pid][0]
            wait += w1 - a[pid][1]
    return (run + wait) / run if run > 0 else math.nan


class Meter:
    """Readings of one cluster through a connection of the driver's own, whose backend's
    CPU is left out of the server's."""

    def __init__(self, dsn: str, postmaster: int) -> None:
        import psycopg

        self.postmaster = postmaster
        self.conn = psycopg.connect(dsn, autocommit=True)
        row = self.conn.execute("SELECT pg_backend_pid()").fetchone()
        assert row is not None
        # Backends of the driver's own whose CPU is not the phase's: this one, a poll's.
        self.leave_out = {int(row[0])}

    def read(self, db: str, client_cpu: float = 0.0, clients: Sequence[int] = ()) -> Reading:
        """Now: the cluster's CPU, WAL position and WAL counters, and the commits of
        database ``db`` (this connection's own are in another database); the run-queue
        waits of the cluster's processes and of ``clients``."""
        row = self.conn.execute(
            "SELECT pg_current_wal_lsn() - '0/0'::pg_lsn, w.wal_write, w.wal_sync,"
            " w.wal_sync_time, (SELECT xact_commit FROM pg_stat_database WHERE datname = %s)"
            " FROM pg_stat_wal AS w",
            (db,),
        ).fetchone()
        assert row is not None
        return Reading(
            time.monotonic(),
            cluster_cpu(self.postmaster, tuple(self.leave_out)),
            int(row[0]),
            int(row[1]),
            int(row[2]),
            float(row[3]),
            int(row[4] or 0),
            client_cpu,
            machine_cpu(),
            cpus_busy(),
            sched([p for p in cluster_pids(self.postmaster) if p not in self.leave_out]),
            sched(clients),
        )

    def close(self) -> None:
        self.conn.close()


def per_job(a: Reading, b: Reading, jobs: int, flushed: Reading | None = None) -> dict[str, Any]:
    """The costs of ``jobs`` between readings ``a`` and ``b``; the counters of
    pg_stat_wal and pg_stat_database from ``flushed`` instead when given (a reading taken
    after the phase's connections closed: a busy backend reports them at most once a
    second, a closing one at once)."""
    c = flushed or b
    syncs = c.wal_sync - a.wal_sync
    wall = b.t - a.t
    return {
        "jobs": jobs,
        "seconds": wall,
        "jobs_s": jobs / wall if wall > 0 else math.nan,
        "server_us": (b.server_cpu - a.server_cpu) / jobs * 1e6,
        "server_busy": (b.server_cpu - a.server_cpu) / wall if wall > 0 else math.nan,
        "client_us": (b.client_cpu - a.client_cpu) / jobs * 1e6,
        "wal_bytes": (b.lsn - a.lsn) / jobs,
        "wal_writes": (c.wal_write - a.wal_write) / jobs,
        "fsyncs": syncs / jobs,
        "fsync_ms": (c.wal_sync_ms - a.wal_sync_ms) / syncs if syncs else math.nan,
        "commits": (c.commits - a.commits) / jobs,
        # Cores busy with anything else meanwhile (other programs on the machine, and
        # the driver's own reads): what a shared machine took from the phase.
        "other_cores": (
            (b.machine_cpu - a.machine_cpu)
            - (b.server_cpu - a.server_cpu)
            - (b.client_cpu - a.client_cpu)
        )
        / wall
        if wall > 0
        else math.nan,
        # How much longer than its CPU time the server's and the clients' work took for
        # want of a free CPU (others ran): 1.0 on a machine of its own.
        "server_slowdown": slowdown(a.server_sched, b.server_sched),
        "client_slowdown": slowdown(a.client_sched, b.client_sched),
        # Each CPU's busy share of the window (whoever ran on it).
        "cpu_busy": [
            (y - x) / wall if wall > 0 else math.nan for x, y in zip(a.cpus, b.cpus, strict=True)
        ],
    }


# -- round trips: a counting proxy ---------------------------------------------------------


class TripCounter:
    """A TCP proxy in a thread of its own in front of the server: counts, over every
    connection, the turns at which the client speaks again after the server answered (a
    round trip each; several messages sent before reading any answer count once)."""

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.trips = 0
        self._lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self.port = 0
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        self._ready.wait(10)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        server = self._loop.run_until_complete(
            asyncio.start_server(self._serve, "127.0.0.1", 0, family=socket.AF_INET)
        )
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        self._loop.run_forever()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(*self.target)
        turn = {"last": "server"}

        async def pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter, side: str) -> None:
            try:
                while data := await src.read(65536):
                    if side == "client" and turn["last"] == "server":
                        with self._lock:
                            self.trips += 1
                    turn["last"] = side
                    dst.write(data)
                    await dst.drain()
            except (ConnectionError, asyncio.CancelledError):
                pass
            finally:
                with contextlib.suppress(Exception):
                    dst.close()

        await asyncio.gather(pump(reader, up_writer, "client"), pump(up_reader, writer, "server"))

    def read(self) -> int:
        with self._lock:
            return self.trips

    def dsn(self, dsn: str) -> str:
        from psycopg import conninfo

        from common import with_db

        p = conninfo.conninfo_to_dict(dsn)
        return with_db(
            conninfo.make_conninfo(dsn, host="127.0.0.1", port=self.port), str(p["dbname"])
        )

    def close(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)


# -- the phases, through brooq's code --------------------------------------------------------


def session_dsn(dsn: str, sync: str) -> str:
    """``dsn`` with the session's synchronous_commit set."""
    from psycopg import conninfo

    return conninfo.make_conninfo(dsn, options=f"-c synchronous_commit={sync}")


def _client_cpu() -> float:
    return time.process_time()


@dataclass
class Round:
    """One database, one synchronous_commit setting: each phase's costs."""

    sync: str
    server_cpus: list[int]
    client_cpus: list[int]
    phases: dict[str, dict[str, float]] = field(default_factory=dict)
    trips: dict[str, float] = field(default_factory=dict)


class Runner:
    def __init__(
        self, admin: str, postmaster: int, counter: TripCounter | None = None, workers: int = 2
    ) -> None:
        self.admin = admin
        self.workers = workers
        self.empty_claim: dict[str, float] = {}
        self.meter = Meter(admin, postmaster)
        self.counter = counter

    def _target(self, dsn: str) -> str:
        """Where the phase's clients connect: the server, or the counting proxy."""
        return self.counter.dsn(dsn) if self.counter is not None else dsn

    def _trips(self) -> int:
        return self.counter.read() if self.counter is not None else 0

    def _settle(self, db: str) -> Reading:
        """A reading once the statistics of the connections just closed are in."""
        time.sleep(0.6)
        return self.meter.read(db)

    def single(self, dsn: str, db: str, sync: str, n: int) -> tuple[dict[str, float], float]:
        import brooq

        q = brooq.Queue(session_dsn(self._target(dsn), sync))
        try:
            for i in range(20):  # the line's connection and prepared statement: not measured
                q.enqueue(brooq.Job("bench.noop", {"i": i}))
            trips = self._trips()
            a = self.meter.read(db, _client_cpu())
            for i in range(n):
                q.enqueue(brooq.Job("bench.noop", {"i": i}))
            b = self.meter.read(db, _client_cpu())
            trips = self._trips() - trips
        finally:
            q.close()
        return per_job(a, b, n, self._settle(db)), trips / n

    def bulk(self, dsn: str, db: str, sync: str, n: int) -> tuple[dict[str, float], float]:
        import brooq

        q = brooq.Queue(session_dsn(self._target(dsn), sync))
        try:
            q.enqueue_many([brooq.Job("bench.noop", {"i": i}) for i in range(10)])
            chunks = [
                [brooq.Job("bench.noop", {"i": i}) for i in range(at, min(n, at + BULK_CHUNK))]
                for at in range(0, n, BULK_CHUNK)
            ]
            trips = self._trips()
            a = self.meter.read(db, _client_cpu())
            for chunk in chunks:
                q.enqueue_many(chunk)
            b = self.meter.read(db, _client_cpu())
            trips = self._trips() - trips
        finally:
            q.close()
        return per_job(a, b, n, self._settle(db)), trips / n

    def drain(self, dsn: str, db: str, sync: str) -> tuple[dict[str, float], float]:
        """Every ready job drained by `brooq-master --workers 2` of no-op handlers, from
        the first job done to the last (the start-up is left out, as ab.py's drain)."""
        import psycopg

        from common import start_master, tree_cpu

        with psycopg.connect(dsn, autocommit=True) as conn:
            if _has_history(conn):
                conn.execute(HISTORY_PREPARE)
            conn.execute("VACUUM ANALYZE job")
            row = conn.execute(LEFT).fetchone()
        jobs = int(row[0]) if row else 0
        env = {"QUEUE_WORKER_SYNCHRONOUS_COMMIT": sync}
        master = start_master(self._target(dsn), self.workers, env=env, name="sizing", quiet=True)
        polls = 0
        first: Reading | None = None
        try:
            with psycopg.connect(dsn, autocommit=True) as poll:
                row = poll.execute("SELECT pg_backend_pid()").fetchone()
                assert row is not None
                self.meter.leave_out.add(int(row[0]))
                trips = 0
                done_first = 0
                deadline = time.monotonic() + 600
                crowd: list[float] = []
                while True:
                    row = poll.execute(LEFT).fetchone()
                    polls += 1
                    left = int(row[0]) if row else 0
                    if first is not None and polls % 3 == 0:
                        crowd.append(others_runnable(self.meter.postmaster, master.pid))
                    if (first is None and left < jobs) or left == 0:
                        tree = tree_cpu(master.pid)
                        reading = self.meter.read(db, sum(tree.values()), list(tree))
                        if first is None:
                            first, done_first, trips = reading, jobs - left, self._trips()
                    if left == 0:
                        break
                    if not master.alive():
                        raise RuntimeError(f"brooq-master exited:\n{master.log_tail()}")
                    if time.monotonic() > deadline:
                        raise TimeoutError("the drain took over 600 s")
                    time.sleep(0.1)
                trips = self._trips() - trips
        finally:
            master.stop(30)
        assert first is not None
        done = jobs - done_first
        flushed = self._settle(db)
        flushed.commits -= polls  # the poll's own transactions
        got = per_job(first, reading, done, flushed)
        got["others_runnable"] = statistics.fmean(crowd) if crowd else math.nan
        return got, trips / done

    def claim_and_done(
        self, dsn: str, db: str, sync: str, batch: int = SPLIT_BATCH
    ) -> tuple[dict[str, float], float, dict[str, float], float]:
        """job_finish_and_claim claiming only, a batch at a time, every ready job; then
        writing only, the same batches: the two halves of the drain's statement apart."""
        import psycopg
        from brooq.sql import Q

        statement = Q.job_finish_and_claim
        common = {
            "topics": ["bench.noop"],
            "children": 2,
            "worker": "sizing",
            "lease": 300.0,
            "queue": "default",
        }
        with psycopg.connect(dsn, autocommit=True) as conn:
            if _has_history(conn):
                conn.execute(HISTORY_PREPARE)
            conn.execute("VACUUM ANALYZE job")
        with psycopg.connect(session_dsn(self._target(dsn), sync), autocommit=True) as conn:
            cur = conn.cursor()
            batches: list[list[Any]] = []
            trips = self._trips()
            a = self.meter.read(db, _client_cpu())
            while True:
                params = {**common, "done": [], "limit": batch}
                rows = cur.execute(statement, params, prepare=True).fetchall()
                if not rows:
                    break
                batches.append([r[1] for r in rows])
            b = self.meter.read(db, _client_cpu())
            claim_trips = self._trips() - trips
            claimed = sum(len(x) for x in batches)
            trips = self._trips()
            c = self.meter.read(db, _client_cpu())
            for ids in batches:
                cur.execute(statement, {**common, "done": ids, "limit": 0}, prepare=True)
            d = self.meter.read(db, _client_cpu())
            done_trips = self._trips() - trips
        flushed = self._settle(db)
        # A claim that finds nothing, once the master's VACUUM has passed: what an idle
        # child's poll costs the server (per statement).
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("VACUUM job")
        with psycopg.connect(session_dsn(dsn, sync), autocommit=True) as conn:
            cur = conn.cursor()
            cur.execute(statement, {**common, "done": [], "limit": batch}, prepare=True)
            e = self.meter.read(db, _client_cpu())
            for _ in range(EMPTY_CLAIMS):
                cur.execute(statement, {**common, "done": [], "limit": batch}, prepare=True)
            f = self.meter.read(db, _client_cpu())
        self.empty_claim = per_job(e, f, EMPTY_CLAIMS, self._settle(db))
        # The claim's counters end at b: pg_stat_* read at b may lag (a busy backend
        # reports at most once a second); the claim pass is long enough to bear it.
        return (
            per_job(a, b, claimed),
            claim_trips / claimed,
            per_job(c, d, claimed, flushed),
            done_trips / claimed,
        )

    def retention(self, dsn: str, db: str, sync: str) -> tuple[dict[str, float], float]:
        """Retention of every done job. With job_history (migration 0020): the finished
        rows' partitions released and dropped whole, each in its own transaction
        (brooq_history_release, brooq_history_drop), as the master's upkeep does. Without:
        the master's row-by-row retention (maintenance.delete_expired), in batches of the
        default size, on a connection like the master's (autocommit)."""
        import psycopg

        with psycopg.connect(dsn, autocommit=True) as conn:
            history = _has_history(conn)
            row = conn.execute(DONE_HISTORY if history else DONE).fetchone()
        jobs = int(row[0]) if row else 0
        if jobs == 0:
            raise RuntimeError("retention: no done job to delete")
        time.sleep(0.01)  # older than the TTL below, by far
        with psycopg.connect(session_dsn(self._target(dsn), sync), autocommit=True) as conn:
            # The partitions that hold the phase's rows, counted before the stopwatch (a
            # count reads a partition whole; the upkeep never does).
            full = self._partitions(conn) if history else []
            trips = self._trips()
            a = self.meter.read(db, _client_cpu())
            if history:
                for name, _ in full:
                    with conn.transaction():
                        conn.execute("SELECT brooq_history_release(%s)", (name,))
                    with conn.transaction():
                        conn.execute("SELECT brooq_history_drop(%s)", (name,))
                deleted = sum(n for _, n in full)
            else:
                deleted = self._delete_rows(conn)
            b = self.meter.read(db, _client_cpu())
            trips = self._trips() - trips
        if deleted != jobs:
            raise RuntimeError(f"retention deleted {deleted} of {jobs} done jobs")
        return per_job(a, b, jobs, self._settle(db)), trips / jobs

    @staticmethod
    def _delete_rows(conn: Any) -> int:
        from brooq.settings import Settings
        from brooq.supervisor import maintenance

        deleted = 0
        while True:
            counts, more = maintenance.delete_expired(
                conn, 0.001, Settings().retention_batch, budget=3600.0
            )
            deleted += sum(counts.values())
            if not more:
                return deleted

    @staticmethod
    def _partitions(conn: Any) -> list[tuple[str, int]]:
        """The partitions of job_history that hold rows, and how many; the default
        partition must hold none (the phase made partitions ahead)."""
        from psycopg import sql

        full = []
        for (name,) in conn.execute(HISTORY_EXPIRED).fetchall():
            query = sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(name))
            row = conn.execute(query).fetchone()
            if row and row[0]:
                full.append((str(name), int(row[0])))
        return full

    def round(self, sync: str, single: int, bulk: int, quick: bool = False) -> dict[str, Any]:
        """Every phase, in one fresh database: single then bulk enqueue, the drain of
        all of them, retention of all of them, then the claim and done apart. ``quick``:
        the bulk enqueue and the drain only (more drains for the model's check)."""
        from psycopg import conninfo

        from common import fresh_database, migrate_tree

        phases: dict[str, dict[str, float]] = {}
        trips: dict[str, float] = {}
        with fresh_database(self.admin, "sizing", prefix="brooq_sizing") as dsn:
            migrate_tree(dsn)
            db = str(conninfo.conninfo_to_dict(dsn)["dbname"])
            if not quick:
                phases["enqueue_single"], trips["enqueue_single"] = self.single(
                    dsn, db, sync, single
                )
            phases["enqueue_bulk"], trips["enqueue_bulk"] = self.bulk(dsn, db, sync, bulk)
            phases["drain"], trips["drain"] = self.drain(dsn, db, sync)
            if quick:
                return {"phases": phases, "trips": trips}
            phases["retention"], trips["retention"] = self.retention(dsn, db, sync)
            self._fill(dsn, sync, bulk)
            claim, claim_trips, done, done_trips = self.claim_and_done(dsn, db, sync)
            phases["claim"], trips["claim"] = claim, claim_trips
            phases["done"], trips["done"] = done, done_trips
            phases["empty_claim"] = self.empty_claim  # per statement, not per job
        return {"phases": phases, "trips": trips}

    def _fill(self, dsn: str, sync: str, n: int) -> None:
        import brooq

        q = brooq.Queue(session_dsn(dsn, sync))
        try:
            for at in range(0, n, BULK_CHUNK):
                chunk = range(at, min(n, at + BULK_CHUNK))
                q.enqueue_many([brooq.Job("bench.noop", {"i": i}) for i in chunk])
        finally:
            q.close()

    def close(self) -> None:
        self.meter.close()


# Jobs not yet done (a done job's row is in job or, with migration 0020, in job_history).
LEFT = "SELECT count(*) FROM job WHERE state IN ('pending', 'failed', 'processing')"
DONE = "SELECT count(*) FROM job WHERE state = 'done'"
DONE_HISTORY = "SELECT count(*) FROM job_history WHERE state = 'done'"
# Every partition of job_history but the default, oldest first (the upper bounds of the
# phase's partitions are ahead of now: 'infinity' takes them all).
HISTORY_EXPIRED = "SELECT name FROM brooq_history_expired('infinity')"
# Partitions of job_history ahead of the drain, an hour each (the master's upkeep makes
# them ahead too); no row then lands in the default partition, and a phase's rows fill
# one partition (two if it runs across the hour).
HISTORY_PREPARE = (
    "SELECT brooq_history_prepare(interval '1 hour', now(), now() + interval '1 hour', 4)"
)


def _has_history(conn: Any) -> bool:
    row = conn.execute("SELECT to_regclass('job_history') IS NOT NULL").fetchone()
    return bool(row and row[0])


# -- measure -------------------------------------------------------------------------------


def _cpus(text: str, what: str) -> set[int]:
    try:
        cpus = {int(x) for x in text.split(",") if x != ""}
    except ValueError:
        raise SystemExit(f"{what} wants CPU numbers separated by commas, got {text!r}") from None
    if not cpus or not cpus <= os.sched_getaffinity(0):
        raise SystemExit(f"{what}: CPUs {text!r} are not all on this machine")
    return cpus


def _syncs(text: str) -> list[str]:
    syncs = [x for x in text.split(",") if x]
    if not syncs or any(x not in ("on", "off") for x in syncs):
        raise SystemExit(f"--sync wants on, off or both (on,off), got {text!r}")
    return syncs


def measure(args: argparse.Namespace) -> None:
    from psycopg import conninfo

    from common import log

    server_cpus = _cpus(args.server_cpus, "--server-cpus")
    client_cpus = _cpus(args.client_cpus, "--client-cpus")
    syncs = _syncs(args.sync)
    postmaster = postmaster_pid(Path(args.pg_data))
    everything = os.sched_getaffinity(0)
    pin_cluster(postmaster, server_cpus)
    os.sched_setaffinity(0, client_cpus)  # the driver, and the masters it starts
    result: dict[str, Any] = {
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "server_cpus": sorted(server_cpus),
        "client_cpus": sorted(client_cpus),
        "machine_cpus": os.cpu_count(),
        "commit": _git_head(),
        # The code measured is the working tree's: what differs from the commit there.
        "uncommitted": _git_dirty(),
        "single": args.single,
        "bulk": args.bulk,
        "workers": args.workers,
        "rounds": {s: [] for s in syncs},
        "quick_rounds": args.quick_rounds,
        "trips": {},
    }
    runner = Runner(args.dsn, postmaster, workers=args.workers)
    try:
        from common import server_facts

        result["server"] = server_facts(args.dsn)
        for rnd in range(args.rounds):
            for sync in syncs if rnd % 2 == 0 else syncs[::-1]:
                before = wait_quiet(args.quiet_wait) if args.quiet_wait else None
                got = runner.round(sync, args.single, args.bulk)
                got["phases"]["busy_before"] = {"cores": before}
                result["rounds"][sync].append(got["phases"])
                log(f"round {rnd} sync={sync}: " + _line(got["phases"]))
        for rnd in range(args.quick_rounds):
            for sync in syncs if rnd % 2 == 0 else syncs[::-1]:
                before = wait_quiet(args.quiet_wait) if args.quiet_wait else None
                got = runner.round(sync, args.single, args.bulk + args.single, quick=True)
                got["phases"]["busy_before"] = {"cores": before}
                result["rounds"][sync].append(got["phases"])
                log(f"quick round {rnd} sync={sync}: " + _line(got["phases"]))
        if args.trips:
            p = conninfo.conninfo_to_dict(args.dsn)
            counter = TripCounter(str(p.get("host") or "127.0.0.1"), int(p.get("port") or 5432))
            trips_runner = Runner(args.dsn, postmaster, counter, args.workers)
            try:
                for sync in syncs:
                    got = trips_runner.round(sync, TRIP_JOBS, TRIP_BULK)
                    result["trips"][sync] = got["trips"]
                    log(f"round trips sync={sync}: {got['trips']}")
            finally:
                trips_runner.close()
                counter.close()
    finally:
        runner.close()
        pin_cluster(postmaster, everything)
        os.sched_setaffinity(0, everything)
    out = Path(args.out)
    out.write_text(json.dumps(result, indent=1, default=_json_default) + "\n")
    log(f"wrote {out}")


def _json_default(value: object) -> object:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    raise TypeError(repr(value))


def _git_head() -> str:
    import subprocess

    out = subprocess.run(
        ["git", "-C", str(BENCH_DIR.parent), "rev-parse", "--short", "HEAD"],
        capture_output=True,
        text=True,
    )
    return out.stdout.strip()


def _git_dirty() -> list[str]:
    import subprocess

    out = subprocess.run(
        ["git", "-C", str(BENCH_DIR.parent), "status", "--short", "--", "brooq", "migrations"],
        capture_output=True,
        text=True,
    )
    return [line.strip() for line in out.stdout.splitlines() if line.strip()]


def _line(phases: dict[str, dict[str, Any]]) -> str:
    before = phases.get("busy_before", {}).get("cores")
    head = f"(machine busy {before:.2f} cores before) " if before is not None else ""
    return head + "; ".join(
        f"{name} {p['jobs_s']:,.0f}/s {p['server_us']:.1f}us srv {p['client_us']:.1f}us cli "
        f"busy {p['server_busy']:.2f} other {p['other_cores']:.2f} "
        f"{p['wal_bytes']:.0f}B {p['fsyncs']:.3f}fs {p['commits']:.3f}c"
        for name, p in phases.items()
        if name != "busy_before"
    )


# -- report --------------------------------------------------------------------------------

METRICS = ("server_us", "client_us", "wal_bytes", "wal_writes", "fsyncs", "commits")
SHOWN = ("enqueue_single", "enqueue_bulk", "claim", "done", "drain", "retention")


def _spread(values: Sequence[float]) -> dict[str, float]:
    present = [v for v in values if v is not None and math.isfinite(v)]
    if not present:
        return {"median": math.nan, "min": math.nan, "max": math.nan, "n": 0}
    return {
        "median": statistics.median(present),
        "min": min(present),
        "max": max(present),
        "n": len(present),
    }


def inputs(runs: Sequence[dict[str, Any]]) -> dict[str, dict[str, dict[str, Any]]]:
    """sync -> phase -> metric -> spread, over every round of every run; the round
    trips from the runs' counting passes; jobs/s best of each run by its pinning."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for sync in ("on", "off"):
        rounds = [r for run in runs for r in run["rounds"].get(sync, [])]
        if not rounds:
            continue
        out[sync] = {}
        for phase in (*SHOWN, "empty_claim"):
            rows = [r[phase] for r in rounds if phase in r]
            if not rows:
                continue
            got: dict[str, Any] = {m: _spread([row[m] for row in rows]) for m in METRICS}
            got["fsync_ms"] = _spread([row["fsync_ms"] for row in rows])
            trips = [
                run["trips"][sync][phase] for run in runs if phase in run["trips"].get(sync, {})
            ]
            got["trips"] = _spread(trips)
            got["jobs_s"] = {
                _cores_label(run): _spread(
                    [r[phase]["jobs_s"] for r in run["rounds"].get(sync, []) if phase in r]
                )
                for run in runs
            }
            out[sync][phase] = got
    return out


def _cores_label(run: dict[str, Any]) -> str:
    return f"{len(run['server_cpus'])} core" + ("s" if len(run["server_cpus"]) > 1 else "")


def phase_of(costs: dict[str, dict[str, Any]], name: str, sync: str) -> Phase:
    """The model's Phase from the medians measured."""
    c = costs[name]
    return Phase(
        server_us=c["server_us"]["median"],
        commits_per_job=c["commits"]["median"],
        sync_commit=sync == "on",
        wal_bytes=c["wal_bytes"]["median"],
        client_us=c["client_us"]["median"],
    )


def _stations(
    run: dict[str, Any], drain: Phase, slow: tuple[float, float] = (1.0, 1.0)
) -> tuple[list[Station], float, str]:
    """The drain's stations on this machine, the CPU bound and how they are placed.
    ``slow``: the server's and the clients' slowdowns (others ran on their CPUs), by
    which their work per job grows."""
    server, client = set(run["server_cpus"]), set(run["client_cpus"])
    s_work, c_work = drain.server_us * slow[0], drain.client_us * slow[1]
    if server & client:
        cores = len(server | client)
        return (
            [Station("shared", cores, s_work + c_work)],
            cpu_bound(cores, s_work + c_work),
            f"{cores} cores shared by the server and the clients",
        )
    return (
        [Station("server", len(server), s_work), Station("clients", len(client), c_work)],
        split_cpu_bound(len(server), s_work, len(client), c_work),
        f"server on {len(server)}, clients on {len(client)}",
    )


def _slow(drain: dict[str, Any]) -> tuple[float, float]:
    """The factor by which other programs slowed the server's and the clients' work:
    1 + the other sessions ready to run per CPU (the scheduler's fair share)."""
    x = drain.get("others_runnable")
    share = 1.0 + float(x) if isinstance(x, (int, float)) and math.isfinite(x) else 1.0
    return share, share


def check(
    runs: Sequence[dict[str, Any]], costs: dict[str, dict[str, dict[str, Any]]]
) -> list[dict[str, Any]]:
    """Each run's drains against the model, from the medians of every run's rounds:
    what the master's few children reach moving in step (in_step; closed_loop, children
    at random, beside it) of the bound (the least of the server's cores and the clients'
    at their CPU per job, or, where they share the cores, of the shared cores at both
    summed). The model of whole cores against the median round; and round by round,
    against that round, the model with the work per job grown by the other programs'
    share of the CPUs (others_runnable)."""
    rows = []
    for run in runs:
        workers = int(run.get("workers", 2))
        for sync, rounds in run["rounds"].items():
            drain = phase_of(costs[sync], "drain", sync)
            stations, bound, how = _stations(run, drain)
            modelled = in_step(stations, workers)
            at_random = closed_loop(stations, workers)
            rates = [r["drain"]["jobs_s"] for r in rounds]
            per_round = []
            for r in rounds:
                slow = _slow(r["drain"])
                fair = in_step(_stations(run, drain, slow)[0], workers)
                per_round.append(
                    {
                        "measured": r["drain"]["jobs_s"],
                        "slowdown": slow,
                        "modelled": fair,
                        "error_pct": error_pct(r["drain"]["jobs_s"], fair),
                    }
                )
            quietest = min(per_round, key=lambda x: sum(x["slowdown"]))
            rows.append(
                {
                    "server_cores": len(run["server_cpus"]),
                    "sync": sync,
                    "workers": workers,
                    "measured_best": max(rates),
                    "measured": _spread(rates),
                    "bound": bound,
                    "modelled": modelled,
                    "at_random": at_random,
                    "how": how,
                    "error_pct": error_pct(statistics.median(rates), modelled),
                    "rounds": per_round,
                    "quietest": quietest,
                    "round_errors": _spread([abs(x["error_pct"]) for x in per_round]),
                }
            )
    return rows


def table(
    costs: dict[str, dict[str, dict[str, Any]]],
    cores: Sequence[int] = CORES,
    fsync_ms: float = 1.0,
) -> list[dict[str, Any]]:
    """The modelled jobs/s of a dedicated server (the clients elsewhere) of each size,
    per life of a job and synchronous_commit; with the committing connections needed for
    the commit bound to stay above the CPU bound at ``fsync_ms``."""
    rows = []
    for sync in ("on", "off"):
        if sync not in costs:
            continue
        lives = {
            "drain only (claim + done)": ("drain",),
            **{f"{k} enqueue + drain + retention": v for k, v in LIFE.items()},
        }
        for label, names in lives.items():
            phases = [phase_of(costs[sync], n, sync) for n in names]
            server_us = sum(p.server_us for p in phases)
            sync_commits = sum(p.commits_per_job for p in phases if p.sync_commit)
            cells = []
            for n in cores:
                est = cpu_bound(n, server_us)
                need = est * sync_commits * fsync_ms / 1e3
                cells.append({"cores": n, "jobs_s": est, "committers_needed": need})
            rows.append(
                {
                    "life": label,
                    "sync": sync,
                    "server_us": server_us,
                    "sync_commits_per_job": sync_commits,
                    "cells": cells,
                }
            )
    return rows


def _f(value: float, fmt: str = ",.0f") -> str:
    return "–" if value is None or not math.isfinite(value) else format(value, fmt)


def _range(s: dict[str, float], fmt: str) -> str:
    if not s["n"]:
        return "–"
    if s["n"] == 1 or s["min"] == s["max"]:
        return _f(s["median"], fmt)
    return f"{_f(s['median'], fmt)} ({_f(s['min'], fmt)}–{_f(s['max'], fmt)})"


def _uncommitted(run: dict[str, Any]) -> str:
    files = [x.split()[-1] for x in run.get("uncommitted", [])]
    return f", with uncommitted changes to {', '.join(files)}" if files else ""


def markdown(runs: Sequence[dict[str, Any]], summary: dict[str, Any]) -> str:
    costs, checks, rows = summary["inputs"], summary["check"], summary["table"]
    lines = [
        "# What one job costs PostgreSQL, and how far one server goes",
        "",
        "Measured with `benchmarks/sizing.py measure` (its docstring says how) on a "
        "PostgreSQL cluster of its own, pinned with `sched_setaffinity` (as `taskset -a`) "
        "to the CPUs named; `sizing.py report` wrote this page and its JSON. The model and "
        "how to read it: docs/explanation/one-server.md.",
        "",
    ]
    for run in runs:
        srv = run.get("server", {})
        lines.append(
            f"- run of {run['started']} (commit {run['commit']}"
            + _uncommitted(run)
            + f"): server on CPUs "
            f"{run['server_cpus']}, driver and masters on {run['client_cpus']}, "
            f"{run['machine_cpus']} CPUs in all; rounds per setting "
            f"{', '.join(f'{k}: {len(v)}' for k, v in run['rounds'].items())} (of which "
            f"{run.get('quick_rounds', 0)} the bulk enqueue and the drain only); "
            f"{run['single']:,} single enqueues, {run['bulk']:,} bulk, then the drain of all "
            f"of them by `brooq-master --workers {run.get('workers', 2)}`; PostgreSQL "
            f"{srv.get('server_version', '?')}, shared_buffers {srv.get('shared_buffers', '?')}"
        )
    lines += [
        "",
        "Each figure: the median over every round of every run (both pinnings), then the "
        "least and the most in parentheses. Per job, except the empty claim (per statement).",
        "",
    ]
    for sync, phases in costs.items():
        lines += [
            f"## synchronous_commit = {sync}",
            "",
            "| phase | server CPU (µs/job) | clients' CPU (µs/job) | WAL (bytes/job) | "
            "WAL writes/job | fsyncs/job | commits/job | round trips/job | jobs/s, best "
            "(1 core; 2 cores) |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        ]
        for name, c in phases.items():
            best = "; ".join(_f(v["max"]) for v in c["jobs_s"].values())
            lines.append(
                f"| {name} | {_range(c['server_us'], '.1f')} | {_range(c['client_us'], '.1f')} "
                f"| {_range(c['wal_bytes'], ',.0f')} | {_range(c['wal_writes'], '.4f')} "
                f"| {_range(c['fsyncs'], '.4f')} | {_range(c['commits'], '.4f')} "
                f"| {_range(c['trips'], '.4f')} | {best} |"
            )
        single = phases.get("enqueue_single")
        if single and sync == "on":
            lines += [
                "",
                f"The WAL flush measured here (pg_stat_wal's wal_sync_time / wal_sync, single "
                f"enqueues): {_range(single['fsync_ms'], '.3f')} ms.",
            ]
        lines.append("")
    lines += [
        "## The model against the drains measured",
        "",
        "Whole cores: the model (the children in step) for the CPUs named, against the "
        "median round; beside it, the same stations with the children at random (mean "
        "value analysis), the other end. Round by "
        "round: the model with the work per job grown by 1 + the other programs' "
        "sessions with a process ready to run, per CPU, during that round's drain "
        "(sampled every 300 ms from /proc; the scheduler's autogroups share a CPU "
        "evenly among sessions), against that round; the quietest round, and the "
        "spread of the rounds' errors.",
        "",
        "| server cores | synchronous_commit | drain measured (jobs/s): median (best, range) "
        "| modelled, whole cores | model vs median | children at random | quietest round: "
        "others per CPU, measured, modelled, error | every round: error (median, least–most) "
        "| the CPU bound | placement |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for c in checks:
        q = c["quietest"]
        left = f"{q['slowdown'][0] - 1:.2f}"
        lines.append(
            f"| {c['server_cores']} | {c['sync']} | {_f(c['measured']['median'])} "
            f"(best {_f(c['measured_best'])}, {_f(c['measured']['min'])}–"
            f"{_f(c['measured']['max'])}, {c['measured']['n']} rounds) | {_f(c['modelled'])} | "
            f"{c['error_pct']:+.0f} % | {_f(c['at_random'])} | "
            f"{left}: {_f(q['measured'])} vs {_f(q['modelled'])}, "
            f"{q['error_pct']:+.0f} % | {_range(c['round_errors'], '.0f')} % | "
            f"{_f(c['bound'])} | {c['how']}, {c['workers']} children |"
        )
    lines += [
        "",
        "## Modelled: one dedicated server, the clients elsewhere "
        f"(fsync {summary['fsync_ms']:g} ms)",
        "",
        "| life of a job | synchronous_commit | server µs/job | "
        + " | ".join(f"{c['cores']} cores" for c in rows[0]["cells"])
        + " |",
        "| --- | --- | --- | " + " | ".join("---" for _ in rows[0]["cells"]) + " |",
    ]
    for row in rows:
        cells = []
        for c in row["cells"]:
            cell = f"{_f(c['jobs_s'])}"
            if c["committers_needed"] >= 1:
                cell += f" (≥ {_f(math.ceil(c['committers_needed']))} committers)"
            cells.append(cell)
        lines.append(
            f"| {row['life']} | {row['sync']} | {row['server_us']:.1f} | "
            + " | ".join(cells)
            + " |"
        )
    lines += [
        "",
        'Every cell is modelled: cores x 1e6 / (server µs per job). "committers": the '
        "connections committing synchronously at once that the commit bound needs to stay "
        "above it (jobs/s x synchronous commits per job x fsync).",
        "",
    ]
    return "\n".join(lines)


def report(args: argparse.Namespace) -> None:
    runs = [json.loads(Path(f).read_text()) for f in args.files]
    costs = inputs(runs)
    summary = {
        "inputs": costs,
        "check": check(runs, costs),
        "table": table(costs, fsync_ms=args.fsync_ms),
        "fsync_ms": args.fsync_ms,
    }
    text = markdown(runs, summary)
    if args.md:
        Path(args.md).write_text(text)
    else:
        print(text)
    if args.json:
        Path(args.json).write_text(
            json.dumps({"summary": summary, "runs": runs}, indent=1, default=_json_default) + "\n"
        )


def model(args: argparse.Namespace) -> None:
    phase = Phase(args.server_us, args.commits_per_job, args.sync == "on")
    for n in _ints(args.cores, "--cores"):
        est = sustained([phase], n, fsync_ms=args.fsync_ms, committers=args.committers)
        print(
            f"{n} cores: {est.jobs_s:,.0f} jobs/s ({est.limit} bound; cpu "
            f"{est.bounds['cpu']:,.0f}, commit {_f(est.bounds['commit'])})"
        )


def _ints(text: str, what: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x]
    except ValueError:
        raise SystemExit(f"{what} wants whole numbers separated by commas, got {text!r}") from None
    if not values or min(values) < 1:
        raise SystemExit(f"{what} wants whole numbers of at least 1, got {text!r}")
    return values


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    sub = parser.add_subparsers(dest="command", required=True)
    m = sub.add_parser("measure", help="measure every phase's costs on a cluster of its own")
    m.add_argument("--pg-data", required=True, help="the cluster's data directory")
    m.add_argument("--dsn", default="postgresql://postgres@127.0.0.1:5441/postgres")
    m.add_argument("--server-cpus", default="0", help="the cluster's CPUs (e.g. 0 or 0,1)")
    m.add_argument("--client-cpus", default="1", help="the driver's and the masters' CPUs")
    m.add_argument("--sync", default="on,off")
    m.add_argument("--rounds", type=int, default=3)
    m.add_argument(
        "--quick-rounds", type=int, default=0, help="more rounds of the bulk enqueue and drain"
    )
    m.add_argument("--single", type=int, default=5000)
    m.add_argument("--bulk", type=int, default=95000)
    m.add_argument(
        "--quiet-wait",
        type=float,
        default=0.0,
        help="before each round, wait at most this long for the machine to be quiet",
    )
    m.add_argument("--workers", type=int, default=2, help="the draining master's children")
    m.add_argument("--no-trips", dest="trips", action="store_false")
    m.add_argument("--out", default="/tmp/sizing.json")
    r = sub.add_parser("report", help="the tables of one or more runs")
    r.add_argument("files", nargs="+")
    r.add_argument("--md")
    r.add_argument("--json")
    r.add_argument("--fsync-ms", type=float, default=1.0)
    o = sub.add_parser("model", help="the formula alone")
    o.add_argument("--server-us", type=float, required=True)
    o.add_argument("--cores", default=",".join(map(str, CORES)))
    o.add_argument("--fsync-ms", type=float, default=1.0)
    o.add_argument("--committers", type=float, default=8)
    o.add_argument("--commits-per-job", type=float, default=0.0)
    o.add_argument("--sync", default="on", choices=("on", "off"))
    args = parser.parse_args(argv)
    if args.command == "report":
        if args.fsync_ms <= 0:
            raise SystemExit("--fsync-ms must be positive")
        report(args)
    elif args.command == "model":
        if args.server_us <= 0 or args.fsync_ms <= 0 or args.committers <= 0:
            raise SystemExit("--server-us, --fsync-ms and --committers must be positive")
        model(args)
    elif args.command == "measure":
        if args.rounds < 1 or args.single < 1 or args.bulk < 1 or args.workers < 1:
            raise SystemExit("--rounds, --single, --bulk and --workers must be at least 1")
        if args.quick_rounds < 0:
            raise SystemExit("--quick-rounds must be 0 or more")
        measure(args)
    return 0


def run(argv: Sequence[str] | None = None) -> int:
    """main, with a refusal as one line on stderr and exit status 2."""
    try:
        return main(argv)
    except SystemExit as exc:
        if isinstance(exc.code, str):
            print(exc.code, file=sys.stderr)
            return 2
        raise


if __name__ == "__main__":
    sys.exit(run())
