"""What one assignment of the claim's UPDATE costs: the claim statement
(job_finish_and_claim, LIMIT jobs a claim) with and without it, claims alternated over one
pool of ready jobs, timed per statement from the client (autocommit: the commit
included), prepared as a child prepares it. The assignments measured:

- ``progress``: ``progress = NULL, progress_message = NULL`` (each attempt starts with
  no progress; the pool's rows carry an earlier attempt's);
- ``started_at``: ``started_at = now()`` (the attempt's start, kept once it ended).

Run by hand (never part of `make test`); a minute on 2 cores:

    .venv/bin/python benchmarks/claim_assignment.py progress|started_at [--dsn ADMIN_DSN]
        [--jobs 200000] [--limit 256] [--rounds 1]

Prints the median milliseconds per claim of each and the difference per job.
"""

from __future__ import annotations

import argparse
import statistics
import time

import psycopg
from brooq.sql import Q

from common import DEFAULT_DSN, fresh_database, migrate_tree

# The assignment as the claim statement spells it, the pool's INSERT, and the count of
# rows the assignment wrote at the end (a check that the claims ran it).
ASSIGNMENTS = {
    "progress": (
        "        progress = NULL, progress_message = NULL,\n",
        "INSERT INTO job (topic, progress, progress_message) "
        "SELECT 't', 0.4, 'an earlier attempt''s' FROM generate_series(1, %s)",
        "SELECT count(*) FROM job WHERE state = 'processing' AND progress IS NULL",
    ),
    "started_at": (
        "        -- The attempt's start, kept once it ended (updated_at is then its end).\n"
        "        started_at = now(),\n",
        "INSERT INTO job (topic) SELECT 't' FROM generate_series(1, %s)",
        "SELECT count(started_at) FROM job",
    ),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("assignment", choices=sorted(ASSIGNMENTS))
    parser.add_argument("--dsn", default=DEFAULT_DSN)
    parser.add_argument("--jobs", type=int, default=200_000)
    parser.add_argument("--limit", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=1, help="the pool claimed this many times")
    args = parser.parse_args()
    fragment, fill, written = ASSIGNMENTS[args.assignment]
    with_it = Q.job_finish_and_claim
    assert with_it.count(fragment) == 1, f"the claim no longer writes {args.assignment} this way"
    statements = {"without": with_it.replace(fragment, ""), "with": with_it}
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
    with fresh_database(args.dsn, "claimassign") as dsn:
        migrate_tree(dsn)
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(fill, (args.jobs,))
            conn.execute("VACUUM ANALYZE job")
            conn.execute("SET plan_cache_mode = force_generic_plan")
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
            count = conn.execute(written).fetchone()
    print(f"claims of {args.limit}: {len(times['with'])} each, alternated")
    for name, values in times.items():
        print(f"{name} {args.assignment}: median {statistics.median(values):.3f} ms a claim")
    diff = statistics.median(times["with"]) - statistics.median(times["without"])
    print(f"difference: {diff * 1000 / args.limit:+.2f} us a job")
    print(f"rows the assignment wrote: {count[0] if count else '?'}")


if __name__ == "__main__":
    main()
