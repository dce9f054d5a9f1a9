"""The read target's standing: whether the database the operator's reads go to
(QUEUE_READ_DATABASE_URL, docs/how-to/read-replica.md) is a standby, and how far behind
its primary it is, as that database itself knows it.

A standby shows what its primary had that long ago: the status page and the commands
print this beside the figures they read there.

Owns: ``ReplicaLag``, reading it (``lag``) and its words (``ReplicaLag.summary``).
Must never: write, or name the database (the caller does, without its password).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
from psycopg.rows import dict_row

from brooq.durations import format_age
from brooq.sql import Q, Queries


@dataclass(frozen=True)
class ReplicaLag:
    """``standby``: the database is in recovery (a standby; False: it takes writes).
    ``streaming``: a WAL receiver runs (it is connected to its primary). ``seconds``: how
    far behind the primary it is: 0 while it streams and has replayed all it received,
    else the age of the last transaction it replayed; None on a primary, or when it has
    replayed none yet. ``replayed_at``: when that transaction committed on the primary."""

    standby: bool
    streaming: bool
    seconds: float | None
    replayed_at: datetime | None

    def summary(self) -> str:
        """One clause for people: "a standby, 0.3s behind its primary"."""
        if not self.standby:
            return "not a standby (it takes writes): nothing to lag behind"
        if self.seconds is None:
            return "a standby that has replayed no transaction yet: how far behind is unknown"
        behind = format_age(self.seconds)
        if not self.streaming:
            return (
                "a standby not streaming from its primary: the last transaction it replayed "
                f"committed {behind} ago"
            )
        return f"a standby, {behind} behind its primary"

    def to_dict(self) -> dict[str, Any]:
        return {
            "standby": self.standby,
            "streaming": self.streaming,
            "lag_seconds": self.seconds,
            "replayed_at": None if self.replayed_at is None else self.replayed_at.isoformat(),
        }


def lag(conn: psycopg.Connection[Any], q: Queries = Q) -> ReplicaLag:
    """The standing of the database ``conn`` is connected to (one statement)."""
    with conn.cursor(row_factory=dict_row) as cur:
        row = cur.execute(q.replica_lag).fetchone()
    assert row is not None
    standby = bool(row["standby"])
    streaming = bool(row["streaming"])
    seconds: float | None = None
    if standby:
        if streaming and row["caught_up"]:
            seconds = 0.0
        elif row["since_replay"] is not None:
            seconds = max(float(row["since_replay"]), 0.0)
    return ReplicaLag(standby, streaming, seconds, row["replayed_at"] if standby else None)
