"""A total-queue audit in the spirit of Jepsen's checker: after a run, every job is classed.

- ok: enqueued, ended in a terminal state, and reached it exactly once;
- lost: enqueued but not terminal at the end, or missing without a recorded terminal
  deletion (an active row deleted counts as lost too);
- duplicated: more than one terminal transition for one id, or a terminal row that
  changed state again;
- unexpected: a row, an outcome or an execution for an id nobody enqueued.

Outcomes are observed by the database itself: `install` creates (for the test only, never
in the migrations) a table `outcome_log` and row triggers on `job` that log every
transition into or out of a terminal state and every deletion. Executions (the rows the
test app's handlers write into `execution`) are counted apart: duplicate executions are
allowed by the at-least-once promise and reported, not failed.
"""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import psycopg

TERMINAL = ("done", "dead", "canceled")

INSTALL = """
CREATE TABLE IF NOT EXISTS outcome_log (
    seq       bigserial PRIMARY KEY,
    job_id    uuid NOT NULL,
    op        text NOT NULL,          -- 'UPDATE' or 'DELETE'
    old_state text NOT NULL,
    new_state text,                   -- NULL for a deletion
    locked_by text,
    txid      bigint NOT NULL DEFAULT txid_current(),
    at        timestamptz NOT NULL DEFAULT clock_timestamp(),
    row_age   interval                -- for a deletion: now() - updated_at of the row
);

CREATE OR REPLACE FUNCTION audit_log_outcome() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        INSERT INTO outcome_log (job_id, op, old_state, new_state, locked_by, row_age)
        VALUES (OLD.id, 'DELETE', OLD.state, NULL, OLD.locked_by, now() - OLD.updated_at);
        RETURN OLD;
    END IF;
    INSERT INTO outcome_log (job_id, op, old_state, new_state, locked_by)
    VALUES (NEW.id, 'UPDATE', OLD.state, NEW.state, NEW.locked_by);
    RETURN NEW;
END;
$$;

DROP TRIGGER IF EXISTS audit_outcome_update ON job;
CREATE TRIGGER audit_outcome_update
    AFTER UPDATE ON job
    FOR EACH ROW
    WHEN (OLD.state <> NEW.state
          AND (NEW.state IN ('done', 'dead', 'canceled')
               OR OLD.state IN ('done', 'dead', 'canceled')))
    EXECUTE FUNCTION audit_log_outcome();

DROP TRIGGER IF EXISTS audit_outcome_delete ON job;
CREATE TRIGGER audit_outcome_delete
    AFTER DELETE ON job
    FOR EACH ROW
    EXECUTE FUNCTION audit_log_outcome();
"""


def install(conn: psycopg.Connection[Any]) -> None:
    """Create outcome_log and the triggers that feed it (test databases only)."""
    conn.execute(INSTALL)


@dataclass
class Report:
    enqueued: int = 0
    ok: int = 0
    lost: int = 0
    duplicated: int = 0
    unexpected: int = 0
    executions: int = 0  # handler runs recorded for enqueued jobs
    executed_jobs: int = 0  # distinct jobs with at least one execution
    duplicate_executions: int = 0  # executions beyond the first, summed over jobs
    done_unexecuted: int = 0  # done although no handler run was recorded
    active_deleted: int = 0  # rows deleted while not terminal (counted as lost too)
    final_states: Counter[str] = field(default_factory=Counter)
    samples: dict[str, list[str]] = field(default_factory=dict)

    def add_sample(self, kind: str, what: str) -> None:
        found = self.samples.setdefault(kind, [])
        if len(found) < 5:
            found.append(what)

    def assert_clean(self, *, require_execution: bool = True) -> None:
        problems = []
        for kind in ("lost", "duplicated", "unexpected"):
            if getattr(self, kind):
                problems.append(f"{getattr(self, kind)} {kind}")
        if require_execution and self.done_unexecuted:
            problems.append(f"{self.done_unexecuted} done without any execution")
        assert not problems, f"audit failed: {', '.join(problems)}\n{self}"

    def __str__(self) -> str:
        lines = [
            f"enqueued={self.enqueued} ok={self.ok} lost={self.lost} "
            f"duplicated={self.duplicated} unexpected={self.unexpected}",
            f"executions={self.executions} executed_jobs={self.executed_jobs} "
            f"duplicate_executions={self.duplicate_executions} "
            f"done_unexecuted={self.done_unexecuted} active_deleted={self.active_deleted}",
            f"final states: {dict(sorted(self.final_states.items()))}",
        ]
        lines += [f"  {kind}: {', '.join(ids)}" for kind, ids in sorted(self.samples.items())]
        return "\n".join(lines)


