"""The benchmark's one entry point. `make bench` is `run.py` with no workload named:
brooq and its peers side by side (same PostgreSQL, same machine, same workloads, one
run: results/<date>.json raw, results/<date>.md the tables, <date>.png the chart), then
brooq's scale, held-snapshot and fan-in workloads (results/scale-latest.json,
snapshot-latest.json and .md, fan-in-latest.json).

    python benchmarks/run.py [--quick] [--dsn DSN] [--systems brooq,celery] [--workloads ...]
    python benchmarks/run.py scale|snapshot|fan_in [their own options]     # one, by hand
    python benchmarks/run.py ab drain|bulk|enqueue|io|cpu ...              # A/B of trees
    python benchmarks/run.py TOOL ...   # migration_locks, snapshot_walk, web_pages,
                                        # cold_enqueue: measurements run by hand

Workloads (each in a fresh database, three repetitions, median and min-max reported):
  enqueue_single  20,000 jobs, one API call each     (jobs/s)
  enqueue_bulk    100,000 jobs in one bulk API call  (jobs/s)
  drain           100,000 ready no-op jobs drained   (jobs/s)
  cpu             200 jobs of ~25 ms pure Python     (wall s, parallelism = CPU s / wall s)
  pickup          200 single jobs on an idle queue   (commit -> handler start, ms);
                  brooq also with its async children (variant "async")
  hung            handlers that never return, 2 s limit: does a next job run, and when
  priority        brooq only: 10,000 ready jobs at priority 0 draining (--workers 2), then
                  100 at priority 10: how many low ones start before the last high one
  limited         brooq only: 1,000 jobs of 20 ms on a global_limit=4 topic, 2 masters x 8
                  children: the most running at once (from the handlers' own start/end
                  records) and jobs/s against 4 / 0.020 s = 200
  rated           brooq only: 1,000 jobs of 1 ms on a rate_limit="200/s" topic, 2 masters
                  x 8 children: the most starts in any second (handlers' own records)
                  and starts/s past the first burst, against the 200/s asked
  grouped         brooq only: 1,000 jobs of 20 ms on a group_limit=1 topic, 20 groups of
                  50, 2 masters x 8 children: the most running at once in a group, and
                  jobs/s against 16 children / 0.020 s = 800
  grouped_drain   brooq only: the drain's no-op jobs spread over 1,000 groups of a
                  group_limit=2 topic, --workers 2 (claims of the groups in turn, a batch
                  at a time): jobs/s beside the unlimited drain's
  rated_drain     brooq only: the drain's no-op jobs on a topic under rate_limit
                  "50000/s" (a rate that allows them): jobs/s beside the unlimited
                  drain's
  ordered_drain   brooq only: the drain's no-op jobs spread over 1,000 ordering keys
                  (each key's jobs one at a time, in order), --workers 2: jobs/s beside
                  the unlimited drain's
  io              2,000 ready jobs that each wait 50 ms (async handlers:
                  asyncio.sleep; brooq's sync variants: time.sleep), jobs/s from the
                  first handler start to the last handler end, and its share of the
                  bound slots / 50 ms
  io_http         the same, each job a GET to a local server answering after 50 ms
                  (httpwait.py, started for the run)
  io_best         brooq and pgqueuer only: the io jobs, 20,000 of them (a steady state,
                  not a ramp-up), at each system's best configuration (brooq async
                  2 x 500 and 2 x 1,000, pgqueuer without max_concurrent_tasks) and at
                  equal slots (2 x 100 each): jobs/s and the share of slots / 50 ms
  durability      brooq only: 100,000 ready no-op jobs drained by --workers 2,
                  children with synchronous_commit on, then off (jobs/s, the cost of on)
  scale           brooq only (scale.py): 1,000,000 ready jobs beside 10,000,000 finished
                  ones, then retention (--quick: 100,000 and 1,000,000)
  snapshot        brooq only (snapshot.py): 1,000 jobs/s for 5 min alone, then beside a
                  held REPEATABLE READ snapshot (--quick: 1 min each)
  fan_in          brooq only (fan_in.py): 10,000 no-op jobs alone, then with one
                  callback after all of them, 3 rounds (--quick: 1)
The throughput workloads (enqueue_*, drain, io*, durability) also record the CPU per job
of the system's client and of its server over the measured window (common.CpuWindow).
enqueue_single also runs pgbench's single-insert ceiling (brooq's INSERT, one client,
-M prepared and -M simple) in the same rounds, unless --no-ceiling.
plus a pgbench ceiling: brooq's own claim and done statements, no Python in the way.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import re
import socket
import statistics
import sys
import time
import traceback
import urllib.request
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import psycopg

import ceiling
import report
from common import (
    BENCH_DIR,
    PLACEMENTS,
    POLL,
    CpuWindow,
    LoadMeter,
    Worker,
    calibrated_iterations,
    choose_admin_dsn,
    concurrency,
    cpu_events,
    fresh_database,
    next_look,
    percentile,
    placed,
    server_facts,
    span_events,
    summary,
    wait_for_quiet,
    wait_until,
)
from systems import (
    GROUPED_DRAIN_GROUPS,
    ORDERED_DRAIN_KEYS,
    Celery,
    PgbenchInsert,
    System,
    all_systems,
)

WORKLOADS = [
    "enqueue_single",
    "enqueue_bulk",
    "drain",
    "cpu",
    "pickup",
    "hung",
    "priority",
    "limited",
    "rated",
    "grouped",
    "grouped_drain",
    "rated_drain",
    "ordered_drain",
    "io",
    "io_http",
    "io_best",
    "durability",
    *(SUITES := ["scale", "snapshot", "fan_in"]),
]
# Workloads with a module and options of their own, run after the others, each once
# (their own rounds), brooq only; `run.py NAME ...` runs one with its own options. The
# tools are measurements run by hand, reached the same way.
SUITE_OUT = {"scale": "scale-latest", "snapshot": "snapshot-latest", "fan_in": "fan-in-latest"}
TOOLS = ["ab", "ab_drain", "ab_bulk", "migration_locks", "snapshot_walk", "web_pages"]
TOOLS += ["cold_enqueue"]
# Features the peers are not compared on here: run only by systems naming them in
# System.extra_workloads.
BROOQ_ONLY = {"priority", "limited", "rated", "grouped", "grouped_drain", "rated_drain"}
BROOQ_ONLY |= {"ordered_drain"}
BROOQ_ONLY |= {"durability", *SUITES}
BROOQ_DRAIN_WORKERS = ["2", "4", "8"]
# The I/O-bound workloads run brooq once per variant: "N" is
# `brooq-master --workers N` with the sync handlers of apps/bench_brooq_app.py; "async"
# and "async200" are `--workers 2` with the async handlers of
# apps/bench_brooq_async_app.py at brooq's default --concurrency (100: 200 slots, those
# of pgqueuer here) and at `--concurrency 200` (400 slots, enough to show 1.5x pgqueuer).
# systems.Brooq maps them to their command lines (see benchmarks/README.md).
BROOQ_IO_VARIANTS = ["2", "8", "32", "async", "async200"]
# Pickup latency: "" is `--workers 2` with sync handlers, "async" the async children
# (the target: "pickup p95 unchanged").
BROOQ_PICKUP_VARIANTS = ["", "async"]
IO_WORKLOADS = ("io", "io_http")
# io_best: the io jobs in a steady state, per system at equal slots (brooq "async" and
# pgqueuer "": 2 x 100 each) and at its best (brooq 2 x 500 and 2 x 1,000; pgqueuer
# with no cap on its tasks). The other peers do not run it.
IO_BEST_VARIANTS = {"brooq": ["async", "async500", "async1000"], "pgqueuer": ["", "unlimited"]}
# The children's synchronous_commit, durable (on) and not (off), same drain.
BROOQ_DURABILITY_VARIANTS = ["on", "off"]
IO_SECONDS = 0.05  # as in apps/benchwork.py (each job's wait, the HTTP server's delay)
HUNG_LIMIT = 2.0
HUNG_WAIT = 15.0  # how long we wait for the next job after the hung ones started
PRIO_HIGH_PRIORITY = 10
PRIO_HIGH_AFTER = 1_000  # the high ones are enqueued once this many low ones have started
# As in apps/bench_brooq_limited_app.py:
LIMITED_CAP = 4
LIMITED_JOB_S = 0.020
# As in apps/bench_brooq_rated_app.py and apps/bench_brooq_grouped_app.py:
RATED_RATE = 200
GROUPS = 20
GROUPED_JOB_S = 0.020


class Sizes:
    def __init__(self, quick: bool) -> None:
        self.enqueue = 2_000 if quick else 20_000
        # The bulk API's job: one call of many jobs (as a backfill or a fan-out makes).
        self.bulk = 10_000 if quick else 100_000
        # Enough jobs that the workers' start and the first claims weigh little.
        self.drain = 5_000 if quick else 100_000
        # The one-job-per-claim ceiling flushes a commit per job: 100,000 would take minutes.
        self.ceiling_one = min(self.drain, 20_000)
        self.cpu = 40 if quick else 200
        self.pickup = 30 if quick else 200
        # The workloads' sizes, --quick or not (each run takes seconds).
        self.priority_low = 10_000
        self.priority_high = 100
        self.limited = 1_000
        self.rated = 1_000
        self.grouped = 1_000
        self.io = 200 if quick else 2_000
        self.io_best = 4_000 if quick else 20_000
        self.durability = 20_000 if quick else 100_000  # 100,000 no-op jobs
        self.reps = 1 if quick else 3


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


# -- workloads -------------------------------------------------------------------------------


def w_enqueue(system: System, dsn: str, n: int, bulk: bool) -> dict[str, Any]:
    """N jobs enqueued by this process; jobs/s and the CPU per job over the timed call
    (this process, the producer, and the database's backends)."""
    system.prepare(dsn)
    items = [{"i": i} for i in range(n)]
    cpu = CpuWindow(system.server_cpu, producer=True)
    cpu.start()
    t0 = time.perf_counter()
    if bulk:
        system.enqueue_bulk("noop", items, chunk=n)
    else:
        system.enqueue_single("noop", items)
    seconds = time.perf_counter() - t0
    cpu.stop()
    left = system.remaining()
    if left != n:
        raise RuntimeError(f"expected {n} jobs enqueued, the queue holds {left}")
    # pgbench's single-insert ceiling counts its own time, without starting and connecting.
    rate = getattr(system, "tps", None) or n / seconds
    m = {"jobs": n, "seconds": seconds, "jobs_per_s": rate}
    return {**m, **cpu.per_job(n)} if system.measures_cpu else m


METER: LoadMeter | None = None  # the current run's; knows the workers' sessions


def start_all(system: System, workload: str, variant: str) -> list[Any]:
    return [w.start(METER) for w in system.workers(workload, variant)]


def stop_all(workers: list[Any]) -> None:
    if METER is not None:
        METER.checkpoint()
    for w in workers:
        w.stop(graceful=3.0)


def check_alive(workers: list[Any]) -> None:
    for w in workers:
        if not w.alive():
            raise RuntimeError(f"worker {w.name} exited early:\n{w.log_tail()}")


def w_drain(
    system: System,
    dsn: str,
    n: int,
    variant: str,
    analyze: bool = True,
    workload: str = "drain",
    items: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """N ready jobs, then the workers start; timed from the first look that sees a job
    finished to the first look that sees none left (looks POLL apart at both ends,
    spaced between them: common.next_look), and the CPU per job of
    the workers' sessions and of the database's backends over the same stretch (so the
    workers' start-up is left out of both)."""
    system.prepare(dsn)
    if items is None:
        system.enqueue_bulk("noop", [{"i": i} for i in range(n)])
    else:  # the grouped drain's jobs, each with its group
        system.enqueue_bulk(workload, items)
    if analyze:
        system.analyze()
    workers = start_all(system, workload, variant)
    cpu = CpuWindow(system.server_cpu, [w.pid for w in workers])
    try:
        deadline = time.monotonic() + 60
        left = n
        while left >= n:
            if time.monotonic() > deadline:
                raise TimeoutError("no job finished within 60 s of starting the workers")
            check_alive(workers)
            time.sleep(POLL)
            left = system.remaining()
        cpu.start()
        t0, left0, stalled0 = time.perf_counter(), left, io_stalled_us()
        since = time.monotonic()
        deadline = since + 600
        while left > 0:
            now = time.monotonic()
            if now > deadline:
                raise TimeoutError(f"{left} jobs still left after 600 s")
            time.sleep(next_look(left0, since, left, now))
            left = system.remaining()
        seconds = time.perf_counter() - t0
        stalled = io_stalled_us()
        cpu.stop()
    finally:
        stop_all(workers)
    m = {"jobs": n, "jobs_timed": left0, "seconds": seconds, "jobs_per_s": left0 / seconds}
    m.update(cpu.per_job(left0))
    if stalled is not None and stalled0 is not None:
        # Share of the time some task waited on I/O (PSI): commits that wait for their WAL
        # flush slow down when other processes write to the same disk.
        m["io_pressure_pct"] = 100 * (stalled - stalled0) / 1e6 / seconds
    return m


def io_stalled_us() -> int | None:
    """/proc/pressure/io's "some" total (µs during which some task waited on I/O)."""
    try:
        line = Path("/proc/pressure/io").read_text().splitlines()[0]
    except (OSError, IndexError):
        return None
    found = re.search(r"total=(\d+)", line)
    return int(found.group(1)) if found else None


def w_cpu(system: System, dsn: str, n: int, iterations: int) -> dict[str, Any]:
    """N CPU-bound jobs ready, then the workers start. Wall time from the first handler
    start to the last handler end; CPU time summed from the handlers' thread_time. The
    handlers write their times to files (benchwork.record_cpu), not to the database."""
    system.prepare(dsn)
    system.enqueue_bulk("cpu", [{"k": f"c{i}", "n": iterations} for i in range(n)])
    system.analyze()
    workers = start_all(system, "cpu", "")
    try:
        wait_until(
            lambda: check_alive(workers) or len({r[0] for r in cpu_events(dsn)}) >= n,
            timeout=300,
            interval=0.1,
            what=f"{n} cpu jobs",
        )
    finally:
        stop_all(workers)
    rows = cpu_events(dsn)  # (job, start, end, cpu, pid); a job run twice counts twice
    wall = max(r[2] for r in rows) - min(r[1] for r in rows)
    cpu = sum(r[3] for r in rows)
    per_job = sorted(r[3] for r in rows)
    return {
        "jobs": n,
        "iterations": iterations,
        "wall_s": wall,
        "cpu_s": cpu,
        "parallelism": cpu / wall,
        "job_cpu_ms_median": percentile(per_job, 0.5) * 1000,
        "processes_seen": len({r[4] for r in rows}),
    }


def _wait_started(conn: psycopg.Connection[Any], key: str, timeout: float) -> float | None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        row = conn.execute(
            "SELECT min(t) FROM bench_event WHERE job = %s AND kind = 'start'", (key,)
        ).fetchone()
        if row and row[0] is not None:
            return float(row[0])
        time.sleep(0.002)
    return None


def warm_up(system: System, conn: psycopg.Connection[Any], workers: list[Any]) -> None:
    """Wait until the workers take jobs, then give every process time to be idle."""
    deadline = time.monotonic() + 60
    for i in range(4):
        key = f"warm{i}"
        system.enqueue_one("probe", {"k": key})
        while _wait_started(conn, key, 1.0) is None:
            check_alive(workers)
            if time.monotonic() > deadline:
                raise TimeoutError("workers took no job within 60 s")
    time.sleep(1.0)


def w_pickup(system: System, dsn: str, n: int, variant: str = "") -> dict[str, Any]:
    system.prepare(dsn)
    workers = start_all(system, "pickup", variant)
    latencies = []
    missed = 0
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            warm_up(system, conn, workers)
            rng = random.Random(7)
            for i in range(n):
                key = f"p{i}"
                committed = system.enqueue_one("pickup", {"k": key})
                started = _wait_started(conn, key, 10.0)
                if started is None:
                    missed += 1
                else:
                    latencies.append((started - committed) * 1000)
                time.sleep(0.02 + rng.random() * 0.01)  # let the queue go idle
    finally:
        stop_all(workers)
    return {
        "jobs": n,
        "missed": missed,
        "p50_ms": percentile(latencies, 0.5),
        "p95_ms": percentile(latencies, 0.95),
        "max_ms": max(latencies) if latencies else None,
        "min_ms": min(latencies) if latencies else None,
    }


def w_hung(system: System, dsn: str) -> dict[str, Any]:
    """As many never-returning jobs as the workers have processes, then one probe job:
    does it run, how long after the hung ones started, and what became of them."""
    system.prepare(dsn)
    workers = start_all(system, "hung", "")
    n_hung = system.slots("hung", "")
    hung_keys = [f"h{i}" for i in range(n_hung)]
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            warm_up(system, conn, workers)
            for key in hung_keys:
                system.enqueue_one("hung", {"k": key})
            starts = [_wait_started(conn, key, 20.0) for key in hung_keys]
            if any(s is None for s in starts):
                raise TimeoutError(f"hung jobs did not all start: {starts}")
            hung_start = min(s for s in starts if s is not None)
            committed = system.enqueue_one("probe", {"k": "probe"})
            started = _wait_started(conn, "probe", HUNG_WAIT)
            time.sleep(1.0)  # let the supervisor write what it writes
            states = system.job_states(hung_keys)
            runs = conn.execute(
                "SELECT count(*) FROM bench_event WHERE kind = 'start' AND job = ANY(%s)",
                (hung_keys,),
            ).fetchone()
    finally:
        stop_all(workers)
    return {
        "hung_jobs": n_hung,
        "recovered": started is not None,
        "probe_wait_s": None if started is None else started - committed,
        "from_hung_start_s": None if started is None else started - hung_start,
        "waited_s": HUNG_WAIT,
        "hung_runs": int(runs[0]) if runs else None,
        "hung_states": states,
    }


def w_priority(system: System, dsn: str, n_low: int, n_high: int) -> dict[str, Any]:
    """N_LOW ready jobs at priority 0 and the workers draining them; once PRIO_HIGH_AFTER
    have started, N_HIGH jobs at priority PRIO_HIGH_PRIORITY in one statement. Every
    handler (~1 ms) records its start and end (benchwork.record_span). Counted: the low
    jobs that started after the high ones were committed and before the last high one
    started, against the low ones still to start at that commit."""
    system.prepare(dsn)
    system.enqueue_bulk("prio", [{"k": f"lo{i}"} for i in range(n_low)])
    system.analyze()
    workers = start_all(system, "priority", "")
    try:
        wait_until(
            lambda: check_alive(workers) or system.remaining() <= n_low - PRIO_HIGH_AFTER,
            timeout=120,
            interval=0.02,
            what=f"{PRIO_HIGH_AFTER} low-priority jobs started",
        )
        high = [{"k": f"hi{i}"} for i in range(n_high)]
        system.enqueue_bulk("prio", high, priority=PRIO_HIGH_PRIORITY)  # type: ignore[call-arg]
        committed_ns = time.time_ns()
        wait_until(
            lambda: check_alive(workers) or system.remaining() == 0,
            timeout=300,
            interval=POLL,
            what="every job finished",
        )
    finally:
        stop_all(workers)
    spans = span_events(dsn)
    lo = sorted(s for k, s, *_ in spans if k.startswith("lo"))
    hi = sorted(s for k, s, *_ in spans if k.startswith("hi"))
    if len(lo) < n_low or len(hi) < n_high:
        raise RuntimeError(f"recorded {len(lo)} low and {len(hi)} high jobs of {n_low}/{n_high}")
    before = sum(1 for s in lo if s < committed_ns)
    between = sum(1 for s in lo if committed_ns <= s <= hi[-1])
    remaining = n_low - before
    first = min(s for _, s, *_ in spans)
    last = max(e for _, _, e, *_ in spans)
    return {
        "jobs": n_low + n_high,
        "low_started_before_high": before,
        "low_remaining_at_high": remaining,
        "low_started_meanwhile": between,
        "low_meanwhile_pct": 100 * between / remaining if remaining else 0.0,
        "high_first_start_ms": (hi[0] - committed_ns) / 1e6,
        "high_last_start_ms": (hi[-1] - committed_ns) / 1e6,
        "drain_s": (last - first) / 1e9,
        "jobs_per_s": (n_low + n_high) / ((last - first) / 1e9),
        "processes_seen": len({span[3] for span in spans}),
    }


def _drain_spans(system: System, dsn: str, kind: str, items: list[dict[str, Any]]) -> list[Any]:
    """Enqueue ``items`` of ``kind``, run the masters until none is left, and return the
    handlers' own (key, start, end, pid, ppid) records."""
    system.prepare(dsn)
    system.enqueue_bulk(kind, items)
    system.analyze()
    workers = start_all(system, kind, "")
    try:
        wait_until(
            lambda: check_alive(workers) or system.remaining() == 0,
            timeout=600,
            interval=POLL,
            what=f"{len(items)} {kind} jobs",
        )
    finally:
        stop_all(workers)
    spans = span_events(dsn)
    if len(spans) < len(items):
        raise RuntimeError(f"recorded {len(spans)} of {len(items)} {kind} jobs")
    return spans


def most_in_window(starts: list[int], window_ns: int) -> int:
    """The most starts in any half-open window [t, t + window)."""
    most = first = 0
    for last, at in enumerate(starts):
        while at - starts[first] >= window_ns:
            first += 1
        most = max(most, last - first + 1)
    return most


def w_rated(system: System, dsn: str, n: int) -> dict[str, Any]:
    """N ready 1 ms jobs of a topic with rate_limit="200/s", then the masters (2 x 8
    children). From the handlers' own start records: the most starts in any 1 s window
    (at most 200), and the rate sustained (200 per the median time from a start to the
    200th before it) against 200 (the window is the second plus a 50 ms allowance:
    190.5/s at best)."""
    spans = _drain_spans(system, dsn, "rated", [{"k": f"r{i}"} for i in range(n)])
    starts = sorted(s for _, s, *_ in spans)
    # N per the median time from a start to the one N before it: right for starts spread
    # out and in bursts a window apart alike, whatever the first window and the last.
    gaps = [starts[i] - starts[i - RATED_RATE] for i in range(RATED_RATE, len(starts))]
    per_s = RATED_RATE / (statistics.median(gaps) / 1e9)
    return {
        "jobs": n,
        "executions": len(spans),
        "rate": RATED_RATE,
        "max_starts_in_1s": most_in_window(starts, 1_000_000_000),
        "starts_per_s": per_s,
        "share_of_rate_pct": 100 * per_s / RATED_RATE,
        "drain_s": (starts[-1] - starts[0]) / 1e9,
        "processes_seen": len({span[3] for span in spans}),
        "masters_seen": len({span[4] for span in spans}),
    }


def w_grouped(system: System, dsn: str, n: int) -> dict[str, Any]:
    """N ready 20 ms jobs of a topic with group_limit=1, GROUPS groups in turn, then the
    masters (2 x 8 children). From the handlers' own (start, end) records: the most
    running at once in one group (at most 1) and overall, and jobs/s against the 16
    children's 800/s."""
    items = [{"k": f"g{i % GROUPS}-{i}", "g": f"tenant-{i % GROUPS}"} for i in range(n)]
    spans = _drain_spans(system, dsn, "grouped", items)
    by_group: dict[str, list[tuple[int, int]]] = {}
    for key, s, e, *_ in spans:
        by_group.setdefault(key.split("-")[0], []).append((s, e))
    per_group = max(concurrency(group, 1)[0] for group in by_group.values())
    most, _ = concurrency([(s, e) for _, s, e, *_ in spans], n)
    starts = sorted(s for _, s, *_ in spans)
    first, last = starts[0], max(e for _, _, e, *_ in spans)
    ideal = system.slots("grouped") / GROUPED_JOB_S
    per_s = n / ((last - first) / 1e9)
    return {
        "jobs": n,
        "groups": GROUPS,
        "executions": len(spans),
        "max_in_a_group": per_group,
        "max_concurrency": most,
        "jobs_per_s": per_s,
        "ideal_jobs_per_s": ideal,
        "share_of_ideal_pct": 100 * per_s / ideal,
        "processes_seen": len({span[3] for span in spans}),
        "masters_seen": len({span[4] for span in spans}),
    }


def w_limited(system: System, dsn: str, n: int) -> dict[str, Any]:
    """N ready 20 ms jobs of a topic with global_limit=4, then the masters (2 x 8
    children) start. From the handlers' own (start, end) records (time.time_ns(), one
    host): the most running at once and the time spent above the cap; jobs/s over the
    whole run and over its middle (the 10th to the 90th percentile of the starts)."""
    system.prepare(dsn)
    system.enqueue_bulk("limited", [{"k": f"l{i}"} for i in range(n)])
    system.analyze()
    workers = start_all(system, "limited", "")
    try:
        wait_until(
            lambda: check_alive(workers) or system.remaining() == 0,
            timeout=600,
            interval=POLL,
            what=f"{n} limited jobs",
        )
    finally:
        stop_all(workers)
    spans = span_events(dsn)
    if len(spans) < n:
        raise RuntimeError(f"recorded {len(spans)} of {n} limited jobs")
    most, over_ns = concurrency([(s, e) for _, s, e, *_ in spans], LIMITED_CAP)
    starts = sorted(s for _, s, *_ in spans)
    first, last = starts[0], max(e for _, _, e, *_ in spans)
    lo, hi = starts[len(starts) // 10], starts[len(starts) * 9 // 10]
    middle = sum(1 for s in starts if lo <= s < hi) / ((hi - lo) / 1e9)
    ideal = LIMITED_CAP / LIMITED_JOB_S
    return {
        "jobs": n,
        "executions": len(spans),
        "cap": LIMITED_CAP,
        "max_concurrency": most,
        "over_cap_ms": over_ns / 1e6,
        "jobs_per_s": n / ((last - first) / 1e9),
        "jobs_per_s_middle": middle,
        "ideal_jobs_per_s": ideal,
        "share_of_ideal_pct": 100 * middle / ideal,
        "job_ms_median": percentile([(e - s) / 1e6 for _, s, e, *_ in spans], 0.5),
        "processes_seen": len({span[3] for span in spans}),
        "masters_seen": len({span[4] for span in spans}),
    }


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_http_server() -> tuple[Worker, str]:
    """httpwait.py on a free port, as a worker of its own (its CPU is the benchmark's);
    returns once it has answered a GET."""
    port = _free_port()
    argv = [sys.executable, str(BENCH_DIR / "httpwait.py"), "--port", str(port)]
    server = Worker([*argv, "--delay", str(IO_SECONDS)], dict(os.environ), "httpwait")
    server.start(METER)
    url = f"http://127.0.0.1:{port}/wait"
    deadline = time.monotonic() + 10
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                resp.read()
            return server, url
        except OSError as exc:
            if not server.alive() or time.monotonic() > deadline:
                server.stop(graceful=1.0)
                raise RuntimeError(f"the HTTP server did not answer:\n{server.log_tail()}") from exc
            time.sleep(0.05)


def w_io(system: System, dsn: str, n: int, workload: str, variant: str) -> dict[str, Any]:
    """N ready I/O-bound jobs (each waits IO_SECONDS: asleep, or for the local HTTP
    server), then the workers start. From the handlers' own (start, end) records
    (benchwork.record_span, time.time_ns(), one host): jobs/s from the first start to
    the last end, the most running at once, each job's duration. The CPU per job as the
    drain's: from the first look that sees a job finished to the first that sees every
    one recorded and none left (the HTTP server's CPU is the instrument's, not counted)."""
    system.prepare(dsn)
    system.enqueue_bulk(workload, [{"k": f"i{i}"} for i in range(n)])
    system.analyze()
    server = None
    left0: int | None = None  # jobs left at the window's start
    try:
        if workload == "io_http":
            server, system.http_url = start_http_server()
        workers = start_all(system, workload, variant)
        cpu = CpuWindow(system.server_cpu, [w.pid for w in workers])
        try:
            deadline = time.monotonic() + 600
            since = 0.0
            while True:
                check_alive(workers)
                left = system.remaining()
                now = time.monotonic()
                if left0 is None and left < n:
                    cpu.start()
                    left0, since = left, now
                # The handlers' records are read once none is left: a read walks every file.
                if not left and len({s[0] for s in span_events(dsn)}) >= n:
                    break
                if now > deadline:
                    raise TimeoutError(f"timed out after 600s waiting for {n} {workload} jobs")
                time.sleep(POLL if left0 is None else next_look(left0, since, left, now))
            cpu.stop()
        finally:
            stop_all(workers)
    finally:
        system.http_url = ""
        if server is not None:
            if METER is not None:
                METER.checkpoint()  # the server's CPU is the benchmark's own
            server.stop(graceful=3.0)
    spans = span_events(dsn)
    first = min(s for _, s, *_ in spans)
    last = max(e for _, _, e, *_ in spans)
    durations = [(e - s) / 1e6 for _, s, e, *_ in spans]
    slots = system.slots(workload, variant)
    most, _ = concurrency([(s, e) for _, s, e, *_ in spans], slots)
    jobs_per_s = n / ((last - first) / 1e9)
    m: dict[str, Any] = {
        "jobs": n,
        "executions": len(spans),
        "seconds": (last - first) / 1e9,
        "jobs_per_s": jobs_per_s,
        "max_concurrency": most,
        "slots": slots,
        # No configuration exceeds its slots / IO_SECONDS: the fairer figure to compare
        # (none for a configuration without a cap: 0 slots).
        "ideal_jobs_per_s": slots / IO_SECONDS if slots else None,
        "share_of_ideal_pct": 100 * jobs_per_s * IO_SECONDS / slots if slots else None,
        "job_ms_p50": percentile(durations, 0.5),
        "job_ms_p95": percentile(durations, 0.95),
        "processes_seen": len({span[3] for span in spans}),
        **cpu.per_job(left0 or 0),
    }
    if server is not None:
        found = re.search(r"served (\d+) requests", server.log_tail())
        # Every job's GET and the readiness probe's; None if the count was not written.
        m["http_served"] = int(found.group(1)) if found else None
    return m


def _as_run(workload: str) -> str:
    """The workload the systems are asked to run: io_best runs the io jobs."""
    return "io" if workload == "io_best" else workload


def variants(system: System, workload: str) -> list[str]:
    """The variants a system runs a workload in ("" when it has one configuration)."""
    if workload == "io_best":
        return IO_BEST_VARIANTS.get(system.name, [])
    if system.name == "brooq" and workload == "drain":
        return BROOQ_DRAIN_WORKERS
    if system.name == "brooq" and workload in IO_WORKLOADS:
        return BROOQ_IO_VARIANTS
    if system.name == "brooq" and workload == "pickup":
        return BROOQ_PICKUP_VARIANTS
    if system.name == "brooq" and workload == "durability":
        return BROOQ_DURABILITY_VARIANTS
    return [""]


# -- the run --------------------------------------------------------------------------------


def machine_facts(admin_dsn: str, where: str) -> dict[str, Any]:
    cpu_model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu_model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = ""
    try:
        kb = int(Path("/proc/meminfo").read_text().split()[1])
        mem = f"{kb / 1024 / 1024:.1f} GiB"
    except (OSError, ValueError, IndexError):
        pass
    versions = {}
    for pkg in (
        "brooq",
        "procrastinate",
        "pgqueuer",
        "asyncpg",
        "celery",
        "kombu",
        "redis",
        "psycopg",
        "psycopg-binary",
        "psycopg-pool",
        "matplotlib",
    ):
        try:
            versions[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            versions[pkg] = None
    redis_version = None
    try:
        import redis

        from common import REDIS_URL

        redis_version = redis.Redis.from_url(REDIS_URL, socket_connect_timeout=2).info("server")[
            "redis_version"
        ]
    except Exception:
        redis_version = None
    import brooq

    return {
        "nproc": os.cpu_count(),
        "cpu_model": cpu_model,
        "memory": mem,
        "kernel": platform.release(),
        "python": sys.version.split()[0],
        "postgres": server_facts(admin_dsn),
        "postgres_where": where,
        "redis": redis_version,
        "versions": versions,
        "brooq_file": brooq.__file__,
    }


def run_plan(
    plan: list[tuple[System, str, str]],
    reps: int,
    result: dict[str, Any],
    admin_dsn: str,
    sizes: Sizes,
    iterations: int,
    args: argparse.Namespace,
    partial: Path,
    paired: list[dict[str, Any]] | None = None,
) -> None:
    """Every (system, workload, variant) of the plan, ``reps`` times, into result["runs"];
    after each of brooq's drains, when ``paired`` holds the list, a repetition of the
    batched pgbench ceiling with as many clients as the drain had children (its figure
    is a share of that ceiling: run an hour apart, the two measured the machine's drift
    as much as brooq)."""
    global METER
    for rep in range(reps):
        for s, wl, variant in plan:
            label = f"{s.name}_{wl}{variant}_r{rep}".replace("-", "_")
            log(f"rep {rep + 1}/{reps} {s.name} {wl} {variant}".rstrip())
            entry: dict[str, Any] = {"system": s.name, "workload": wl, "variant": variant}
            entry["rep"] = rep
            entry["quiet_before"] = wait_for_quiet()
            METER = LoadMeter()
            t = time.monotonic()
            try:
                with fresh_database(admin_dsn, label, args.db_prefix) as dsn:
                    try:
                        if wl == "enqueue_single":
                            m = w_enqueue(s, dsn, sizes.enqueue, bulk=False)
                        elif wl == "enqueue_bulk":
                            m = w_enqueue(s, dsn, sizes.bulk, bulk=True)
                        elif wl == "drain":
                            m = w_drain(s, dsn, sizes.drain, variant)
                        elif wl == "cpu":
                            m = w_cpu(s, dsn, sizes.cpu, iterations)
                        elif wl == "pickup":
                            m = w_pickup(s, dsn, sizes.pickup, variant)
                        elif wl == "hung":
                            m = w_hung(s, dsn)
                        elif wl == "priority":
                            m = w_priority(s, dsn, sizes.priority_low, sizes.priority_high)
                        elif wl == "limited":
                            m = w_limited(s, dsn, sizes.limited)
                        elif wl == "rated":
                            m = w_rated(s, dsn, sizes.rated)
                        elif wl == "grouped":
                            m = w_grouped(s, dsn, sizes.grouped)
                        elif wl in ("grouped_drain", "rated_drain"):  # under limits
                            groups = GROUPED_DRAIN_GROUPS
                            items = [{"i": i, "g": f"t{i % groups}"} for i in range(sizes.drain)]
                            m = w_drain(s, dsn, sizes.drain, "2", workload=wl, items=items)
                        elif wl == "ordered_drain":  # as the drain, each job with a key
                            keys = ORDERED_DRAIN_KEYS
                            items = [{"i": i, "o": f"k{i % keys}"} for i in range(sizes.drain)]
                            m = w_drain(s, dsn, sizes.drain, "2", workload=wl, items=items)
                        elif wl in IO_WORKLOADS:
                            m = w_io(s, dsn, sizes.io, wl, variant)
                        elif wl == "io_best":  # the io jobs, more of them
                            m = w_io(s, dsn, sizes.io_best, "io", variant)
                        elif wl == "durability":
                            m = w_drain(s, dsn, sizes.durability, variant, workload=wl)
                        else:
                            raise ValueError(wl)
                    finally:
                        METER.checkpoint()
                        s.close()
                        s.close_poll()
                entry["metrics"] = m
                log("   " + ", ".join(f"{k}={_fmt(v)}" for k, v in m.items()))
            except Exception as exc:
                entry["error"] = f"{type(exc).__name__}: {exc}"
                log(f"   ERROR {entry['error']}")
                traceback.print_exc()
            entry["load"] = METER.stop()
            if entry["load"]["other_cpu_pct"] >= 10:
                log(f"   note: other processes used {entry['load']['other_cpu_pct']}% of the CPUs")
            entry["elapsed_s"] = round(time.monotonic() - t, 1)
            result["runs"].append(entry)
            if paired is not None and s.name == "brooq" and wl == "drain":
                log(f"rep {rep + 1}/{reps} pgbench ceiling, {ceiling.BATCH} per claim, {variant}")
                try:
                    paired.append(
                        ceiling.one_rep(admin_dsn, int(variant), sizes.drain, ceiling.BATCH, rep)
                    )
                    log(f"   jobs_per_s={_fmt(paired[-1]['jobs_per_s'])}")
                except Exception as exc:
                    log(f"   ERROR {type(exc).__name__}: {exc}")
            # Kept as we go, so that an interrupted run still leaves its figures.
            partial.write_text(json.dumps(result, indent=1, default=str) + "\n")


def run_tool(name: str, argv: list[str]) -> int:
    """`run.py NAME ...`: a suite or a tool with its own options."""
    import importlib

    module = importlib.import_module(name)
    sys.argv = [str(Path(module.__file__ or name)), *argv]
    return int(module.main() or 0)


def run_suites(suites: list[str], args: argparse.Namespace, out: Path) -> int:
    """scale, snapshot, fan_in after the rest, as make bench runs them."""
    failed = 0
    for name in suites:
        argv = ["--out", str(out / f"{SUITE_OUT[name]}.json")]
        argv += ["--dsn", args.dsn] if args.dsn else []  # else each finds one as make bench did
        log(f"{name}: {' '.join(argv)}{' --quick' if args.quick else ''}")
        try:
            failed |= run_tool(name, [*argv, *(["--quick"] if args.quick else [])])
        except Exception as exc:
            log(f"   ERROR {name}: {type(exc).__name__}: {exc}")
            traceback.print_exc()
            failed = 1
    return failed


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in (*SUITES, *TOOLS):
        return run_tool(argv[0], argv[1:])
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer jobs, one repetition")
    ap.add_argument("--dsn", help="admin DSN of the PostgreSQL to use (CREATE DATABASE)")
    ap.add_argument("--systems", help="comma-separated subset of the systems")
    ap.add_argument("--workloads", help="comma-separated subset of: " + ",".join(WORKLOADS))
    ap.add_argument("--reps", type=int, help="repetitions (default 3, --quick 1)")
    ap.add_argument("--no-ceiling", action="store_true", help="skip the pgbench ceiling")
    ap.add_argument("--out", default=str(BENCH_DIR / "results"), help="output directory")
    ap.add_argument("--name", help="file name stem (default: the date, -quick when --quick)")
    ap.add_argument(
        "--db-prefix",
        default="bench",
        help="start of the scratch databases' names (default bench: bench_<run>_<hex>)",
    )
    ap.add_argument(
        "--placement",
        default="free",
        choices=PLACEMENTS,
        help="where the client and its backends run: free (the scheduler's choice), same "
        "or cross CPU (common.placed); same/cross with the enqueue workloads only",
    )
    args = ap.parse_args(argv)
    if unknown := set(args.workloads.split(",") if args.workloads else ()) - set(WORKLOADS):
        ap.error(f"--workloads: no workload {', '.join(sorted(unknown))}")
    if args.placement != "free" and set(
        args.workloads.split(",") if args.workloads else WORKLOADS
    ) - {"enqueue_single", "enqueue_bulk"}:
        # Workers started by a pinned client would share its one CPU.
        ap.error("--placement same|cross takes --workloads enqueue_single,enqueue_bulk only")

    systems = [*all_systems(), Celery(acks_late=False)]
    if args.systems:
        wanted = set(args.systems.split(","))
        systems = [s for s in systems if s.name in wanted]
    workloads = args.workloads.split(",") if args.workloads else WORKLOADS
    brooq_in = not args.systems or "brooq" in args.systems.split(",")
    suites = [w for w in SUITES if w in workloads and brooq_in]
    workloads = [w for w in workloads if w not in SUITES]
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    failed = 0
    if workloads:
        failed = run_peers(args, workloads, systems, out_dir)
    return failed | run_suites(suites, args, out_dir)


def run_peers(
    args: argparse.Namespace,
    workloads: list[str],
    systems: list[System],
    out_dir: Path,
) -> int:
    """brooq and its peers: every (system, workload, variant), reps times, and the report."""
    admin_dsn, where = choose_admin_dsn(args.dsn)
    sizes = Sizes(args.quick)
    reps = args.reps or sizes.reps
    iterations = calibrated_iterations()
    started_at = datetime.now(timezone.utc)
    stem = args.name or (started_at.strftime("%Y-%m-%d") + ("-quick" if args.quick else ""))

    partial = out_dir / f"{stem}.partial.json"
    log(f"PostgreSQL: {where}; brooq from {__import__('brooq').__file__}")
    result: dict[str, Any] = {
        "started_at": started_at.isoformat(timespec="seconds"),
        "quick": args.quick,
        "reps": reps,
        "sizes": vars(sizes),
        "cpu_iterations": iterations,
        "machine": machine_facts(admin_dsn, where),
        "systems": {},
        "runs": [],
        "ceiling": None,
        "ceiling_batched": None,
        "enqueue_ceiling_script": ceiling.INSERT_ONE,
    }
    for s in systems:
        reason = s.available()
        result["systems"][s.name] = {
            "skipped": reason,
            "settings": {
                wl: {v or "-": s.settings(_as_run(wl), v) for v in variants(s, wl)}
                for wl in WORKLOADS
                if (wl not in BROOQ_ONLY or wl in s.extra_workloads) and wl not in s.skip_workloads
            },
            "skipped_workloads": {
                wl: why for wl, why in s.skip_workloads.items() if wl in workloads
            },
        }
        if reason:
            log(f"{s.name}: skipped: {reason}")
    runnable = [s for s in systems if not result["systems"][s.name]["skipped"]]

    plan: list[tuple[System, str, str]] = []
    for s in runnable:
        early = s.name == "celery-early-ack"  # only the drain, as a variant of Celery
        for wl in workloads:
            if early and wl != "drain":
                continue
            if wl in BROOQ_ONLY and wl not in s.extra_workloads:
                continue
            if wl in s.skip_workloads:
                continue
            for v in variants(s, wl):
                plan.append((s, wl, v))

    # The single-enqueue ceiling: pgbench running brooq's INSERT, in the plan right after
    # brooq's enqueue_single (else at its end), so that each of its repetitions runs
    # beside one of brooq's on the same machine.
    if "enqueue_single" in workloads and not args.no_ceiling:
        inserts = [(PgbenchInsert(mode), "enqueue_single", mode) for mode in PgbenchInsert.MODES]
        single = ("brooq", "enqueue_single")
        brooqs = [i for i, (s, wl, _) in enumerate(plan) if (s.name, wl) == single]
        at = brooqs[0] + 1 if brooqs else len(plan)
        plan[at:at] = inserts

    drains = {"drain", "durability"} & set(workloads)
    with_brooq = not args.systems or "brooq" in args.systems
    ceilings = bool(drains) and not args.no_ceiling and with_brooq
    paired: list[dict[str, Any]] | None = [] if ceilings and "drain" in workloads else None

    with placed(admin_dsn, args.placement) as placed_where:
        result["placement"] = placed_where
        log(f"placement: {placed_where}")
        run_plan(plan, reps, result, admin_dsn, sizes, iterations, args, partial, paired)

    # The drain ceilings: with a drain workload (the single-enqueue one ran in the plan,
    # the batched one beside brooq's drains when brooq drained).
    if ceilings:
        for key, batch in (("ceiling", 1), ("ceiling_batched", ceiling.BATCH)):
            log(f"pgbench ceiling, {batch} job(s) per claim")
            try:
                if batch > 1 and paired:
                    result[key] = ceiling.summarise(admin_dsn, paired, batch)
                else:
                    jobs = sizes.ceiling_one if batch == 1 else sizes.drain
                    result[key] = ceiling.run(
                        admin_dsn, [int(c) for c in BROOQ_DRAIN_WORKERS], jobs, reps, batch
                    )
                log(f"   {result[key]['summary']}")
            except Exception as exc:
                result[key] = {"error": f"{type(exc).__name__}: {exc}"}
                log(f"   ERROR {result[key]['error']}")

    result["finished_at"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
    result["summary"] = summarise(result["runs"])
    json_path = out_dir / f"{stem}.json"
    json_path.write_text(json.dumps(result, indent=1, default=str) + "\n")
    md_path = out_dir / f"{stem}.md"
    md_path.write_text(report.markdown(result))
    png_path = out_dir / f"{stem}.png"
    report.chart(result, png_path)
    partial.unlink(missing_ok=True)
    log(f"wrote {json_path}, {md_path}, {png_path}")
    print("\n".join(report.glance(result)), flush=True)  # the terminal gets the summary too
    errors = [r for r in result["runs"] if "error" in r]
    return 1 if errors else 0


def _fmt(v: Any) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def summarise(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per system/workload/variant: every numeric metric as median, min and max."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for r in runs:
        key = f"{r['system']}|{r['workload']}|{r['variant']}"
        groups.setdefault(key, []).append(r)
    out: dict[str, Any] = {}
    for key, rs in groups.items():
        metrics = [r.get("metrics") for r in rs]
        names = {
            k
            for m in metrics
            if m
            for k, v in m.items()
            if isinstance(v, int | float) and not isinstance(v, bool)
        }
        entry: dict[str, Any] = {
            name: summary([m.get(name) if m else None for m in metrics]) for name in names
        }
        entry["errors"] = [r["error"] for r in rs if "error" in r]
        extra = [m for m in metrics if m]
        if extra and "hung_states" in extra[0]:
            entry["hung_states"] = [m["hung_states"] for m in extra]
            entry["recovered"] = [m["recovered"] for m in extra]
        out[key] = entry
    return out


if __name__ == "__main__":
    sys.exit(main())
