"""A total-queue audit in the spirit of Jepsen's checker: after a run, every job is classed.

- ok: enqueued, ended in a terminal state, and reached it exactly once;
- lost: enqueued but not terminal at the end, or missing without a recorded terminal
  deletion (an active row deleted counts as lost too);
- duplicated: more than one terminal transition for one id, a terminal row that
  changed state again (in job_history too), or a finished row back in job;
- unexpected: a row, an outcome or an execution for an id nobody enqueued.

Outcomes are observed by the database itself: `install` creates (for the test only, never
in the migrations) a table `outcome_log` and row triggers that log every transition into
or out of a terminal state on `job`, every deletion from `job`, and every row entering,
changing state in or leaving `job_history` (migration 0020). A finished job leaves job
for job_history in the statement that ends it, so one outcome is logged as one of:
an UPDATE into a terminal state on job, then its move (the row deleted from job and
inserted into job_history, same transaction, same state: no second outcome); or the
claim statement's `done`, which deletes a processing row from job and inserts it into
job_history as done (that pair is the outcome). `check` pairs them back. A partition
dropped whole logs nothing: a test that audits must not let one expire.
Executions (the rows the test app's handlers write into `execution`) are counted apart:
duplicate executions are allowed by the at-least-once promise and reported, not failed.
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
    op        text NOT NULL,          -- on job: 'UPDATE', 'DELETE'; on job_history:
                                      -- 'HISTORY_IN', 'HISTORY_UPDATE', 'HISTORY_OUT'
    old_state text,                   -- NULL for HISTORY_IN
    new_state text,                   -- NULL for a deletion; for HISTORY_OUT, the state
                                      -- of the row back in job (a retry), if any
    locked_by text,
    txid      bigint NOT NULL DEFAULT txid_current(),
    at        timestamptz NOT NULL DEFAULT clock_timestamp(),
    row_age   interval,               -- for a deletion: now() - updated_at of the row
    -- brooq.moving: set while the master's partition upkeep moves a row inside
    -- job_history (and while job_zz_history moves one out of job).
    moving    boolean NOT NULL DEFAULT coalesce(current_setting('brooq.moving', true) = 'on', false)
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

-- An AFTER trigger sees its whole statement done: a row leaving job_history by a retry
-- is already back in job (one statement: DELETE ... RETURNING feeding the INSERT).
CREATE OR REPLACE FUNCTION audit_log_history() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO outcome_log (job_id, op, old_state, new_state, locked_by)
        VALUES (NEW.id, 'HISTORY_IN', NULL, NEW.state, NEW.locked_by);
        RETURN NEW;
    ELSIF TG_OP = 'UPDATE' THEN
        INSERT INTO outcome_log (job_id, op, old_state, new_state, locked_by)
        VALUES (NEW.id, 'HISTORY_UPDATE', OLD.state, NEW.state, NEW.locked_by);
        RETURN NEW;
    END IF;
    INSERT INTO outcome_log (job_id, op, old_state, new_state, locked_by, row_age)
    VALUES (OLD.id, 'HISTORY_OUT', OLD.state,
            (SELECT j.state FROM job j WHERE j.id = OLD.id), OLD.locked_by,
            now() - OLD.updated_at);
    RETURN OLD;
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

DROP TRIGGER IF EXISTS audit_history_insert ON job_history;
CREATE TRIGGER audit_history_insert
    AFTER INSERT ON job_history
    FOR EACH ROW
    EXECUTE FUNCTION audit_log_history();

DROP TRIGGER IF EXISTS audit_history_update ON job_history;
CREATE TRIGGER audit_history_update
    AFTER UPDATE ON job_history
    FOR EACH ROW
    WHEN (OLD.state <> NEW.state)
    EXECUTE FUNCTION audit_log_history();

DROP TRIGGER IF EXISTS audit_history_delete ON job_history;
CREATE TRIGGER audit_history_delete
    AFTER DELETE ON job_history
    FOR EACH ROW
    EXECUTE FUNCTION audit_log_history();
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


# One row of outcome_log: op, old_state, new_state, txid, moving.
Logged = tuple[str, str | None, str | None, int, bool]
# What check classes: op ('UPDATE' or 'DELETE'), the state left, the state reached.
Entry = tuple[str, str | None, str | None]


def as_one_table(rows: list[Logged]) -> list[Entry]:
    """One job's log, in order, as if job and job_history were one table: UPDATEs and
    DELETEs. A row leaving job (or job_history's default partition for another partition)
    and entering job_history in the same transaction is one UPDATE from the state it left
    to the state it arrived with, or nothing when they are equal (the move that follows an
    UPDATE into a terminal state). A row leaving job_history back into job is an UPDATE
    out of its terminal state; a row entering job_history from nowhere, an UPDATE into
    one; a row leaving job_history for nowhere, a deletion. The master's partition upkeep
    (brooq.moving on) moves rows inside job_history through a table not yet attached,
    whose half of the move no trigger sees: its halves alone are nothing."""
    out: list[Entry] = []
    i = 0
    while i < len(rows):
        op, old, new, txid, moving = rows[i]
        if i + 1 < len(rows):
            op2, txid2 = rows[i + 1][0], rows[i + 1][3]
            pair = {op, op2}
            leaving = rows[i] if op2 == "HISTORY_IN" else rows[i + 1]
            arriving = rows[i + 1] if op2 == "HISTORY_IN" else rows[i]
            if (
                txid2 == txid
                and "HISTORY_IN" in pair
                and leaving[0] in ("DELETE", "HISTORY_OUT")
                and (leaving[0] == "DELETE" or leaving[2] is None)  # not back in job
            ):
                if leaving[1] != arriving[2]:
                    out.append(("UPDATE", leaving[1], arriving[2]))
                i += 2
                continue
        if moving and op in ("HISTORY_IN", "HISTORY_OUT") and (op == "HISTORY_IN" or new is None):
            pass
        elif op in ("UPDATE", "HISTORY_UPDATE"):
            out.append(("UPDATE", old, new))
        elif op == "HISTORY_IN":
            out.append(("UPDATE", None, new))
        elif op == "HISTORY_OUT" and new is not None:
            out.append(("UPDATE", old, new))
        else:
            out.append(("DELETE", old, None))
        i += 1
    return out


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

    # A job is in job or in job_history, never both (job_all is both).
    table = {
        r[0]: r[1] for r in conn.execute("SELECT id, state FROM job_all").fetchall()
    }  # id -> state
    raw: dict[uuid.UUID, list[Logged]] = {}
    for job_id, op, old, new, txid, moving in conn.execute(
        "SELECT job_id, op, old_state, new_state, txid, moving FROM outcome_log ORDER BY seq"
    ).fetchall():
        raw.setdefault(job_id, []).append((op, old, new, txid, moving))
    log = {job_id: as_one_table(rows) for job_id, rows in raw.items()}
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

        if len(into_terminal) > 1 or out_of_terminal or (deletions and job_id in table):
            # A second outcome, a terminal row reopened, or a deleted row back: whatever
            # the final state.
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
