"""Cancel a running job, then retry it at once, as an operator would: the handler is
interrupted, and the job, claimed again (often by the same child), runs and finishes
at once, with no lease expiry in its history and no child killed for it.

The child forgets what the master said about the job's earlier claim, and the master
forgets it too: a `lost` notice or a lease-lost note belongs to one claim, never to the
next one of the same job.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

import brooq
from tests.harness import MasterProcess, executions, wait_for


def _row(db: psycopg.Connection[Any], job_id: Any) -> tuple[str, Any, Any]:
    row = db.execute(
        "SELECT state, errors, lease_expiries FROM job_all WHERE id = %s", (job_id,)
    ).fetchone()
    assert row is not None
    return row[0], row[1], row[2]


@pytest.mark.parametrize("rounds", [3])
def test_cancel_then_retry_a_running_job_runs_it_again_at_once(
    rounds: int,
    start_master: Callable[..., MasterProcess],
    queue: brooq.Queue,
    db: psycopg.Connection[Any],
) -> None:
    m = start_master(workers=1)
    m.wait_ready(1)
    job_id, _ = queue.enqueue(brooq.Job("t.ok", {"sleep": 60}))
    for n in range(1, rounds + 1):
        wait_for(lambda n=n: executions(db, job_id) == n, what=f"run {n} started")
        wait_for(lambda: _row(db, job_id)[0] == "processing", what="processing")
        assert queue.cancel(job_id) and queue.retry(job_id)
    wait_for(lambda: executions(db, job_id) == rounds + 1, what="the last run started")
    state, errors, expiries = _row(db, job_id)
    assert state == "processing"
    # Each run after a retry was started by its own claim, not by the reaper: no lease
    # expired on the way, and the master never took the new claim for the old one.
    assert expiries == 0 and not errors, (errors, expiries)
    log = m.log()
    assert "hung_after_lease_lost" not in log and "event=child_exited" not in log
    # Once for each cancel, in the master and in the child.
    assert len(re.findall(r"logger=brooq.master .*event=lease_lost job=", log)) == rounds
    assert len(re.findall(r"logger=brooq.child .*event=lease_lost job=", log)) == rounds
