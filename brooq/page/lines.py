"""The one-line notes of the pages: where they read (a replica, and how far behind), the
fleet's line, the oldest snapshot's line and the topics' limits of the overview.

Owns: the words and the markup of those lines. Must never read the database (the data
comes in).
"""

from __future__ import annotations

from brooq.operator.masters import MasterRow
from brooq.operator.records import TopicLimits
from brooq.operator.replica import ReplicaLag
from brooq.operator.snapshots import Holder
from brooq.page.render import age, e, link

__all__ = [
    "LIMITS_NOTE",
    "SNAPSHOT_NOTE_AFTER",
    "fleet_line",
    "limits_cell",
    "replica_note",
    "snapshot_line",
]

# The oldest snapshot is shown as a note (not muted) once it is this old: brooq's own
# statements hold one for milliseconds, a job count for seconds.
SNAPSHOT_NOTE_AFTER = 60.0


def replica_note(standing: ReplicaLag) -> str:
    """Where the pages read when a read target is set, on every page: how far behind its
    primary it is, and what that means for the figures and for the actions."""
    if not standing.standby:
        return (
            '<p class="note">These pages read from the read target '
            f"(<code>QUEUE_READ_DATABASE_URL</code>): {e(standing.summary())}.</p>"
        )
    return (
        '<p class="note">These pages read from a replica '
        f"(<code>QUEUE_READ_DATABASE_URL</code>): {e(standing.summary())}. What they show "
        "is the primary's as of that long ago. The actions (cancel, retry, pause, resume) "
        "write to the primary; a page shows what they did once the replica has replayed "
        "it.</p>"
    )


def fleet_line(masters: list[MasterRow]) -> str:
    """The overview's line about the fleet, linking to it."""
    children = sum(len(m.children) for m in masters)
    return (
        f"<p>Masters alive: {len(masters):,}, with {children:,} children: "
        f"{link('/fleet', 'the fleet')}</p>"
    )


def snapshot_line(h: Holder | None, unseen: bool = False) -> str:
    """The overview's line about the oldest snapshot holding back the table's cleanup
    (docs/how-to/big-tables.md): who, and for how long. ``unseen``: the page reads a
    standby, which cannot see the primary's sessions."""
    if unseen:
        return (
            '<p class="muted">This page reads a standby, which cannot see the snapshots '
            "held on the primary: the master's log (event=snapshot_held) and "
            "brooq_oldest_snapshot_age_seconds name them.</p>"
        )
    if h is None:
        return '<p class="muted">No snapshot holds back the job table\'s cleanup.</p>'
    held = f", held for {age(h.seconds)}" if h.seconds is not None else ""
    text = (
        f"Oldest snapshot holding back the job table's cleanup: {h.who()}{held}, "
        f"{h.xid_age:,} transactions old."
    )
    old = h.seconds is not None and h.seconds >= SNAPSHOT_NOTE_AFTER
    return f'<p class="{"note" if old else "muted"}">{e(text)}</p>'


LIMITS_NOTE = (
    '<p class="muted">limits: each topic\'s limits of the fleet, as the live masters publish '
    "them. A topic at its global_limit, or whose rate_limit window is full, holds every "
    'ready job back (its oldest ready job then reads "held back": waiting its turn, not '
    "stuck); a group at its group_limit, or whose group_rate_limit window is full, holds "
    "back that group's. <code>brooq stats</code> counts the jobs held back.</p>"
)


def limits_cell(limits: TopicLimits | None) -> str:
    """A topic's limits and what they hold back now, for the overview's row."""
    if limits is None:
        return ""
    holding = limits.holding()
    held = f"; <strong>holding back {e(holding)}</strong>" if holding else ""
    return e(limits.summary()) + held
