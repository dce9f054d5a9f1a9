"""When make bench looks at a drain again (benchmarks/common.next_look): often near the
stopwatch's two readings, spaced by the drain's own rate between them."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from common import LOOK_MAX, POLL, next_look


def test_nothing_finished_yet_or_none_left_looks_again_soon() -> None:
    assert next_look(1000, 10.0, 1000, 11.0) == POLL  # no job finished since the first look
    assert next_look(1000, 10.0, 0, 11.0) == POLL
    assert next_look(1000, 10.0, 900, 10.0) == POLL  # no time passed


def test_between_the_ends_a_third_of_the_time_left_at_most_look_max() -> None:
    # 100 done in 0.1 s, 900 left: 0.9 s predicted, a third of it, capped.
    assert next_look(1000, 10.0, 900, 10.1) == LOOK_MAX
    # 800 done in 1 s, 400 left: 0.5 s predicted, the next look after a third of it.
    assert abs(next_look(1200, 10.0, 400, 11.0) - 0.5 / 3) < 1e-9
    # Near the end, never less than POLL apart.
    assert next_look(1000, 10.0, 10, 11.0) == POLL
