"""A/B of bulk enqueue: `Queue.enqueue_many` of checkouts of brooq, alternated.

    python benchmarks/ab_bulk.py --dsn ADMIN_DSN [--jobs 100000] [--rounds 5] [--own-schema]
        [--chunk 1000] TREE TREE ...

Each round, every TREE (a checkout's path) enqueues JOBS untyped jobs without keys in one
`enqueue_many` call (COPY), in a process of its own with that tree first on `sys.path`,
into a fresh database migrated by the brooq running this script; the figure is jobs/s
from the call to its return (the pool opened and warmed before), beside the CPU per job
of the producer process and of the database's backends (read from /proc: same machine),
which a shared machine disturbs far less than the rate. Trees run in an order
reversed every other round, so the machine's drift is spread over all of them; the
medians are what to compare.

`--own-schema`: each tree's database is migrated by that tree's own migrations instead,
so that what a migration adds to the table (an index, a trigger) is in the comparison.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from pathlib import Path

from brooq import migrate

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import fresh_database

CHILD = """
import os, sys, time
sys.path.insert(0, sys.argv[1])
import brooq, psycopg
dsn, n, chunk = sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
TICK = os.sysconf("SC_CLK_TCK")

def server_cpu(pids):  # seconds of CPU of the database's backends (same machine)
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])
        except (OSError, IndexError, ValueError):
            pass
    return total / TICK

def backends(conn):
    rows = conn.execute(
        "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
    ).fetchall()
    return {r[0] for r in rows}

q = brooq.Queue(dsn)
q.enqueue_many([brooq.Job("bench.noop", {"i": i}) for i in range(10)])
items = list(range(n))
jobs = [brooq.Job("bench.noop", {"i": i}) for i in items] if chunk >= n else None
with psycopg.connect(dsn, autocommit=True) as watch:
    pids = backends(watch)
    server = server_cpu(pids)
    client = time.process_time()
    t = time.perf_counter()
    if jobs is not None:
        q.enqueue_many(jobs)
    else:  # as make bench does: the jobs made and sent a chunk at a time
        for at in range(0, n, chunk):
            q.enqueue_many([brooq.Job("bench.noop", {"i": i}) for i in items[at : at + chunk]])
    wall = time.perf_counter() - t
    client = time.process_time() - client
    pids |= backends(watch)
    server = server_cpu(pids) - server
print(n / wall, client / n * 1e6, server / n * 1e6)
q.close()
"""


def once(
    admin: str, tree: str, jobs: int, own_schema: bool = False, chunk: int = 0
) -> tuple[float, ...]:
    with fresh_database(admin, "bulk", prefix="brooq_ab") as dsn:
        if own_schema:  # the tree's own brooq.migrate, in a process with it first on the path
            migrator = "import sys; from brooq import migrate; migrate.up(sys.argv[1])"
            subprocess.run(
                [sys.executable, "-c", migrator, dsn],
                env={**os.environ, "PYTHONPATH": str(Path(tree).resolve())},
                check=True,
                cwd="/",
            )
        else:
            migrate.up(dsn)
        out = subprocess.run(
            [
                sys.executable,
                "-c",
                CHILD,
                str(Path(tree).resolve()),
                dsn,
                str(jobs),
                str(chunk or jobs),
            ],
            capture_output=True,
            text=True,
            timeout=600,
            cwd="/",
        )
        if out.returncode != 0:
            raise RuntimeError(f"{tree}: {out.stderr[-2000:]}")
        return tuple(float(x) for x in out.stdout.split())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dsn", required=True, help="admin DSN (CREATE DATABASE)")
    ap.add_argument("--jobs", type=int, default=100_000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument(
        "--own-schema", action="store_true", help="migrate each tree's database with its own"
    )
    ap.add_argument(
        "--chunk",
        type=int,
        default=0,
        help="enqueue_many calls of this many jobs, each Job made in the timed loop, as "
        "make bench's bulk workload does (default: all the jobs in one call, made before)",
    )
    ap.add_argument("trees", nargs="+")
    args = ap.parse_args()
    results: dict[str, list[tuple[float, ...]]] = {t: [] for t in args.trees}
    for rnd in range(args.rounds):
        order = args.trees if rnd % 2 == 0 else list(reversed(args.trees))
        for tree in order:
            rate, client, server = once(args.dsn, tree, args.jobs, args.own_schema, args.chunk)
            results[tree].append((rate, client, server))
            print(
                f"round {rnd} {tree}: {rate:,.0f} jobs/s, CPU per job {client:.2f} us "
                f"producer + {server:.2f} us server",
                flush=True,
            )
    for tree, runs in results.items():
        rates = [r[0] for r in runs]
        client = statistics.median(r[1] for r in runs)
        server = statistics.median(r[2] for r in runs)
        print(
            f"{tree}: median {statistics.median(rates):,.0f} jobs/s "
            f"({min(rates):,.0f}-{max(rates):,.0f}); CPU per job {client:.2f} us producer "
            f"+ {server:.2f} us server = {client + server:.2f} us"
        )


if __name__ == "__main__":
    main()
