"""What a child says on its pipe, as the master reads it (brooq.supervisor.childmessages):
the held lists, each id read once, what left them, and lines it cannot read."""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator

import pytest

from brooq.ipc import protocol
from brooq.supervisor.childmessages import parse_job_id, read_messages
from brooq.supervisor.childproc import ChildProc


def test_a_job_id_parses_as_uuid_does() -> None:
    for value in (uuid.uuid4(), uuid.UUID(int=0), uuid.UUID(int=2**128 - 1)):
        got = parse_job_id(str(value))
        assert got == value and hash(got) == hash(value) and str(got) == str(value)
        assert isinstance(got, uuid.UUID) and got.is_safe == uuid.SafeUUID.unknown


@pytest.mark.parametrize(
    "text",
    [
        "",
        "0" * 36,
        "0" * 32,
        "00000000-0000-0000-0000-00000000000g",
        "00000000-0000-0000-0000-0000000000_0",
        "00000000-0000-0000-0000-+00000000000",
        "00000000-0000-0000-0000- 00000000000",
        "00000000-0000-0000-0000-٣00000000000",  # a digit int() reads, not hex text
        "000000000-000-0000-0000-000000000000",
        "{00000000-0000-0000-0000-000000000000}",
    ],
)
def test_anything_else_is_refused(text: str) -> None:
    with pytest.raises(ValueError):
        parse_job_id(text)


@pytest.fixture
def child() -> Iterator[tuple[ChildProc, int]]:
    r, w = os.pipe()
    os.set_blocking(r, False)
    c = ChildProc(
        pid=1, identity="h:1:x", generation=1, to_child=-1, reader=protocol.LineReader(r),
        stack_file="", born=0.0,
    )  # fmt: skip
    try:
        yield c, w
    finally:
        os.close(r)
        os.close(w)


def _say(w: int, *messages: object) -> None:
    for m in messages:
        os.write(w, (m if isinstance(m, str) else json.dumps(m)).encode() + b"\n")


def test_held_lists_and_what_left_them(child: tuple[ChildProc, int]) -> None:
    c, w = child
    a, b, d = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    _say(w, {"held": [str(a), str(b)]})
    read_messages(c, 1.0)
    assert c.held == [a, b] and c.dropped == set() and c.progress_at == 1.0
    first_a = c.held[0]
    _say(w, {"held": [str(a), str(d)]})
    read_messages(c, 2.0)
    assert c.held == [a, d] and c.dropped == {b}
    assert c.held[0] is first_a  # read once, kept by its text
    _say(w, {"held": []})
    read_messages(c, 3.0)
    assert c.held == [] and c.dropped == {a, b, d}


@pytest.mark.parametrize(
    "bad",
    [
        {"held": ["not an id"]},
        {"held": [12]},
        {"held": [["x"]]},
        {"held": 5},
        "{not json",
    ],
)
def test_a_held_list_it_cannot_read_is_skipped(child: tuple[ChildProc, int], bad: object) -> None:
    c, w = child
    a = uuid.uuid4()
    _say(w, {"held": [str(a)]}, bad, {"ready": 1})
    read_messages(c, 1.0)
    assert c.held == [a] and c.ready  # the line skipped, the ones around it read
