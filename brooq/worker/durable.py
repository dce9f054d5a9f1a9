"""The durable operations of a handler (``claim.step``, ``sleep``, ``sleep_until``,
``wait_event``, ``spawn``, ``wait_jobs``): what they read and write, on a connection of
this backend's own.

The model: a handler runs again from its first line on every attempt; what it wraps in a
step is recorded (the job's JSON encoder) in its own committed transaction when the step
ends, guarded by the lease (still processing, still held by this child), and a later
attempt gets the record back instead of running the step. A sleep, an event wait and a
wait for child jobs are steps of brooq's own (names starting ``__``) plus a park: the job
is made pending or waiting with its attempt given back and nothing held, then ``Parked``
ends the attempt (brooq.worker.execute maps it to an outcome that writes nothing).

Owns: ``Durable``, set as ``Claim.durable`` once per process after the fork
(brooq.worker.process, brooq.testing's drain); its connections, one per thread, opened at
the first durable operation (a handler that uses none opens none) and again after one
broke; the per-attempt cache of recorded steps (on the Claim: one read per attempt).
Must never: use the child's claim connection, add work to the claim or outcome path, or
write without the lease guard.
"""

from __future__ import annotations

import asyncio
import json
import threading
import uuid
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta, timezone
from typing import Any

import psycopg

from brooq.db import connect, connect_kwargs
from brooq.durations import to_seconds
from brooq.encoding import check_payload_size, encode_payload, to_json
from brooq.errors import InvalidResult, WaitTimeout
from brooq.job import ChildJob, Claim, Job, LeaseLost, Parked
from brooq.producer.events import check_key
from brooq.producer.insert import Handlers, check_jobs, insert_many_checked
from brooq.settings import Settings
from brooq.sql import queries

__all__ = ["Durable"]

_INTERNAL = "__"  # brooq's own step names start with it
DEADLOCK_TRIES = 5
NAME_MAX_LENGTH = 1024  # a step's name, with its job the record's key


def _now() -> datetime:
    return datetime.now(timezone.utc)


