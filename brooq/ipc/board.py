"""The notice board: what one child is running right now, in memory shared with the master.

The master's watchdog needs, for every child, the jobs it runs and since when. Telling it
over the pipe cost a message per job (a write, a wake-up of the master, a JSON decode):
more than a no-op job itself. Instead the master maps a small shared area per child
before the fork; the child writes its current jobs there (no system call) and the master
reads it when it needs to (each watchdog tick, at renewal, when the child dies). The
board cannot be silenced by the child hanging: its last write stays readable.

A board has ``capacity`` slots: one for a sync child (one job at a time), ``concurrency``
for an async child (docs/async.md). Each slot has one writer (the thread running jobs)
and one reader (the master), and a sequence counter of its own that makes reads
consistent: the writer makes it odd before a change and even after; a reader that sees
it odd or changed reads again (a seqlock). Slots are independent, so a reader never
retries because a neighbour changed. A child killed in the middle of a write leaves it
odd: the reader then takes what is there, which names either the old job or the new one,
both of which the master's guarded statements handle.

The header holds what is not a job: the async loop's heartbeat (written by the loop every
LOOP_BEAT seconds; a loop that stops writing is blocked), the job the child's control
thread found blocking the loop (the culprit, under a seqlock of its own), and the flag of
the application's on_success hooks, the job whose outcome the child is writing (so
that a child dying in that write charges that job, not the jobs beside it), and the count
of progress reports (the master's progress tick reads the slots' reports only when it
moved).
"""

from __future__ import annotations

import mmap
import struct
import uuid
from dataclasses import dataclass

_SEQ = struct.Struct("<Q")
# job id (16 bytes, zero when idle), started (time.monotonic(), one clock for every
# process of the host), max_execution_timeout, attempt_timeout, attempt, topic length,
# topic (<= 128).
_BODY = struct.Struct("<16sdddIH128s")
_SLOT = 1024  # bytes per slot: its seq, the body, then the job's progress
# A running handler's progress (Claim.progress), under a seqlock of its own at PROGRESS_AT
# in its slot: the job it belongs to and the slot's sequence when its job was posted (the
# low 32 bits: a progress left by an earlier job in the slot, or by an earlier claim of
# the same job, names another post), the fraction, the message's length and its UTF-8
# bytes. Written only when a handler reports progress, read only when the header's count
# of reports moved: the per-job post and the watchdog's reads never touch it.
_PROGRESS = struct.Struct("<16sIdH800s")
_PROGRESS_AT = 184
MESSAGE_MAX_BYTES = 800
_SLOTS_AT = 128
# Header: the loop's beat (a double, one aligned store), the culprit (seq, id, since).
_BEAT_AT = 0
_CULPRIT_SEQ_AT = 8
_CULPRIT = struct.Struct("<16sd")
_CULPRIT_AT = 16
# A flag of its own (one aligned byte, written in one store): the child runs the
# application's on_success hooks, application code outside the handler that the stall
# rule of brooq.watchdog must leave alone.
_HOOKS_AT = 64
# The job whose outcome is being written (brooq.worker.outcome), zero when none: read by
# the master only after the child died, so no seqlock (a torn id names no job).
_SETTLING_AT = 80
# How many progress reports the child has written (one aligned 8-byte store each): the
# master's progress tick reads the slots' reports only when it moved since its last write.
_PROGRESS_COUNT_AT = 104
_DOUBLE = struct.Struct("<d")
_NO_JOB = bytes(16)
# An empty slot's body, packed once: a clear copies it.
_EMPTY_BODY = _BODY.pack(_NO_JOB, 0.0, 0.0, 0.0, 0, 0, b"")
_READ_TRIES = 1000
LOOP_BEAT = 0.1  # how often an async child's loop writes its beat


@dataclass(frozen=True)
class Running:
    """A job a child has on its board."""

    id: uuid.UUID
    topic: str
    attempt: int
    started: float  # time.monotonic() of the child when the handler was called
    max_execution_timeout: float
    attempt_timeout: float = 0.0


