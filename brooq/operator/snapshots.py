"""What holds back the cleanup of the job table's dead rows: the snapshot holders of its
database, as the master's watch and the status page read them.

A PostgreSQL queue leaves dead rows behind every claim and outcome, and VACUUM removes a
dead row only once no snapshot may still see it: one long transaction anywhere in the
database (a forgotten REPEATABLE READ session, an analytics query, a standby's query
through hot_standby_feedback, a slot whose standby is gone, a prepared transaction
nobody finished) keeps every dead row of the table alive, and the claims slow down as
they walk them. The snapshot_holders statement lists the holders, oldest first; a
Holder says who one is, in words an operator can act on.

Owns: the Holder as read (its kinds, its identity, its words) and the read itself
(``holders``, on a connection it is given).
Must never: write, read or keep query text (it may hold data), or import
brooq.supervisor (the page process reads it too).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
from psycopg.rows import dict_row

from brooq.sql import Q, Queries

SESSION = "session"
STANDBY = "standby"
SLOT = "slot"
PREPARED = "prepared"
# The most holders one read returns, oldest first: a thousand idle transactions are
# named by their oldest few.
MAX_HOLDERS = 20


@dataclass(frozen=True)
class Holder:
    """One row of snapshot_holders. ``name``: a session's or standby's application name,
    a slot's name, a prepared transaction's gid. ``seconds``: its age by PostgreSQL's own
    clock (``since``), None when PostgreSQL keeps none (a standby, a slot) or hides it
    (another role's session, read without pg_read_all_stats). ``xmin``: the transaction
    ID it holds the horizon at, as text."""

    kind: str
    pid: int | None
    name: str | None
    user: str | None
    client: str | None
    state: str | None
    backend_start: datetime | None
    xact_start: datetime | None
    query_start: datetime | None
    since: datetime | None
    seconds: float | None
    xid_age: int
    xmin: str

    @classmethod
    def of(cls, row: dict[str, Any]) -> Holder:
        return cls(
            kind=row["kind"],
            pid=row["pid"],
            name=row["name"],
            user=row["usename"],
            client=row["client"],
            state=row["state"],
            backend_start=row["backend_start"],
            xact_start=row["xact_start"],
            query_start=row["query_start"],
            since=row["since"],
            seconds=None if row["seconds"] is None else max(float(row["seconds"]), 0.0),
            xid_age=int(row["xid_age"] or 0),
            xmin=row["xmin"],
        )

    @property
    def key(self) -> tuple[str, ...]:
        """One holding, the same from one read to the next while it lasts: a session's
        transaction (its pid and start, or the xmin it holds when the start is hidden:
        a new transaction of the same backend is a new holding), a standby's or a slot's
        xmin (when it moves on, the old holding is over), a prepared transaction."""
        if self.kind == SESSION and self.xact_start is not None:
            return (SESSION, str(self.pid), self.xact_start.isoformat())
        if self.kind == PREPARED:
            return (PREPARED, self.name or "", self.xmin)
        ident = self.name if self.kind == SLOT else str(self.pid)
        return (self.kind, ident or "", self.xmin)

    def fields(self) -> list[tuple[str, object]]:
        """Who it is, as (key, value) pairs for a log line, the unknown ones left out:
        free text (names, states) as str, to be quoted by the caller."""
        pairs: list[tuple[str, object]] = [("kind", self.kind)]
        if self.kind == SLOT:
            pairs.append(("slot", self.name))
        elif self.kind == PREPARED:
            pairs.append(("gid", self.name))
        if self.pid is not None:
            pairs.append(("backend", self.pid))
        if self.kind in (SESSION, STANDBY) and self.name is not None:
            pairs.append(("application", self.name))
        pairs += [("user", self.user), ("client", self.client), ("state", self.state)]
        return [(k, v) for k, v in pairs if v is not None and v != ""]

    def who(self) -> str:
        """The holder in a few words, for a page: ``session 4242 (reporting, alice,
        10.0.0.5, idle in transaction)``."""
        head = {
            SESSION: f"session {self.pid}",
            STANDBY: f"standby feedback through walsender {self.pid}",
            SLOT: f"replication slot {self.name}",
            PREPARED: f"prepared transaction {self.name}",
        }.get(self.kind, self.kind)
        details = [self.name if self.kind in (SESSION, STANDBY) else None]
        details += [self.user, self.client, self.state]
        shown = [d for d in details if d]
        return f"{head} ({', '.join(shown)})" if shown else head


def holders(
    conn: psycopg.Connection[Any], q: Queries = Q, limit: int = MAX_HOLDERS
) -> list[Holder]:
    """The snapshot holders of the connection's database (and the standbys and slots,
    which hold every database), oldest first, at most ``limit``; the connection's own
    session left out."""
    cur = conn.cursor(row_factory=dict_row)
    return [Holder.of(r) for r in cur.execute(q.snapshot_holders, {"limit": limit}).fetchall()]
