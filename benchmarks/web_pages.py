"""Server time of each status page (brooq.page) on a table of 1,000,000 jobs.

Run by hand (never part of `make test` or `make bench`); about a minute on 2 cores:

    .venv/bin/python benchmarks/web_pages.py [--dsn ADMIN_DSN] [--rows 1000000] [--runs 9]
    .venv/bin/python benchmarks/web_pages.py --explain      # and each statement's plan

In a scratch database of its own (`--db NAME`, default `bench_web_pages_<hex>`, dropped
at the end unless --keep): `brooq.migrate.up`, then ROWS jobs in one INSERT ... SELECT
generate_series, in the mix of a busy queue that keeps a day of history:

    94.0 % done       updated over the last 24 h (about 650 a minute in the last hour),
                      half of them with a result
     2.0 % pending    ready now, created over the last 10 minutes
     1.0 % pending    scheduled over the next 6 hours
     1.0 % failed     waiting for a retry, a 1 kB traceback as last_error and 1-3
                      entries of error history
     1.0 % dead       a 1 kB traceback and 5 entries of error history
     0.95 % canceled
     0.05 % processing  leases held by 40 children on 4 hosts

over three queues and eight topics, each started job with its last claim (started_at:
a done job ran under a second). With migration 0020 the finished ones (done, dead,
canceled) are then moved into job_history, in daily partitions made as the master makes
them, and job is rewritten (VACUUM FULL): job holds the unfinished jobs alone, as it
does once every job has ended since the migration; on a checkout before 0020 they stay
in job (the measure of the time before) (`--mix backlog`: the 94 % are pending and ready
instead, a queue far behind: the overview then estimates the pending figures from its
sample instead of counting them; `--rows 8000000 --mix backlog` is the backlog that an
exact count could not serve within the 2 s statement timeout), then VACUUM ANALYZE
(what autovacuum would have done on a table of that age). A page over the statement
timeout is shown as such (its answer, 503) instead of stopping the run.
Each page is then served through brooq.page.routes.serve on one connection, once to warm
up and RUNS times measured: the table shows the median, the fastest and the slowest wall
time of the whole answer (the page's statements, their round trips, and the rendering),
and the median of the reads alone (brooq.page.reads).
The deep pages start at a cursor halfway into their list (5,000 rows for 1,000,000
jobs): keyset pagination should make them cost what the first page costs.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's brooq

import psycopg
from brooq import migrate
from brooq.page import reads, routes
from brooq.page.reads import Cursor
from psycopg import conninfo, sql
from psycopg.rows import dict_row, tuple_row

DEFAULT_DSN = "postgresql://postgres@127.0.0.1:5432/postgres"
TARGET_MS = 200.0

TRACEBACK = (
    "Traceback (most recent call last):\n"
    + '  File "/srv/app/handlers.py", line 120, in send\n    reply = client.post(url, json=body)\n'
    * 8
    + "ConnectionError: <urlopen error [Errno 111] Connection refused>"
)

# i runs from 1 to rows; bucket = i % 10000 picks the state (per ten thousand).
FILL = """
INSERT INTO job (topic, queue, priority, payload, state, attempts, available_at,
                 locked_by, locked_until, last_error, errors, result, created_at, updated_at,
                 started_at)
