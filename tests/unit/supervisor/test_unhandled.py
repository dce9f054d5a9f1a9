"""The unhandled (queue, topic) watch of the master: said once per pair (pure)."""

from __future__ import annotations

import logging
from datetime import datetime, timezone
from types import SimpleNamespace

import pytest

from brooq.supervisor.unhandled import Unhandled
from tests.unit.supervisor.duties.test_scheduler_and_duties import FakeGauge

T0 = datetime(2026, 12, 3, 9, 0, tzinfo=timezone.utc)


def test_unhandled_is_said_once_per_pair_and_again_after_it_was_handled(
    caplog: pytest.LogCaptureFixture,
) -> None:
    live: list[frozenset[tuple[str, str]] | None] = [None]
    metrics = SimpleNamespace(unhandled=FakeGauge())
    watch = Unhandled(lambda: live[0], metrics)  # type: ignore[arg-type]
    typo = [{"queue": "default", "topic": "calc.hsah", "ready": 3}]
    key = (("queue", "default"), ("topic", "calc.hsah"))

    def said() -> int:
        return caplog.text.count("event=unhandled_topic topic=calc.hsah queue=default")

    with caplog.at_level(logging.INFO, logger="brooq.master"):
        assert watch.check(typo) == {}  # the fleet not known yet: nothing judged
        live[0] = frozenset({("default", "calc.hash")})
        assert watch.check(typo) == {("default", "calc.hsah"): 3}
        assert "count=3" in caplog.text and metrics.unhandled.values[key] == 3
        watch.check([{**typo[0], "ready": 5}])  # more jobs: the gauge, not the line
        assert said() == 1 and metrics.unhandled.values[key] == 5
        watch.check([])  # its jobs gone: 0 once, still flagged
        assert metrics.unhandled.values[key] == 0
        metrics.unhandled.written.clear()
        watch.check([])
        assert metrics.unhandled.written == []  # written as zero once, then forgotten
        watch.check(typo)
        assert said() == 1  # not handled in between: not said again
        live[0] = frozenset({("default", "calc.hash"), ("default", "calc.hsah")})
        assert watch.check(typo) == {}
        assert "event=unhandled_topic_handled topic=calc.hsah queue=default" in caplog.text
        assert metrics.unhandled.values[key] == 0
        live[0] = frozenset({("default", "calc.hash")})
        watch.check(typo)
        assert said() == 2


# -- the beat, on fakes ------------------------------------------------------------------------
