"""Where finished jobs live: three designs measured side by side on the same rows.

    .venv/bin/python benchmarks/history_options.py [--dsn ADMIN_DSN] [--finished 1000000]
        [--rounds 5] [--cycles 8] [--lookups 40] [--out results/NAME.json]

In one fresh database migrated by brooq (dropped at the end), three schemas, each with a
job relation of job's 32 columns (`LIKE public.job INCLUDING DEFAULTS INCLUDING
CONSTRAINTS`, no triggers in any of them) and the same indexes where they play the same
part (primary key or id index, the ready index, the lease index, the failed/dead index):

- ``a`` "range on the UUIDv7 id" (as Absurd does): job partitioned by RANGE (id), one
  partition a day (the first 48 bits of a UUIDv7 are its milliseconds), 30 past days
  and today, plus a default; the indexes made on the parent (partial on each
  partition). The outcome is an UPDATE in place.
- ``b`` "list by state with time sub-partitions" (as Oban Pro does): job partitioned by
  LIST (state), job_hot (pending, processing, failed, waiting) with C's job indexes,
  job_fin (done, dead, canceled) sub-partitioned by RANGE (updated_at), a day each, plus
  a default, with C's job_history indexes. The outcome UPDATE moves the row from
  job_hot to job_fin (PostgreSQL's row movement).
- ``c`` the chosen one (migration 0020): job unpartitioned, job_history RANGE
  (updated_at), a day each, plus a default; the outcome DELETEs from job and INSERTs
  into job_history in one statement.

Rows: FINISHED finished jobs spread evenly over the 30 past days (one in fifty dead),
ids made by brooq.producer.ids.uuid7_many with their 48-bit millisecond field set to
the job's creation (uuid7_many stamps the current clock); a ready pool of
ROUNDS x CYCLES x 256 (+ 256) pending jobs made now, the same rows in the three schemas.

Each round runs, for each design in turn (the order rotates), CYCLES claims of 256 (the
claim's shape: SELECT ... ORDER BY priority DESC, available_at, id LIMIT 256 FOR NO KEY
UPDATE SKIP LOCKED in a materialized CTE, then UPDATE by id) each followed by the done of
those 256; half the cycles timed from the client (psycopg, prepare=True, autocommit: the
commit included) with the backend's CPU time around each statement (/proc/PID/schedstat,
the server being local: on a shared machine wall times count the others' turns), half
through EXPLAIN (ANALYZE, BUFFERS, WAL, TIMING OFF) EXECUTE of the same statement (SQL
PREPARE) for the server's execution time, buffers and WAL bytes of the statement alone
(pg_current_wal_lsn also counts the other sessions of a shared server: its difference is
recorded too, as an upper bound). Sessions run with plan_cache_mode = force_generic_plan,
as brooq's workers do. Then LOOKUPS lookups of a
finished job by id (after an ANALYZE of the partitions the dones wrote, as autovacuum
soon would) (a and b: job, c: job_all), timed from the client (prepared), and
through EXPLAIN ANALYZE both prepared (generic plan) and as a plain statement (custom
plan: its planning time).

Retention, once at the end, for each design: the oldest day's partition dropped (for a,
after the check that it holds no unfinished job, which a must do and b and c need not),
three times, with the relations the DROP holds ACCESS EXCLUSIVE; and three other days'
rows deleted by DELETE (EXPLAIN ANALYZE WAL) followed by a VACUUM of the partition.

Run by hand (never part of `make test`): a few minutes on 2 shared cores. Writes OUT
(JSON) and OUT with .md.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import psycopg
from brooq.producer.ids import uuid7_many
from psycopg import ClientCursor

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import DEFAULT_DSN, fresh_database, log, migrate_tree, server_facts

DESIGNS = ("a", "b", "c")
NAMES = {
    "a": "A range on the UUIDv7 id (UPDATE in place)",
    "b": "B list by state + time sub-partitions (row movement)",
    "c": "C hot job + job_history by updated_at (DELETE + INSERT)",
}
DAYS = 30
BATCH = 256
FINISHED = ("done", "dead", "canceled")
LIKE = "(LIKE public.job INCLUDING DEFAULTS INCLUDING CONSTRAINTS)"

# The hot relation's indexes (brooq's job_pkey, job_ready_queue_idx,
# job_processing_lease_idx, job_failed_dead_idx) and the finished rows' (job_history's).
HOT_INDEXES = """
CREATE INDEX {p}ready_idx ON {t} (queue, priority DESC, available_at, id)
    WHERE state IN ('pending', 'failed');
CREATE INDEX {p}lease_idx ON {t} (locked_until) WHERE state = 'processing';
CREATE INDEX {p}failed_dead_idx ON {t} (state, updated_at DESC, id DESC)
    WHERE state IN ('failed', 'dead');
"""
HISTORY_INDEXES = """
CREATE INDEX {p}id_idx ON {t} (id);
CREATE INDEX {p}dead_idx ON {t} (queue, updated_at DESC, id DESC) WHERE state = 'dead';
CREATE INDEX {p}linked_idx ON {t} (id)
    WHERE has_downstream IS TRUE OR upstream_open IS NOT NULL OR idempotency_key IS NOT NULL;
"""


def uuid7_floor(ms: int) -> str:
    """The smallest UUID whose 48-bit millisecond field is ms (a partition bound)."""
    return str(uuid.UUID(int=ms << 80))


def day_starts(today: dt.datetime) -> list[dt.datetime]:
    """The 31 days' starts, oldest first, today last."""
    return [today - dt.timedelta(days=DAYS - k) for k in range(DAYS + 1)]


