"""What a claim reads of the ready index through a long drain.

    python benchmarks/claim_walk.py [--dsn ADMIN_DSN] [--jobs 1000000] [--chunk 100000]
                                    [--workers 2] [--tree PATH] [--out results/NAME.json]

In a fresh database: JOBS ready no-op jobs, enqueued CHUNK to a transaction (the jobs of
one transaction share their available_at, as those of one enqueue_many call do); then
`brooq-master --workers N` (of --tree, this checkout by default) drains them. Every
second the sampler reads the server's counters of the ready index (job_ready_queue_idx:
index scans, index blocks hit or read) and of job (rows deleted: the jobs done, and
vacuums), so the blocks each index scan read over the drain can be drawn: a claim that
walks the entries of the jobs claimed before it since the last VACUUM reads more with
each claim; one that enters the index past them reads the same from start to end.

Prints one JSON document (written to --out too): the samples, and per tenth of the drain
the jobs/s, the index scans, the blocks per scan and per job, and the vacuums.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import ROOT, choose_admin_dsn, fresh_database, migrate_tree, start_master
from scale import UUID7

READY = """
INSERT INTO job (id, topic, payload)
SELECT pg_temp.bench_uuid7(clock_timestamp()), 'bench.noop', jsonb_build_object('i', g)
FROM generate_series(1, %(n)s) AS g
"""

COUNTERS = """
SELECT s.idx_scan, io.idx_blks_hit + io.idx_blks_read AS blocks, t.n_tup_del,
       t.vacuum_count + t.autovacuum_count AS vacuums
FROM pg_stat_user_indexes s
JOIN pg_statio_user_indexes io USING (indexrelid)
JOIN pg_stat_user_tables t ON t.relid = s.relid
WHERE s.indexrelname = 'job_ready_queue_idx'
"""


def counters(conn: psycopg.Connection[Any]) -> dict[str, int]:
    row = conn.execute(COUNTERS).fetchone()
    assert row is not None, "no job_ready_queue_idx: is the schema migrated?"
    return {"scans": row[0], "blocks": row[1], "deleted": row[2], "vacuums": row[3]}


def run(admin: str, jobs: int, chunk: int, workers: int, tree: Path) -> dict[str, Any]:
    with fresh_database(admin, "walk") as dsn:
        migrate_tree(dsn, None if tree == ROOT else tree)
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(UUID7)
            for first in range(0, jobs, chunk):
                conn.execute(READY, {"n": min(chunk, jobs - first)})
            conn.execute("VACUUM (ANALYZE) job")
            base = counters(conn)
            master = start_master(dsn, workers, tree=tree, name="brooq-walk", quiet=True)
            samples: list[dict[str, float]] = []
            t0 = time.monotonic()
            try:
                while True:
                    time.sleep(1.0)
                    now = counters(conn)
                    sample = {k: now[k] - base[k] for k in now}
                    samples.append({"t": round(time.monotonic() - t0, 2), **sample})
                    if sample["deleted"] >= jobs:
                        break
                    if not master.alive():
                        raise RuntimeError(f"brooq-master exited:\n{master.log_tail()}")
                    if time.monotonic() - t0 > 3600:
                        raise TimeoutError("the drain took over an hour")
            finally:
                master.stop()
    return {
        "jobs": jobs,
        "chunk": chunk,
        "workers": workers,
        "tree": str(tree),
        "samples": samples,
        "tenths": tenths(samples, jobs),
    }


def tenths(samples: list[dict[str, float]], jobs: int) -> list[dict[str, float]]:
    """Per tenth of the jobs done: jobs/s, index scans, blocks per scan and per job."""
    out, last = [], {"t": 0.0, "scans": 0, "blocks": 0, "deleted": 0, "vacuums": 0}
    for tenth in range(1, 11):
        end = next((s for s in samples if s["deleted"] >= jobs * tenth / 10), samples[-1])
        if end["deleted"] <= last["deleted"]:
            continue
        done, scans = end["deleted"] - last["deleted"], end["scans"] - last["scans"]
        blocks = end["blocks"] - last["blocks"]
        out.append(
            {
                "tenth": tenth,
                "jobs_per_s": round(done / max(end["t"] - last["t"], 1e-9)),
                "scans": scans,
                "blocks_per_scan": round(blocks / scans, 1) if scans else 0.0,
                "blocks_per_job": round(blocks / done, 3),
                "vacuums": end["vacuums"] - last["vacuums"],
            }
        )
        last = end
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dsn")
    ap.add_argument("--jobs", type=int, default=1_000_000)
    ap.add_argument("--chunk", type=int, default=100_000)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--tree", type=Path, default=ROOT)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    admin, _ = choose_admin_dsn(args.dsn)
    result = run(admin, args.jobs, args.chunk, args.workers, args.tree.resolve())
    for row in result["tenths"]:
        print(json.dumps(row), file=sys.stderr)
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
