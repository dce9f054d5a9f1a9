"""Retention of a whole day of history: one partition of job_history released and dropped
while single jobs flow.

    python benchmarks/history_retention.py [--dsn ADMIN_DSN] [--rows 10000000]
                                           [--workers 2] [--before 30] [--after 15]
                                           [--rounds 1] [--key-every 10]
                                           [--out results/NAME.json]

In a fresh database: ROWS finished rows (done, one topic, one in KEY_EVERY with an
idempotency key, as a producer using keys leaves them; 0: none) in the daily partition of the day
before yesterday (made with brooq_history_prepare('1 day', ...), written by INSERT ...
SELECT straight into it, VACUUM ANALYZEd); their keys in brooq_job_key. Then
`brooq-master --workers N` with the benchmark's handler, and one producer thread
enqueueing single jobs (`Queue.enqueue`, one every 20 ms): each job's pickup is its
handler's start minus the enqueue's return (its commit), as run.py's pickup workload.

BEFORE seconds of flow, then the partition goes as the master's upkeep does it:
its idempotency keys released a batch per transaction in short passes
(brooq_history_release_keys, with the master's batch, pass and pause), its steps and edges
deleted (brooq_history_release_links), then `SELECT brooq_history_drop(name)` under a lock_timeout
of 1 s (DETACH and DROP, ACCESS EXCLUSIVE on job_history for the catalog change only),
then AFTER seconds more. Database time of each: the statement's duration as its session
sees it (clock_timestamp() around it, on the server) and the client's wall time.

Pickups are reported in three windows: before the release, during release + drop, and
after. Writes OUT (JSON) and OUT with .md.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (  # the benchmark's own modules, next to this file
    choose_admin_dsn,
    fresh_database,
    log,
    master_env,
    percentile,
    server_facts,
    start_master,
)
from snapshot import count_starts, read_starts

TOPIC = "bench.steady"

# A UUIDv7 for a given time (PostgreSQL 15 has no uuidv7()), as scale.py makes them.
UUID7 = """
CREATE OR REPLACE FUNCTION pg_temp.bench_uuid7(ts timestamptz) RETURNS uuid LANGUAGE sql AS $$
  SELECT encode(set_bit(set_bit(overlay(uuid_send(gen_random_uuid())
         PLACING substring(int8send((extract(epoch FROM ts) * 1000)::bigint) FROM 3)
         FROM 1 FOR 6), 52, 1), 53, 1), 'hex')::uuid
$$
"""

# Finished rows spread evenly over [lo, hi): chunk [first, last] of total.
FILL = """
INSERT INTO {part} (id, topic, payload, state, attempts, idempotency_key,
                    available_at, created_at, started_at, updated_at)
SELECT pg_temp.bench_uuid7(t), %(topic)s, '{{"i": 0}}'::jsonb, 'done', 1,
       CASE WHEN g %% %(key_every)s = 0 THEN 'k' || g END, t, t, t + interval '5 ms',
       t + interval '20 ms'
FROM (SELECT g, %(lo)s::timestamptz + (%(hi)s::timestamptz - %(lo)s::timestamptz
             - interval '1 s') * (g::float8 / %(total)s::float8) AS t
      FROM generate_series(%(first)s::bigint, %(last)s::bigint) AS g) AS s
