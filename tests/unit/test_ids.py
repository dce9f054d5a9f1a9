"""brooq.producer.ids: UUIDv7 as RFC 9562 lays it out, strictly increasing within a process."""

from __future__ import annotations

import os
import pickle
import time
import uuid

import pytest

from brooq.producer import ids


def _ms(value: uuid.UUID) -> int:
    return value.int >> 80


def test_layout_version_variant_and_time() -> None:
    before = time.time_ns() // 1_000_000
    one = ids.uuid7()
    after = time.time_ns() // 1_000_000
    assert one.version == 7 and one.variant == uuid.RFC_4122
    assert before <= _ms(one) <= after


def test_single_and_batched_ids_interleaved_keep_increasing() -> None:
    made: list[uuid.UUID] = []
    for _ in range(200):
        made.append(ids.uuid7())
        made.extend(ids.uuid7_many(7))
    assert made == sorted(made) and len(set(made)) == len(made)
    assert all(v.version == 7 for v in made)


def test_more_than_the_counter_holds_in_one_millisecond_borrows_the_next(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    frozen = (time.time_ns() // 1_000_000 + 5) * 1_000_000  # just ahead of every id so far
    monkeypatch.setattr(time, "time_ns", lambda: frozen)
    made = [ids.uuid7() for _ in range(5000)]
    assert made == sorted(made) and len(set(made)) == 5000
    first = _ms(made[0])
    assert first == frozen // 1_000_000
    assert _ms(made[-1]) == first + 1  # 4096 - the random start fit in the first ms


def test_a_batch_larger_than_the_counter_borrows_milliseconds_in_order(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    frozen = (time.time_ns() // 1_000_000 + 100) * 1_000_000  # ahead of every id so far
    monkeypatch.setattr(time, "time_ns", lambda: frozen)
    made = ids.uuid7_many(10_000)
    assert made == sorted(made) and len(set(made)) == 10_000
    assert all(v.version == 7 and v.variant == uuid.RFC_4122 for v in made)
    first = frozen // 1_000_000
    spans = [_ms(v) for v in made]
    # Each millisecond's run counts its 12 bits up to 4095 before the next one is borrowed.
    assert spans[0] == first and spans[-1] == first + 2
    per_ms = {ms: spans.count(ms) for ms in set(spans)}
    assert per_ms[first + 1] == 4096
    after = ids.uuid7()  # a single id goes on from the batch's last
    assert after > made[-1] and _ms(after) == spans[-1]


def test_ids_are_uuids_like_the_constructor_makes() -> None:
    value = ids.uuid7_int()
    made = ids.uuid_from_int(value)
    reference = uuid.UUID(int=value)
    assert ids.uuid_from_int is ids._assemble  # CPython: the fast path is the one in use
    assert made == reference and hash(made) == hash(reference)
    assert str(made) == str(reference) and made.bytes == value.to_bytes(16, "big")
    assert made.is_safe == reference.is_safe and made.version == 7
    assert pickle.loads(pickle.dumps(made)) == reference
    assert {made: 1}[reference] == 1


def test_an_id_text_is_the_uuid_text() -> None:
    for value in (0, 1, 2**128 - 1, ids.uuid7_int(), uuid.uuid4().int):
        assert ids.uuid_text(value) == str(uuid.UUID(int=value))


def test_a_forked_child_draws_its_own_random_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    # One frozen millisecond: parent and child count alike from the state fork copied,
    # so only the random bits can tell their ids apart (the buffer must not be shared).
    frozen = (time.time_ns() // 1_000_000 + 50) * 1_000_000
    monkeypatch.setattr(time, "time_ns", lambda: frozen)
    ids.uuid7()  # the buffer holds unread random bytes now
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its ids, as hex, to the parent
        try:
            os.close(read)
            os.write(write, " ".join(ids.uuid7().hex for _ in range(20)).encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        theirs = set(pipe.read().split())
    os.waitpid(pid, 0)
    ours = {ids.uuid7().hex for _ in range(20)}
    assert len(theirs) == 20 and not ours & theirs