def size_for(capacity: int) -> int:
    """The board's bytes for ``capacity`` slots, whole pages."""
    wanted = _SLOTS_AT + capacity * _SLOT
    return -(-wanted // mmap.PAGESIZE) * mmap.PAGESIZE


class Board:
    """Create in the master before the fork; the child writes, the master reads."""

    def __init__(self, capacity: int = 1) -> None:
        self.capacity = max(1, capacity)
        self._mem = mmap.mmap(-1, size_for(self.capacity), flags=mmap.MAP_SHARED)
        self._seqs = [0] * self.capacity
        self._culprit_seq = 0
        self._reports = 0  # the child's count of progress reports (_PROGRESS_COUNT_AT)
        self._found: dict[bytes, int] = {}  # job id -> the slot its last report found
        self._topics: dict[str, bytes] = {}  # topic -> its bytes on the board
        self._at = [_SLOTS_AT + slot * _SLOT for slot in range(self.capacity)]

    # -- the child ---------------------------------------------------------------------------

    def post(
        self,
        job_id: uuid.UUID,
        topic: str,
        attempt: int,
        started: float,
        max_execution_timeout: float,
        attempt_timeout: float,
        slot: int = 0,
    ) -> None:
        """A job starts in ``slot``. Fields, not a Running: building a frozen dataclass
        per job cost more than the write itself."""
        raw = self._topics.get(topic)
        if raw is None:
            raw = self._topics[topic] = topic.encode()[:128]
        # _write's, inline: a post per job.
        mem, at = self._mem, self._at[slot]
        seq = self._seqs[slot] + 1
        _SEQ.pack_into(mem, at, seq)  # odd: being written
        _BODY.pack_into(
            mem,
            at + _SEQ.size,
            job_id.int.to_bytes(16, "big"),  # job_id.bytes, without its property
            started,
            max_execution_timeout,
            attempt_timeout,
            attempt,
            len(raw),
            raw,
        )
        self._seqs[slot] = seq = seq + 1
        _SEQ.pack_into(mem, at, seq)  # even: consistent

    def post_running(self, job: Running, slot: int = 0) -> None:
        self.post(
            job.id,
            job.topic,
            job.attempt,
            job.started,
            job.max_execution_timeout,
            job.attempt_timeout,
            slot,
        )

    def clear(self, slot: int = 0) -> None:
        mem, at = self._mem, self._at[slot]
        seq = self._seqs[slot] + 1
        _SEQ.pack_into(mem, at, seq)  # odd: being written
        body = at + _SEQ.size
        mem[body : body + _BODY.size] = _EMPTY_BODY
        self._seqs[slot] = seq = seq + 1
        _SEQ.pack_into(mem, at, seq)  # even: consistent

    def progress(self, job_id: uuid.UUID, fraction: float, message: bytes) -> bool:
        """A running job's progress, in the slot that runs it, and one more report in
        the header's count; False when no slot runs it (nothing written)."""
        raw_id = job_id.bytes
        # The slot this job was found in last time, looked at first: an async child's
        # board has a slot per job in flight, and a handler reports many times.
        slot = self._found.get(raw_id, 0)
        if self._slot_id(slot) != raw_id:
            for slot in range(self.capacity):
                if self._slot_id(slot) == raw_id:
                    break
            else:
                return False
            if len(self._found) >= 2 * self.capacity:
                self._found.clear()  # jobs long gone
            self._found[raw_id] = slot
        posted = self._seqs[slot] & 0xFFFFFFFF  # this claim's post, not an earlier one's
        at = _SLOTS_AT + slot * _SLOT + _PROGRESS_AT
        (seq,) = _SEQ.unpack_from(self._mem, at)
        _SEQ.pack_into(self._mem, at, seq + 1 | 1)  # odd: being written
        _PROGRESS.pack_into(
            self._mem, at + _SEQ.size, raw_id, posted, fraction, len(message), message
        )
        _SEQ.pack_into(self._mem, at, (seq | 1) + 1)  # even: consistent
        self._reports += 1
        _SEQ.pack_into(self._mem, _PROGRESS_COUNT_AT, self._reports)
        return True

    def _slot_id(self, slot: int) -> bytes:
        at = _SLOTS_AT + slot * _SLOT + _SEQ.size
        return self._mem[at : at + 16]

    def hooks_running(self, running: bool) -> None:
        self._mem[_HOOKS_AT] = 1 if running else 0

    def settling(self, job_id: uuid.UUID | None) -> None:
        """The child writes this job's outcome now (None: it is written)."""
        self._mem[_SETTLING_AT : _SETTLING_AT + 16] = job_id.bytes if job_id else _NO_JOB

    def beat(self, now: float) -> None:
        """The async loop is alive (the loop's own callback, every LOOP_BEAT)."""
        _DOUBLE.pack_into(self._mem, _BEAT_AT, now)

    def set_culprit(self, job_id: uuid.UUID | None, since: float) -> None:
        """The job blocking the loop, as the control thread saw it (None: none)."""
        self._culprit_seq += 1
        _SEQ.pack_into(self._mem, _CULPRIT_SEQ_AT, self._culprit_seq)
        _CULPRIT.pack_into(self._mem, _CULPRIT_AT, job_id.bytes if job_id else _NO_JOB, since)
        self._culprit_seq += 1
        _SEQ.pack_into(self._mem, _CULPRIT_SEQ_AT, self._culprit_seq)

    # -- the master --------------------------------------------------------------------------

    def read(self) -> Running | None:
        """The job in the first slot: a sync child's job."""
        return self._read_slot(0)

    def read_all(self) -> tuple[Running, ...]:
        """Every job on the board, by slot."""
        if self.capacity == 1:
            job = self._read_slot(0)
            return () if job is None else (job,)
        jobs = []
        for slot in range(self.capacity):
            job = self._read_slot(slot)
            if job is not None:
                jobs.append(job)
        return tuple(jobs)

    def _read_slot(self, slot: int) -> Running | None:
        return self._read_slot_seq(slot)[0]

    def _read_slot_seq(self, slot: int) -> tuple[Running | None, int]:
        """The job in ``slot`` and the slot's sequence it was read at."""
        at = _SLOTS_AT + slot * _SLOT
        mem = self._mem
        body: tuple[object, ...] = ()
        before = 0
        for _ in range(_READ_TRIES):
            (before,) = _SEQ.unpack_from(mem, at)
            if not before:
                return None, 0  # never written
            body = _BODY.unpack_from(mem, at + _SEQ.size)
            (after,) = _SEQ.unpack_from(mem, at)
            if before == after and not before & 1:
                break
        raw_id, started, max_exec, soft, attempt, topic_len, topic = body
        assert isinstance(raw_id, bytes) and isinstance(topic, bytes)
        assert isinstance(topic_len, int) and isinstance(attempt, int)
        if raw_id == _NO_JOB:
            return None, before
        running = Running(
            id=uuid.UUID(bytes=raw_id),
            topic=topic[:topic_len].decode(errors="replace"),
            attempt=attempt,
            started=float(started),  # type: ignore[arg-type]
            max_execution_timeout=float(max_exec),  # type: ignore[arg-type]
            attempt_timeout=float(soft),  # type: ignore[arg-type]
        )
        return running, before

    def reports(self) -> int:
        """How many progress reports the child has written so far (0: none)."""
        (count,) = _SEQ.unpack_from(self._mem, _PROGRESS_COUNT_AT)
        return int(count)

    def progresses(self) -> dict[uuid.UUID, tuple[int, float, str]]:
        """The progress of every job on the board that reported one since it was posted
        (this claim of it): (attempt, fraction, message) by job id."""
        found: dict[uuid.UUID, tuple[int, float, str]] = {}
        for slot in range(self.capacity):
            job, posted = self._read_slot_seq(slot)
            if job is None:
                continue
            at = _SLOTS_AT + slot * _SLOT + _PROGRESS_AT
            body: tuple[object, ...] = ()
            for _ in range(_READ_TRIES):
                (before,) = _SEQ.unpack_from(self._mem, at)
                if not before:
                    break  # never written
                body = _PROGRESS.unpack_from(self._mem, at + _SEQ.size)
                (after,) = _SEQ.unpack_from(self._mem, at)
                if before == after and not before & 1:
                    break
            if not body:
                continue
            raw_id, reported_at, fraction, length, message = body
            assert isinstance(raw_id, bytes) and isinstance(message, bytes)
            assert isinstance(length, int)
            if raw_id != job.id.bytes or reported_at != posted & 0xFFFFFFFF:
                continue  # an earlier job's, or an earlier claim's of this one
            text = message[:length].decode(errors="replace")
            found[job.id] = (job.attempt, float(fraction), text)  # type: ignore[arg-type]
        return found

    def loop_beat(self) -> float:
        """The loop's last beat (monotonic); 0.0 when no loop ever ran."""
        (beat,) = _DOUBLE.unpack_from(self._mem, _BEAT_AT)
        return float(beat)

    def culprit(self) -> tuple[uuid.UUID, float] | None:
        """The job the child found blocking its loop, and since when; None: none."""
        body: tuple[object, ...] = (_NO_JOB, 0.0)
        for _ in range(_READ_TRIES):
            (before,) = _SEQ.unpack_from(self._mem, _CULPRIT_SEQ_AT)
            body = _CULPRIT.unpack_from(self._mem, _CULPRIT_AT)
            (after,) = _SEQ.unpack_from(self._mem, _CULPRIT_SEQ_AT)
            if before == after and not before & 1:
                break
        raw_id, since = body
        assert isinstance(raw_id, bytes)
        if raw_id == _NO_JOB:
            return None
        return uuid.UUID(bytes=raw_id), float(since)  # type: ignore[arg-type]

    def settling_job(self) -> uuid.UUID | None:
        """The job whose outcome the child was writing, if it was."""
        raw = bytes(self._mem[_SETTLING_AT : _SETTLING_AT + 16])
        return None if raw == _NO_JOB else uuid.UUID(bytes=raw)

    def in_hooks(self) -> bool:
        return self._mem[_HOOKS_AT] == 1

    def close(self) -> None:
        self._mem.close()
