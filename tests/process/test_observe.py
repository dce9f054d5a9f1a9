"""What a running job says about itself, through a real brooq-master: its progress
(claim.progress, carried by the master's lease renewal) and its kept logs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psycopg
import pytest

import brooq
from tests.harness import StartMaster, wait_for

APP = "brooq_observeapp:queue"


@pytest.mark.parametrize("topic", ["o.progress", "o.progress_async"])
def test_progress_reaches_the_row_at_the_next_renewal(
    start_master: StartMaster,
    queue: brooq.Queue,
    db: psycopg.Connection[Any],
    tmp_path: Path,
    topic: str,
) -> None:
    release = tmp_path / "release"
    job_id, _ = queue.enqueue(brooq.Job(topic, {"release": str(release)}))
    start_master(workers=1, app=APP)
    expected = (0.4, "resizing 3 of 8") if topic == "o.progress" else (0.75, "uploading")

    def reported() -> bool:
        record = queue.get(job_id)
        assert record is not None
        return (record.progress, record.progress_message) == expected

    # QUEUE_LEASE is 2s in the harness: a renewal every ~0.7 s carries the report.
    wait_for(reported, what="the progress in queue.get")
    record = queue.get(job_id)
    assert record is not None and record.state == "processing"
    (flying,) = queue.in_flight()
    assert (flying.id, flying.progress, flying.progress_message) == (job_id, *expected)
    assert flying.to_dict()["progress"] == expected[0]
    release.touch()
    wait_for(lambda: (r := queue.get(job_id)) is not None and r.state == "done", what="done")
