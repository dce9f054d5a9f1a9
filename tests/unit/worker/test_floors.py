"""brooq.worker.floors: where a claim starts in the ready index, and when it reads the
index whole. Pure: times are passed in."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from brooq.worker.floors import FACTOR, MAX_APART, SLACK, WHOLE, Floors

T = datetime(2026, 12, 3, 12, 0, 0, tzinfo=timezone.utc)


def test_a_queue_is_read_whole_until_a_claim_of_it_returned_a_job() -> None:
    floors = Floors()
    assert floors.start("default", 0.0) == WHOLE
    floors.end("default", None, 0.0, 0.001)  # nothing came back
    assert floors.start("default", 10.0) == WHOLE
    floors.end("default", T, 10.0, 10.001)
    assert floors.start("other", 10.002) == WHOLE  # each queue its own


def test_the_floor_is_the_oldest_job_returned_less_the_slack() -> None:
    floors = Floors()
    floors.start("q", 0.0)
    floors.end("q", T, 0.0, 0.5)  # a whole read of 0.5 s: the next is due at 0.5 + 10
    assert floors.start("q", 1.0) == T - SLACK
    floors.end("q", T + timedelta(seconds=5), 1.0, 1.001)
    assert floors.start("q", 2.0) == T + timedelta(seconds=5) - SLACK


def test_the_floor_never_moves_back() -> None:
    """A claim that returned an older job (one found below the floor by a whole read)
    does not lower the floor: that job is claimed now."""
    floors = Floors()
    floors.start("q", 0.0)
    floors.end("q", T, 0.0, 1.0)
    floors.start("q", 2.0)
    floors.end("q", T - timedelta(minutes=5), 2.0, 2.001)
    assert floors.start("q", 3.0) == T - SLACK


def test_a_whole_read_comes_back_after_factor_times_its_own_duration() -> None:
    floors = Floors()
    floors.start("q", 0.0)
    floors.end("q", T, 0.0, 0.2)  # 0.2 s: due at 0.2 + FACTOR * 0.2
    due = 0.2 + FACTOR * 0.2
    assert floors.start("q", due - 0.001) == T - SLACK
    floors.end("q", T, due - 0.001, due)  # a floored claim does not move the due time
    assert floors.start("q", due) == WHOLE


def test_a_cheap_whole_read_leaves_nearly_every_claim_whole() -> None:
    """On a table VACUUM keeps clean a whole read is sub-millisecond: the next claim, a
    few milliseconds later, reads whole again (nothing changes)."""
    floors = Floors()
    floors.start("q", 0.0)
    floors.end("q", T, 0.0, 0.0003)
    assert floors.start("q", 0.0003 + FACTOR * 0.0003) == WHOLE


def test_whole_reads_are_never_further_apart_than_max_apart() -> None:
    floors = Floors()
    floors.start("q", 0.0)
    floors.end("q", T, 0.0, 100.0)  # a whole read of 100 s
    assert floors.start("q", 100.0 + MAX_APART - 0.001) == T - SLACK
    floors.end("q", None, 0.0, 0.0)
    assert floors.start("q", 100.0 + MAX_APART) == WHOLE


def test_after_a_failed_claim_the_next_reads_whole() -> None:
    floors = Floors()
    floors.start("q", 0.0)
    floors.end("q", T, 0.0, 1.0)
    assert floors.start("q", 2.0) == T - SLACK
    floors.forget("q")
    assert floors.start("q", 2.1) == WHOLE