"""

KEYS = """
INSERT INTO brooq_job_key (topic, idempotency_key, job_id)
SELECT topic, idempotency_key, id FROM {part} WHERE idempotency_key IS NOT NULL
"""


def partition_for(conn: psycopg.Connection[Any], at: Any) -> str:
    """The name of the job_history partition whose range holds ``at``."""
    row = conn.execute(
        "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid"
        " WHERE i.inhparent = 'job_history'::regclass"
        "   AND pg_get_expr(c.relpartbound, c.oid) <> 'DEFAULT'"
        "   AND substring(pg_get_expr(c.relpartbound, c.oid) FROM 'FROM \\(''([^'']+)''\\)')"
        "       ::timestamptz <= %s::timestamptz"
        "   AND substring(pg_get_expr(c.relpartbound, c.oid) FROM 'TO \\(''([^'']+)''\\)')"
        "       ::timestamptz > %s::timestamptz",
        (at, at),
    ).fetchone()
    if row is None:
        raise RuntimeError(f"no job_history partition holds {at}")
    return str(row[0])


def bounds(conn: psycopg.Connection[Any], name: str) -> tuple[Any, Any]:
    row = conn.execute(
        "SELECT substring(e FROM 'FROM \\(''([^'']+)''\\)')::timestamptz,"
        "       substring(e FROM 'TO \\(''([^'']+)''\\)')::timestamptz"
        " FROM (SELECT pg_get_expr(c.relpartbound, c.oid) AS e FROM pg_class c"
        "       WHERE c.relname = %s) AS p",
        (name,),
    ).fetchone()
    assert row is not None
    return row[0], row[1]


def fill_partition(
    conn: psycopg.Connection[Any],
    name: str,
    rows: int,
    key_every: int = 10,
    chunk: int = 1_000_000,
) -> None:
    """ROWS done rows over the partition's whole range, straight into it (the parent's
    routing and its trigger's WHEN test skipped), their keys, then VACUUM ANALYZE."""
    from psycopg import sql

    lo, hi = bounds(conn, name)
    conn.execute(UUID7)
    part = sql.Identifier(name)
    for first in range(1, rows + 1, chunk):
        last = min(first + chunk - 1, rows)
        conn.execute(
            sql.SQL(FILL).format(part=part),
            {
                "topic": "bench.old",
                "lo": lo,
                "hi": hi,
                "first": first,
                "last": last,
                "total": rows,
                "key_every": key_every or rows + 1,  # 0: no keys (no row matches)
            },
        )
        log(f"  {name}: {last:,} / {rows:,}")
    conn.execute(sql.SQL(KEYS).format(part=part))
    conn.execute(sql.SQL("VACUUM (ANALYZE) {}").format(part))
    conn.execute("VACUUM (ANALYZE) brooq_job_key")


def timed_call(conn: psycopg.Connection[Any], call: str, params: Sequence[Any]) -> dict[str, Any]:
    """``SELECT call`` in its own transaction: its result, its database time (measured
    in the session) and the client's wall time."""
    t0 = time.monotonic()
    row = conn.execute(
        # The target list is computed left to right: the clock is read after the call.
        f"SELECT {call}, extract(epoch FROM clock_timestamp() - statement_timestamp()) * 1000",
        params,
    ).fetchone()
    wall = (time.monotonic() - t0) * 1000
    assert row is not None
    return {"result": row[0], "db_ms": round(float(row[1]), 1), "wall_ms": round(wall, 1)}


def drop_partition(conn: psycopg.Connection[Any], name: str, lock_timeout: str = "1s") -> dict:
    """The master's upkeep for one expired partition (brooq.supervisor.history): its keys
    released history.KEYS_BATCH per transaction, for KEYS_PASS_SECONDS per pass with
    KEYS_PAUSE between passes; then its edges, steps and event waits; then the drop
    (retried on a lock timeout, as the master retries on its next period). Database time
    summed over the key batches, and the wall time from the first batch to the drop."""
    from brooq.supervisor import history

    out: dict[str, Any] = {"name": name}
    started = time.monotonic()
    after, batches, db_ms, released = str(history.NO_ID), 0, 0.0, 0
    pass_start = time.monotonic()
    while True:
        if batches and time.monotonic() - pass_start >= history.KEYS_PASS_SECONDS:
            time.sleep(history.KEYS_PAUSE)
            pass_start = time.monotonic()
        call = timed_call(
            conn, "to_jsonb(brooq_history_release_keys(%s, %s::uuid, %s))",
            (name, after, history.KEYS_BATCH),
        )  # fmt: skip
        batches += 1
        db_ms += call["db_ms"]
        released += call["result"]["released"]
        after = call["result"]["last_id"] or after
        if call["result"]["seen"] < history.KEYS_BATCH:
            break
    out["keys"] = {
        "released": released,
        "batches": batches,
        "db_ms": round(db_ms, 1),
        "wall_ms": round((time.monotonic() - started) * 1000, 1),
    }
    out["release"] = timed_call(conn, "brooq_history_release_links(%s)", (name,))
    conn.execute(f"SET lock_timeout = '{lock_timeout}'")
    tries = 0
    while True:
        tries += 1
        try:
            out["drop"] = timed_call(conn, "brooq_history_drop(%s)", (name,))
            break
        except psycopg.errors.LockNotAvailable:
            if tries >= 10:
                raise
            time.sleep(0.5)
    out["drop"]["tries"] = tries
    conn.execute("RESET lock_timeout")
    return out


