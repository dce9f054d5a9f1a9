"""Reconnecting the master's database connections, as a duty run every pass while one
is down (each connection keeps its own backoff: brooq.supervisor.connections).

Owns: trying again, then writing what the master owes the table for children that ended
meanwhile (brooq.supervisor.accounting). Must never wait longer than one connect
timeout.
"""

from __future__ import annotations

from brooq.supervisor.accounting import Accounting
from brooq.supervisor.connections import Connections
from brooq.supervisor.duties.scheduler import Counts

RECONNECT = "reconnect"


class Reconnect:
    """While a connection is down: try again (after its backoff), then write what the
    master owes the table for children that ended meanwhile."""

    name = RECONNECT
    period = None
    first_after = 0.0

    def __init__(self, conns: Connections, accounting: Accounting) -> None:
        self.conns = conns
        self.accounting = accounting

    def run_once(self, now: float) -> Counts:
        if self.conns.connected or not self.conns.connect():
            return {}
        self.accounting.flush()
        return {"reconnected": 1}
