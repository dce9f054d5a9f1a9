"""A/B of checkouts of brooq: the same measure from each tree, alternated.

    python benchmarks/ab.py drain --dsn ADMIN_DSN [--jobs 100000] [--rounds 5]
        [--async [--concurrency 100]] [--own-schema] [--bulk-jobs 100000] TREE TREE ...
    python benchmarks/ab.py bulk --dsn ADMIN_DSN [--jobs 100000] [--rounds 5] [--own-schema]
        [--chunk 1000] TREE TREE ...
    python benchmarks/ab.py enqueue --dsn ADMIN_DSN [--jobs 1000] [--rounds 15]
        [--placement free|same|cross] VARIANT ...
    python benchmarks/ab.py io TREE [--jobs 40000] [--workers 2] [--concurrency 500]
        [--dsn ADMIN_DSN] [--spy SECONDS --spy-out FILE]
    python benchmarks/ab.py cpu --dsn ADMIN_DSN [--jobs 200] [--rounds 5] [--own-schema]
        TREE TREE ...

(also `benchmarks/run.py ab ...`; `ab_drain.py` and `ab_bulk.py` are `ab.py drain` and
`ab.py bulk`). Each TREE is a checkout (a `git worktree` of the commit before a change,
say); every run gets a fresh database migrated by the brooq running this script (a
superset of the older trees' schema) or, with `--own-schema`, by the tree's own
migrations, so that what a migration adds to the table (an index, a trigger) is in the
comparison. Every tree runs the benchmark application of this checkout (benchmarks/apps),
so the trees differ in brooq alone. Trees run in turn, every round, so the machine's
drift is spread over all of them; the medians are what to compare, CPU per job first (a
shared machine disturbs it far less than the rates).

drain: JOBS ready no-op jobs drained by the tree's `brooq-master --workers 2`; jobs/s
  from the first finished job to the last (polled every 50 ms), the CPU per job over the
  same stretch of the master and its children and of their database sessions (/proc).
  `TREE,BENCH_MIDDLEWARE=1` gives the tree's master more environment (the same tree may
  be given twice). `--async`: `async def` no-op handlers (bench_brooq_async_app,
  `--concurrency` jobs at once per child). After each drain the tree also runs `bulk`
  with `--bulk-jobs` jobs (0: none), so the A/B of a hot-path change shows both ends.
bulk: JOBS untyped jobs without keys in one `enqueue_many` call (COPY), in a process of
  its own with the tree first on `sys.path`, the pool opened and warmed before; jobs/s
  of the call, the CPU per job of the producer and of the database's backends. Order
  reversed every other round.
enqueue: `Queue.enqueue` of each tree, one call per job, each committed when it
  returns; a VARIANT is a tree, `pgbench:prepared` / `pgbench:simple` (ceiling.INSERT_ONE,
  one client) or `python:libpq` (a loop of libpq's `exec_prepared` of brooq's insert
  with the same parameters: the least a Python client can do). Short rounds, order
  reversed every other round, each figure also as a share of the round's
  `pgbench:prepared` when that is a variant, and a Python variant's CPU per call (its
  process's user + system time over the timed calls). `--placement` as run.py's.
cpu: JOBS CPU-bound jobs (make bench's: pure Python of ~25 ms, the iterations of
  cpu_calibration.json) drained by the tree's `brooq-master --workers 2`: parallelism =
  the handlers' summed CPU time (their own thread_time) over the wall time from the
  first start to the last end, as make bench's cpu workload reads it.
io: one drain of 50 ms async jobs (`bench.io`) by one tree's `brooq-master --workers W
  --concurrency C`, its own migrations: jobs/s, the bound (slots / 50 ms), the CPU per
  job of the master and its children; `--spy S`: py-spy records the busiest child for S
  seconds, one second into the drain (raw format, to --spy-out). Run the trees in turn,
  several times.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import psycopg

import ceiling
from common import (
    PLACEMENTS,
    ROOT,
    Worker,
    any_left,
    backends_cpu,
    calibrated_iterations,
    children_of,
    cpu_events,
    cpu_of,
    events_dir,
    fresh_database,
    migrate_tree,
    placed,
    spent,
    start_master,
    tree_cpu,
    wait_until,
)

# Run inside the tree's own process: argv = tree, dsn, jobs, chunk. Prints jobs/s, then
# the CPU per job (us) of the producer and of the database's backends.
BULK_CHILD = """
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

