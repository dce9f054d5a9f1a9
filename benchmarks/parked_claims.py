"""What parked jobs cost the claim of ready ones: a no-op drain of READY jobs by a master of
2 children, beside none and beside PARKED durable jobs (half sleeping a day, half waiting
for an event), alternated for ROUNDS rounds in one database of this tree's schema.

Run by hand (never part of `make test`); a few minutes on 2 cores:

    .venv/bin/python benchmarks/parked_claims.py [--dsn ADMIN_DSN] [--ready 20000]
        [--parked 10000] [--rounds 3]

Prints each round's jobs/s and the medians; the difference is the parked jobs' cost.
"""

from __future__ import annotations

import argparse
import statistics
import time

import brooq
import psycopg

from common import (  # the benchmark's own modules, next to this file
    DEFAULT_DSN,
    fresh_database,
    migrate_tree,
    start_master,
)

PARK = """
INSERT INTO job (id, topic, payload, state, available_at, parked)
SELECT gen_random_uuid(), 'bench.noop', '{}'::jsonb,
       CASE WHEN i %% 2 = 0 THEN 'pending' ELSE 'waiting' END,
       CASE WHEN i %% 2 = 0 THEN now() + interval '1 day' ELSE now() END,
       CASE WHEN i %% 2 = 0 THEN 'sleep' ELSE 'event' END
FROM generate_series(1, %(n)s) AS i
"""
WAITS = """
INSERT INTO brooq_event_wait (job_id, key)
SELECT id, 'bench-' || id FROM job WHERE parked = 'event'
"""


def drain(dsn: str, ready: int, parked: int) -> float:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("TRUNCATE job CASCADE")
        if parked:
            conn.execute(PARK, {"n": parked})
            conn.execute(WAITS)
        queue = brooq.Queue(dsn)
        queue.enqueue_many([brooq.Job("bench.noop") for _ in range(ready)])
        queue.close()
        conn.execute("VACUUM ANALYZE job")
        master = start_master(dsn, 2, quiet=True)
        try:
            started = time.monotonic()
            left = "SELECT count(*) FROM job WHERE state <> 'done' AND parked IS NULL"
            while conn.execute(left).fetchone()[0]:  # type: ignore[index]
                if not master.alive():
                    raise RuntimeError(master.log_tail())
                time.sleep(0.05)
            return ready / (time.monotonic() - started)
        finally:
            master.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dsn", default=DEFAULT_DSN)
    parser.add_argument("--ready", type=int, default=20_000)
    parser.add_argument("--parked", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    rates: dict[int, list[float]] = {0: [], args.parked: []}
    with fresh_database(args.dsn, "parked") as dsn:
        migrate_tree(dsn)
        for r in range(args.rounds):
            for parked in (0, args.parked):
                rate = drain(dsn, args.ready, parked)
                rates[parked].append(rate)
                print(f"round {r}: {parked:,} parked: {rate:,.0f} jobs/s", flush=True)
    for parked, values in rates.items():
        print(
            f"{parked:,} parked: median {statistics.median(values):,.0f} jobs/s "
            f"({min(values):,.0f}-{max(values):,.0f})"
        )


if __name__ == "__main__":
    main()
