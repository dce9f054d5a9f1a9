"""What the master knows of one child, and the two ways it acts on a child's process.

Owns ChildProc (its pid, identity, generation, pipes, board, the jobs it holds, why it is
stopping or was killed, the watchdog's notes, what settle() reads of it once reaped) and
the raw process operations the fleet and the watchdog's enforcement share: SIGKILL of a
child's process group, reading the stack a child's faulthandler wrote.

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
from typing import Any

from brooq.ipc import protocol
from brooq.ipc.board import Board, Running
from brooq.ipc.reasons import SYNC, ChildKind, KillReason, RetireReason, StopReason
from brooq.producer.ids import uuid_from_int
from brooq.supervisor.settlement import ChildEnd


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
    # The handlers it imported, as it said when ready (brooq.declare.handlers.described): after a
    # reload, the master's options come from here (brooq.supervisor.options).
    handlers: dict[str, Any] | None = None
    board: Board = field(default_factory=Board)  # what it runs now, shared memory
    kind: ChildKind = SYNC  # which handlers it runs (docs/async.md)
    jobs: tuple[Running, ...] = ()  # the board as last read (Fleet.read_boards)
    # Every job it holds, jobs included, as the canonical text the child sent (checked
    # when read: brooq.supervisor.childmessages). A list comes per claim round trip and
    # is read as UUIDs a few times a lease (``held``): parsing every id of every list
    # cost the master more than a no-op job's share of its loop.
    held_ids: list[str] = field(default_factory=list)
    _held: list[uuid.UUID] | None = field(default=None, init=False, repr=False)
    # Jobs that left `held` while Renewal's statement ran (``watching_drops``): one back
    # in `held` was claimed again (canceled, then retried), and a renewal answer older
    # than that claim must not be taken for the new claim's.
    dropped: set[uuid.UUID] = field(default_factory=set)
    watching_drops: bool = False
    retiring: StopReason | RetireReason | None = None  # why it was asked to (or will) stop
    kill_reason: KillReason | None = None
    # Why its claims fail (the first line of the error), None while they work: /readyz
    # says not ready when every ready child's do (a full disk, a trigger refusing).
    claims_failing: str | None = None
    kill_job: uuid.UUID | None = None  # the job the watchdog charges for the kill
    kill_detail: str = ""
    kill_stack: str = ""  # the stack read before the kill, whole: the error history's
    stack_requested_at: float | None = None
    lease_lost: dict[uuid.UUID, float] = field(default_factory=dict)  # job -> told at
    fds: list[int] = field(default_factory=list)
    # Last visible progress (a job started or ended, a new held list): the stall rule.
    progress_at: float = 0.0
    # Batchmates of a long job the child will not run: the enforcer gives them back.
    to_release: list[uuid.UUID] = field(default_factory=list)

    @property
    def held(self) -> list[uuid.UUID]:
        """The jobs it holds as UUIDs, parsed once per list when first asked for."""
        if self._held is None:
            self._held = [parse_job_id(text) for text in self.held_ids]
        return self._held

    @held.setter
    def held(self, ids: list[uuid.UUID]) -> None:
        self._held = list(ids)
        self.held_ids = [str(i) for i in ids]

    def hold(self, ids: list[str]) -> None:
        """What the child holds now: ``ids`` in canonical text (8-4-4-4-12 lowercase hex
        digits, checked by the caller). Those that left the list are noted while Renewal
        watches."""
        if self.watching_drops and self.held_ids:
            now = set(ids)
            self.dropped.update(parse_job_id(t) for t in self.held_ids if t not in now)
        self.held_ids = ids
        self._held = None

    @property
    def job(self) -> Running | None:
        """The job it runs, for a sync child; an async child's first."""
        return self.jobs[0] if self.jobs else None

    @property
    def full(self) -> bool:
        """No free slot: a wake-up would find it with nothing to claim into."""
        return len(self.jobs) >= self.board.capacity

    def end(self, code: int, stopping: bool, now: float) -> ChildEnd:
        """What settle() looks at once it is reaped (``code``: its exit status, or minus
        the signal), read off its board before the board is closed."""
        culprit = self.board.culprit()
        return ChildEnd(
            code=code,
            kill_reason=self.kill_reason,
            retiring=self.retiring,
            ready=self.ready,
            jobs=self.jobs,
            stopping=stopping,
            now=now,
            kill_detail=self.kill_detail,
            kill_stack=self.kill_stack,
            kill_job=self.kill_job,
            culprit=culprit[0] if culprit else None,
            kind=self.kind,
            settling=self.board.settling_job(),
        )


def parse_job_id(text: str) -> uuid.UUID:
    """``uuid.UUID(text)`` for the canonical text a child sends (8-4-4-4-12 hex digits),
    in half its time. ValueError for anything else."""
    if len(text) != 36 or text[8] != "-" or text[13] != "-" or text[18] != "-" or text[23] != "-":
        raise ValueError(f"not a job id: {text[:40]!r}")
    digits = text.replace("-", "")
    # int() would take more: "_" between digits, signs, spaces, non-ASCII digits.
    if len(digits) != 32 or not (digits.isascii() and digits.isalnum()):
        raise ValueError(f"not a job id: {text[:40]!r}")
    return uuid_from_int(int(digits, 16))


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
    """What the child's faulthandler wrote, after the await chain of the job when an
    async child wrote one (brooq.worker.link)."""
    parts = []
    for name in (path + ".await", path):
        try:
            text = Path(name).read_text(errors="replace").strip()
        except OSError:
            continue
        if text:
            text = current_thread_first(text)
            parts.append(text if len(text) <= limit else text[:limit] + "\n...")
    return "\n".join(parts)


def current_thread_first(dump: str) -> str:
    """A faulthandler dump of every thread with the thread that took the signal first:
    the main thread, which runs the handler (or an async child's loop). The dump lists it
    last, so a busy control or DB thread could push it past the limit read."""
    sections: list[list[str]] = []
    for line in dump.splitlines():
        if line.startswith(("Thread 0x", "Current thread 0x")) or not sections:
            sections.append([])
        sections[-1].append(line)
    current = [s for s in sections if s[0].startswith("Current thread 0x")]
    others = [s for s in sections if not s[0].startswith("Current thread 0x")]
    return "\n".join("\n".join(s).rstrip() + "\n" for s in current + others).strip()


def empty_stack(path: str) -> None:
    """Before asking for a stack: forget an earlier one (the child appends)."""
    for name in (path, path + ".await"):
        with contextlib.suppress(OSError):
            os.truncate(name, 0)
