"""What every system's handlers do, so that the work is the same whatever runs it.

record() writes one row into bench_event of the run's database (BENCH_DSN) over a
connection of its own, opened once per process; the time is taken before the write.
The instrument must not slow what it measures, the same for every system: its
connection commits with synchronous_commit = off (no wait for a disk flush), and
record_cpu() -- inside the CPU-bound workload, whose wall time is the measure -- does not
touch the database at all: it appends one line to a file of its own process under
BENCH_EVENTS_DIR (no flush to disk; the benchmark reads the files). record_span() does
the same for the priority, limited and I/O-bound workloads (start and end in
nanoseconds), record_start() for the held-snapshot workload (the job's id and start).

The I/O-bound workloads wait IO_SECONDS per job: asleep (time.sleep in a
sync handler, asyncio.sleep in an async one) or for a local HTTP server
(benchmarks/httpwait.py, at BENCH_HTTP_URL) that answers every GET after IO_SECONDS.
http_get() is the sync client (stdlib urllib), http_get_async() the async one (a raw
HTTP/1.1 GET over asyncio.open_connection); both open one connection per request and
send `Connection: close`, so neither side keeps connections the other does not.
"""

from __future__ import annotations

import asyncio
import os
import urllib.request
from typing import Any
from urllib.parse import urlsplit

import psycopg

IO_SECONDS = 0.05  # each I/O-bound job's wait (the HTTP server's delay too)

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


def record_start(job: str, started: float) -> None:
    """A job's id and start (time.time(), one host) as one line job,start in a .starts
    file of its own process (the held-snapshot workload, 1,000 jobs a second: no
    database write per job)."""
    _append("starts", f"{job},{started!r}\n")


def hang_forever() -> None:
    """A handler that never returns and swallows whatever is raised into it (a soft
    timeout included), like code stuck in a C extension: only a kill stops it."""
    while True:
        try:
            while True:
                pass
        except BaseException:  # the point is to ignore everything
            continue


def http_url() -> str:
    """The local HTTP server of the io_http workload (run.py starts it)."""
    return os.environ["BENCH_HTTP_URL"]


def http_get(url: str) -> bytes:
    """A blocking GET (stdlib urllib: a new connection per request, closed after it)."""
    with urllib.request.urlopen(url, timeout=30) as resp:
        if resp.status != 200:
            raise RuntimeError(f"GET {url}: HTTP {resp.status}")
        return bytes(resp.read())


async def http_get_async(url: str) -> bytes:
    """The same GET on the event loop: one connection per request, HTTP/1.1 with
    `Connection: close`, the body read to the end of the stream."""
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write(
            f"GET {parts.path or '/'} HTTP/1.1\r\nHost: {host}:{port}\r\n"
            "Connection: close\r\n\r\n".encode()
        )
        await writer.drain()
        data = await asyncio.wait_for(reader.read(), timeout=30)
    finally:
        writer.close()
    status = data.split(b"\r\n", 1)[0]
    if status.split()[1:2] != [b"200"]:
        raise RuntimeError(f"GET {url}: {status!r}")
    return data.split(b"\r\n\r\n", 1)[1]
