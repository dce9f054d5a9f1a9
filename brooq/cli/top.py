"""`brooq top`: a live view of the queue on a terminal.

A snapshot is read from the database (``take``), drawn by a pure function (``render``) and
refreshed by a small loop (``run``) that puts the terminal in cbreak mode, waits for a key
with select() between frames, and restores the terminal however it ends. Plain ANSI
escapes only, so it works over SSH and needs no curses.

With a read target (--read-database-url) it reads there, and each frame says how far
behind its primary that is (brooq.operator.replica).

Owns: the top command (``top_command``, its --interval bounds), the snapshot, the frame,
the terminal while it runs.
Must never: write to the database, read it but through Queue (stats, throughput_by_queue,
processing_by_holder, in_flight) and brooq.operator.replica, leave the terminal in
cbreak mode or on the alternate screen however it ends, or let a failed refresh end the
view (the frame shows the error and the last good read).
"""

from __future__ import annotations

import contextlib
import os
import select
import shutil
import signal
import sys
import termios
import threading
import time
import tty
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from types import FrameType
from typing import Any, TextIO

import click
import psycopg

from brooq import dsn as dsn_mod
from brooq.cli.common import cli, dsn, emit_json, open_reads, read_target
from brooq.cli.terminal import one_line, say_lines
from brooq.durations import format_age, parse_duration_string
from brooq.errors import BrooqError
from brooq.ipc import progress
from brooq.operator.records import COUNTS, HolderStats, InFlight, TopicStats
from brooq.operator.replica import ReplicaLag, lag
from brooq.queue import Queue
from brooq.sql import queries

WINDOW_SECONDS = 60
IN_FLIGHT_LIMIT = 200
CHILDREN_LIMIT = 100  # holders read, busiest first
MIN_INTERVAL = 0.1
# `brooq top` sleeps in select(), which refuses a timeout past the platform's time_t.
MAX_INTERVAL = 86400.0
EMPTY = "(no unfinished or dead jobs, none finished lately)"

# Alternate screen and hidden cursor while running; the operator's scrollback comes back.
_ENTER = "\x1b[?1049h\x1b[?25l"
_LEAVE = "\x1b[?25h\x1b[?1049l"
_HOME = "\x1b[H"
_CLEAR_LINE_END = "\x1b[K"
_CLEAR_BELOW = "\x1b[J"


@dataclass(frozen=True)
class Snapshot:
    """What `brooq top` shows, read at ``taken_at``."""

    taken_at: datetime
    database: str
    topics: list[TopicStats]
    finished: dict[tuple[str, str], int]  # (queue, topic) -> jobs finished in the window
    in_flight: list[InFlight]
    window: int = WINDOW_SECONDS
    children: list[HolderStats] = field(default_factory=list)  # busiest first
    standing: ReplicaLag | None = None  # read on a read target: how far behind it is

    def topic_names(self) -> list[tuple[str, str]]:
        """(queue, topic) pairs with active or dead jobs, and the pairs that only finished
        jobs lately, by queue then topic."""
        return sorted({(t.queue, t.topic) for t in self.topics} | set(self.finished))

    def rows(self) -> list[tuple[TopicStats, int]]:
        by_name = {(t.queue, t.topic): t for t in self.topics}
        return [
            (by_name.get(key, TopicStats(queue=key[0], topic=key[1])), self.finished.get(key, 0))
            for key in self.topic_names()
        ]

    def to_dict(self) -> dict[str, Any]:
        found: dict[str, Any] = {
            "taken_at": self.taken_at.isoformat(),
            "database": self.database,
            "window_seconds": self.window,
            "topics": [
                {**stats.to_dict(), "finished_in_window": finished}
                for stats, finished in self.rows()
            ],
            "children": [holder.to_dict() for holder in self.children],
            "in_flight": [job.to_dict() for job in self.in_flight],
        }
        if self.standing is not None:
            found["read_from"] = {"database": self.database, **self.standing.to_dict()}
        return found


