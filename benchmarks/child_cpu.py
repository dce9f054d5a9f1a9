"""Where a worker child's CPU goes per no-op job, stage by stage.

One child of this checkout, forked here as the master forks it (its board, metrics in a
multiprocess directory, brooq's log handler writing the INFO line of every job to
/dev/null), drains JOBS ready no-op jobs (bench.noop) of a fresh database through its
real loop, sync or ``--async``; its CPU per job is read from /proc from the first finished
job to the last (as `ab.py drain` reads it). Then, in the same process and on the same
parts, each stage of the no-op path is timed on its own, ROWS jobs per round trip:

  claim decode    the claim statement's rows loaded by psycopg (a claimed row per job:
                  row factory, uuid, timestamps, the payload's JSON; a finished job comes
                  back only when its `done` was not written)
  claim object    RoundTrips.settle of the claimed rows: their order, the Claim objects
  held list       what the master is told the child holds (RoundTrips.hold), per trip
  board           the job posted on the board and cleared
  handler call    the runner called with the soft limit armed (sync: attempt.call;
                  async: Slot.call on the loop, with the task that runs it)
  metering        the attempt's duration, CPU and peak RSS observations (Meter.attempt)
  metrics         the claims counted, the tally written once per trip
  logging         the job_done line, made and written with its round trip's lines, and
                  the outcome counted
  tracing check   the job's log context set and reset, the spans and keep_logs checks
  done list       a finished job kept for the next trip, and its id sent as `done`

The stages add up to less than the drain's figure: the rest is the loop itself, the
statement's round trip through psycopg and libpq, and the system calls.

Run by hand (never part of `make test`); a minute or two:

    .venv/bin/python benchmarks/child_cpu.py [--dsn ADMIN_DSN] [--jobs 100000] [--async]
        [--rows 256] [--profile]

``--profile``: cProfile of the drain instead, timed by the child's CPU clock (top
functions by own time; the figures are then the profiler's, not the child's).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import inspect
import io
import json
import logging
import os
import pstats
import signal
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent / "apps"))

from brooq import metrics as metrics_mod

# Before prometheus_client is imported: it picks multiprocess mode at import.
METRICS_DIR = metrics_mod.prepare_dir(None)

import psycopg  # noqa: E402
from brooq import logs, migrate  # noqa: E402
from brooq.ipc.board import Board  # noqa: E402
from brooq.ipc.reasons import ASYNC, SYNC  # noqa: E402
from brooq.settings import Settings  # noqa: E402
from brooq.worker import attempt  # noqa: E402
from brooq.worker.aio import AsyncLoop  # noqa: E402
from brooq.worker.child import Child  # noqa: E402
from brooq.worker.process import ChildProcess  # noqa: E402
from brooq.worker.roundtrip import claim_plan, claim_row  # noqa: E402
from brooq.worker.state import ChildConfig, identity_for  # noqa: E402
from brooq.worker.tasks import Slot, SoftLimits  # noqa: E402

from common import DEFAULT_DSN, cpu_of, fresh_database  # noqa: E402

TOPIC = "bench.noop"
# The claim statement's columns, as it returns them for claimed jobs and finished ones.
CLAIMED_ROWS = (
    "SELECT true AS claimed, gen_random_uuid() AS id, 'bench.noop'::text AS topic,"
    " 'null'::jsonb AS payload, 1 AS attempts, 'x'::text AS locked_by,"
    " now() AS locked_until, now() AS available_at, 'default'::text AS queue,"
    " 0::smallint AS priority FROM generate_series(1, %(n)s)"
)


def per_job(fn: Callable[[], object], jobs: int, budget: float = 0.4) -> float:
    """CPU ns per job of ``fn`` (which handles ``jobs`` jobs per call): the best of 5
    runs of about ``budget`` seconds each."""
    fn()  # warm
    t = time.process_time()
    fn()
    once = max(time.process_time() - t, 1e-6)
    calls = max(1, int(budget / 5 / once))
    best = float("inf")
    for _ in range(5):
        t = time.process_time()
        for _ in range(calls):
            fn()
        best = min(best, (time.process_time() - t) / calls / jobs)
    return best * 1e9


def stages(child: ChildProcess, rows_per_trip: int, aio: bool) -> dict[str, float]:
    """ns per job of each stage, on the child's own parts (after its drain)."""
    n = rows_per_trip
    conn = child.db.get()
    cur = conn.cursor(row_factory=claim_row)
    claimed = cur.execute(CLAIMED_ROWS, {"n": n}).fetchall()
    if len(claimed) < n:
        raise SystemExit(f"only {len(claimed)} rows read")

    def decode() -> None:  # a finished job comes back only if its `done` was not written
        cur.scroll(0, "absolute")
        cur.fetchall()

    trips = child.trips
    queues = trips.order.names
    out: dict[str, float] = {}
    out["claim decode"] = per_job(decode, n)
    out["claim object"] = per_job(lambda: trips.settle([], claimed, queues), n)
    claims = trips.settle([], claimed, queues)

    def held() -> None:  # a new batch's ids each time, as each trip's are
        trips.hold([uuid.uuid4() for _ in range(n)])

    new_ids = per_job(lambda: [uuid.uuid4() for _ in range(n)], n)
    out["held list"] = per_job(held, n) - new_ids
    trips.hold([])

    board, attempts, meter = child.board, child.attempts, child.meter
    policy = child.policies[TOPIC]
    claim = claims[0]

    def board_post() -> None:
        for c in claims:
            board.post(c.id, c.topic, c.attempt, 1.0, policy.max_execution_timeout, 0.0)
            board.clear()

    out["board"] = per_job(board_post, n)

    runner = child.runners[TOPIC]
    if not aio:

        def call() -> None:
            for c in claims:
                attempt.call(runner, c, policy, child.state)

        out["handler call"] = per_job(call, n)
    else:
        out["handler call"] = per_job(lambda: _async_calls(runner, claims, policy), n)

    cpu = not aio and attempts.measure_cpu
    # As Attempts.end calls it (since it passes the time it read, the meter's reuses it).
    with_now = "now" in inspect.signature(meter.attempt).parameters

    def metering() -> None:
        # A batch's attempts share a reading of the CPU clock where the meter returns
        # the one it took (Attempts.cpu_mark): the next attempt counts from it.
        mark = None
        for c in claims:
            before = (time.process_time() if mark is None else mark) if cpu else None
            if with_now:
                mark = meter.attempt(c.topic, 0.0001, before, time.monotonic())
            else:
                mark = meter.attempt(c.topic, 0.0001, before)

    out["metering"] = per_job(metering, n)

    def metrics() -> None:  # the claims counted, the tally written (the outcomes: logging)
        if aio:
            meter.counted(claims)
        else:
            meter.claimed(claims)

    out["metrics"] = per_job(metrics, n)

    outcomes = child.outcomes
    log = logging.getLogger("brooq.child")
    finished = [(c, 0.0001, None) for c in claims]
    unwritten: set[int] = set()  # every `done` written
    settled_done = getattr(outcomes, "settled_done", None)

    def logging_() -> None:  # as RoundTrips.settle does, the outcomes counted with them
        with logs.batch(log):
            if settled_done is not None:
                settled_done(finished, unwritten)
            else:
                for c in claims:
                    outcomes.settled(c, "done", 0.0001)

    trips.hold([c.id for c in claims])  # as in the loop: the jobs logged are held
    out["logging"] = per_job(logging_, n)
    trips.hold([])

    def tracing_check() -> None:
        spans, keeps = child.spans, child.keeps
        for c in claims:
            context = logs.current_job.set((c.id, c.topic))
            if keeps and c.topic in keeps:
                pass
            if spans is None:
                pass
            logs.current_job.reset(context)

    out["tracing check"] = per_job(tracing_check, n)

    from brooq.worker import execute

    common = {"topics": trips.topics, "children": 2, "worker": "x", "lease": 30.0}
    tx = psycopg.adapt.Transformer(conn)

    def done_list() -> None:
        for c in claims:
            trips.keep_done(c, execute.DONE, 0.0001, None)
        finished, with_results = trips.take()
        plan = claim_plan(finished, with_results, n, queues, common)
        ids = plan.params["done"]
        tx.get_dumper(ids, psycopg.adapt.PyFormat.BINARY).dump(ids)  # %(done)b

    out["done list"] = per_job(done_list, n)
    del claim
    return out


