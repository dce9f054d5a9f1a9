"""The topics a child claims apart, one per round trip in turn: those under a
``global_limit`` alone (brooq_claim_limited, a job a claim), and those under a
``rate_limit``, a ``group_limit``, a ``group_rate_limit`` or with ``fair_groups``
(brooq_claim_batch, migration 0027, a batch a claim: the groups in turn).

Owns: each such topic's turn (its parameters of the claim statement), which turn a
round takes (one whose window has room again first, else the next in order), what a
held-back answer says (when the topic's window has room: the child sleeps no longer than
that), each rate-limited claim's start deadline: a handler may start at most its rate's
allowance after the claim was sent (brooq.declare.rates); a claim that could not start by
then is given back unstarted, so that the handlers' own start times keep the rate
(docs/explanation/rate-limits.md); and the size of a rated topic's batch, which follows
what the handlers start in time: from one job, doubled when a whole batch started within
its allowance, halved once for a batch with a late start, then grown by an eighth past
that half (as TCP's congestion window: fast to its size, slow near the size that was
late).
Must never: touch the database or a pipe, or run a handler; the round trips
(brooq.worker.roundtrip) and the loops ask it.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol, TypeVar

from brooq.declare.handlers import Handler

__all__ = ["BATCH_MAX", "Pacing", "Turn", "turns"]

# The most jobs a claim of a topic taken apart may ask for (the round trip's limit is
# lower in every child: its batch size).
BATCH_MAX = 1_000
# A rated topic's round trip that took more than this share of its allowance halves its
# next batch before any start is late.
SLOW_TRIP = 0.5


class Answer(Protocol):
    """What ``sift`` reads of a claim statement's row (brooq.worker.roundtrip.ClaimRow)."""

    @property
    def claimed(self) -> bool: ...
    @property
    def id(self) -> uuid.UUID: ...
    @property
    def topic(self) -> str: ...
    @property
    def locked_until(self) -> datetime: ...
    @property
    def available_at(self) -> datetime: ...


R = TypeVar("R", bound=Answer)


@dataclass(frozen=True)
class Turn:
    """One topic claimed apart: the claim statement's shape and its parameters."""

    topic: str
    shape: str  # "limited" (global_limit alone) or "coordinated" (a batch a claim)
    params: dict[str, Any] = field(hash=False)
    # Seconds a handler of it may start after its claim was sent; None: no rate, no
    # deadline.
    allowance: float | None = None


def turns(handlers: Mapping[str, Handler]) -> list[Turn]:
    """The turns of ``handlers``' topics claimed apart, by topic; none for the others."""
    found: list[Turn] = []
    for topic in sorted(handlers):
        h = handlers[topic]
        if h.coordinated:
            rate, group_rate = h.rate_limit, h.group_rate_limit
            allowance = min(
                (r.allowance for r in (rate, group_rate) if r is not None), default=None
            )
            params = {
                "limited": topic,
                "cap": h.global_limit,
                "rate": None if rate is None else rate.limit,
                "window": None if rate is None else rate.window,
                "group_cap": h.group_limit,
                "group_rate": None if group_rate is None else group_rate.limit,
                "group_window": None if group_rate is None else group_rate.window,
                "in_turn": h.fair_groups,
                "allowance": allowance,
            }
            found.append(Turn(topic, "coordinated", params, allowance))
        elif h.global_limit is not None:
            found.append(Turn(topic, "limited", {"limited": topic, "cap": h.global_limit}))
    return found