def schema_ddl(design: str, days: list[dt.datetime]) -> list[str]:
    out = [f"CREATE SCHEMA {design}", f"SET search_path = {design}, public"]
    if design == "a":
        out.append(f"CREATE TABLE job {LIKE} PARTITION BY RANGE (id)")
        for k, start in enumerate(days):
            lo = uuid7_floor(int(start.timestamp() * 1000))
            hi = uuid7_floor(int((start + dt.timedelta(days=1)).timestamp() * 1000))
            out.append(
                f"CREATE TABLE job_d{k:02d} PARTITION OF job FOR VALUES FROM ('{lo}') TO ('{hi}')"
            )
        out.append("CREATE TABLE job_default PARTITION OF job DEFAULT")
        out.append("ALTER TABLE job ADD PRIMARY KEY (id)")
        out.extend(s for s in HOT_INDEXES.format(p="job_", t="job").split(";") if s.strip())
    elif design == "b":
        out.append(f"CREATE TABLE job {LIKE} PARTITION BY LIST (state)")
        out.append(
            "CREATE TABLE job_hot PARTITION OF job FOR VALUES IN "
            "('pending', 'processing', 'failed', 'waiting')"
        )
        out.append(
            "CREATE TABLE job_fin PARTITION OF job FOR VALUES IN "
            "('done', 'dead', 'canceled') PARTITION BY RANGE (updated_at)"
        )
        for k, start in enumerate(days):
            end = start + dt.timedelta(days=1)
            out.append(
                f"CREATE TABLE job_fin_d{k:02d} PARTITION OF job_fin "
                f"FOR VALUES FROM ('{start.isoformat()}') TO ('{end.isoformat()}')"
            )
        out.append("CREATE TABLE job_fin_default PARTITION OF job_fin DEFAULT")
        # No primary key on id over the whole tree: a unique index of a partitioned table
        # must hold the partition keys (state, updated_at). The hot leaf has its own.
        out.append("ALTER TABLE job_hot ADD PRIMARY KEY (id)")
        out.extend(s for s in HOT_INDEXES.format(p="job_hot_", t="job_hot").split(";") if s.strip())
        out.extend(
            s for s in HISTORY_INDEXES.format(p="job_fin_", t="job_fin").split(";") if s.strip()
        )
    else:
        out.append(f"CREATE TABLE job {LIKE}")
        out.append("ALTER TABLE job ADD PRIMARY KEY (id)")
        out.extend(s for s in HOT_INDEXES.format(p="job_", t="job").split(";") if s.strip())
        out.append(
            "CREATE TABLE job_history (LIKE public.job INCLUDING DEFAULTS) "
            "PARTITION BY RANGE (updated_at)"
        )
        for k, start in enumerate(days):
            end = start + dt.timedelta(days=1)
            out.append(
                f"CREATE TABLE job_history_d{k:02d} PARTITION OF job_history "
                f"FOR VALUES FROM ('{start.isoformat()}') TO ('{end.isoformat()}')"
            )
        out.append("CREATE TABLE job_history_default PARTITION OF job_history DEFAULT")
        out.extend(
            s
            for s in HISTORY_INDEXES.format(p="job_history_", t="job_history").split(";")
            if s.strip()
        )
        out.append("CREATE VIEW job_all AS SELECT * FROM job UNION ALL SELECT * FROM job_history")
    return out


# -- the statements (named placeholders; SQL PREPARE gets them as $n) -------------------

CLAIM = """
WITH next AS MATERIALIZED (
    SELECT id FROM job
    WHERE queue = %(queue)s AND state IN ('pending', 'failed') AND available_at <= now()
      AND topic = ANY(%(topics)s::text[])
    ORDER BY priority DESC, available_at, id
    LIMIT %(limit)s
    FOR NO KEY UPDATE SKIP LOCKED
),
claimed AS (
    UPDATE job
    SET state = 'processing', attempts = job.attempts + 1, locked_by = %(worker)s,
        locked_until = now() + make_interval(secs => %(lease)s),
        progress = NULL, progress_message = NULL, started_at = now(), updated_at = now()
    WHERE job.id = ANY(ARRAY(SELECT id FROM next)){hot}
    RETURNING job.id, job.topic, job.payload, job.attempts, job.locked_by, job.locked_until,
              job.available_at, job.queue, job.priority
)
SELECT * FROM claimed
"""

# a: in place. b: the same UPDATE, `state = 'processing'` plain so that the plan prunes to
# job_hot (brooq's `(...) IS TRUE` guard would not prune); the row then moves to job_fin.
DONE_UPDATE = """
UPDATE job SET state = 'done', updated_at = now()
WHERE id = ANY(%(done)s::uuid[]) AND {guard} AND locked_by = %(worker)s
RETURNING id
"""

# c: brooq's job_finish_and_claim `finished` + `moved`, every column in job's order.
DONE_MOVE = """
WITH finished AS (
    DELETE FROM job
    WHERE id = ANY(%(done)s::uuid[]) AND (state = 'processing') IS TRUE
      AND locked_by = %(worker)s
    RETURNING job.*
)
INSERT INTO job_history
SELECT f.id, f.topic, f.payload, 'done', f.attempts, f.available_at, f.locked_by,
       f.locked_until, f.last_error, f.idempotency_key, f.created_at, now(),
       f.lease_expiries, f.queue, f.priority, f.result,
       f.errors, f.waited, f.unique_key, f.start_after, f.tags, f.group_key,
       f.upstream_open, f.upstream_failed, f.on_upstream_failure, f.has_downstream,
       f.progress, f.progress_message, f.logs, f.traceparent, f.parked, f.started_at,
       f.ordering_key
FROM finished AS f
RETURNING id
"""

