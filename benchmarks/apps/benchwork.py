"""What every system's handlers do, so that the work is the same whatever runs it.

record() writes one row into bench_event of the run's database (BENCH_DSN) over a
connection of its own, opened once per process; the time is taken before the write.
The instrument must not slow what it measures, the same for every system: its
connection commits with synchronous_commit = off (no wait for a disk flush), and
record_cpu() -- inside the CPU-bound workload, whose wall time is the measure -- does not
touch the database at all: it appends one line to a file of its own process under
BENCH_EVENTS_DIR (no flush to disk; the benchmark reads the files). record_span() does
the same for the priority and limited workloads (start and end in nanoseconds).
"""

from __future__ import annotations

import os
from typing import Any

import psycopg

_conn: psycopg.Connection[Any] | None = None
_pid = 0


def spin(iterations: int) -> int:
    """Pure-Python CPU work; the iteration count for ~25 ms is calibrated once."""
    n = 0
    for i in range(iterations):
        n += i * i % 7
    return n


def _connection() -> psycopg.Connection[Any]:
    global _conn, _pid
    if _conn is None or _pid != os.getpid() or _conn.closed:
        _conn = psycopg.connect(
            os.environ["BENCH_DSN"], autocommit=True, options="-c synchronous_commit=off"
        )
        _pid = os.getpid()
    return _conn


def record(job: str, kind: str, t: float, cpu: float | None = None) -> None:
    _connection().execute(
        "INSERT INTO bench_event (job, kind, t, cpu, pid) VALUES (%s, %s, %s, %s, %s)",
        (job, kind, t, cpu, os.getpid()),
    )


_files: dict[tuple[int, str], int] = {}  # (pid, suffix) -> an O_APPEND descriptor


def _append(suffix: str, line: str) -> None:
    """One line to this process's own file in BENCH_EVENTS_DIR (opened once per process:
    a forked child gets a file of its own)."""
    key = (os.getpid(), suffix)
    fd = _files.get(key)
    if fd is None:
        path = os.path.join(os.environ["BENCH_EVENTS_DIR"], f"{key[0]}.{suffix}")
        fd = _files[key] = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.write(fd, line.encode())


def record_cpu(job: str, started: float, ended: float, cpu: float) -> None:
    """Both times of a CPU-bound job as one line: job,start,end,cpu,pid."""
    _append("csv", f"{job},{started!r},{ended!r},{cpu!r},{os.getpid()}\n")


def record_span(job: str, started_ns: int, ended_ns: int) -> None:
    """A job's start and end (time.time_ns(), one host) as one line
    job,start,end,pid,ppid in a .spans file of its own process (the priority and limited
    workloads; the parent is the child's master)."""
    _append("spans", f"{job},{started_ns},{ended_ns},{os.getpid()},{os.getppid()}\n")


def hang_forever() -> None:
    """A handler that never returns and swallows whatever is raised into it (a soft
    timeout included), like code stuck in a C extension: only a kill stops it."""
    while True:
        try:
            while True:
                pass
        except BaseException:  # the point is to ignore everything
            continue
