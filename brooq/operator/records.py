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

from brooq.declare.rates import Rate
from brooq.job import DEFAULT_QUEUE

# The counts every surface shows, in their order (docs/explanation/guarantees.md, "Counts"):
# the CLI's columns (upper-cased), the JSON keys, the demo's words. ``held`` is part of
# ``ready``; the others split the unfinished jobs (and the dead) so that each is in exactly
# one: SPLIT, the values of the brooq_jobs gauge's ``state`` label.
COUNTS = (
    "waiting",
    "scheduled",
    "ready",
    "held",
    "retrying",
    "parked",
    "on_hold",
    "processing",
    "dead",
)
SPLIT = tuple(name for name in COUNTS if name != "held")


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
    """One topic's jobs in one queue, counted as every surface counts them
    (docs/explanation/guarantees.md, "Counts"): each unfinished job is in exactly one of
    ``waiting`` (for the jobs named in its after), ``scheduled`` (pending, due later),
    ``ready`` (pending or failed, due now), ``retrying`` (failed, due later: its backoff),
    ``parked`` (a durable handler's job sleeping or waiting for an event or its child
    jobs), ``on_hold`` (held by an operator until released: queue.hold) and
    ``processing``; ``dead`` counts the dead. ``held``, part of ``ready``: ready
    jobs a limit of the topic holds back now (its global_limit or rate_limit, their
    group's group_limit or group_rate_limit: docs/how-to/rate-limits.md);
    ``oldest_ready_age`` is then the age of the oldest ready job not held back, so a topic
    that waits its turn does not look stuck.

    Kept for the callers that read them, not counts of the vocabulary: ``pending`` and
    ``failed`` (the jobs in those states, wherever they are counted above) and ``busy``
    (processing under an unexpired lease: a child working on it; ``processing - busy``
    are expired leases the reaper gives back). A topic whose jobs sit in two queues has a
    row in each."""

    topic: str
    pending: int = 0
    processing: int = 0
    failed: int = 0
    dead: int = 0
    oldest_ready_age: float = 0.0
    ready: int = 0
    busy: int = 0
    queue: str = DEFAULT_QUEUE  # after the others: positional construction keeps working
    held: int = 0
    waiting: int = 0
    parked: int = 0
    scheduled: int = 0
    retrying: int = 0
    on_hold: int = 0

    def to_dict(self) -> dict[str, Any]:
        """The counts in the vocabulary's order, then the state counts kept."""
        return {
            "queue": self.queue,
            "topic": self.topic,
            "waiting": self.waiting,
            "scheduled": self.scheduled,
            "ready": self.ready,
            "held": self.held,
            "retrying": self.retrying,
            "parked": self.parked,
            "on_hold": self.on_hold,
            "processing": self.processing,
            "dead": self.dead,
            "oldest_ready_age_seconds": round(self.oldest_ready_age, 3),
            "pending": self.pending,
            "failed": self.failed,
            "busy": self.busy,
        }


@dataclass(frozen=True)
class GroupLimit:
    """A group's own limits, set at runtime (``brooq limits set``, Queue.set_group_limit
    and Queue.set_group_rate): ``limit`` replaces the topic's group_limit for that group
    (0: its jobs wait) in the claims of a topic claimed apart (a rate, a group limit, or
    fair_groups); ``rate`` and ``period`` (at most ``rate`` starts in any ``period``
    seconds) replace its group_rate_limit on a topic under a rate. None: the topic's."""

    topic: str
    group: str
    limit: int | None
    updated_at: datetime
    rate: int | None = None
    period: float | None = None

    @property
    def rate_text(self) -> str | None:
        """The own rate in the options' words ("50/s"), or None."""
        if self.rate is None or self.period is None:
            return None
        return str(Rate(self.rate, per=self.period))

    def to_dict(self) -> dict[str, Any]:
        return {
            "topic": self.topic,
            "group": self.group,
            "limit": self.limit,
            "rate": self.rate_text,
            "updated_at": self.updated_at.isoformat(),
        }


# A topic's limits as a master publishes them (brooq.declare.handlers.Handler.limits), and their
# names in the order shown.
LIMIT_NAMES = ("global_limit", "rate_limit", "group_limit", "group_rate_limit")


