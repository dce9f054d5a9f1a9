"""Job ids: UUIDv7 (RFC 9562), made by the producer.

The claim orders ready jobs by (available_at, id). Jobs enqueued together share their
available_at, so the id breaks the tie: time-ordered ids make that tie-break the enqueue
order (invariant 10), and keep the primary-key index growing at its right edge. Within
one process the ids are strictly increasing (a 12-bit counter in rand_a, RFC 9562's
"method 1"); across processes they are ordered by millisecond.
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
    global _last_ms, _sequence
    with _lock:
        ms = time.time_ns() // 1_000_000
        if ms > _last_ms:
            _last_ms = ms
            _sequence = int.from_bytes(os.urandom(2), "big") & 0x3FF  # leave room to count
        else:
            _sequence += 1
            if _sequence > 0xFFF:  # 4096 ids in one millisecond: borrow the next one
                _last_ms += 1
                _sequence = 0
        ms, sequence = _last_ms, _sequence
    rand_b = int.from_bytes(os.urandom(8), "big") & ((1 << 62) - 1)
    value = (ms << 80) | (0x7 << 76) | (sequence << 64) | (0b10 << 62) | rand_b
    return uuid.UUID(int=value)
