"""Groups taken in turn: a big tenant beside small ones, and group_limit at speed.

    python benchmarks/groups.py [--dsn ADMIN_DSN] [--workers 2] [--masters 1]
                                [--rounds 1] [--out results/NAME.json]
                                [fair] [limit]

fair:  one group with BIG (100,000) ready jobs enqueued first, then SMALL_GROUPS (100)
       groups of SMALL (10) jobs: drained by `brooq-master --workers N` with the topic
       declared `fair_groups=True`, and the same jobs with it plain, alternated. Reported:
       when each small group's first job started, from the first claim of the run
       (max and p50 over the groups), and the drain's jobs/s (the jobs' own start and end
       times: first started_at to last updated_at).
limit: LIMIT_GROUPS (1,000) groups of PER_GROUP (100) jobs, enqueued interleaved,
       drained with group_limit=2 and plain, alternated. Reported: the jobs/s of each,
       and the most jobs of one group processing at once, sampled every 10 ms by a
       connection of its own (it must never pass 2).

Each run in a fresh database, the master from this checkout, the application
apps/bench_groups_app.py (BENCH_GROUPS says how the topic is declared).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import ROOT, choose_admin_dsn, fresh_database, migrate_tree, start_master

BIG, SMALL_GROUPS, SMALL = 100_000, 100, 10
LIMIT_GROUPS, PER_GROUP = 1_000, 100
TOPIC = "bench.groups"

INSERT = """
INSERT INTO job (topic, group_key, payload)
SELECT %(topic)s, %(prefix)s || (g %% %(groups)s), '{}'::jsonb
FROM generate_series(0, %(n)s - 1) AS g
"""
LEFT = "SELECT EXISTS (SELECT FROM job WHERE state IN ('pending', 'failed', 'processing'))"
BUSIEST = """
SELECT coalesce(max(n), 0) FROM (
    SELECT count(*) AS n FROM job WHERE state = 'processing' AND topic = %s
    GROUP BY group_key) AS g
"""


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


class Busiest(threading.Thread):
    """The most jobs of one group processing at once, every 10 ms."""

    def __init__(self, dsn: str) -> None:
        super().__init__(daemon=True)
        self.dsn, self.most, self.samples = dsn, 0, 0
        self.done = threading.Event()

    def run(self) -> None:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            while not self.done.is_set():
                row = conn.execute(BUSIEST, (TOPIC,)).fetchone()
                self.most = max(self.most, int(row[0]) if row else 0)
                self.samples += 1
                time.sleep(0.01)


TREE = ROOT  # --tree: the checkout whose master runs (this one by default)


def drain(dsn: str, mode: str, workers: int, masters: int) -> dict[str, Any]:
    env = {"BENCH_GROUPS": mode, "QUEUE_RETENTION_TTL": "0s"}
    watcher = Busiest(dsn)
    watcher.start()
    started = [
        start_master(
            dsn, workers, app="bench_groups_app:queue", env=env, name=f"groups{i}", tree=TREE
        )
        for i in range(masters)
    ]
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            deadline = time.monotonic() + 1800
            while conn.execute(LEFT).fetchone() == (True,):
                for m in started:
                    if not m.alive():
                        raise RuntimeError(f"brooq-master exited:\n{m.log_tail()}")
                if time.monotonic() > deadline:
                    raise TimeoutError("the drain took over 30 minutes")
                time.sleep(0.2)
            row = conn.execute(
                "SELECT count(*), extract(epoch FROM max(updated_at) - min(started_at)),"
                " min(started_at) FROM job_all WHERE state = 'done'"
            ).fetchone()
            assert row is not None
            jobs, seconds, first = int(row[0]), float(row[1]), row[2]
            firsts = conn.execute(
                "SELECT group_key, extract(epoch FROM min(started_at) - %s) FROM job_all"
                " WHERE state = 'done' AND group_key LIKE 'small-%%' GROUP BY group_key",
                (first,),
            ).fetchall()
    finally:
        watcher.done.set()
        for m in started:
            m.stop()
        watcher.join(5)
    out: dict[str, Any] = {
        "mode": mode,
        "jobs": jobs,
        "seconds": round(seconds, 2),
        "jobs_per_s": round(jobs / seconds),
        "busiest_group": watcher.most,
        "busiest_samples": watcher.samples,
    }
    if firsts:
        waits = sorted(float(w) for _, w in firsts)
        out["small_first_start_s"] = {
            "groups": len(waits),
            "p50": round(statistics.median(waits), 3),
            "max": round(waits[-1], 3),
        }
    return out


def run_fair(admin: str, mode: str, args: argparse.Namespace) -> dict[str, Any]:
    with fresh_database(admin, "groups") as dsn:
        migrate_tree(dsn, None if TREE == ROOT else TREE)
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(INSERT, {"topic": TOPIC, "prefix": "big", "groups": 1, "n": BIG})
            conn.execute(
                INSERT,
                {
                    "topic": TOPIC,
                    "prefix": "small-",
                    "groups": SMALL_GROUPS,
                    "n": SMALL_GROUPS * SMALL,
                },
            )
            conn.execute("UPDATE job SET group_key = 'big' WHERE group_key = 'big0'")
            conn.execute("VACUUM (ANALYZE) job")
        return drain(dsn, mode, args.workers, args.masters)


def run_limit(admin: str, mode: str, args: argparse.Namespace) -> dict[str, Any]:
    with fresh_database(admin, "groups") as dsn:
        migrate_tree(dsn, None if TREE == ROOT else TREE)
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(
                INSERT,
                {
                    "topic": TOPIC,
                    "prefix": "tenant-",
                    "groups": LIMIT_GROUPS,
                    "n": LIMIT_GROUPS * PER_GROUP,
                },
            )
            conn.execute("VACUUM (ANALYZE) job")
        return drain(dsn, mode, args.workers, args.masters)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dsn")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--masters", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--tree", type=Path, default=ROOT, help="the checkout whose master runs")
    ap.add_argument(
        "--modes",
        help="modes to run, separated by spaces (a mode is BENCH_GROUPS's options, a comma"
        " between them, as apps/bench_groups_app.py reads them; default: plain and the option)",
    )
    ap.add_argument("scenarios", nargs="*", default=["fair", "limit"])
    args = ap.parse_args()
    global TREE
    TREE = args.tree.resolve()
    admin, _ = choose_admin_dsn(args.dsn)
    results: list[dict[str, Any]] = []
    for _ in range(args.rounds):
        if "fair" in args.scenarios:
            for mode in args.modes.split() if args.modes else ("plain", "fair"):
                log(f"fair scenario, {mode}")
                results.append({"scenario": "fair", **run_fair(admin, mode, args)})
                log(json.dumps(results[-1]))
        if "limit" in args.scenarios:
            for mode in args.modes.split() if args.modes else ("plain", "limit:2"):
                log(f"limit scenario, {mode}")
                results.append({"scenario": "limit", **run_limit(admin, mode, args)})
                log(json.dumps(results[-1]))
    text = json.dumps({"workers": args.workers, "masters": args.masters, "runs": results}, indent=1)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
