"""A round trip's plan: which claim statement, with which parameters
(brooq.worker.roundtrip.claim_plan), decided apart from its execution."""

from __future__ import annotations

import re
import uuid
from datetime import datetime, timezone
from typing import Any

import pytest

from brooq.job import Claim
from brooq.sql import Q
from brooq.worker.floors import Range
from brooq.worker.pacing import Turn
from brooq.worker.roundtrip import Finished, Plan, claim_plan

COMMON = {"topics": ["a", "b"], "children": 3, "worker": "host:1:w", "lease": 30.0}
AT = datetime(2024, 1, 1, tzinfo=timezone.utc)


def finished(result: str | None = None) -> Finished:
    claim: Claim[Any] = Claim(
        id=uuid.uuid4(),
        topic="a",
        payload=None,
        attempt=1,
        locked_by="host:1:w",
        locked_until=AT,
        queue="default",
        priority=0,
    )
    return (claim, 0.5, result)


def placeholders(plan: Plan) -> set[str]:
    """The parameters the plan's statement reads."""
    return set(re.findall(r"%\((\w+)\)\w", getattr(Q, plan.statement)))


def test_one_queue_claims_with_the_one_queue_statement() -> None:
    done = [finished()]
    plan = claim_plan(done, False, 5, ["default"], COMMON)
    assert (plan.shape, plan.statement) == ("one", "job_finish_and_claim")
    assert plan.params["queue"] == "default"
    assert plan.params["done"] == [done[0][0].id]
    assert (plan.limit, plan.params["limit"], plan.queues) == (5, 5, ["default"])
    assert set(plan.params) == placeholders(plan)


def test_several_queues_claim_with_the_queues_statement_in_their_order() -> None:
    plan = claim_plan([], False, 5, ["b", "a"], COMMON)
    assert (plan.shape, plan.statement) == ("queues", "job_finish_and_claim_queues")
    assert plan.params["queues"] == ["b", "a"]
    assert set(plan.params) == placeholders(plan)


def test_ranges_make_a_floored_claim() -> None:
    first, last = uuid.UUID(int=1), uuid.UUID(int=2)
    ranges: list[Range] = [("a", 0, 9, AT, first), ("b", -1, 4, AT, last)]
    plan = claim_plan([], False, 5, ["a", "b"], COMMON, ranges=ranges)
    assert (plan.shape, plan.statement) == ("floored", "job_finish_and_claim_floored")
    assert plan.params["queues"] == ["a", "b"]
    assert (plan.params["lows"], plan.params["highs"]) == ([0, -1], [9, 4])
    assert plan.params["floors"] == [AT, AT]
    assert plan.params["floor_ids"] == [first, last]
    assert set(plan.params) == placeholders(plan)


@pytest.mark.parametrize(
    "turn",
    [
        Turn("a", "limited", {"limited": "a", "cap": 2}),
        Turn(
            "a",
            "coordinated",
            {
                "limited": "a",
                "cap": None,
                "rate": 10,
                "window": 1.0,
                "group_cap": None,
                "group_rate": None,
                "group_window": None,
                "in_turn": False,
                "allowance": 0.5,
            },
            0.5,
        ),
    ],
)
def test_a_turn_claims_its_topic_apart_with_its_shape(turn: Turn) -> None:
    ranges: list[Range] = [("a", 0, 9, AT)]
    plan = claim_plan([], False, 5, ["a"], COMMON, turn=turn, ranges=ranges)
    assert plan.shape == turn.shape  # a turn wins over floors
    assert plan.statement == f"job_finish_and_claim_{turn.shape}"
    assert plan.params["queues"] == ["a"]
    assert {k: plan.params[k] for k in turn.params} == turn.params
    assert set(plan.params) == placeholders(plan)
    if turn.shape == "coordinated":  # a batch: the pacing's, else the round trip's limit
        assert plan.params["batch"] == 5
        assert claim_plan([], False, 5, ["a"], COMMON, turn, batch=2).params["batch"] == 2


def test_results_choose_the_statement_that_writes_them() -> None:
    done = [finished('{"n": 1}'), finished(None)]
    plan = claim_plan(done, True, 0, ["default"], COMMON)
    assert plan.statement == "job_finish_and_claim_results"
    assert plan.params["results"] == ['{"n": 1}', None]
    assert plan.params["limit"] == 0
    assert set(plan.params) == placeholders(plan)
    assert "results" not in claim_plan(done, False, 0, ["default"], COMMON).params


def test_every_shape_names_a_statement_with_and_without_results() -> None:
    for shape in ("one", "queues", "limited", "coordinated", "floored"):
        for with_results in (False, True):
            name = Plan(shape, with_results, [], 0, {}).statement
            assert name.startswith("job_finish_and_claim")
            assert name.endswith("_results") == with_results
            assert hasattr(Q, name)


def test_the_same_arguments_make_the_same_plan() -> None:
    done = [finished()]
    assert claim_plan(done, False, 3, ["a", "b"], COMMON) == claim_plan(
        done, False, 3, ["a", "b"], COMMON
    )


def test_a_progress_report_rides_with_its_done_in_the_results_statement() -> None:
    quiet, reporting = finished(), finished()
    reporting[0].reported = (0.9, "almost")
    plan = claim_plan([quiet, reporting], True, 0, ["default"], COMMON)
    assert plan.statement == "job_finish_and_claim_results"
    assert plan.params["results"] == [None, None]
    assert plan.params["reported"] == [reporting[0].id]
    assert (plan.params["fractions"], plan.params["messages"]) == ([0.9], ["almost"])
    assert set(plan.params) == placeholders(plan)
