"""Logging: one line per event. key=value by default, JSON with --log-format json.

Under systemd (JOURNAL_STREAM set) no timestamp is printed: the journal adds its own.
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
from datetime import datetime, timezone

_PAIR = re.compile(r"(\w+)=('[^']*'|\"[^\"]*\"|\S+)")


class KeyValueFormatter(logging.Formatter):
    def __init__(self, timestamps: bool) -> None:
        super().__init__()
        self.timestamps = timestamps

    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
        head = f"level={record.levelname.lower()} logger={record.name} pid={record.process}"
        if self.timestamps:
            when = datetime.fromtimestamp(record.created, timezone.utc).isoformat(
                timespec="milliseconds"
            )
            head = f"time={when} {head}"
        line = f"{head} {message}"
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


class JsonFormatter(logging.Formatter):
    def __init__(self, timestamps: bool) -> None:
        super().__init__()
        self.timestamps = timestamps

    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
        first, _, rest = message.partition("\n")
        out: dict[str, object] = {
            "level": record.levelname.lower(),
            "logger": record.name,
            "pid": record.process,
        }
        if self.timestamps:
            out["time"] = datetime.fromtimestamp(record.created, timezone.utc).isoformat()
        for key, value in _PAIR.findall(first):
            out[key] = value.strip("'\"")
        out["message"] = first
        if rest:
            out["detail"] = rest
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, ensure_ascii=False)


def setup(fmt: str = "kv", level: str = "INFO") -> None:
    timestamps = not os.environ.get("JOURNAL_STREAM")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        JsonFormatter(timestamps) if fmt == "json" else KeyValueFormatter(timestamps)
    )
    root = logging.getLogger("brooq")
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    root.propagate = False