# Run inside the variant's process: warm the pool (its opening is not what is compared),
# then time JOBS enqueues, one call each.
ENQUEUE_CHILD = """
import sys, time
sys.path.insert(0, sys.argv[1])
import brooq
dsn, n = sys.argv[2], int(sys.argv[3])
q = brooq.Queue(dsn)
for i in range(20):
    q.enqueue(brooq.Job("bench.noop", {"i": i}))
c, t = time.process_time(), time.perf_counter()
for i in range(n):
    q.enqueue(brooq.Job("bench.noop", {"i": i}))
t, c = time.perf_counter() - t, time.process_time() - c
print(n / t, c / n * 1e6)
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
c, t = time.process_time(), time.perf_counter()
for i in range(n):
    one(i)
t, c = time.perf_counter() - t, time.process_time() - c
print(n / t, c / n * 1e6)
"""


def _tree(spec: str) -> Path:
    return Path(spec).resolve()


def _child(code: str, tree: str | Path, *args: object) -> list[float]:
    argv = [sys.executable, "-c", code, str(tree), *map(str, args)]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=600, cwd="/")
    if out.returncode != 0:
        raise RuntimeError(f"{tree}: {out.stderr[-2000:]}")
    return [float(x) for x in out.stdout.split()]


def _fill(dsn: str, jobs: int, topic: str = "bench.noop") -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO job (topic, payload) SELECT %s, jsonb_build_object('k', 'j' || g) "
            "FROM generate_series(1, %s) g"
            if topic == "bench.io"
            else "INSERT INTO job (topic) SELECT %s FROM generate_series(1, %s)",
            (topic, jobs),
        )
        conn.execute("VACUUM ANALYZE job")


def drain_once(
    admin: str, tree: Path, jobs: int, env: dict[str, str], aio: int, own_schema: bool
) -> tuple[float, float, float]:
    """(jobs/s, master + children CPU us per job, their sessions' CPU us per job)."""
    with fresh_database(admin, "drain", prefix="brooq_ab") as dsn:
        migrate_tree(dsn, tree if own_schema else None)
        _fill(dsn, jobs)
        app = "bench_brooq_async_app:queue" if aio else "bench_brooq_app:queue"
        options = ["--concurrency", str(aio)] if aio else []
        master = start_master(
            dsn, 2, app=app, tree=tree, env=env, options=options, name="ab", quiet=True
        )
        # From the first finished job to the last, as the rate: the processes' start-up
        # (imports, connections) is left out of the CPU per job too.
        first: tuple[float, int, dict[int, float], dict[int, float]] | None = None
        try:
            with psycopg.connect(dsn, autocommit=True) as conn:
                for left in any_left(conn, master):
                    if (first is None and left < jobs) or left == 0:
                        reading = (time.monotonic(), left, tree_cpu(master.pid), backends_cpu(conn))
                        first = first or reading
                end = reading
        finally:
            master.stop(30)
    assert first is not None
    done = first[1]
    rate = done / (end[0] - first[0])
    return rate, spent(first[2], end[2]) / done * 1e6, spent(first[3], end[3]) / done * 1e6


def cpu_once(admin: str, tree: Path, jobs: int, own_schema: bool) -> float:
    """The parallelism of one CPU-bound drain (see the module's docstring)."""
    with fresh_database(admin, "cpu", prefix="brooq_ab") as dsn:
        migrate_tree(dsn, tree if own_schema else None)
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(
                "INSERT INTO job (topic, payload) SELECT 'bench.cpu', "
                "jsonb_build_object('k', 'c' || g, 'n', %s::integer) "
                "FROM generate_series(1, %s) g",
                (calibrated_iterations(), jobs),
            )
            conn.execute("VACUUM ANALYZE job")
        master = start_master(dsn, 2, tree=tree, name="ab", quiet=True)
        try:
            wait_until(
                lambda: len({r[0] for r in cpu_events(dsn)}) >= jobs or not master.alive(),
                timeout=300,
                interval=0.1,
                what=f"{jobs} cpu jobs",
            )
        finally:
            master.stop(30)
        rows = cpu_events(dsn)  # (job, start, end, cpu, pid)
    if len({r[0] for r in rows}) < jobs:
        raise RuntimeError(f"{tree}: the master exited before its {jobs} cpu jobs ran")
    return sum(r[3] for r in rows) / (max(r[2] for r in rows) - min(r[1] for r in rows))


def bulk_once(admin: str, tree: str, jobs: int, own_schema: bool, chunk: int = 0) -> list[float]:
    """(jobs/s, producer CPU us per job, server CPU us per job) of one enqueue_many."""
    with fresh_database(admin, "bulk", prefix="brooq_ab") as dsn:
        migrate_tree(dsn, _tree(tree) if own_schema else None)
        return _child(BULK_CHILD, _tree(tree), dsn, jobs, chunk or jobs)


