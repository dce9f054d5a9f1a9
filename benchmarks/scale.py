"""The scale workload: brooq beside a long history of finished jobs, then retention.

    python benchmarks/scale.py [--dsn ADMIN_DSN] [--history 10000000] [--ready 1000000]
                               [--workers 2] [--history-in job_history|job] [--quick]
                               [--out results/NAME.json]

Two databases, fresh, the same code and settings:

- small: READY ready no-op jobs and nothing else;
- big:   the same READY ready jobs beside HISTORY finished rows (done, UUIDv7 ids and
  timestamps spread over 30 days ending a day and an hour ago, as a month of history
  under the default retention would be; VACUUM ANALYZEd, as autovacuum would have left
  them). By default they are in job_history, in daily partitions made in place
  (as the migration makes today's), where the claim statement's done puts finished jobs; with
  --history-in job, in job itself (terminal rows left there from before migration
  0020). Retention is off while it drains.

For each: the drain rate of the READY jobs with `brooq-master --workers N`, taken from
the done rows' own updated_at (first to last finished; the driver only asks "any left?"
every second, through the ready index, so it adds no load that grows with the history);
then the pickup latency (PICKUP single jobs, one at a time, from the producer's commit
to the handler's start, as run.py's pickup workload); job's and job_history's table and
index sizes and dead tuples sampled every 2 s. Then, on the big one only, retention
while a producer feeds single jobs one at a time: in job_history, each partition ended
over a day ago released and dropped in turn (brooq_history_release, then
brooq_history_drop under lock_timeout 1 s: the master's upkeep), each call's database
time recorded; in job, the master's row-by-row retention (QUEUE_RETENTION_TTL=1d, a
period of 1 s, batches of QUEUE_RETENTION_BATCH). The pickup p50/p95/p99 of those jobs
is the claim latency an application sees during retention.

Prints one JSON document (and writes it to --out): per database, jobs/s, pickup p50/p95,
sizes and dead tuples over time; the big/small ratios (the target: the drain beside the
history at 95 % of the drain beside none).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (  # the benchmark's own modules, next to this file
    Worker,
    choose_admin_dsn,
    fresh_database,
    log,
    master_env,
    percentile,
    start_master,
)

PICKUP = 200
DAY = 86400

# A UUIDv7 for a given time, in SQL (PostgreSQL 15 has no uuidv7()): the 48-bit
# millisecond timestamp over a random v4, whose version nibble becomes 7 (0100 -> 0111).
UUID7 = """
CREATE FUNCTION pg_temp.bench_uuid7(ts timestamptz) RETURNS uuid LANGUAGE sql AS $$
  SELECT encode(set_bit(set_bit(overlay(uuid_send(gen_random_uuid())
         PLACING substring(int8send((extract(epoch FROM ts) * 1000)::bigint) FROM 3)
         FROM 1 FOR 6), 52, 1), 53, 1), 'hex')::uuid
$$
"""

# One chunk of finished history: done rows created in order over 30 days, the newest a
# day and an hour old (so that retention with a TTL of one day removes all of them).
# Into job_history (its daily partitions made first), or into job (--history-in job:
# the table before migration 0020, its terminal rows kept in place).
HISTORY_CHUNK = """
INSERT INTO {table} (id, topic, payload, state, attempts, available_at, created_at,
                     updated_at)
SELECT pg_temp.bench_uuid7(t), 'bench.noop', '{{"i": 0}}'::jsonb, 'done', 1, t, t,
       t + interval '20 ms'
FROM (SELECT now() - interval '31 days'
             + interval '29 days 23 hours' * (g::float8 / %(total)s) AS t
      FROM generate_series(%(first)s, %(last)s) AS g) AS s
"""

READY = """
INSERT INTO job (id, topic, payload)
SELECT pg_temp.bench_uuid7(clock_timestamp()), 'bench.noop', jsonb_build_object('i', g)
FROM generate_series(1, %(n)s) AS g
"""

SIZES = """
WITH h AS (SELECT t.relid FROM pg_partition_tree('job_history') t WHERE t.isleaf)
SELECT pg_table_size('job') AS table_bytes, pg_indexes_size('job') AS index_bytes,
       n_live_tup, n_dead_tup, autovacuum_count, vacuum_count,
       age(c.relfrozenxid) AS xid_age,
       (SELECT coalesce(sum(pg_table_size(relid)), 0) FROM h) AS history_table_bytes,
       (SELECT coalesce(sum(pg_indexes_size(relid)), 0) FROM h) AS history_index_bytes,
       (SELECT coalesce(sum(u.n_dead_tup), 0) FROM pg_stat_user_tables u
        WHERE u.relid IN (SELECT relid FROM h)) AS history_dead_tup,
       (SELECT count(*) FROM h) - 1 AS partitions
