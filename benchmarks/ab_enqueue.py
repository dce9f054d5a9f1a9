"""A/B of single enqueues: `Queue.enqueue` of checkouts of brooq and pgbench's single
insert, alternated in short rounds.

    python benchmarks/ab_enqueue.py --dsn ADMIN_DSN [--jobs 1000] [--rounds 15] VARIANT ...

A VARIANT is a checkout's path (its `Queue.enqueue`, one call per job, each committed when
it returns, in a process of its own with that tree first on `sys.path`),
`pgbench:prepared` / `pgbench:simple` (ceiling.INSERT_ONE, one client), or `python:libpq`
(the least a Python client can do: a loop of libpq's `exec_prepared` of brooq's
`job_insert_one` with the same parameters, no Job, no checks; the tree running this
script gives the statement). `--placement same|cross` fixes where the client and the
backends run (benchmarks/placement.py); the default leaves it to the scheduler. Every run gets a
fresh database migrated by the brooq running this script. Commit latency on a shared disk
drifts by several times within a minute, so rounds are short and every variant runs once
per round, in an order reversed every other round; each round's figure is also given as a
share of the round's `pgbench:prepared` when that is a variant (the medians of the shares
are what to compare).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import uuid
from pathlib import Path

import psycopg
from brooq import migrate
from psycopg import conninfo, sql

sys.path.insert(0, str(Path(__file__).resolve().parent))

import ceiling
import placement

# Run inside the variant's process: warm the pool (its opening is not what is compared),
# then time JOBS enqueues, one call each.
CHILD = """
import sys, time
sys.path.insert(0, sys.argv[1])
import brooq
dsn, n = sys.argv[2], int(sys.argv[3])
q = brooq.Queue(dsn)
for i in range(20):
    q.enqueue(brooq.Job("bench.noop", {"i": i}))
t = time.perf_counter()
for i in range(n):
    q.enqueue(brooq.Job("bench.noop", {"i": i}))
print(n / (time.perf_counter() - t))
q.close()
"""

# python:libpq: brooq's statement and parameters through libpq, nothing else.
LIBPQ = """
import sys, time
sys.path.insert(0, sys.argv[1])
import psycopg
import brooq
from brooq.producer import line as enqueue_line
from brooq.producer.ids import uuid7_int
dsn, n = sys.argv[2], int(sys.argv[3])
statement = brooq.Queue(dsn)._q.job_insert_one.encode()
pg = psycopg.connect(dsn, autocommit=True).pgconn
pg.prepare(b"s", statement, enqueue_line._TYPES)
def one(i):
    params = [uuid7_int().to_bytes(16, "big"), b"bench.noop", b'{"i":%d}' % i, None, None,
              b"default", b"\\x00\\x00", None]
    if pg.exec_prepared(b"s", params, enqueue_line._FORMATS, 1).status != 2:
        raise SystemExit(pg.error_message)
for i in range(20):
    one(i)
t = time.perf_counter()
for i in range(n):
    one(i)
print(n / (time.perf_counter() - t))
"""


def once(admin: str, variant: str, jobs: int) -> float:
    name = f"brooq_abenq_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    dsn = conninfo.make_conninfo(admin, dbname=name)
    try:
        migrate.up(dsn)
        if variant.startswith("pgbench:"):
            return ceiling.insert_one(dsn, jobs, variant.split(":", 1)[1])
        if variant == "python:libpq":
            code, tree = LIBPQ, str(Path(__file__).resolve().parent.parent)
        else:
            code, tree = CHILD, str(Path(variant).resolve())
        out = subprocess.run(
            [sys.executable, "-c", code, tree, dsn, str(jobs)],
            capture_output=True,
            text=True,
            timeout=600,
            cwd="/",
        )
        if out.returncode != 0:
            raise RuntimeError(f"{variant}: {out.stderr[-2000:]}")
        return float(out.stdout.strip())
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dsn", required=True, help="admin DSN (CREATE DATABASE)")
    ap.add_argument("--jobs", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--placement", default="free", choices=placement.PLACEMENTS)
    ap.add_argument("variants", nargs="+")
    args = ap.parse_args()
    with placement.placed(args.dsn, args.placement) as where:
        print(f"placement: {where}", flush=True)
        run(args)


def run(args: argparse.Namespace) -> None:
    rates: dict[str, list[float]] = {v: [] for v in args.variants}
    shares: dict[str, list[float]] = {v: [] for v in args.variants}
    for rnd in range(args.rounds):
        order = args.variants if rnd % 2 == 0 else args.variants[::-1]
        got = {v: once(args.dsn, v, args.jobs) for v in order}
        ref = got.get("pgbench:prepared")
        for v in args.variants:
            rates[v].append(got[v])
            if ref:
                shares[v].append(got[v] / ref)
        line = ", ".join(f"{v} {got[v]:,.0f}" for v in args.variants)
        print(f"round {rnd}: {line} (jobs/s)", flush=True)
    for v in args.variants:
        r = rates[v]
        text = f"{v}: median {statistics.median(r):,.0f} jobs/s ({min(r):,.0f}-{max(r):,.0f})"
        if shares[v]:
            s = shares[v]
            text += (
                f"; of pgbench:prepared: median {statistics.median(s):.0%} "
                f"({min(s):.0%}-{max(s):.0%})"
            )
        print(text)


if __name__ == "__main__":
    main()
