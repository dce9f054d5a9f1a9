"""The cancels a master hears (brooq.supervisor.cancels): matched to the child holding the
job, kept for a renewal period when no child of ours holds it yet, then forgotten."""

from __future__ import annotations

import uuid

from brooq.ipc.protocol import LineReader
from brooq.ipc.reasons import LEASE_LOST
from brooq.supervisor.cancels import CancelsHeard
from brooq.supervisor.childproc import ChildProc


def _child(pid: int, *held: uuid.UUID) -> ChildProc:
    child = ChildProc(pid, f"c{pid}", 0, -1, LineReader(-1), "", 0.0)
    child.held = list(held)
    return child


def test_a_cancel_of_a_job_a_child_holds_brings_the_renewal_forward_once() -> None:
    job, other = uuid.uuid4(), uuid.uuid4()
    heard = CancelsHeard(keep=10.0)
    heard.heard([str(job)], now=0.0)
    children = [_child(1, other), _child(2, job)]
    assert heard.match(children, now=0.0) is True
    assert heard.pending == {}  # matched: forgotten
    assert heard.match(children, now=0.1) is False


def test_a_cancel_heard_before_the_held_list_is_matched_when_it_comes() -> None:
    job = uuid.uuid4()
    heard = CancelsHeard(keep=10.0)
    heard.heard([str(job)], now=0.0)
    child = _child(1)
    assert heard.match([child], now=0.0) is False
    assert job in heard.pending  # kept for the held list still on its way
    child.held = [job]
    assert heard.match([child], now=0.5) is True


def test_a_cancel_no_child_of_ours_holds_is_forgotten_after_a_renewal_period() -> None:
    job = uuid.uuid4()
    heard = CancelsHeard(keep=10.0)
    heard.heard([str(job)], now=0.0)  # another master's job
    assert heard.match([_child(1)], now=9.9) is False and job in heard.pending
    assert heard.match([_child(1)], now=10.0) is False and heard.pending == {}
    # Held only after that: the periodic renewal's business, not this one's.
    heard.heard([], now=10.0)
    assert heard.match([_child(1, job)], now=10.1) is False


def test_a_child_being_killed_and_a_payload_that_is_no_job_id_are_ignored() -> None:
    job = uuid.uuid4()
    heard = CancelsHeard(keep=10.0)
    heard.heard(["not a uuid", "", str(job)], now=0.0)
    assert list(heard.pending) == [job]
    dying = _child(1, job)
    dying.kill_reason = LEASE_LOST
    assert heard.match([dying], now=0.0) is False


def test_a_flood_of_notifications_keeps_at_most_kept_max_ids_the_newest() -> None:
    from brooq.supervisor import cancels

    heard = CancelsHeard(keep=10.0)
    flood = [uuid.uuid4() for _ in range(cancels.KEPT_MAX + 5)]
    heard.heard([str(j) for j in flood], now=0.0)
    assert len(heard.pending) == cancels.KEPT_MAX
    assert flood[0] not in heard.pending and flood[-1] in heard.pending
    # The newest is still matched to the child holding it.
    assert heard.match([_child(1, flood[-1])], now=0.1) is True
