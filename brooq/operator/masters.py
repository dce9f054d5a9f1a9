"""The masters' table, brooq_master, as its readers see it: which masters are alive, what
they run, and which ready jobs none of them would ever run.

Each brooq-master keeps one row there while it runs (brooq.supervisor.duties.beat writes
it on every beat and deletes it when the master stops). A row not written for
MISSED_BEATS of its own beats is a master that vanished (SIGKILL, a host gone): every
reader ignores it (the statements compare each row's ``seen_at`` with its own
``beat_seconds``), and a master deletes such rows now and then.

A master runs the jobs of every topic it has a handler for that sit in a queue it works
(docs/how-to/queues.md), so the pairs a row handles are its queues times its topics; a
(queue, topic) with ready jobs and no live row handling it is "no handler": a topic
misspelt by a producer, a queue nobody works, the one master of a topic gone.

Owns: MISSED_BEATS, the row as read (MasterRow, Child; defensively and bounded: a bad
entry is left out and noted in ``malformed``), the pairs the live masters handle
(``Handled``, never their cross product) and which ready pairs none does (pure), the
topics' limits the live masters publish (``topic_limits``, pure), and reading the live
rows (``live``, the fleet_live statement on a connection it is given).
Must never: write the table, hold a connection of its own, or import brooq.supervisor
(the status page's process and the command line read it too).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Container, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import psycopg
from psycopg.rows import dict_row

from brooq.sql import Q, Queries

# A row whose master missed this many of its own beats no longer counts.
MISSED_BEATS = 3
# The most rows one read returns (a fleet is dozens of masters, not thousands).
MAX_MASTERS = 1000
# The most queues, topics (and topics' limits) and children read of one row: a row is
# written by whoever may write the table, and one huge or malformed row must not stop
# the readers (the status page, `brooq fleet`, `stats`, `queues`) nor the beats.
MAX_NAMES = 5000
MAX_CHILDREN = 1000

Pair = tuple[str, str]  # (queue, topic)


@dataclass(frozen=True)
class Child:
    """One child of a master, as its master last wrote it."""

    pid: int
    kind: str  # sync or async (docs/async.md)
    generation: int
    started_at: datetime | None

    def to_dict(self) -> dict[str, Any]:
        return {
            "pid": self.pid,
            "kind": self.kind,
            "generation": self.generation,
            "started_at": self.started_at.isoformat() if self.started_at else None,
        }


@dataclass(frozen=True)
class MasterRow:
    """One live master: where it runs, what it runs, and when it last wrote its row."""

    id: uuid.UUID
    host: str
    pid: int
    version: str
    app: str
    queues: tuple[str, ...]
    topics: tuple[str, ...]
    children: tuple[Child, ...]
    beat_seconds: float
    started_at: datetime
    seen_at: datetime
    seen_seconds_ago: float
    # Per topic, the limits of the fleet its handler declares here (global_limit,
    # rate_limit, group_limit, group_rate_limit; the rates as {limit, per_seconds, text}).
    limits: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    # What reading the row left out ("" when nothing): a bad entry, names past the caps.
    malformed: str = ""

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> MasterRow:
        """A row of fleet_live (a dict_row), read defensively: the table is written by
        every master of the fleet, any version, and by anyone with the right to. A
        children entry or a topic's limits that is not what brooq writes is left out, and
        what is read is bounded (MAX_NAMES queues and topics, MAX_CHILDREN children,
        MAX_NAMES topics' limits); ``malformed`` says what was left out."""
        notes: list[str] = []
        children = _json(row.get("children"), list, "children", notes)
        limits = _json(row.get("limits") or {}, dict, "limits", notes)
        kids = [c for c in (_child(raw) for raw in children[:MAX_CHILDREN]) if c is not None]
        if len(kids) < min(len(children), MAX_CHILDREN):
            notes.append(f"{min(len(children), MAX_CHILDREN) - len(kids)} bad children entries")
        given = {str(t): v for t, v in list(limits.items())[:MAX_NAMES] if isinstance(v, dict)}
        if len(given) < min(len(limits), MAX_NAMES):
            notes.append("limits that are not objects")
        return cls(
            id=row["id"],
            host=str(row["host"]),
            pid=int(row["pid"]),
            version=str(row["version"]),
            app=str(row["app"]),
            queues=_names(row.get("queues"), "queues", notes),
            topics=_names(row.get("topics"), "topics", notes),
            children=tuple(kids),
            beat_seconds=float(row["beat_seconds"]),
            started_at=row["started_at"],
            seen_at=row["seen_at"],
            seen_seconds_ago=max(float(row["seen_seconds_ago"]), 0.0),
            limits=given,
            malformed="; ".join(notes),
        )

    def handles(self) -> set[Pair]:
        return pairs(self.queues, self.topics)

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": str(self.id),
            "host": self.host,
            "pid": self.pid,
            "version": self.version,
            "app": self.app,
            "queues": list(self.queues),
            "topics": list(self.topics),
            "children": [c.to_dict() for c in self.children],
            "beat_seconds": self.beat_seconds,
            "started_at": self.started_at.isoformat(),
            "seen_at": self.seen_at.isoformat(),
            "seen_seconds_ago": round(self.seen_seconds_ago, 3),
            "limits": {topic: dict(given) for topic, given in self.limits.items()},
            "malformed": self.malformed or None,
        }


