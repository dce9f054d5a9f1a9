"""What the master knows of one child, and the two ways it acts on a child's process.

Owns ChildProc (its pid, identity, generation, pipes, board, the jobs it holds, why it is
stopping or was killed, the watchdog's notes) and the raw process operations the fleet and
the watchdog's enforcement share: SIGKILL of a child's process group, reading the stack
a child's faulthandler wrote.

Plain data and two system calls: it must never decide anything (brooq.supervisor.watchdog
and brooq.supervisor.settlement do) and never wait for a child.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from brooq.ipc import protocol
from brooq.ipc.board import Board, Running
from brooq.ipc.reasons import KillReason, RetireReason, StopReason


@dataclass
class ChildProc:
    pid: int
    identity: str
    generation: int
    to_child: int
    reader: protocol.LineReader
    stack_file: str
    born: float
    ready: bool = False
    board: Board = field(default_factory=Board)  # what it runs now, shared memory
    job: Running | None = None  # the board as last read (Fleet.read_boards)
    held: list[uuid.UUID] = field(default_factory=list)  # every job it holds, job included
    retiring: StopReason | RetireReason | None = None  # why it was asked to (or will) stop
    kill_reason: KillReason | None = None
    kill_detail: str = ""
    stack_requested_at: float | None = None
    lease_lost_at: float | None = None
    fds: list[int] = field(default_factory=list)
    # Last visible progress (a job started or ended, a new held list): the stall rule.
    progress_at: float = 0.0
    # Batchmates of a long job the child will not run: the enforcer gives them back.
    to_release: list[uuid.UUID] = field(default_factory=list)


def killpg(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    except PermissionError:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    except OSError as exc:
        if exc.errno != errno.ESRCH:
            raise


def read_stack(path: str, limit: int = 1500) -> str:
    try:
        text = Path(path).read_text(errors="replace").strip()
    except OSError:
        return ""
    return text if len(text) <= limit else text[:limit] + "\n..."
