"""What one claim pays under a held snapshot, statement by statement, without workers.

    python benchmarks/snapshot_walk.py [--dsn ADMIN_DSN] [--jobs 10000,100000,300000]
                                       [--out results/NAME.json]

For each size N and each variant, in a fresh database: a session takes a REPEATABLE READ
snapshot; N jobs are enqueued as four producers leave them (the heap holds each
producer's rows together, the ready index interleaves them), then claimed and finished
(two UPDATEs, as the children's claim and `done`); one fresh job is enqueued. Then, as a
child runs them (PREPAREd, generic plan, no bitmap or sequential scans), EXPLAIN
(ANALYZE, BUFFERS) of the claim (job_finish_and_claim of the checkout running this,
reading the index whole, for one job and for two; job_finish_and_claim_floored, from the
floors a child would have) and of the guarded `done` with the guard written as before
and as now, each the median of five runs rolled back. VACUUM (VERBOSE) at the end says
what it could not remove.

Variants (what brooq could change, measured apart):
  base        the schema as migrated
  payload1k   each payload about 1 kB (what the hot rows carry)
  fillfactor  the table at fillfactor 70 (the updates' new versions on their row's page)
  moved       finished rows deleted from the table (as if they lived elsewhere)
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import psycopg
from brooq.schema.plans import CHILD_OPTIONS, prepare
from psycopg import sql

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import choose_admin_dsn, fresh_database

WHOLE = datetime.min.replace(tzinfo=timezone.utc)
# job_set_done as it was written before the guard went through the key.
DONE_BEFORE = (
    "UPDATE job SET state = 'done', result = %(result)s::jsonb, updated_at = now() "
    "WHERE id = %(id)s AND state = 'processing' AND locked_by = %(worker)s"
)
VARIANTS = ("base", "payload1k", "fillfactor", "moved")


def explain(
    conn: psycopg.Connection[Any], name: str, names: list[str], values: dict[str, Any]
) -> dict[str, Any]:
    """Median execution time and buffers (hit or read) of five EXPLAIN ANALYZE runs,
    rolled back."""
    args = sql.SQL(", ").join(sql.Literal(values[n]) for n in names)
    ms, hits, text = [], [], ""
    for _ in range(5):
        with conn.transaction(force_rollback=True):
            rows = conn.execute(
                sql.SQL("EXPLAIN (ANALYZE, BUFFERS) EXECUTE {}({})").format(
                    sql.Identifier(name), args
                )
            ).fetchall()
        text = "\n".join(str(r[0]) for r in rows)
        found = re.search(r"Execution Time: ([\d.]+) ms", text)
        ms.append(float(found.group(1)) if found else float("nan"))
        hits.append(buffers(text))
    return {
        "ms": round(statistics.median(ms), 3),
        "buffers": int(statistics.median(hits)),
        "plan": text,
    }


def buffers(plan: str) -> int:
    """The statement's shared buffers, found in shared_buffers or read (its first
    Buffers line is the top node's, the total)."""
    line = next((x for x in plan.splitlines() if "Buffers: shared" in x), "")
    return sum(int(n) for n in re.findall(r"(?:hit|read)=(\d+)", line))


def build(dsn: str, n: int, variant: str) -> tuple[psycopg.Connection[Any], datetime]:
    """The table after N jobs went through under a snapshot; the holder's connection
    (to close) and the fresh job's available_at."""
    from brooq import migrate

    migrate.up(dsn)
    holder = psycopg.connect(dsn, autocommit=True)
    with psycopg.connect(dsn, autocommit=True) as conn:
        if variant == "fillfactor":
            conn.execute("ALTER TABLE job SET (fillfactor = 70)")
        payload = "repeat('x', 1000)" if variant == "payload1k" else "'x'"
        conn.execute(
            "INSERT INTO job (topic, payload, available_at) "
            f"SELECT 't', jsonb_build_object('p', {payload}, 'i', g), "
            "       now() - interval '1 hour' + g * interval '1 ms' "
            "FROM generate_series(1, %s) AS g ORDER BY g %% 4, g",
            (n,),
        )
        conn.execute("ANALYZE job")
        holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        holder.execute("SELECT 1")
        conn.execute(
            "UPDATE job SET state = 'processing', attempts = 1, locked_by = 'w0', "
            "locked_until = now() + interval '30 s' WHERE state = 'pending'"
        )
        if variant == "moved":
            conn.execute("DELETE FROM job WHERE state = 'processing'")
        else:
            conn.execute("UPDATE job SET state = 'done' WHERE state = 'processing'")
        # One job in flight, whose `done` the outcome statements look up.
        conn.execute(
            "INSERT INTO job (topic, state, locked_by, locked_until, attempts) "
            "VALUES ('t', 'processing', 'w1', now() + interval '30 s', 1)"
        )
        row = conn.execute("INSERT INTO job (topic) VALUES ('t') RETURNING available_at")
        fresh = row.fetchone()
        assert fresh is not None
    return holder, fresh[0]


