"""make bench's summary table, read from a stored run (benchmarks/results)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCH))

import report  # noqa: E402

TIMES, NONE = "\u00d7", "\u2013"  # how the table writes a ratio and an empty cell


def test_the_glance_table_puts_brooq_beside_the_best_peer_and_the_ceiling() -> None:
    result = json.loads((BENCH / "results" / "2026-12-01.json").read_text())
    rows = {
        line.split(" | ")[0].lstrip("| "): line.strip("| ").split(" | ")
        for line in report.glance(result)
        if line.startswith("| ") and "---" not in line and "workload" not in line
    }
    bulk = rows["bulk enqueue (jobs/s)"]
    assert bulk[1:] == ["44,346", "38,207 (pgqueuer)", NONE, "1.16" + TIMES]
    drain = rows["no-op drain (jobs/s)"]
    assert drain[1] == "18,414 (2 children)" and drain[3] == "38,469 (pgbench, 2 clients)"
    assert drain[4] == "1.40" + TIMES  # 18,414 / 13,158
    # A latency: the best peer's ÷ brooq's, so that above 1 still means brooq ahead.
    pickup = rows["pickup p50 (ms; lower is better)"]
    assert pickup[2] == "1.67 (celery)" and pickup[4] == "1.26" + TIMES
    assert "## At a glance" in report.markdown(result)
