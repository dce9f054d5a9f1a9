"""Messages between the master and one child, as JSON lines over two pipes.

child -> master: {"ready": 1} | {"busy": id, "topic": t, "attempt": n, "policy": [...]}
                 | {"idle": 1} | {"retire": reason}
master -> child: "w" (wake: jobs may be ready) | "lost <id>" (lease lost: abandon it)

Each message is one write of less than PIPE_BUF bytes, so writes are atomic.
"""

from __future__ import annotations

import json
import os
from typing import Any

from brooq.handlers import Policy


def encode(message: dict[str, Any]) -> bytes:
    return json.dumps(message, separators=(",", ":")).encode() + b"\n"


def policy_to_list(p: Policy) -> list[float]:
    return [
        p.max_attempts,
        p.attempt_timeout,
        p.max_execution_timeout,
        p.backoff_base,
        p.backoff_max,
    ]


def policy_from_list(values: list[float]) -> Policy:
    return Policy(int(values[0]), values[1], values[2], values[3], values[4])


class LineReader:
    """Split what a non-blocking pipe yields into complete lines."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self._buffer = b""
        self.eof = False

    def read(self) -> list[bytes]:
        while True:
            try:
                chunk = os.read(self.fd, 65536)
            except BlockingIOError:
                break
            except OSError:
                self.eof = True
                break
            if not chunk:
                self.eof = True
                break
            self._buffer += chunk
            if len(chunk) < 65536:
                break
        *lines, self._buffer = self._buffer.split(b"\n")
        return [line for line in lines if line]


def send(fd: int, data: bytes) -> bool:
    """Write without blocking; False when the other side is gone or not reading."""
    try:
        os.write(fd, data)
    except (BlockingIOError, BrokenPipeError, OSError):
        return False
    return True
