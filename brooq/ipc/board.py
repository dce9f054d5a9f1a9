"""The notice board: what one child is running right now, in memory shared with the master.

The master's watchdog needs, for every child, the job it runs and since when. Telling it
over the pipe cost a message per job (a write, a wake-up of the master, a JSON decode):
more than a no-op job itself. Instead the master maps a small shared page per child
before the fork; the child writes its current job there (no system call) and the master
reads it when it needs to (each watchdog tick, at renewal, when the child dies). The
board cannot be silenced by the child hanging: its last write stays readable.

One writer (the child's main thread), one reader (the master). A sequence counter makes
reads consistent: the writer makes it odd before a change and even after; a reader that
sees it odd or changed reads again (a seqlock). A child killed in the middle of a write
leaves it odd: the reader then takes what is there, which names either the old job or the
new one, both of which the master's guarded statements handle.
"""

from __future__ import annotations

import mmap
import struct
import uuid
from dataclasses import dataclass

_SEQ = struct.Struct("<Q")
# job id (16 bytes, zero when idle), started (time.monotonic(), one clock for every
# process of the host), max_execution_timeout, attempt, topic length, topic (<= 128).
_BODY = struct.Struct("<16sddIH128s")
SIZE = mmap.PAGESIZE
_NO_JOB = bytes(16)
_READ_TRIES = 1000
# A flag of its own (one aligned byte, written in one store): the child runs the
# application's on_success hooks, application code outside the handler that the stall
# rule of brooq.watchdog must leave alone.
_HOOKS_AT = 512


@dataclass(frozen=True)
class Running:
    """The job a child has on its board."""

    id: uuid.UUID
    topic: str
    attempt: int
    started: float  # time.monotonic() of the child when the handler was called
    max_execution_timeout: float


class Board:
    """Create in the master before the fork; the child writes, the master reads."""

    def __init__(self) -> None:
        self._mem = mmap.mmap(-1, SIZE, flags=mmap.MAP_SHARED)
        self._seq = 0

    # -- the child ---------------------------------------------------------------------------

    def post(self, job: Running) -> None:
        topic = job.topic.encode()[:128]
        self._write(
            job.id.bytes,
            job.started,
            job.max_execution_timeout,
            job.attempt,
            len(topic),
            topic,
        )

    def clear(self) -> None:
        self._write(_NO_JOB, 0.0, 0.0, 0, 0, b"")

    def hooks_running(self, running: bool) -> None:
        self._mem[_HOOKS_AT] = 1 if running else 0

    def _write(self, *body: object) -> None:
        self._seq += 1
        _SEQ.pack_into(self._mem, 0, self._seq)  # odd: being written
        _BODY.pack_into(self._mem, _SEQ.size, *body)
        self._seq += 1
        _SEQ.pack_into(self._mem, 0, self._seq)  # even: consistent

    # -- the master --------------------------------------------------------------------------

    def read(self) -> Running | None:
        body: tuple[object, ...] = ()
        for _ in range(_READ_TRIES):
            (before,) = _SEQ.unpack_from(self._mem, 0)
            body = _BODY.unpack_from(self._mem, _SEQ.size)
            (after,) = _SEQ.unpack_from(self._mem, 0)
            if before == after and not before & 1:
                break
        raw_id, started, max_exec, attempt, topic_len, topic = body
        assert isinstance(raw_id, bytes) and isinstance(topic, bytes)
        assert isinstance(topic_len, int) and isinstance(attempt, int)
        if raw_id == _NO_JOB:
            return None
        return Running(
            id=uuid.UUID(bytes=raw_id),
            topic=topic[:topic_len].decode(errors="replace"),
            attempt=attempt,
            started=float(started),  # type: ignore[arg-type]
            max_execution_timeout=float(max_exec),  # type: ignore[arg-type]
        )

    def in_hooks(self) -> bool:
        return self._mem[_HOOKS_AT] == 1

    def close(self) -> None:
        self._mem.close()
