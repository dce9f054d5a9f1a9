"""Run a real brooq-master in a subprocess and watch what it does to the table."""

from __future__ import annotations

import contextlib
import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import psycopg

APPS = Path(__file__).resolve().parent / "apps"
T = TypeVar("T")

# Short intervals so process tests run in seconds.
FAST = {
    "QUEUE_LEASE": "2s",
    "QUEUE_POLL_INTERVAL": "200ms",
    "QUEUE_REAPER_PERIOD": "500ms",
    "QUEUE_GRACEFUL_TIMEOUT": "10s",
    "QUEUE_OPS_ADDR": "127.0.0.1:0",
}


def wait_for(
    fn: Callable[[], T], timeout: float = 20.0, interval: float = 0.05, what: str = ""
) -> T:
    """Poll until fn() is truthy; return it, or fail with what it last returned."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = fn()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what or fn}: last={last!r}")


def covering(doors: Sequence[str], cases: Sequence[Any]) -> list[tuple[str, Any]]:
    """(door, case) pairs where every door meets a case and every case a door: each door
    once, its case taken in turn; then the first door with every case. For a matrix whose
    doors share the path a case tests (the same statement, driven differently), this runs
    each door and each case without their whole product."""
    pairs = [(door, cases[i % len(cases)]) for i, door in enumerate(doors)]
    pairs += [(doors[0], case) for case in cases if (doors[0], case) not in pairs]
    return pairs


def prepare(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE IF NOT EXISTS execution (job_id uuid, pid int, attempt int, "
            "note text, at timestamptz DEFAULT clock_timestamp())"
        )
        conn.execute("CREATE TABLE IF NOT EXISTS side_effect (job_id uuid, planner text)")


class MasterProcess:
    def __init__(
        self,
        dsn: str,
        log_path: Path,
        *,
        workers: int = 2,
        app: str = "brooq_testapp:queue",
        args: tuple[str, ...] = (),
        env: dict[str, str] | None = None,
        cwd: Path = APPS,
        wrap: tuple[str, ...] = (),
        new_session: bool = False,
    ) -> None:
        """`wrap` prefixes the command (`ip netns exec NAME`, say: it execs, so the pid is
        still the master's); `new_session` gives the master a process group of its own,
        which its children share, to kill them all with one killpg."""
        self.log_path = log_path
        full_env = {k: v for k, v in os.environ.items() if not k.startswith("QUEUE_")}
        full_env.update(FAST)
        full_env["DATABASE_URL"] = dsn
        full_env["PYTHONPATH"] = os.pathsep.join([str(cwd), str(APPS.parent.parent)])
        full_env.update(env or {})
        self._log = open(log_path, "ab")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [
                *wrap,
                sys.executable,
                "-m",
                "brooq.master_cli",
                "--app",
                app,
                "--workers",
                str(workers),
                *args,
            ],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=full_env,
            cwd=cwd,
            start_new_session=new_session,
        )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def signal(self, signum: int) -> None:
        os.kill(self.proc.pid, signum)

    def children(self) -> list[int]:
        return children_of(self.proc.pid)

    def wait_ready(self, workers: int, timeout: float = 20.0) -> list[int]:
        return wait_for(
            lambda: (kids := self.children()) and len(kids) >= workers and kids,
            timeout,
            what=f"{workers} children",
        )

    def wait(self, timeout: float = 30.0) -> int:
        try:
            return self.proc.wait(timeout)
        finally:
            self._log.close()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGQUIT)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        for pid in orphans_of_log(self.log_path):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if not self._log.closed:
            self._log.close()


def terminate_backend(admin: psycopg.Connection[Any], pid: int) -> None:
    """End backend ``pid`` from another session and wait until it is gone."""
    admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
    deadline = time.monotonic() + 10
    while admin.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone():
        assert time.monotonic() < deadline, f"backend {pid} still there"
        time.sleep(0.01)


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


def orphans_of_log(log_path: Path) -> list[int]:
    """Children named in the log that are still alive (cleanup after a failed test)."""
    import re

    pids = {int(p) for p in re.findall(r"pid=(\d+)", log_path.read_text(errors="replace"))}
    alive = []
    for pid in pids:
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if b"brooq" in cmd:
            alive.append(pid)
    return alive


def process_alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def states(conn: psycopg.Connection[Any]) -> dict[str, int]:
    """How many jobs are in each state, the finished ones (in job_history) included."""
    return dict(conn.execute("SELECT state, count(*) FROM job_all GROUP BY state").fetchall())


def executions(conn: psycopg.Connection[Any], job_id: Any = None) -> int:
    if job_id is None:
        row = conn.execute("SELECT count(*) FROM execution WHERE note = ''").fetchone()
    else:
        row = conn.execute(
            "SELECT count(*) FROM execution WHERE job_id = %s AND note IN ('', 'start')",
            (job_id,),
        ).fetchone()
    assert row is not None
    return int(row[0])


StartMaster = Callable[..., MasterProcess]


# The doors a producer enqueues through (enqueue_through): the Queue's one and many, sync
# and async, and brooq.enqueue* on the caller's own connection, one by one or as a batch.
ENQUEUE_DOORS = (
    "enqueue",
    "enqueue_many",
    "enqueue_async",
    "enqueue_many_async",
    "own_connection",
    "own_connection_many",
    "own_connection_async",
)


def enqueue_through(door: str, queue: Any, dsn: str, jobs: list[Any]) -> list[Any]:
    """The ids of ``jobs`` enqueued through ``door`` (ENQUEUE_DOORS), in order; the caller's
    own connections commit once all are enqueued."""
    import asyncio

    import psycopg

    import brooq

    if door == "enqueue":
        return [queue.enqueue(job)[0] for job in jobs]
    if door == "enqueue_many":
        return [i for i, _ in queue.enqueue_many(jobs)]
    if door == "enqueue_async":

        async def each() -> list[Any]:
            return [(await queue.enqueue_async(job))[0] for job in jobs]

        return asyncio.run(each())
    if door == "enqueue_many_async":
        return [i for i, _ in asyncio.run(queue.enqueue_many_async(jobs))]
    if door == "own_connection":
        with psycopg.connect(dsn) as conn:
            return [brooq.enqueue(conn, job)[0] for job in jobs]
    if door == "own_connection_many":
        with psycopg.connect(dsn) as conn:
            return [i for i, _ in brooq.enqueue_many(conn, jobs)]
    assert door == "own_connection_async", door

    async def own() -> list[Any]:
        async with await psycopg.AsyncConnection.connect(dsn) as conn:
            ids = [(await brooq.enqueue_async(conn, job))[0] for job in jobs]
            await conn.commit()
            return ids

    return asyncio.run(own())


def free_port() -> int:
    """A loopback port nothing listens on, taken below the kernel's ephemeral range: a
    port the kernel hands out (bind to 0) is also what the suite's many client
    connections get as their local port, and one of them may hold it by the time a
    server binds it."""
    low = _ephemeral_low()
    for _ in range(200):
        port = random.randrange(max(1024, low - 12000), low)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free loopback port below the ephemeral range")


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768
