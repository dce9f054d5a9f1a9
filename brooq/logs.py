"""Logging: one line per event. key=value by default, JSON with --log-format json.

A record is one line whatever its texts hold: a newline, a CR or another control
character in a message, a traceback, an error text a job wrote, is escaped inside the
line (KeyValueFormatter; JSON escapes them itself), so that no text can forge a record.

Under systemd (JOURNAL_STREAM set) no timestamp is printed: the journal adds its own.

brooq-master formats the records of every logger, the application's included, unless
told otherwise (``--log-config``, QUEUE_LOG_CONFIG; ``setup``): brooq's own loggers go
to a handler of their own (the per-job lines' fast path, ``emit_plain``, needs it alone),
the others reach the root logger's, whose lines name the job a handler was running
(``job=<id> topic=<topic>``, from ``current_job``, set by the child around each attempt).
"""

from __future__ import annotations

import contextvars
import json
import logging
import logging.config
import os
import re
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, NamedTuple, TextIO

# key=value in a message; a quoted value is a Python string literal as %r writes it, taken
# whole with its escapes ('it\'s', "a \"b\""), so a quote or a key=value inside it does not
# end it early.
_PAIR = re.compile(r"""(\w+)=('[^'\\]*(?:\\.[^'\\]*)*'|"[^"\\]*(?:\\.[^"\\]*)*"|\S+)""")
_ESCAPE = re.compile(r"\\(x[0-9a-fA-F]{2}|u[0-9a-fA-F]{4}|U[0-9a-fA-F]{8}|[0-7]{1,3}|.)", re.DOTALL)
_SIMPLE_ESCAPES = {
    "\\": "\\",
    "'": "'",
    '"': '"',
    "a": "\a",
    "b": "\b",
    "f": "\f",
    "n": "\n",
    "r": "\r",
    "t": "\t",
    "v": "\v",
}
# The keys of a JSON line's own. A message key=value with one of these names is kept under
# "msg_" + name: a handler's error text saying "pid=1" must not replace the line's pid.
HEADER_KEYS = frozenset({"time", "level", "logger", "pid", "message", "detail", "exception"})
_QUOTES = "'\""


