"""The held-snapshot workload: a steady flow of jobs, first alone, then while another
session holds a REPEATABLE READ snapshot open for the whole run.

    python benchmarks/snapshot.py [--dsn ADMIN_DSN] [--duration 300] [--rate 1000]
                                  [--every 30] [--runs alone,held] [--quick]
                                  [--out results/NAME.json]

Each run, in a fresh database: `brooq-master --workers 2` with the benchmark's no-op
handler (apps/bench_brooq_app.py `bench.steady`, which appends its job's id and start
time to a file of its process: no database write per job); PRODUCERS threads enqueue
one job per `Queue.enqueue`, together RATE a second on a fixed schedule (a thread that
falls behind sends at once), for DURATION seconds. In the held run a session runs
`BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT 1;` before the offering starts and stays
idle in that transaction until the run ends: its snapshot keeps every row version the
queue leaves behind from being removed, in the heap and in the indexes.

Measured (the tables: report.py, "the held snapshot"):
- completed jobs/s: jobs whose handler started during the offering, over its length;
- pickup p50/p99: handler start minus the return of the producer's enqueue (the commit),
  as run.py's pickup workload; jobs offered but not started when the run ends count as
  lower bounds (marked ≥);
- every EVERY seconds: pg_stat_user_tables' dead and live tuples and autovacuum count,
  pg_relation_size of the table and of the ready index, pg_indexes_size, and the ready
  index's idx_scan/idx_tup_read (the entries read per scan: the dead ones the claims
  walk);
- once, at EXPLAIN_AT of the offering, EXPLAIN (ANALYZE, BUFFERS) of the claim
  (job_finish_and_claim, prepared with the children's planner settings, rolled back);
- once, when the offering ends, VACUUM (VERBOSE) of the table: what it could not remove.

Writes OUT (JSON) and OUT with .md (the tables), and prints the tables.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import psycopg
from brooq.schema.plans import CHILD_OPTIONS, prepare
from psycopg import sql
from psycopg.rows import dict_row

sys.path.insert(0, str(Path(__file__).resolve().parent))

import report as report_module
from common import (  # the benchmark's own modules, next to this file
    ROOT,
    Worker,
    choose_admin_dsn,
    events_dir,
    fresh_database,
    log,
    master_env,
    percentile,
    server_facts,
    start_master,
)

TOPIC = "bench.steady"
READY_INDEX = "job_ready_queue_idx"  # the index the one-queue claim walks

SAMPLE = """
SELECT pg_relation_size('job') AS heap_bytes, pg_indexes_size('job') AS index_bytes,
       pg_relation_size(%(ready)s::regclass) AS ready_index_bytes,
       s.n_live_tup, s.n_dead_tup, s.autovacuum_count, s.vacuum_count, s.autoanalyze_count,
       s.seq_scan, s.seq_tup_read,
       i.idx_scan AS ready_idx_scan, i.idx_tup_read AS ready_idx_tup_read,
       i.idx_tup_fetch AS ready_idx_tup_fetch,
       io.heap_blks_hit + io.heap_blks_read AS heap_blks, io.idx_blks_hit + io.idx_blks_read
           AS idx_blks,
       (SELECT max(age(backend_xmin)) FROM pg_stat_activity
        WHERE datname = current_database()) AS oldest_xmin_age
