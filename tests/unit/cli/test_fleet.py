"""`brooq fleet` and the HANDLER column of `brooq stats`, as lines (pure)."""

from __future__ import annotations

import brooq
from brooq.cli.fleet import fleet_lines
from brooq.cli.stats import stats_lines
from tests.unit.test_masters import T0, row


def test_fleet_lines() -> None:
    child = {"pid": 7, "kind": "sync", "generation": 0, "started_at": T0.isoformat()}
    lines = fleet_lines([row(5, ["default"], ["a", "b"], [child]), row(6, ["bulk"], ["c"])])
    text = "\n".join(lines)
    assert lines[0].startswith("h1 pid 5: brooq 0.1.0, app app:queue, started 2026-12-03")
    assert "seen 1.2s ago" in lines[0]
    assert "  topics: a, b" in text and "  (no children)" in text
    assert lines[-1] == "2 masters, 1 child"
    assert fleet_lines([])[0].startswith("(no live master")


def test_stats_lines_say_whether_a_master_handles_each_row() -> None:
    rows = [
        brooq.TopicStats(topic="a", pending=2, ready=2),
        brooq.TopicStats(topic="typo", pending=1, ready=1),
    ]
    lines = stats_lines(rows, {("default", "a")})
    assert lines[0].split()[-1] == "HANDLER"
    assert lines[1].endswith("  yes") and lines[2].endswith("  none")
    assert lines[3].startswith("(total)") and lines[3].endswith("0.0s")  # no HANDLER cell
    assert [line.split()[-1] for line in stats_lines(rows)[1:3]] == ["-", "-"]  # cannot tell
    assert stats_lines([]) == ["(no unfinished or dead jobs)"]
