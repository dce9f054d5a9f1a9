"""Where a no-op job's time goes in brooq: a profile of the drain path, from outside.

    python benchmarks/profile_brooq.py [--dsn DSN] [--jobs 200000] [--out DIR]

1. A master with 2 children drains N ready no-op jobs. While it runs: py-spy samples one
   child and the master (idle frames included, so waiting on PostgreSQL shows up);
   /proc gives the CPU time of the children, the master and their PostgreSQL backends;
   pg_stat_database gives the transactions. Everything is divided by the jobs finished
   in the same window.
2. strace on one child, for a second, counts its system calls per job: round trips to
   PostgreSQL (sendto/recvfrom), messages to the master (writes to the pipe), log lines
   (writes to stderr).
3. A/B drains that switch one thing off from outside brooq: per-job INFO log lines
   (--log-level WARNING), and table statistics (a never-analyzed table).
Writes profile-<date>.md (and .json, and a py-spy flame graph of the child) to --out.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import re
import subprocess
import sys
import threading
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import brooq
import psycopg
from brooq import migrate

from common import (
    BENCH_DIR,
    LoadMeter,
    Worker,
    base_env,
    children_of,
    choose_admin_dsn,
    fresh_database,
    venv_bin,
    wait_until,
)

WINDOW = 6.0  # seconds of sampling


def load(dsn: str, n: int, analyze: bool = True) -> None:
    migrate.up(dsn)
    q = brooq.Queue(dsn)
    try:
        for i in range(0, n, 1000):
            q.enqueue_many([brooq.Job("bench.noop", {"i": j}) for j in range(i, min(n, i + 1000))])
    finally:
        q.close()
    if analyze:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("ANALYZE job")


METER = LoadMeter()  # knows the masters' sessions, so their CPU is not "other"


def master(dsn: str, workers: int, extra: list[str] | None = None) -> Worker:
    argv = [
        venv_bin("brooq-master"),
        "--app",
        "bench_brooq_app:queue",
        "--workers",
        str(workers),
        *(extra or []),
    ]
    return _Metered(argv, base_env(dsn, {"QUEUE_OPS_ADDR": "127.0.0.1:0"}), "profile")


class _Metered(Worker):
    def start(self, meter: LoadMeter | None = None) -> Worker:
        return super().start(meter or METER)

    def stop(self, graceful: float = 5.0) -> None:
        METER.checkpoint()
        super().stop(graceful)


def done(conn: psycopg.Connection[Any], like: str = "%") -> int:
    row = conn.execute(
        "SELECT count(*) FROM job WHERE state = 'done' AND locked_by LIKE %s", (like,)
    ).fetchone()
    return int(row[0]) if row else 0


def cpu_ticks(pid: int) -> int:
    try:
        f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0
    return int(f[11]) + int(f[12])


def xacts(conn: psycopg.Connection[Any]) -> tuple[int, int]:
    row = conn.execute(
        "SELECT xact_commit, xact_rollback FROM pg_stat_database WHERE datname = current_database()"
    ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


def backends(conn: psycopg.Connection[Any]) -> dict[str, int]:
    rows = conn.execute(
        "SELECT application_name, pid FROM pg_stat_activity WHERE datname = current_database()"
    ).fetchall()
    return {str(a): int(p) for a, p in rows}


def wait_progress(conn: psycopg.Connection[Any], w: Worker) -> None:
    def moving() -> bool:
        if not w.alive():
            raise RuntimeError(w.log_tail())
        return done(conn) > 0

    wait_until(moving, timeout=60, interval=0.05, what="the first job done")


# -- phase 1: py-spy + CPU accounting + wait events ----------------------------------------


class WaitSampler(threading.Thread):
    """What the children's PostgreSQL backends are doing, every few milliseconds:
    pg_stat_activity's state and wait event (an active backend with no wait event is
    running on a CPU, or waiting for one)."""

    def __init__(self, dsn: str, pids: list[int], seconds: float) -> None:
        super().__init__(daemon=True)
        self.dsn, self.pids, self.seconds = dsn, pids, seconds
        self.counts: collections.Counter[str] = collections.Counter()
        self.queries = 0  # our own read-only transactions, to take out of xact_commit

    def run(self) -> None:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            deadline = time.monotonic() + self.seconds
            while time.monotonic() < deadline:
                rows = conn.execute(
                    "SELECT state, wait_event_type, wait_event FROM pg_stat_activity "
                    "WHERE pid = ANY(%s)",
                    (self.pids,),
                    prepare=True,
                ).fetchall()
                self.queries += 1
                for state, wtype, wevent in rows:
                    if state == "active" and wevent is None:
                        key = "active, on CPU (or waiting for one)"
                    elif state == "idle" and wevent == "ClientRead":
                        key = "idle: waiting for the child's next statement"
                    else:
                        key = f"{state}: {wtype}/{wevent}"
                    self.counts[key] += 1
                time.sleep(0.003)


def sampled_drain(dsn: str, n: int, out: Path) -> dict[str, Any]:
    load(dsn, n)
    w = master(dsn, 2).start()
    clk = os.sysconf("SC_CLK_TCK")
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            wait_progress(conn, w)
            kids = children_of(w.pid)
            pg = backends(conn)
            child_backends = [p for a, p in pg.items() if a.startswith("brooq-child")]
            master_backends = [p for a, p in pg.items() if a.startswith("brooq-master")]
            child = kids[0]
            pids = {"master": [w.pid], "children": kids, "pg_children": child_backends}
            pids["pg_master"] = master_backends
            t0 = {k: sum(cpu_ticks(p) for p in v) for k, v in pids.items()}
            x0, d0 = xacts(conn), done(conn)
            c0 = done(conn, f"%:{child}:%")
            sampler = WaitSampler(dsn, child_backends, WINDOW)
            sampler.start()
            start = time.monotonic()
            raw = out / "profile-child.txt"
            svg = out / "profile-child.svg"
            spies = [
                subprocess.Popen(
                    [
                        venv_bin("py-spy"),
                        "record",
                        "--pid",
                        str(pid),
                        "--duration",
                        str(int(WINDOW)),
                        "--rate",
                        "250",
                        "--idle",
                        "--nonblocking",
                        "--format",
                        fmt,
                        "--output",
                        str(o),
                    ],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
                for pid, fmt, o in (
                    (child, "raw", raw),
                    (child, "flamegraph", svg),
                    (w.pid, "raw", out / "profile-master.txt"),
                )
            ]
            for s in spies:
                s.wait(WINDOW + 30)
            sampler.join(WINDOW + 5)
            wall = time.monotonic() - start
            x1, d1 = xacts(conn), done(conn)
            c1 = done(conn, f"%:{child}:%")
            t1 = {k: sum(cpu_ticks(p) for p in v) for k, v in pids.items()}
    finally:
        w.stop()
    jobs = d1 - d0
    cpu_ms_per_job = {k: 1000 * (t1[k] - t0[k]) / clk / jobs for k in t0}
    return {
        "window_s": wall,
        "jobs": jobs,
        "jobs_per_s": jobs / wall,
        "child_jobs": c1 - c0,
        # Our own look-ups (the sampler's, four done() counts) are transactions too.
        "commits_per_job": (x1[0] - x0[0] - sampler.queries - 4) / jobs,
        "cpu_ms_per_job": cpu_ms_per_job,
        "backend_waits": {
            k: v / max(1, sum(sampler.counts.values())) for k, v in sampler.counts.most_common()
        },
        "child_stacks": summarise_stacks(raw, c1 - c0, wall),
        "master_stacks": summarise_stacks(out / "profile-master.txt", jobs, wall, master=True),
    }


# Buckets for the child's main thread, first match wins, most specific first.
CHILD_BUCKETS = [
    (
        "done + claim round trip: waiting for PostgreSQL",
        ["Child._flush_and_claim", "Connection.wait"],
    ),
    (
        "done + claim round trip: psycopg client side",
        ["Child._flush_and_claim", "Connection.execute"],
    ),
    ("done + claim round trip: Claim objects, metrics, held list", ["Child._flush_and_claim"]),
    ("other outcomes: waiting for PostgreSQL", ["OutcomeWriter.write", "Connection.wait"]),
    ("other outcomes: psycopg client side", ["OutcomeWriter.write", "Connection.execute"]),
    ("per-job log line (logging)", ["OutcomeWriter.settled"]),
    ("board: the running job for the watchdog", ["Board._write"]),
    ("metrics tally", ["Tally."]),
    ("handler call and timers", ["=call"]),  # brooq.worker.interrupts.call
    ("outcome decision", ["decide"]),
    ("traceback formatting", ["format_exception"]),
    ("idle wait for a wake-up", ["ChildState.sleep"]),
    ("other in _run_one", ["Child._run_one"]),
    ("other in the loop", ["Child.run"]),
]


def summarise_stacks(path: Path, jobs: int, wall: float, master: bool = False) -> dict[str, Any]:
    """Collapsed stacks (py-spy raw) -> share of the main thread's samples per bucket."""
    if not path.exists():
        return {"error": "py-spy wrote nothing (ptrace not allowed?)"}
    counts: collections.Counter[str] = collections.Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        if not n.isdigit():
            continue
        frames = [f.split(" (")[0] for f in stack.split(";")]
        if master:
            if "Master._loop" not in frames:
                continue
            total += int(n)
            counts[_master_bucket(frames)] += int(n)
            continue
        if "Child.run" not in frames:  # the reader thread and the boot are not the loop
            continue
        total += int(n)
        for name, needles in CHILD_BUCKETS:
            if all(any(_matches(nd, f) for f in frames) for nd in needles):
                counts[name] += int(n)
                break
        else:
            counts["other"] += int(n)
    if not total:
        return {"error": "no samples of the main loop"}
    per_job_ms = wall * 1000 / jobs if jobs else float("nan")
    return {
        "samples": total,
        "per_job_ms": per_job_ms,
        "buckets": {
            k: {"share": v / total, "ms_per_job": v / total * per_job_ms}
            for k, v in counts.most_common()
        },
    }


