"""How long the master's loop is held while a backlog sits in the table: /healthz
latency, sampled back to back, with the stats duty counting the backlog.

    python benchmarks/loop_hold.py --dsn ADMIN_DSN [--jobs 2000000] [--seconds 30] TREE ...

For each TREE (a checkout: its brooq-master runs with that tree first on PYTHONPATH), a
fresh database gets --jobs ready jobs in a paused queue (counted by the stats duty,
claimed by nobody), then a master with one child, QUEUE_STATS_PERIOD=1s and its ops
socket on a free port; /healthz is answered by the master's loop itself, so its
latency shows when the loop was busy elsewhere. Prints the p50, p99 and max latency
over --seconds, how many took over 100 ms, and how many stats counts the master logged
as slow. The trees run one
after the other on the same database contents.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path

import brooq
import psycopg
from brooq import migrate
from psycopg import conninfo, sql

APP = Path(__file__).resolve().parent / "apps"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def fill(dsn: str, jobs: int) -> None:
    q = brooq.Queue(dsn)
    try:
        q.pause("parked")
        batch = [brooq.Job("bench.parked", {"i": i}, queue="parked") for i in range(10_000)]
        for _ in range(jobs // len(batch)):
            q.enqueue_many(batch)
    finally:
        q.close()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE job")


def one(tree: str, dsn: str, seconds: float) -> str:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("QUEUE_")}
    env.update(
        DATABASE_URL=dsn,
        QUEUE_OPS_ADDR=f"127.0.0.1:{port}",
        QUEUE_STATS_PERIOD="1s",
        PYTHONPATH=os.pathsep.join([str(Path(tree).resolve()), str(APP)]),
    )
    log = Path(f"/tmp/loop_hold_{uuid.uuid4().hex[:8]}.log")
    with log.open("wb") as out:
        master = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "brooq.master_cli",
                "--app",
                "bench_brooq_app:queue",
                "--workers",
                "1",
            ],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd="/",
        )
    try:
        url = f"http://127.0.0.1:{port}/healthz"
        deadline = time.monotonic() + 30
        while True:  # up and answering
            try:
                urllib.request.urlopen(url, timeout=2).read()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{tree}: no /healthz: {log.read_text()[-2000:]}") from None
                time.sleep(0.1)
        took = []
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            t = time.monotonic()
            urllib.request.urlopen(url, timeout=30).read()
            took.append(time.monotonic() - t)
    finally:
        master.terminate()
        master.wait(60)
    text = log.read_text()
    log.unlink()
    took.sort()
    p99 = took[int(len(took) * 0.99)]
    return (
        f"{tree}: {len(took)} requests, /healthz p50 {statistics.median(took) * 1000:.1f} ms, "
        f"p99 {p99 * 1000:.1f} ms, max {took[-1] * 1000:.0f} ms, "
        f"{sum(1 for t in took if t > 0.1)} over 100 ms; "
        f"event=stats_slow logged {text.count('event=stats_slow')}x"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dsn", required=True, help="admin DSN (CREATE DATABASE)")
    ap.add_argument("--jobs", type=int, default=2_000_000)
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("trees", nargs="+")
    args = ap.parse_args()
    name = f"brooq_loophold_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(args.dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    dsn = conninfo.make_conninfo(args.dsn, dbname=name)
    try:
        migrate.up(dsn)
        fill(dsn, args.jobs)
        for tree in args.trees:
            print(one(tree, dsn, args.seconds), flush=True)
    finally:
        with psycopg.connect(args.dsn, autocommit=True) as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )


if __name__ == "__main__":
    main()
