"""Messages between the master and one child, as JSON lines over two pipes.

child -> master: {"ready": 1} | {"held": [id, ...]} | {"retire": reason}
                 | {"release": [id, ...]} | {"stack": id, "text": traceback}
master -> child: "w" (wake: jobs may be ready) | "lost <id>" (lease lost: abandon it)
                 | "drain" (the SIGTERM that follows is a drain: an async child's
                   deadline is graceful_timeout) | "stack <id>" (before a hard kill: an
                   async child writes that job's await chain beside the thread stacks)
                 | "where <id>" (`brooq jobs stack`: answer with {"stack": …})

"held" lists every job the child has claimed and not yet settled (the master renews
their leases); it is sent once per claim, before any of those jobs runs. "release" names
jobs of its batch the child will not run (they wait behind a long job): the master gives
them back, guarded by the child's identity, and stops counting them as held. Which job
runs right now is not a message: it is on the child's board (brooq.ipc.board), because a
message per job cost more than a short job. Each pipe has one writer at a time; the
reader reassembles lines, so a long list may take more than one write.
"""

from __future__ import annotations

import json
import os
from typing import Any


def encode(message: dict[str, Any]) -> bytes:
    return json.dumps(message, separators=(",", ":")).encode() + b"\n"


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