def _matches(needle: str, frame: str) -> bool:
    """A needle "=name" is the whole frame name (a module function); else a substring."""
    return frame == needle[1:] if needle.startswith("=") else needle in frame


def _master_bucket(frames: list[str]) -> str:
    if frames[-1].endswith("Master._loop"):
        return "select() wait (idle)"
    for name, needle in (
        ("reading child messages (json.loads)", "Fleet.read_child"),
        ("watchdog", "Enforcer."),
        ("LISTEN notifications", "Connections.read_notifications"),
        ("periodic work (renew, reaper, retention)", "Master._run_due"),
        ("reaping children", "Fleet.reap"),
        ("managing children", "Fleet.manage"),
    ):
        if any(needle in f for f in frames):
            return name
    return "other"


# -- phase 2: system calls per job ------------------------------------------------------------


def syscalls(dsn: str, n: int, out: Path) -> dict[str, Any]:
    load(dsn, n)
    w = master(dsn, 2).start()
    trace = out / "strace-child.txt"
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            wait_progress(conn, w)
            child = children_of(w.pid)[0]
            fds = {}
            for fd in Path(f"/proc/{child}/fd").iterdir():
                with contextlib.suppress(OSError):
                    fds[int(fd.name)] = os.readlink(fd)
            c0 = done(conn, f"%:{child}:%")
            subprocess.run(
                [
                    "timeout",
                    "-s",
                    "INT",
                    "2",
                    "strace",
                    "-qq",
                    "-p",
                    str(child),
                    "-e",
                    "trace=!futex",
                    "-o",
                    str(trace),
                ],
                capture_output=True,
                timeout=30,
            )
            c1 = done(conn, f"%:{child}:%")
    finally:
        w.stop()
    jobs = c1 - c0
    calls: collections.Counter[str] = collections.Counter()
    for line in trace.read_text(errors="replace").splitlines():
        m = re.match(r"(\w+)\((\d+)?", line)
        if not m:
            continue
        name, fd = m.group(1), m.group(2)
        target = fds.get(int(fd), "?") if fd else ""
        if target.startswith("socket:"):
            target = "socket (PostgreSQL)"
        elif target.startswith("pipe:"):
            target = "pipe"
        elif target.startswith("/"):
            target = "file " + Path(target).name
        calls[f"{name}({target})" if target else name] += 1
    trace.unlink(missing_ok=True)
    return {
        "jobs": jobs,
        "per_job": {k: round(v / jobs, 2) for k, v in calls.most_common(25)} if jobs else {},
        "fds": {str(k): v for k, v in sorted(fds.items())},
    }


