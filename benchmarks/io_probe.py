"""One drain of 50 ms async jobs by a checkout's brooq: jobs/s and CPU per job.

    python benchmarks/io_probe.py TREE [--jobs 40000] [--workers 2] [--concurrency 500]
        [--dsn ADMIN_DSN] [--spy SECONDS --spy-out FILE]

TREE is a checkout (a `git worktree` of the commit before a change, say). In a fresh
database migrated by TREE's own brooq, JOBS ready `bench.io` jobs (`await
asyncio.sleep(0.05)`, apps/bench_brooq_async_app.py of this checkout) are drained by
TREE's `brooq-master --workers W --concurrency C`. Prints jobs/s from the first look that
saw a job finished to the first that saw none left (polled every 50 ms), the bound
(slots / 50 ms), and the CPU time of the master and its children over the same stretch
per job (/proc). With --spy, py-spy records the busiest child for SECONDS, one second
into the drain, as a raw profile (py-spy must be on PATH or beside this Python). Run
several trees alternately and compare the medians, CPU per job first: one drain on a
shared machine says little.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psycopg
from psycopg import conninfo, sql

APPS = Path(__file__).resolve().parent / "apps"


def cpu_seconds(pids: list[int]) -> float:
    """utime + stime of the processes still alive, in seconds."""
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def children(pid: int) -> list[int]:
    argv = ["ps", "--ppid", str(pid), "-o", "pid=", "--sort=-pcpu"]
    out = subprocess.run(argv, capture_output=True, text=True)
    return [int(p) for p in out.stdout.split()]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("tree", type=Path)
    ap.add_argument("--jobs", type=int, default=40_000)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--concurrency", type=int, default=500)
    ap.add_argument("--dsn", default="postgresql://postgres@127.0.0.1:5432/postgres")
    ap.add_argument("--spy", type=int, default=0, help="seconds of py-spy on the busiest child")
    ap.add_argument("--spy-out", default="io-probe-spy.txt")
    a = ap.parse_args()
    name = f"brooq_io_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(a.dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    dsn = conninfo.make_conninfo(a.dsn, dbname=name)
    try:
        migrator = "import sys; from brooq import migrate; migrate.up(sys.argv[1])"
        tree_env = {**os.environ, "PYTHONPATH": str(a.tree)}
        subprocess.run([sys.executable, "-c", migrator, dsn], env=tree_env, check=True, cwd="/")
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(
                "INSERT INTO job (topic, payload) SELECT 'bench.io', "
                "jsonb_build_object('k', 'j' || g) FROM generate_series(1, %s) g",
                (a.jobs,),
            )
            conn.execute("VACUUM ANALYZE job")
        print(drain(a, dsn))
    finally:
        with psycopg.connect(a.dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(name)))
    return 0


def drain(a: argparse.Namespace, dsn: str) -> str:
    events = Path(f"/tmp/{uuid.uuid4().hex}")  # the bench app's span files
    events.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("QUEUE_")}
    env.update(
        DATABASE_URL=dsn,
        PYTHONPATH=os.pathsep.join([str(APPS), str(a.tree)]),
        QUEUE_OPS_ADDR="127.0.0.1:0",
        BENCH_EVENTS_DIR=str(events),
    )
    command = [sys.executable, "-m", "brooq.master_cli", "--app", "bench_brooq_async_app:queue"]
    command += ["--workers", str(a.workers), "--concurrency", str(a.concurrency)]
    master = subprocess.Popen(
        command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd="/"
    )
    first: tuple[float, int, float] | None = None  # when, jobs left, CPU seconds
    spy = None
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            while True:
                row = conn.execute("SELECT count(*) FROM job WHERE state <> 'done'").fetchone()
                left, now = row[0] if row else 0, time.monotonic()
                if first is None and left < a.jobs:
                    first = (now, left, cpu_seconds([master.pid, *children(master.pid)]))
                if a.spy and spy is None and first is not None and now - first[0] > 1:
                    spy = start_spy(children(master.pid)[0], a.spy, a.spy_out)
                if left == 0:
                    break
                time.sleep(0.05)
        assert first is not None
        seconds = time.monotonic() - first[0]
        cpu = cpu_seconds([master.pid, *children(master.pid)]) - first[2]
    finally:
        master.send_signal(signal.SIGTERM)
        master.wait(30)
        if spy is not None:
            spy.wait(a.spy + 10)
        shutil.rmtree(events, ignore_errors=True)
    bound = a.workers * a.concurrency / 0.05
    return (
        f"{a.tree} {a.workers} x {a.concurrency}: {first[1] / seconds:,.0f} jobs/s "
        f"(bound {bound:,.0f}), {1e6 * cpu / first[1]:.1f} us CPU per job (master + children)"
    )


def start_spy(pid: int, seconds: int, out: str) -> subprocess.Popen[bytes]:
    py_spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    argv = [py_spy, "record", "-p", str(pid), "-d", str(seconds), "-r", "250"]
    argv += ["--format", "raw", "-o", out, "--nonblocking"]
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


if __name__ == "__main__":
    sys.exit(main())
