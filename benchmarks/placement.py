"""Where the client and its PostgreSQL backends run: --placement for the single-enqueue
benchmarks.

A single enqueue is one round trip and one commit, and on a 2-CPU machine most of its
time variance is the scheduler's: measured 2026-12-02 (benchmarks/README.md, "Placement"),
the same libpq loop took 110 µs a call with client and backend on one CPU and 170 µs on
two (synchronous_commit off), and an interpreted client loses more than a C one when it
shares a CPU with its backend (each wake-up finds the caches full of the backend's work).
Left to the scheduler ("free", the default) a run gets whichever it picks, and may change
placement mid-run. "same" and "cross" fix it for every system of the run alike: the
postmaster's affinity is set to one CPU (a new backend inherits it when forked), the
client's to that CPU or another one, and both are put back when the run ends.

Needs a local PostgreSQL whose postmaster this user may re-pin (root, or the server's own
user) and at least 2 CPUs; otherwise it refuses with the reason. A run killed with
SIGKILL cannot put the postmaster back: `taskset -pc 0-N PID` (the first line of the data
directory's postmaster.pid) does, and a restart of the server too.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

import psycopg

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
