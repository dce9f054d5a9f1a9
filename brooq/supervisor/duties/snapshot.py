"""The oldest snapshot holding back the job table's cleanup, named, as a duty.

One long transaction anywhere in the database keeps every dead row of the job table
alive (brooq.operator.snapshots says who can hold one): the claims walk more dead index
entries each time, and nothing in brooq's own figures says why. So every few seconds
the master reads the holders (a read of PostgreSQL's shared memory views, in the loop
like the table's health) and:

- sets brooq_oldest_snapshot_age_seconds to the age of the oldest (0 when none);
- names each holder once, when it has been held QUEUE_SNAPSHOT_WARN
  (``event=snapshot_held``: kind, backend pid, application, user, client, state, age,
  when it began; never the query text, which may hold data), and says when a named one
  ended (``event=snapshot_released``). brooq's own statements hold a snapshot for
  milliseconds, the count of the stats duty for seconds: the threshold (minutes by
  default) leaves them out. 0s turns the lines off; the gauge stays.

A holder's age is PostgreSQL's when it keeps a clock (a transaction's start, a
preparation's time); for a standby's feedback, a slot, or another role's session read
without pg_read_all_stats it is how long this master has seen the same xmin held: a
lower bound, that starts with the master. Every master of a database names a holder
(one line each).

Owns: the period, the pure once-per-holder decision (Watch), the gauge and the lines.
Must never: wait (one short statement on the maintenance connection, under its
statement timeout), or act on a holder: naming it is all; ending it is the operator's.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from brooq.metrics import Metrics
from brooq.operator.snapshots import (
    MAX_HOLDERS,
    PREPARED,
    SESSION,
    SLOT,
    STANDBY,
    Holder,
    holders,
)
from brooq.supervisor.connections import Connections
from brooq.supervisor.duties.scheduler import Counts

log = logging.getLogger("brooq.master")

SNAPSHOT = "snapshot"
# A holder is named within QUEUE_SNAPSHOT_WARN plus one period: a quarter of the
# threshold, between these bounds (15 s with the default 5 minutes).
LOOK_EVERY_MAX = 15.0
LOOK_EVERY_MIN = 1.0

_HINTS = {
    SESSION: "its transaction keeps the job table's dead rows (every table's in this "
    "database) from being vacuumed: end it, or pg_terminate_backend() it",
    STANDBY: "a query on this standby holds every database's cleanup back through "
    "hot_standby_feedback",
    SLOT: "this replication slot holds every database's cleanup back: drop it if its "
    "standby is gone",
    PREPARED: "this prepared transaction holds the cleanup back until COMMIT PREPARED or "
    "ROLLBACK PREPARED",
}
# Free text (chosen by whoever connects) is quoted in a line; these are not.
_PLAIN = frozenset({"kind", "backend", "client"})


def look_period(warn: float) -> float:
    """Seconds between two looks for a threshold of ``warn`` seconds (0: lines off)."""
    if warn <= 0:
        return LOOK_EVERY_MAX
    return min(LOOK_EVERY_MAX, max(LOOK_EVERY_MIN, warn / 4))


@dataclass(frozen=True)
class Held:
    """A holder and its age at one look: PostgreSQL's (``since`` set), else since this
    master first saw it (``first_seen``, a lower bound)."""

    holder: Holder
    seconds: float
    first_seen: bool


@dataclass
class Verdict:
    oldest: Held | None  # the oldest holder now, by age in seconds
    named: list[Held]  # held past the threshold, not named before: say so
    released: list[Held]  # named before and gone now, as last seen


class Watch:
    """The once-per-holder decision (pure: its clock is the ``now`` it is given).
    ``warn``: seconds a holder may hold before it is named; 0 names none."""

    def __init__(self, warn: float) -> None:
        self.warn = warn
        self.first_seen: dict[tuple[str, ...], float] = {}
        self.named: dict[tuple[str, ...], Held] = {}  # named and still seen (last look)

    def judge(self, found: Sequence[Holder], now: float, complete: bool = True) -> Verdict:
        """``complete``: ``found`` is every holder. A read cut at its limit lists the
        oldest only: one named before and missing from it is not said to be released
        (it may be younger than those listed), and is kept as last seen."""
        seen = {h.key: h for h in found}
        first = {k: self.first_seen.get(k, now) for k in seen}
        self.first_seen = first if complete else {**self.first_seen, **first}
        held = [
            Held(h, h.seconds, False)
            if h.seconds is not None
            else Held(h, now - self.first_seen[k], True)
            for k, h in seen.items()
        ]
        new = [
            x
            for x in held
            if self.warn > 0 and x.seconds >= self.warn and x.holder.key not in self.named
        ]
        unseen = {k: x for k, x in self.named.items() if k not in seen}
        released = list(unseen.values()) if complete else []
        keep = set(self.named) | {x.holder.key for x in new}
        self.named = {x.holder.key: x for x in held if x.holder.key in keep}
        if not complete:
            self.named.update(unseen)
        oldest = max(held, key=lambda x: x.seconds, default=None)
        return Verdict(oldest, sorted(new, key=lambda x: -x.seconds), released)


def _pairs(pairs: Sequence[tuple[str, object]]) -> str:
    return " ".join(f"{k}={v}" if k in _PLAIN else f"{k}={str(v)!r}" for k, v in pairs)


def held_line(x: Held) -> str:
    """The event=snapshot_held line of a holder (its text, formatted)."""
    h = x.holder
    when = [("since", h.since), ("query_start", h.query_start)] if h.kind == SESSION else []
    if h.kind == PREPARED:
        when = [("since", h.since)]
    times = " ".join(f"{k}={v.isoformat()}" for k, v in when if v is not None)
    origin = "first_seen" if x.first_seen else ("prepared" if h.kind == PREPARED else "xact_start")
    return (
        f"event=snapshot_held {_pairs(h.fields())} age={x.seconds:.0f}s age_from={origin} "
        f"xid_age={h.xid_age}{' ' + times if times else ''}: {_HINTS.get(h.kind, '')}"
    )


def released_line(x: Held) -> str:
    keep = [(k, v) for k, v in x.holder.fields() if k not in ("state", "client", "user")]
    return f"event=snapshot_released {_pairs(keep)} held={x.seconds:.0f}s"


class SnapshotWatch:
    """The duty (brooq.supervisor.duties.scheduler): a look every look_period(warn)."""

    name = SNAPSHOT
    first_after = LOOK_EVERY_MIN

    def __init__(self, conns: Connections, warn: float, metrics: Metrics | None) -> None:
        self.conns = conns
        self.period = look_period(warn)
        self.metrics = metrics
        self.watch = Watch(warn)

    def run_once(self, now: float) -> Counts:
        found = self.conns.with_db("snapshot_holders", lambda c: holders(c, self.conns.q))
        if found is None:  # out of reach: what was named stays named
            return {}
        verdict = self.watch.judge(found, now, complete=len(found) < MAX_HOLDERS)
        if self.metrics is not None:
            oldest = verdict.oldest.seconds if verdict.oldest is not None else 0.0
            self.metrics.oldest_snapshot.set(oldest)
        for x in verdict.named:
            log.warning("%s", held_line(x))
        for x in verdict.released:
            log.info("%s", released_line(x))
        return {"holders": len(found), "named": len(verdict.named)}
