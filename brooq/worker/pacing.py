"""The topics a child claims apart, one per round trip in turn: those under a
``global_limit`` (brooq_claim_limited), those whose groups are taken in turn (a
``group_limit`` or ``fair_groups`` without a rate: brooq_claim_groups, migration 0024, a
batch a claim) and those under a ``rate_limit`` or a ``group_rate_limit``
(brooq_claim_coordinated, migration 0012, a job a claim).

Owns: each such topic's turn (its parameters of the claim statement), which turn a
round takes (one whose window has room again first, else the next in order), what a
held-back answer says (when the topic's window has room: the child sleeps no longer than
that), and each rate-limited claim's start deadline: a handler may start at most its
rate's allowance after the claim was sent (brooq.declare.rates); a claim that could not start by
then is given back unstarted, so that the handlers' own start times keep the rate
(docs/explanation/rate-limits.md).
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

__all__ = ["Pacing", "Turn", "turns"]


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
    shape: str  # "limited" (global_limit alone), "grouped" or "coordinated"
    params: dict[str, Any] = field(hash=False)
    # Seconds a handler of it may start after its claim was sent; None: no rate, no
    # deadline.
    allowance: float | None = None


def turns(handlers: Mapping[str, Handler]) -> list[Turn]:
    """The turns of ``handlers``' topics claimed apart, by topic; none for the others."""
    found: list[Turn] = []
    for topic in sorted(handlers):
        h = handlers[topic]
        if h.grouped:
            grouped: dict[str, Any] = {
                "limited": topic,
                "cap": h.global_limit,
                "group_cap": h.group_limit,
            }
            found.append(Turn(topic, "grouped", grouped))
        elif h.coordinated:
            rate, group_rate = h.rate_limit, h.group_rate_limit
            allowances = [r.allowance for r in (rate, group_rate) if r is not None]
            params = {
                "limited": topic,
                "cap": h.global_limit,
                "rate": None if rate is None else rate.limit,
                "window": None if rate is None else rate.window,
                "group_cap": h.group_limit,
                "group_rate": None if group_rate is None else group_rate.limit,
                "group_window": None if group_rate is None else group_rate.window,
            }
            found.append(Turn(topic, "coordinated", params, min(allowances, default=None)))
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
        # Round trips in a row that claimed nothing: until every turn has had one, an
        # idle child does not sleep (another topic's jobs may be waiting).
        self.dry = 0

    def next_turn(self) -> Turn:
        """This round's turn: a topic whose window had room again by now, the earliest
        first; else the next in order."""
        if self.due:
            now = self.clock()
            topic, at = min(self.due.items(), key=lambda item: item[1])
            if at <= now:
                for turn in self.turns:
                    if turn.topic == topic:
                        return turn
        turn = self.turns[self._next % len(self.turns)]
        self._next += 1
        return turn

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
            kept.append(row)
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

    def late(self, job_id: uuid.UUID) -> bool:
        """Whether the claim ``job_id`` is past its start deadline (it is then given back
        unstarted); False for a claim without one. Asked once, right before the start."""
        deadline = self.start_by.pop(job_id, None)
        return deadline is not None and self.clock() > deadline
