"""brooq.ids: UUIDv7 as RFC 9562 lays it out, strictly increasing within a process."""

from __future__ import annotations

import time
import uuid

import pytest

from brooq import ids


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