def take(queue: Queue, database: str, replica: bool = False) -> Snapshot:
    """A snapshot read through ``queue``; ``replica``: it reads on the read target, whose
    standing is read too."""
    standing = None
    if replica:
        with queue.connection() as conn:
            standing = lag(conn, queries(queue.schema))
    return Snapshot(
        taken_at=datetime.now(timezone.utc),
        database=database,
        topics=queue.stats(),
        finished=queue.throughput_by_queue(WINDOW_SECONDS),
        in_flight=queue.in_flight(IN_FLIGHT_LIMIT),
        children=queue.processing_by_holder(CHILDREN_LIMIT),
        standing=standing,
    )


def _columns(rows: list[list[str]], left: set[int]) -> list[str]:
    rows = [[one_line(cell) for cell in row] for row in rows]
    widths = [max(len(cell) for cell in column) for column in zip(*rows, strict=True)]
    return [
        "  ".join(
            cell.ljust(width) if i in left else cell.rjust(width)
            for i, (cell, width) in enumerate(zip(row, widths, strict=True))
        ).rstrip()
        for row in rows
    ]


def render(
    snap: Snapshot,
    *,
    width: int | None = None,
    height: int | None = None,
    error: str | None = None,
) -> list[str]:
    """The frame for ``snap`` as lines, cut to ``width`` columns and ``height`` lines when
    given (the jobs in flight give way first, then the children, each with a line saying
    how many are hidden)."""
    clock = snap.taken_at.astimezone(timezone.utc).strftime("%H:%M:%S UTC")
    lines = [f"brooq top  {snap.database}  {clock}  (q quits)"]
    if snap.standing is not None:
        lines.append(f"read target: {snap.standing.summary()}")
    if error:
        lines.append(f"! {error} (showing the last good read)")
    lines.append("")

    rows = snap.rows()
    if rows:
        finished = f"FINISHED/{snap.window}S"
        table = [["QUEUE", "TOPIC", *(name.upper() for name in COUNTS), finished, "OLDEST READY"]]
        for stats, done in rows:
            oldest = format_age(stats.oldest_ready_age) if stats.ready > stats.held else "-"
            numbers = [*(getattr(stats, name) for name in COUNTS), done]
            table.append([stats.queue, stats.topic, *map(str, numbers), oldest])
        lines += _columns(table, left={0, 1})
    else:
        lines.append(EMPTY)
    lines.append("")
    # The children leave room for the IN FLIGHT line and the one saying how many are hidden.
    lines += _children_block(snap, None if height is None else height - len(lines) - 2)

    processing = sum(t.processing for t in snap.topics)
    expired = processing - sum(t.busy for t in snap.topics)
    flying = f"IN FLIGHT  {processing} processing"
    leases = "lease" if expired == 1 else "leases"
    lines.append(f"{flying}, {expired} {leases} expired" if expired > 0 else flying)
    jobs = [["ID", "TOPIC", "ATTEMPT", "HOLDER", "RUNNING", "LEASE", "PROGRESS"]]
    for job in snap.in_flight:
        lease = format_age(job.lease_left)
        if job.lease_left <= 0:
            lease = "expired " + lease
        running = format_age(job.running_for)
        row = [str(job.id), job.topic, str(job.attempts), job.locked_by, running, lease]
        jobs.append([*row, progress.text(job.progress, job.progress_message)])
    job_lines = _columns(jobs, left={0, 1, 3, 5, 6}) if len(jobs) > 1 else []
    hidden = max(processing, len(snap.in_flight)) - len(snap.in_flight)
    if height is not None and len(lines) + len(job_lines) + (hidden > 0) > height:
        shown = max(height - len(lines) - 2, 0)  # rows below the header, above "… more"
        hidden += len(job_lines) - 1 - shown
        job_lines = job_lines[: shown + 1] if shown else []
    lines += job_lines
    if hidden > 0:
        lines.append(f"… {hidden} more in flight")

    # Text from jobs and the database (topics, holders, progress messages, an error) as a
    # terminal may show it: the frame's own escapes are added after (_frame).
    lines = [one_line(line) for line in lines]
    if height is not None:
        lines = lines[:height]
    if width is not None:
        lines = [line[:width] for line in lines]
    return lines


