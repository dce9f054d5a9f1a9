"""brooq.worker.floors: where a claim enters the ready index, and when it reads the index
whole. Pure: times are passed in."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from brooq.worker.floors import FACTOR, MAX_APART, SLACK, WHOLE, WORTH, Floors

T = datetime(2026, 12, 3, 12, 0, 0, tzinfo=timezone.utc)
SLOW = 10 * WORTH  # a whole read that took long enough for floors to be worth it


def slow_whole_read(
    floors: Floors, queues: list[str], rows: list[tuple[str, int, datetime]]
) -> float:
    """A whole read of ``queues`` from 0 to SLOW that returned ``rows``; its end."""
    assert floors.start(queues, 0.0) is None
    floors.end(rows, 0.0, SLOW)
    return SLOW


def test_a_queue_is_read_whole_until_a_claim_of_it_returned_a_job() -> None:
    floors = Floors(spread=lambda: 0.0)
    assert floors.start(["q"], 0.0) is None
    floors.end([], 0.0, SLOW)  # expensive, but nothing came back: no floor to use
    assert floors.start(["q"], SLOW + 0.001) is None


def test_cheap_whole_reads_are_always_taken() -> None:
    """On a table VACUUM keeps clean a whole read is cheap: every claim stays the plain
    statement, whatever floors the claims left."""
    floors = Floors(spread=lambda: 0.0)
    for i in range(5):
        now = float(i)
        assert floors.start(["q"], now) is None
        floors.end([("q", 0, T + timedelta(seconds=i))], now, now + WORTH / 2)


def test_only_claims_past_worth_or_from_floors_move_the_floors() -> None:
    """A cheap whole read's jobs are not listed (its floors would never be used); the
    first whole read past WORTH, and every floored claim, are."""
    floors = Floors(spread=lambda: 0.0)
    assert floors.start(["q"], 0.0) is None
    assert not floors.tracks(WORTH / 2)
    assert floors.tracks(WORTH)
    end = slow_whole_read(floors, ["q"], [("q", 0, T)])
    assert floors.start(["q"], end + 0.001) is not None
    assert floors.tracks(0.0)  # a floored claim, however quick
    floors.forget()
    assert floors.start(["q"], end + 0.002) is None and not floors.tracks(0.0)


def test_past_worth_the_claim_enters_each_priority_at_its_floor() -> None:
    floors = Floors(spread=lambda: 0.0)
    end = slow_whole_read(floors, ["q"], [("q", 0, T), ("q", 0, T + timedelta(seconds=3))])
    assert floors.start(["q"], end + 0.001) == [
        ("q", 1, 32767, WHOLE),
        ("q", 0, 0, T - SLACK),
        ("q", -32768, -1, WHOLE),
    ]


def test_the_ranges_cover_every_priority_highest_first() -> None:
    floors = Floors(spread=lambda: 0.0)
    rows = [("q", 5, T), ("q", 4, T + timedelta(seconds=1)), ("q", 32767, T), ("q", -32768, T)]
    end = slow_whole_read(floors, ["q"], rows)
    assert floors.start(["q"], end + 0.001) == [
        ("q", 32767, 32767, T - SLACK),
        ("q", 6, 32766, WHOLE),
        ("q", 5, 5, T - SLACK),
        ("q", 4, 4, T + timedelta(seconds=1) - SLACK),
        ("q", -32767, 3, WHOLE),
        ("q", -32768, -32768, T - SLACK),
    ]


def test_the_floor_moves_forward_only() -> None:
    """A claim that returned an older job (one a whole read found below the floor) does
    not lower the floor: that job is claimed now."""
    floors = Floors(spread=lambda: 0.0)
    end = slow_whole_read(floors, ["q"], [("q", 0, T)])
    floors.start(["q"], end)
    floors.end([("q", 0, T + timedelta(seconds=5))], end, end + 0.001)
    assert floors.start(["q"], end + 0.01) == [
        ("q", 1, 32767, WHOLE),
        ("q", 0, 0, T + timedelta(seconds=5) - SLACK),
        ("q", -32768, -1, WHOLE),
    ]
    floors.end([("q", 0, T - timedelta(minutes=5))], end + 0.01, end + 0.011)
    ranges = floors.start(["q"], end + 0.02)
    assert ranges is not None and ranges[1] == ("q", 0, 0, T + timedelta(seconds=5) - SLACK)


def test_a_whole_read_comes_back_after_factor_times_its_own_duration() -> None:
    floors = Floors(spread=lambda: 0.0)
    end = slow_whole_read(floors, ["q"], [("q", 0, T)])
    due = end + FACTOR * SLOW
    assert floors.start(["q"], due - 0.001) is not None
    floors.end([], due - 0.001, due)  # a floored claim does not move the due time
    assert floors.start(["q"], due) is None


def test_the_wait_for_a_whole_read_is_stretched_by_up_to_a_half_at_random() -> None:
    """Sibling children start together and their whole reads take as long: each stretches
    its wait by its own random share, so they do not read whole at the same moment."""
    floors = Floors(spread=lambda: 0.999)
    end = slow_whole_read(floors, ["q"], [("q", 0, T)])
    assert floors.start(["q"], end + FACTOR * SLOW * 1.49) is not None
    floors.end([], 0.0, 0.0)
    assert floors.start(["q"], end + FACTOR * SLOW * 1.5) is None


def test_whole_reads_are_never_further_apart_than_max_apart() -> None:
    floors = Floors(spread=lambda: 0.0)
    assert floors.start(["q"], 0.0) is None
    floors.end([("q", 0, T)], 0.0, 100.0)  # a whole read of 100 s
    assert floors.start(["q"], 100.0 + MAX_APART - 0.001) is not None
    floors.end([], 0.0, 0.0)
    assert floors.start(["q"], 100.0 + MAX_APART) is None


def test_several_queues_each_whole_or_from_their_floors() -> None:
    """A round of several queues, in its order: a queue whose whole read is due is one
    range read whole, the others their floors' ranges."""
    floors = Floors(spread=lambda: 0.0)
    assert floors.start(["a"], 0.0) is None
    floors.end([("a", 0, T)], 0.0, SLOW)  # a's next whole read: SLOW + FACTOR * SLOW
    assert floors.start(["b"], 1.0) is None
    floors.end([("b", 0, T)], 1.0, 1.0 + SLOW)  # b's: later
    now = SLOW + FACTOR * SLOW + 0.01
    assert now < 1.0 + SLOW + FACTOR * SLOW
    assert floors.start(["b", "a"], now) == [
        ("b", 1, 32767, WHOLE),
        ("b", 0, 0, T - SLACK),
        ("b", -32768, -1, WHOLE),
        ("a", -32768, 32767, WHOLE),
    ]


def test_after_a_failed_claim_the_next_reads_whole() -> None:
    floors = Floors(spread=lambda: 0.0)
    end = slow_whole_read(floors, ["q"], [("q", 0, T)])
    assert floors.start(["q"], end + 0.001) is not None
    floors.forget()
    assert floors.start(["q"], end + 0.002) is None