FROM pg_stat_user_tables s JOIN pg_class c ON c.oid = s.relid
WHERE s.relname = 'job'
"""

# Through the partial ready index (its predicate), so the look does not grow with history.
ANY_LEFT = (
    "SELECT EXISTS (SELECT 1 FROM job WHERE state IN ('pending', 'failed'))"
    " OR EXISTS (SELECT 1 FROM job WHERE state = 'processing')"
)


class Sampler(threading.Thread):
    """Sizes and dead tuples every `every` seconds until stopped."""

    def __init__(self, dsn: str, every: float = 2.0) -> None:
        super().__init__(daemon=True)
        self.dsn, self.every = dsn, every
        self.samples: list[dict[str, Any]] = []
        self.done = threading.Event()
        self.t0 = time.monotonic()

    def run(self) -> None:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            while not self.done.is_set():
                cur = conn.cursor(row_factory=psycopg.rows.dict_row)
                row = cur.execute(SIZES).fetchone()
                if row:
                    self.samples.append({"t": round(time.monotonic() - self.t0, 1), **row})
                self.done.wait(self.every)

    def stop(self) -> list[dict[str, Any]]:
        self.done.set()
        self.join(10)
        return self.samples


def build(dsn: str, history: int, ready: int, table: str = "job_history") -> dict[str, Any]:
    from brooq import migrate
    from psycopg import sql

    from history_retention import make_partitions

    migrate.up(dsn)
    t0 = time.monotonic()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(UUID7)
        # Daily partitions from the oldest row's day to the day after tomorrow.
        days = conn.execute(
            "SELECT now() - interval '32 days', now() + interval '2 days'"
        ).fetchone()
        assert days is not None
        make_partitions(conn, 86400, days[0], days[1])
        chunk = 1_000_000
        insert = sql.SQL(HISTORY_CHUNK).format(table=sql.Identifier(table))
        for first in range(1, history + 1, chunk):
            last = min(first + chunk - 1, history)
            conn.execute(insert, {"first": first, "last": last, "total": history})
            log(f"  history {last:,} / {history:,} into {table}")
        if history:
            # VACUUM of a partitioned table vacuums each partition.
            conn.execute(sql.SQL("VACUUM (ANALYZE) {}").format(sql.Identifier(table)))
        conn.execute(READY, {"n": ready})
        conn.execute("ANALYZE job")
        conn.execute("CHECKPOINT")
    return {"build_s": round(time.monotonic() - t0, 1)}


MASTER_ENV: dict[str, str] = {}  # --master-env: settings for every master of the run


def start_master_of(dsn: str, workers: int, extra: dict[str, str]) -> Worker:
    env = {"QUEUE_RETENTION_TTL": "0s", **MASTER_ENV, **extra}
    return start_master(dsn, workers, env=env, name="brooq-scale")


def drain(dsn: str, workers: int, ready: int) -> dict[str, Any]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        start = conn.execute("SELECT now()").fetchone()
    master = start_master_of(dsn, workers, {})
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            deadline = time.monotonic() + 3600
            while conn.execute(ANY_LEFT).fetchone() == (True,):
                if not master.alive():
                    raise RuntimeError(f"master exited:\n{master.log_tail()}")
                if time.monotonic() > deadline:
                    raise TimeoutError("drain took over an hour")
                time.sleep(1.0)
            # The ready rows are the only ones that ended since the drain's start (the
            # history ended over a day ago, an earlier round before it).
            row = conn.execute(
                "SELECT count(*), extract(epoch FROM max(updated_at) - min(updated_at))"
                " FROM job_all WHERE state = 'done' AND updated_at > %s",
                (start[0] if start else None,),
            ).fetchone()
        assert row is not None
        count, seconds = int(row[0]), float(row[1] or 0.0)
        return {"jobs": count, "seconds": round(seconds, 2), "jobs_per_s": round(count / seconds)}
    finally:
        master.stop()


def _enqueue_and_time(queue: Any, conn: psycopg.Connection[Any], key: str) -> float | None:
    import brooq

    queue.enqueue(brooq.Job("bench.pickup", {"k": key}))
    committed = time.time()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        row = conn.execute(
            "SELECT min(t) FROM bench_event WHERE job = %s AND kind = 'start'", (key,)
        ).fetchone()
        if row and row[0] is not None:
            return (float(row[0]) - committed) * 1000
        time.sleep(0.002)
    return None


def pickup(dsn: str, workers: int, n: int, extra: dict[str, str] | None = None) -> dict[str, Any]:
    """n single jobs one at a time, each after the last one started (the queue idle)."""
    import brooq

    master = start_master_of(dsn, workers, extra or {})
    queue = brooq.Queue(dsn)
    latencies: list[float] = []
    missed = 0
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            for i in range(5):  # warm up: the children are up and idle
                _enqueue_and_time(queue, conn, f"warm{i}-{uuid.uuid4().hex[:6]}")
            time.sleep(1.0)
            for i in range(n):
                ms = _enqueue_and_time(queue, conn, f"p{i}-{uuid.uuid4().hex[:6]}")
                if ms is None:
                    missed += 1
                else:
                    latencies.append(ms)
                time.sleep(0.02)
    finally:
        queue.close()
        master.stop()
    return _latency_summary(latencies, missed)


def _latency_summary(latencies: list[float], missed: int) -> dict[str, Any]:
    return {
        "jobs": len(latencies) + missed,
        "missed": missed,
        "p50_ms": round(percentile(latencies, 0.5), 2),
        "p95_ms": round(percentile(latencies, 0.95), 2),
        "p99_ms": round(percentile(latencies, 0.99), 2),
        "max_ms": round(max(latencies), 2) if latencies else None,
    }


def retention(dsn: str, workers: int, history: int, batch: int) -> dict[str, Any]:
    """Retention deletes the history while single jobs flow (one every 20 ms plus its
    pickup): their pickup latency during the deletion, and how fast it deletes."""
    import brooq

    extra = {
        "QUEUE_RETENTION_TTL": "1d",
        "QUEUE_RETENTION_PERIOD": "1s",
        "QUEUE_RETENTION_BATCH": str(batch),
    }
    env_master = start_master_of(dsn, workers, extra)
    queue = brooq.Queue(dsn)
    latencies: list[float] = []
    missed = 0
    t0 = time.monotonic()
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:

            def history_left() -> int:
                # The oldest finished row through the retention index (a count would
                # walk millions of entries every look): its position in the history's
                # 30 days says how much is left.
                row = conn.execute(
                    "SELECT extract(epoch FROM now() - interval '1 day 1 hour'"
                    " - min(updated_at))"
                    " FROM job WHERE state IN ('done', 'dead', 'canceled')"
                    " AND updated_at < now() - interval '1 day'"
                ).fetchone()
                if not row or row[0] is None:
                    return 0
                return max(1, int(history * float(row[0]) / (30 * DAY - 3600)))

            i, last_look, left = 0, 0.0, history
            deadline = t0 + 3 * 3600
            while left > 0:
                if not env_master.alive():
                    raise RuntimeError(f"master exited:\n{env_master.log_tail()}")
                if time.monotonic() > deadline:
                    raise TimeoutError(f"retention left {left} rows after 3 hours")
                ms = _enqueue_and_time(queue, conn, f"r{i}-{uuid.uuid4().hex[:6]}")
                i += 1
                if ms is None:
                    missed += 1
                else:
                    latencies.append(ms)
                time.sleep(0.02)
                if time.monotonic() - last_look > 2:
                    left, last_look = history_left(), time.monotonic()
                    log(f"  retention: {left:,} history rows left")
        seconds = time.monotonic() - t0
    finally:
        queue.close()
        env_master.stop()
    return {
        "deleted": history,
        "seconds": round(seconds, 1),
        "deleted_per_s": round(history / seconds),
        "batch": batch,
        "pickup_during_retention": _latency_summary(latencies, missed),
    }


def retention_partitions(dsn: str, workers: int, history: int) -> dict[str, Any]:
    """The history's partitions released and dropped one after the other, as the
    master's upkeep does past a TTL of one day, while single jobs flow (one every 20 ms
    plus its pickup): their pickup latency during the drops, and each call's time."""
    import brooq

    from history_retention import drop_partition

    env_master = start_master_of(dsn, workers, {})
    queue = brooq.Queue(dsn)
    latencies: list[float] = []
    missed = 0
    calls: list[dict[str, Any]] = []
    errors: list[str] = []
    finished = threading.Event()

    def upkeep() -> None:
        try:
            with psycopg.connect(dsn, autocommit=True) as conn:
                names = [
                    r[0]
                    for r in conn.execute(
                        "SELECT name FROM brooq_history_expired(now() - interval '1 day')"
                    ).fetchall()
                ]
                for name in names:
                    calls.append(drop_partition(conn, name))
                    log(f"  retention: dropped {name}: {calls[-1]}")
        except Exception as exc:
            errors.append(f"{type(exc).__name__}: {exc}")
        finally:
            finished.set()

    t0 = time.monotonic()
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            for i in range(5):  # warm up: the children are up and idle
                _enqueue_and_time(queue, conn, f"warm{i}-{uuid.uuid4().hex[:6]}")
            dropper = threading.Thread(target=upkeep, daemon=True)
            t0 = time.monotonic()
            dropper.start()
            i = 0
            while not finished.is_set():
                if not env_master.alive():
                    raise RuntimeError(f"master exited:\n{env_master.log_tail()}")
                ms = _enqueue_and_time(queue, conn, f"r{i}-{uuid.uuid4().hex[:6]}")
                i += 1
                if ms is None:
                    missed += 1
                else:
                    latencies.append(ms)
                time.sleep(0.02)
            dropper.join()
            left = conn.execute(
                "SELECT count(*) FROM job_history WHERE updated_at < now() - interval '1 day'"
            ).fetchone()
        seconds = time.monotonic() - t0
    finally:
        queue.close()
        env_master.stop()
    release = [c["release"]["db_ms"] for c in calls]
    drop = [c["drop"]["db_ms"] for c in calls]
    return {
        "deleted": history,
        "left": left[0] if left else None,
        "partitions": len(calls),
        "seconds": round(seconds, 1),
        "deleted_per_s": round(history / seconds) if seconds else None,
        "release_db_ms_max": max(release, default=None),
        "release_db_ms_sum": round(sum(release), 1),
        "drop_db_ms_max": max(drop, default=None),
        "drop_db_ms_sum": round(sum(drop), 1),
        "drop_tries_max": max((c["drop"]["tries"] for c in calls), default=None),
        "calls": calls,
        "errors": errors,
        "pickup_during_retention": _latency_summary(latencies, missed),
    }


