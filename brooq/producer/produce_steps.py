"""What an insert asks its driver to run: the steps an insert generator yields
(brooq.producer.produce drives them on a psycopg cursor, sync or async) and the rows they answer
with, the queue a job goes to, and the tags as COPY and arrays carry them.

Owns: One, All, Keyed, Copy (and Steps, a generator of them), KeyedId, Handlers,
``queue_of``, ``tags_literal``, the COPY rows of a batch without keys (``copy_rows``, as
rows or as COPY's text) and KEY_ROUNDS.
Must never: do I/O (the drivers do), or know a statement's text beyond its name.
"""

from __future__ import annotations

import uuid
from collections.abc import Generator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar

from brooq.job import DEFAULT_QUEUE, Job

if TYPE_CHECKING:
    from typing_extensions import LiteralString

    from brooq.declare.handlers import Handler

R = TypeVar("R")

# A conflicting row can vanish between our INSERT and our SELECT (retention deleted it,
# or the active job holding a unique_key ended): then the INSERT is tried again. Two
# rounds are plenty; more means something is wrong.
KEY_ROUNDS = 3


class KeyedId(NamedTuple):
    """A row of job_get_ids_by_keys (or _by_unique_keys): the job holding (topic, key)."""

    topic: str
    key: str | None  # never None here (the lookup joins on it), typed as Job's keys
    id: uuid.UUID


class One(NamedTuple):
    """Execute; the first row's id, None without a row."""

    statement: LiteralString
    params: dict[str, Any]


class All(NamedTuple):
    """Execute; every row's id."""

    statement: LiteralString
    params: dict[str, Any]


class Keyed(NamedTuple):
    """Execute; every row as a KeyedId."""

    statement: LiteralString
    params: dict[str, Any]


class Copy(NamedTuple):
    """COPY these rows (or this text, already in COPY's text format); nothing is sent
    back."""

    statement: LiteralString
    rows: list[tuple[Any, ...]] | str


Step = One | All | Keyed | Copy
Steps = Generator[Step, Any, R]

# A Queue's handlers by topic (their queue is where a job naming none goes); empty for
# brooq.enqueue, which knows no handlers.
Handlers = Mapping[str, "Handler"]


def queue_of(job: Job, handlers: Handlers) -> str:
    """The queue a job goes to: its own, else its handler's, else "default"."""
    if job.queue:
        return job.queue
    handler = handlers.get(job.topic)
    return handler.queue if handler is not None else DEFAULT_QUEUE


def tags_literal(tags: Sequence[str] | None) -> str | None:
    """The tags as a text[] literal, each element quoted (so that a tag "null" stays a
    word): what COPY writes into the tags column and what job_insert_many_options casts.
    brooq.job_options' alphabet holds no quote, backslash or separator to escape."""
    if tags is None:
        return None
    return "{" + ",".join(f'"{tag}"' for tag in tags) + "}"


def copy_rows(
    checked: list[Job], ids: list[uuid.UUID], handlers: Handlers, wide: bool = False
) -> tuple[list[tuple[Any, ...]] | str, list[tuple[Any, ...]]]:
    """The COPY rows of jobs without keys, ready ones and scheduled ones apart, so that
    "ready now" is the server's now(), never the client's clock; ``wide``: each row ends
    with its tags and its group (the _options statements). Plain ready rows come as COPY
    text, made here in one pass (psycopg's write_row per row was the producer's largest
    cost in a bulk enqueue)."""
    if not wide and all(job.available_at is None for job in checked):
        return ready_copy_text(checked, ids, handlers), []
    ready: list[tuple[Any, ...]] = []
    scheduled: list[tuple[Any, ...]] = []
    for job_id, job in zip(ids, checked, strict=True):
        queue = queue_of(job, handlers)
        if job.available_at is None:
            row: tuple[Any, ...] = (job_id, job.topic, job.payload_json, queue, job.priority)
            ready.append((*row, tags_literal(job.tags), job.group) if wide else row)
        else:
            at = job.available_at
            row = (job_id, job.topic, job.payload_json, at, queue, job.priority)
            scheduled.append((*row, tags_literal(job.tags), job.group) if wide else row)
    return ready, scheduled


def ready_copy_text(checked: list[Job], ids: list[uuid.UUID], handlers: Handlers) -> str:
    """job_copy_ready's rows in COPY's text format: (id, topic, payload, queue, priority).
    Topics and queues are validated names (no character COPY would read as special), and
    a payload is JSON text from brooq.encoding, which writes every control character as
    an escape: a backslash is the one character to double."""
    lines = []
    for job_id, job in zip(ids, checked, strict=True):
        payload = job.payload_json
        if "\\" in payload:
            payload = payload.replace("\\", "\\\\")
        queue = queue_of(job, handlers)
        lines.append(f"{job_id.hex}\t{job.topic}\t{payload}\t{queue}\t{job.priority}\n")
    return "".join(lines)
