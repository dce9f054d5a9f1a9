"""`make run`: migrate, start brooq-master with the demo app, feed it jobs, show progress.

Every round feeds renders (queue bulk), flaky calls (default, one at a time fleet-wide),
one urgent job at priority 10, a quote (a typed payload) whose result it waits for and
forty fetches (async handlers, run at once by the async child: `--concurrency`);
every tenth round pauses the bulk queue for three rounds (`brooq queues pause bulk` does
the same), then resumes it. Beside the rounds, one video (a durable handler of five steps)
shows a job resuming after a kill: once its second step is recorded, the demo SIGKILLs the
child running it; the master replaces the child, and the job's next attempt replays the
recorded steps and runs the rest. `--seconds` stops once the video's story is told too.
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
import threading
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
        record = queue.wait(job_id, timeout=5)
    except brooq.WaitTimeout:
        print("[demo] quote still queued behind other work", flush=True)
        return
    print(f"[demo] quote {record.state}: result={record.result} (queue.wait)", flush=True)


# The counts brooq shows everywhere (docs/explanation/guarantees.md, "Counts"), in their
# order: `brooq stats`, `brooq queues`, `brooq top`, the status page, brooq.QueueStats.
COUNTS = ("waiting", "scheduled", "ready", "held", "retrying", "parked", "processing", "dead")


def show(queue: brooq.Queue, done_before: int) -> None:
    """One line per round: the jobs done since the start, then each queue's counts (the
    zeros left out)."""
    with queue.connection() as conn:
        row = conn.execute("SELECT count(*) FROM job_all WHERE state = 'done'").fetchone()
    done = int(row[0]) if row else 0
    parts = [
        f"{q.name}{' (paused)' if q.paused else ''}: "
        + (", ".join(f"{n} {name}" for name in COUNTS if (n := getattr(q, name))) or "no jobs")
        for q in queue.queues()
    ]
    print(f"[demo] done={done - done_before}  " + " | ".join(parts), flush=True)


# How long the video's story may take before the demo stops telling it (a busy machine).
STORY_TIMEOUT = 60.0


def recorded_steps(queue: brooq.Queue, job_id: Any) -> list[dict[str, Any]]:
    """The steps recorded for the job so far (claim.step writes one row each), in order."""
    with queue.connection() as conn:
        rows = conn.execute(
            "SELECT result FROM brooq_job_step WHERE job_id = %s ORDER BY created_at, name",
            (job_id,),
        ).fetchall()
    return [row[0] for row in rows]


def master_children(queue: brooq.Queue, master_pid: int) -> set[int]:
    """The pids of the master's children, as the master lists them in brooq_master (what
    `brooq fleet` shows)."""
    with queue.connection() as conn:
        row = conn.execute(
            "SELECT children FROM brooq_master WHERE pid = %s AND host = %s",
            (master_pid, socket.gethostname()),
        ).fetchone()
    return {int(c["pid"]) for c in row[0]} if row else set()


def span(numbers: list[int]) -> str:
    """[1, 2] -> "1-2", [3] -> "3"."""
    return f"{numbers[0]}-{numbers[-1]}" if len(numbers) > 1 else str(numbers[0])


def video_story(queue: brooq.Queue, dsn: str, master_pid: int, stop: threading.Event) -> None:
    """Enqueue a video, kill the child running it once its second step is recorded, and
    tell how the job resumed. Gives up when the demo stops first, or after STORY_TIMEOUT."""
    from demo_app import VIDEO_STEPS

    total = len(VIDEO_STEPS)
    deadline = time.monotonic() + STORY_TIMEOUT

    def say(line: str) -> None:
        print(f"[demo] video: {line}", flush=True)

    def wait(seconds: float) -> bool:
        """Whether to go on polling: neither stopped nor out of time."""
        return not stop.wait(seconds) and time.monotonic() < deadline

    job_id, _ = queue.enqueue(brooq.Job("demo.video", {"title": "intro"}, priority=10))
    say(f"job {job_id}, {total} steps, each recorded with claim.step")
    while len(recorded_steps(queue, job_id)) < 2:
        if not wait(0.05):
            return say("its second step was not recorded in time; no kill this run")
    record = queue.get(job_id)
    if record is None or record.state != "processing" or not record.locked_by:
        return say("it finished before the kill could come; nothing to show this run")
    # locked_by is host:pid:tag; the pid must be one of this master's children.
    pid = int(record.locked_by.rsplit(":", 2)[1])
    before = master_children(queue, master_pid)
    if pid not in before:
        return say(f"child pid {pid} is not one the master lists; not killing it")
    recorded = len(recorded_steps(queue, job_id))
    say(
        f"step {recorded} of {total} recorded; killing the worker running it "
        f"(child pid {pid}, SIGKILL)..."
    )
    os.kill(pid, signal.SIGKILL)
    while not (fresh := master_children(queue, master_pid) - before):
        if not wait(0.1):
            break
    else:
        say(
            "the master saw the child die (its log lines), counted the attempt as failed and "
            f"forked child pid {min(fresh)} in its place; the job is retried"
        )
    while (record := queue.get(job_id)) is not None and record.state not in ("done", "dead"):
        if not wait(0.2):
            return say(f"still {record.state} after {STORY_TIMEOUT:.0f} s; see brooq jobs show")
    if record is None:
        return say("deleted before it ended")
    steps = recorded_steps(queue, job_id)
    replayed = [n for n, s in enumerate(steps, 1) if s["attempt"] < record.attempts]
    ran = [n for n, s in enumerate(steps, 1) if s["attempt"] == record.attempts]
    if record.state != "done" or not replayed or not ran:
        say(f"ended {record.state}, {len(steps)} steps recorded")
    else:
        say(
            f"done after {record.attempts} attempts. Resumed: steps {span(replayed)} replayed "
            f"from their records, {span(ran)} ran (step {ran[0]} from its start: the kill "
            "came while it ran)"
        )
    say(f"its steps: {cli_command(dsn, f'jobs show {job_id}')}")


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
        row = conn.execute("SELECT count(*) FROM job_all WHERE state = 'done'").fetchone()
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
    stop_story = threading.Event()
    story = threading.Thread(
        target=video_story, args=(queue, dsn, master.pid, stop_story), daemon=True
    )
    story.start()
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
        if args.seconds and time.monotonic() - started >= args.seconds and not story.is_alive():
            master.send_signal(signal.SIGTERM)
            break
    stop_story.set()
    story.join()
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