# -- phase 3: A/B drains --------------------------------------------------------------------------


def drain_rate(dsn: str, n: int, extra: list[str], analyze: bool) -> float:
    load(dsn, n, analyze=analyze)
    w = master(dsn, 2, extra).start()
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            wait_progress(conn, w)
            t0, d0 = time.monotonic(), done(conn)
            wait_until(lambda: done(conn) >= n, timeout=600, interval=0.05, what="drain")
            return (n - d0) / (time.monotonic() - t0)
    finally:
        w.stop()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--dsn")
    # Enough that the drain outlasts the sampling window at ~25,000 jobs/s: the shares of
    # the py-spy tables are then of a busy child, not of one that finished early.
    ap.add_argument("--jobs", type=int, default=200_000)
    ap.add_argument("--out", default=str(BENCH_DIR / "results"))
    ap.add_argument("--reps", type=int, default=3, help="repetitions of each A/B drain")
    ap.add_argument("--ab-jobs", type=int, default=10_000, help="jobs in each A/B drain")
    args = ap.parse_args()
    admin, where = choose_admin_dsn(args.dsn)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    METER.start()
    result: dict[str, Any] = {
        "started_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "postgres": where,
        "brooq_file": brooq.__file__,
    }
    with fresh_database(admin, "profile_sampled") as dsn:
        result["sampled"] = sampled_drain(dsn, args.jobs, out)
    with fresh_database(admin, "profile_strace") as dsn:
        result["syscalls"] = syscalls(dsn, args.jobs, out)
    variants = {
        "default (INFO log line per job, analyzed table)": ([], True),
        "--log-level WARNING (no per-job log line)": (["--log-level", "WARNING"], True),
        "never-analyzed table (fresh database, no ANALYZE)": ([], False),
    }
    result["ab"] = {}
    for rep in range(args.reps):
        for name, (extra, analyze) in variants.items():
            with fresh_database(admin, f"profile_ab{rep}") as dsn:
                rate = drain_rate(dsn, args.ab_jobs, extra, analyze)
            result["ab"].setdefault(name, []).append(rate)
            print(f"{name}: {rate:.0f} jobs/s", flush=True)
    result["load"] = METER.stop()
    result["ab_jobs"] = args.ab_jobs
    stem = "profile-" + datetime.now(timezone.utc).strftime("%Y-%m-%d")
    (out / f"{stem}.json").write_text(json.dumps(result, indent=1, default=str) + "\n")
    (out / f"{stem}.md").write_text(markdown(result, args.jobs))
    for f in ("profile-child.txt", "profile-master.txt"):
        (out / f).unlink(missing_ok=True)
    (out / "profile-child.svg").replace(out / f"{stem}-child.svg")
    print(f"wrote {out / stem}.md")
    return 0


