"""What the claim's `started_at = now()` costs: the claim statement (job_finish_and_claim,
LIMIT jobs a claim) with and without that assignment, claims alternated over one pool of
ready jobs, timed per statement from the client (autocommit: the commit included),
prepared as a child prepares it (as benchmarks/claim_reset.py does for the progress).

Run by hand (never part of `make test`); a minute on 2 cores:

    .venv/bin/python benchmarks/claim_started.py [--dsn ADMIN_DSN] [--jobs 200000]
        [--limit 256] [--rounds 1]

Prints the median milliseconds per claim of each and the difference per job.
"""

from __future__ import annotations

import argparse
import statistics
import time

import psycopg
from brooq.sql import Q

from common import DEFAULT_DSN, fresh_database, migrate_tree

STARTED = (
    "        -- The attempt's start, kept once it ended (updated_at is then its end).\n"
    "        started_at = now(),\n"
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dsn", default=DEFAULT_DSN)
    parser.add_argument("--jobs", type=int, default=200_000)
    parser.add_argument("--limit", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=1, help="the pool claimed this many times")
    args = parser.parse_args()
    with_start = Q.job_finish_and_claim
    assert with_start.count(STARTED) == 1, "the claim no longer sets started_at this way"
    without = with_start.replace(STARTED, "")
    params = {
        "done": [],
        "topics": ["t"],
        "limit": args.limit,
        "children": 1,
        "worker": "bench",
        "lease": 30.0,
        "queue": "default",
    }
    times: dict[str, list[float]] = {"without": [], "with": []}
    with fresh_database(args.dsn, "claimstarted") as dsn:
        migrate_tree(dsn)
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(
                "INSERT INTO job (topic) SELECT 't' FROM generate_series(1, %s)", (args.jobs,)
            )
            conn.execute("VACUUM ANALYZE job")
            conn.execute("SET plan_cache_mode = force_generic_plan")
            statements = {"without": without, "with": with_start}
            for round_ in range(args.rounds):
                if round_:  # the pool ready again, vacuumed, for the next round
                    conn.execute("UPDATE job SET state = 'pending', locked_by = NULL, "
                                 "locked_until = NULL")  # fmt: skip
                    conn.execute("VACUUM ANALYZE job")
                while True:
                    got = 0
                    for name, statement in statements.items():
                        started = time.perf_counter()
                        rows = conn.execute(statement, params, prepare=True).fetchall()
                        elapsed = time.perf_counter() - started
                        if len(rows) == args.limit:
                            times[name].append(elapsed * 1000)
                        got += len(rows)
                    if got < 2 * args.limit:
                        break
            set_ = conn.execute("SELECT count(started_at) FROM job").fetchone()
    print(f"claims of {args.limit}: {len(times['with'])} each, alternated")
    for name, values in times.items():
        print(f"{name} started_at: median {statistics.median(values):.3f} ms a claim")
    diff = statistics.median(times["with"]) - statistics.median(times["without"])
    print(f"difference: {diff * 1000 / args.limit:+.2f} us a job")
    print(f"rows whose started_at the claims set: {set_[0] if set_ else '?'}")


if __name__ == "__main__":
    main()
