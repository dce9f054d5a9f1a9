"""The log records a ``keep_logs`` handler emits during an attempt, kept for its job.

Owns `Kept`, one attempt's bounded text (at most the handler's keep_logs bytes: the
oldest lines are dropped first, and the text says how many), the context variable naming
the attempt's `Kept` in the thread or task that runs it, and `Capture`, the handler a
child adds to the root logger when a handler of its kind keeps logs: the records that
pass the logging set-up brooq-master made (brooq.logs.setup: QUEUE_LOG_LEVEL, or the
application's own configuration) are formatted as key=value lines with their time and
appended to the running attempt's `Kept`. The text is written with the attempt's outcome,
in the same statement (the _logs variants of job_set_done, job_set_failed and
job_set_canceled: brooq.worker.outcome).
Must never do I/O, and never cost a child whose handlers keep nothing: `Capture` is not
installed there, and the loops check one attribute per job.
"""

from __future__ import annotations

import contextvars
import logging
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager

from brooq.logs import Event, KeyValueFormatter

# A line longer than the whole bound keeps its start, cut to the bound less this much.
_CUT_MARGIN = 64

current: contextvars.ContextVar[Kept | None] = contextvars.ContextVar(
    "brooq_kept_logs", default=None
)


class Kept:
    """One attempt's log lines, at most ``limit`` bytes of UTF-8 (newlines included)."""

    __slots__ = ("dropped", "dropped_bytes", "limit", "lines", "size")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.lines: deque[tuple[str, int]] = deque()
        self.size = 0
        self.dropped = 0
        self.dropped_bytes = 0

    def add(self, line: str) -> None:
        size = len(line.encode("utf-8", "replace")) + 1
        if size > self.limit:
            cut = line.encode("utf-8", "replace")[: self.limit - _CUT_MARGIN]
            line = cut.decode("utf-8", "ignore") + " [cut]"
            size = len(line.encode("utf-8", "replace")) + 1
        self.lines.append((line, size))
        self.size += size
        while self.size > self.limit:
            _, gone = self.lines.popleft()
            self.size -= gone
            self.dropped += 1
            self.dropped_bytes += gone

    def text(self) -> str | None:
        """The kept text (None: the attempt logged nothing), headed by what was dropped."""
        if not self.lines:
            return None
        body = "\n".join(line for line, _ in self.lines)
        if not self.dropped:
            return body
        return (
            f"[brooq: {self.dropped} earlier lines ({self.dropped_bytes} bytes) dropped; "
            f"an attempt keeps its last {self.limit} bytes of log]\n{body}"
        )


@contextmanager
def keeping(limit: int) -> Iterator[Kept]:
    """Keep the records emitted in this context (thread or task) while it lasts."""
    kept = Kept(limit)
    token = current.set(kept)
    try:
        yield kept
    finally:
        current.reset(token)


class Capture(logging.Handler):
    """On the root logger of a child whose handlers keep logs: each record emitted while
    an attempt keeps its logs, as a key=value line with its time (not its job: the line
    is kept with it)."""

    def __init__(self) -> None:
        super().__init__()
        self.lines = KeyValueFormatter(timestamps=True)

    def emit(self, record: logging.LogRecord) -> None:
        kept = current.get()
        if kept is None:
            return
        try:
            exception = self.lines.formatException(record.exc_info) if record.exc_info else ""
            event = Event(
                record.levelname,
                record.name,
                record.process,
                record.created,
                record.getMessage(),
                exception,
            )
            kept.add(self.lines.line(event))
        except Exception:
            self.handleError(record)


def install() -> None:
    """Add `Capture` to the root logger (once)."""
    root = logging.getLogger()
    if not any(isinstance(h, Capture) for h in root.handlers):
        root.addHandler(Capture())
