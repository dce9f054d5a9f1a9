"""claim.progress: its checks, and the board slot that carries a report to the master."""

from __future__ import annotations

import uuid
from datetime import datetime, timezone

import pytest

import brooq
from brooq.ipc import progress
from brooq.ipc.board import Board


def _claim(attempt: int = 1) -> brooq.Claim:
    return brooq.Claim(
        id=uuid.uuid4(),
        topic="t",
        payload={},
        attempt=attempt,
        locked_by="w",
        locked_until=datetime.now(timezone.utc),
    )


@pytest.mark.parametrize(
    ("fraction", "message", "words"),
    [
        (1.5, "", "progress fraction must be from 0 to 1, got 1.5"),
        (-0.1, "", "progress fraction must be from 0 to 1, got -0.1"),
        (float("nan"), "", "progress fraction must be from 0 to 1, got nan"),
        ("0.5", "", "progress fraction must be a number from 0 to 1, got str"),
        (True, "", "progress fraction must be a number from 0 to 1, got bool"),
        (0.5, 3, "progress message must be a str, got int"),
        (0.5, "x" * 201, "progress message is 201 characters long, at most 200"),
        (0.5, "a\x00b", "progress message must not contain NUL characters"),
    ],
)
def test_bad_progress_is_refused_naming_what(fraction: object, message: object, words: str) -> None:
    claim = _claim()
    with pytest.raises(ValueError) as refused:
        claim.progress(fraction, message)  # type: ignore[arg-type]
    assert str(refused.value) == words
    assert claim.reported is None  # nothing kept


def test_a_report_without_a_child_stays_on_the_claim() -> None:
    claim = _claim()
    claim.progress(0, "starting")
    claim.progress(1, "x" * 200)
    assert claim.reported == (1.0, "x" * 200)


def test_the_board_carries_the_running_claims_report_only() -> None:
    board = Board(capacity=3)
    a, b = uuid.uuid4(), uuid.uuid4()
    board.post(a, "t", 2, 1.0, 60.0, 30.0, slot=0)
    board.post(b, "t", 1, 1.0, 60.0, 30.0, slot=2)
    assert board.progresses() == {}  # nothing reported yet
    assert board.reports() == 0
    assert board.progress(b, 0.5, "résumé 1/2".encode())
    assert not board.progress(uuid.uuid4(), 0.5, b"")  # no slot runs it: not counted
    assert board.reports() == 1
    assert board.progresses() == {b: (1, 0.5, "résumé 1/2")}
    board.progress(b, 0.75, b"x" * 800)
    assert board.reports() == 2
    assert board.progresses() == {b: (1, 0.75, "x" * 800)}
    # The same job's next attempt in that slot, or another job there: the old report is
    # not theirs.
    board.post(b, "t", 2, 2.0, 60.0, 30.0, slot=2)
    assert board.progresses() == {}
    board.progress(b, 0.1, b"again")
    assert board.progresses() == {b: (2, 0.1, "again")}
    # The same attempt claimed again (a refunded attempt, a durable job resumed): a new
    # post, so the earlier claim's report is not its own.
    board.post(b, "t", 2, 3.0, 60.0, 30.0, slot=2)
    assert board.progresses() == {}
    board.clear(2)
    assert board.progresses() == {}
    assert not board.progress(b, 0.2, b"gone")  # its slot is empty: nothing written
    # Claimed again into another slot: found there, not in the slot it last reported from.
    board.post(b, "t", 3, 4.0, 60.0, 30.0, slot=1)
    assert board.progress(b, 0.3, b"moved")
    assert board.progresses() == {b: (3, 0.3, "moved")}
    assert board.read_all()[0].id == a  # the job fields beside it are untouched
    board.close()


def test_the_displayed_text() -> None:
    assert progress.text(None, None) == "-"
    assert progress.text(0.4, "resizing") == "40% resizing"
    assert progress.text(1.0, "") == "100%"
