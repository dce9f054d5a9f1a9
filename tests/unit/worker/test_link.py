"""The child's side of its pipe to the master (brooq.worker.link): the held list told when it
changes, and the ids' text made once for it and the job_done lines."""

from __future__ import annotations

import json
import os
import uuid

from brooq.settings import Settings
from brooq.worker.link import MasterLink
from brooq.worker.state import ChildState


def _told(fd: int) -> list[dict[str, object]]:
    try:
        data = os.read(fd, 1 << 20)
    except BlockingIOError:
        return []
    return [json.loads(line) for line in data.splitlines()]


def test_the_held_list_is_told_when_it_changes_and_names_each_job_by_its_text() -> None:
    to_r, to_w = os.pipe()
    from_r, from_w = os.pipe()
    os.set_blocking(to_r, False)
    link = MasterLink(to_w, from_r, Settings(), ChildState())
    try:
        a, b, c = (uuid.uuid4() for _ in range(3))
        link.tell_held([a, b])
        assert _told(to_r) == [{"held": [str(a), str(b)]}]
        link.tell_held([a, b])  # the same: nothing told
        link.tell_held([uuid.UUID(str(a)), uuid.UUID(str(b))])  # equal ids, other objects
        assert _told(to_r) == []
        assert (link.text_of(a), link.text_of(b)) == (str(a), str(b))
        link.tell_held([b, c])
        assert _told(to_r) == [{"held": [str(b), str(c)]}]
        assert link.text_of(a) == str(a)  # no longer held: made again, the same
        link.tell_held([c, b])  # the order changed: told
        link.tell_held([])
        assert _told(to_r) == [{"held": [str(c), str(b)]}, {"held": []}]
    finally:
        for fd in (to_r, to_w, from_r, from_w):
            os.close(fd)
