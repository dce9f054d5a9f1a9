"""The topics a child claims apart (brooq.worker.pacing): their turns and parameters, which
turn a round takes, what a held-back answer makes the child do, and the start deadline
of a claim under a rate."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta, timezone
from typing import NamedTuple

import pytest

import brooq
from brooq.worker.pacing import BATCH_MAX, Pacing, turns

NOW = datetime(2026, 12, 1, tzinfo=timezone.utc)


class Row(NamedTuple):
    claimed: bool
    id: uuid.UUID
    topic: str
    locked_until: datetime
    available_at: datetime


def handlers() -> dict[str, brooq.declare.handlers.Handler]:
    q = brooq.Queue("postgresql://unused")
    q.handler("a.capped", global_limit=2)(print)
    q.handler("b.rated", rate_limit="20/s", global_limit=3)(print)
    q.handler("c.grouped", group_limit=1, group_rate_limit="1/m")(print)
    q.handler("d.free")(print)
    return q.handlers


def test_each_limited_topic_has_a_turn_with_its_parameters() -> None:
    found = {t.topic: t for t in turns(handlers())}
    assert sorted(found) == ["a.capped", "b.rated", "c.grouped"]
    assert found["a.capped"].shape == "limited"
    assert found["a.capped"].params == {"limited": "a.capped", "cap": 2}
    assert found["a.capped"].allowance is None
    assert found["b.rated"].shape == "coordinated"
    assert found["b.rated"].params == {
        "limited": "b.rated",
        "cap": 3,
        "rate": 20,
        "window": 1.05,
        "group_cap": None,
        "group_rate": None,
        "group_window": None,
        "in_turn": False,
        "allowance": 0.05,
    }
    assert found["b.rated"].allowance == 0.05
    grouped = found["c.grouped"]
    assert (grouped.params["group_cap"], grouped.params["group_rate"]) == (1, 1)
    assert grouped.params["group_window"] == 60.25 and grouped.allowance == 0.25


def test_the_turns_go_round_and_a_window_with_room_again_goes_first() -> None:
    clock = [0.0]
    pacing = Pacing(turns(handlers()), clock=lambda: clock[0])
    assert [pacing.next_turn().topic for _ in range(4)] == [
        "a.capped",
        "b.rated",
        "c.grouped",
        "a.capped",
    ]
    rated = pacing.turns[1]
    held = Row(True, None, "b.rated", NOW, NOW + timedelta(seconds=0.3))  # type: ignore[arg-type]
    assert pacing.sift([held], rated, sent_at=0.0) == []
    for _ in pacing.turns:  # an idle child sleeps once every turn came back with nothing
        assert pacing.idle_wait(1.0) == 0.0
        pacing.claimed(False)
    assert pacing.idle_wait(1.0) == 0.3  # not poll_interval: the window has room sooner
    assert pacing.next_turn().topic == "b.rated"  # in order (its room is not yet there)
    clock[0] = 0.31
    assert pacing.idle_wait(1.0) == 0.001  # due: a millisecond, never a spin
    assert pacing.next_turn().topic == "b.rated"  # due first, out of order
    assert pacing.sift([], rated, sent_at=0.31) == [] and pacing.idle_wait(1.0) == 1.0
    pacing.claimed(True)  # a claim: the turns come round again before any sleep
    assert pacing.idle_wait(1.0) == 0.0


def test_a_claim_under_a_rate_must_start_within_its_allowance() -> None:
    clock = [10.0]
    pacing = Pacing(turns(handlers()), clock=lambda: clock[0])
    rated, capped = pacing.turns[1], pacing.turns[0]
    mine, other, finished = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    rows = [
        Row(True, mine, "b.rated", NOW, NOW),
        Row(True, other, "d.free", NOW, NOW),
        Row(False, finished, None, None, None),  # type: ignore[arg-type]
    ]
    assert pacing.sift(rows, rated, sent_at=10.0) == rows
    assert pacing.start_by == {mine: 10.05}
    assert not pacing.late(other)  # no deadline
    clock[0] = 10.049
    assert not pacing.late(mine)
    assert pacing.start_by == {}  # asked once
    pacing.sift(rows[:1], rated, sent_at=10.0)
    clock[0] = 10.051
    assert pacing.late(mine)
    pacing.sift(rows[:1], capped, sent_at=20.0)  # a cap alone: no deadline
    assert pacing.start_by == {}


def test_nothing_to_claim_from_sleeps_at_once() -> None:
    """Every worked queue paused: no turn is tried, and the child sleeps its
    poll_interval rather than going round the turns."""
    pacing = Pacing(turns(handlers()), clock=lambda: 0.0)
    assert pacing.idle_wait(1.0) == 0.0
    pacing.claimed(False, every_turn=True)
    assert pacing.idle_wait(1.0) == 1.0


def test_every_coordinated_topic_takes_the_batched_claim() -> None:
    """group_limit, fair_groups, a rate on the topic or per group: each claims a batch
    through brooq_claim_batch; fair_groups takes the groups in turn even without a limit."""
    q = brooq.Queue("postgresql://unused")
    q.handler("e.limited", group_limit=2)(print)
    q.handler("f.fair", fair_groups=True, global_limit=10)(print)
    q.handler("g.fair.rated", fair_groups=True, rate_limit="5/s")(print)
    q.handler("h.per.group", group_limit=2, group_rate_limit="1/s")(print)
    by_topic = {t.topic: t for t in turns(q.handlers)}
    assert {t.shape for t in by_topic.values()} == {"coordinated"}
    assert by_topic["e.limited"].params["group_cap"] == 2
    assert by_topic["e.limited"].allowance is None
    assert (by_topic["f.fair"].params["cap"], by_topic["f.fair"].params["in_turn"]) == (10, True)
    assert by_topic["g.fair.rated"].params["rate"] == 5
    assert by_topic["h.per.group"].params["group_rate"] == 1
    assert q.handlers["f.fair"].limits() == {"global_limit": 10, "fair_groups": True}


def test_a_rated_topics_batch_follows_what_starts_in_time() -> None:
    """From one job a claim; doubled once a whole batch started within its allowance,
    halved once for a batch with a late start, then grown by an eighth; a topic without a
    rate takes what the round trip asks."""
    clock = [0.0]
    pacing = Pacing(turns(handlers()), clock=lambda: clock[0])
    rated = next(t for t in pacing.turns if t.topic == "b.rated")
    capped = next(t for t in pacing.turns if t.topic == "a.capped")
    assert pacing.batch(rated) == 1 and pacing.batch(capped) == BATCH_MAX

    def claim_and_start(n: int, late: int = 0) -> list[bool]:
        ids = [uuid.uuid4() for _ in range(n)]
        rows = [Row(True, i, "b.rated", NOW, NOW) for i in ids]
        pacing.sift(rows, rated, sent_at=clock[0])
        answers = [pacing.late(i) for i in ids[: n - late]]
        clock[0] += 1.0  # the rest start after the allowance
        return answers + [pacing.late(i) for i in ids[n - late :]]

    sizes = []
    for _ in range(4):
        size = pacing.batch(rated)
        assert claim_and_start(size) == [False] * size
        sizes.append(pacing.batch(rated))
    assert sizes == [2, 4, 8, 16]
    assert claim_and_start(16, late=3) == [False] * 13 + [True] * 3
    assert pacing.batch(rated) == 8  # halved once for the batch
    assert claim_and_start(8) == [False] * 8 and pacing.batch(rated) == 9  # an eighth more
    assert claim_and_start(9, late=9) == [True] * 9 and pacing.batch(rated) == 4
    # A late claim's batchmates past their deadline go back with it.
    ids = [uuid.uuid4() for _ in range(3)]
    pacing.sift([Row(True, i, "b.rated", NOW, NOW) for i in ids], rated, sent_at=clock[0])
    clock[0] += 1.0
    assert pacing.late(ids[0]) and pacing.overdue(ids[1:]) == ids[1:]
    assert pacing.start_by == {} and pacing.batch(rated) == 2
    given = uuid.uuid4()
    pacing.sift([Row(True, given, "b.rated", NOW, NOW)], rated, sent_at=clock[0])
    pacing.forget(given)  # given back before its start: no deadline, no say
    assert pacing.start_by == {} and pacing.batch(rated) == 2
    # A round trip that took more than half the allowance halves the next batch at once.
    pacing.sift([Row(True, uuid.uuid4(), "b.rated", NOW, NOW)], rated, sent_at=clock[0] - 0.03)
    assert pacing.batch(rated) == 1


def test_fair_groups_is_a_bool() -> None:
    q = brooq.Queue("postgresql://unused")
    with pytest.raises(brooq.InvalidSettings, match="fair_groups must be True or False"):
        q.handler("x.fair", fair_groups="yes")(print)  # type: ignore[arg-type]
