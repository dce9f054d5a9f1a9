"""The steps of a batch holding jobs with ``after``: a graph created in one transaction.

The names are checked before any write: a Job named in ``after`` must be in the same
batch, an id must be a job's (one read); a job with ``after`` takes no ``unique_key``
(the key's promise counts pending, failed and processing jobs, not waiting ones). Then
the batch is inserted as any batch is (every job pending, ids made before the insert),
and one statement (job_after: migration 0013's brooq_job_after) writes the edges and
moves the jobs that wait to ``waiting``, all in the caller's transaction: nothing sees
a job of the graph before its edges.

Owns: ``insert_graph``. Must never: do I/O (brooq.produce drives the steps), or write
edges for a job that was not created (an idempotency key's earlier job keeps its own).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable

from brooq.errors import InvalidAfter
from brooq.job import Job
from brooq.produce_steps import All, One, Steps
from brooq.sql import Queries

Inserted = list[tuple[uuid.UUID, bool]]


def insert_graph(
    checked: list[Job], insert: Callable[[list[Job]], Steps[Inserted]], q: Queries
) -> Steps[Inserted]:
    """Insert ``checked`` through ``insert`` (the batch's own steps), then its edges."""
    index = {id(job): i for i, job in enumerate(checked)}
    named: list[uuid.UUID] = []
    for n, job in enumerate(checked):
        if job.after is None:
            continue
        if job.unique_key is not None:
            raise InvalidAfter(f"job {n}: after cannot be combined with unique_key or debounce")
        for item in job.after:
            if isinstance(item, uuid.UUID):
                named.append(item)
            elif id(item) not in index:
                raise InvalidAfter(
                    f"job {n}: after names a Job ({item.topic!r}) that is not in this "
                    "enqueue_many call: enqueue it in the same call, or name its id"
                )
    if named:
        present = set((yield All(q.job_ids_present, {"ids": named})))
        for job_id in named:
            if job_id not in present:
                raise InvalidAfter(f"after names job {job_id}, which does not exist")
    results = yield from insert(checked)
    jobs: list[uuid.UUID] = []
    policies: list[str] = []
    downs: list[uuid.UUID] = []
    ups: list[uuid.UUID] = []
    for (job_id, created), job in zip(results, checked, strict=True):
        if job.after is None or not created:
            continue
        jobs.append(job_id)
        policies.append(job.on_upstream_failure)
        seen: set[uuid.UUID] = set()
        for item in job.after:
            up = item if isinstance(item, uuid.UUID) else results[index[id(item)]][0]
            if up not in seen:
                seen.add(up)
                downs.append(job_id)
                ups.append(up)
    if jobs:
        yield One(
            q.job_after,
            {"jobs": jobs, "policies": policies, "downs": downs, "ups": ups},
        )
    return results