# Partitions of job_history for a range that may lie in the past, as the migration makes
# today's: made in place, the bounds aligned on multiples of the step since the epoch and
# named as brooq_history_prepare names them. brooq_history_prepare itself never makes one
# that starts before now (rows may already be arriving there).
MAKE_PARTITIONS = """
DO $$
DECLARE
    step float8 := %(step)s;
    lo timestamptz := to_timestamp(floor(extract(epoch FROM %(lo)s::timestamptz) / step) * step);
    hi timestamptz;
BEGIN
    WHILE lo < %(hi)s::timestamptz LOOP
        hi := lo + make_interval(secs => step);
        EXECUTE format('CREATE TABLE IF NOT EXISTS %%I PARTITION OF job_history '
                       'FOR VALUES FROM (%%L) TO (%%L)',
                       'job_history_' || to_char(lo AT TIME ZONE 'UTC', 'YYYYMMDD_HH24MISS'),
                       lo, hi);
        lo := hi;
    END LOOP;
END $$
"""


def make_partitions(conn: psycopg.Connection[Any], step_s: float, lo: Any, hi: Any) -> None:
    """job_history's partitions of ``step_s`` seconds covering [lo, hi), after dropping the
    empty ones the migration made (they may overlap the new ones)."""
    from psycopg import sql

    empty = conn.execute(
        "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid"
        " WHERE i.inhparent = 'job_history'::regclass"
        "   AND pg_get_expr(c.relpartbound, c.oid) <> 'DEFAULT'"
    ).fetchall()
    for (name,) in empty:
        if conn.execute(
            sql.SQL("SELECT NOT EXISTS (SELECT FROM {})").format(sql.Identifier(name))
        ).fetchone() == (True,):
            conn.execute(sql.SQL("DROP TABLE {}").format(sql.Identifier(name)))
    # DO takes no parameters: the values are written in as literals.
    text = MAKE_PARTITIONS % {
        "step": sql.Literal(float(step_s)).as_string(conn),
        "lo": sql.Literal(lo).as_string(conn),
        "hi": sql.Literal(hi).as_string(conn),
    }
    conn.execute(text.replace("%%", "%"))


def prepare(conn: psycopg.Connection[Any], step_s: float, ahead_s: float) -> None:
    """Partitions of ``step_s`` seconds from the current step's until ``ahead_s`` from now
    (the master then attaches the later ones)."""
    row = conn.execute("SELECT now()").fetchone()
    assert row is not None
    from datetime import timedelta

    make_partitions(conn, step_s, row[0], row[0] + timedelta(seconds=ahead_s))


class Flow(threading.Thread):
    """Single jobs, one every ``gap`` seconds plus its enqueue, each job's enqueue return
    time kept (its commit) and the window it belongs to."""

    def __init__(self, dsn: str, gap: float = 0.02) -> None:
        super().__init__(daemon=True)
        self.dsn, self.gap = dsn, gap
        self.enqueued: dict[str, tuple[float, str]] = {}
        self.window = "before"
        self.stopped = threading.Event()
        self.errors: list[str] = []

    def run(self) -> None:
        import brooq

        queue = brooq.Queue(self.dsn)
        try:
            k = 0
            while not self.stopped.is_set():
                window = self.window
                job_id, _ = queue.enqueue(brooq.Job(TOPIC, {"k": k}))
                self.enqueued[str(job_id)] = (time.time(), window)
                k += 1
                self.stopped.wait(self.gap)
        except Exception as exc:
            self.errors.append(f"{type(exc).__name__}: {exc}")
        finally:
            queue.close()


def window_pickups(
    enqueued: dict[str, tuple[float, str]], started: dict[str, float]
) -> dict[str, dict[str, Any]]:
    """Pickup p50/p99/max (ms) per window; a job never started counts as missed."""
    by: dict[str, list[float]] = {}
    missed: dict[str, int] = {}
    for job, (t_enq, window) in enqueued.items():
        t = started.get(job)
        if t is None:
            missed[window] = missed.get(window, 0) + 1
            continue
        by.setdefault(window, []).append((t - t_enq) * 1000)
    out = {}
    for window in sorted(set(by) | set(missed)):
        v = by.get(window, [])
        out[window] = {
            "jobs": len(v),
            "missed": missed.get(window, 0),
            "p50_ms": round(percentile(v, 0.5), 2) if v else None,
            "p99_ms": round(percentile(v, 0.99), 2) if v else None,
            "max_ms": round(max(v), 2) if v else None,
        }
    return out


