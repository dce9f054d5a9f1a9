"""The locks a migration (0003, queues, by default; `--migration 6` for 0006, handlers;
`--migration 11` for 0011, unique keys and tags; `--migration 12` for 0012, rate limits
and groups; `--migration 13` for 0013, workflows; `--migration 14` for 0014, progress,
logs and trace context; `--migration 15` for 0015, lighter inserts; `--migration 16` for
0016, flat cascades; `--migration 17` for 0017, durable handlers; `--migration 18` for
0018, tracebacks kept; `--migration 19` for 0019, each attempt's start; `--migration 20`
for 0020, the finished jobs' history; `--migration 23` for 0023, jobs on hold;
`--migration 24` for 0024, groups taken in turn; `--migration 26` for 0026, ordered keys;
`--migration 27` for 0027, rates in batches; `--migration 28` for 0028, the groups' floors;
`--migration 29` for 0029, the groups' windows a claim at a time; `--migration 30` for
0030, a graph's edges in one pass; `--migration 31` for 0031, a graph's counts planned
without the estimate of its new rows) takes on a live
table, through the real migrator.

Run by hand (never part of `make test`); about two minutes on 2 cores:

    .venv/bin/python benchmarks/migration_locks.py [--dsn ADMIN_DSN] [--rows 1000000]
    .venv/bin/python benchmarks/migration_locks.py --migration 6
    .venv/bin/python benchmarks/migration_locks.py --migration 12

In a scratch database of its own (dropped at the end): `brooq.migrate.up(dsn, N - 1)`, then
ROWS jobs (90 % `done`, 10 % pending over three topics, one INSERT ... SELECT
generate_series), ANALYZE. Then, while

- a producer probe inserts one job every 20 ms (its own connection, autocommit),
- a claim probe runs the claim of the release before migration N (job_finish_and_claim,
  limit 1, rolled back: the rows stay ready) every 20 ms -- that statement, because during
  the deploy only masters of the previous release run (a newer master refuses to start on
  a schema it does not know): for 0003 the statement of 8a67732, for 0006, 0011, 0012 and
  0013 to 0018, 0023, 0024 and 0026 today's without the ordering key moved into
  job_history (none changes the statement the previous release sends for a topic without
  limits), for 0027 to 0031 today's itself, for 0019 that without `started_at = now()`, for 0020
  that with its done an UPDATE (the release before moved no rows itself),
- for 0020, an ending probe: every 20 ms the job the producer probe inserted last is
  ended as the release before ends it (an UPDATE to done: after the up step the trigger
  moves it to job_history, so the down step has rows to bring back),
- a sampler reads pg_locks of the migrating backend every 5 ms (the lock modes it holds
  or waits for on job, and on job_history, reported as "job_history <mode>"),

it runs, each scenario in turn:

1. `brooq.migrate.up(dsn, N)`: migration N alone (later ones are not measured);
2. `brooq.migrate.down(dsn)`: its down step;
3. `up` again while a transaction that has read job stays open for 3 s (it started just
   before the migration): the first ALTER waits for it, lock_timeout (500 ms) ends the
   wait and the migrator retries, so producers queue behind the ALTER for at most
   ~500 ms at a time;
4. (`--control`, after an unmeasured down) the same with the migrator's lock_timeout
   switched off: how long producers wait without it.

With `--ended N` (0020 only), N pending jobs are ended by one UPDATE after the up step
(the trigger moves them to job_history): the down step's lock then covers copying them
back. For 0020 the down step is verified: the rows in job_history before it (ids, states and
ends, with the probes stopped) are in job after it with the same values, job_history and
job_all are gone, the schema is at 0019, and up runs again.

Every statement of the migration is timed by wrapping brooq.migrate._run, the one place
the migrator sends a migration file's text (so the figures are of the real migrator's
statements, retries included). A statement of a no-transaction file runs in a transaction
of its own with the version record (brooq.schema.check), so a lock it takes lasts at most
as long as that transaction, whose time bounds the lock. The sampler
confirms which modes were held; a lock held for less than its 5 ms period can be
missed. Prints Markdown tables; --json writes every figure.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's brooq

import psycopg
from brooq import migrate
from brooq.sql import Q
from psycopg import conninfo, sql

DEFAULT_DSN = "postgresql://postgres@127.0.0.1:5432/postgres"
APP_NAME = "brooq_migration_locks"  # the migrator's connections, as the sampler finds them
PROBE_PERIOD = 0.020
SAMPLE_PERIOD = 0.005
READER_HOLD = 3.0
BASELINE = 1.0  # seconds of probes before each scenario

# job_finish_and_claim of the release before migration 0003 (brooq/sql/queries.sql at
# 8a67732): what the masters still running during a deploy send. It is valid on both
# schemas, before and after 0003, which the current statement may not be.
CLAIM_BEFORE_0003 = """
WITH finished AS (
    UPDATE job SET state = 'done', updated_at = now()
    WHERE id = ANY(%(done)s::uuid[]) AND state = 'processing' AND locked_by = %(worker)s
    RETURNING id
),
next AS MATERIALIZED (
    SELECT id
    FROM job
    WHERE state IN ('pending', 'failed')
      AND available_at <= now()
      AND topic = ANY(%(topics)s::text[])
    ORDER BY available_at, id
    LIMIT least(%(limit)s, (
        SELECT (count(*) + %(children)s - 1) / %(children)s
        FROM (
            SELECT 1 FROM job
            WHERE state IN ('pending', 'failed')
              AND available_at <= now()
              AND topic = ANY(%(topics)s::text[])
            ORDER BY available_at, id
            LIMIT %(limit)s * %(children)s
        ) AS ready
    ))
    FOR NO KEY UPDATE SKIP LOCKED
),
claimed AS (
    UPDATE job
    SET state = 'processing',
        attempts = job.attempts + 1,
        locked_by = %(worker)s,
        locked_until = now() + make_interval(secs => %(lease)s),
        updated_at = now()
    WHERE job.id = ANY(ARRAY(SELECT id FROM next))
    RETURNING job.id, job.topic, job.payload, job.attempts, job.locked_by, job.locked_until,
              job.available_at
)
SELECT true AS claimed, id, topic, payload, attempts, locked_by, locked_until, available_at
FROM claimed
UNION ALL
SELECT false, id, NULL::text, NULL::jsonb, NULL::integer, NULL::text, NULL::timestamptz,
       NULL::timestamptz