SELECT
    (ARRAY['mail.send', 'mail.bounce', 'report.build', 'image.resize', 'sync.crm',
           'billing.charge', 'webhook.deliver', 'search.index'])[1 + i %% 8],
    (ARRAY['default', 'default', 'default', 'high', 'low'])[1 + i %% 5],
    (i %% 3)::smallint,
    jsonb_build_object('user', i, 'email', 'user' || i || '@example.org',
                       'items', jsonb_build_array(i %% 97, i %% 89, 'x')),
    s.state,
    CASE s.state WHEN 'pending' THEN 0 WHEN 'dead' THEN 5 WHEN 'failed' THEN 1 + i %% 3
                 ELSE 1 END,
    CASE WHEN b < 9600 THEN now() - make_interval(secs => 86400.0 * i / %(rows)s) - interval '1 s'
         WHEN b < 9800 THEN now() - make_interval(secs => 600.0 * (b - 9600) / 200)
         WHEN b < 9900 THEN now() + make_interval(secs => 21600.0 * (b - 9800) / 100)
         WHEN b < 10000 THEN now() + make_interval(secs => 30 + b - 9900)
    END,
    CASE WHEN s.state IN ('processing', 'done', 'dead', 'failed')
         THEN 'worker-' || (i %% 4) || ':' || (1000 + i %% 40) || ':a1b2' END,
    CASE WHEN s.state = 'processing' THEN now() + interval '30 s'
         WHEN s.state IN ('done', 'dead', 'failed') THEN now() - interval '1 min' END,
    CASE WHEN s.state IN ('failed', 'dead') THEN %(traceback)s END,
    CASE WHEN s.state IN ('failed', 'dead') THEN (
        SELECT jsonb_agg(jsonb_build_object(
                   'attempt', a, 'at', now() - make_interval(mins => 6 - a),
                   'error', %(traceback)s, 'worker', 'worker-0:1000:a1b2'))
        FROM generate_series(1, CASE WHEN s.state = 'dead' THEN 5 ELSE 1 + i %% 3 END) AS a) END,
    CASE WHEN s.state = 'done' AND i %% 2 = 0 THEN jsonb_build_object('sent', true, 'id', i) END,
    now() - make_interval(secs => 86400.0 * i / %(rows)s) - interval '2 s',
    CASE WHEN s.state = 'processing' THEN now() - make_interval(secs => (i %% 600) + 0.5)
         WHEN b < 9600 THEN now() - make_interval(secs => 86400.0 * i / %(rows)s)
         ELSE now() - make_interval(secs => 600.0 * b / 10000) END,
    -- The last claim: a processing job's is its updated_at; a done job ran 0.05 to 0.94 s
    -- (claimed 0.06 to 0.95 s after its due time); a failed or dead one's last attempt
    -- ran 1 s; a canceled one was never claimed.
    CASE WHEN s.state = 'processing' THEN now() - make_interval(secs => (i %% 600) + 0.5)
         WHEN s.state = 'done' THEN now() - make_interval(secs => 86400.0 * i / %(rows)s)
                                    - make_interval(secs => 0.05 + (i %% 90) / 100.0)
         WHEN s.state IN ('failed', 'dead') AND b < 9600
              THEN now() - make_interval(secs => 86400.0 * i / %(rows)s + 1)
         WHEN s.state IN ('failed', 'dead')
              THEN now() - make_interval(secs => 600.0 * b / 10000 + 1) END
FROM generate_series(1, %(rows)s) AS g(i)
CROSS JOIN LATERAL (SELECT g.i %% 10000 AS b) AS bb
CROSS JOIN LATERAL (SELECT CASE
    WHEN b < 9400 THEN %(bulk)s
    WHEN b < 9495 THEN 'canceled'
    WHEN b < 9500 THEN 'processing'
    WHEN b < 9600 THEN 'dead'
    WHEN b < 9900 THEN 'pending'
    ELSE 'failed' END AS state) AS s