def _children_block(snap: Snapshot, room: int | None) -> list[str]:
    """CHILDREN: each holder of processing jobs (its locked_by), busiest first, with the
    running time of its oldest job, then a blank line; nothing when no job is processing.
    Cut to ``room`` lines when given, a last row saying how many holders are hidden."""
    if not snap.children:
        return []
    count = len(snap.children)
    more = " or more" if count >= CHILDREN_LIMIT else ""  # the read stopped at the limit
    table = [["HOLDER", "PROCESSING", "LONGEST"]]
    for holder in snap.children:
        table.append([holder.locked_by, str(holder.processing), format_age(holder.oldest_running)])
    rows = _columns(table, left={0})
    if room is not None and len(rows) + 2 > room:  # the title, the rows, the blank line
        shown = max(room - 4, 0)  # below the title and the table's header, above "… more"
        rows = [*(rows[: shown + 1] if shown else []), f"… {count - shown} more holders"]
    return [f"CHILDREN  {count}{more} holding jobs", *rows, ""]


def _frame(lines: list[str]) -> str:
    # No newline after the last line: a frame as tall as the terminal must not scroll it.
    return _HOME + "\r\n".join(line + _CLEAR_LINE_END for line in lines) + _CLEAR_BELOW


@contextmanager
def _terminal(fd: int | None, out: TextIO) -> Iterator[None]:
    """cbreak on stdin (keys arrive one by one, Ctrl-C still interrupts) and the alternate
    screen on stdout, both restored on the way out, TERM and HUP included."""
    saved = termios.tcgetattr(fd) if fd is not None else None

    def stop(signum: int, frame: FrameType | None) -> None:
        raise SystemExit(128 + signum)

    handlers = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        if fd is not None:
            tty.setcbreak(fd)
        out.write(_ENTER)
        out.flush()
        yield
    finally:
        out.write(_LEAVE)
        out.flush()
        if fd is not None and saved is not None:
            termios.tcsetattr(fd, termios.TCSADRAIN, saved)
        for sig, handler in handlers.items():
            signal.signal(sig, handler)


class _Stop:
    """Ctrl-C while the view runs: a flag and a byte on a pipe the loop selects on, so
    that SIGINT never raises inside a read (the database driver's or its pool's code,
    which a KeyboardInterrupt could leave waiting on a connection or a lock)."""

    def __init__(self) -> None:
        self.fd, self._w = os.pipe()
        os.set_blocking(self._w, False)
        self.hit = False
        self._saved = signal.signal(signal.SIGINT, self._handle)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.hit = True
        with contextlib.suppress(OSError):  # the pipe full: one byte is there already
            os.write(self._w, b"\0")

    def close(self) -> None:
        signal.signal(signal.SIGINT, self._saved)
        os.close(self.fd)
        os.close(self._w)


class _Read:
    """One snapshot read in a thread of its own; ``fd`` is readable once it ended. A read
    the view no longer waits for (Ctrl-C, q) is left to end or die with the process."""

    def __init__(self, take_snapshot: Callable[[], Snapshot]) -> None:
        self.fd, self._w = os.pipe()
        self.snap: Snapshot | None = None
        self.error: BaseException | None = None
        threading.Thread(target=self._run, args=(take_snapshot,), daemon=True).start()

    def _run(self, take_snapshot: Callable[[], Snapshot]) -> None:
        try:
            self.snap = take_snapshot()
        except BaseException as exc:  # handed to the loop, which raises what it must
            self.error = exc
        finally:
            os.write(self._w, b"\0")

    def close(self) -> None:
        """Once the read ended (its thread wrote ``fd``)."""
        os.close(self.fd)
        os.close(self._w)