FROM finished
"""
TOPICS = ["bench.a", "bench.b", "bench.c", "bench.probe"]
CLAIM_PARAMS = {
    "done": [],
    "worker": "probe",
    "topics": TOPICS,
    "limit": 1,
    "children": 2,
    "lease": 30.0,
    "queue": "default",  # unused by CLAIM_BEFORE_0003
}
# job_finish_and_claim of the release before migration 0026: today's without the ordering
# key it carries into job_history (the column that migration adds).
_ORDERING = ", f.ordering_key\n"
assert Q.job_finish_and_claim.count(_ORDERING) == 1, "the claim no longer moves ordering_key so"
CLAIM_BEFORE_0026 = Q.job_finish_and_claim.replace(_ORDERING, "\n")
# job_finish_and_claim of the release before migration 0019: today's without the
# claim's start (the column that migration adds).
_STARTED = (
    "        -- The attempt's start, kept once it ended (updated_at is then its end).\n"
    "        started_at = now(),\n"
)
assert CLAIM_BEFORE_0026.count(_STARTED) == 1, "the claim no longer sets started_at so"
CLAIM_BEFORE_0019 = CLAIM_BEFORE_0026.replace(_STARTED, "")
# job_finish_and_claim of the release before migration 0020: today's with the old done,
# an UPDATE of the rows in place (job_history does not exist yet).
_MOVE = re.compile(r"WITH finished AS \(\n.*?    FROM finished AS f\n\),\n", re.S)
_DONE_IN_PLACE = """WITH finished AS (
    UPDATE job SET state = 'done', updated_at = now()
    WHERE id = ANY(%(done)b::uuid[]) AND (state = 'processing') IS TRUE
      AND locked_by = %(worker)s
    RETURNING id
),
"""
assert len(_MOVE.findall(CLAIM_BEFORE_0026)) == 1, "the claim's done no longer moves so"
CLAIM_BEFORE_0020 = _MOVE.sub(lambda _: _DONE_IN_PLACE, CLAIM_BEFORE_0026)
# The migrations this measures: version -> the claim the release before it sends.
CLAIM_BEFORE = {
    3: CLAIM_BEFORE_0003,
    6: CLAIM_BEFORE_0026,
    11: CLAIM_BEFORE_0026,
    12: CLAIM_BEFORE_0026,
    13: CLAIM_BEFORE_0026,
    14: CLAIM_BEFORE_0026,
    15: CLAIM_BEFORE_0026,
    16: CLAIM_BEFORE_0026,
    17: CLAIM_BEFORE_0026,
    18: CLAIM_BEFORE_0026,
    19: CLAIM_BEFORE_0019,
    20: CLAIM_BEFORE_0020,
    23: CLAIM_BEFORE_0026,
    24: CLAIM_BEFORE_0026,
    26: CLAIM_BEFORE_0026,
    27: Q.job_finish_and_claim,
    28: Q.job_finish_and_claim,
    29: Q.job_finish_and_claim,
    30: Q.job_finish_and_claim,
    31: Q.job_finish_and_claim,
}
MIGRATION = 3  # set by --migration

LOAD = """
INSERT INTO job (topic, payload, state, attempts, available_at, created_at, updated_at)
SELECT (ARRAY['bench.a', 'bench.b', 'bench.c'])[1 + i %% 3],
       jsonb_build_object('i', i),
       CASE WHEN i <= %(done)s THEN 'done' ELSE 'pending' END,
       CASE WHEN i <= %(done)s THEN 1 ELSE 0 END,
       now() - make_interval(secs => (%(rows)s - i) / 1000.0),
       now() - make_interval(secs => (%(rows)s - i) / 1000.0),
       now() - make_interval(secs => (%(rows)s - i) / 1000.0)