@dataclass(frozen=True)
class TopicLimits:
    """A topic's limits of the fleet, as the live masters publish them, and what they
    hold back now: ``held_by`` names the limit holding every ready job of the topic back
    (global_limit or rate_limit; None: none does), ``groups_held`` counts the groups at
    their group_limit or with a full group_rate_limit window. ``queue``: the queue its
    handler declares."""

    topic: str
    queue: str = DEFAULT_QUEUE
    global_limit: int | None = None
    rate_limit: str | None = None  # "50/s", as brooq.Rate writes it
    group_limit: int | None = None
    group_rate_limit: str | None = None
    held_by: str | None = None
    groups_held: int = 0
    fair_groups: bool = False  # its claims take the groups in turn

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> TopicLimits:
        """A row of topic_limits_held: topic, limits (JSON), held_by, groups_held."""
        given = row.get("limits") or {}

        def rate(name: str) -> str | None:
            value = given.get(name)
            return str(value.get("text")) if isinstance(value, dict) else None

        def cap(name: str) -> int | None:
            value = given.get(name)
            return value if isinstance(value, int) and not isinstance(value, bool) else None

        return cls(
            topic=row["topic"],
            queue=str(given.get("queue") or DEFAULT_QUEUE),
            global_limit=cap("global_limit"),
            rate_limit=rate("rate_limit"),
            group_limit=cap("group_limit"),
            group_rate_limit=rate("group_rate_limit"),
            held_by=row.get("held_by"),
            groups_held=int(row.get("groups_held") or 0),
            fair_groups=given.get("fair_groups") is True,
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "topic": self.topic,
            "queue": self.queue,
            "global_limit": self.global_limit,
            "rate_limit": self.rate_limit,
            "group_limit": self.group_limit,
            "group_rate_limit": self.group_rate_limit,
            "held_by": self.held_by,
            "groups_held": self.groups_held,
            "fair_groups": self.fair_groups,
        }

    def summary(self) -> str:
        """The limits in a few words: "rate_limit 50/s, group_limit 1" (and "fair_groups"
        when the groups are taken in turn)."""
        words = [
            f"{name} {value}" for name in LIMIT_NAMES if (value := getattr(self, name)) is not None
        ]
        return ", ".join([*words, "fair_groups"] if self.fair_groups else words)

    def holding(self) -> str:
        """What it holds back now, in a few words ("" when nothing)."""
        if self.held_by:
            return f"all ready jobs ({self.held_by})"
        if self.groups_held:
            return f"{self.groups_held} group{'s' if self.groups_held != 1 else ''}"
        return ""


@dataclass(frozen=True)
class QueueStats:
    """One queue: paused or not, and its jobs, counted as TopicStats counts them (its
    topics' counts summed): ``waiting``, ``scheduled``, ``ready`` (``held``: part of it),
    ``retrying``, ``parked``, ``on_hold``, ``processing``, ``dead``, and the age of the
    oldest ready job not held back. ``failed``, kept for the callers that read it, is the
    state's count (its jobs are ready or retrying). A queue paused before any job came
    shows with zeros."""

    name: str
    paused: bool = False
    ready: int = 0
    scheduled: int = 0
    processing: int = 0
    failed: int = 0
    dead: int = 0
    oldest_ready_seconds: float = 0.0
    waiting: int = 0
    held: int = 0
    retrying: int = 0
    parked: int = 0
    on_hold: int = 0

    def to_dict(self) -> dict[str, Any]:
        """The counts in the vocabulary's order, then the state count kept."""
        return {
            "name": self.name,
            "paused": self.paused,
            "waiting": self.waiting,
            "scheduled": self.scheduled,
            "ready": self.ready,
            "held": self.held,
            "retrying": self.retrying,
            "parked": self.parked,
            "on_hold": self.on_hold,
            "processing": self.processing,
            "dead": self.dead,
            "oldest_ready_seconds": round(self.oldest_ready_seconds, 3),
            "failed": self.failed,
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
    progress: float | None = None  # the handler's last claim.progress(), 0 to 1
    progress_message: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": str(self.id),
            "topic": self.topic,
            "attempts": self.attempts,
            "locked_by": self.locked_by,
            "locked_until": self.locked_until.isoformat(),
            "running_for_seconds": round(self.running_for, 3),
            "lease_left_seconds": round(self.lease_left, 3),
            "progress": self.progress,
            "progress_message": self.progress_message,
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


@dataclass(frozen=True)
class AttemptLog:
    """The log records a ``keep_logs`` handler emitted during one attempt (``queue.logs``):
    key=value lines with their time, oldest first, headed by a line saying how many were
    dropped when the attempt logged more than its bound."""

    attempt: int
    at: datetime  # when the attempt's outcome was written
    text: str

    def to_dict(self) -> dict[str, Any]:
        return {"attempt": self.attempt, "at": self.at.isoformat(), "text": self.text}
