"""A/B drain of checkouts of brooq: the same no-op drain from each tree, alternated.

    python benchmarks/ab_drain.py --dsn ADMIN_DSN [--jobs 100000] [--rounds 5]
        [--async [--concurrency 100]] [--own-schema] [--bulk-jobs 100000] TREE TREE ...

Each TREE is a checkout (e.g. a `git worktree` of the commit before a change), optionally
followed by environment for its master: `TREE,BENCH_MIDDLEWARE=1` drains with one no-op
middleware registered by the benchmark app (the same tree may be given twice). A round
drains JOBS ready no-op jobs with `brooq-master --workers 2` of every tree in turn, each in
a fresh database (the migrations of the brooq that runs this script, a superset of the
older trees' schema), and reports the jobs/s from the first finished job to the last and
the CPU per job, over the same stretch, of the master and its children and of their
database sessions (read from /proc: the same machine). Alternating the trees
spreads the machine's drift over all of them; the medians are what to compare. Every tree
runs the benchmark application of the checkout running this script (benchmarks/apps), so
the trees differ in brooq alone. `--async` drains with `async def` no-op handlers
(bench_brooq_async_app: every child an async child, `--concurrency` jobs at once).
`--own-schema`: each tree's database is migrated by that tree's own migrations instead,
so that what a migration adds to the table (an index, a trigger) is in the comparison.
After each drain, the tree also enqueues `--bulk-jobs` jobs in one `enqueue_many`
(ab_bulk.py's measure), so the A/B of a hot-path change reports both ends of the path.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import psycopg
from brooq import migrate
from psycopg import conninfo, sql

APPS = Path(__file__).resolve().parent / "apps"
sys.path.insert(0, str(APPS.parent))

from ab_bulk import once as bulk_once  # noqa: E402


def drain_once(
    admin: str,
    tree: Path,
    jobs: int,
    extra_env: dict[str, str],
    command: list[str],
    own_schema: bool = False,
) -> tuple[float, float, float]:
    name = f"brooq_ab_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    dsn = conninfo.make_conninfo(admin, dbname=name)
    try:
        if own_schema:  # the tree's own brooq.migrate, in a process with it first on the path
            migrator = "import sys; from brooq import migrate; migrate.up(sys.argv[1])"
            subprocess.run(
                [sys.executable, "-c", migrator, dsn],
                env={**os.environ, "PYTHONPATH": str(tree)},
                check=True,
                cwd="/",
            )
        else:
            migrate.up(dsn)
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(
                "INSERT INTO job (topic) SELECT 'bench.noop' FROM generate_series(1, %s)", (jobs,)
            )
            conn.execute("VACUUM ANALYZE job")
        env = {k: v for k, v in os.environ.items() if not k.startswith("QUEUE_")}
        env.update(
            DATABASE_URL=dsn,
            PYTHONPATH=os.pathsep.join([str(APPS), str(tree)]),
            QUEUE_OPS_ADDR="127.0.0.1:0",
        )
        env.update(extra_env)
        master = subprocess.Popen(
            [sys.executable, "-m", "brooq.master_cli", *command],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            cwd="/",
        )
        # From the first finished job to the last, as the rate: the processes' start-up
        # (imports, connections) is left out of the CPU per job too.
        first: tuple[float, int, dict[int, float], dict[int, float]] | None = None
        with psycopg.connect(dsn, autocommit=True) as conn:
            while True:
                row = conn.execute("SELECT count(*) FROM job WHERE state <> 'done'").fetchone()
                left = int(row[0]) if row else 0
                now = time.monotonic()
                if first is None and left < jobs:
                    first = (now, left, _tree_cpu(master.pid), _backends_cpu(conn))
                if left == 0:
                    end = (now, 0, _tree_cpu(master.pid), _backends_cpu(conn))
                    break
                if master.poll() is not None:  # a schema it refuses, say: never wait for ever
                    raise RuntimeError(f"{tree}: brooq-master exited {master.returncode}")
                time.sleep(0.05)
        master.send_signal(signal.SIGTERM)
        master.wait(30)
        assert first is not None
        done = first[1]
        rate = done / (end[0] - first[0])
        return rate, _spent(first[2], end[2]) / done * 1e6, _spent(first[3], end[3]) / done * 1e6
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )


def _cpu(pid: int) -> float | None:
    """Seconds of CPU (user + system) of a process so far, from /proc; None if gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