def one_table(admin: str, label: str, history: int, args: argparse.Namespace) -> dict[str, Any]:
    with fresh_database(admin, f"scale_{label}") as dsn:
        log(f"{label}: building ({history:,} finished rows, {args.ready:,} ready)")
        result: dict[str, Any] = {"history": history, "ready": args.ready}
        result.update(build(dsn, history, args.ready, args.history_in))
        sampler = Sampler(dsn)
        sampler.start()
        log(f"{label}: draining")
        result["drain"] = drain(dsn, args.workers, args.ready)
        log(f"{label}: drain {result['drain']}")
        result["pickup"] = pickup(dsn, args.workers, args.pickup)
        log(f"{label}: pickup {result['pickup']}")
        if history and not args.no_retention:
            log(f"{label}: retention of {history:,} rows while jobs flow")
            if args.history_in == "job_history":
                result["retention"] = retention_partitions(dsn, args.workers, history)
            else:
                result["retention"] = retention(dsn, args.workers, history, args.retention_batch)
            log(f"{label}: retention {dict(result['retention'], calls='...')}")
        samples = sampler.stop()
        result["samples"] = samples
        if samples:
            result["max_dead_tuples"] = max(s["n_dead_tup"] for s in samples)
            result["table_bytes"] = [samples[0]["table_bytes"], samples[-1]["table_bytes"]]
            result["index_bytes"] = [samples[0]["index_bytes"], samples[-1]["index_bytes"]]
            result["history_bytes"] = [
                samples[0]["history_table_bytes"] + samples[0]["history_index_bytes"],
                samples[-1]["history_table_bytes"] + samples[-1]["history_index_bytes"],
            ]
    return result


