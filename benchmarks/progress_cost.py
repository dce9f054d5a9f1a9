"""What claim.progress() costs: one call in a child (the board write), and a drain of
JOBS jobs by a master of 2 children whose handlers report progress 0, 1 or 10 times per
job, alternated for ROUNDS rounds in one database of this tree's schema (sync children,
then --async).

Run by hand (never part of `make test`); a few minutes on 2 cores:

    .venv/bin/python benchmarks/progress_cost.py [--dsn ADMIN_DSN] [--jobs 20000]
        [--rounds 3] [--async]

Prints the per-call cost, each round's jobs/s and the medians.
"""

from __future__ import annotations

import argparse
import statistics
import time
import types
import uuid

import brooq
import psycopg
from brooq.ipc import progress
from brooq.ipc.board import Board
from brooq.worker.process import ChildProcess

from common import (  # the benchmark's own modules, next to this file
    DEFAULT_DSN,
    fresh_database,
    migrate_tree,
    start_master,
)

TOPICS = ("bench.noop", "bench.progress1", "bench.progress10")


def per_call(calls: int = 200_000) -> tuple[float, float]:
    """Microseconds per claim.progress(): in a child (its sink: the message made storable,
    the board written) and without a sink (brooq.testing, a direct call)."""
    board = Board(capacity=1)
    claim = brooq.Claim(uuid.uuid4(), "t", {}, 1, "w", None)  # type: ignore[arg-type]
    board.post(claim.id, "t", 1, time.monotonic(), 60.0, 30.0)
    # A UTF-8 database: the codec a child keeps is None (brooq.worker.connection).
    child = types.SimpleNamespace(board=board, db=types.SimpleNamespace(codec=None))
    timings = []
    for sink in (lambda *a: ChildProcess._progress(child, *a), None):  # type: ignore[arg-type]
        progress.sink = sink
        started = time.perf_counter()
        for _ in range(calls):
            claim.progress(0.5, "step 3 of 8")
        timings.append((time.perf_counter() - started) / calls * 1e6)
    progress.sink = None
    assert board.reports() == calls
    board.close()
    return timings[0], timings[1]


def drain(dsn: str, jobs: int, topic: str, is_async: bool) -> float:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("TRUNCATE job CASCADE")
        queue = brooq.Queue(dsn)
        queue.enqueue_many([brooq.Job(topic) for _ in range(jobs)])
        queue.close()
        conn.execute("VACUUM ANALYZE job")
        env = {"BENCH_PROGRESS_ASYNC": "1"} if is_async else {}
        master = start_master(dsn, 2, app="bench_brooq_progress_app:queue", env=env, quiet=True)
        try:
            # Timed from the first done job on: the children's start is not the drain's.
            left = "SELECT count(*) FROM job WHERE state <> 'done'"
            while (waiting := conn.execute(left).fetchone()[0]) == jobs:  # type: ignore[index]
                if not master.alive():
                    raise RuntimeError(master.log_tail())
                time.sleep(0.005)
            started = time.monotonic()
            while conn.execute(left).fetchone()[0]:  # type: ignore[index]
                if not master.alive():
                    raise RuntimeError(master.log_tail())
                time.sleep(0.02)
            rate = waiting / (time.monotonic() - started)
            unwritten = conn.execute(
                "SELECT count(*) FROM job WHERE topic <> 'bench.noop' AND progress IS NULL"
            ).fetchone()[0]  # type: ignore[index]
            assert unwritten == 0, f"{unwritten} jobs without their last progress"
            return rate
        finally:
            master.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dsn", default=DEFAULT_DSN)
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--async", dest="is_async", action="store_true")
    args = parser.parse_args()
    in_child, bare = per_call()
    print(f"claim.progress(): {in_child:.2f} us in a child, {bare:.2f} us without a sink")
    rates: dict[str, list[float]] = {t: [] for t in TOPICS}
    with fresh_database(args.dsn, "progress") as dsn:
        migrate_tree(dsn)
        for r in range(args.rounds):
            for topic in TOPICS:
                rate = drain(dsn, args.jobs, topic, args.is_async)
                rates[topic].append(rate)
                print(f"round {r}: {topic}: {rate:,.0f} jobs/s", flush=True)
    kind = "async" if args.is_async else "sync"
    for topic, values in rates.items():
        print(
            f"{kind} {topic}: median {statistics.median(values):,.0f} jobs/s "
            f"({min(values):,.0f}-{max(values):,.0f})"
        )


if __name__ == "__main__":
    main()
