"""What a child says on its pipe, as the master reads it (brooq.supervisor.childmessages):
the held lists (the child's own form read whole, any other id by id), what left them
while a renewal watched, and lines it cannot read."""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator

import pytest

from brooq.ipc import protocol
from brooq.supervisor.childmessages import canonical_held, parse_job_id, read_messages
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
    assert c.held == [a, b] and c.held_ids == [str(a), str(b)] and c.progress_at == 1.0
    _say(w, {"held": [str(a), str(d)]})
    read_messages(c, 2.0)
    assert c.held == [a, d] and c.dropped == set()  # nobody watches: not noted
    c.watching_drops = True  # as Renewal does while its statement runs
    _say(w, {"held": [str(d)]}, {"held": [str(a), str(d)]}, {"held": []})
    read_messages(c, 3.0)
    assert c.held == [] and c.held_ids == [] and c.dropped == {a, d}


def test_the_childs_own_form_is_read_whole_and_any_other_id_by_id(
    child: tuple[ChildProc, int],
) -> None:
    c, w = child
    ids = [uuid.uuid4() for _ in range(300)]
    line = protocol.encode({"held": [str(i) for i in ids]}).rstrip(b"\n")
    assert canonical_held(line) == [str(i) for i in ids]
    assert canonical_held(b'{"held":[]}') == []
    other_forms = [
        line.replace(b"a", b"A"),  # uppercase digits
        line.replace(b",", b", "),  # spaces
        line[:-3] + b'",]}',  # a trailing comma
        line.replace(b"-", b"", 1),  # an id without a dash
        b'{"held":["' + str(ids[0]).encode() + b'"],"x":1}',
        b'{"held":["' + str(ids[0]).encode() + b'"]} ',
    ]
    for form in other_forms:
        assert canonical_held(form) is None
    # Read id by id, as uuid.UUID reads them, and kept in the canonical text.
    _say(w, json.dumps({"held": [str(ids[0]).upper(), str(ids[1])]}, indent=1).replace("\n", ""))
    read_messages(c, 1.0)
    assert c.held_ids == [str(ids[0]), str(ids[1])] and c.held == ids[:2]


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