LOOKUP = "SELECT * FROM {rel} WHERE id = %(id)s::uuid"
# b and c: the same with migration 0020's brooq_history_floor (a UUIDv7's enqueue time
# less a day), so that the plan skips the finished partitions that ended before it.
LOOKUP_FLOOR = (
    "SELECT * FROM {rel} WHERE id = %(id)s::uuid"
    " AND updated_at >= public.brooq_history_floor(%(id)s::uuid)"
)

TYPES = {
    "queue": "text",
    "topics": "text[]",
    "limit": "int",
    "worker": "text",
    "lease": "float8",
    "done": "uuid[]",
    "id": "uuid",
}


def statements(design: str) -> dict[str, str]:
    hot = "\n      AND job.state IN ('pending', 'failed')" if design == "b" else ""
    guard = "state = 'processing'" if design == "b" else "(state = 'processing') IS TRUE"
    rel = "job_all" if design == "c" else "job"
    out = {
        "claim": CLAIM.replace("{hot}", hot),
        "done": DONE_MOVE if design == "c" else DONE_UPDATE.replace("{guard}", guard),
        "lookup": LOOKUP.replace("{rel}", rel),
    }
    if design != "a":
        out["lookup_floor"] = LOOKUP_FLOOR.replace("{rel}", rel)
    return out


def sql_prepare(conn: psycopg.Connection[Any], name: str, text: str) -> list[str]:
    """PREPARE name AS text with its %(x)s as $n; the parameter names in order."""
    order: list[str] = []
    out = text
    for key in TYPES:
        if f"%({key})s" in out:
            order.append(key)
            out = out.replace(f"%({key})s", f"${len(order)}")
    types = ", ".join(TYPES[k] for k in order)
    conn.execute(f"PREPARE {name} ({types}) AS {out}")
    return order


def explain_execute(
    conn: psycopg.Connection[Any],
    name: str,
    order: list[str],
    params: dict[str, Any],
    timing: bool = False,
) -> dict[str, Any]:
    """EXPLAIN (ANALYZE, BUFFERS, WAL) EXECUTE: the server's figures for the statement."""
    cur = ClientCursor(conn)
    args = ", ".join(cur.mogrify("%s", (params[k],)) for k in order)
    opts = "ANALYZE, BUFFERS, WAL, FORMAT JSON" + ("" if timing else ", TIMING OFF")
    cur.execute(f"EXPLAIN ({opts}) EXECUTE {name}({args})")
    row = cur.fetchone()
    assert row is not None
    return dict(row[0][0])


def plan_figures(plan: dict[str, Any]) -> dict[str, Any]:
    top = plan["Plan"]
    return {
        "execution_ms": plan.get("Execution Time"),
        "planning_ms": plan.get("Planning Time"),
        "rows": top.get("Actual Rows"),
        "shared_hit": top.get("Shared Hit Blocks", 0),
        "shared_read": top.get("Shared Read Blocks", 0),
        "shared_dirtied": top.get("Shared Dirtied Blocks", 0),
        "wal_bytes": top.get("WAL Bytes", 0),
        "wal_records": top.get("WAL Records", 0),
        "wal_fpi": top.get("WAL FPI", 0),
    }


def cpu_ns(pid: int) -> int:
    """The CPU time a local backend has run so far, in ns (/proc/PID/schedstat): on a
    shared machine its wall time counts the other processes' turns, its CPU time not."""
    with open(f"/proc/{pid}/schedstat") as f:
        return int(f.read().split()[0])


