"""This master's row in brooq_master, as a duty (every fleet_beat, the first at once, and
soon after its children changed) and a source of the master's select (the beat's
answer, read when it arrives).

Owns: writing the row (host, pid, version, application, the queues it works and its
topics, their limits of the fleet, its children, its beat, when it started) with
master_beat, sent off the loop (brooq.supervisor.offloop) on a connection of its own;
sweeping the rows of vanished masters every SWEEP_EVERY beats (the same statement); the
(queue, topic) pairs the live fleet handles as the last answer said (``live_pairs``, for
the unhandled-topic watch: brooq.supervisor.unhandled); deleting the row when the master
stops (``leave``).
Must never wait on the beat in the loop: a database out of reach skips a beat, one in
flight is never sent twice, and only ``leave``, at the master's end, waits (a bounded
moment) for the answer of a beat in flight, so that it cannot write the row again after
the row was deleted.
"""

from __future__ import annotations

import json
import logging
import os
import select
import socket
import time
import uuid
from collections.abc import Callable, Collection, Mapping
from datetime import datetime, timezone
from typing import Any

from brooq import __version__
from brooq.declare.handlers import Handler
from brooq.operator.masters import MISSED_BEATS, Pair, pairs
from brooq.rules import worked_queues
from brooq.settings import Settings
from brooq.supervisor.connections import MASTER_LOCK_TIMEOUT_MS, Connections
from brooq.supervisor.duties.scheduler import Counts
from brooq.supervisor.fleet import Fleet
from brooq.supervisor.offloop import OffLoop
from brooq.supervisor.source import Source

log = logging.getLogger("brooq.master")

BEAT = "fleet_beat"
# The rows of vanished masters are deleted by every master once per this many beats.
SWEEP_EVERY = 5
# A beat with no answer after this long is given up (its connection closed).
GIVE_UP_AFTER = 30.0
BEAT_STATEMENT_TIMEOUT_MS = 5_000
# A beat asked for (the children changed) while one is in flight: looked at again after
# this long, until it can be sent.
AGAIN_AFTER = 0.05
# At the master's end: how long leave() waits for the answer of a beat in flight.
LEAVE_WAIT = 2.0


def _wall_clock() -> float:
    return time.time()