class _Clock:
    """ISO 8601 timestamps with milliseconds, made once per millisecond: a child
    finishing thousands of short jobs a second logs a line for each."""

    def __init__(self) -> None:
        # (second, its text) and (from, until, text): the times ``text`` stands for, a
        # little inside its millisecond (so that rounding to the microsecond, below,
        # cannot move a time of the window into the next one). Each replaced as one
        # object: threads that log at once each read values that belong together.
        self._cached: tuple[int, str] = (-1, "")
        self._window: tuple[float, float, str] = (0.0, 0.0, "")

    def iso(self, created: float) -> str:
        low, high, text = self._window
        if low <= created < high:
            return text
        # Rounded to the microsecond first, as datetime.fromtimestamp does.
        second = int(created)
        micros = round((created - second) * 1_000_000)
        if micros >= 1_000_000:
            second, micros = second + 1, micros - 1_000_000
        cached = self._cached
        if cached[0] != second:
            text = datetime.fromtimestamp(second, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S")
            cached = self._cached = (second, text)
        millis = micros // 1000
        text = f"{cached[1]}.{millis:03d}+00:00"
        start = second + millis / 1000
        self._window = (start + 2e-6, start + 0.000998, text)
        return text


class Event(NamedTuple):
    """What one line says: all a LogRecord carries that brooq's formats show."""

    level: str
    logger: str
    pid: int | None
    created: float
    message: str
    exception: str = ""
    job: tuple[Any, str] | None = None  # (id, topic) of the job whose handler logged it


# The job whose handler runs in this thread or task: (id, topic). Set by the children
# around each attempt; an asyncio task has its own value.
current_job: contextvars.ContextVar[tuple[Any, str] | None] = contextvars.ContextVar(
    "brooq_current_job", default=None
)


class _LineFormatter(logging.Formatter):
    """brooq's formatters: a line from an Event, so that a line can also be made without
    a LogRecord (emit_plain)."""

    def __init__(self, timestamps: bool) -> None:
        super().__init__()
        self.timestamps = timestamps
        self._clock = _Clock()

    def format(self, record: logging.LogRecord) -> str:
        exception = self.formatException(record.exc_info) if record.exc_info else ""
        return self.line(
            Event(
                record.levelname,
                record.name,
                record.process,
                record.created,
                record.getMessage(),
                exception,
                getattr(record, "brooq_job", None),
            )
        )

    def line(self, event: Event) -> str:
        raise NotImplementedError

    def plain(self, level: str, logger: str, pid: int | None) -> Callable[[float, str], str]:
        """What makes the line of a record without a job or an exception of ``level``,
        ``logger`` and ``pid`` from its time and message (emit_plain's, made once per
        batch)."""

        def make(created: float, message: str) -> str:
            return self.line(Event(level, logger, pid, created, message))

        return make


class KeyValueFormatter(_LineFormatter):
    """One line per record, whatever its texts hold: the message's first line with its
    control characters escaped (``_one_line``), what follows it (a traceback a message
    carries: event=job_failed, event=job_dead) as ``detail="..."`` and a record's
    exception as ``exception="..."``, each a double-quoted string with its newlines,
    quotes and control characters escaped (``_quoted``). No text a job or a handler
    writes can start a line, so none can pass for a record of its own."""

    def line(self, event: Event) -> str:
        head = f"level={event.level.lower()} logger={event.logger} pid={event.pid}"
        if event.job is not None:
            head += f" job={_one_line(str(event.job[0]))} topic={_one_line(event.job[1])}"
        if self.timestamps:
            head = f"time={self._clock.iso(event.created)} {head}"
        message = event.message
        if message.isprintable():  # the usual line: nothing to escape, no detail
            line = f"{head} {message}"
        else:
            first, _, rest = message.partition("\n")
            line = f"{head} {_one_line(first)}"
            if rest:
                line += " detail=" + _quoted(rest)
        if event.exception:
            line += " exception=" + _quoted(event.exception)
        return line

    def plain(self, level: str, logger: str, pid: int | None) -> Callable[[float, str], str]:
        """``line`` of such Events, their head (level, logger, pid) made once."""
        head = f"level={level.lower()} logger={logger} pid={pid}"
        line, iso, timestamps = self.line, self._clock.iso, self.timestamps

        def make(created: float, message: str) -> str:
            if not message.isprintable():
                return line(Event(level, logger, pid, created, message))
            if timestamps:
                return f"time={iso(created)} {head} {message}"
            return f"{head} {message}"

        return make


# What must not reach a log line raw: C0 controls (newline and CR among them), DEL, C1
# controls (NEL among them), the bidi marks, overrides and isolates, and the line and
# paragraph separators (str.splitlines ends a line at several of these).
_CONTROL = re.compile(
    "[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]"
)
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escaped(match: re.Match[str]) -> str:
    char = match.group(0)
    return _NAMED.get(char) or f"\\u{ord(char):04x}"


def _one_line(text: str) -> str:
    """``text`` with every control character escaped (\\n, \\r, \\t, \\u001b...)."""
    return text if text.isprintable() else _CONTROL.sub(_escaped, text)


def _quoted(text: str) -> str:
    """``text`` as one double-quoted value: JSON's string escapes, with DEL, the C1
    controls, bidi marks and line separators as \\uXXXX too."""
    quoted = json.dumps(text, ensure_ascii=False)
    return quoted if quoted.isprintable() else _CONTROL.sub(_escaped, quoted)


class JsonFormatter(_LineFormatter):
    def line(self, event: Event) -> str:
        first, _, rest = event.message.partition("\n")
        out: dict[str, object] = {
            "level": event.level.lower(),
            "logger": event.logger,
            "pid": event.pid,
        }
        if self.timestamps:
            out["time"] = self._clock.iso(event.created)
        for key, value in _PAIR.findall(first):
            if key in HEADER_KEYS:
                key = "msg_" + key
            # Most values (ids, numbers, topics) are plain words: no call for them.
            out[key] = _value(value) if value[0] in _QUOTES or value[-1] in _QUOTES else value
        if event.job is not None:  # the running job, whatever the message says
            out["job"], out["topic"] = str(event.job[0]), event.job[1]
        out["message"] = first
        if rest:
            out["detail"] = rest
        if event.exception:
            out["exception"] = event.exception
        line = json.dumps(out, ensure_ascii=False)
        # JSON escapes the C0 controls; DEL, C1 (NEL), bidi marks and U+2028 as well.
        return line if line.isprintable() else _CONTROL.sub(_escaped, line)


def _unescape(match: re.Match[str]) -> str:
    code = match.group(1)
    simple = _SIMPLE_ESCAPES.get(code)
    if simple is not None:
        return simple
    if len(code) > 1 and code[0] in "xuU":
        value = int(code[1:], 16)
    elif code[0] in "01234567":
        value = int(code, 8)
    else:
        return match.group(0)  # not an escape: Python keeps the backslash too
    return chr(value) if value <= 0x10FFFF else match.group(0)


def _value(token: str) -> str:
    """A message value as it was logged: a quoted one (%r of a string) decoded back to
    that string, any other one as written (stray quotes at its ends dropped)."""
    if len(token) >= 2 and token[0] in _QUOTES and token[-1] == token[0]:
        body = token[1:-1]
        return _ESCAPE.sub(_unescape, body) if "\\" in body else body
    return token.strip(_QUOTES)


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
        except Exception:
            self.handleError(record)

    @contextmanager
    def held(self, logger: logging.Logger | None = None) -> Iterator[None]:
        """Hold this thread's lines until the block ends; with ``logger``, let
        emit_plain() make that logger's lines when its route allows."""
        if getattr(self._local, "pending", None) is not None:  # already held further up
            yield
            return
        pending: list[str] = []
        self._local.pending = pending
        formatter = self.formatter
        if (
            logger is not None
            and isinstance(formatter, _LineFormatter)
            and self._plain_route(logger)
        ):
            pid = os.getpid() if logging.logProcesses else None
            _plain.current = _Plain(self, logger, formatter, pending, pid)
        try:
            yield
        finally:
            self._local.pending = None
            _plain.current = None
            if pending:
                self.acquire()
                try:
                    self.stream.write("".join(pending))
                    self.flush()
                except Exception:
                    self.handleError(_unwritten(pending))
                finally:
                    self.release()

    def _plain_route(self, logger: logging.Logger) -> bool:
        """Whether ``logger``'s records reach this handler alone, unfiltered."""
        if self.filters:
            return False
        current: logging.Logger | None = logger
        while current is not None:
            if current.filters:
                return False
            if current.handlers:
                if current.handlers != [self]:
                    return False
                return not current.propagate or not _has_handlers(current.parent)
            if not current.propagate:
                return False
            current = current.parent
        return False


def _has_handlers(logger: logging.Logger | None) -> bool:
    while logger is not None:
        if logger.handlers:
            return True
        if not logger.propagate:
            return False
        logger = logger.parent
    return False


@dataclass
class _Plain:
    """The logger whose lines a held LineHandler may make without LogRecords."""

    handler: LineHandler
    logger: logging.Logger
    formatter: _LineFormatter
    pending: list[str]
    pid: int | None
    # Per level: what holds a line of it (its message formatted), made at its first line.
    writers: dict[int, Callable[[str], None]] = field(default_factory=dict)

    def emit(self, level: int, msg: str, args: tuple[object, ...]) -> bool:
        if level < self.handler.level or not self.logger.isEnabledFor(level):
            return True  # nothing to log
        try:
            message = msg % args if args else msg
        except Exception:
            return False  # logging's own path reports the bad format
        self.writer(level)(message)
        return True

    def writer(self, level: int) -> Callable[[str], None]:
        """What holds one line of ``level`` (enabled), given its message."""
        write = self.writers.get(level)
        if write is None:
            if level < self.handler.level:
                write = _discard
            else:
                make = self.formatter.plain(logging.getLevelName(level), self.logger.name, self.pid)
                hold, end, now = self.pending.append, self.handler.terminator, time.time

                def write(message: str) -> None:
                    hold(make(now(), message) + end)

            self.writers[level] = write
        return write


def _discard(message: str) -> None:
    pass


# The held logger of this thread, if any (one at a time per thread).
_plain = threading.local()


def emit_plain(logger: logging.Logger, level: int, msg: str, args: tuple[object, ...]) -> bool:
    """Hold one line of ``logger`` without building a LogRecord, when that cannot be told
    apart from logging it: inside ``batch(logger)``, with ``logger``'s records going to
    brooq's handler alone, through no filter, formatted by brooq's formatter. False when
    the caller must log it the usual way. (A LogRecord and the handler's lock cost more
    than a no-op job, and a child logs a line for each job.)"""
    plain: _Plain | None = getattr(_plain, "current", None)
    if plain is None or plain.logger is not logger:
        return False
    return plain.emit(level, msg, args)


def held_lines(logger: logging.Logger, level: int) -> Callable[[str], None] | None:
    """emit_plain for many lines of one ``level`` (enabled for ``logger``): what holds
    one, given its message as ``msg % args`` makes it, or None when they must be logged
    the usual way. Asked once, then called per line."""
    plain: _Plain | None = getattr(_plain, "current", None)
    if plain is None or plain.logger is not logger:
        return None
    return plain.writer(level)


def _unwritten(pending: list[str]) -> logging.LogRecord:
    """A record standing for held lines that could not be written, for handleError."""
    return logging.LogRecord(
        "brooq", logging.ERROR, __file__, 0, "%d held log lines", (len(pending),), None
    )


@contextmanager
def batch(logger: logging.Logger | None = None) -> Iterator[None]:
    """Lines logged through brooq's own handler inside this block are written at its end
    (by the calling thread); a no-op when the application configured logging itself.
    With ``logger``, emit_plain() may make that logger's lines without LogRecords."""
    handler = _our_handler()
    if handler is None:
        yield
        return
    with handler.held(logger):
        yield


def _our_handler() -> LineHandler | None:
    """brooq's own handler, when setup() installed it and nobody replaced it."""
    for handler in logging.getLogger("brooq").handlers:
        if isinstance(handler, LineHandler):
            return handler
    return None


# --log-config: brooq formats every logger (the default), only its own, or a file says.
EVERY = "brooq"
OWN = "own"


class _JobContext(logging.Filter):
    """Marks a record with the job whose handler logged it (current_job)."""

    def filter(self, record: logging.LogRecord) -> bool:
        job = current_job.get()
        if job is not None:
            record.brooq_job = job
        return True


def setup(fmt: str = "kv", level: str = "INFO", config: str = EVERY) -> None:
    """brooq's handler for its own loggers; for every other logger too with ``config``
    "brooq" (records at ``level`` and above, the application's warnings included);
    "own" leaves the rest to the application; a path applies that logging
    configuration after brooq's (a JSON dictConfig or an INI fileConfig, read by
    ``check_config``), which may reconfigure brooq's loggers as well."""
    timestamps = not os.environ.get("JOURNAL_STREAM")

    def handler() -> LineHandler:
        made = LineHandler(sys.stderr)
        made.setFormatter(
            JsonFormatter(timestamps) if fmt == "json" else KeyValueFormatter(timestamps)
        )
        return made

    root = logging.getLogger("brooq")
    root.handlers[:] = [handler()]
    root.setLevel(level.upper())
    root.propagate = False
    if config == EVERY:
        everything = handler()
        everything.addFilter(_JobContext())
        logging.root.handlers[:] = [everything]
        logging.root.setLevel(level.upper())
        logging.captureWarnings(True)
    elif config != OWN:
        apply_config(config)


def check_config(config: str) -> str | None:
    """Why ``config`` (brooq, own, or a file) cannot be used; None when it can."""
    if config in (EVERY, OWN):
        return None
    path = Path(config)
    if not path.is_file():
        return f"--log-config {config}: no such file (or give brooq or own)"
    if path.suffix == ".json":
        try:
            loaded = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            return f"--log-config {config}: not a JSON file: {exc}"
        if not isinstance(loaded, dict) or loaded.get("version") != 1:
            return f'--log-config {config}: a logging dictConfig needs "version": 1'
    return None


def apply_config(config: str) -> None:
    """A logging configuration file: JSON for dictConfig, anything else fileConfig (INI).
    Loggers that exist already (brooq's) stay enabled unless the file says otherwise."""
    path = Path(config)
    if path.suffix == ".json":
        loaded = json.loads(path.read_text(encoding="utf-8"))
        loaded.setdefault("disable_existing_loggers", False)
        logging.config.dictConfig(loaded)
    else:
        logging.config.fileConfig(path, disable_existing_loggers=False)
