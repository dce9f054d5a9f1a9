"""brooq.page.bulk: the helper says it has ended before its client can ask again, so a
second bulk action sent as soon as the first was answered is taken, not refused."""

from __future__ import annotations

import os
import select
import socket
import time

import pytest

from brooq.page.bulk import Bulk


def test_a_second_bulk_action_right_after_the_first_answer_is_taken(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real_exit = os._exit

    def lingering_exit(code: int) -> None:  # the helper, slow to go once it has answered
        time.sleep(1.0)
        real_exit(code)

    monkeypatch.setattr(os, "_exit", lingering_exit)
    bulk = Bulk()
    master_r, master_w = os.pipe()  # stands for the page process's socket to the master
    bulk.master_fd = master_w
    ours, theirs = socket.socketpair()
    try:
        assert bulk.start(theirs, lambda: b"first done") is None
        theirs.close()
        assert ours.recv(100) == b"first done"
        helper = bulk.helper
        assert helper is not None
        # The page process's loop looks at the helper's pipe: already readable, though the
        # helper has not exited (it lingers a second).
        readable, _, _ = select.select([helper.fd], [], [], 0)
        assert readable == [helper.fd]
        assert os.waitpid(helper.pid, os.WNOHANG) == (0, 0)
        bulk.ended()
        assert bulk.exiting == [helper] and bulk.fds() == [helper.fd]
        second_ours, second_theirs = socket.socketpair()
        try:
            assert bulk.start(second_theirs, lambda: b"second done") is None  # not a 503
            second_theirs.close()
            assert second_ours.recv(100) == b"second done"
        finally:
            second_ours.close()
        # The first helper's pipe ends when it exits (a second later): the loop reaps it.
        deadline = time.monotonic() + 10
        while helper in bulk.exiting:
            assert time.monotonic() < deadline, "the first helper was not reaped"
            readable, _, _ = select.select(bulk.fds(), [], [], 0.5)
            bulk.reap(readable)
        with pytest.raises(ChildProcessError):
            os.waitpid(helper.pid, os.WNOHANG)  # reaped: no zombie left
    finally:
        ours.close()
        bulk.stop()  # kills and reaps both helpers
        os.close(master_r)
        os.close(master_w)
    assert bulk.exiting == [] and bulk.helper is None
