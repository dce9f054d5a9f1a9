"""Every error brooq raises on purpose is a BrooqError; the message names what was wrong."""

from __future__ import annotations


class BrooqError(Exception):
    """Base class of brooq's own errors."""


class InvalidJob(BrooqError, ValueError):
    """A job was refused before anything was written (topic, payload, key or time)."""


class InvalidTopic(InvalidJob):
    """The topic does not match the topic format, or (a Queue with ``strict_topics=True``)
    no handler of the Queue declares it."""


class InvalidQueue(InvalidJob):
    """The queue name does not match the queue format (the topic's)."""


class InvalidGroup(InvalidJob):
    """A job's group is not None or 1 to 128 printable characters."""


class InvalidOrderingKey(InvalidJob):
    """A job's ordering_key is not None or 1 to 256 printable characters, or is combined
    with an option that cannot keep its order (unique_key, after, held)."""


class InvalidAfter(InvalidJob):
    """A job's ``after`` names something that is not a job id or a Job of its batch, or
    its ``on_upstream_failure`` is neither "cancel" nor "run"."""


class InvalidPriority(InvalidJob):
    """The priority is not an integer from -32768 to 32767."""


class InvalidPayload(InvalidJob):
    """The payload cannot be stored as JSON, or is too large."""


class PayloadMismatch(InvalidPayload):
    """The payload does not fit the type its handler declares (``payload=Model``); the
    message names the field (``payload.user_id``) and the type expected."""


class InvalidResult(InvalidJob):
    """What a handler returned cannot be stored: not JSON-serialisable, or too large. It
    fails the attempt."""


class InvalidIdempotencyKey(InvalidJob):
    """The idempotency key cannot be stored."""


class InvalidUniqueKey(InvalidJob):
    """The unique key cannot be stored."""


class InvalidDebounce(InvalidJob):
    """The debounce is not a positive duration of at most a day, or is given without a
    unique_key (or beside an idempotency_key or an available_at)."""


class InvalidTags(InvalidJob):
    """The tags are not a list of at most 8 short labels (brooq.job_options.TAG_FORM)."""


class NaiveDatetime(InvalidJob):
    """A datetime without a time zone was given where an instant is required."""


class InvalidJobId(BrooqError, ValueError):
    """A job id that is not a UUID."""


class InvalidSettings(BrooqError, ValueError):
    """One or more settings are invalid; ``problems`` lists every one of them."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = list(problems)
        super().__init__("invalid settings:\n  - " + "\n  - ".join(self.problems))


class InvalidDsn(BrooqError, ValueError):
    """The connection string cannot be parsed, or none was given."""


class DatabaseUnavailable(BrooqError):
    """The database cannot be reached; the message never contains the password."""


class ReadOnlyDatabase(DatabaseUnavailable):
    """The server reached is read-only: a standby in recovery (a connection string without
    ``target_session_attrs=read-write`` that landed on it), or a session made read-only.
    brooq writes only to a primary; the message says which server and what to change."""


class SchemaMissing(BrooqError):
    """The job table is not there: run ``brooq migrate up``."""


class MigrationError(BrooqError):
    """The migrations directory or the recorded versions are inconsistent."""


class JobNotFound(BrooqError, LookupError):
    """No job has the given id (it never existed, or retention deleted it)."""


class WaitTimeout(BrooqError, TimeoutError):
    """queue.wait() gave up: the job did not end within the timeout."""


class JobNotRunning(BrooqError):
    """queue.stack(): the job is not processing, so it has no stack to show."""


class StackUnavailable(BrooqError):
    """queue.stack(): no master answered in time, or the job ended while it was asked."""


class InvalidTransition(BrooqError):
    """An operator asked for a state change the job's current state does not allow."""


class AppLoadError(BrooqError):
    """``--app`` could not be imported or does not name a brooq.Queue, or a module named in
    a Queue's ``include=`` could not be imported (at its first enqueue, a drain, or the
    application's load). ``problems``: what
    the import refused, one each, when it raised InvalidSettings (a bad schedule or
    handler option at registration); else empty."""

    def __init__(self, message: str, problems: list[str] | None = None) -> None:
        self.problems = list(problems or [])
        super().__init__(message)


class PoolerMismatch(BrooqError):
    """The connection goes through a transaction pooler that brooq was not told about
    (QUEUE_POOLER), or LISTEN was configured through one (docs/poolers.md)."""


class EnqueueDeadlock(BrooqError):
    """Jobs with ``after`` could not be enqueued: PostgreSQL broke a deadlock between the
    enqueue, which locks the jobs named, and workers writing those jobs' outcomes. In a
    transaction of brooq's own (Queue's enqueues, a connection in autocommit) it is raised
    once every try deadlocked; in the caller's transaction at once, the transaction
    aborted: roll it back and run it again. ``__cause__`` is psycopg's DeadlockDetected."""