def check(
    conn: psycopg.Connection[Any],
    enqueued: Iterable[uuid.UUID],
    *,
    extra_ok: Iterable[uuid.UUID] = (),
) -> Report:
    """Audit the run. ``enqueued`` are the ids the test enqueued; ``extra_ok`` are ids the
    test created otherwise (chained jobs, say) that must not count as unexpected."""
    wanted = set(enqueued)
    known = wanted | set(extra_ok)
    report = Report(enqueued=len(wanted))

    table = {
        r[0]: r[1] for r in conn.execute("SELECT id, state FROM job").fetchall()
    }  # id -> state
    log: dict[uuid.UUID, list[tuple[str, str, str | None]]] = {}
    for job_id, op, old, new in conn.execute(
        "SELECT job_id, op, old_state, new_state FROM outcome_log ORDER BY seq"
    ).fetchall():
        log.setdefault(job_id, []).append((op, old, new))
    runs = Counter(
        {
            r[0]: int(r[1])
            for r in conn.execute(
                "SELECT job_id, count(*) FROM execution WHERE note IN ('', 'start') GROUP BY job_id"
            ).fetchall()
        }
    )

    for job_id in sorted(set(table) | set(log) | set(runs), key=str):
        if job_id not in known:
            report.unexpected += 1
            where = [
                name
                for name, found in (("job", table), ("outcome_log", log), ("execution", runs))
                if job_id in found
            ]
            report.add_sample("unexpected", f"{job_id} in {'+'.join(where)}")

    for job_id in sorted(wanted, key=str):
        entries = log.get(job_id, [])
        into_terminal = [e for e in entries if e[0] == "UPDATE" and e[2] in TERMINAL]
        out_of_terminal = [e for e in entries if e[0] == "UPDATE" and e[1] in TERMINAL]
        deletions = [e for e in entries if e[0] == "DELETE"]
        state = table.get(job_id)
        if state is None and deletions:
            state = deletions[-1][1]  # the state the row had when it was deleted
            if state not in TERMINAL:
                report.active_deleted += 1
        report.final_states[state or "missing"] += 1
        n = runs.get(job_id, 0)
        if n:
            report.executed_jobs += 1
            report.executions += n
            report.duplicate_executions += n - 1
        if state == "done" and n == 0:
            report.done_unexecuted += 1
            report.add_sample("done_unexecuted", str(job_id))

        if len(into_terminal) > 1 or out_of_terminal:
            # A second outcome, or a terminal row reopened: whatever the final state.
            report.duplicated += 1
            report.add_sample("duplicated", f"{job_id} {entries}")
        elif state is None or state not in TERMINAL or any(d[1] not in TERMINAL for d in deletions):
            report.lost += 1
            report.add_sample("lost", f"{job_id} ({state or 'missing'})")
        elif not into_terminal:
            # Terminal without a logged transition: the audit was installed too late,
            # or the row was written terminal by someone else. Either way not explained.
            report.unexpected += 1
            report.add_sample("unexpected", f"{job_id} terminal without a logged outcome")
        else:
            report.ok += 1
    return report
