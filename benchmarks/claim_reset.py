"""What the claim's `progress = NULL, progress_message = NULL` costs: the claim statement
(job_finish_and_claim, LIMIT jobs a claim) with and without those two assignments, claims
alternated over one pool of ready jobs whose progress is set, timed per statement from
the client (autocommit: the commit included), prepared as a child prepares it.

Run by hand (never part of `make test`); a minute on 2 cores:

    .venv/bin/python benchmarks/claim_reset.py [--dsn ADMIN_DSN] [--jobs 200000]
        [--limit 256]

Prints the median milliseconds per claim of each and the difference per job.
"""

from __future__ import annotations

import argparse
import statistics
import time

import psycopg
from brooq.sql import Q

from common import DEFAULT_DSN, fresh_database, migrate_tree

RESET = "        progress = NULL, progress_message = NULL,\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dsn", default=DEFAULT_DSN)
    parser.add_argument("--jobs", type=int, default=200_000)
    parser.add_argument("--limit", type=int, default=256)
    args = parser.parse_args()
    with_reset = Q.job_finish_and_claim
    assert with_reset.count(RESET) == 1, "the claim no longer resets progress this way"
    without = with_reset.replace(RESET, "")
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
    with fresh_database(args.dsn, "claimreset") as dsn:
        migrate_tree(dsn)
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(
                "INSERT INTO job (topic, progress, progress_message) "
                "SELECT 't', 0.4, 'an earlier attempt''s' FROM generate_series(1, %s)",
                (args.jobs,),
            )
            conn.execute("VACUUM ANALYZE job")
            conn.execute("SET plan_cache_mode = force_generic_plan")
            statements = {"without": without, "with": with_reset}
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
            left = conn.execute(
                "SELECT count(*) FROM job WHERE state = 'processing' AND progress IS NOT NULL"
            ).fetchone()
    print(f"claims of {args.limit}: {len(times['with'])} each, alternated")
    for name, values in times.items():
        print(f"{name} the reset: median {statistics.median(values):.3f} ms a claim")
    diff = statistics.median(times["with"]) - statistics.median(times["without"])
    print(f"difference: {diff * 1000 / args.limit:+.2f} us a job")
    print(f"claimed by the plain statement, progress kept: {left[0] if left else '?'}")


if __name__ == "__main__":
    main()
