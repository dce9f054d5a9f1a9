"""The fan-in workload: N no-op jobs and one callback that waits for all of them
(`Job(after=[...])`), beside a plain drain of the same N jobs.

    python benchmarks/fan_in.py [--dsn ADMIN_DSN] [--jobs 10000] [--rounds 3]
                                [--workers 2] [--quick] [--out results/NAME.json]

Each round drains, in a fresh database each, first N plain no-op jobs, then the same N
with one more job created in the same enqueue_many call and named after all of them
(each no-op's `done` then also counts down the callback's counter, in its transaction),
with `brooq-master --workers N`. Reported per round and as medians: the drain rate from
the first job done to the last (from the rows' own updated_at), the fan-in's over the
plain one, and the callback's delay: from the last upstream job's `done` to the
callback's own `done` (its release, its claim and its run). The enqueue of the graph
(COPY, then the edges in one statement) is timed too.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (
    choose_admin_dsn,
    fresh_database,
    log,
    start_master,
)

ANY_LEFT = (
    "SELECT EXISTS (SELECT 1 FROM job WHERE state IN ('pending', 'failed', 'waiting'))"
    " OR EXISTS (SELECT 1 FROM job WHERE state = 'processing')"
)


def drain(admin: str, jobs: int, workers: int, fan_in: bool) -> dict[str, Any]:
    import brooq
    from brooq import migrate

    with fresh_database(admin, "fan_in" if fan_in else "plain") as dsn:
        migrate.up(dsn)
        batch = [brooq.Job("bench.noop", {"i": i}) for i in range(jobs)]
        if fan_in:
            batch.append(brooq.Job("bench.noop", {"callback": True}, after=list(batch)))
        with psycopg.connect(dsn) as conn:
            t0 = time.perf_counter()
            ids = brooq.enqueue_many(conn, batch)
            conn.commit()
            enqueue_s = time.perf_counter() - t0
        env = {"QUEUE_RETENTION_TTL": "0s"}
        master = start_master(dsn, workers, env=env, name="brooq-fan-in")
        try:
            with psycopg.connect(dsn, autocommit=True) as conn:
                deadline = time.monotonic() + 600
                while conn.execute(ANY_LEFT).fetchone() == (True,):
                    if not master.alive():
                        raise RuntimeError(f"master exited:\n{master.log_tail()}")
                    if time.monotonic() > deadline:
                        raise TimeoutError("the drain took over 10 minutes")
                    time.sleep(0.2)
                # Finished jobs are in job_history; job_all is both tables.
                row = conn.execute(
                    "SELECT count(*), extract(epoch FROM max(updated_at) - min(updated_at))"
                    " FROM job_all WHERE state = 'done' AND upstream_open IS NULL"
                ).fetchone()
                assert row is not None
                count, seconds = int(row[0]), float(row[1] or 0.0)
                result: dict[str, Any] = {
                    "jobs": count,
                    "seconds": round(seconds, 3),
                    "jobs_per_s": round(count / seconds) if seconds else None,
                    "enqueue_s": round(enqueue_s, 3),
                }
                if fan_in:
                    delay = conn.execute(
                        "SELECT extract(epoch FROM c.updated_at - (SELECT max(updated_at)"
                        " FROM job_all WHERE upstream_open IS NULL AND id <> c.id)),"
                        " c.state, c.attempts FROM job_all c WHERE c.id = %s",
                        (ids[-1][0],),
                    ).fetchone()
                    assert delay is not None and delay[1] == "done" and delay[2] == 1, delay
                    result["callback_delay_ms"] = round(1000 * float(delay[0]), 1)
        finally:
            master.stop()
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--dsn", help="an admin DSN (default: 127.0.0.1:5432, else embedded)")
    ap.add_argument("--jobs", type=int, default=10_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="one round")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    if args.quick:
        args.rounds = 1
    admin, where = choose_admin_dsn(args.dsn)
    rounds = []
    for n in range(args.rounds):
        plain = drain(admin, args.jobs, args.workers, fan_in=False)
        log(f"round {n} plain: {plain}")
        fan = drain(admin, args.jobs, args.workers, fan_in=True)
        log(f"round {n} fan-in: {fan}")
        rounds.append({"plain": plain, "fan_in": fan})
    plain_rate = statistics.median(r["plain"]["jobs_per_s"] for r in rounds)
    fan_rate = statistics.median(r["fan_in"]["jobs_per_s"] for r in rounds)
    report = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "server": where,
        "jobs": args.jobs,
        "workers": args.workers,
        "rounds": rounds,
        "plain_jobs_per_s": plain_rate,
        "fan_in_jobs_per_s": fan_rate,
        "fan_in_over_plain": round(fan_rate / plain_rate, 3),
        "callback_delay_ms": statistics.median(r["fan_in"]["callback_delay_ms"] for r in rounds),
    }
    text = json.dumps(report, indent=2)
    if args.out:
        args.out.write_text(text + "\n")
    print(
        f"{args.jobs:,} no-op jobs, --workers {args.workers}, median of {args.rounds}: plain "
        f"{plain_rate:,} jobs/s; with one callback after all of them {fan_rate:,} jobs/s "
        f"({report['fan_in_over_plain']:.0%}); the callback done "
        f"{report['callback_delay_ms']} ms after the last of them"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
