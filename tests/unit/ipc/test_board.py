"""The board (brooq.ipc.board): what a child posts, read across a fork; slots of an async child."""

from __future__ import annotations

import uuid

from brooq.ipc.board import Board, Running

# -- the board (shared memory between a child and the master) ----------------------------


def test_board_shows_what_the_child_posted_across_a_fork() -> None:
    import os
    import uuid

    from brooq.ipc.board import Board, Running

    board = Board()
    assert board.read() is None  # a new board: idle
    job = Running(
        id=uuid.uuid4(),
        topic="mail.send",
        attempt=3,
        started=12.5,
        max_execution_timeout=60.0,
    )
    pid = os.fork()
    if pid == 0:  # the child writes; the parent reads after it is gone
        board.post_running(job)
        os._exit(0)
    os.waitpid(pid, 0)
    assert board.read() == job
    board.clear()
    assert board.read() is None
    board.close()


def test_board_keeps_a_long_topic_readable() -> None:
    import uuid

    from brooq.ipc.board import Board, Running

    board = Board()
    topic = "t" * 128
    job = Running(uuid.uuid4(), topic, 1, 0.0, 1.0)
    board.post_running(job)
    assert board.read() == job
    board.close()


def test_board_read_waits_out_a_write_in_progress() -> None:
    # A reader that finds the sequence odd (a write under way) reads again; when the
    # writer never finishes (killed mid-write) it takes what is there.
    import struct
    import uuid

    from brooq.ipc.board import Board, Running

    board = Board()
    job = Running(uuid.uuid4(), "a", 1, 1.0, 2.0)
    board.post_running(job)
    struct.pack_into("<Q", board._mem, 0, 3)  # odd: as if a writer stopped half-way
    assert board.read() == job
    board.close()


def running(n: int, started: float = 100.0, hard: float = 300.0, soft: float = 60.0) -> Running:
    return Running(uuid.UUID(int=n), f"t{n}", 1, started, hard, soft)


# -- the board -----------------------------------------------------------------------------


def test_a_board_of_many_slots_shows_every_job_and_each_slot_changes_alone() -> None:
    board = Board(100)
    assert board.read_all() == () and board.loop_beat() == 0.0 and board.culprit() is None
    jobs = [running(n) for n in range(1, 6)]
    for slot, job in zip((0, 7, 42, 98, 99), jobs, strict=True):
        board.post_running(job, slot)
    assert board.read_all() == tuple(jobs)
    board.clear(42)
    assert board.read_all() == (jobs[0], jobs[1], jobs[3], jobs[4])
    assert board.read() == jobs[0]  # the first slot: a sync child's job
    board.beat(123.5)
    board.set_culprit(jobs[1].id, 123.5)
    assert board.loop_beat() == 123.5 and board.culprit() == (jobs[1].id, 123.5)
    board.set_culprit(None, 0.0)
    assert board.culprit() is None
    board.hooks_running(True)
    assert board.in_hooks() and board.read_all() == (jobs[0], jobs[1], jobs[3], jobs[4])
    board.close()


def test_a_sync_board_keeps_one_slot_and_one_page() -> None:
    board = Board()
    assert board.capacity == 1 and len(board._mem) == 4096
    job = running(1)
    board.post_running(job)
    assert board.read_all() == (job,) and board.read() == job
    board.clear()
    assert board.read_all() == () and board.read() is None
    board.close()


def test_a_post_and_a_clear_write_the_slot_the_master_reads() -> None:
    """The bytes of a post are the job's fields in the slot's layout (its id as
    UUID.bytes), a clear leaves the body all zeros, and each write moves the slot's
    sequence on by two (odd while it is written)."""
    from brooq.ipc import board as board_mod

    board = Board(2)
    job = uuid.uuid4()
    at = board_mod._SLOTS_AT + board_mod._SLOT  # slot 1
    body = at + board_mod._SEQ.size
    board.post(job, "t.x", 3, 12.5, 300.0, 60.0, slot=1)
    assert board._mem[body : body + 16] == job.bytes
    assert board_mod._BODY.unpack_from(board._mem, body)[1:6] == (12.5, 300.0, 60.0, 3, 3)
    assert board_mod._SEQ.unpack_from(board._mem, at) == (2,)
    board.clear(1)
    assert board._mem[body : body + board_mod._BODY.size] == bytes(board_mod._BODY.size)
    assert board_mod._SEQ.unpack_from(board._mem, at) == (4,)
    assert board.read_all() == ()
    board.close()