def one_round(admin: str, args: argparse.Namespace, n: int) -> dict[str, Any]:
    from brooq import migrate

    with fresh_database(admin, f"hret{n}") as dsn:
        migrate.up(dsn)
        result: dict[str, Any] = {"rows": args.rows, "key_every": args.key_every}
        with psycopg.connect(dsn, autocommit=True) as conn:
            # Daily from the day before yesterday (a whole day, ended before the drop).
            days = conn.execute(
                "SELECT now() - interval '2 days', now() + interval '2 days'"
            ).fetchone()
            assert days is not None
            make_partitions(conn, 86400, days[0], days[1])
            name = partition_for(conn, days[0])
            t0 = time.monotonic()
            fill_partition(conn, name, args.rows, args.key_every)
            conn.execute("CHECKPOINT")
            result["build_s"] = round(time.monotonic() - t0, 1)
            result["partition"] = name
            result["partition_bytes"] = conn.execute(
                "SELECT pg_table_size(%s::regclass), pg_indexes_size(%s::regclass)",
                (name, name),
            ).fetchone()
            result["keys"] = conn.execute("SELECT count(*) FROM brooq_job_key").fetchone()[0]
        master = start_master(
            dsn,
            args.workers,
            env={"QUEUE_RETENTION_TTL": "0s", **args.env},
            name="brooq-hret",
        )
        flow = Flow(dsn)
        try:
            deadline = time.monotonic() + 60
            flow.start()
            while count_starts(dsn) < 5:
                if not master.alive() or time.monotonic() > deadline:
                    raise RuntimeError(f"the master took no job:\n{master.log_tail()}")
                time.sleep(0.1)
            flow.enqueued.clear()  # the children were starting: not a pickup
            time.sleep(args.before)
            flow.window = "during"
            with psycopg.connect(dsn, autocommit=True) as conn:
                log(f"releasing and dropping {name}")
                result["upkeep"] = drop_partition(conn, name)
                log(f"  {result['upkeep']}")
            flow.window = "after"
            time.sleep(args.after)
        finally:
            flow.stopped.set()
            flow.join(10)
            time.sleep(1.0)
            master.stop()
        result["producer_errors"] = flow.errors
        result["pickup"] = window_pickups(dict(flow.enqueued), read_starts(dsn))
        with psycopg.connect(dsn, autocommit=True) as conn:
            result["keys_after"] = conn.execute("SELECT count(*) FROM brooq_job_key").fetchone()[0]
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--dsn", help="an admin DSN (default: 127.0.0.1:5432, else embedded)")
    ap.add_argument("--rows", type=int, default=10_000_000)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--before", type=float, default=30.0, help="seconds of flow before")
    ap.add_argument("--after", type=float, default=15.0, help="seconds of flow after")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument(
        "--key-every",
        type=int,
        default=10,
        help="one row in N has an idempotency key (0: none); its key is released",
    )
    ap.add_argument("--out", type=Path)
    ap.add_argument("--master-env", action="append", default=[], metavar="NAME=VALUE")
    args = ap.parse_args(argv)
    if args.rows < 1 or args.rounds < 1 or args.key_every < 0:
        raise SystemExit("--rows and --rounds must be at least 1, --key-every at least 0")
    args.env = master_env(args.master_env)
    admin, where = choose_admin_dsn(args.dsn)
    report: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "server": where,
        "facts": server_facts(admin),
        "workers": args.workers,
        "rounds": [one_round(admin, args, n) for n in range(args.rounds)],
    }
    text = json.dumps(report, indent=2, default=str)
    if args.out:
        args.out.write_text(text + "\n")
        args.out.with_suffix(".md").write_text(markdown(report))
    print(markdown(report))
    return 0


def markdown(report: dict[str, Any]) -> str:
    lines = [
        f"# Retention of one partition ({report['date']}, {report['server']})",
        "",
        "| round | rows | keys released (batches) | keys db ms (wall ms) | links db ms |"
        " drop db ms | drop tries | pickup p50/p99 before | during | after |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for i, r in enumerate(report["rounds"]):
        up = r["upkeep"]
        p = r["pickup"]

        def pp(w: str, p: dict[str, Any] = p) -> str:
            x = p.get(w)
            if not x:
                return "-"
            return f"{x['p50_ms']} / {x['p99_ms']} ms (n={x['jobs']}, missed {x['missed']})"

        lines.append(
            f"| {i + 1} | {r['rows']:,} | {up['keys']['released']:,} ({up['keys']['batches']})"
            f" | {up['keys']['db_ms']} ({up['keys']['wall_ms']}) | {up['release']['db_ms']}"
            f" | {up['drop']['db_ms']} | {up['drop']['tries']} | {pp('before')}"
            f" | {pp('during')} | {pp('after')} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