FROM generate_series(1, %(rows)s) AS i
"""


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# -- instruments ------------------------------------------------------------------------------


@dataclass
class StatementRun:
    label: str
    start: float
    end: float
    error: str | None = None

    @property
    def ms(self) -> float:
        return (self.end - self.start) * 1000


class StatementTimer:
    """Wraps brooq.migrate._run (where the migrator sends a file's text) to time each
    statement, failed attempts included."""

    def __init__(self) -> None:
        self.runs: list[StatementRun] = []

    @contextmanager
    def installed(self) -> Iterator[None]:
        original = migrate._run

        def timed(conn: Any, script: str) -> None:
            label = " ".join(re.sub(r"--[^\n]*", "", script).split())
            run = StatementRun(label, time.perf_counter(), 0.0)
            try:
                original(conn, script)
            except psycopg.Error as exc:
                run.error = type(exc).__name__
                raise
            finally:
                run.end = time.perf_counter()
                self.runs.append(run)

        migrate._run = timed
        try:
            yield
        finally:
            migrate._run = original


class Probe(threading.Thread):
    """Runs ``action`` on a connection of its own every PROBE_PERIOD; keeps (t, seconds)."""

    def __init__(self, dsn: str, name: str, action: Callable[[psycopg.Connection[Any]], None]):
        super().__init__(name=name, daemon=True)
        self.dsn = dsn
        self.action = action
        self.stop_event = threading.Event()
        self.samples: list[tuple[float, float]] = []
        self.errors: list[str] = []

    def run(self) -> None:
        with psycopg.connect(self.dsn, autocommit=True, application_name="probe") as conn:
            conn.execute("SET enable_bitmapscan = off")  # as brooq's children run
            next_at = time.perf_counter()
            while not self.stop_event.is_set():
                t0 = time.perf_counter()
                try:
                    self.action(conn)
                except psycopg.Error as exc:
                    self.errors.append(f"{type(exc).__name__}: {exc}".strip())
                self.samples.append((t0, time.perf_counter() - t0))
                next_at = max(next_at + PROBE_PERIOD, time.perf_counter())
                self.stop_event.wait(max(0.0, next_at - time.perf_counter()))

    def stop(self) -> None:
        self.stop_event.set()
        self.join(30)

    def between(self, start: float, end: float) -> list[float]:
        """Latencies (ms) of the probes that overlapped [start, end]."""
        return [s * 1000 for t, s in self.samples if t <= end and t + s >= start]


INSERTED: list[Any] = []  # the producer probe's jobs, newest last (the ending probe's)
ENDED: list[Any] = []  # the jobs the ending probe ended


def probe_insert(conn: psycopg.Connection[Any]) -> None:
    row = conn.execute(
        "INSERT INTO job (topic, payload) VALUES ('bench.probe', '{}'::jsonb) RETURNING id",
        prepare=True,
    ).fetchone()
    if row:
        INSERTED.append(row[0])


def probe_end(conn: psycopg.Connection[Any]) -> None:
    """The producer probe's newest job ended as the release before 0020 ends one (an
    UPDATE to done; after 0020's up step its trigger moves the row to job_history)."""
    if not INSERTED:
        return
    job_id = INSERTED.pop()
    conn.execute(
        "UPDATE job SET state = 'done', updated_at = now() WHERE id = %s AND state = 'pending'",
        (job_id,),
        prepare=True,
    )
    ENDED.append(job_id)


def probe_claim(conn: psycopg.Connection[Any]) -> None:
    with conn.transaction(force_rollback=True):
        conn.execute(CLAIM_BEFORE[MIGRATION], CLAIM_PARAMS, prepare=True).fetchall()


class LockSampler(threading.Thread):
    """pg_locks of the migrator's backends on job, every SAMPLE_PERIOD."""

    # job's modes as they are, job_history's (and its partitions') prefixed.
    QUERY = """
        SELECT CASE WHEN l.relation = %(job)s::oid THEN l.mode
                    ELSE 'job_history ' || l.mode END, l.granted
        FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
        WHERE a.application_name = %(app)s AND l.locktype = 'relation'
          AND (l.relation = %(job)s::oid OR l.relation IN (
              SELECT c.oid FROM pg_class c WHERE c.relname LIKE 'job\\_history%%'
                AND c.relkind IN ('p', 'r')))
    """

    def __init__(self, dsn: str, job_oid: int) -> None:
        super().__init__(name="locks", daemon=True)
        self.dsn = dsn
        self.job_oid = job_oid
        self.stop_event = threading.Event()
        # (middle of the query, modes): the middle, since the server looked at some
        # moment between sending and receiving
        self.samples: list[tuple[float, frozenset[str]]] = []
        self.sent: list[float] = []  # when each sample's query was sent

    def run(self) -> None:
        params = {"app": APP_NAME, "job": self.job_oid}
        with psycopg.connect(self.dsn, autocommit=True, application_name="sampler") as conn:
            while not self.stop_event.is_set():
                t = time.perf_counter()
                rows = conn.execute(self.QUERY, params, prepare=True).fetchall()
                modes = frozenset(m if granted else f"{m} (waiting)" for m, granted in rows)
                self.samples.append(((t + time.perf_counter()) / 2, modes))
                self.sent.append(t)
                self.stop_event.wait(max(0.0, SAMPLE_PERIOD - (time.perf_counter() - t)))

    def stop(self) -> None:
        self.stop_event.set()
        self.join(30)

    def holds(self) -> dict[str, list[tuple[float, float, float]]]:
        """mode -> [(first seen, seen for at least ms, at most ms)], one per stretch of
        consecutive samples showing it. At most: from the sample before to the one after."""
        out: dict[str, list[tuple[float, float, float]]] = {}
        s = self.samples
        modes = {m for _, ms in s for m in ms}
        for mode in modes:
            i = 0
            while i < len(s):
                if mode not in s[i][1]:
                    i += 1
                    continue
                j = i
                while j + 1 < len(s) and mode in s[j + 1][1]:
                    j += 1
                before = s[i - 1][0] if i > 0 else s[i][0]
                after = s[j + 1][0] if j + 1 < len(s) else s[j][0]
                out.setdefault(mode, []).append(
                    (s[i][0], (s[j][0] - s[i][0]) * 1000, (after - before) * 1000)
                )
                i = j + 1
        return out

    def period_ms(self) -> float:
        gaps = [b[0] - a[0] for a, b in zip(self.samples, self.samples[1:], strict=False)]
        return statistics.mean(gaps) * 1000 if gaps else float("nan")


# -- the run ----------------------------------------------------------------------------------


@dataclass
class Scenario:
    name: str
    wall_ms: float = 0.0
    statements: list[dict[str, Any]] = field(default_factory=list)
    locks: dict[str, dict[str, Any]] = field(default_factory=dict)
    insert: dict[str, Any] = field(default_factory=dict)
    claim: dict[str, Any] = field(default_factory=dict)
    baseline_insert: dict[str, Any] = field(default_factory=dict)
    baseline_claim: dict[str, Any] = field(default_factory=dict)
    end: dict[str, Any] = field(default_factory=dict)
    baseline_end: dict[str, Any] = field(default_factory=dict)
    lock_waits_timed_out: int = 0
    probe_errors: list[str] = field(default_factory=list)
    sampler_period_ms: float = 0.0


def stats(values: list[float]) -> dict[str, Any]:
    if not values:
        return {"n": 0, "mean_ms": None, "max_ms": None, "p50_ms": None, "over_100ms": 0}
    return {
        "n": len(values),
        "over_100ms": sum(1 for v in values if v > 100),
        "mean_ms": statistics.mean(values),
        "p50_ms": statistics.median(values),
        "max_ms": max(values),
    }


def with_app_name(dsn: str) -> str:
    return conninfo.make_conninfo(dsn, application_name=APP_NAME)


def hold_reader(dsn: str, ready: threading.Event, seconds: float) -> threading.Thread:
    """A transaction that reads job, then stays open for ``seconds`` (a report, an
    on_success hook doing slow work): it holds ACCESS SHARE on job until its end."""

    def run() -> None:
        with psycopg.connect(dsn, application_name="reader") as conn:
            conn.execute("SELECT id FROM job LIMIT 1").fetchall()
            ready.set()
            time.sleep(seconds)
            conn.rollback()

    t = threading.Thread(target=run, name="reader", daemon=True)
    t.start()
    return t


def measure(
    name: str, dsn: str, job_oid: int, step: Callable[[], Any], reader: float = 0.0
) -> Scenario:
    timer = StatementTimer()
    inserts = Probe(dsn, "insert", probe_insert)
    claims = Probe(dsn, "claim", probe_claim)
    sampler = LockSampler(dsn, job_oid)
    threads: list[Probe | LockSampler] = [inserts, claims, sampler]
    ender = Probe(dsn, "end", probe_end) if MIGRATION == 20 else None
    if ender is not None:
        threads.append(ender)
    for t in threads:
        t.start()
    time.sleep(BASELINE)
    reader_thread = None
    if reader:
        ready = threading.Event()
        reader_thread = hold_reader(dsn, ready, reader)
        ready.wait(10)
    log(f"{name}: migrating")
    with timer.installed():
        start = time.perf_counter()
        step()
        end = time.perf_counter()
    time.sleep(0.3)
    for t in threads:
        t.stop()
    if reader_thread is not None:
        reader_thread.join()

    sc = Scenario(name, wall_ms=(end - start) * 1000)
    for run in timer.runs:
        seen = [
            (sent, ms)
            for sent, (t, ms) in zip(sampler.sent, sampler.samples, strict=True)
            if run.start <= t <= run.end
        ]
        # The statement held what it got at most from its last sample still waiting
        # (taken no earlier than that sample's query was sent) to its end.
        waited_until = max(
            (sent for sent, ms in seen if any("waiting" in m for m in ms)), default=0
        )
        sc.statements.append(
            {
                "statement": run.label,
                "ms": run.ms,
                "error": run.error,
                "locks_seen": sorted({m for _, ms in seen for m in ms}),  # sampled meanwhile
                "held_at_most_ms": (run.end - max(run.start, waited_until)) * 1000,
            }
        )
    sc.lock_waits_timed_out = sum(1 for r in timer.runs if r.error == "LockNotAvailable")
    for mode, stretches in sampler.holds().items():
        inside = [x for x in stretches if start - 0.01 <= x[0] <= end + 0.01]
        if inside:
            sc.locks[mode] = {
                "stretches": len(inside),
                "longest_seen_ms": max(x[1] for x in inside),
                "longest_bound_ms": max(x[2] for x in inside),
            }
    sc.insert = stats(inserts.between(start, end))
    sc.claim = stats(claims.between(start, end))
    sc.baseline_insert = stats(inserts.between(start - BASELINE, start - 0.001))
    sc.baseline_claim = stats(claims.between(start - BASELINE, start - 0.001))
    sc.probe_errors = inserts.errors[:5] + claims.errors[:5]
    if ender is not None:
        sc.end = stats(ender.between(start, end))
        sc.baseline_end = stats(ender.between(start - BASELINE, start - 0.001))
        sc.probe_errors += ender.errors[:5]
    sc.sampler_period_ms = sampler.period_ms()
    return sc


def load(dsn: str, rows: int) -> int:
    log(f"migrate up to version {MIGRATION - 1}, then {rows:,} jobs")
    migrate.up(dsn, MIGRATION - 1)
    with psycopg.connect(dsn, autocommit=True) as conn:
        t = time.perf_counter()
        conn.execute(LOAD, {"rows": rows, "done": rows * 9 // 10})
        conn.execute("ANALYZE job")
        size = conn.execute("SELECT pg_size_pretty(pg_total_relation_size('job'))").fetchone()
        oid = conn.execute("SELECT 'job'::regclass::oid").fetchone()
        log(f"loaded in {time.perf_counter() - t:.1f} s; job with its indexes: {size[0]}")  # type: ignore[index]
    return int(oid[0])  # type: ignore[index]


VERIFIED: list[str] = []  # what the 0020 down step was checked for


HISTORY_STATE = """
SELECT count(*), md5(coalesce(string_agg(id::text || state || updated_at::text, ','
                                          ORDER BY id), ''))
FROM {relation} WHERE id = ANY(%(ids)s::uuid[])
"""


def history_before_down(dsn: str) -> tuple[list[Any], tuple[Any, ...]]:
    """The ids in job_history and their (count, digest of id, state, end)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        ids = [r[0] for r in conn.execute("SELECT id FROM job_history").fetchall()]
        q = sql.SQL(HISTORY_STATE).format(relation=sql.Identifier("job_history"))
        row = conn.execute(q, {"ids": ids}).fetchone()
    assert row is not None
    return ids, tuple(row)


def end_jobs(dsn: str, count: int) -> None:
    """``count`` pending jobs ended by one UPDATE after the up step (the trigger moves them
    to job_history): the rows the down step then copies back under its lock."""
    log(f"ending {count:,} pending jobs (moved to job_history by the trigger)")
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "UPDATE job SET state = 'done', updated_at = now() WHERE id IN ("
            " SELECT id FROM job WHERE state = 'pending' AND topic <> 'bench.probe'"
            " LIMIT %s)",
            (count,),
        )
        conn.execute("ANALYZE job_history_default")


def verify_down(dsn: str, ids: list[Any], before: tuple[Any, ...]) -> None:
    """The rows job_history held are in job with the same values; 0020's objects gone."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        q = sql.SQL(HISTORY_STATE).format(relation=sql.Identifier("job"))
        after = tuple(conn.execute(q, {"ids": ids}).fetchone() or ())
        gone = conn.execute(
            "SELECT to_regclass('job_history'), to_regclass('job_all'),"
            " to_regclass('brooq_job_key')"
        ).fetchone()
        steps_fk = conn.execute(
            "SELECT convalidated FROM pg_constraint WHERE conname = 'brooq_job_step_job_id_fkey'"
        ).fetchone()
    applied = [st.version for st in migrate.status(dsn) if st.state == "applied"]
    version = max(applied, default=0)
    if after != before:
        raise SystemExit(f"down lost or changed rows: before {before}, after {after}")
    if gone != (None, None, None):
        raise SystemExit(f"down left 0020's relations: {gone}")
    if not steps_fk or not steps_fk[0]:
        raise SystemExit("down did not put back brooq_job_step's validated foreign key")
    VERIFIED.append(
        f"the {before[0]:,} rows job_history held are in job, ids, states and ends equal"
        f" (digest {before[1][:8]})"
    )
    VERIFIED.append("job_history, job_all and brooq_job_key gone; foreign keys validated")
    if version != 19:
        raise SystemExit(f"down left the schema at {version}, not 19")
    VERIFIED.append("schema at 0019")


def access_exclusive(sc: Scenario) -> tuple[float, str]:
    """The longest hold of ACCESS EXCLUSIVE on job (bounded by the statement's time after
    its last sampled wait), and its statement: the statements sampled with it, or known
    to take it (every ALTER TABLE that adds or drops a column or a constraint, and
    DROP TRIGGER)."""
    worst = (0.0, "")
    for st in sc.statements:
        text = st["statement"]
        takes = (
            "AccessExclusiveLock" in st["locks_seen"]
            or (text.startswith("ALTER TABLE job") and "VALIDATE CONSTRAINT" not in text)
            or (text.startswith("DROP TRIGGER") and text.endswith(" ON job"))
        )
        if takes and st["error"] is None and st["held_at_most_ms"] > worst[0]:
            worst = (st["held_at_most_ms"], text)
    return worst


def fmt(v: float | None, digits: int = 1) -> str:
    return "–" if v is None else f"{v:,.{digits}f}"


def probes(st: dict[str, Any]) -> str:
    return f"{fmt(st['mean_ms'])} / {fmt(st['max_ms'])} ({st['n']}, {st['over_100ms']})"


def markdown(scenarios: list[Scenario], facts: dict[str, Any]) -> str:
    out = [
        f"Migration {MIGRATION:04d} on a live {facts['rows']:,}-row job table ({facts['size']}), "
        f"PostgreSQL {facts['server']}, {facts['nproc']} CPUs, load average before "
        f"{facts['loadavg']}; probes every {PROBE_PERIOD * 1000:.0f} ms, pg_locks every "
        f"{SAMPLE_PERIOD * 1000:.0f} ms (measured "
        + ", ".join(f"{s.sampler_period_ms:.1f}" for s in scenarios)
        + " ms).",
        "",
    ]
    for sc in scenarios:
        out += [
            f"**{sc.name}** — {fmt(sc.wall_ms, 0)} ms for the whole step",
            "",
            "| statement | ms | outcome | locks on job seen (pg_locks) |",
            "|---|---:|---|---|",
        ]
        for st in sc.statements:
            text = st["statement"]
            short = text if len(text) <= 70 else text[:67] + "..."
            locks = ", ".join(m.replace("Lock", "") for m in st["locks_seen"]) or "none sampled"
            out.append(f"| `{short}` | {fmt(st['ms'])} | {st['error'] or 'ok'} | {locks} |")
        out.append("")
    out += [
        "| step | wall ms | ACCESS EXCLUSIVE on job held at most, ms | its longest stretch "
        "in pg_locks, ms | lock waits timed out | probe insert mean / max ms (n, > 100 ms) "
        "| probe claim mean / max ms (n, > 100 ms) | 1 s before the step: insert / claim "
        "max ms |",
        "|---|---:|---:|---:|---:|---|---|---|",
    ]
    for sc in scenarios:
        ms, _ = access_exclusive(sc)
        ae = sc.locks.get("AccessExclusiveLock")
        seen = f"{fmt(ae['longest_seen_ms'])}–{fmt(ae['longest_bound_ms'])}" if ae else "not seen"
        out.append(
            f"| {sc.name} | {fmt(sc.wall_ms, 0)} | {fmt(ms)} | {seen} | "
            f"{sc.lock_waits_timed_out} | {probes(sc.insert)} | {probes(sc.claim)} | "
            f"{fmt(sc.baseline_insert['max_ms'])} / "
            f"{fmt(sc.baseline_claim['max_ms'])} |"
        )
    out += [
        "",
        "| step | lock (pg_locks of the migrator, on job or job_history) | stretches "
        "| longest stretch seen – bound, ms |",
        "|---|---|---:|---|",
    ]
    for sc in scenarios:
        for mode, v in sorted(sc.locks.items()):
            out.append(
                f"| {sc.name} | {mode} | {v['stretches']} | {fmt(v['longest_seen_ms'])} – "
                f"{fmt(v['longest_bound_ms'])} |"
            )
    if any(sc.end for sc in scenarios):
        out += [
            "",
            "| step | ending probe mean / max ms (n, > 100 ms) | 1 s before: max ms |",
            "|---|---|---|",
        ]
        for sc in scenarios:
            if sc.end:
                out.append(f"| {sc.name} | {probes(sc.end)} | {fmt(sc.baseline_end['max_ms'])} |")
    if VERIFIED:
        out += ["", "Down step verified: " + "; ".join(VERIFIED)]
    out.append("")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--dsn", default=DEFAULT_DSN, help="admin DSN (CREATE DATABASE)")
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--db", help="scratch database name (default bench_migration_locks_<hex>)")
    ap.add_argument("--control", action="store_true", help="also run without lock_timeout")
    ap.add_argument("--keep", action="store_true", help="do not drop the scratch database")
    ap.add_argument("--json", help="write every figure to this file")
    ap.add_argument(
        "--ended",
        type=int,
        default=0,
        help="0020 only: pending jobs ended (moved to job_history) before the down step",
    )
    ap.add_argument(
        "--migration",
        type=int,
        choices=sorted(CLAIM_BEFORE),
        default=3,
        help="the migration to measure (default 3)",
    )
    args = ap.parse_args(argv)
    if args.ended and args.migration != 20:
        raise SystemExit("--ended is for --migration 20 only")
    if args.ended < 0 or args.ended > args.rows // 10:
        raise SystemExit(f"--ended must be between 0 and the {args.rows // 10:,} pending jobs")
    global MIGRATION
    MIGRATION = args.migration
    n = MIGRATION

    name = args.db or f"bench_migration_locks_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(args.dsn, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        server = str(admin.execute("SHOW server_version").fetchone()[0])  # type: ignore[index]
    dsn = conninfo.make_conninfo(args.dsn, dbname=name)
    mdsn = with_app_name(dsn)
    scenarios: list[Scenario] = []
    try:
        job_oid = load(dsn, args.rows)
        with psycopg.connect(dsn, autocommit=True) as conn:
            size = conn.execute("SELECT pg_size_pretty(pg_total_relation_size('job'))").fetchone()
        facts = {
            "rows": args.rows,
            "size": size[0] if size else "?",
            "server": server,
            "nproc": __import__("os").cpu_count(),
            "loadavg": " ".join(Path("/proc/loadavg").read_text().split()[:3]),
        }
        scenarios.append(measure(f"up ({n:04d})", dsn, job_oid, lambda: migrate.up(mdsn, n)))
        if n == 20 and args.ended:
            end_jobs(dsn, args.ended)
        if n == 20:
            ids, before = history_before_down(dsn)
            log(f"job_history holds {before[0]:,} rows before the down step")
        scenarios.append(measure(f"down ({n:04d})", dsn, job_oid, lambda: migrate.down(mdsn)))
        if n == 20:
            verify_down(dsn, ids, before)
        scenarios.append(
            measure(
                f"up, a {READER_HOLD:g} s reader open",
                dsn,
                job_oid,
                lambda: migrate.up(mdsn, n),
                reader=READER_HOLD,
            )
        )
        if args.control:
            migrate.down(dsn)
            saved = migrate.LOCK_TIMEOUT
            migrate.LOCK_TIMEOUT = "0"  # 0: no lock_timeout at all
            try:
                scenarios.append(
                    measure(
                        f"control: up, a {READER_HOLD:g} s reader open, no lock_timeout",
                        dsn,
                        job_oid,
                        lambda: migrate.up(mdsn, n),
                        reader=READER_HOLD,
                    )
                )
            finally:
                migrate.LOCK_TIMEOUT = saved
    finally:
        if not args.keep:
            with psycopg.connect(args.dsn, autocommit=True) as admin:
                admin.execute(
                    sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
                )
    print(markdown(scenarios, facts))
    if args.json:
        Path(args.json).write_text(
            json.dumps({"facts": facts, "scenarios": [asdict(s) for s in scenarios]}, indent=1)
            + "\n"
        )
    errors = [e for s in scenarios for e in s.probe_errors]
    if errors:
        print("probe errors: " + "; ".join(errors), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