def paired(admin: str, args: argparse.Namespace) -> dict[str, Any]:
    """Both databases built first, then their drains in alternation, ROUNDS each (the
    order swapped every round), READY ready rows loaded again before each: on a machine
    whose speed drifts, each round's ratio compares two drains minutes apart."""
    from contextlib import ExitStack

    out: dict[str, Any] = {"rounds": []}
    with ExitStack() as stack:
        dsns = {
            label: stack.enter_context(fresh_database(admin, f"scale_{label}"))
            for label in ("small", "big")
        }
        for label, dsn in dsns.items():
            history = args.history if label == "big" else 0
            log(f"{label}: building ({history:,} finished rows, {args.ready:,} ready)")
            out[label] = build(dsn, history, args.ready, args.history_in)
        for n in range(args.paired):
            order = ["small", "big"] if n % 2 == 0 else ["big", "small"]
            result: dict[str, Any] = {"order": order}
            for label in order:
                dsn = dsns[label]
                with psycopg.connect(dsn, autocommit=True) as conn:
                    if conn.execute(ANY_LEFT).fetchone() != (True,):  # drained last round
                        conn.execute(UUID7)
                        conn.execute(READY, {"n": args.ready})
                        conn.execute("VACUUM (ANALYZE) job")
                        conn.execute("CHECKPOINT")
                result[label] = drain(dsn, args.workers, args.ready)
                log(f"round {n + 1}: {label} {result[label]}")
            result["big_over_small"] = round(
                result["big"]["jobs_per_s"] / result["small"]["jobs_per_s"], 3
            )
            out["rounds"].append(result)
    ratios = sorted(r["big_over_small"] for r in out["rounds"])
    out["big_over_small"] = {
        "median": round(statistics.median(ratios), 3),
        "min": ratios[0],
        "max": ratios[-1],
    }
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--dsn", help="an admin DSN (default: 127.0.0.1:5432, else embedded)")
    ap.add_argument("--history", type=int, default=10_000_000)
    ap.add_argument("--ready", type=int, default=1_000_000)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--pickup", type=int, default=PICKUP)
    ap.add_argument("--retention-batch", type=int, default=1000)
    ap.add_argument("--no-retention", action="store_true")
    ap.add_argument(
        "--history-in",
        choices=("job_history", "job"),
        default="job_history",
        help="where the finished rows are put: job_history's daily partitions (dropped"
        " whole by retention), or job (terminal rows left there before migration 0020,"
        " deleted row by row)",
    )
    ap.add_argument("--quick", action="store_true", help="1,000,000 history, 100,000 ready")
    ap.add_argument("--out", type=Path)
    ap.add_argument(
        "--master-env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a setting for every master (e.g. QUEUE_STATS_PERIOD=1h); repeatable",
    )
    ap.add_argument("--tables", default="small,big", help="which tables to run (small,big)")
    ap.add_argument(
        "--paired",
        type=int,
        default=0,
        metavar="ROUNDS",
        help="only the drains: both databases built, then ROUNDS drains of each in"
        " alternation (no pickup, no retention)",
    )
    args = ap.parse_args(argv)
    MASTER_ENV.update(master_env(args.master_env))
    if args.quick:
        args.history, args.ready = 1_000_000, 100_000
    admin, where = choose_admin_dsn(args.dsn)
    report: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "server": where,
        "workers": args.workers,
        "master_env": MASTER_ENV,
        "history_in": args.history_in,
    }
    if args.paired:
        report["paired"] = paired(admin, args)
        text = json.dumps(report, indent=2, default=str)
        if args.out:
            args.out.write_text(text + "\n")
        print(json.dumps(report["paired"]["big_over_small"]))
        return 0
    tables = args.tables.split(",")
    for label in tables:
        report[label] = one_table(admin, label, args.history if label == "big" else 0, args)
    if {"small", "big"} <= set(tables):
        small, big = report["small"], report["big"]
        report["ratios"] = {
            "drain_big_over_small": round(
                big["drain"]["jobs_per_s"] / small["drain"]["jobs_per_s"], 3
            ),
            "pickup_p95_small_over_big": round(
                small["pickup"]["p95_ms"] / big["pickup"]["p95_ms"], 3
            ),
        }
    text = json.dumps(report, indent=2, default=str)
    if args.out:
        args.out.write_text(text + "\n")
    print(json.dumps({k: v for k, v in report.items() if k not in ("small", "big")}, indent=2))
    for label in tables:
        r = report[label]
        print(
            f"{label}: drain {r['drain']['jobs_per_s']:,} jobs/s; pickup p50 "
            f"{r['pickup']['p50_ms']} ms p95 {r['pickup']['p95_ms']} ms; max dead tuples "
            f"{r.get('max_dead_tuples')}"
        )
        if "retention" in r:
            ret = r["retention"]
            print(
                f"{label}: retention {ret['deleted_per_s']:,} rows/s; pickup during it p99 "
                f"{ret['pickup_during_retention']['p99_ms']} ms"
                + (
                    f"; per partition release <= {ret['release_db_ms_max']} ms, drop <= "
                    f"{ret['drop_db_ms_max']} ms (database time)"
                    if "calls" in ret
                    else ""
                )
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
