"""Ordered keys' upkeep, as a duty: every KEYS_PERIOD seconds.

A key's next job is made pending by the database as its job ends (migration 0026's
triggers). Two hand-overs are left to this duty: a dead job of a topic whose handler says
``ordering_skip_dead=True`` (the database does not know the handlers: this master does),
and a hand-over the end could not make (a producer's transaction held the key's lock as
the job ended, a job deleted outside a transition, a dead job's partition dropped, a
producer in REPEATABLE READ). Each pass hands on the skipping topics' dead keys, then
walks the next KEYS_BATCH keys with jobs waiting their turn from a cursor that wraps
around, so that every such key is looked at within a few passes however many there are.

Owns: the cursor over the waiting keys and the skipping topics' blocks.
Must never: wait for a key's lock (a producer holds it until its commit: that key is
looked at again next pass) or start a key's job while another of the key is unfinished
(brooq_order_next decides, under the lock).
"""

from __future__ import annotations

import logging
from typing import Any

import psycopg

from brooq.declare.handlers import Handler
from brooq.supervisor.connections import Connections
from brooq.supervisor.duties.scheduler import Counts

log = logging.getLogger("brooq.master")

KEYS = "keys"
KEYS_PERIOD = 1.0  # seconds between two passes
KEYS_BATCH = 500  # keys looked at per pass


class KeyUpkeep:
    """Hand on the keys the database could not, and the skipping topics' dead ones."""

    name = KEYS
    period = KEYS_PERIOD
    first_after = KEYS_PERIOD

    def __init__(self, conns: Connections, handlers: dict[str, Handler]) -> None:
        self.conns = conns
        self.skipping = sorted(t for t, h in handlers.items() if h.ordering_skip_dead)
        self.after = ("", "")  # the last (topic, key) the sweep looked at

    def run_once(self, now: float) -> Counts:
        started = self.conns.with_db(KEYS, self._pass)
        return {} if not started else {"keys_started": started}

    def _pass(self, conn: psycopg.Connection[Any]) -> int:
        q = self.conns.q
        started = 0
        if self.skipping:
            gone = conn.execute(q.key_skip_dead, {"topics": self.skipping}).fetchall()
            if gone:
                keys = sorted(set(gone))
                rows = conn.execute(
                    q.key_next,
                    {"topics": [t for t, _ in keys], "keys": [k for _, k in keys], "wait": False},
                ).fetchall()
                for topic, key, job_id in rows:
                    log.info(
                        "event=key_skipped_dead topic=%s key=%r next=%s: ordering_skip_dead",
                        topic,
                        key,
                        job_id,
                    )
                started += sum(1 for *_, job_id in rows if job_id is not None)
        params = {"after_topic": self.after[0], "after_key": self.after[1], "batch": KEYS_BATCH}
        rows = conn.execute(q.key_sweep, params).fetchall()
        self.after = (rows[-1][0], rows[-1][1]) if len(rows) == KEYS_BATCH else ("", "")
        handed = [(topic, key, job_id) for topic, key, job_id in rows if job_id is not None]
        for topic, key, job_id in handed:
            log.info("event=key_handed_on topic=%s key=%r job=%s", topic, key, job_id)
        return started + len(handed)
