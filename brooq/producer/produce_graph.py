"""The steps of a batch holding jobs with ``after``: a graph created in one transaction.

The names are checked before any write: ``after`` is checked again as the Job's
constructor checks it (it may have been assigned since), a Job named in ``after`` must be
in the same batch and no Job of the batch may wait for itself through others (a cycle
would wait for ever), an id must be a job's (one read); a job with ``after`` takes no
``unique_key`` (the key's promise counts pending, failed and processing jobs, not waiting
ones). Then the batch is inserted as any batch is (every job pending, ids made before the
insert), the jobs with ``after`` held (available_at HELD, so that the insert's trigger
wakes no child for a job that is to wait); one statement (job_after: migration 0013's
brooq_job_after) writes the edges and moves the jobs that wait to ``waiting``, and a
last one (job_after_release) gives them their available_at and wakes the children if
one of them is ready now. brooq.producer.produce_drive runs it all in one transaction: nothing
sees a job of the graph before its edges.

Owns: ``insert_graph``, the check for cycles. Must never: do I/O (brooq.producer.produce drives
the steps), or write edges for a job that was not created (an idempotency key's earlier
job keeps its own).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator, Sequence
from copy import copy as shallow_copy
from datetime import datetime, timezone
from typing import Any

from brooq.errors import InvalidAfter
from brooq.job import Job
from brooq.job_options import check_after
from brooq.producer.produce_steps import All, One, Steps
from brooq.sql import Queries

Inserted = list[tuple[uuid.UUID, bool]]

# What a job with after is inserted with, for the moment between its INSERT and its
# edges: not ready, so that the insert's trigger (brooq_job_notify) sends no NOTIFY for
# it. job_after_release writes its own available_at in the same transaction.
HELD = datetime(9999, 1, 1, tzinfo=timezone.utc)


def insert_graph(
    checked: list[Job], insert: Callable[[list[Job]], Steps[Inserted]], q: Queries
) -> Steps[Inserted]:
    """Insert ``checked`` through ``insert`` (the batch's own steps), then its edges."""
    index = {id(job): i for i, job in enumerate(checked)}
    afters: list[tuple[Any, ...] | None] = []
    named: list[uuid.UUID] = []
    for n, job in enumerate(checked):
        if job.after is None:
            afters.append(None)
            continue
        try:
            after = check_after(job.after, job.on_upstream_failure, Job)
        except InvalidAfter as exc:
            raise InvalidAfter(f"job {n}: {exc}") from None
        afters.append(after)
        if job.unique_key is not None:
            raise InvalidAfter(f"job {n}: after cannot be combined with unique_key or debounce")
        for item in after:
            if isinstance(item, uuid.UUID):
                named.append(item)
            elif id(item) not in index:
                raise InvalidAfter(
                    f"job {n}: after names a Job ({item.topic!r}) that is not in this "
                    "enqueue_many call: enqueue it in the same call, or name its id"
                )
    _check_acyclic(afters, index)
    if named:
        present = set((yield All(q.job_ids_present, {"ids": named})))
        for job_id in named:
            if job_id not in present:
                raise InvalidAfter(f"after names job {job_id}, which does not exist")
    results = yield from insert([_held(job) if job.after is not None else job for job in checked])
    jobs: list[uuid.UUID] = []
    policies: list[str] = []
    available_ats: list[datetime | None] = []
    downs: list[uuid.UUID] = []
    ups: list[uuid.UUID] = []
    for (job_id, created), job, names in zip(results, checked, afters, strict=True):
        if names is None or not created:
            continue
        jobs.append(job_id)
        policies.append(job.on_upstream_failure)
        available_ats.append(job.available_at)
        for item in names:  # each named once (check_after)
            downs.append(job_id)
            ups.append(item if isinstance(item, uuid.UUID) else results[index[id(item)]][0])
    if jobs:
        yield One(
            q.job_after,
            {"jobs": jobs, "policies": policies, "downs": downs, "ups": ups},
        )
        yield All(q.job_after_release, {"ids": jobs, "available_ats": available_ats})
    return results


def _held(job: Job) -> Job:
    """``job`` as the batch inserts it: not ready yet, its edges written after."""
    held = shallow_copy(job)
    held.after = None
    held.available_at = HELD
    return held


def _check_acyclic(afters: Sequence[tuple[Any, ...] | None], index: dict[int, int]) -> None:
    """InvalidAfter naming the jobs of a cycle, when a Job of the batch waits for itself
    through the Jobs its ``after`` names (possible only once ``after`` was assigned after
    the Job was built: the constructor takes Jobs built before)."""

    def named(n: int) -> Iterator[int]:
        return (index[id(item)] for item in afters[n] or () if not isinstance(item, uuid.UUID))

    state = [0] * len(afters)  # 0: not seen, 1: on the path being walked, 2: done
    for start in range(len(afters)):
        if state[start] or afters[start] is None:
            continue
        path = [start]
        walks = [named(start)]
        state[start] = 1
        while walks:
            up = next(walks[-1], None)
            if up is None:
                state[path.pop()] = 2
                walks.pop()
            elif state[up] == 1:
                cycle = [*path[path.index(up) :], up]
                chain = " waits for ".join(f"job {n}" for n in cycle)
                raise InvalidAfter(f"after makes a cycle, which would wait for ever: {chain}")
            elif state[up] == 0:
                state[up] = 1
                path.append(up)
                walks.append(named(up))
