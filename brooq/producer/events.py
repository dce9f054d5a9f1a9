"""Events a durable handler waits for (``claim.wait_event``): emitting one, in the caller's
transaction or through a Queue.

An event is a key and a payload (JSON). The first emit of a key wins: it is stored, and
every job waiting on the key is made pending in the same transaction (a rollback releases
nothing); later emits change nothing and answer False. An event emitted before anyone
waits is kept, so a later wait returns its payload at once (brooq_emit_event, migration
0017, serialises the emits and parks of one key under a transaction-scoped advisory lock:
held until the caller's commit).

Owns: ``emit_event`` and ``emit_event_async`` (``brooq.emit_event``; Queue.emit_event and
emit_event_async call them), and ``check_key``, the rule of an event's key (the durable
backend checks a wait's key with it).
Must never: commit, roll back or change the caller's connection (brooq.producer.targets).
"""

from __future__ import annotations

from typing import Any, Final

import psycopg

from brooq.encoding import check_payload_size, encode_payload, to_json
from brooq.errors import InvalidPayload
from brooq.job import DEFAULT_MAX_PAYLOAD_BYTES
from brooq.producer.targets import AnyTarget, AsyncTarget, async_cursor, cursor, resolve_target
from brooq.sql import queries

__all__ = ["KEY_MAX_LENGTH", "check_key", "emit_event", "emit_event_async"]

KEY_MAX_LENGTH: Final = 1024


def check_key(key: object) -> str:
    """``key`` if it can name an event, else a ValueError saying why."""
    if not isinstance(key, str):
        raise ValueError(f"an event's key must be a string, not {type(key).__name__}")
    if not key:
        raise ValueError("an event's key must not be empty")
    if "\x00" in key:
        raise ValueError("an event's key contains the character \\x00")
    if len(key) > KEY_MAX_LENGTH:
        raise ValueError(
            f"an event's key is {len(key)} characters long; the limit is {KEY_MAX_LENGTH}"
        )
    return key


def _params(key: object, payload: Any, max_payload_bytes: int) -> dict[str, Any]:
    text = encode_payload(to_json(payload), "the event's payload", InvalidPayload)
    check_payload_size(text, max_payload_bytes, "the event's payload", InvalidPayload)
    return {"key": check_key(key), "payload": text}


def emit_event(
    target: AnyTarget,
    key: str,
    payload: Any = None,
    *,
    max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
    schema: str | None = None,
) -> bool:
    """Emit the event ``key`` with ``payload`` in the caller's transaction (the targets
    brooq.enqueue takes); whether this emit was the first under ``key`` (the one waiters
    get). A rollback releases nothing; the commit wakes the jobs waiting on it."""
    params = _params(key, payload, max_payload_bytes)
    if not isinstance(target, psycopg.Connection | psycopg.Cursor):
        target = resolve_target(target, "brooq.emit_event")
    return bool(cursor(target).execute(queries(schema).event_emit, params).fetchone())


async def emit_event_async(
    target: AsyncTarget,
    key: str,
    payload: Any = None,
    *,
    max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
    schema: str | None = None,
) -> bool:
    """``emit_event`` for a psycopg AsyncConnection or AsyncCursor."""
    params = _params(key, payload, max_payload_bytes)
    cur = async_cursor(target)
    await cur.execute(queries(schema).event_emit, params)
    return bool(await cur.fetchone())