class Pacing:
    """The turns of one child, when their windows have room, and the deadlines of the
    claims it holds under a rate."""

    def __init__(self, turns: Sequence[Turn], clock: Callable[[], float] = time.monotonic) -> None:
        self.turns = list(turns)
        self.clock = clock
        self._next = 0
        # topic -> when (this child's clock) its window has room again, as last told.
        self.due: dict[str, float] = {}
        # claim id -> by when (this child's clock) its handler must start.
        self.start_by: dict[uuid.UUID, float] = {}
        # claim id -> its topic, for the claims with a deadline; topic -> the size of its
        # next batch, and how many of the current size started in time in a row.
        self._topic_of: dict[uuid.UUID, str] = {}
        self._batch: dict[str, int] = {}
        self._in_time: dict[str, int] = {}
        self._halved: dict[str, float] = {}  # topic -> the deadline of its last halving
        self._doubling_up_to: dict[str, int] = {}  # topic -> half the size last late
        # Round trips in a row that claimed nothing: until every turn has had one, an
        # idle child does not sleep (another topic's jobs may be waiting).
        self.dry = 0

    def next_turn(self) -> Turn:
        """This round's turn: a topic whose window had room again by now, the earliest
        first; else the next in order."""
        if self.due:
            now = self.clock()
            topic, at = min(self.due.items(), key=lambda item: item[1])
            if at <= now and (due := self.turn(topic)) is not None:
                return due
        turn = self.turns[self._next % len(self.turns)]
        self._next += 1
        return turn

    def turn(self, topic: str) -> Turn | None:
        """``topic``'s turn, if it is claimed apart."""
        for turn in self.turns:
            if turn.topic == topic:
                return turn
        return None

    def sift(self, rows: list[R], turn: Turn, sent_at: float) -> list[R]:
        """The rows without the held-back answer (a claimed row without an id: its
        available_at is when the window has room, its locked_until the server's clock
        then); that answer noted, and a start deadline for the claim of a rated turn."""
        kept: list[R] = []
        self.due.pop(turn.topic, None)
        for row in rows:
            if row.claimed and row.id is None:
                wait = (row.available_at - row.locked_until).total_seconds()
                self.due[turn.topic] = self.clock() + max(wait, 0.0)
                continue
            if row.claimed and turn.allowance is not None and row.topic == turn.topic:
                self.start_by[row.id] = sent_at + turn.allowance
                self._topic_of[row.id] = turn.topic
            kept.append(row)
        if turn.allowance is not None and self.clock() - sent_at > turn.allowance * SLOW_TRIP:
            # The round trip itself ate most of the allowance: a batch this size would
            # start late (a large batch's claim costs more), so the next is halved now.
            size = self._batch.get(turn.topic, 1)
            if size > 1:
                self._batch[turn.topic] = size // 2
                self._doubling_up_to[turn.topic] = size // 2
                self._in_time[turn.topic] = 0
        return kept

    def claimed(self, anything: bool, every_turn: bool = False) -> None:
        """What a round trip claimed: something, or nothing (another dry round;
        ``every_turn``: nothing could be claimed at all, as if every turn had come)."""
        if anything:
            self.dry = 0
        else:
            self.dry = len(self.turns) if every_turn else self.dry + 1

    def idle_wait(self, poll_interval: float) -> float:
        """How long an idle child sleeps: nothing until every turn has come round with
        nothing, then poll_interval, or less when a window has room sooner (a
        millisecond at least: never a spin)."""
        if self.dry < len(self.turns):
            return 0.0
        if not self.due:
            return poll_interval
        soonest = min(self.due.values()) - self.clock()
        return min(poll_interval, max(soonest, 0.001))

    def batch(self, turn: Turn) -> int:
        """How many jobs of ``turn``'s topic its next claim may take: under a rate, what its
        handlers have been starting within their allowance (from 1, doubled after a whole
        batch in time, halved at a late start, at most BATCH_MAX); else BATCH_MAX (the
        round trip's own limit decides)."""
        if turn.allowance is None:
            return BATCH_MAX
        return self._batch.get(turn.topic, 1)

    def late(self, job_id: uuid.UUID) -> bool:
        """Whether the claim ``job_id`` is past its start deadline (it is then given back
        unstarted); False for a claim without one. Asked once, right before the start;
        the answer sizes its topic's next batch."""
        deadline = self.start_by.pop(job_id, None)
        topic = self._topic_of.pop(job_id, None)
        late = deadline is not None and self.clock() > deadline
        if topic is not None and deadline is not None:
            self._resize(topic, deadline, late)
        return late

    def overdue(self, ids: Sequence[uuid.UUID]) -> list[uuid.UUID]:
        """Those of ``ids`` past their start deadline now (asked when a claim of their
        batch was found late: they go back with it, in one round trip); the others keep
        theirs."""
        now = self.clock()
        gone = [i for i in ids if (d := self.start_by.get(i)) is not None and now > d]
        for job_id in gone:
            del self.start_by[job_id]
            self._topic_of.pop(job_id, None)
        return gone

    def _resize(self, topic: str, deadline: float, late: bool) -> None:
        """A whole batch started in time grows the next: doubled up to the size that last
        had a late start, then by an eighth (so that it does not swing back into
        lateness); a late start halves it, once per batch (its claims share a
        deadline), and that half becomes the size up to which it doubles again."""
        size = self._batch.get(topic, 1)
        if late:
            if self._halved.get(topic) != deadline:
                self._batch[topic] = max(1, size // 2)
                self._doubling_up_to[topic] = self._batch[topic]
                self._halved[topic] = deadline
            self._in_time[topic] = 0
            return
        self._in_time[topic] = self._in_time.get(topic, 0) + 1
        if self._in_time[topic] >= size:
            if size < self._doubling_up_to.get(topic, BATCH_MAX):
                grown = size * 2
            else:
                grown = size + max(1, size // 8)
            self._batch[topic] = min(grown, BATCH_MAX)
            self._in_time[topic] = 0

    def forget(self, job_id: uuid.UUID) -> None:
        """A claim given back before its start: no deadline, no say in the batch's size."""
        self.start_by.pop(job_id, None)
        self._topic_of.pop(job_id, None)