def enqueue_once(admin: str, variant: str, jobs: int) -> tuple[float, float | None]:
    """(jobs/s, the client's CPU µs per call: None for pgbench, a process of its own)."""
    with fresh_database(admin, "enqueue", prefix="brooq_abenq") as dsn:
        migrate_tree(dsn)
        if variant.startswith("pgbench:"):
            return ceiling.insert_one(dsn, jobs, variant.split(":", 1)[1]), None
        code, tree = (LIBPQ, ROOT) if variant == "python:libpq" else (ENQUEUE_CHILD, _tree(variant))
        rate, cpu = _child(code, tree, dsn, jobs)
        return rate, cpu


def _spread(values: list[float], fmt: str = ",.0f") -> str:
    return f"median {statistics.median(values):{fmt}} ({min(values):{fmt}}-{max(values):{fmt}})"


def drain(args: argparse.Namespace) -> None:
    results: dict[str, list[tuple[float, float, float]]] = {t: [] for t in args.trees}
    bulks: dict[str, list[list[float]]] = {t: [] for t in args.trees}
    for rnd in range(args.rounds):
        for tree in args.trees:
            path, *assignments = tree.split(",")
            env = dict(a.split("=", 1) for a in assignments)
            aio = args.concurrency if args.aio else 0
            rate, cpu, server = drain_once(
                args.dsn, _tree(path), args.jobs, env, aio, args.own_schema
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
        server = statistics.median(r[2] for r in runs)
        print(
            f"{tree}: {_spread([r[0] for r in runs])} jobs/s; master+children CPU "
            f"{_spread([r[1] for r in runs], '.1f')} us/job; server {server:.1f} us/job"
        )
    for tree, bruns in bulks.items():
        if bruns:
            print(
                f"{tree}: bulk enqueue median {statistics.median(r[0] for r in bruns):,.0f} "
                f"jobs/s; CPU per job {statistics.median(r[1] for r in bruns):.2f} us producer "
                f"+ {statistics.median(r[2] for r in bruns):.2f} us server"
            )


def bulk(args: argparse.Namespace) -> None:
    results: dict[str, list[list[float]]] = {t: [] for t in args.trees}
    for rnd in range(args.rounds):
        for tree in args.trees if rnd % 2 == 0 else list(reversed(args.trees)):
            rate, client, server = bulk_once(args.dsn, tree, args.jobs, args.own_schema, args.chunk)
            results[tree].append([rate, client, server])
            print(
                f"round {rnd} {tree}: {rate:,.0f} jobs/s, CPU per job {client:.2f} us "
                f"producer + {server:.2f} us server",
                flush=True,
            )
    for tree, runs in results.items():
        client = statistics.median(r[1] for r in runs)
        server = statistics.median(r[2] for r in runs)
        print(
            f"{tree}: {_spread([r[0] for r in runs])} jobs/s; CPU per job {client:.2f} us "
            f"producer + {server:.2f} us server = {client + server:.2f} us"
        )


def cpu(args: argparse.Namespace) -> None:
    results: dict[str, list[float]] = {t: [] for t in args.trees}
    for rnd in range(args.rounds):
        for tree in args.trees if rnd % 2 == 0 else list(reversed(args.trees)):
            par = cpu_once(args.dsn, _tree(tree), args.jobs, args.own_schema)
            results[tree].append(par)
            print(f"round {rnd} {tree}: parallelism {par:.2f}", flush=True)
    for tree, runs in results.items():
        print(f"{tree}: parallelism {_spread(runs, '.2f')}")


def enqueue(args: argparse.Namespace) -> None:
    with placed(args.dsn, args.placement) as where:
        print(f"placement: {where}", flush=True)
        rates: dict[str, list[float]] = {v: [] for v in args.variants}
        shares: dict[str, list[float]] = {v: [] for v in args.variants}
        cpus: dict[str, list[float]] = {v: [] for v in args.variants}
        for rnd in range(args.rounds):
            order = args.variants if rnd % 2 == 0 else args.variants[::-1]
            got = {v: enqueue_once(args.dsn, v, args.jobs) for v in order}
            ref = got["pgbench:prepared"][0] if "pgbench:prepared" in got else None
            for v in args.variants:
                rate, cpu = got[v]
                rates[v].append(rate)
                if cpu is not None:
                    cpus[v].append(cpu)
                if ref:
                    shares[v].append(rate / ref)
            line = ", ".join(f"{v} {got[v][0]:,.0f}" for v in args.variants)
            print(f"round {rnd}: {line} (jobs/s)", flush=True)
    for v in args.variants:
        text = f"{v}: {_spread(rates[v])} jobs/s"
        if cpus[v]:
            text += f"; client CPU {_spread(cpus[v], '.1f')} µs a call"
        if shares[v]:
            text += f"; of pgbench:prepared: {_spread(shares[v], '.0%')}"
        print(text)


def io(args: argparse.Namespace) -> None:
    tree = args.tree.resolve()
    with fresh_database(args.dsn, "io", prefix="brooq_io") as dsn:
        migrate_tree(dsn, tree)
        _fill(dsn, args.jobs, "bench.io")
        options = ["--concurrency", str(args.concurrency)]
        app = "bench_brooq_async_app:queue"
        master = start_master(
            dsn, args.workers, app=app, tree=tree, options=options, name="ab-io", quiet=True
        )
        first: tuple[float, int, float] | None = None  # when, jobs left, CPU seconds
        spy: subprocess.Popen[bytes] | None = None
        try:
            with psycopg.connect(dsn, autocommit=True) as conn:
                for left in any_left(conn, master):
                    now = time.monotonic()
                    if first is None and left < args.jobs:
                        first = (now, left, _cpu_seconds(master))
                    if args.spy and spy is None and first is not None and now - first[0] > 1:
                        spy = start_spy(_busiest_child(master), args.spy, args.spy_out)
            assert first is not None
            seconds = time.monotonic() - first[0]
            cpu = _cpu_seconds(master) - first[2]
        finally:
            master.stop(30)
            if spy is not None:
                spy.wait(args.spy + 10)
            shutil.rmtree(events_dir(dsn), ignore_errors=True)
    bound = args.workers * args.concurrency / 0.05
    print(
        f"{args.tree} {args.workers} x {args.concurrency}: {first[1] / seconds:,.0f} jobs/s "
        f"(bound {bound:,.0f}), {1e6 * cpu / first[1]:.1f} us CPU per job (master + children)"
    )


def _cpu_seconds(master: Worker) -> float:
    return sum(tree_cpu(master.pid).values())


def _busiest_child(master: Worker) -> int:
    return max(children_of(master.pid), key=lambda pid: cpu_of(pid) or 0.0)


def start_spy(pid: int, seconds: int, out: str) -> subprocess.Popen[bytes]:
    py_spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    argv = [py_spy, "record", "-p", str(pid), "-d", str(seconds), "-r", "250"]
    argv += ["--format", "raw", "-o", out, "--nonblocking"]
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = ap.add_subparsers(dest="measure", required=True)
    commands: dict[str, Callable[[argparse.Namespace], None]] = {
        "drain": drain,
        "bulk": bulk,
        "enqueue": enqueue,
        "io": io,
        "cpu": cpu,
    }
    d = sub.add_parser("drain", help="no-op drains (and a bulk enqueue) of each tree")
    b = sub.add_parser("bulk", help="one enqueue_many of each tree")
    e = sub.add_parser("enqueue", help="single enqueues of each tree, pgbench's insert")
    i = sub.add_parser("io", help="one drain of 50 ms async jobs by one tree")
    c = sub.add_parser("cpu", help="CPU-bound drains of each tree: their parallelism")
    for p, jobs, rounds in ((d, 100_000, 5), (b, 100_000, 5), (e, 1000, 15), (c, 200, 5)):
        p.add_argument("--dsn", required=True, help="admin DSN (CREATE DATABASE)")
        p.add_argument("--jobs", type=int, default=jobs)
        p.add_argument("--rounds", type=int, default=rounds)
    for p in (d, b, c):
        p.add_argument(
            "--own-schema", action="store_true", help="migrate each tree's database with its own"
        )
    d.add_argument("--async", dest="aio", action="store_true", help="async def handlers")
    d.add_argument("--concurrency", type=int, default=100, help="with --async")
    d.add_argument(
        "--bulk-jobs",
        type=int,
        default=100_000,
        help="each round, each tree also enqueues this many jobs in one enqueue_many "
        "(bulk's measure, in a database of its own; 0: no bulk enqueue)",
    )
    d.add_argument("trees", nargs="+", help="TREE or TREE,NAME=VALUE,...")
    b.add_argument(
        "--chunk",
        type=int,
        default=0,
        help="enqueue_many calls of this many jobs, each Job made in the timed loop, as "
        "make bench's bulk workload does (default: all the jobs in one call, made before)",
    )
    b.add_argument("trees", nargs="+")
    c.add_argument("trees", nargs="+")
    e.add_argument("--placement", default="free", choices=PLACEMENTS)
    e.add_argument("variants", nargs="+")
    i.add_argument("tree", type=Path)
    i.add_argument("--jobs", type=int, default=40_000)
    i.add_argument("--workers", type=int, default=2)
    i.add_argument("--concurrency", type=int, default=500)
    i.add_argument("--dsn", default="postgresql://postgres@127.0.0.1:5432/postgres")
    i.add_argument("--spy", type=int, default=0, help="seconds of py-spy on the busiest child")
    i.add_argument("--spy-out", default="io-probe-spy.txt")
    args = ap.parse_args(argv)
    commands[args.measure](args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
