"""brooq.worker.floors: where a claim enters the ready index, and when it reads the index
whole. Pure: times are passed in."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta, timezone

from brooq.worker.floors import FACTOR, MAX_APART, MIN_APART, SLACK, WHOLE, Claimed, Floors

T = datetime(2026, 12, 3, 12, 0, 0, tzinfo=timezone.utc)
LATER = T + timedelta(hours=1)  # a claim of a backlog: its jobs are older than SLACK
NIL = uuid.UUID(int=0)
A, B, C = (uuid.UUID(int=n) for n in (10, 20, 30))


def whole_read(
    floors: Floors, queues: list[str], rows: list[Claimed], took: float = 0.001
) -> float:
    """A whole read of ``queues`` from 0 to ``took`` that returned ``rows`` (the claim
    started at LATER by the database's clock); its end."""
    assert floors.start(queues, 0.0) is None
    floors.end(rows, LATER if rows else None, 0.0, took)
    return took


def test_a_queue_is_read_whole_until_a_claim_of_it_returned_a_job() -> None:
    floors = Floors(spread=lambda: 0.0)
    assert floors.start(["q"], 0.0) is None
    floors.end([], None, 0.0, 0.001)  # nothing came back: no floor to use
    assert floors.start(["q"], 0.002) is None


def test_after_a_claim_of_a_backlog_the_next_enters_past_its_last_job() -> None:
    """Jobs older than the claim's start less SLACK: the floor is the last one's position,
    id included, so the claimed jobs of one enqueue (one available_at) are passed too."""
    floors = Floors(spread=lambda: 0.0)
    end = whole_read(floors, ["q"], [("q", 0, T, A), ("q", 0, T, C), ("q", 0, T, B)])
    assert floors.start(["q"], end + 0.001) == [
        ("q", 1, 32767, *WHOLE),
        ("q", 0, 0, T, C),
        ("q", -32768, -1, *WHOLE),
    ]


def test_a_claim_of_fresh_jobs_keeps_slack_before_its_own_start() -> None:
    """Jobs that became ready within SLACK of the claim: a job whose enqueue started
    before them may not have committed yet, so the floor stays at the claim's start less
    SLACK, whatever the ids."""
    floors = Floors(spread=lambda: 0.0)
    assert floors.start(["q"], 0.0) is None
    fresh = LATER - SLACK / 2
    floors.end([("q", 0, fresh, C)], LATER, 0.0, 0.001)
    ranges = floors.start(["q"], 0.01)
    assert ranges is not None and ranges[1] == ("q", 0, 0, LATER - SLACK, NIL)


def test_the_ranges_cover_every_priority_highest_first() -> None:
    floors = Floors(spread=lambda: 0.0)
    rows = [
        ("q", 5, T, A),
        ("q", 4, T + timedelta(seconds=1), B),
        ("q", 32767, T, C),
        ("q", -32768, T, A),
    ]
    end = whole_read(floors, ["q"], rows)
    assert floors.start(["q"], end + 0.001) == [
        ("q", 32767, 32767, T, C),
        ("q", 6, 32766, *WHOLE),
        ("q", 5, 5, T, A),
        ("q", 4, 4, T + timedelta(seconds=1), B),
        ("q", -32767, 3, *WHOLE),
        ("q", -32768, -32768, T, A),
    ]


def test_the_floor_moves_forward_only() -> None:
    """A claim that returned an older job (one a whole read found below the floor) does
    not lower the floor: that job is claimed now."""
    floors = Floors(spread=lambda: 0.0)
    end = whole_read(floors, ["q"], [("q", 0, T, B)])
    floors.start(["q"], end)
    floors.end([("q", 0, T, C)], LATER, end, end + 0.001)
    ranges = floors.start(["q"], end + 0.01)
    assert ranges is not None and ranges[1] == ("q", 0, 0, T, C)
    floors.end([("q", 0, T - timedelta(minutes=5), A)], LATER, end + 0.01, end + 0.011)
    ranges = floors.start(["q"], end + 0.02)
    assert ranges is not None and ranges[1] == ("q", 0, 0, T, C)


def test_a_whole_read_comes_back_min_apart_after_a_cheap_one() -> None:
    """A job below a floor (a long enqueue transaction, a release) waits for the next
    whole read: at least MIN_APART after the last, so that cheap whole reads do not
    come back at every claim."""
    floors = Floors(spread=lambda: 0.0)
    end = whole_read(floors, ["q"], [("q", 0, T, A)], took=0.001)
    assert FACTOR * 0.001 < MIN_APART
    assert floors.start(["q"], end + MIN_APART - 0.001) is not None
    floors.end([], None, 0.0, 0.0)  # a floored claim does not move the due time
    assert floors.start(["q"], end + MIN_APART) is None


def test_a_whole_read_comes_back_after_factor_times_its_own_duration() -> None:
    floors = Floors(spread=lambda: 0.0)
    slow = 2 * MIN_APART / FACTOR
    end = whole_read(floors, ["q"], [("q", 0, T, A)], took=slow)
    due = end + FACTOR * slow
    assert floors.start(["q"], due - 0.001) is not None
    floors.end([], None, due - 0.001, due)
    assert floors.start(["q"], due) is None


def test_the_wait_for_a_whole_read_is_stretched_by_up_to_a_half_at_random() -> None:
    """Sibling children start together and their whole reads take as long: each stretches
    its wait by its own random share, so they do not read whole at the same moment."""
    floors = Floors(spread=lambda: 0.999)
    end = whole_read(floors, ["q"], [("q", 0, T, A)])
    assert floors.start(["q"], end + MIN_APART * 1.49) is not None
    floors.end([], None, 0.0, 0.0)
    assert floors.start(["q"], end + MIN_APART * 1.5) is None


def test_whole_reads_are_never_further_apart_than_max_apart() -> None:
    floors = Floors(spread=lambda: 0.0)
    assert floors.start(["q"], 0.0) is None
    floors.end([("q", 0, T, A)], LATER, 0.0, 100.0)  # a whole read of 100 s
    assert floors.start(["q"], 100.0 + MAX_APART - 0.001) is not None
    floors.end([], None, 0.0, 0.0)
    assert floors.start(["q"], 100.0 + MAX_APART) is None


def test_several_queues_each_whole_or_from_their_floors() -> None:
    """A round of several queues, in its order: a queue whose whole read is due is one
    range read whole, the others their floors' ranges."""
    floors = Floors(spread=lambda: 0.0)
    assert floors.start(["a"], 0.0) is None
    floors.end([("a", 0, T, A)], LATER, 0.0, 0.001)  # a's next whole read: MIN_APART on
    assert floors.start(["b"], 0.5) is None
    floors.end([("b", 0, T, B)], LATER, 0.5, 0.501)  # b's: later
    now = 0.001 + MIN_APART + 0.01
    assert now < 0.501 + MIN_APART
    assert floors.start(["b", "a"], now) == [
        ("b", 1, 32767, *WHOLE),
        ("b", 0, 0, T, B),
        ("b", -32768, -1, *WHOLE),
        ("a", -32768, 32767, *WHOLE),
    ]


def test_after_a_failed_claim_the_next_reads_whole() -> None:
    floors = Floors(spread=lambda: 0.0)
    end = whole_read(floors, ["q"], [("q", 0, T, A)])
    assert floors.start(["q"], end + 0.001) is not None
    floors.forget()
    assert floors.start(["q"], end + 0.002) is None


def test_a_whole_read_sets_the_floors_again_from_what_it_took() -> None:
    """Jobs given back behind the floors (a long job's batchmates) keep their place in
    line: the whole read that follows takes them, and the floors start again from them,
    not from the old, later floors."""
    floors = Floors(spread=lambda: 0.0)
    end = whole_read(floors, ["q"], [("q", 0, T, C)])
    floors.forget()  # the child gave back jobs
    assert floors.start(["q"], end + 0.001) is None
    floors.end([("q", 0, T, A)], LATER, end + 0.001, end + 0.002)
    ranges = floors.start(["q"], end + 0.003)
    assert ranges is not None and ranges[1] == ("q", 0, 0, T, A)
    # A whole read that found nothing leaves no floor: the next claim reads whole too.
    floors.forget()
    assert floors.start(["q"], end + 0.004) is None
    floors.end([], None, end + 0.004, end + 0.005)
    assert floors.start(["q"], end + 0.006) is None
