"""Queue weights and worked queues (brooq.worker.weights)."""

from __future__ import annotations

from typing import Any

from brooq.declare.handlers import build
from brooq.rules import worked_queues
from brooq.worker.weights import RoundOrder

# -- the rules, without a database ----------------------------------------------------------


def test_weights_decide_how_often_a_queue_is_first_never_whether_it_is_tried() -> None:
    order = RoundOrder((("default", 4), ("bulk", 1)))
    rounds = [order.next() for _ in range(50)]
    firsts = [r[0] for r in rounds]
    assert firsts.count("default") == 40 and firsts.count("bulk") == 10
    assert all(sorted(r) == ["bulk", "default"] for r in rounds)
    # Smooth: bulk never waits more than five rounds to lead.
    assert max(len(run) for run in "".join(f[0] for f in firsts).split("b")) <= 4
    three = RoundOrder((("a", 1), ("b", 1), ("c", 2)))
    assert [three.next() for _ in range(4)] == [
        ["c", "a", "b"],
        ["a", "c", "b"],
        ["b", "c", "a"],
        ["c", "a", "b"],
    ]
    assert RoundOrder((("only", 3),)).single == "only" and three.single is None


def test_worked_queues_default_to_the_handlers_queues() -> None:
    handlers = {
        "a": build("a", print, **_unset(), queue="bulk"),
        "b": build("b", print, **_unset()),
        "c": build("c", print, **_unset(), queue="bulk"),
    }
    assert worked_queues((), handlers) == (("bulk", 1), ("default", 1))
    assert worked_queues((("x", 3),), handlers) == (("x", 3),)


def _unset() -> dict[str, Any]:
    return {
        name: None
        for name in (
            "max_attempts",
            "attempt_timeout",
            "max_execution_timeout",
            "backoff_base",
            "backoff_max",
        )
    }
