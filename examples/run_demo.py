"""`make run`: migrate, start brooq-master with the demo app, feed it jobs, show progress.

Every round feeds renders (queue bulk), flaky calls (default, one at a time fleet-wide),
one urgent job at priority 10, a quote (a typed payload) whose result it waits for and
forty fetches (async handlers, run at once by the async child: `--concurrency`);
every tenth round pauses the bulk queue for three rounds (`brooq queues pause bulk` does
the same), then resumes it.
Ctrl-C stops the feeding at once, drains the master (running jobs finish), resumes the
bulk queue if the demo paused it, and prints the final counts.
DATABASE_URL must be set (`make run` starts an embedded PostgreSQL when it is not).

    python examples/run_demo.py [--workers 2] [--seconds N]
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from psycopg import conninfo  # noqa: E402

import brooq  # noqa: E402
from brooq import migrate  # noqa: E402


def feed(queue: brooq.Queue, round_no: int) -> Any:
    """Enqueue this round's jobs; the id of its quote. Pauses the bulk queue for three
    rounds in every ten (main resumes it on the way out)."""
    from demo_app import Quote  # the app's payload type (main put examples/ on the path)

    renders = [
        brooq.Job("demo.render", {"n": round_no * 10 + i, "rounds": 30_000}) for i in range(4)
    ]
    jobs = list(renders)
    # Waits for the four renders (created `waiting`, in the same transaction).
    jobs.append(brooq.Job("demo.report", {"round": round_no}, after=renders))
    jobs += [brooq.Job("demo.flaky", {"n": round_no * 10 + i}) for i in range(3)]
    jobs.append(brooq.Job("demo.notify", {"urgent": round_no}, priority=10))
    jobs += [
        brooq.Job("demo.fetch", {"url": f"https://example.test/{round_no}/{i}"}) for i in range(40)
    ]
    # A typed payload: checked against the handler's dataclass before it is written.
    jobs.append(brooq.Job("demo.quote", Quote(f"sku-{round_no}", round_no + 1, 9.99)))
    ids = queue.enqueue_many(jobs)
    if round_no % 10 == 5:
        queue.pause("bulk")
        print("[demo] paused queue bulk: renders wait, the rest goes on", flush=True)
    elif round_no % 10 == 8:
        queue.resume("bulk")
        print("[demo] resumed queue bulk", flush=True)
    return ids[-1][0]


def show_quote(queue: brooq.Queue, job_id: Any) -> None:
    """Wait for the quote's result (a NOTIFY wakes the waiter; no tight polling)."""
    try:
        record = queue.wait(job_id, timeout=2)
    except brooq.WaitTimeout:
        print("[demo] quote still queued behind other work", flush=True)
        return
    print(f"[demo] quote {record.state}: result={record.result} (queue.wait)", flush=True)


def show(queue: brooq.Queue, done_before: int) -> None:
    with queue.connection() as conn:
        row = conn.execute("SELECT count(*) FROM job WHERE state = 'done'").fetchone()
    done = int(row[0]) if row else 0
    parts = [
        f"{q.name}{' (paused)' if q.paused else ''}: {q.ready} ready, {q.processing} running, "
        f"{q.failed} retrying, {q.dead} dead"
        for q in queue.queues()
    ]
    print(f"[demo] done={done - done_before}  " + " | ".join(parts), flush=True)


def demo_ops_addr() -> str:
    """QUEUE_OPS_ADDR when it names a port, else a free one on 127.0.0.1 (the demo prints
    the page's address, so it must know the port before the master binds it)."""
    given = os.environ.get("QUEUE_OPS_ADDR", "")
    if given and not given.endswith(":0"):
        return given
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


def cli_command(dsn: str, args: str, app: bool = False) -> str:
    """A `brooq` command as it runs from the checkout's root, with the database to use (a
    DSN holding a password is not printed) and, for one that imports the demo app, its
    directory on the path."""
    if conninfo.conninfo_to_dict(dsn).get("password"):
        database = "DATABASE_URL=<your DATABASE_URL>"
    else:
        database = f"DATABASE_URL='{dsn}'"
    path = "PYTHONPATH=examples " if app else ""
    return f"{database} {path}.venv/bin/brooq {args}"


def top_command(dsn: str) -> str:
    """`brooq top` with the database to use."""
    return cli_command(dsn, "top")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    # One child per core for the CPU-heavy sync jobs, and one async child for the fetches.
    parser.add_argument("--workers", type=int, default=(os.cpu_count() or 2) + 1)
    parser.add_argument("--seconds", type=float, default=0, help="stop after this long")
    args = parser.parse_args()
    dsn = os.environ.get("DATABASE_URL", "")
    if not dsn:
        sys.exit("DATABASE_URL is not set; use `make run`, which starts a database for you")
    for m in migrate.up(dsn):
        print(f"[demo] applied migration {m.version:04d}_{m.name}")
    sys.path.insert(0, str(HERE))
    # Its handlers: a job naming no queue goes to its handler's, a typed one is checked.
    from demo_app import queue

    with queue.connection() as conn:
        row = conn.execute("SELECT count(*) FROM job WHERE state = 'done'").fetchone()
    done_before = int(row[0]) if row else 0
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(HERE), str(HERE.parent)]))
    ops_addr = demo_ops_addr()
    env["QUEUE_OPS_ADDR"] = ops_addr
    master = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "brooq.master_cli",
            "--app",
            "demo_app:queue",
            "--workers",
            str(args.workers),
            "--queues",
            "default=3,bulk=1",
            "--log-level",
            "ERROR",
        ],
        cwd=HERE,
        env=env,
    )
    print(
        f"[demo] brooq-master pid {master.pid} with {args.workers} workers (one async child "
        "runs the fetches, up to 100 at once; the others the sync jobs); Ctrl-C to stop"
    )
    print(
        "[demo] periodic: a heartbeat job every 3 s, once per tick across masters; "
        f"list it with: {cli_command(dsn, 'periodic --app demo_app:queue', app=True)}",
    )
    print(f"[demo] status page: http://{ops_addr}/ (the in-flight jobs, their stacks, errors)")
    print(f"[demo] live view in another terminal: {top_command(dsn)}", flush=True)
    started = time.monotonic()
    round_no = 0
    # Ctrl-C: the terminal sends SIGINT to the master too (it drains); here it only ends
    # the feeding, checked before each round, so no round is fed after it.
    stopping: list[int] = []
    signal.signal(signal.SIGINT, lambda signum, frame: stopping.append(signum))
    while master.poll() is None and not stopping:
        quote = feed(queue, round_no)
        round_no += 1
        time.sleep(1.0)
        if stopping:
            break
        show(queue, done_before)
        show_quote(queue, quote)
        if args.seconds and time.monotonic() - started >= args.seconds:
            master.send_signal(signal.SIGTERM)
            break
    print("[demo] draining: running jobs finish, nothing new is claimed", flush=True)
    code = master.wait()
    # A stop in the middle of a pause must not leave the next run's bulk queue paused.
    if any(q.name == "bulk" and q.paused for q in queue.queues()):
        queue.resume("bulk")
        print("[demo] resumed queue bulk", flush=True)
    show(queue, done_before)
    queue.close()
    print(f"[demo] brooq-master exited with status {code}")
    return code


if __name__ == "__main__":
    sys.exit(main())