def markdown(r: dict[str, Any], n: int) -> str:
    s = r["sampled"]
    lines = [
        f"# Where a no-op job's time goes in brooq ({r['started_at'][:10]})",
        "",
        f"`brooq-master --workers 2`, default settings, draining {n:,} ready no-op jobs "
        f"(PostgreSQL: {r['postgres']}). Sampling window {s['window_s']:.1f} s: "
        f"{s['jobs']:,} jobs ({s['jobs_per_s']:.0f} jobs/s), {s['child_jobs']:,} of them "
        f"by the sampled child. Other processes used {r['load']['other_cpu_pct']}% of the "
        "machine's CPU over the whole profile run.",
        "",
        "## CPU time per job",
        "",
        "| who | CPU ms per job |",
        "| --- | ---: |",
    ]
    labels = {
        "children": "children (Python)",
        "master": "master (Python)",
        "pg_children": "PostgreSQL backends of the children",
        "pg_master": "PostgreSQL backends of the master",
    }
    for k, v in s["cpu_ms_per_job"].items():
        lines.append(f"| {labels.get(k, k)} | {v:.3f} |")
    lines += [
        "",
        f"Transactions committed per job (pg_stat_database): {s['commits_per_job']:.2f} "
        "(the children run in autocommit: one statement per transaction).",
        "",
    ]
    lines += [
        "## What the children's PostgreSQL backends were doing (pg_stat_activity, sampled)",
        "",
        "| state / wait event | share of samples |",
        "| --- | ---: |",
    ]
    for k, v in s["backend_waits"].items():
        lines.append(f"| {k} | {v:.1%} |")
    lines += ["", "## The sampled child's main thread (py-spy, idle frames included)", ""]
    cs = s["child_stacks"]
    if "buckets" in cs:
        lines += [
            f"Wall time per job for this child: {cs['per_job_ms']:.2f} ms "
            f"({cs['samples']} samples).",
            "",
            "| where | share | ms per job |",
            "| --- | ---: | ---: |",
        ]
        for k, v in cs["buckets"].items():
            lines.append(f"| {k} | {v['share']:.1%} | {v['ms_per_job']:.3f} |")
    else:
        lines.append(cs.get("error", ""))
    ms = s["master_stacks"]
    lines += ["", "## The master's loop (py-spy, idle frames included)", ""]
    if "buckets" in ms:
        lines += ["| where | share |", "| --- | ---: |"]
        for k, v in ms["buckets"].items():
            lines.append(f"| {k} | {v['share']:.1%} |")
    sc = r["syscalls"]
    lines += [
        "",
        f"## System calls of one child per job (strace, {sc['jobs']} jobs)",
        "",
        "| call | per job |",
        "| --- | ---: |",
    ]
    for k, v in sc["per_job"].items():
        lines.append(f"| `{k}` | {v} |")
    lines += [
        "",
        f"## A/B drains of {r.get('ab_jobs', 0):,} jobs (jobs/s, each a fresh database)",
        "",
        "| variant | runs | median |",
        "| --- | --- | ---: |",
    ]
    for name, rates in r["ab"].items():
        med = sorted(rates)[len(rates) // 2]
        lines.append(f"| {name} | {', '.join(f'{x:.0f}' for x in rates)} | {med:.0f} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