FROM pg_stat_user_tables s
JOIN pg_statio_user_tables io ON io.relid = s.relid
JOIN pg_stat_user_indexes i ON i.relid = s.relid AND i.indexrelid = %(ready)s::regclass
WHERE s.relname = 'job'
"""

MASTER_ENV: dict[str, str] = {}  # --master-env: settings for every master of the run
TREE: Path = ROOT  # --tree: the checkout of brooq the masters run (an A/B of two trees)


class Sampler(threading.Thread):
    """The database samples at t0 + k * every, k = 0 .. count."""

    def __init__(self, dsn: str, t0: float, every: float, count: int) -> None:
        super().__init__(daemon=True)
        self.dsn, self.t0, self.every, self.count = dsn, t0, every, count
        self.samples: list[dict[str, Any]] = []
        self.stopped = threading.Event()

    def run(self) -> None:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            cur = conn.cursor(row_factory=dict_row)
            for k in range(self.count + 1):
                if self.stopped.wait(max(0.0, self.t0 + k * self.every - time.monotonic())):
                    return
                row = cur.execute(SAMPLE, {"ready": READY_INDEX}).fetchone()
                if row:
                    row = {"k": k, "t": round(time.monotonic() - self.t0, 1), **row}
                    row["entries_per_scan"] = per_scan(
                        self.samples[-1] if self.samples else None, row
                    )
                    self.samples.append(row)

    def stop(self) -> list[dict[str, Any]]:
        self.stopped.set()
        self.join(30)
        return self.samples


class Producers:
    """THREADS threads, each with a Queue of its own, enqueuing job k at t0 + k / rate,
    until t0 + the duration: a thread that falls behind sends at once, and what is still
    unsent at the end is not offered (the achieved rate is reported beside the target)."""

    def __init__(self, dsn: str, rate: float, threads: int, duration: float) -> None:
        self.dsn, self.rate, self.threads, self.duration = dsn, rate, threads, duration
        self.total = int(rate * duration)
        self.records: list[dict[str, float]] = [{} for _ in range(threads)]
        self.late_s = [0.0] * threads  # the most a thread ran behind its schedule
        self.errors: list[str] = []
        self.stopped = threading.Event()
        self._threads: list[threading.Thread] = []
        self.t0 = 0.0

    def start(self, t0: float) -> None:
        self.t0 = t0
        for i in range(self.threads):
            t = threading.Thread(target=self._run, args=(i,), daemon=True)
            t.start()
            self._threads.append(t)

    def _run(self, i: int) -> None:
        import brooq

        queue = brooq.Queue(self.dsn)
        rec = self.records[i]
        try:
            for k in range(i, self.total, self.threads):
                due = self.t0 + k / self.rate
                wait = due - time.monotonic()
                if wait > 0 and self.stopped.wait(wait):
                    return
                if time.monotonic() >= self.t0 + self.duration:
                    return
                self.late_s[i] = max(self.late_s[i], -wait)
                job_id, _ = queue.enqueue(brooq.Job(TOPIC, {"k": k}))
                rec[str(job_id)] = time.time()
        except Exception as exc:
            self.errors.append(f"{type(exc).__name__}: {exc}")
        finally:
            queue.close()

    def join(self) -> dict[str, float]:
        for t in self._threads:
            t.join()
        merged: dict[str, float] = {}
        for rec in self.records:
            merged.update(rec)
        return merged


def read_starts(dsn: str) -> dict[str, float]:
    """job id -> handler start, from every child's .starts file (whole lines only; a job
    run twice keeps its first start)."""
    out: dict[str, float] = {}
    for f in events_dir(dsn).glob("*.starts"):
        for line in f.read_text().split("\n")[:-1]:
            job, t = line.split(",")
            if job not in out or float(t) < out[job]:
                out[job] = float(t)
    return out


def count_starts(dsn: str) -> int:
    return sum(f.read_bytes().count(b"\n") for f in events_dir(dsn).glob("*.starts"))


def warm_up(dsn: str, master: Worker) -> None:
    """A few jobs through, so that the children are up and idle when the offering starts."""
    import brooq

    queue = brooq.Queue(dsn)
    try:
        for _ in range(5):
            queue.enqueue(brooq.Job(TOPIC, {"k": -1}))
    finally:
        queue.close()
    deadline = time.monotonic() + 60
    while count_starts(dsn) < 5:
        if not master.alive() or time.monotonic() > deadline:
            raise RuntimeError(f"the master took no job:\n{master.log_tail()}")
        time.sleep(0.1)
    time.sleep(1.0)


def explain_claim(dsn: str, workers: int, limit: int = 1) -> str:
    """EXPLAIN (ANALYZE, BUFFERS) of the one-queue claim reading the ready index whole, as
    a child runs it (prepared, generic plan), for ``limit`` jobs, rolled back."""
    from brooq.sql import load, render

    values: dict[str, Any] = {
        "done": [],
        "topics": [TOPIC],
        "limit": limit,
        "children": workers,
        "worker": "bench-explain",
        "lease": 30.0,
        "queue": "default",
    }
    claim = render(load(TREE / "brooq" / "sql")["job_finish_and_claim"], None)
    return explain_prepared(dsn, claim, values)


def explain_prepared(dsn: str, statement: str, values: dict[str, Any]) -> str:
    """EXPLAIN (ANALYZE, BUFFERS) of ``statement`` PREPAREd with the child's parameter
    types and planner settings (a generic plan), in a transaction rolled back."""
    with psycopg.connect(dsn, options=CHILD_OPTIONS) as conn:
        names = prepare(conn, "bench_claim", statement)
        args = sql.SQL(", ").join(sql.Literal(values[n]) for n in names)
        rows = conn.execute(
            sql.SQL("EXPLAIN (ANALYZE, BUFFERS) EXECUTE bench_claim({})").format(args)
        ).fetchall()
        conn.rollback()
    return "\n".join(str(r[0]) for r in rows)


def explain_floored(dsn: str, workers: int) -> str | None:
    """EXPLAIN (ANALYZE, BUFFERS) of the claim from floors (job_finish_and_claim_floored,
    when the tree has it) with the ranges of a child whose last claim returned a job of
    priority 0 made available a second ago; None for a tree without it."""
    from brooq.sql import load, render

    texts = load(TREE / "brooq" / "sql")
    if "job_finish_and_claim_floored" not in texts:
        return None
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT now() - interval '1 s'").fetchone()
        assert row is not None
    floor = row[0] - timedelta(milliseconds=100)  # brooq.worker.floors.SLACK
    whole = datetime.min.replace(tzinfo=timezone.utc)
    values: dict[str, Any] = {
        "done": [],
        "topics": [TOPIC],
        "limit": 1,
        "children": workers,
        "worker": "bench-explain",
        "lease": 30.0,
        "queues": ["default"] * 3,
        "lows": [1, 0, -32768],
        "highs": [32767, 0, -1],
        "floors": [whole, floor, whole],
        "floor_ids": [uuid.UUID(int=0)] * 3,  # each range from its floor's first id
    }
    return explain_prepared(dsn, render(texts["job_finish_and_claim_floored"], None), values)


def vacuum_verbose(dsn: str) -> str:
    """VACUUM (VERBOSE) job: its report (what it removed, and what it could not)."""
    notes: list[str] = []
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.add_notice_handler(lambda d: notes.append(d.message_primary or ""))
        t = time.monotonic()
        conn.execute("VACUUM (VERBOSE) job")
        notes.append(f"(took {time.monotonic() - t:.2f} s)")
    return "\n".join(notes)


def pickups(
    enqueued: Mapping[str, float], started: Mapping[str, float], cutoff: float
) -> tuple[dict[str, float], int]:
    """Each offered job's pickup in ms (censored at ``cutoff`` when it never started),
    and how many were censored."""
    out: dict[str, float] = {}
    censored = 0
    for job, t_enq in enqueued.items():
        t_start = started.get(job)
        if t_start is None:
            censored += 1
            t_start = max(cutoff, t_enq)
        out[job] = (t_start - t_enq) * 1000.0
    return out, censored


def latency_summary(values: Sequence[float], censored: int = 0) -> dict[str, Any]:
    """p50/p95/p99/max of the pickups (ms); ``censored`` jobs are lower bounds within."""
    if not values:
        return {
            "jobs": 0,
            "censored": censored,
            "p50_ms": None,
            "p95_ms": None,
            "p99_ms": None,
            "max_ms": None,
        }
    return {
        "jobs": len(values),
        "censored": censored,
        "p50_ms": round(percentile(values, 0.50), 2),
        "p95_ms": round(percentile(values, 0.95), 2),
        "p99_ms": round(percentile(values, 0.99), 2),
        "max_ms": round(max(values), 2),
    }


def windows(
    enqueued: Mapping[str, float],
    started: Mapping[str, float],
    pickup_ms: Mapping[str, float],
    t0: float,
    duration: float,
    every: float,
) -> list[dict[str, Any]]:
    """The offering cut in ``every``-second windows (the last one may be shorter): jobs
    offered and started in each, their rates, and the pickup p50/p99 of the jobs
    offered in it."""
    count = max(1, math.ceil(duration / every - 1e-9))
    offered: list[list[float]] = [[] for _ in range(count)]
    completed = [0] * count

    def slot(t: float) -> int | None:
        k = math.floor((t - t0) / every)
        return k if 0 <= k < count and t - t0 < duration else None

    for job, t_enq in enqueued.items():
        k = slot(t_enq)
        if k is not None:
            offered[k].append(pickup_ms[job])
    for t_start in started.values():
        k = slot(t_start)
        if k is not None:
            completed[k] += 1
    out = []
    for k in range(count):
        length = min(every, duration - k * every)
        lat = offered[k]
        out.append(
            {
                "k": k,
                "t_end": round(k * every + length, 1),
                "offered": len(lat),
                "offered_per_s": round(len(lat) / length, 1),
                "completed": completed[k],
                "completed_per_s": round(completed[k] / length, 1),
                "p50_ms": round(percentile(lat, 0.50), 2) if lat else None,
                "p99_ms": round(percentile(lat, 0.99), 2) if lat else None,
            }
        )
    return out


def per_scan(before: Mapping[str, Any] | None, after: Mapping[str, Any]) -> float | None:
    """Index entries read per scan of the ready index between two samples (each holding
    the index's cumulative idx_scan and idx_tup_read), None without scans."""
    if before is None:
        return None
    scans = int(after["ready_idx_scan"]) - int(before["ready_idx_scan"])
    if scans <= 0:
        return None
    read = int(after["ready_idx_tup_read"]) - int(before["ready_idx_tup_read"])
    return round(read / scans, 1)


def one_run(admin: str, label: str, held: bool, args: argparse.Namespace) -> dict[str, Any]:
    from brooq import migrate

    with fresh_database(admin, f"snapshot_{label}") as dsn:
        migrate.up(dsn)
        master = start_master(dsn, args.workers, tree=TREE, env=MASTER_ENV, name="brooq-snapshot")
        holder: psycopg.Connection[Any] | None = None
        result: dict[str, Any] = {"label": label, "held": held}
        try:
            warm_up(dsn, master)
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute("ANALYZE job")
            if held:
                holder = psycopg.connect(dsn, autocommit=True, application_name="bench-holder")
                holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
                holder.execute("SELECT 1")
                result["holder_pid"] = holder.info.backend_pid
            producers = Producers(dsn, args.rate, args.producers, args.duration)
            count = int(-(-args.duration // args.every))
            t0 = time.monotonic() + 0.5
            t0_wall = time.time() + (t0 - time.monotonic())
            sampler = Sampler(dsn, t0, args.every, count)
            sampler.start()
            producers.start(t0)
            log(f"{label}: offering {args.rate:g} jobs/s for {args.duration:g} s")
            explain_at = t0 + args.duration * args.explain_at
            while time.monotonic() < explain_at:
                time.sleep(0.2)
            result["explain"] = explain_claim(dsn, args.workers)
            result["explain_floored"] = explain_floored(dsn, args.workers)
            enqueued = producers.join()
            offered_s = args.duration
            while time.monotonic() < t0 + count * args.every + 0.5 and sampler.is_alive():
                time.sleep(0.2)  # the last sample
            result["backlog_at_end"] = len(enqueued) - count_starts(dsn) + 5
            result["vacuum_verbose"] = vacuum_verbose(dsn)
            deadline = time.monotonic() + args.drain_timeout
            while count_starts(dsn) - 5 < len(enqueued) and time.monotonic() < deadline:
                if not master.alive():
                    raise RuntimeError(f"master exited:\n{master.log_tail()}")
                time.sleep(0.5)
            cutoff = time.time()
            samples = sampler.stop()
        finally:
            master.stop()
            if holder is not None:
                holder.close()
        vacuums = master.log_tail(10**9).count("event=vacuum_done")
        started = read_starts(dsn)
    pickup_ms, censored = pickups(enqueued, started, cutoff)
    in_window = sum(1 for j in enqueued if t0_wall <= started.get(j, -1) < t0_wall + offered_s)
    result.update(
        {
            "enqueued": len(enqueued),
            "producer_errors": producers.errors,
            "producers_most_behind_s": round(max(producers.late_s), 3),
            "offered_s": round(offered_s, 2),
            "offered_per_s": round(len(enqueued) / offered_s, 1),
            "completed_per_s": round(in_window / offered_s, 1),
            "pickup": latency_summary(list(pickup_ms.values()), censored),
            "windows": windows(enqueued, started, pickup_ms, t0_wall, args.duration, args.every),
            "samples": samples,
            "master_vacuums": vacuums,
        }
    )
    result["max_dead_tuples"] = max((s["n_dead_tup"] for s in samples), default=None)
    result["heap_bytes"] = [samples[0]["heap_bytes"], samples[-1]["heap_bytes"]]
    result["index_bytes"] = [samples[0]["index_bytes"], samples[-1]["index_bytes"]]
    result["last_entries_per_scan"] = samples[-1]["entries_per_scan"]
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--dsn", help="an admin DSN (default: 127.0.0.1:5432, else embedded)")
    ap.add_argument("--duration", type=float, default=300.0, help="seconds of offering")
    ap.add_argument("--rate", type=float, default=1000.0, help="jobs offered a second")
    ap.add_argument("--producers", type=int, default=4, help="producer threads")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--every", type=float, default=30.0, help="seconds between samples")
    ap.add_argument("--explain-at", type=float, default=0.5, help="share of the offering")
    ap.add_argument("--drain-timeout", type=float, default=120.0)
    ap.add_argument("--runs", default="alone,held", help="which runs, in order")
    ap.add_argument("--quick", action="store_true", help="60 s, samples every 10 s")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--master-env", action="append", default=[], metavar="NAME=VALUE")
    ap.add_argument("--tree", type=Path, help="the brooq checkout the masters run (default: this)")
    args = ap.parse_args(argv)
    if args.tree is not None:
        if not (args.tree / "brooq" / "sql").is_dir():
            ap.error(f"--tree {args.tree}: no brooq checkout there")
        global TREE
        TREE = args.tree.resolve()
    MASTER_ENV.update(master_env(args.master_env))
    if args.quick:
        args.duration, args.every = 60.0, 10.0
    runs = args.runs.split(",")
    if unknown := set(runs) - {"alone", "held"}:
        ap.error(f"--runs takes alone and held, got {sorted(unknown)}")
    if args.duration <= 0 or args.every <= 0 or args.rate <= 0 or args.producers < 1:
        ap.error("--duration, --every and --rate must be positive, --producers at least 1")
    admin, where = choose_admin_dsn(args.dsn)
    report: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "where": where,
        "server": server_facts(admin),
        "rate": int(args.rate),
        "duration": args.duration,
        "every": args.every,
        "producers": args.producers,
        "workers": args.workers,
        "explain_at": args.explain_at,
        "master_env": MASTER_ENV,
        "tree": str(TREE),
        "runs": {},
    }
    for label in runs:
        report["runs"][label] = one_run(admin, label, label == "held", args)
        run = report["runs"][label]
        log(
            f"{label}: {run['completed_per_s']:,} jobs/s, pickup p50 {run['pickup']['p50_ms']} "
            f"ms p99 {run['pickup']['p99_ms']} ms, most dead tuples {run['max_dead_tuples']}"
        )
    if {"alone", "held"} <= set(runs):
        report["targets"] = report_module.snapshot_targets(
            report["runs"]["alone"], report["runs"]["held"]
        )
    text = report_module.snapshot_markdown(report)
    if args.out:
        args.out.write_text(json.dumps(report, indent=1, default=str) + "\n")
        args.out.with_suffix(".md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
