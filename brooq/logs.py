"""Logging: one line per event. key=value by default, JSON with --log-format json.

Under systemd (JOURNAL_STREAM set) no timestamp is printed: the journal adds its own.
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from typing import TextIO

_PAIR = re.compile(r"(\w+)=('[^']*'|\"[^\"]*\"|\S+)")


class _Clock:
    """ISO 8601 timestamps with milliseconds, the date-and-second part made once per
    second: a child finishing thousands of short jobs a second logs a line for each."""

    def __init__(self) -> None:
        self._second = -1
        self._head = ""

    def iso(self, created: float) -> str:
        # Rounded to the microsecond first, as datetime.fromtimestamp does.
        second = int(created)
        micros = round((created - second) * 1_000_000)
        if micros >= 1_000_000:
            second, micros = second + 1, micros - 1_000_000
        if second != self._second:
            self._head = datetime.fromtimestamp(second, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S")
            self._second = second
        return f"{self._head}.{micros // 1000:03d}+00:00"


class KeyValueFormatter(logging.Formatter):
    def __init__(self, timestamps: bool) -> None:
        super().__init__()
        self.timestamps = timestamps
        self._clock = _Clock()

    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
        head = f"level={record.levelname.lower()} logger={record.name} pid={record.process}"
        if self.timestamps:
            head = f"time={self._clock.iso(record.created)} {head}"
        line = f"{head} {message}"
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


class JsonFormatter(logging.Formatter):
    def __init__(self, timestamps: bool) -> None:
        super().__init__()
        self.timestamps = timestamps
        self._clock = _Clock()

    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
        first, _, rest = message.partition("\n")
        out: dict[str, object] = {
            "level": record.levelname.lower(),
            "logger": record.name,
            "pid": record.process,
        }
        if self.timestamps:
            out["time"] = self._clock.iso(record.created)
        for key, value in _PAIR.findall(first):
            out[key] = value.strip("'\"")
        out["message"] = first
        if rest:
            out["detail"] = rest
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, ensure_ascii=False)


class LineHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """A StreamHandler that can hold lines back: inside ``held()`` the calling thread's
    lines (a child's `done` jobs of one round trip) go out in one write at the end of the
    block instead of one write each. Other threads, and everything outside the block,
    write at once as StreamHandler does."""

    def __init__(self, stream: TextIO) -> None:
        super().__init__(stream)
        self._local = threading.local()

    def emit(self, record: logging.LogRecord) -> None:
        pending: list[str] | None = getattr(self._local, "pending", None)
        if pending is None:
            super().emit(record)
            return
        try:
            pending.append(self.format(record) + self.terminator)
            self._local.last = record
        except Exception:
            self.handleError(record)

    @contextmanager
    def held(self) -> Iterator[None]:
        if getattr(self._local, "pending", None) is not None:  # already held further up
            yield
            return
        pending: list[str] = []
        self._local.pending = pending
        try:
            yield
        finally:
            self._local.pending = None
            if pending:
                self.acquire()
                try:
                    self.stream.write("".join(pending))
                    self.flush()
                except Exception:
                    self.handleError(self._local.last)  # as StreamHandler.emit does
                finally:
                    self.release()


@contextmanager
def batch() -> Iterator[None]:
    """Lines logged through brooq's own handler inside this block are written at its end
    (by the calling thread); a no-op when the application configured logging itself."""
    handlers = [h for h in logging.getLogger("brooq").handlers if isinstance(h, LineHandler)]
    if not handlers:
        yield
        return
    with handlers[0].held():
        yield


def setup(fmt: str = "kv", level: str = "INFO") -> None:
    timestamps = not os.environ.get("JOURNAL_STREAM")
    handler = LineHandler(sys.stderr)
    handler.setFormatter(
        JsonFormatter(timestamps) if fmt == "json" else KeyValueFormatter(timestamps)
    )
    root = logging.getLogger("brooq")
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    root.propagate = False