def one(admin: str, n: int, variant: str) -> dict[str, Any]:
    from brooq.sql import Q
    from brooq.worker.floors import Floors

    with fresh_database(admin, f"walk_{variant}_{n}") as dsn:
        t0 = time.monotonic()
        holder, fresh_at = build(dsn, n, variant)
        out: dict[str, Any] = {"jobs": n, "variant": variant}
        out["build_s"] = round(time.monotonic() - t0, 1)
        try:
            with psycopg.connect(dsn, autocommit=True, options=CHILD_OPTIONS) as conn:
                in_flight = conn.execute("SELECT id FROM job WHERE state = 'processing'").fetchone()
                assert in_flight is not None
                claim = prepare(conn, "claim", Q.job_finish_and_claim)
                base = {
                    "done": [],
                    "topics": ["t"],
                    "children": 2,
                    "worker": "w9",
                    "lease": 30.0,
                    "queue": "default",
                }
                out["claim_1_whole"] = explain(
                    conn, "claim", claim, {**base, "limit": 1, "floor": WHOLE}
                )
                out["claim_2_whole"] = explain(
                    conn, "claim", claim, {**base, "limit": 2, "floor": WHOLE}
                )
                # The claim from floors, with the ranges a child makes after claiming
                # jobs of priority 0 up to the fresh one.
                floors = Floors()
                floors.end([("default", 0, fresh_at)], 0.0, 0.0)
                ranges = floors.ranges("default")
                floored = prepare(conn, "floored", Q.job_finish_and_claim_floored)
                out["claim_1_floor"] = explain(
                    conn,
                    "floored",
                    floored,
                    {
                        **base,
                        "limit": 1,
                        "queues": [r[0] for r in ranges],
                        "lows": [r[1] for r in ranges],
                        "highs": [r[2] for r in ranges],
                        "floors": [r[3] for r in ranges],
                    },
                )
                done_values = {"id": in_flight[0], "worker": "w1", "result": None}
                before = prepare(conn, "done_before", DONE_BEFORE)
                out["done_guard_before"] = explain(conn, "done_before", before, done_values)
                now = prepare(conn, "done_now", Q.job_set_done)
                out["done_guard_now"] = explain(conn, "done_now", now, done_values)
                sizes = conn.execute(
                    "SELECT pg_relation_size('job'), pg_indexes_size('job'),"
                    " pg_relation_size('job_ready_queue_idx'),"
                    " pg_relation_size('job_processing_lease_idx')"
                ).fetchone()
                assert sizes is not None
                out["heap_bytes"], out["index_bytes"] = sizes[0], sizes[1]
                out["ready_index_bytes"], out["processing_index_bytes"] = sizes[2], sizes[3]
            notes: list[str] = []
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.add_notice_handler(lambda d: notes.append(d.message_primary or ""))
                conn.execute("VACUUM (VERBOSE) job")
            found = re.search(r"(\d+) are dead but not yet removable", "\n".join(notes))
            out["vacuum_not_removable"] = int(found.group(1)) if found else None
        finally:
            holder.close()
    return out


def table(results: list[dict[str, Any]]) -> str:
    lines = [
        "| variant | jobs | claim of 1, whole: ms (buffers) | claim of 2, whole | claim of 1 "
        "from the floor | `done`, guard before | `done`, guard now | dead, not removable "
        "by VACUUM |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]

    def cell(r: dict[str, Any], key: str) -> str:
        return f"{r[key]['ms']:.2f} ({r[key]['buffers']:,})"

    for r in results:
        lines.append(
            f"| {r['variant']} | {r['jobs']:,} | {cell(r, 'claim_1_whole')} | "
            f"{cell(r, 'claim_2_whole')} | {cell(r, 'claim_1_floor')} | "
            f"{cell(r, 'done_guard_before')} | {cell(r, 'done_guard_now')} | "
            f"{r['vacuum_not_removable']:,} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--dsn", help="an admin DSN (default: 127.0.0.1:5432, else embedded)")
    ap.add_argument("--jobs", default="10000,100000,300000", help="sizes, comma-separated")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    sizes = [int(x) for x in args.jobs.split(",")]
    variants = args.variants.split(",")
    if unknown := set(variants) - set(VARIANTS):
        ap.error(f"--variants: unknown {sorted(unknown)}")
    admin, where = choose_admin_dsn(args.dsn)
    results = []
    for variant in variants:
        for n in sizes:
            results.append(one(admin, n, variant))
            r = results[-1]
            print(
                f"[{time.strftime('%H:%M:%S')}] {variant} {n:,}: whole "
                f"{r['claim_1_whole']['ms']} ms, floor {r['claim_1_floor']['ms']} ms",
                file=sys.stderr,
                flush=True,
            )
    text = table(results)
    if args.out:
        report = {
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "where": where,
            "results": results,
        }
        args.out.write_text(json.dumps(report, indent=1, default=str) + "\n")
        args.out.with_suffix(".md").write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