def _async_calls(runner: Any, claims: list[Any], policy: Any) -> None:
    async def main() -> None:
        limits = SoftLimits(asyncio.get_running_loop())
        tasks = []
        for i, c in enumerate(claims):
            slot = Slot(i, c, limits=limits)
            tasks.append(asyncio.ensure_future(slot.call(runner, policy.attempt_timeout)))
        await asyncio.gather(*tasks)

    asyncio.run(main())


def child_main(
    dsn: str, aio: bool, rows: int, profile: bool, report: int, to_master: int, from_master: int
) -> None:
    sys.stderr = open(os.devnull, "w")  # noqa: SIM115 - brooq's handler writes here
    logs.setup("kv", "INFO")
    import bench_brooq_app
    import bench_brooq_async_app

    app = bench_brooq_async_app if aio else bench_brooq_app
    config = ChildConfig(
        identity=identity_for(os.getpid(), "cpu"),
        dsn=dsn,
        settings=Settings(concurrency=100) if aio else Settings(),
        handlers=app.queue.handlers,
        to_master=to_master,
        from_master=from_master,
        stack_file=f"/tmp/brooq-child-cpu-{os.getpid()}.stack",
        metrics=METRICS,
        board=Board(100 if aio else 1),
        kind=ASYNC if aio else SYNC,
        children=1,
    )
    child: ChildProcess = ChildProcess(config) if aio else Child(config)
    child.setup()
    prof = cProfile.Profile(time.process_time) if profile else None
    if prof is not None:
        prof.enable()
    if aio:
        AsyncLoop(child).run()
    else:
        assert isinstance(child, Child)
        child.run()
    text: dict[str, Any] = {}
    if prof is not None:
        prof.disable()
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(40)
        text["profile"] = buf.getvalue()
    else:
        child.state.stopping = False
        text["stages"] = stages(child, rows, aio)
    os.write(report, json.dumps(text).encode())


