"""The running handlers' progress to their rows, as a duty: every PROGRESS_TICK seconds.

Owns carrying `claim.progress()` from the children's boards to the job table: each tick
reads every child's count of progress reports (one 8-byte read of its board); only a
child whose count moved since the last write has its slots' reports read, and only when
some did is one statement sent (brooq.supervisor.maintenance.write_progress, guarded by
the job's state, holder and attempt). A master whose handlers report no progress sends
nothing and reads one integer per child per tick.

A report reaches the row within about one tick of `claim.progress()`. A row locked at
the time (the child's own outcome transaction, most often) is tried again on the next
tick; the outcome itself carries the attempt's last report (brooq.worker.outcome), so
what a handler reported last before returning is in the row however the two meet.
Must never wait on a row lock, a child or the database beyond the one statement.
"""

from __future__ import annotations

from brooq.supervisor import maintenance
from brooq.supervisor.connections import Connections
from brooq.supervisor.duties.scheduler import Counts
from brooq.supervisor.fleet import Fleet

PROGRESS = "progress"
PROGRESS_TICK = 0.25  # seconds between two looks at the children's report counts


class ProgressWrites:
    """Write the running handlers' last progress reports, when some child reported."""

    name = PROGRESS
    period = PROGRESS_TICK
    first_after = PROGRESS_TICK

    def __init__(self, fleet: Fleet, conns: Connections) -> None:
        self.fleet = fleet
        self.conns = conns
        self.seen: dict[int, int] = {}  # pid -> the report count its last write covered

    def run_once(self, now: float) -> Counts:
        children = self.fleet.children
        moved: list[tuple[int, int]] = []
        for pid, c in children.items():
            count = c.board.reports()
            if count != self.seen.get(pid, 0) and c.kill_reason is None:
                moved.append((pid, count))
        if len(self.seen) > len(children):  # forget the children gone
            self.seen = {pid: n for pid, n in self.seen.items() if pid in children}
        if not moved:
            return {}
        reports: list[maintenance.Report] = []
        for pid, _ in moved:
            c = children[pid]
            for job_id, (attempt, fraction, text) in c.board.progresses().items():
                reports.append((job_id, c.identity, attempt, fraction, text))
        if not reports:  # the jobs that reported have ended since: nothing to write
            self.seen.update(moved)
            return {}
        busy = self.conns.with_db(
            "progress", lambda conn: maintenance.write_progress(conn, reports, self.conns.q)
        )
        if busy is None:
            return {}  # the database is away: the counts stay unseen, written next tick
        owners = {job_id: identity for job_id, identity, *_ in reports}
        late = {owners[job_id] for job_id in busy}
        for pid, count in moved:
            if children[pid].identity not in late:  # a locked row: this child again
                self.seen[pid] = count
        return {"progress_written": len(reports) - len(busy)}