def lsn(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn").fetchone()
    assert row is not None
    return int(row[0])


def spread(values: list[float]) -> dict[str, float | int | None]:
    if not values:
        return {"median": None, "min": None, "max": None, "n": 0}
    return {
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
        "n": len(values),
    }


# -- loading -------------------------------------------------------------------------


def load(conn: psycopg.Connection[Any], finished: int, pool: int, today: dt.datetime) -> None:
    """The rows every design gets, in two unlogged staging tables."""
    conn.execute("CREATE UNLOGGED TABLE public.stage_ids (id uuid, k int)")
    conn.execute("CREATE UNLOGGED TABLE public.stage_hot (id uuid, n int)")
    first = today - dt.timedelta(days=DAYS)
    base, span_ms = int(first.timestamp() * 1000), DAYS * 86_400_000
    low80 = (1 << 80) - 1
    # Only the ids and their ranks go over the wire, as text in large chunks; the
    # server derives the rest (creation from the id's milliseconds, the end from its
    # last 16 bits): ten million rows in a few minutes, not a Python loop of rows.
    with conn.cursor().copy("COPY public.stage_ids (id, k) FROM STDIN") as copy:
        for at in range(0, finished, 100_000):
            chunk = uuid7_many(min(100_000, finished - at))
            copy.write(
                "".join(
                    # evenly over the 30 days, in id order
                    f"{uuid.UUID(int=((base + (k * span_ms) // finished) << 80) | (m.int & low80))}"
                    f"\t{k}\n"
                    for k, m in enumerate(chunk, start=at)
                )
            )
    conn.execute(
        """CREATE UNLOGGED TABLE public.stage_fin AS
        SELECT id, c AS created_at,
               c + (1 + ('x' || right(id::text, 4))::bit(16)::int) * interval '1 ms'
                   AS updated_at,
               k % 50 = 0 AS dead
        FROM public.stage_ids,
             LATERAL (SELECT to_timestamp(('x' || left(replace(id::text, '-', ''), 12))
                                          ::bit(48)::bigint / 1000.0) AS c) AS t"""
    )
    conn.execute("DROP TABLE public.stage_ids")
    with conn.cursor().copy("COPY public.stage_hot (id, n) FROM STDIN") as copy:
        for k, made in enumerate(uuid7_many(pool)):
            copy.write_row((made, k))


FILL_FIN = """
INSERT INTO {rel} (id, topic, payload, state, attempts, available_at, locked_by,
                   locked_until, created_at, updated_at, queue, priority, started_at)
SELECT s.id, 't', jsonb_build_object('order', s.id, 'n', 12345),
       CASE WHEN s.dead THEN 'dead' ELSE 'done' END, 1, s.created_at, 'w',
       s.created_at + interval '30 seconds', s.created_at, s.updated_at, 'default', 0,
       s.created_at
FROM public.stage_fin s ORDER BY s.id
"""
FILL_HOT = """
INSERT INTO job (id, topic, payload, available_at, created_at, updated_at)
SELECT s.id, 't', jsonb_build_object('order', s.id, 'n', 12345),
       now() - interval '1 hour' + s.n * interval '1 ms', now(), now()
FROM public.stage_hot s ORDER BY s.id
"""


def build(dsn: str, design: str, days: list[dt.datetime]) -> float:
    started = time.perf_counter()
    with psycopg.connect(dsn, autocommit=True) as conn:
        for stmt in schema_ddl(design, days):
            conn.execute(stmt)
        conn.execute(FILL_FIN.format(rel="job_history" if design == "c" else "job"))
        conn.execute(FILL_HOT)
        conn.execute("VACUUM ANALYZE job")
        if design == "c":
            conn.execute("VACUUM ANALYZE job_history")
    return time.perf_counter() - started


# -- the measurement -------------------------------------------------------------------


class Session:
    """One design's connection, its statements prepared both ways."""

    def __init__(self, dsn: str, design: str) -> None:
        self.design = design
        self.conn = psycopg.connect(dsn, autocommit=True)
        self.pid = self.conn.info.backend_pid
        self.conn.execute(f"SET search_path = {design}, public")
        self.conn.execute("SET plan_cache_mode = force_generic_plan")
        self.text = statements(design)
        self.order = {k: sql_prepare(self.conn, f"s_{k}", v) for k, v in self.text.items()}
        self.params: dict[str, Any] = {
            "queue": "default",
            "topics": ["t"],
            "limit": BATCH,
            "worker": "w",
            "lease": 30.0,
        }

    def claim_done(self, explained: bool, out: dict[str, list[Any]]) -> None:
        p = self.params
        before = lsn(self.conn)
        if explained:
            # EXPLAIN returns no rows: the claimed ids are those now processing and ours.
            fig = plan_figures(explain_execute(self.conn, "s_claim", self.order["claim"], p))
            ids = [
                r[0]
                for r in self.conn.execute(
                    "SELECT id FROM job WHERE state = 'processing' AND locked_by = 'w'"
                )
            ]
            mid = lsn(self.conn)
            assert fig["rows"] == BATCH == len(ids), (self.design, fig["rows"], len(ids))
            out["claim_plan"].append(fig)
            dfig = plan_figures(
                explain_execute(self.conn, "s_done", self.order["done"], {**p, "done": ids})
            )
            assert dfig["rows"] == BATCH, (self.design, dfig)
            out["done_plan"].append(dfig)
        else:
            cpu, started = cpu_ns(self.pid), time.perf_counter()
            rows = self.conn.execute(self.text["claim"], p, prepare=True).fetchall()
            out["claim_client_ms"].append((time.perf_counter() - started) * 1000)
            out["claim_cpu_ms"].append((cpu_ns(self.pid) - cpu) / 1e6)
            assert len(rows) == BATCH, (self.design, len(rows))
            mid = lsn(self.conn)
            ids = [r[0] for r in rows]
            cpu, started = cpu_ns(self.pid), time.perf_counter()
            done = self.conn.execute(self.text["done"], {**p, "done": ids}, prepare=True).fetchall()
            out["done_client_ms"].append((time.perf_counter() - started) * 1000)
            out["done_cpu_ms"].append((cpu_ns(self.pid) - cpu) / 1e6)
            assert len(done) == BATCH, (self.design, len(done))
        after = lsn(self.conn)
        out["claim_lsn_bytes"].append(mid - before)
        out["done_lsn_bytes"].append(after - mid)

    def lookups(self, ids: list[uuid.UUID], out: dict[str, list[Any]]) -> None:
        # The relations the dones wrote today, analyzed as autovacuum soon would (a
        # partition that had no rows when the plan was made is planned as a seq scan).
        for rel in {
            "a": ["job_d30"],
            "b": ["job_hot", "job_fin_d30"],
            "c": ["job", "job_history_d30"],
        }[self.design]:
            self.conn.execute(f"ANALYZE {rel}")
        for k, job_id in enumerate(ids):
            if k % 8 == 0:
                fig = plan_figures(
                    explain_execute(
                        self.conn, "s_lookup", self.order["lookup"], {"id": job_id}, timing=True
                    )
                )
                assert fig["rows"] == 1, (self.design, fig)
                out["lookup_plan"].append(fig)
                cur = ClientCursor(self.conn)
                q = cur.mogrify(self.text["lookup"], {"id": job_id})
                cur.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + q)
                row = cur.fetchone()
                assert row is not None
                out["lookup_custom_plan"].append(plan_figures(dict(row[0][0])))
            cpu, started = cpu_ns(self.pid), time.perf_counter()
            got = self.conn.execute(self.text["lookup"], {"id": job_id}, prepare=True).fetchall()
            out["lookup_client_ms"].append((time.perf_counter() - started) * 1000)
            out["lookup_cpu_ms"].append((cpu_ns(self.pid) - cpu) / 1e6)
            assert len(got) == 1
            if "lookup_floor" not in self.text:
                continue
            if k % 8 == 0:
                fig = plan_figures(
                    explain_execute(
                        self.conn,
                        "s_lookup_floor",
                        self.order["lookup_floor"],
                        {"id": job_id},
                        timing=True,
                    )
                )
                assert fig["rows"] == 1, (self.design, fig)
                out["lookup_floor_plan"].append(fig)
            cpu = cpu_ns(self.pid)
            got = self.conn.execute(
                self.text["lookup_floor"], {"id": job_id}, prepare=True
            ).fetchall()
            out["lookup_floor_cpu_ms"].append((cpu_ns(self.pid) - cpu) / 1e6)
            assert len(got) == 1