class Durable:
    """One process's backend of the durable operations."""

    def __init__(self, dsn: str, settings: Settings, handlers: Handlers) -> None:
        self.dsn = dsn
        self.q = queries(settings.schema)
        self.max_bytes = settings.max_payload_bytes
        self.handlers = handlers
        self.local = threading.local()  # an async child's sync handlers run in threads
        # Behind a transaction pooler: no prepared statements (brooq.db.connect_kwargs).
        self.kwargs = connect_kwargs(settings.pooler, dsn, {})

    # -- plumbing ----------------------------------------------------------------------------

    def _conn(self) -> psycopg.Connection[Any]:
        conn: psycopg.Connection[Any] | None = getattr(self.local, "conn", None)
        if conn is None or conn.closed or conn.broken:
            conn = connect(self.dsn, autocommit=True, **self.kwargs)
            self.local.conn = conn
        return conn

    def close(self) -> None:
        conn = getattr(self.local, "conn", None)
        if conn is not None and not conn.closed:
            conn.close()

    def _recorded(self, claim: Claim[Any]) -> dict[str, Any]:
        if claim.steps_recorded is None:
            rows = self._conn().execute(self.q.job_steps_read, {"id": claim.id}).fetchall()
            claim.steps_recorded = {name: result for name, result in rows}
        return claim.steps_recorded

    def _encode(self, name: str, value: Any) -> str:
        what = f"the result of step {name!r}"
        text = encode_payload(to_json(value), what, InvalidResult)
        check_payload_size(text, self.max_bytes, what, InvalidResult)
        return text

    def _record(
        self, conn: psycopg.Connection[Any], claim: Claim[Any], name: str, text: str
    ) -> None:
        """Write the record (in the caller's transaction, or alone in autocommit: one
        round trip); LeaseLost when the job is no longer this child's (the caller's
        transaction then rolls back)."""
        params = {"id": claim.id, "name": name, "result": text, "worker": claim.locked_by}
        if conn.execute(self.q.job_step_record, params).fetchone() is None:
            raise LeaseLost(f"lease of job {claim.id} lost: step {name!r} not recorded")

    def _internal(self, claim: Claim[Any], name: str, make: Callable[[], Any]) -> Any:
        """A step of brooq's own: its record, else ``make()`` recorded."""
        recorded = self._recorded(claim)
        if name in recorded:
            return recorded[name]
        text = self._encode(name, make())
        self._record(self._conn(), claim, name, text)  # one statement: its own transaction
        value = json.loads(text)
        recorded[name] = value
        return value

    def _awaited(self, claim: Claim[Any]) -> bool:
        """Whether the claim's handler is async: its operations return awaitables."""
        handler = self.handlers.get(claim.topic)
        return handler is not None and handler.is_async

    @staticmethod
    def _nth(claim: Claim[Any], kind: str) -> int:
        calls = claim.calls
        if calls is None:
            calls = claim.calls = {}
        n = calls.get(kind, 0)
        calls[kind] = n + 1
        return n

    @staticmethod
    def _used(claim: Claim[Any]) -> set[str]:
        """The step names this run of the handler used (made at its first step)."""
        used = claim.steps_used
        if used is None:
            used = claim.steps_used = set()
        return used

    # -- steps -------------------------------------------------------------------------------

    def step(
        self,
        claim: Claim[Any],
        name: str,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        transaction: bool,
    ) -> Any:
        if not isinstance(name, str) or not name:
            raise ValueError(f"a step's name must be a non-empty string, got {name!r}")
        if "\x00" in name or len(name) > NAME_MAX_LENGTH:
            shown = name[:40] + "…" if len(name) > 40 else name
            raise ValueError(f"step name {shown!r}: at most {NAME_MAX_LENGTH} characters, no \\x00")
        if name.startswith(_INTERNAL):
            raise ValueError(f"step name {name!r}: names starting with '__' are brooq's own")
        if not callable(fn):
            raise TypeError(f"step {name!r}: fn must be callable, not {type(fn).__name__}")
        if name in self._used(claim):
            raise ValueError(f"step name {name!r} is used twice in one run of the handler")
        # Used once it returned (replayed or recorded): a step that raised may be called
        # again under its name in the same run.
        if self._awaited(claim):
            return self._step_async(claim, name, fn, args, kwargs, transaction)
        recorded = self._recorded(claim)
        if name in recorded:
            self._used(claim).add(name)
            return recorded[name]
        if transaction:
            conn = self._conn()
            with conn.transaction():
                value = fn(conn, *args, **kwargs)
                text = self._encode(name, value)
                self._record(conn, claim, name, text)
        else:
            value = fn(*args, **kwargs)
            text = self._encode(name, value)
            # One statement in autocommit: its own transaction, one round trip.
            self._record(self._conn(), claim, name, text)
        result = json.loads(text)  # every attempt sees the same value: the record's
        recorded[name] = result
        self._used(claim).add(name)
        return result

    async def _step_async(
        self,
        claim: Claim[Any],
        name: str,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        transaction: bool,
    ) -> Any:
        """An async handler's step: the database work in a thread (this backend's
        connection of that thread), ``fn`` awaited when it is a coroutine function."""
        if transaction:
            raise ValueError(
                f"step {name!r}: transaction=True is for sync handlers (a step's fn runs "
                "on the recording transaction's connection, which is not an async one)"
            )
        recorded = await asyncio.to_thread(self._recorded, claim)
        if name in recorded:
            self._used(claim).add(name)
            return recorded[name]
        value = fn(*args, **kwargs)
        if isinstance(value, Awaitable):
            value = await value
        text = self._encode(name, value)

        def record() -> None:
            self._record(self._conn(), claim, name, text)

        await asyncio.to_thread(record)
        result = json.loads(text)
        recorded[name] = result
        self._used(claim).add(name)
        return result

    # -- sleeps ------------------------------------------------------------------------------

    def sleep(self, claim: Claim[Any], duration: timedelta | float | str) -> Any:
        seconds = to_seconds(duration)
        return self.sleep_until(claim, _now() + timedelta(seconds=seconds))

    def sleep_until(self, claim: Claim[Any], when: datetime) -> Any:
        name = f"__sleep:{self._nth(claim, 'sleep')}"
        if self._awaited(claim):
            return asyncio.to_thread(self._sleep, claim, name, when)
        return self._sleep(claim, name, when)

    def _sleep(self, claim: Claim[Any], name: str, when: datetime) -> None:
        wake = datetime.fromisoformat(
            self._internal(claim, name, lambda: when.astimezone(timezone.utc).isoformat())
        )
        if _now() >= wake:
            return
        params = {"id": claim.id, "worker": claim.locked_by, "until": wake}
        if self._conn().execute(self.q.job_park_sleep, params).fetchone() is None:
            raise LeaseLost(f"lease of job {claim.id} lost: not parked")
        raise Parked("sleep", until=wake)

    # -- events ------------------------------------------------------------------------------

    def wait_event(
        self, claim: Claim[Any], key: str, timeout: timedelta | float | str | None
    ) -> Any:
        check_key(key)
        seconds = None if timeout is None else to_seconds(timeout)
        if self._awaited(claim):
            return asyncio.to_thread(self._wait_event, claim, key, seconds)
        return self._wait_event(claim, key, seconds)

    def _wait_event(self, claim: Claim[Any], key: str, seconds: float | None) -> Any:
        name = f"__event:{key}"
        recorded = self._recorded(claim)
        if name in recorded:
            return recorded[name]
        deadline = None
        if seconds is not None:
            deadline = datetime.fromisoformat(
                self._internal(
                    claim,
                    f"__event_deadline:{key}",
                    lambda: (_now() + timedelta(seconds=seconds)).isoformat(),
                )
            )
        conn = self._conn()
        while True:
            row = conn.execute(self.q.event_read, {"key": key}).fetchone()
            if row is not None:
                payload = row[0]
                with conn.transaction():
                    self._record(conn, claim, name, json.dumps(payload))
                    conn.execute(self.q.event_wait_forget, {"id": claim.id})
                recorded[name] = payload
                return payload
            if deadline is not None and _now() >= deadline:
                conn.execute(self.q.event_wait_forget, {"id": claim.id})
                raise WaitTimeout(f"no event was emitted under key {key!r} by {deadline}")
            params = {"id": claim.id, "worker": claim.locked_by, "key": key, "until": deadline}
            parked = conn.execute(self.q.event_park, params).fetchone()
            if parked is None or parked[0] is None:
                raise LeaseLost(f"lease of job {claim.id} lost: not parked")
            if parked[0]:
                raise Parked("event", until=deadline, key=key)
            # emitted meanwhile: read it

    # -- child jobs --------------------------------------------------------------------------

    def spawn(self, claim: Claim[Any], job: Job) -> Any:
        name = f"__spawn:{self._nth(claim, 'spawn')}"
        if self._awaited(claim):
            return asyncio.to_thread(self._spawn, claim, name, job)
        return self._spawn(claim, name, job)

    def _spawn(self, claim: Claim[Any], name: str, job: Job) -> uuid.UUID:
        recorded = self._recorded(claim)
        if name in recorded:
            return uuid.UUID(recorded[name])
        checked = check_jobs([job], self.max_bytes, self.handlers)
        conn = self._conn()
        with conn.transaction():
            [(job_id, _)] = insert_many_checked(conn, checked, self.handlers, q=self.q)
            self._record(conn, claim, name, json.dumps(str(job_id)))
        recorded[name] = str(job_id)
        return job_id

    def wait_jobs(self, claim: Claim[Any], ids: list[uuid.UUID]) -> Any:
        name = f"__wait_jobs:{self._nth(claim, 'wait_jobs')}"
        if self._awaited(claim):
            return asyncio.to_thread(self._wait_jobs, claim, name, ids)
        return self._wait_jobs(claim, name, ids)

    def _wait_jobs(self, claim: Claim[Any], name: str, ids: list[uuid.UUID]) -> list[ChildJob]:
        recorded = self._recorded(claim)
        if name not in recorded:
            if not ids:
                return []
            conn = self._conn()
            params = {"id": claim.id, "worker": claim.locked_by, "ids": ids}
            for attempt in range(DEADLOCK_TRIES):
                try:
                    row = conn.execute(self.q.jobs_park, params).fetchone()
                    break
                except psycopg.errors.DeadlockDetected:
                    # The children are locked in id order, but a child's batch of `done`
                    # writes its rows in its own order: the statement (its own
                    # transaction) is run again, as brooq_job_after's callers do.
                    if attempt == DEADLOCK_TRIES - 1:
                        raise
            if row is None or row[0] is None:
                raise LeaseLost(f"lease of job {claim.id} lost: not parked")
            if row[0]:
                raise Parked("jobs")
            rows = conn.execute(self.q.jobs_records, {"ids": ids}).fetchall()
            by_id = {
                str(r[0]): {
                    "id": str(r[0]),
                    "topic": r[1],
                    "state": r[2],
                    "result": r[3],
                    "last_error": r[4],
                }
                for r in rows
            }
            records = [by_id[str(i)] for i in ids]
            self._internal(claim, name, lambda: records)
        return [
            ChildJob(
                id=uuid.UUID(r["id"]),
                topic=r["topic"],
                state=r["state"],
                result=r["result"],
                last_error=r["last_error"],
            )
            for r in recorded[name]
        ]
