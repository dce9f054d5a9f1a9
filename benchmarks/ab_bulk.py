"""A/B of bulk enqueue: `Queue.enqueue_many` of checkouts of brooq, alternated.

    python benchmarks/ab_bulk.py --dsn ADMIN_DSN [--jobs 100000] [--rounds 5] TREE TREE ...

Each round, every TREE (a checkout's path) enqueues JOBS untyped jobs without keys in one
`enqueue_many` call (COPY), in a process of its own with that tree first on `sys.path`,
into a fresh database migrated by the brooq running this script; the figure is jobs/s
from the call to its return (the pool opened and warmed before). Trees run in an order
reversed every other round, so the machine's drift is spread over all of them; the
medians are what to compare.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
from pathlib import Path

from brooq import migrate

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import fresh_database

CHILD = """
import sys, time
sys.path.insert(0, sys.argv[1])
import brooq
dsn, n = sys.argv[2], int(sys.argv[3])
q = brooq.Queue(dsn)
q.enqueue_many([brooq.Job("bench.noop", {"i": i}) for i in range(10)])
jobs = [brooq.Job("bench.noop", {"i": i}) for i in range(n)]
t = time.perf_counter()
q.enqueue_many(jobs)
print(n / (time.perf_counter() - t))
q.close()
"""


def once(admin: str, tree: str, jobs: int) -> float:
    with fresh_database(admin, "bulk", prefix="brooq_ab") as dsn:
        migrate.up(dsn)
        out = subprocess.run(
            [sys.executable, "-c", CHILD, str(Path(tree).resolve()), dsn, str(jobs)],
            capture_output=True,
            text=True,
            timeout=600,
            cwd="/",
        )
        if out.returncode != 0:
            raise RuntimeError(f"{tree}: {out.stderr[-2000:]}")
        return float(out.stdout.strip())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dsn", required=True, help="admin DSN (CREATE DATABASE)")
    ap.add_argument("--jobs", type=int, default=100_000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("trees", nargs="+")
    args = ap.parse_args()
    results: dict[str, list[float]] = {t: [] for t in args.trees}
    for rnd in range(args.rounds):
        order = args.trees if rnd % 2 == 0 else list(reversed(args.trees))
        for tree in order:
            rate = once(args.dsn, tree, args.jobs)
            results[tree].append(rate)
            print(f"round {rnd} {tree}: {rate:,.0f} jobs/s", flush=True)
    for tree, rates in results.items():
        print(
            f"{tree}: median {statistics.median(rates):,.0f} jobs/s "
            f"({min(rates):,.0f}-{max(rates):,.0f})"
        )


if __name__ == "__main__":
    main()