def retention(dsn: str, design: str, days: list[dt.datetime]) -> dict[str, Any]:
    part = {"a": "job_d{:02d}", "b": "job_fin_d{:02d}", "c": "job_history_d{:02d}"}[design]
    res: dict[str, Any] = {"drop": [], "delete": []}
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"SET search_path = {design}, public")
        for k in range(3):  # the oldest days, dropped
            name = part.format(k)
            rows = conn.execute(f"SELECT count(*) FROM {name}").fetchone()[0]  # type: ignore[index]
            entry: dict[str, Any] = {"partition": name, "rows": rows}
            before = lsn(conn)
            started = time.perf_counter()
            with conn.transaction():
                if design == "a":
                    # job's partitions hold active rows too: one created that day and not
                    # finished (scheduled far ahead, retried for days) stops the drop.
                    t0 = time.perf_counter()
                    busy = conn.execute(
                        f"SELECT EXISTS (SELECT 1 FROM {name} "
                        "WHERE state NOT IN ('done', 'dead', 'canceled'))"
                    ).fetchone()[0]  # type: ignore[index]
                    entry["check_ms"] = (time.perf_counter() - t0) * 1000
                    assert not busy
                t0 = time.perf_counter()
                conn.execute(f"DROP TABLE {name}")
                entry["drop_ms"] = (time.perf_counter() - t0) * 1000
                entry["exclusive"] = [
                    r[0]
                    for r in conn.execute(
                        "SELECT c.relname FROM pg_locks l JOIN pg_class c ON c.oid = l.relation "
                        "WHERE l.pid = pg_backend_pid() AND l.mode = 'AccessExclusiveLock' "
                        "AND c.relkind IN ('r', 'p') ORDER BY 1"
                    )
                ]
            entry["total_ms"] = (time.perf_counter() - started) * 1000
            entry["lsn_bytes"] = lsn(conn) - before
            res["drop"].append(entry)
        for k in range(3, 6):  # three other days, deleted row by row, then vacuumed
            start, end = days[k], days[k] + dt.timedelta(days=1)
            if design == "a":
                lo = uuid7_floor(int(start.timestamp() * 1000))
                hi = uuid7_floor(int(end.timestamp() * 1000))
                where = f"id >= '{lo}' AND id < '{hi}' AND state IN ('done', 'dead', 'canceled')"
                rel = "job"
            elif design == "b":
                where = (
                    f"updated_at >= '{start.isoformat()}' AND updated_at < '{end.isoformat()}'"
                    " AND state IN ('done', 'dead', 'canceled')"
                )
                rel = "job"
            else:
                where = f"updated_at >= '{start.isoformat()}' AND updated_at < '{end.isoformat()}'"
                rel = "job_history"
            plan = conn.execute(
                "EXPLAIN (ANALYZE, BUFFERS, WAL, TIMING OFF, FORMAT JSON) "
                f"DELETE FROM {rel} WHERE {where}"
            ).fetchone()[0][0]  # type: ignore[index]
            entry = {"day": k, **plan_figures(plan)}
            t0 = time.perf_counter()
            conn.execute(f"VACUUM {part.format(k)}")
            entry["vacuum_ms"] = (time.perf_counter() - t0) * 1000
            res["delete"].append(entry)
    return res


def race_b(dsn: str) -> dict[str, Any]:
    """Design b's trap: a locker meets a row an outcome moved to another partition."""
    out: dict[str, Any] = {}

    def pick(conn: psycopg.Connection[Any], state: str) -> uuid.UUID:
        row = conn.execute(
            "SELECT id FROM b.job WHERE state = 'pending' ORDER BY id LIMIT 1"
        ).fetchone()
        assert row is not None
        if state == "processing":  # as a claim leaves it
            conn.execute(
                "UPDATE b.job SET state = 'processing', locked_by = 'x', "
                "locked_until = now() + interval '1 hour' WHERE id = %s",
                (row[0],),
            )
        job_id: uuid.UUID = row[0]
        return job_id

    cases = {
        # A waiting locker (a cancel's or a lease renewal's FOR NO KEY UPDATE).
        "wait_lock": (
            "processing",
            "done",
            "SELECT id FROM b.job WHERE id = %s FOR NO KEY UPDATE",
            0.0,
        ),
        # A waiting UPDATE (a cancel) racing the done.
        "wait_update": (
            "processing",
            "done",
            "UPDATE b.job SET state = 'canceled', updated_at = now() "
            "WHERE id = %s AND state IN ('pending', 'processing') RETURNING id",
            0.0,
        ),
        # The claim's SKIP LOCKED: its snapshot taken before a cancel commits, its lock
        # after (widened here by a sleep in the scan's filter).
        "claim_skip_locked": (
            "pending",
            "canceled",
            "SELECT id FROM b.job WHERE id = %s AND state IN ('pending', "
            "'failed') AND pg_sleep(1.0) IS NOT NULL "
            "FOR NO KEY UPDATE SKIP LOCKED",
            0.4,
        ),
    }
    for case, (state, outcome, locker, delay) in cases.items():
        with (
            psycopg.connect(dsn, autocommit=True) as mover,
            psycopg.connect(dsn, autocommit=True) as other,
        ):
            job_id = pick(mover, state)
            result: dict[str, Any] = {}

            def lock(
                job_id: uuid.UUID = job_id, locker: str = locker, result: dict[str, Any] = result
            ) -> None:
                try:
                    rows = other.execute(locker, (job_id,)).fetchall()
                    result["rows"] = len(rows)
                except psycopg.Error as exc:
                    result["sqlstate"] = exc.sqlstate
                    result["error"] = str(exc.diag.message_primary)

            with mover.transaction():
                mover.execute(
                    "UPDATE b.job SET state = %s, updated_at = now() WHERE id = %s",
                    (outcome, job_id),
                )
                if delay:  # the locker's snapshot first, then the mover commits
                    thread = threading.Thread(target=lock)
                    thread.start()
                    time.sleep(delay)
                else:
                    thread = threading.Thread(target=lock)
                    thread.start()
                    time.sleep(0.5)  # the locker waits on the mover's row lock
            thread.join()
            out[case] = {"state": state, "outcome": outcome, "locker": locker, **result}
    return out


