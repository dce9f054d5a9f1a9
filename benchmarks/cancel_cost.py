"""What a cancel that stops its handler costs, and how long a purge takes.

1. job_cancel before and after it notifies: the statement that reads the row's state
   under its lock, against the plain UPDATE it replaced, on pending jobs (which notify
   nothing) and on processing ones (which notify), CANCELS each, ROUNDS rounds alternated.
2. From a cancel's commit to the handler hearing brooq.LeaseLost: a master of 2 children,
   a lease of 30 s (its renewal every 10 s), a handler spinning in pure Python, canceled
   SAMPLES times (wall clock, one host).
3. Queue.purge of PURGE pending jobs in one queue beside a tenth as many in another: the
   whole purge and its longest batch (each batch its own transaction).

Run by hand (never part of `make test`), a few minutes on 2 cores:

    .venv/bin/python benchmarks/cancel_cost.py [--dsn ADMIN_DSN] [--purge 1000000]
"""

from __future__ import annotations

import argparse
import statistics
import time
import uuid
from typing import Any

import brooq
import psycopg
from brooq.job import CANCELABLE_STATES
from brooq.operator import changes
from brooq.sql import Q

from common import DEFAULT_DSN, fresh_database, migrate_tree, start_master

# job_cancel as it was before it notified: the plain guarded UPDATE.
PLAIN_CANCEL = """UPDATE job SET state = 'canceled', updated_at = now()
WHERE id = %(id)s AND state = ANY(%(from_states)s::text[])
RETURNING id"""


def statement_cost(dsn: str, cancels: int, rounds: int) -> dict[str, list[float]]:
    """Microseconds per cancel (a round trip in autocommit, the commit not flushed), per
    variant and job state."""
    times: dict[str, list[float]] = {}
    states = list(CANCELABLE_STATES)
    with psycopg.connect(dsn, autocommit=True) as conn:
        # The commit's flush would be most of a round trip, and the same for both.
        conn.execute("SET synchronous_commit = off")
        for _ in range(rounds):
            for variant, text in (("plain", PLAIN_CANCEL), ("notifying", Q.job_cancel)):
                for state in ("pending", "processing"):
                    ids = [uuid.uuid4() for _ in range(cancels)]
                    with conn.cursor().copy(
                        "COPY job (id, topic, state, locked_by, locked_until) FROM STDIN"
                    ) as copy:
                        for i in ids:
                            held = state == "processing"
                            copy.write_row(
                                (
                                    i,
                                    "bench.cancel",
                                    state,
                                    "w" if held else None,
                                    "2100-01-01" if held else None,
                                )
                            )
                    started = time.perf_counter()
                    for i in ids:
                        conn.execute(text, {"id": i, "from_states": states}).fetchone()
                    us = (time.perf_counter() - started) / cancels * 1e6
                    times.setdefault(f"{variant} {state}", []).append(us)
    return times


def latency(dsn: str, samples: int) -> list[float]:
    """Seconds from each cancel's commit to its handler's LeaseLost."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE bench_cancel (job text, kind text, t double precision)")
    queue = brooq.Queue(dsn)
    master = start_master(
        dsn, 2, app="bench_brooq_cancel_app:queue", env={"QUEUE_LEASE": "30s"}, quiet=True
    )
    found = []
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:

            def note(job: uuid.UUID, kind: str) -> float | None:
                row = conn.execute(
                    "SELECT t FROM bench_cancel WHERE job = %s AND kind = %s", (str(job), kind)
                ).fetchone()
                return None if row is None else float(row[0])

            for _ in range(samples):
                job, _ = queue.enqueue(brooq.Job("bench.spin"))
                while note(job, "start") is None:
                    time.sleep(0.01)
                assert queue.cancel(job)
                canceled = time.time()
                while (lost := note(job, "lost")) is None:
                    time.sleep(0.005)
                found.append(lost - canceled)
    finally:
        master.stop()
        queue.close()
    return found


def purge_time(dsn: str, jobs: int) -> dict[str, Any]:
    """The purge of ``jobs`` pending jobs of one queue: its seconds, batches, longest one."""
    queue = brooq.Queue(dsn)
    for name, n in (("bulk", jobs), ("other", jobs // 10)):
        for start in range(0, n, 100_000):
            queue.enqueue_many(
                [brooq.Job("bench.purge", queue=name) for _ in range(min(100_000, n - start))]
            )
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE job")
    batches: list[float] = []
    with psycopg.connect(dsn) as conn:
        cur = conn.cursor(row_factory=psycopg.rows.dict_row)
        params: dict[str, Any] = {
            **changes.check_purge(queue="bulk", topic=None, batch_size=changes.BULK_BATCH_SIZE),
            "as_of": None,
            "batch": changes.BULK_BATCH_SIZE,
            "after": uuid.UUID(int=0),
        }
        started = time.perf_counter()
        purged = 0
        while True:
            t0 = time.perf_counter()
            batch = cur.execute(Q.job_purge_batch, params).fetchone()
            conn.commit()
            batches.append(time.perf_counter() - t0)
            purged += int(batch["changed"])
            if batch["picked"] < changes.BULK_BATCH_SIZE:
                break
            params["after"], params["as_of"] = batch["last_id"], batch["as_of"]
        total = time.perf_counter() - started
    left = queue.purge(queue="other", dry_run=True)
    queue.close()
    return {
        "purged": purged,
        "seconds": total,
        "batches": len(batches),
        "longest_batch_ms": max(batches) * 1000,
        "other_queue_left": left,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dsn", default=DEFAULT_DSN)
    parser.add_argument("--cancels", type=int, default=5_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--samples", type=int, default=20)
    parser.add_argument("--purge", type=int, default=1_000_000)
    args = parser.parse_args()
    with fresh_database(args.dsn, "cancel") as dsn:
        migrate_tree(dsn)
        for name, values in statement_cost(dsn, args.cancels, args.rounds).items():
            print(
                f"job_cancel {name}: {[round(v, 1) for v in values]} µs, "
                f"median {statistics.median(values):.1f} µs"
            )
    with fresh_database(args.dsn, "cancel_lat") as dsn:
        migrate_tree(dsn)
        found = sorted(latency(dsn, args.samples))
        print(
            f"cancel -> LeaseLost over {len(found)} cancels: median "
            f"{statistics.median(found) * 1000:.1f} ms, max {found[-1] * 1000:.1f} ms"
        )
    with fresh_database(args.dsn, "purge") as dsn:
        migrate_tree(dsn)
        print(f"purge: {purge_time(dsn, args.purge)}")


if __name__ == "__main__":
    main()