"""


def scratch_db(admin: str, name: str) -> str:
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    return conninfo.make_conninfo(admin, dbname=name)


def drop_db(admin: str, name: str) -> None:
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )


# The finished jobs into job_history, as the outcomes move them (brooq.moving: the
# history's AFTER INSERT trigger is for rows the claim statement moves), in the daily
# partitions the master makes (brooq.supervisor.history).
MOVE = """
SELECT brooq_history_prepare(interval '1 day', now(), now() + interval '2 days', 10);
SELECT set_config('brooq.moving', 'on', false);
WITH gone AS (DELETE FROM job WHERE state IN ('done', 'dead', 'canceled') RETURNING *)
INSERT INTO job_history SELECT * FROM gone;
SELECT set_config('brooq.moving', '', false);
"""


def has_history(conn: psycopg.Connection[Any]) -> bool:
    cur = conn.cursor(row_factory=tuple_row)
    row = cur.execute("SELECT to_regclass('job_history') IS NOT NULL").fetchone()
    return bool(row and row[0])


def fill(dsn: str, rows: int, bulk: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        start = time.perf_counter()
        conn.execute(FILL, {"rows": rows, "traceback": TRACEBACK, "bulk": bulk})
        conn.execute("INSERT INTO brooq_queue (name, paused) VALUES ('low', true)")
        history = has_history(conn)
        if history:
            conn.execute(MOVE)
            conn.execute("VACUUM FULL job")
            conn.execute("VACUUM ANALYZE job_history")
        conn.execute("VACUUM ANALYZE job")
        conn.execute("ANALYZE brooq_queue")
        took = time.perf_counter() - start
        counts = conn.execute(
            "SELECT state, count(*) FROM job GROUP BY state ORDER BY 2 DESC"
        ).fetchall()
        size = conn.execute("SELECT pg_size_pretty(pg_total_relation_size('job'))").fetchone()
        moved = (
            conn.execute(
                "SELECT state, count(*) FROM job_history GROUP BY state ORDER BY 2 DESC"
            ).fetchall()
            if history
            else []
        )
    mix = ", ".join(f"{state} {n:,}" for state, n in counts)
    print(f"filled {rows:,} jobs in {took:.1f} s ({mix}); job with its indexes: {size[0]}")
    if moved:
        print("job_history: " + ", ".join(f"{state} {n:,}" for state, n in moved))


def jobs_relation(conn: psycopg.Connection[Any]) -> str:
    """Where every job is: job_all (job and job_history) from migration 0020 on."""
    return "job_all" if has_history(conn) else "job"


def deep_cursor(conn: psycopg.Connection[Any], state: str, depth: int) -> str:
    order = "updated_at, id" if state == "processing" else "updated_at DESC, id DESC"
    row = conn.execute(
        f"SELECT updated_at, id FROM {jobs_relation(conn)} WHERE state = %s "
        f"ORDER BY {order} OFFSET %s LIMIT 1",
        [state, depth],
    ).fetchone()
    assert row is not None, state
    return reads.encode_cursor(Cursor(row["updated_at"], row["id"]))


def measure(fn: Callable[[], Any], runs: int) -> list[float]:
    fn()  # warm: plans cached, pages in shared buffers
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1000)
    return times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dsn", default=DEFAULT_DSN, help="an admin DSN (creates the DB)")
    parser.add_argument("--db", default=f"bench_web_pages_{uuid.uuid4().hex[:8]}")
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=9)
    parser.add_argument(
        "--mix",
        choices=("history", "backlog"),
        default="history",
        help="backlog: the 94 %% of done jobs are pending and ready instead (a queue far behind)",
    )
    parser.add_argument("--keep", action="store_true", help="keep the scratch database")
    parser.add_argument("--reuse", action="store_true", help="--db exists and is filled")
    parser.add_argument("--explain", action="store_true", help="print each read's plans")
    args = parser.parse_args()

    dsn = (
        conninfo.make_conninfo(args.dsn, dbname=args.db)
        if args.reuse
        else scratch_db(args.dsn, args.db)
    )
    try:
        if not args.reuse:
            migrate.up(dsn)
            fill(dsn, args.rows, "pending" if args.mix == "backlog" else "done")
        with psycopg.connect(dsn, autocommit=True, row_factory=dict_row) as conn:
            every = jobs_relation(conn)
            ids = {
                state: conn.execute(
                    f"SELECT id FROM {every} WHERE state = %s ORDER BY updated_at DESC LIMIT 1",
                    [state],
                ).fetchone()
                for state in ("dead", "done", "processing")
            }
        depth = args.rows // 200  # half of the failed (or dead) list
        with psycopg.connect(dsn, autocommit=True, row_factory=dict_row) as conn:
            targets = {
                "overview /": "/",
                "in flight, first page": "/in-flight",
                "failed, first page": "/failed",
                f"failed, {depth:,} rows deep": "/failed?after="
                + deep_cursor(conn, "failed", depth),
                "dead, first page": "/dead",
                f"dead, {depth:,} rows deep": "/dead?after=" + deep_cursor(conn, "dead", depth),
                "job page, dead (5 errors)": f"/jobs/{ids['dead']['id']}",  # type: ignore[index]
            }
            if ids["done"] is not None:  # none in the backlog mix
                targets["job page, done"] = f"/jobs/{ids['done']['id']}"
            targets["charts, last hour"] = "/charts"
            targets["charts, last day"] = "/charts?window=day"
            targets["charts, one topic, last day"] = "/charts?window=day&topic=mail.send"
            rows = []
            for label, target in targets.items():
                status = routes.serve(conn, "GET", target, actions_enabled=False).status
                if status != 200:  # over the statement timeout: shown, not measured
                    rows.append((label, float("nan"), float("nan"), float("nan"),
                                 float("nan"), status))  # fmt: skip
                    continue
                whole = measure(
                    lambda t=target: routes.serve(conn, "GET", t, actions_enabled=False),
                    args.runs,
                )
                read = measure(lambda t=target: read_only_part(conn, t), args.runs)
                size = len(routes.serve(conn, "GET", target, actions_enabled=False).body)
                rows.append((label, statistics.median(whole), min(whole), max(whole),
                             statistics.median(read), size))  # fmt: skip
            if args.explain:
                explain(conn, targets)
        print(
            f"\n{args.rows:,} jobs ({args.mix}), {args.runs} runs each, "
            "milliseconds of server time\n"
        )
        print("| page | median | fastest | slowest | reads alone (median) | HTML bytes |")
        print("|---|---:|---:|---:|---:|---:|")
        for label, med, low, high, read_med, size in rows:
            if med != med:  # NaN: the page was not served
                print(f"| {label} | **answered {size}** | | | | |")
                continue
            flag = "" if med < TARGET_MS else " **over 200 ms**"
            print(
                f"| {label} | {med:.1f}{flag} | {low:.1f} | {high:.1f} | {read_med:.1f} "
                f"| {size:,} |"
            )
        return 0 if all(r[1] < TARGET_MS for r in rows) else 1
    finally:
        if not args.keep:
            drop_db(args.dsn, args.db)


def read_only_part(conn: psycopg.Connection[Any], target: str) -> object:
    """The reads a target runs, without the rendering (mirrors brooq.page.routes.serve);
    over the statement timeout, None (the time measured is then the timeout's)."""
    try:
        return _reads_of(conn, target)
    except psycopg.errors.QueryCanceled:
        return None


def _reads_of(conn: psycopg.Connection[Any], target: str) -> object:
    path, _, query = target.partition("?")
    cursor = query.removeprefix("after=") if query.startswith("after=") else ""
    after = reads.decode_cursor(cursor) if cursor else None
    if path == "/":
        return reads.overview(conn)
    if path == "/in-flight":
        return reads.in_flight(conn, after)
    if path in ("/failed", "/dead"):
        return reads.finished_badly(conn, path.strip("/"), after)
    if path == "/charts":
        given = dict(part.split("=", 1) for part in query.split("&") if part)
        return reads.charts(conn, given.get("window", "hour"), topic=given.get("topic"))
    return reads.job(conn, uuid.UUID(path.rsplit("/", 1)[1]))


def explain(conn: psycopg.Connection[Any], targets: dict[str, str]) -> None:
    """EXPLAIN (ANALYZE, BUFFERS) of each statement the reads run, by wrapping execute."""
    import psycopg as pg

    original = pg.Cursor.execute

    def explaining(self: Any, query: Any, params: Any = None, **kw: Any) -> Any:
        text = str(query)
        body = [line for line in text.splitlines() if not line.startswith("--")]
        if body and body[0].startswith("SELECT") and "set_config" not in text:
            plan = original(self, "EXPLAIN (ANALYZE, BUFFERS) " + text, params).fetchall()
            print("\n" + body[0][:90])
            for line in plan:
                print(
                    "    " + str(next(iter(line.values())) if isinstance(line, dict) else line[0])
                )
        return original(self, query, params, **kw)

    pg.Cursor.execute = explaining  # type: ignore[method-assign]
    try:
        for target in set(targets.values()):
            print(f"\n=== {target}")
            read_only_part(conn, target)
    finally:
        pg.Cursor.execute = original  # type: ignore[method-assign]


if __name__ == "__main__":
    sys.exit(main())