def race_c(dsn: str) -> dict[str, Any]:
    """The same waiting locker against design c's move: the row is gone, no error."""
    with (
        psycopg.connect(dsn, autocommit=True) as mover,
        psycopg.connect(dsn, autocommit=True) as other,
    ):
        row = mover.execute(
            "UPDATE c.job SET state = 'processing', locked_by = 'x', "
            "locked_until = now() + interval '1 hour' "
            "WHERE id = (SELECT id FROM c.job WHERE state = 'pending' ORDER BY id LIMIT 1) "
            "RETURNING id"
        ).fetchone()
        assert row is not None
        result: dict[str, Any] = {}

        def lock() -> None:
            try:
                result["rows"] = len(
                    other.execute(
                        "SELECT id FROM c.job WHERE id = %s FOR NO KEY UPDATE", (row[0],)
                    ).fetchall()
                )
            except psycopg.Error as exc:
                result["error"] = str(exc.diag.message_primary)

        with mover.transaction():
            mover.execute(
                "WITH gone AS (DELETE FROM c.job WHERE id = %s RETURNING *) "
                "INSERT INTO c.job_history SELECT * FROM gone",
                (row[0],),
            )
            thread = threading.Thread(target=lock)
            thread.start()
            time.sleep(0.5)
        thread.join()
    return result


