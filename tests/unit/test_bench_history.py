"""The history benchmarks' own logic: the pgbench ceiling moves a finished row with the
claim statement's column list, migration_locks' claim of the release before 0020 is
today's with the done in place, and the retention run's pickups per window."""

from __future__ import annotations

import re
import sys
from pathlib import Path

from brooq.sql import Q

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCH))

import ceiling  # noqa: E402
import history_retention  # noqa: E402


def _moved_columns(text: str) -> list[str]:
    """The select list of the INSERT INTO job_history ... FROM finished, one per item."""
    found = re.search(r"INSERT INTO job_history\s+SELECT (.*?)\s+FROM finished AS f", text, re.S)
    assert found, text
    body = re.sub(r"--[^\n]*", "", found.group(1))
    return [" ".join(item.split()) for item in body.replace("\\\n", " ").split(",")]


def test_the_ceilings_done_moves_the_columns_the_claim_statement_moves() -> None:
    # The claim statement without results: the ceiling's jobs return nothing.
    assert _moved_columns(ceiling.DONE.format(match="= :jid")) == _moved_columns(
        Q.job_finish_and_claim
    )
    for script in (ceiling.CLAIM, ceiling.CLAIM_BATCH):
        assert "DELETE FROM job WHERE id" in script and "INSERT INTO job_history" in script
        # The claim writes what job_finish_and_claim's `claimed` writes.
        assert "started_at = now()" in script and "progress = NULL" in script


def test_the_claim_before_0020_writes_its_done_in_place() -> None:
    import migration_locks

    before = migration_locks.CLAIM_BEFORE[20]
    assert "job_history" not in before and "DELETE" not in before
    assert "UPDATE job SET state = 'done', updated_at = now()" in before
    # Everything after the done is today's.
    tail = Q.job_finish_and_claim[Q.job_finish_and_claim.index("next AS MATERIALIZED") :]
    assert before.endswith(tail)


def test_pickups_are_summed_per_window_and_a_job_never_started_is_missed() -> None:
    enqueued = {f"b{i}": (100.0 + i, "before") for i in range(100)}
    enqueued.update({"d1": (300.0, "during"), "d2": (301.0, "during")})
    started = {f"b{i}": 100.0 + i + 0.001 * (i + 1) for i in range(100)}  # 1 .. 100 ms
    started["d1"] = 300.050
    out = history_retention.window_pickups(enqueued, started)
    assert out["before"]["jobs"] == 100 and out["before"]["missed"] == 0
    assert 50.0 <= out["before"]["p50_ms"] <= 51.0
    assert 99.0 <= out["before"]["p99_ms"] <= 100.0
    assert out["during"] == {
        "jobs": 1,
        "missed": 1,
        "p50_ms": 50.0,
        "p99_ms": 50.0,
        "max_ms": 50.0,
    }
