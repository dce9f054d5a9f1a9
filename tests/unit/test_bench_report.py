"""The benchmark report's tables (benchmarks/report.py), read from stored runs
(benchmarks/results): make bench's summary, the held snapshot's side by side."""

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
    # That run kept no CPU per job: its two columns say so.
    assert bulk[1:] == ["44,346", "38,207 (pgqueuer)", NONE, "1.16" + TIMES, NONE, NONE]
    drain = rows["no-op drain (jobs/s)"]
    assert drain[1] == "18,414 (2 children)" and drain[3] == "38,469 (pgbench, 2 clients)"
    assert drain[4] == "1.40" + TIMES  # 18,414 / 13,158
    # A latency: the best peer's ÷ brooq's, so that above 1 still means brooq ahead.
    pickup = rows["pickup p50 (ms; lower is better)"]
    assert pickup[2] == "1.67 (celery)" and pickup[4] == "1.26" + TIMES
    assert "## At a glance" in report.markdown(result)


def test_the_glance_table_gives_each_systems_cpu_per_job_beside_its_rate() -> None:
    """The client's and the server's CPU per job, medians of the same configuration as
    the jobs/s beside them."""
    result = json.loads((BENCH / "results" / "2026-12-01.json").read_text())
    for key, client, server in (
        ("brooq|enqueue_bulk|", 1.6, 3.7),
        ("pgqueuer|enqueue_bulk|", 4.1, 12.0),
        ("brooq|drain|2", 14.6, 19.5),
    ):
        entry = result["summary"][key]
        entry["client_cpu_us_per_job"] = {"median": client}
        entry["server_cpu_us_per_job"] = {"median": server}
    rows = {
        line.split(" | ")[0].lstrip("| "): line.strip("| ").split(" | ")
        for line in report.glance(result)
        if line.startswith("| ") and "---" not in line and "workload" not in line
    }
    assert rows["bulk enqueue (jobs/s)"][5:] == ["1.6 + 3.7 µs", "4.1 + 12.0 µs"]
    assert rows["no-op drain (jobs/s)"][5] == "14.6 + 19.5 µs"


def test_the_held_snapshot_report_is_rewritten_from_its_stored_run_as_it_was() -> None:
    stem = BENCH / "results" / "2026-12-03-snapshot-quiet"
    result = json.loads(stem.with_suffix(".json").read_text())
    text = report.snapshot_markdown(result)
    assert text == stem.with_suffix(".md").read_text()
    side = text.split("## alone")[0]
    assert "| completed jobs/s | 1,000 | 1,000 | 100 % |" in side
    assert "held pickup p99 < 50 ms: 27.1 ms (met)" in side