def _wait(fd: int | None, stop: _Stop, seconds: float | None, read: _Read | None = None) -> bool:
    """Wait up to ``seconds`` (None: until ``read`` ends) for a key, Ctrl-C or the end of
    ``read``; True when the view must end (q or Ctrl-C). Any other key ends the wait."""
    deadline = None if seconds is None else time.monotonic() + seconds
    while not stop.hit:
        left = None if deadline is None else max(deadline - time.monotonic(), 0.0)
        fds = [stop.fd, *([fd] if fd is not None else []), *([read.fd] if read else [])]
        readable, _, _ = select.select(fds, [], [], left)
        if stop.fd in readable or stop.hit:
            return True
        if fd is not None and fd in readable:
            data = os.read(fd, 64)
            if b"q" in data.lower():
                return True
            if data and read is None:
                return False  # a key: redraw now
            if not data:  # stdin closed: keep drawing until Ctrl-C
                fd = None
        if (read is not None and read.fd in readable) or (not readable and left == 0):
            return False
    return True


def run(
    take_snapshot: Callable[[], Snapshot],
    *,
    interval: float = 1.0,
    out: TextIO | None = None,
    stdin: TextIO | None = None,
) -> None:
    """Draw a frame every ``interval`` seconds until q or Ctrl-C. The first read happens
    before the screen is taken, so a wrong database fails with a plain error; later read
    errors are shown on the frame and retried. The reads after the first run in a thread
    of their own: Ctrl-C and q end the view at once, a read waiting on the database
    included, and never interrupt the driver."""
    out = out or sys.stdout
    stdin = stdin or sys.stdin
    fd = stdin.fileno() if stdin.isatty() else None
    snap = take_snapshot()
    error: str | None = None
    stop = _Stop()
    try:
        with _terminal(fd, out):
            while True:
                size = shutil.get_terminal_size()
                lines = render(snap, width=size.columns, height=size.lines, error=error)
                out.write(_frame(lines))
                out.flush()
                if _wait(fd, stop, interval):
                    return
                read = _Read(take_snapshot)
                if _wait(fd, stop, None, read):
                    return  # the read is left behind (its pipe with it)
                read.close()
                if isinstance(read.error, (BrooqError, psycopg.Error)):
                    exc = read.error
                    error = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
                elif isinstance(read.error, KeyboardInterrupt):
                    return
                elif read.error is not None:
                    raise read.error
                elif read.snap is not None:
                    snap, error = read.snap, None
    finally:
        stop.close()


@cli.command("top")
@click.option("--once", is_flag=True, help="Print one frame and exit.")
@click.option(
    "--interval",
    default="1s",
    show_default=True,
    help="Time between refreshes, with a unit (500ms, 2s).",
)
@click.option("--json", "as_json", is_flag=True, help="One snapshot as JSON (implies --once).")
@click.pass_context
def top_command(ctx: click.Context, once: bool, interval: str, as_json: bool) -> None:
    """A live view of the queue, refreshed every second.

    Per queue and topic, the counts of `brooq stats` (waiting, scheduled, ready, held,
    retrying, parked, processing, dead: docs/explanation/guarantees.md, "Counts"), the
    jobs finished in the last minute and the oldest ready age; then the children holding
    jobs, how many each and the oldest one's running time; then the jobs in flight with
    their holders (IN FLIGHT says how many leases expired: the reaper gives those jobs
    back). q or Ctrl-C quits."""
    try:
        period = parse_duration_string(interval)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--interval") from None
    if period < MIN_INTERVAL:
        raise click.BadParameter(
            f"{interval} is too short; the least is {MIN_INTERVAL * 1000:g}ms",
            param_hint="--interval",
        )
    if period > MAX_INTERVAL:
        raise click.BadParameter(f"{interval} is too long; the most is 1d", param_hint="--interval")
    target = read_target(ctx)
    database = dsn_mod.describe(target or dsn(ctx))
    queue = open_reads(ctx)

    def take_snapshot() -> Snapshot:
        return take(queue, database, replica=target is not None)

    if as_json:
        emit_json(take_snapshot().to_dict())
    elif once:
        say_lines(render(take_snapshot()))
    elif not sys.stdout.isatty():
        raise click.UsageError("brooq top draws on a terminal; use --once or --json for one frame")
    else:
        run(take_snapshot, interval=period)