def summarize(figs: dict[str, dict[str, list[Any]]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for design, f in figs.items():
        s: dict[str, Any] = {}
        for what in ("claim", "done"):
            s[f"{what}_client_us_per_job"] = spread(
                [v * 1000 / BATCH for v in f[f"{what}_client_ms"]]
            )
            s[f"{what}_cpu_us_per_job"] = spread([v * 1000 / BATCH for v in f[f"{what}_cpu_ms"]])
            plans = f[f"{what}_plan"]
            s[f"{what}_server_us_per_job"] = spread(
                [p["execution_ms"] * 1000 / BATCH for p in plans]
            )
            s[f"{what}_wal_bytes_per_job"] = spread([p["wal_bytes"] / BATCH for p in plans])
            s[f"{what}_fpi_per_batch"] = spread([float(p["wal_fpi"]) for p in plans])
            s[f"{what}_buffers_per_job"] = spread(
                [(p["shared_hit"] + p["shared_read"]) / BATCH for p in plans]
            )
            s[f"{what}_lsn_bytes_per_job"] = spread([v / BATCH for v in f[f"{what}_lsn_bytes"]])
        s["lookup_client_us"] = spread([v * 1000 for v in f["lookup_client_ms"]])
        s["lookup_cpu_us"] = spread([v * 1000 for v in f["lookup_cpu_ms"]])
        s["lookup_floor_cpu_us"] = spread([v * 1000 for v in f.get("lookup_floor_cpu_ms", [])])
        floor = f.get("lookup_floor_plan", [])
        s["lookup_floor_execution_ms"] = spread([p["execution_ms"] for p in floor])
        s["lookup_floor_buffers"] = spread(
            [float(p["shared_hit"] + p["shared_read"]) for p in floor]
        )
        s["lookup_generic_planning_ms"] = spread([p["planning_ms"] for p in f["lookup_plan"]])
        s["lookup_generic_execution_ms"] = spread([p["execution_ms"] for p in f["lookup_plan"]])
        s["lookup_generic_buffers"] = spread(
            [float(p["shared_hit"] + p["shared_read"]) for p in f["lookup_plan"]]
        )
        s["lookup_custom_planning_ms"] = spread([p["planning_ms"] for p in f["lookup_custom_plan"]])
        s["lookup_custom_execution_ms"] = spread(
            [p["execution_ms"] for p in f["lookup_custom_plan"]]
        )
        s["lookup_custom_buffers"] = spread(
            [float(p["shared_hit"] + p["shared_read"]) for p in f["lookup_custom_plan"]]
        )
        out[design] = s
    return out


def fmt(s: dict[str, Any] | None, digits: int = 1) -> str:
    if s is None or s["median"] is None:  # None: a figure an older run did not measure
        return "-"
    return f"{s['median']:.{digits}f} ({s['min']:.{digits}f}-{s['max']:.{digits}f})"


def write_markdown(path: Path, report: dict[str, Any]) -> None:
    lines = ["# Where finished jobs live: three designs measured", ""]
    lines += run_markdown(report, "##")
    for other in report.get("added", []):
        which = ", ".join(d.upper() for d in other["summary"])
        lines += ["", f"## Another run: {other['args']['finished']:,} finished rows, {which}", ""]
        lines += run_markdown(other, "###")
    path.write_text("\n".join(lines) + "\n")


def run_markdown(report: dict[str, Any], level: str) -> list[str]:
    """One run's tables."""
    s, ret, a = report["summary"], report["retention"], report["args"]
    designs = tuple(s)
    rows = [
        ("claim, backend CPU µs/job (schedstat)", "claim_cpu_us_per_job", 2),
        ("claim, client µs/job (prepared, autocommit)", "claim_client_us_per_job", 2),
        ("claim, server µs/job (EXPLAIN ANALYZE)", "claim_server_us_per_job", 2),
        ("claim, WAL bytes/job (EXPLAIN WAL)", "claim_wal_bytes_per_job", 0),
        ("claim, full-page images per batch", "claim_fpi_per_batch", 0),
        ("claim, shared buffers/job", "claim_buffers_per_job", 1),
        ("done, backend CPU µs/job (schedstat)", "done_cpu_us_per_job", 2),
        ("done, client µs/job (prepared, autocommit)", "done_client_us_per_job", 2),
        ("done, server µs/job (EXPLAIN ANALYZE)", "done_server_us_per_job", 2),
        ("done, WAL bytes/job (EXPLAIN WAL)", "done_wal_bytes_per_job", 0),
        ("done, full-page images per batch", "done_fpi_per_batch", 0),
        ("done, shared buffers/job", "done_buffers_per_job", 1),
        ("lookup by id, backend CPU µs (prepared)", "lookup_cpu_us", 0),
        ("lookup by id, client µs (prepared)", "lookup_client_us", 0),
        ("lookup, generic plan: planning ms", "lookup_generic_planning_ms", 3),
        ("lookup, generic plan: execution ms", "lookup_generic_execution_ms", 3),
        ("lookup, generic plan: buffers", "lookup_generic_buffers", 0),
        ("lookup, custom plan: planning ms", "lookup_custom_planning_ms", 3),
        ("lookup, custom plan: execution ms", "lookup_custom_execution_ms", 3),
        ("lookup, custom plan: buffers", "lookup_custom_buffers", 0),
        ("lookup + brooq_history_floor, backend CPU µs", "lookup_floor_cpu_us", 0),
        ("lookup + brooq_history_floor, generic: execution ms", "lookup_floor_execution_ms", 3),
        ("lookup + brooq_history_floor, generic: buffers", "lookup_floor_buffers", 0),
    ]
    lines = [
        f"`benchmarks/history_options.py` on {report['date']}: {a['finished']:,} finished rows "
        f"over {DAYS} days in each design, {a['rounds']} rounds x {a['cycles']} claim+done "
        f"cycles of {BATCH} jobs per design (half timed from the client, half through "
        f"EXPLAIN), {a['lookups']} lookups per round. PostgreSQL "
        f"{report['server']['server_version']}, shared_buffers "
        f"{report['server']['shared_buffers']}, synchronous_commit "
        f"{report['server']['synchronous_commit']}; a 2-core machine shared with other "
        f"work (load average {report['load_before']} at the start): wall times (the "
        "client's, EXPLAIN's) count the other processes' turns and are noisy; the "
        "backend's CPU time (/proc/PID/schedstat), the buffers and the WAL are what to "
        "compare. Median (min-max) over cycles.",
        "",
        "| figure | " + " | ".join(NAMES[d] for d in designs) + " |",
        "|---|" + "---|" * len(designs),
    ]
    for label, key, digits in rows:
        lines.append(
            f"| {label} | " + " | ".join(fmt(s[d].get(key), digits) for d in designs) + " |"
        )
    lines += ["", f"{level} Retention of one day's rows", ""]
    lines.append(
        "| design | rows a day | DROP (ms) | check before DROP (ms) | relations held "
        "ACCESS EXCLUSIVE by the DROP | DELETE (ms) | DELETE WAL (MB) | "
        "VACUUM after DELETE (ms) |"
    )
    lines.append("|---|---|---|---|---|---|---|---|")
    for d in designs:
        drops, dels = ret[d]["drop"], ret[d]["delete"]
        checks = [e["check_ms"] for e in drops if "check_ms" in e]
        lines.append(
            f"| {d} | {drops[0]['rows']:,} | {fmt(spread([e['drop_ms'] for e in drops]))} | "
            f"{fmt(spread(checks)) if checks else '-'} | {', '.join(drops[0]['exclusive'])} | "
            f"{fmt(spread([e['execution_ms'] for e in dels]))} | "
            f"{fmt(spread([e['wal_bytes'] / 1e6 for e in dels]), 2)} | "
            f"{fmt(spread([e['vacuum_ms'] for e in dels]))} |"
        )
    if report["race_b"]:
        lines += ["", f"{level} Design B's race (two connections)", ""]
    for case, r in report["race_b"].items():
        what = (
            f"`{r['error']}` (SQLSTATE {r['sqlstate']})"
            if "error" in r
            else f"{r.get('rows')} rows, no error"
        )
        lines.append(
            f"- {case}: a `{r['state']}` job set `{r['outcome']}` by one connection "
            f"(row moved to job_fin) while the other runs `{r['locker']}`: {what}"
        )
    rc = report["race_c"]
    if rc:
        lines.append(
            f"- design C, the same waiting FOR NO KEY UPDATE against the DELETE + INSERT: "
            f"{rc.get('rows')} rows, {'error ' + rc['error'] if 'error' in rc else 'no error'}"
        )
    lines += ["", f"{level} Plans (generic, as prepared)", ""]
    for d in designs:
        lines.append(
            f"- {d}: claim `{report['plans'][d]['claim']}`; done "
            f"`{report['plans'][d]['done']}`; lookup `{report['plans'][d]['lookup']}`"
        )
    return lines


def plan_shape(
    conn: psycopg.Connection[Any], name: str, order: list[str], params: dict[str, Any]
) -> str:
    """The generic plan's nodes, one line (how many partitions it reads)."""
    cur = ClientCursor(conn)
    args = ", ".join(cur.mogrify("%s", (params[k],)) for k in order)
    cur.execute(f"EXPLAIN (FORMAT JSON) EXECUTE {name}({args})")
    row = cur.fetchone()
    assert row is not None
    counts: dict[str, int] = {}

    def walk(node: dict[str, Any]) -> None:
        key = node["Node Type"]
        counts[key] = counts.get(key, 0) + 1
        for child in node.get("Plans", []):
            walk(child)

    walk(row[0][0]["Plan"])
    return ", ".join(f"{k} x{v}" for k, v in counts.items())


def add_run(out: Path, other: Path) -> None:
    if not out.is_absolute():
        out = Path(__file__).resolve().parent / out
    try:
        report = json.loads(out.read_text())
        added = json.loads(other.read_text())
    except (OSError, ValueError) as exc:
        print(f"history_options.py: --add: {exc}", file=sys.stderr)
        sys.exit(2)
    added.pop("raw", None)
    report["added"] = [r for r in report.get("added", []) if r["date"] != added["date"]]
    report["added"].append(added)
    out.write_text(json.dumps(report, indent=1, default=str))
    write_markdown(out.with_suffix(".md"), report)
    log(f"added {other} to {out} and {out.with_suffix('.md')}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dsn", default=DEFAULT_DSN)
    parser.add_argument("--finished", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--cycles", type=int, default=8)
    parser.add_argument("--lookups", type=int, default=40)
    parser.add_argument("--designs", default="a,b,c", help="a subset, e.g. a,c")
    parser.add_argument("--out", default="results/history-options.json")
    parser.add_argument(
        "--add",
        metavar="OTHER.json",
        help="measure nothing: add OTHER's run (e.g. a larger history) to OUT and its .md",
    )
    args = parser.parse_args()
    if args.add:
        add_run(Path(args.out), Path(args.add))
        return
    designs = tuple(d for d in DESIGNS if d in args.designs.split(","))
    if not designs or set(args.designs.split(",")) - set(DESIGNS):
        parser.error(f"--designs: a comma-separated subset of {','.join(DESIGNS)}")
    out = Path(args.out)
    if not out.is_absolute():
        out = Path(__file__).resolve().parent / out
    now = dt.datetime.now(dt.timezone.utc)
    today = now.replace(hour=0, minute=0, second=0, microsecond=0)
    days = day_starts(today)
    pool = args.rounds * args.cycles * BATCH + BATCH
    with open("/proc/loadavg") as f:
        load_before = f.read().split()[0]
    report: dict[str, Any] = {
        "date": now.isoformat(timespec="seconds"),
        "args": vars(args),
        "load_before": load_before,
        "build_s": {},
    }
    with fresh_database(args.dsn, "histopt") as dsn:
        migrate_tree(dsn)
        report["server"] = server_facts(dsn)
        with psycopg.connect(dsn, autocommit=True) as conn:
            t0 = time.perf_counter()
            load(conn, args.finished, pool, today)
            took = time.perf_counter() - t0
            log(f"staged {args.finished:,} finished + {pool:,} ready in {took:.0f} s")
        for d in designs:
            report["build_s"][d] = build(dsn, d, days)
            log(f"built {d} in {report['build_s'][d]:.0f} s")
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("DROP TABLE public.stage_hot")
            sample = [
                r[0]
                for r in conn.execute(
                    "SELECT id FROM public.stage_fin WHERE created_at >= %s AND created_at < %s "
                    "ORDER BY random() LIMIT %s",
                    (days[10], days[25], args.rounds * args.lookups),
                )
            ]
        sessions = {d: Session(dsn, d) for d in designs}
        report["plans"] = {
            d: {
                k: plan_shape(
                    s.conn, f"s_{k}", s.order[k], {**s.params, "done": [sample[0]], "id": sample[0]}
                )
                for k in ("claim", "done", "lookup")
            }
            for d, s in sessions.items()
        }
        figs: dict[str, dict[str, list[Any]]] = {
            d: {
                k: []
                for k in (
                    "claim_client_ms",
                    "done_client_ms",
                    "claim_plan",
                    "done_plan",
                    "claim_lsn_bytes",
                    "done_lsn_bytes",
                    "lookup_client_ms",
                    "lookup_plan",
                    "lookup_custom_plan",
                    "claim_cpu_ms",
                    "done_cpu_ms",
                    "lookup_cpu_ms",
                    "lookup_floor_plan",
                    "lookup_floor_cpu_ms",
                )
            }
            for d in designs
        }
        t0 = time.perf_counter()
        for r in range(args.rounds):
            order = designs[r % len(designs) :] + designs[: r % len(designs)]
            ids = sample[r * args.lookups : (r + 1) * args.lookups]
            for d in order:
                for c in range(args.cycles):
                    sessions[d].claim_done(c % 2 == 1, figs[d])
                sessions[d].lookups(ids, figs[d])
            log(f"round {r + 1}/{args.rounds} done ({time.perf_counter() - t0:.0f} s)")
        report["measure_s"] = time.perf_counter() - t0
        report["race_b"] = race_b(dsn) if "b" in designs else {}
        report["race_c"] = race_c(dsn) if "c" in designs else {}
        log(f"race: {report['race_b']}")
        for s in sessions.values():
            s.conn.close()
        report["retention"] = {d: retention(dsn, d, days) for d in designs}
    report["summary"] = summarize(figs)
    report["raw"] = figs
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1, default=str))
    write_markdown(out.with_suffix(".md"), report)
    log(f"wrote {out} and {out.with_suffix('.md')}")


if __name__ == "__main__":
    main()
