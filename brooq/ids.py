"""Job ids: UUIDv7 (RFC 9562), made by the producer.

The claim orders ready jobs by (available_at, id). Jobs enqueued together share their
available_at, so the id breaks the tie: time-ordered ids make that tie-break the enqueue
order (the FIFO promise: by readiness, ties in enqueue order), and keep the primary-key
index growing at its right edge. Within one process the ids are strictly increasing (a
12-bit counter in rand_a, RFC 9562's "method 1"); across processes they are ordered by
millisecond.
"""

from __future__ import annotations

import os
import threading
import time
import uuid

_lock = threading.Lock()
_last_ms = 0
_sequence = 0


def uuid7() -> uuid.UUID:
    """One UUIDv7 (Queue.enqueue's: one read of the random source, no list)."""
    rand_b = int.from_bytes(os.urandom(8), "big") & _RAND_B_MASK
    with _lock:
        ms, sequence = _tick()
    return uuid.UUID(int=(ms << 80) | _VERSION | (sequence << 64) | _VARIANT | rand_b)


def uuid7_many(n: int) -> list[uuid.UUID]:
    """n increasing UUIDv7s: one lock and one read of the random source for all."""
    random = os.urandom(8 * n)
    out = []
    with _lock:
        for i in range(n):
            ms, sequence = _tick()
            rand_b = int.from_bytes(random[8 * i : 8 * i + 8], "big") & _RAND_B_MASK
            out.append(uuid.UUID(int=(ms << 80) | _VERSION | (sequence << 64) | _VARIANT | rand_b))
    return out


def _tick() -> tuple[int, int]:
    """The next id's (millisecond, counter); called holding _lock."""
    global _last_ms, _sequence
    ms = time.time_ns() // 1_000_000
    if ms > _last_ms:
        _last_ms = ms
        _sequence = int.from_bytes(os.urandom(2), "big") & 0x3FF  # room to count
    else:
        _sequence += 1
        if _sequence > 0xFFF:  # 4096 ids in one millisecond: borrow the next one
            _last_ms += 1
            _sequence = 0
    return _last_ms, _sequence


_RAND_B_MASK = (1 << 62) - 1
_VERSION = 0x7 << 76
_VARIANT = 0b10 << 62
