"""Job ids: UUIDv7 (RFC 9562), made by the producer.

The claim orders ready jobs by (available_at, id). Jobs enqueued together share their
available_at, so the id breaks the tie: time-ordered ids make that tie-break the enqueue
order (the FIFO promise: by readiness, ties in enqueue order), and keep the primary-key
index growing at its right edge. Within one process the ids are strictly increasing (a
12-bit counter in rand_a, RFC 9562's "method 1"); across processes they are ordered by
millisecond.

The random bits come from the operating system's CSPRNG (os.urandom), read 4 KiB at a
time rather than once per id: a single enqueue makes one id per call, and a system call
per id was a measurable part of its Python time. The buffer is dropped in a fork's
child, so parent and child never hand out the same bytes (their counters are copies).
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections.abc import Callable

_lock = threading.Lock()
_last_ms = 0
_sequence = 0
_RANDOM_CHUNK = 4096
_random = b""
_random_at = 0


def uuid7() -> uuid.UUID:
    """One UUIDv7 (one lock, no list)."""
    return uuid_from_int(uuid7_int())


def uuid7_int() -> int:
    """One UUIDv7 as its 128-bit integer (the enqueue line sends its bytes)."""
    with _lock:
        ms, sequence = _tick()
        rand_b = _random_int(8) & _RAND_B_MASK
    return (ms << 80) | _VERSION | (sequence << 64) | _VARIANT | rand_b


def uuid7_many(n: int) -> list[uuid.UUID]:
    """n increasing UUIDv7s: one lock and one read of the random source for all, and one
    read of the clock per run of ids that share a millisecond (each run as long as the
    counter allows: a batch is made faster than the clock moves)."""
    global _sequence
    # The random bits as native 64-bit integers in one C loop: any byte order is as random.
    randoms = memoryview(os.urandom(8 * n)).cast("Q")
    make, mask, version_variant = uuid_from_int, _RAND_B_MASK, _VERSION | _VARIANT
    out: list[uuid.UUID] = []
    with _lock:
        done = 0
        while done < n:
            ms, first = _tick()
            run = min(n - done, _SEQUENCE_MAX + 1 - first)
            base = (ms << 80) | version_variant | (first << 64)
            out.extend(
                [
                    make((base + (k << 64)) | (r & mask))
                    for k, r in enumerate(randoms[done : done + run])
                ]
            )
            _sequence = first + run - 1  # the next _tick counts on from the last one made
            done += run
    return out


def _tick() -> tuple[int, int]:
    """The next id's (millisecond, counter); called holding _lock."""
    global _last_ms, _sequence
    ms = time.time_ns() // 1_000_000
    if ms > _last_ms:
        _last_ms = ms
        _sequence = _random_int(2) & 0x3FF  # room to count
    else:
        _sequence += 1
        if _sequence > _SEQUENCE_MAX:  # 4096 ids in one millisecond: borrow the next one
            _last_ms += 1
            _sequence = 0
    return _last_ms, _sequence


def _random_int(size: int) -> int:
    """``size`` fresh random bytes as an int, from the buffer; called holding _lock."""
    global _random, _random_at
    at = _random_at
    if at + size > len(_random):
        _random, at = os.urandom(_RANDOM_CHUNK), 0
    _random_at = at + size
    return int.from_bytes(_random[at : at + size], "big")


def _forget_in_child() -> None:
    """A fork's child: new random bytes (the buffer is the parent's) and a new lock (a
    thread of the parent's may have held it; that thread does not exist here)."""
    global _random, _random_at, _lock
    _random, _random_at = b"", 0
    _lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_in_child)


def _construct(value: int) -> uuid.UUID:
    return uuid.UUID(int=value)


# Read once: an enum member's attribute lookup goes through enum's descriptor, a
# microsecond per id on Python 3.11.
_UNKNOWN_SAFETY = uuid.SafeUUID.unknown
_new = object.__new__
_set = object.__setattr__


def _assemble(value: int) -> uuid.UUID:
    """uuid.UUID(int=value) without the constructor's checks (the value is built above
    and in range): the two slot writes its __init__ ends with."""
    made = _new(uuid.UUID)
    _set(made, "int", value)
    _set(made, "is_safe", _UNKNOWN_SAFETY)
    return made


def _pick_constructor() -> Callable[[int], uuid.UUID]:
    """_assemble where it makes exactly what the constructor makes (checked once, here),
    else the constructor: another Python's UUID may keep other slots."""
    probe = (0x0123456789ABCDEF << 64) | 0xFEDCBA9876543210
    try:
        fast, slow = _assemble(probe), uuid.UUID(int=probe)
        same = (
            fast == slow
            and hash(fast) == hash(slow)
            and str(fast) == str(slow)
            and fast.is_safe == slow.is_safe
            and fast.bytes == slow.bytes
        )
    except (AttributeError, TypeError):
        same = False
    return _assemble if same else _construct


uuid_from_int = _pick_constructor()


def uuid_text(value: int) -> str:
    """``str(uuid.UUID(int=value))`` without a UUID and its method calls: the form the
    job_done lines and the held lists carry, made once per job a child claims."""
    h = f"{value:032x}"
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


_RAND_B_MASK = (1 << 62) - 1
_SEQUENCE_MAX = 0xFFF  # rand_a: 12 bits
_VERSION = 0x7 << 76
_VARIANT = 0b10 << 62
