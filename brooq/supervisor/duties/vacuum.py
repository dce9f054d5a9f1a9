"""The master's own VACUUM of the job table, started when its dead tuples pile up and
waited for in the loop's select, never in a blocking call.

Why: a queue drains from the front of its ready index, and every
claimed job leaves its entry there until a VACUUM removes it; a claim walks those pages
before it finds a live row. Autovacuum looks at a database once per
``autovacuum_naptime`` (a minute by default), and a server may run without it (this
project's CI service does): with no vacuum, each claim of a long drain walks ever more
dead index entries, and both the drain and an idle pickup slow down (docs/benchmarks.md).
So every QUEUE_VACUUM_PERIOD the master reads the table's dead
tuples (a catalog read), and past QUEUE_VACUUM_DEAD_TUPLES it sends
``VACUUM (SKIP_LOCKED, INDEX_CLEANUP ON)`` on a connection of its own and goes on: the
answer is read when its socket is readable (brooq.supervisor.offloop). SKIP_LOCKED:
when autovacuum or another master is already at it, the statement returns at once.
INDEX_CLEANUP ON: the default (AUTO) skips the indexes when few heap pages hold dead
tuples, and the ready index is what needs the cleaning.

A VACUUM cannot remove what a session's snapshot may still see: while one is held (an
idle transaction, a long report), the dead tuples stay over the threshold after each
VACUUM, and a VACUUM every period would read the whole table for nothing
(docs/explanation/held-snapshots.md). So the threshold counts from what the last VACUUM
left (read at the first look after it, lowered whenever a look finds fewer, as after
autovacuum's run once the snapshot is gone): the next VACUUM waits for THRESHOLD new
dead tuples.

Owns: the decision, and the VACUUM's OffLoop. Must never wait on the server, hold a
lock, or touch a child.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection

from brooq.sql import Queries
from brooq.supervisor.connections import Connections
from brooq.supervisor.offloop import OffLoop
from brooq.supervisor.source import Source

log = logging.getLogger("brooq.master")

VACUUM = "vacuum"
# A VACUUM with no answer after this long is given up (its connection closed, so a lost
# server or a cut network cannot stop every later vacuum); a real one on a big table
# takes minutes, not hours.
GIVE_UP_AFTER = 3600.0


class Vacuum(Source):
    """A duty (brooq.supervisor.duties.scheduler) and a source of the master's select."""

    name = VACUUM
    first_after = 1.0

    def __init__(
        self,
        conns: Connections,
        dsn: str,
        threshold: int,
        period: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.conns = conns
        self.threshold = threshold
        self.period = period
        self.clock = clock
        # A VACUUM may take minutes on a big table: no statement timeout, and SKIP_LOCKED
        # instead of a lock wait.
        self.line = OffLoop(dsn, VACUUM, {"statement_timeout": "0"}, clock)
        self.dead_at_start = 0.0
        self.runs = 0  # VACUUMs finished (their answer read), for tests and logs
        self.left = 0.0  # dead tuples the last VACUUM could not remove (as last seen)
        self._look_after = False  # the next look reads what the last VACUUM left

    @property
    def q(self) -> Queries:
        return self.conns.q

    # -- the duty: decide and send ---------------------------------------------------------

    def run_once(self, now: float) -> dict[str, int]:
        if self.line.overdue(GIVE_UP_AFTER):
            log.warning("event=vacuum_failed error='no answer after %.0f s'", GIVE_UP_AFTER)
            self.line.drop()
        if self.threshold <= 0 or self.line.busy:  # 0: autovacuum's; one at a time
            return {}
        row = self.conns.with_db(
            "vacuum_check", lambda c: c.execute(self.q.job_table_health).fetchone()
        )
        if row is None:
            return {}
        dead = float(row[0])
        if self._look_after:
            self.left, self._look_after = dead, False
        self.left = min(self.left, dead)
        if dead - self.left < self.threshold:
            return {}
        if not self.line.send(self.q.job_vacuum):
            return {}
        self.dead_at_start = dead
        log.info("event=vacuum_started dead_tuples=%d", dead)
        return {"started": 1}

    # -- the loop: read what arrived -------------------------------------------------------

    def read_fds(self) -> list[int]:
        return self.line.read_fds()

    def fds(self) -> list[int]:
        """Every descriptor of ours (a forked child closes them)."""
        return self.line.fds()

    def service(self, readable: Collection[int], writable: Collection[int] = ()) -> None:
        answer = self.line.service(readable)
        if answer is None:
            return
        self.runs += 1
        self._look_after = not answer.error
        if answer.error:
            log.warning("event=vacuum_failed seconds=%.2f error=%r", answer.seconds, answer.error)
        else:
            log.info(
                "event=vacuum_done seconds=%.2f dead_tuples_before=%d",
                answer.seconds,
                self.dead_at_start,
            )

    def close(self) -> None:
        """At the master's end: a VACUUM in flight is canceled, not left running."""
        self.line.close()