def _tree_cpu(master: int) -> dict[int, float]:
    """The CPU so far of the master and of its children (its forks), by pid."""
    pids = [master]
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            if ppid == master:
                pids.append(int(entry))
    return {pid: cpu for pid in pids if (cpu := _cpu(pid)) is not None}


def _backends_cpu(conn: psycopg.Connection[Any]) -> dict[int, float]:
    """The CPU so far of the database's other backends (the master's and its children's
    sessions, opened for this drain), by pid: the same machine."""
    rows = conn.execute(
        "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
        "AND pid <> pg_backend_pid()"
    ).fetchall()
    return {pid: cpu for (pid,) in rows if (cpu := _cpu(pid)) is not None}


def _spent(before: dict[int, float], after: dict[int, float]) -> float:
    """CPU seconds between two readings (a process born between them counts whole)."""
    return sum(cpu - before.get(pid, 0.0) for pid, cpu in after.items())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dsn", required=True, help="admin DSN (CREATE DATABASE)")
    ap.add_argument("--jobs", type=int, default=100_000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--async", dest="aio", action="store_true", help="async def handlers")
    ap.add_argument("--concurrency", type=int, default=100, help="with --async")
    ap.add_argument(
        "--own-schema", action="store_true", help="migrate each tree's database with its own"
    )
    ap.add_argument(
        "--bulk-jobs",
        type=int,
        default=100_000,
        help="each round, each tree also enqueues this many jobs in one enqueue_many "
        "(ab_bulk.py's measure, in a database of its own; 0: no bulk enqueue)",
    )
    ap.add_argument("trees", nargs="+", help="TREE or TREE,NAME=VALUE,...")
    args = ap.parse_args()
    command = ["--app", "bench_brooq_app:queue", "--workers", "2"]
    if args.aio:
        command = ["--app", "bench_brooq_async_app:queue", "--workers", "2"]
        command += ["--concurrency", str(args.concurrency)]
    results: dict[str, list[tuple[float, float, float]]] = {t: [] for t in args.trees}
    bulks: dict[str, list[tuple[float, ...]]] = {t: [] for t in args.trees}
    for rnd in range(args.rounds):
        for tree in args.trees:
            path, *assignments = tree.split(",")
            extra = dict(a.split("=", 1) for a in assignments)
            rate, cpu, server = drain_once(
                args.dsn, Path(path).resolve(), args.jobs, extra, command, args.own_schema
            )
            results[tree].append((rate, cpu, server))
            print(
                f"round {rnd} {tree}: {rate:,.0f} jobs/s, {cpu:.1f} us CPU/job "
                f"+ {server:.1f} us server",
                flush=True,
            )
            if args.bulk_jobs and not assignments:  # the same tree twice: once is enough
                bulk = bulk_once(args.dsn, path, args.bulk_jobs, args.own_schema)
                bulks[tree].append(bulk)
                print(
                    f"round {rnd} {tree}: bulk enqueue {bulk[0]:,.0f} jobs/s, CPU per job "
                    f"{bulk[1]:.2f} us producer + {bulk[2]:.2f} us server",
                    flush=True,
                )
    for tree, runs in results.items():
        rates, cpus = [r[0] for r in runs], [r[1] for r in runs]
        server = statistics.median(r[2] for r in runs)
        print(
            f"{tree}: median {statistics.median(rates):,.0f} jobs/s "
            f"({min(rates):,.0f}-{max(rates):,.0f}); master+children CPU median "
            f"{statistics.median(cpus):.1f} us/job ({min(cpus):.1f}-{max(cpus):.1f}); "
            f"server {server:.1f} us/job"
        )
    for tree, runs in bulks.items():
        if runs:
            print(
                f"{tree}: bulk enqueue median {statistics.median(r[0] for r in runs):,.0f} "
                f"jobs/s; CPU per job {statistics.median(r[1] for r in runs):.2f} us producer "
                f"+ {statistics.median(r[2] for r in runs):.2f} us server"
            )


if __name__ == "__main__":
    main()
