"""The fleet (brooq.supervisor.fleet): lease-lost notes belong to one run of a job."""

from __future__ import annotations

import uuid
from typing import Any

from brooq.supervisor.respawn import CrashStreak


def test_lease_lost_notes_belong_to_one_run_of_a_job() -> None:
    """A job canceled, retried and claimed again by the same child is a new run: the
    master's note that the first run's lease was lost must not follow it (the watchdog
    would kill the child for running the new claim), even when the master never read
    the board empty in between."""
    from types import SimpleNamespace

    from brooq.ipc.board import Board
    from brooq.ipc.protocol import LineReader
    from brooq.supervisor.childproc import ChildProc
    from brooq.supervisor.fleet import Fleet

    job = uuid.uuid4()
    board = Board()
    child = ChildProc(1, "c", 0, -1, LineReader(-1), "", 0.0, board=board)
    fleet: Any = SimpleNamespace(children={1: child}, crashes=CrashStreak())
    board.post(job, "t", 1, 10.0, 60.0, 30.0)
    Fleet.read_boards(fleet)
    child.lease_lost[job] = 11.0
    board.post(job, "t", 1, 10.0, 60.0, 30.0)  # the same run: the note stays
    Fleet.read_boards(fleet)
    assert job in child.lease_lost
    board.post(job, "t", 1, 12.0, 60.0, 30.0)  # claimed again: a new run
    Fleet.read_boards(fleet)
    assert child.lease_lost == {}
    board.close()