def _json(value: Any, kind: type, name: str, notes: list[str]) -> Any:
    """A jsonb column as ``kind`` (list or dict); an empty one, with a note, when it is
    not."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            value = None
    if isinstance(value, kind):
        return value
    notes.append(f"{name} is not a JSON {'array' if kind is list else 'object'}")
    return kind()


def _names(value: Any, name: str, notes: list[str]) -> tuple[str, ...]:
    """Queue or topic names, the first MAX_NAMES (a note says how many were left out)."""
    names = [str(n) for n in (value or ())[: MAX_NAMES + 1] if n is not None]
    if len(names) > MAX_NAMES:
        notes.append(f"{name} past the first {MAX_NAMES} not read")
        names = names[:MAX_NAMES]
    return tuple(names)


def _child(raw: Any) -> Child | None:
    """One children entry; None when it is not what a master writes."""
    if not isinstance(raw, dict):
        return None
    started = raw.get("started_at")
    try:
        return Child(
            pid=int(raw.get("pid", 0)),
            kind=str(raw.get("kind", "?"))[:20],
            generation=int(raw.get("generation", 0)),
            started_at=datetime.fromisoformat(started) if isinstance(started, str) else None,
        )
    except (TypeError, ValueError, OverflowError):
        return None


class Handled:
    """The (queue, topic) pairs some live master handles, without listing them: a master
    handles every pair of its queues times its topics, and a row of thousands of each is
    millions of pairs. ``pair in handled`` is what the readers ask."""

    def __init__(self, groups: Iterable[tuple[Iterable[str], Iterable[str]]] = ()) -> None:
        self.groups = tuple((frozenset(q), frozenset(t)) for q, t in groups)

    def __contains__(self, pair: object) -> bool:
        if not isinstance(pair, tuple) or len(pair) != 2:
            return False
        queue, topic = pair
        return any(queue in qs and topic in ts for qs, ts in self.groups)

    def __or__(self, other: Handled) -> Handled:
        joined = Handled()
        joined.groups = self.groups + other.groups
        return joined


def pairs(queues: Iterable[str], topics: Iterable[str]) -> set[Pair]:
    """The (queue, topic) pairs a master working ``queues`` with handlers for ``topics``
    runs."""
    names = list(topics)
    return {(queue, topic) for queue in queues for topic in names}


def handled(masters: Iterable[MasterRow]) -> Handled:
    """Every pair some live master handles."""
    return Handled((m.queues, m.topics) for m in masters)


def no_handler(queue: str, topic: str, ready: int, live: Container[Pair]) -> bool:
    """Ready jobs of (queue, topic) that no live master handles: they wait for ever."""
    return ready > 0 and (queue, topic) not in live


def unhandled(rows: Iterable[Mapping[str, Any]], live: Container[Pair]) -> dict[Pair, int]:
    """{(queue, topic): ready jobs} of the rows (each with queue, topic, ready) that no
    live master handles."""
    found: dict[Pair, int] = {}
    for row in rows:
        ready = int(row.get("ready") or 0)
        if no_handler(row["queue"], row["topic"], ready, live):
            key = (row["queue"], row["topic"])
            found[key] = found.get(key, 0) + ready
    return found


def topic_limits(masters: Iterable[MasterRow]) -> dict[str, Mapping[str, Any]]:
    """Per topic, its limits as the most recently seen live master that declares any
    gives them (masters of one fleet should agree: docs/how-to/rate-limits.md)."""
    found: dict[str, Mapping[str, Any]] = {}
    for m in sorted(masters, key=lambda m: m.seen_at):
        found.update(m.limits)
    return dict(sorted(found.items()))


def live(
    conn: psycopg.Connection[Any], q: Queries = Q, limit: int = MAX_MASTERS
) -> list[MasterRow]:
    """The live masters, by host and pid (at most ``limit``)."""
    cur = conn.cursor(row_factory=dict_row)
    rows = cur.execute(q.fleet_live, {"missed": MISSED_BEATS, "limit": limit}).fetchall()
    return [MasterRow.from_row(r) for r in rows]