METRICS: Any = None


def main() -> int:
    global METRICS
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dsn", default=DEFAULT_DSN)
    p.add_argument("--jobs", type=int, default=100_000)
    p.add_argument("--rows", type=int, default=256, help="jobs per round trip in the stages")
    p.add_argument("--async", dest="aio", action="store_true")
    p.add_argument("--profile", action="store_true")
    args = p.parse_args()
    METRICS = metrics_mod.definitions()
    try:
        with fresh_database(args.dsn, "childcpu", prefix="brooq_cpu") as dsn:
            migrate.up(dsn)
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute(
                    "INSERT INTO job (topic) SELECT %s FROM generate_series(1, %s)",
                    (TOPIC, args.jobs),
                )
                conn.execute("VACUUM ANALYZE job")
            print(drain(dsn, args))
    finally:
        metrics_mod.remove_dir(METRICS_DIR, owned=True)
    return 0


def drain(dsn: str, args: argparse.Namespace) -> str:
    c2m_r, c2m_w = os.pipe()
    m2c_r, m2c_w = os.pipe()
    rep_r, rep_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            for fd in (c2m_r, m2c_w, rep_r):
                os.close(fd)
            child_main(dsn, args.aio, args.rows, args.profile, rep_w, c2m_w, m2c_r)
        except BaseException:
            import traceback

            os.write(rep_w, json.dumps({"error": traceback.format_exc()}).encode())
        finally:
            os._exit(0)
    for fd in (c2m_w, m2c_r, rep_w):
        os.close(fd)

    def read_master() -> None:  # what the child tells the master, read and dropped
        while os.read(c2m_r, 65536):
            pass

    threading.Thread(target=read_master, daemon=True).start()
    first: tuple[float, int, float] | None = None
    last = first
    with psycopg.connect(dsn, autocommit=True) as conn:
        while True:
            row = conn.execute("SELECT count(*) FROM job WHERE state <> 'done'").fetchone()
            left = int(row[0]) if row else 0
            if left < args.jobs:
                last = (time.monotonic(), left, cpu_of(pid) or 0.0)
                first = first or last
            if left == 0:
                break
            time.sleep(0.05)
    os.kill(pid, signal.SIGTERM)
    report = b""
    while chunk := os.read(rep_r, 65536):
        report += chunk
    os.waitpid(pid, 0)
    assert first is not None and last is not None
    jobs = first[1]
    cpu = (last[2] - first[2]) / jobs * 1e6
    rate = jobs / (last[0] - first[0])
    kind = "async" if args.aio else "sync"
    lines = [f"{kind} child, {jobs:,} jobs: {rate:,.0f} jobs/s, {cpu:.1f} us CPU/job"]
    got = json.loads(report or b"{}")
    if "error" in got:
        lines.append(got["error"])
    if "profile" in got:
        lines.append(got["profile"])
    for name, ns in got.get("stages", {}).items():
        lines.append(f"  {name:<14} {ns / 1000:6.2f} us/job")
    if "stages" in got:
        total = sum(got["stages"].values()) / 1000
        lines.append(f"  {'(sum)':<14} {total:6.2f} us/job; the rest: loop, round trip, syscalls")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
