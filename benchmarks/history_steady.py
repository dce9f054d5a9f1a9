"""A steady flow through the partitioned history: job and job_history's sizes and dead
tuples over a long run.

    python benchmarks/history_steady.py [--dsn ADMIN_DSN] [--duration 1800] [--rate 1000]
                                        [--step '1 hour'] [--ttl 600] [--every 60]
                                        [--upkeep-every 60] [--workers 2]
                                        [--out results/NAME.json]

In a fresh database: `brooq-master --workers N` with the benchmark's no-op handler
(apps/bench_brooq_app.py `bench.steady`), PRODUCERS threads enqueueing one job per
`Queue.enqueue`, together RATE a second on a fixed schedule (snapshot.py's producers),
for DURATION seconds. The claim statement's done moves each finished row from job to
job_history.

The partitions: every UPKEEP_EVERY seconds, as the master's upkeep does it,
brooq_history_prepare(STEP, now(), now() + 2 * STEP, ...) makes them ahead (the
current step's and the next are made at the start, the migration's daily ones dropped
while empty), and each
partition whose range ended more than TTL ago is released and dropped
(brooq_history_release, then brooq_history_drop under lock_timeout 1 s); the time of
each call is recorded. A TTL shorter than the run lets one drop happen within it.

Every EVERY seconds: job's heap and index sizes, n_live_tup, n_dead_tup and autovacuum
count; job_history's (all its partitions summed, and job_history_default's alone);
the partitions' count. Pickup p50/p99 of the jobs per window (snapshot.py's windows).

Writes OUT (JSON) and OUT with .md (the samples as a table).
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psycopg
from psycopg.rows import dict_row

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (  # the benchmark's own modules, next to this file
    choose_admin_dsn,
    fresh_database,
    log,
    master_env,
    server_facts,
    start_master,
)
from history_retention import drop_partition, prepare
from snapshot import TOPIC, Producers, count_starts, latency_summary, pickups, read_starts, warm_up
from snapshot import windows as pickup_windows

SAMPLE = """
WITH h AS (
    SELECT t.relid FROM pg_partition_tree('job_history') t WHERE t.isleaf
)
SELECT pg_table_size('job') AS job_table_bytes, pg_indexes_size('job') AS job_index_bytes,
       s.n_live_tup AS job_live, s.n_dead_tup AS job_dead,
       s.autovacuum_count AS job_autovacuums,
       (SELECT coalesce(sum(pg_table_size(relid)), 0) FROM h) AS hist_table_bytes,
       (SELECT coalesce(sum(pg_indexes_size(relid)), 0) FROM h) AS hist_index_bytes,
       (SELECT coalesce(sum(u.n_live_tup), 0) FROM pg_stat_user_tables u
        WHERE u.relid IN (SELECT relid FROM h)) AS hist_live,
       (SELECT coalesce(sum(u.n_dead_tup), 0) FROM pg_stat_user_tables u
        WHERE u.relid IN (SELECT relid FROM h)) AS hist_dead,
       pg_table_size('job_history_default') AS default_table_bytes,
       (SELECT count(*) FROM h) - 1 AS partitions,
       pg_table_size('brooq_job_key') + pg_indexes_size('brooq_job_key') AS key_bytes,
       -- A transaction holding an xid in any database holds back what vacuum may
       -- remove here too (every snapshot's xmin): the oldest, and where it runs.
       (SELECT max(age(a.backend_xmin)) FROM pg_stat_activity a) AS oldest_xmin_age,
       (SELECT a.datname FROM pg_stat_activity a WHERE a.backend_xmin IS NOT NULL
        ORDER BY age(a.backend_xmin) DESC LIMIT 1) AS oldest_xmin_database
FROM pg_stat_user_tables s WHERE s.relname = 'job'
"""


class BatchProducers(Producers):
    """snapshot.py's producers, each call a `Queue.enqueue_many` of ``batch`` jobs: batch
    k of the run at t0 + k * batch / rate (a thread that falls behind sends at once).
    On a loaded machine one enqueue per job cannot offer 1,000 a second (each commit
    waits for the server's NOTIFY queue lock); the tables see the same rows either way."""

    def __init__(self, dsn: str, rate: float, threads: int, duration: float, batch: int) -> None:
        super().__init__(dsn, rate, threads, duration)
        self.batch = batch

    def _run(self, i: int) -> None:
        import brooq

        queue = brooq.Queue(self.dsn)
        rec = self.records[i]
        batches = self.total // self.batch
        try:
            for k in range(i, batches, self.threads):
                due = self.t0 + k * self.batch / self.rate
                wait = due - time.monotonic()
                if wait > 0 and self.stopped.wait(wait):
                    return
                if time.monotonic() >= self.t0 + self.duration:
                    return
                self.late_s[i] = max(self.late_s[i], -wait)
                jobs = [brooq.Job(TOPIC, {"k": k * self.batch + j}) for j in range(self.batch)]
                done = queue.enqueue_many(jobs)
                now = time.time()
                for job_id, _ in done:
                    rec[str(job_id)] = now
        except Exception as exc:
            self.errors.append(f"{type(exc).__name__}: {exc}")
        finally:
            queue.close()


class Upkeep(threading.Thread):
    """Partitions made ahead and expired ones dropped, every ``every`` seconds."""

    def __init__(self, dsn: str, step: str, ttl: float, every: float, t0: float) -> None:
        super().__init__(daemon=True)
        self.dsn, self.step, self.ttl, self.every, self.t0 = dsn, step, ttl, every, t0
        self.calls: list[dict[str, Any]] = []
        self.errors: list[str] = []
        self.stopped = threading.Event()

    def run(self) -> None:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            while not self.stopped.is_set():
                try:
                    self.once(conn)
                except Exception as exc:  # recorded, the run goes on (as the master's)
                    self.errors.append(f"{type(exc).__name__}: {exc}")
                self.stopped.wait(self.every)

    def once(self, conn: psycopg.Connection[Any]) -> None:
        t = round(time.monotonic() - self.t0, 1)
        t1 = time.monotonic()
        made = conn.execute(
            "SELECT brooq_history_prepare(%s::interval, now(), now() + 2 * %s::interval, 10)",
            (self.step, self.step),
        ).fetchone()
        self.calls.append(
            {
                "t": t,
                "prepare_made": made[0] if made else None,
                "prepare_ms": round((time.monotonic() - t1) * 1000, 1),
            }
        )
        expired = conn.execute(
            "SELECT name FROM brooq_history_expired(now() - make_interval(secs => %s))",
            (self.ttl,),
        ).fetchall()
        for (name,) in expired:
            done = drop_partition(conn, name)
            done["t"] = round(time.monotonic() - self.t0, 1)
            self.calls.append(done)
            log(f"  dropped {name}: {done}")


class Sampler(threading.Thread):
    def __init__(self, dsn: str, t0: float, every: float) -> None:
        super().__init__(daemon=True)
        self.dsn, self.t0, self.every = dsn, t0, every
        self.samples: list[dict[str, Any]] = []
        self.stopped = threading.Event()

    def run(self) -> None:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            cur = conn.cursor(row_factory=dict_row)
            k = 0
            while not self.stopped.wait(max(0.0, self.t0 + k * self.every - time.monotonic())):
                row = cur.execute(SAMPLE).fetchone()
                if row:
                    self.samples.append({"t": round(time.monotonic() - self.t0, 1), **row})
                    s = self.samples[-1]
                    log(
                        f"  t={s['t']:.0f}s job {s['job_table_bytes'] // 1024} kB"
                        f" +{s['job_index_bytes'] // 1024} kB dead {s['job_dead']};"
                        f" history {s['hist_table_bytes'] // 2**20} MB"
                        f" +{s['hist_index_bytes'] // 2**20} MB dead {s['hist_dead']}"
                        f" partitions {s['partitions']}"
                    )
                k += 1

    def stop(self) -> list[dict[str, Any]]:
        self.stopped.set()
        self.join(30)
        return self.samples


def run(admin: str, args: argparse.Namespace) -> dict[str, Any]:
    from brooq import migrate

    with fresh_database(admin, "hsteady") as dsn:
        migrate.up(dsn)
        with psycopg.connect(dsn, autocommit=True) as conn:
            prepare(conn, args.step_s, 2 * args.step_s)
        master = start_master(
            dsn,
            args.workers,
            env={"QUEUE_RETENTION_TTL": "0s", **args.env},
            name="brooq-hsteady",
        )
        result: dict[str, Any] = {}
        try:
            warm_up(dsn, master)
            producers: Producers
            if args.batch > 1:
                producers = BatchProducers(
                    dsn, args.rate, args.producers, args.duration, args.batch
                )
            else:
                producers = Producers(dsn, args.rate, args.producers, args.duration)
            t0 = time.monotonic() + 0.5
            t0_wall = time.time() + (t0 - time.monotonic())
            sampler = Sampler(dsn, t0, args.every)
            upkeep = Upkeep(dsn, args.step, args.ttl, args.upkeep_every, t0)
            sampler.start()
            upkeep.start()
            producers.start(t0)
            log(f"offering {args.rate:g} jobs/s for {args.duration:g} s, step {args.step}")
            enqueued = producers.join()
            deadline = time.monotonic() + 120
            while count_starts(dsn) - 5 < len(enqueued) and time.monotonic() < deadline:
                if not master.alive():
                    raise RuntimeError(f"master exited:\n{master.log_tail()}")
                time.sleep(0.5)
            cutoff = time.time()
            time.sleep(max(0.0, t0 + (len(sampler.samples)) * args.every - time.monotonic()))
            upkeep.stopped.set()
            upkeep.join(120)
            samples = sampler.stop()
        finally:
            master.stop()
        started = read_starts(dsn)
    pickup_ms, censored = pickups(enqueued, started, cutoff)
    result.update(
        {
            "enqueued": len(enqueued),
            "producer_errors": producers.errors,
            "producers_most_behind_s": round(max(producers.late_s), 3),
            "offered_per_s": round(len(enqueued) / args.duration, 1),
            "pickup": latency_summary(list(pickup_ms.values()), censored),
            "windows": pickup_windows(
                enqueued, started, pickup_ms, t0_wall, args.duration, args.every
            ),
            "samples": samples,
            "upkeep": upkeep.calls,
            "upkeep_errors": upkeep.errors,
        }
    )
    return result


def interval_seconds(text: str) -> float:
    """'1 hour', '15 minutes', '30 s' as seconds (through PostgreSQL's own parser)."""
    with psycopg.connect(ADMIN, autocommit=True) as conn:
        try:
            row = conn.execute("SELECT extract(epoch FROM %s::interval)", (text,)).fetchone()
        except psycopg.errors.DataError:
            raise SystemExit(f"--step: not an interval: {text!r}") from None
    assert row is not None
    return float(row[0])


ADMIN = ""


def main(argv: list[str] | None = None) -> int:
    global ADMIN
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--dsn", help="an admin DSN (default: 127.0.0.1:5432, else embedded)")
    ap.add_argument("--duration", type=float, default=1800.0, help="seconds of offering")
    ap.add_argument("--rate", type=float, default=1000.0, help="jobs offered a second")
    ap.add_argument("--producers", type=int, default=4, help="producer threads")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--batch", type=int, default=1, help="jobs per enqueue call (1: Queue.enqueue)")
    ap.add_argument("--step", default="1 hour", help="the partitions' length")
    ap.add_argument("--ttl", type=float, default=600.0, help="seconds a partition is kept")
    ap.add_argument("--every", type=float, default=60.0, help="seconds between samples")
    ap.add_argument("--upkeep-every", type=float, default=60.0)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--master-env", action="append", default=[], metavar="NAME=VALUE")
    args = ap.parse_args(argv)
    if args.duration <= 0 or args.rate <= 0 or args.every <= 0 or args.batch < 1:
        raise SystemExit("--duration, --rate, --every and --batch must be positive")
    args.env = master_env(args.master_env)
    ADMIN, where = choose_admin_dsn(args.dsn)
    args.step_s = interval_seconds(args.step)
    report: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "server": where,
        "facts": server_facts(ADMIN),
        "workers": args.workers,
        "rate": args.rate,
        "batch": args.batch,
        "duration_s": args.duration,
        "step": args.step,
        "ttl_s": args.ttl,
    }
    report.update(run(ADMIN, args))
    text = json.dumps(report, indent=2, default=str)
    if args.out:
        args.out.write_text(text + "\n")
        args.out.with_suffix(".md").write_text(markdown(report))
    print(markdown(report))
    return 0


def markdown(report: dict[str, Any]) -> str:
    mb = 2**20
    lines = [
        f"# Steady flow through the partitioned history ({report['date']})",
        "",
        f"{report['rate']:g} jobs/s offered ({report['batch']} a call)"
        f" for {report['duration_s']:g} s"
        f" ({report['offered_per_s']} achieved), partitions of {report['step']},"
        f" kept {report['ttl_s']:g} s; pickup {report['pickup']}",
        "",
        "| t s | job heap kB | job idx kB | job live | job dead | job autovac |"
        " hist heap MB | hist idx MB | hist live | hist dead | default kB | parts | keys kB |"
        " oldest xmin age |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for s in report["samples"]:
        lines.append(
            f"| {s['t']:.0f} | {s['job_table_bytes'] // 1024} | {s['job_index_bytes'] // 1024}"
            f" | {s['job_live']} | {s['job_dead']} | {s['job_autovacuums']}"
            f" | {s['hist_table_bytes'] / mb:.1f} | {s['hist_index_bytes'] / mb:.1f}"
            f" | {s['hist_live']} | {s['hist_dead']} | {s['default_table_bytes'] // 1024}"
            f" | {s['partitions']} | {s['key_bytes'] // 1024}"
            f" | {s.get('oldest_xmin_age', '-')} |"
        )
    lines += ["", "Upkeep calls:", ""]
    for c in report["upkeep"]:
        if "name" in c:
            lines.append(
                f"- t={c['t']} s: {c['name']} released in {c['release']['db_ms']} ms"
                f" (db), dropped in {c['drop']['db_ms']} ms (db), {c['drop']['tries']} tries"
            )
    made = [c for c in report["upkeep"] if "prepare_ms" in c]
    if made:
        lines.append(
            f"- prepare: {len(made)} calls, at most {max(c['prepare_ms'] for c in made)} ms,"
            f" {sum(c['prepare_made'] or 0 for c in made)} partitions made"
        )
    if report["upkeep_errors"]:
        lines.append(f"- errors: {report['upkeep_errors']}")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
