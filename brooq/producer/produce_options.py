"""The insert steps of a job with a unique_key, debounce or tags (brooq.job_options), for
brooq.producer.produce's drivers; a plain job never comes here.

- A unique_key (or tags) without debounce: one INSERT ... ON CONFLICT DO NOTHING (any
  unique index: the idempotency key's or job_unique_key_idx), then, when nothing was
  inserted, the id of the job holding the key; tried again if that job ended meanwhile.
- debounce: one statement, job_debounce, whose id tells what it did: the new id when it
  inserted a job, the existing one's when that job took the payload. It answers nothing
  when a producer racing it inserted first, and is then run again.
- A batch: the keys and tags go into job_insert_many_options' arrays; the jobs that
  conflicted are looked up by idempotency key, then by unique key.

Owns: these steps and their parameters.
Must never: do I/O (brooq.producer.produce's drivers do), or take the plain job's path's place.
"""

from __future__ import annotations

import uuid
from typing import Any

from brooq.errors import BrooqError
from brooq.job import Job
from brooq.producer.produce_steps import KEY_ROUNDS, Keyed, KeyedId, One, Steps, tags_literal
from brooq.sql import Queries


def insert_with_options(
    job: Job, params: dict[str, Any], q: Queries
) -> Steps[tuple[uuid.UUID, bool]]:
    """One job with options; ``params`` are job_insert's (a fresh id among them)."""
    params = {
        **params,
        "unique_key": job.unique_key,
        "tags": list(job.tags) if job.tags is not None else None,
    }
    if job.debounce is not None:
        params["debounce"] = job.debounce
        for _ in range(KEY_ROUNDS):
            got = yield One(q.job_debounce, params)
            if got is not None:
                return got, got == params["id"]
        raise BrooqError(
            f"could not enqueue {job.topic!r} with unique_key {job.unique_key!r}: other "
            "producers of the key kept winning the race; enqueue it again"
        )
    for _ in range(KEY_ROUNDS):
        statement = (
            q.job_insert_options if "traceparent" not in params else q.job_insert_options_traced
        )
        inserted = yield One(statement, params)
        if inserted is not None:
            return inserted, True
        if job.idempotency_key is not None:
            existing = yield One(
                q.job_get_id_by_key, {"topic": job.topic, "key": job.idempotency_key}
            )
            if existing is not None:
                return existing, False
        if job.unique_key is not None:
            existing = yield One(
                q.job_get_id_by_unique_key, {"topic": job.topic, "key": job.unique_key}
            )
            if existing is not None:
                return existing, False
    key = job.unique_key if job.unique_key is not None else job.idempotency_key
    raise BrooqError(
        f"could not enqueue {job.topic!r} with key {key!r}: the conflicting job kept "
        "ending or disappearing (is the caller's transaction REPEATABLE READ or SERIALIZABLE?)"
    )


def many_params(params: dict[str, Any], checked: list[Job]) -> dict[str, Any]:
    """job_insert_many's arrays, and the unique keys and tags of job_insert_many_options."""
    return {
        **params,
        "unique_keys": [j.unique_key for j in checked],
        "tags": [tags_literal(j.tags) for j in checked],
    }


def key_holders(
    checked: list[Job], missing: list[int], q: Queries
) -> Steps[dict[int, uuid.UUID | None]]:
    """The job holding the key of each job of ``missing`` (indexes into ``checked``), or
    None when none does any more: by idempotency key first, then by unique key (a waiting
    debounced job before the key's active one)."""
    found: dict[int, uuid.UUID | None] = dict.fromkeys(missing)
    by_idempotency = [i for i in missing if checked[i].idempotency_key is not None]
    if by_idempotency:
        rows: list[KeyedId] = yield Keyed(
            q.job_get_ids_by_keys,
            {
                "topics": [checked[i].topic for i in by_idempotency],
                "keys": [checked[i].idempotency_key for i in by_idempotency],
            },
        )
        existing = {(row.topic, row.key): row.id for row in rows}
        for i in by_idempotency:
            found[i] = existing.get((checked[i].topic, checked[i].idempotency_key))
    by_unique = [i for i in missing if found[i] is None and checked[i].unique_key is not None]
    if by_unique:
        rows = yield Keyed(
            q.job_get_ids_by_unique_keys,
            {
                "topics": [checked[i].topic for i in by_unique],
                "keys": [checked[i].unique_key for i in by_unique],
            },
        )
        active: dict[tuple[str, str | None], uuid.UUID] = {}
        for row in rows:  # the waiting job of a key comes first
            active.setdefault((row.topic, row.key), row.id)
        for i in by_unique:
            found[i] = active.get((checked[i].topic, checked[i].unique_key))
    return found
