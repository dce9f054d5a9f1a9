"""The records an operator reads: per-topic and per-queue counts, jobs in flight, their
holders, and what a bulk change came to. Each has ``to_dict`` for JSON (the CLI's
``--json``, the status page).

Owns: these dataclasses and their JSON form (field names are the statements' columns:
brooq.operator.reads builds them with class_row).
Must never: do I/O, or read a row by position.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from brooq.job import DEFAULT_QUEUE


@dataclass(frozen=True)
class BulkResult:
    """What a bulk cancel or retry came to. ``matched``: the jobs in the given topic,
    state (and queue, and tag) when it started; ``changed``: those it moved. Fewer changed
    than matched: the others changed state meanwhile (claimed, finished, canceled by
    someone else) and were left alone, or (a retry) their unique_key is held by another
    active job: ``key_taken`` counts those, ``taken`` names the first 20 as (job, the
    job holding its key). With ``dry_run=True``, ``changed`` is 0."""

    matched: int
    changed: int
    key_taken: int = 0
    taken: tuple[tuple[uuid.UUID, uuid.UUID], ...] = ()

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"matched": self.matched, "changed": self.changed}
        if self.key_taken:
            out["key_taken"] = self.key_taken
            out["taken"] = [{"job": str(j), "held_by": str(h)} for j, h in self.taken]
        return out


@dataclass(frozen=True)
class TopicStats:
    """One topic's jobs in one queue, by state. ``ready``: pending or failed and due now.
    ``busy``: processing under an unexpired lease, i.e. the children working on this
    topic. A topic whose jobs sit in two queues has a row in each."""

    topic: str
    pending: int = 0
    processing: int = 0
    failed: int = 0
    dead: int = 0
    oldest_ready_age: float = 0.0
    ready: int = 0
    busy: int = 0
    queue: str = DEFAULT_QUEUE  # last: positional and keyword construction keep working

    def to_dict(self) -> dict[str, Any]:
        return {
            "queue": self.queue,
            "topic": self.topic,
            "pending": self.pending,
            "ready": self.ready,
            "processing": self.processing,
            "busy": self.busy,
            "failed": self.failed,
            "dead": self.dead,
            "oldest_ready_age_seconds": round(self.oldest_ready_age, 3),
        }


@dataclass(frozen=True)
class QueueStats:
    """One queue: paused or not, and its jobs. ``ready``: pending or failed and due now;
    ``scheduled``: pending or failed and due later; ``failed`` (waiting for a retry) is
    counted in one of those too. A queue paused before any job came shows with zeros."""

    name: str
    paused: bool = False
    ready: int = 0
    scheduled: int = 0
    processing: int = 0
    failed: int = 0
    dead: int = 0
    oldest_ready_seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "paused": self.paused,
            "ready": self.ready,
            "scheduled": self.scheduled,
            "processing": self.processing,
            "failed": self.failed,
            "dead": self.dead,
            "oldest_ready_seconds": round(self.oldest_ready_seconds, 3),
        }


@dataclass(frozen=True)
class InFlight:
    """A job in state processing: who holds it, since when, and how long its lease lasts.
    ``lease_left`` is negative once the lease has expired (the reaper will return it)."""

    id: uuid.UUID
    topic: str
    attempts: int
    locked_by: str
    locked_until: datetime
    running_for: float
    lease_left: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": str(self.id),
            "topic": self.topic,
            "attempts": self.attempts,
            "locked_by": self.locked_by,
            "locked_until": self.locked_until.isoformat(),
            "running_for_seconds": round(self.running_for, 3),
            "lease_left_seconds": round(self.lease_left, 3),
        }


@dataclass(frozen=True)
class HolderStats:
    """One holder of jobs in state processing (its ``locked_by``: a child, one job at a
    time if sync, many if async): how many it holds, and how long the oldest of them has
    run. Expired leases count until the reaper gives them back."""

    locked_by: str
    processing: int
    oldest_running: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "locked_by": self.locked_by,
            "processing": self.processing,
            "oldest_running_seconds": round(self.oldest_running, 3),
        }