class Beat(Source):
    """See the module docstring. ``live_pairs()`` is None until the fleet is known: until
    the answer of this master's second beat (a master started at the same moment as this
    one has written its row by then), and again when the last answer is older than
    MISSED_BEATS beats."""

    name = BEAT
    first_after = 0.0
    again_after: float | None = None

    def __init__(
        self,
        conns: Connections,
        fleet: Fleet,
        app_spec: str,
        handlers: Mapping[str, Handler],
        settings: Settings,
        dsn: str | None,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = _wall_clock,
    ) -> None:
        self.conns = conns
        self.fleet = fleet
        self.period = settings.fleet_beat
        self.clock = clock
        self.wall = wall
        self.id = uuid.uuid4()
        queues = [name for name, _ in worked_queues(settings.queues, handlers)]
        topics = sorted(handlers)
        self.own: frozenset[Pair] = frozenset(pairs(queues, topics))
        started = datetime.fromtimestamp(wall(), timezone.utc).isoformat()
        # The parameters of master_beat that never change ($1-$7, $10).
        self._fixed = [
            str(self.id).encode(),
            socket.gethostname().encode(),
            str(os.getpid()).encode(),
            __version__.encode(),
            app_spec.encode(),
            json.dumps(queues).encode(),
            json.dumps(topics).encode(),
        ]
        self._started = started.encode()
        # Each topic's limits (global_limit, the rates, the limits per group), for the
        # readers that show them and what they hold back (brooq.operator.masters).
        limits = {
            topic: {"queue": h.queue, **h.limits()}
            for topic, h in sorted(handlers.items())
            if h.limits()
        }
        self._limits = json.dumps(limits).encode()
        self._born: dict[int, str] = {}  # child pid -> when it started, as written
        self.beats = 0  # beats sent
        self.answers = 0  # beats answered
        self.answered_at: float | None = None
        self.others: frozenset[Pair] = frozenset()  # what the other live masters handle
        self.changed = False  # the children changed since the last beat was sent
        self.line = (
            OffLoop(
                dsn,
                BEAT,
                {
                    "statement_timeout": str(BEAT_STATEMENT_TIMEOUT_MS),
                    "lock_timeout": str(MASTER_LOCK_TIMEOUT_MS),
                },
                clock,
            )
            if dsn is not None
            else None
        )

    def handlers_changed(self, queues: list[str], topics: list[str], limits: object) -> None:
        """After a reload: the queues, topics and limits the next beat writes."""
        self.own = frozenset(pairs(queues, topics))
        self._fixed[5:7] = [json.dumps(queues).encode(), json.dumps(topics).encode()]
        self._limits = json.dumps(limits).encode()
        self.changed = True

    def children_changed(self) -> None:
        """A child was forked or reaped: the next beat says so (the master makes it due)."""
        self.changed = True

    def live_pairs(self) -> frozenset[Pair] | None:
        """The pairs some live master handles, this one's included; None while unknown."""
        if self.answers < 2 or self.answered_at is None:
            return None
        if self.clock() - self.answered_at > MISSED_BEATS * self.period:
            return None
        return self.others | self.own

    # -- the duty: send ------------------------------------------------------------------

    def run_once(self, now: float) -> Counts:
        self.again_after = None
        line = self.line
        if line is None:
            return {}
        if line.overdue(GIVE_UP_AFTER):
            log.warning("event=fleet_beat_failed error='no answer after %.0f s'", GIVE_UP_AFTER)
            line.drop()
        if line.busy:
            if self.changed:
                self.again_after = AGAIN_AFTER
            return {}
        if not self.conns.connected:
            # The database is out of reach (the Reconnect duty is at it): no connect of
            # the beat's own, which would hold the loop for its connect timeout.
            return {}
        sweep = self.beats % SWEEP_EVERY == 0
        params = [
            *self._fixed,
            self._children().encode(),
            repr(float(self.period)).encode(),
            self._started,
            str(MISSED_BEATS).encode(),
            b"true" if sweep else b"false",
            self._limits,
        ]
        if not line.send(self.conns.q.master_beat, params):
            return {}
        self.changed = False
        self.beats += 1
        return {"sent": 1, "sweep": int(sweep)}

    def _children(self) -> str:
        """The children as JSON: pid, kind, generation, when it started (wall clock)."""
        now_mono, now_wall = time.monotonic(), self.wall()
        born: dict[int, str] = {}
        children: list[dict[str, Any]] = []
        for pid, c in sorted(self.fleet.children.items()):
            started = self._born.get(pid)
            if started is None:
                at = now_wall - max(now_mono - c.born, 0.0)
                started = datetime.fromtimestamp(at, timezone.utc).isoformat()
            born[pid] = started
            children.append(
                {"pid": pid, "kind": c.kind, "generation": c.generation, "started_at": started}
            )
        self._born = born  # the reaped ones forgotten
        return json.dumps(children)

    # -- the loop: read what arrived -----------------------------------------------------

    def read_fds(self) -> list[int]:
        return self.line.read_fds() if self.line is not None else []

    def fds(self) -> list[int]:
        return self.line.fds() if self.line is not None else []

    def service(self, readable: Collection[int], writable: Collection[int] = ()) -> None:
        answer = self.line.service(readable) if self.line is not None else None
        if answer is None:
            return
        if answer.error or not answer.results:
            log.warning(
                "event=fleet_beat_failed seconds=%.2f error=%r", answer.seconds, answer.error
            )
            return
        result = answer.results[-1]
        found = set()
        for r in range(result.ntuples):
            queue, topic = result.get_value(r, 0), result.get_value(r, 1)
            if queue is not None and topic is not None:
                found.add((queue.decode(), topic.decode()))
        self.others = frozenset(found)
        self.answers += 1
        self.answered_at = self.clock()

    def leave(self) -> None:
        """At the master's end: wait a moment for a beat in flight, then delete the row."""
        line = self.line
        if line is None:
            return
        deadline = time.monotonic() + LEAVE_WAIT
        while line.busy and (left := deadline - time.monotonic()) > 0:
            fds = line.read_fds()
            if not fds:
                break
            readable, _, _ = select.select(fds, [], [], left)
            self.service(readable)
        line.close()
        # Never written, or the database away (no connect at the end: the row, if any,
        # drops out after its missed beats like a vanished master's).
        if self.beats and self.conns.connected:
            self.conns.with_db(
                "fleet_leave",
                lambda conn: conn.execute(self.conns.q.master_leave, {"id": self.id}),
            )

    def close(self) -> None:
        if self.line is not None:
            self.line.close()
