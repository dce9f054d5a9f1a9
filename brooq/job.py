"""The vocabulary: jobs, claims, states, which states an operator may move a job out of,
and the signals a handler can raise (brooq.job, named here too).

Owns: the job's states and the rule of operator transitions (CANCELABLE_STATES,
RETRYABLE_STATES, transition_refusal: the SQL binds these, Queue, the CLI and the master's
admin HTTP word their refusals with them; BULK_FROM_STATES and bulk_state_refusal for the
bulk forms, Queue.cancel_many and Queue.retry_many), what a valid job is (topic, payload, key,
available_at, group; its payload is encoded by brooq.encoding, its unique_key, debounce
and tags checked by brooq.job_options), JobRecord and Claim.
Must never: do I/O (no database, no files, no clock beyond validating what it is given),
or spell a state's name outside the constants below.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any, ClassVar, Final, Generic, Literal

from brooq.encoding import JSON_TYPES, encode_payload, to_json
from brooq.errors import (
    InvalidIdempotencyKey,
    InvalidJob,
    InvalidJobId,
    InvalidPriority,
    InvalidQueue,
    InvalidTopic,
    NaiveDatetime,
)
from brooq.ipc.progress import report
from brooq.job_options import (
    check_after,
    check_combination,
    check_debounce,
    check_ordering_key,
    check_tags,
    check_unique_key,
    validate_group,
)

if TYPE_CHECKING:
    # A default, so that a bare `Claim` stays Claim[Any] for mypy --strict (no "missing
    # type arguments" in every module naming it); typing has defaults from 3.13 only.
    from typing_extensions import TypeVar

    P = TypeVar("P", default=Any)
else:
    from typing import TypeVar

    P = TypeVar("P")

WAITING: Final = "waiting"  # for the jobs named in after (brooq.job_options.check_after)
PENDING: Final = "pending"
PROCESSING: Final = "processing"
FAILED: Final = "failed"
DONE: Final = "done"
DEAD: Final = "dead"
CANCELED: Final = "canceled"
ON_HOLD: Final = "on_hold"  # held by an operator (queue.hold, Job(held=True)) until released

STATES: Final = (WAITING, PENDING, PROCESSING, FAILED, DONE, DEAD, CANCELED, ON_HOLD)
ACTIVE_STATES: Final = (PENDING, PROCESSING, FAILED)
TERMINAL_STATES: Final = (DONE, DEAD, CANCELED)

# The operator's transitions (brooq jobs cancel/retry/hold/release, Queue.cancel/retry/
# hold/release, POST /admin/jobs/...). job_cancel, job_retry, job_hold and job_release
# take these as their from_states parameter, so the SQL cannot disagree with the refusals
# below. Cancel also takes a processing job: its holder learns as the cancel commits
# (LeaseLost), and its own outcome write then matches no row. Hold takes a job no worker
# has taken (not one a durable handler parked: it has started), and not one with a
# unique_key (on hold it would give its key up to the next enqueue).
Transition = Literal["cancel", "retry", "hold", "release"]
CANCELABLE_STATES: Final = (PENDING, FAILED, PROCESSING, WAITING, ON_HOLD)
RETRYABLE_STATES: Final = (DEAD, CANCELED)
HOLDABLE_STATES: Final = (PENDING, FAILED)
RELEASABLE_STATES: Final = (ON_HOLD,)
FROM_STATES: Final[dict[Transition, tuple[str, ...]]] = {
    "cancel": CANCELABLE_STATES,
    "retry": RETRYABLE_STATES,
    "hold": HOLDABLE_STATES,
    "release": RELEASABLE_STATES,
}
_DONE_WORD: Final[dict[Transition, str]] = {
    "cancel": "canceled",
    "retry": "retried",
    "hold": "held",
    "release": "released",
}
# The bulk forms (brooq jobs cancel/retry --topic T --state S, Queue.cancel_many/retry_many)
# take one state at a time, from these. Bulk cancel leaves processing out: canceling every
# running job of a topic interrupts handlers mid-work (LeaseLost), which an operator does to
# one job they have looked at, by id, not to whatever happens to be running.
BULK_FROM_STATES: Final[dict[Transition, tuple[str, ...]]] = {
    "cancel": tuple(s for s in CANCELABLE_STATES if s != PROCESSING),
    "retry": RETRYABLE_STATES,
    "hold": HOLDABLE_STATES,
    "release": RELEASABLE_STATES,
}

TOPIC_PATTERN: Final = re.compile(r"^[a-z0-9]+([._-][a-z0-9]+)*$")
TOPIC_MAX_LENGTH: Final = 128
# Queue names follow the topic rule (the job_queue_check of migration 0003).
DEFAULT_QUEUE: Final = "default"
# priority is a smallint column: higher runs first.
PRIORITY_MIN: Final = -32768
PRIORITY_MAX: Final = 32767
IDEMPOTENCY_KEY_MAX_LENGTH: Final = 1024
# The key is indexed with the topic, and a btree entry holds at most 2,704 bytes.
IDEMPOTENCY_KEY_MAX_BYTES: Final = 2048
DEFAULT_MAX_PAYLOAD_BYTES: Final = 1024 * 1024
# An available_at this close to datetime's ends could not be read back (year 0 or 10000).
_EARLIEST: Final = datetime.min.replace(tzinfo=timezone.utc) + timedelta(days=2)
_LATEST: Final = datetime.max.replace(tzinfo=timezone.utc) - timedelta(days=2)


def _either(words: tuple[str, ...]) -> str:
    return ", ".join(words[:-1]) + " or " + words[-1] if len(words) > 1 else words[0]


def transition_rule(action: Transition) -> str:
    """The rule in words: "only dead or canceled jobs can be retried"."""
    return f"only {_either(FROM_STATES[action])} jobs can be {_DONE_WORD[action]}"


def bulk_rule(action: Transition) -> str:
    """The bulk rule in words: "only pending, failed or waiting jobs can be canceled in bulk"."""
    return f"only {_either(BULK_FROM_STATES[action])} jobs can be {_DONE_WORD[action]} in bulk"


def bulk_state_refusal(action: Transition, state: object) -> str | None:
    """None when the bulk ``action`` may take jobs in ``state``; else why not, naming the
    states it takes ("state 'done': only dead or canceled jobs can be retried in bulk")."""
    if action not in BULK_FROM_STATES:
        raise ValueError(f"action must be cancel, retry, hold or release, got {action!r}")
    if isinstance(state, str) and state in BULK_FROM_STATES[action]:
        return None
    return f"state {state!r}: {bulk_rule(action)}"


def transition_refusal(action: Transition, state: str, job_id: object = None) -> str:
    """Why ``action`` did nothing to a job found in ``state`` afterwards, in the words an
    operator sees. Without ``job_id``, the admin HTTP's 409 ("job is done; only pending,
    failed or processing jobs can be canceled"); with it, the CLI's and Queue's ("cannot
    cancel job ID: it is done; only ..."). A state the action accepts means the job changed
    between the write and the read that explains it: try again."""
    if action not in FROM_STATES:
        raise ValueError(f"action must be cancel, retry, hold or release, got {action!r}")
    if state in FROM_STATES[action]:
        if job_id is None:
            return f"job is now {state}: its state changed meanwhile; try again"
        return (
            f"cannot {action} job {job_id}: its state changed meanwhile and is now "
            f"{state}; try again"
        )
    if job_id is None:
        return f"job is {state}; {transition_rule(action)}"
    return f"cannot {action} job {job_id}: it is {state}; {transition_rule(action)}"


# Names already found valid (topics and queues: a service uses a handful): a set lookup
# instead of the pattern on every Job. Bounded, so that a producer making names up
# cannot grow it without end; past the bound the pattern runs as before.
_VALID_NAMES: set[str] = set()
_VALID_NAMES_MAX: Final = 4096


def validate_name(value: object, field: str, error: type[InvalidJob]) -> str:
    # Exactly str: a subclass could hash or compare as a valid name it is not.
    if value.__class__ is str and value in _VALID_NAMES:
        return value
    if not isinstance(value, str):
        raise error(f"{field} must be a string, not {type(value).__name__}")
    if len(value) > TOPIC_MAX_LENGTH:
        raise error(f"{field} is {len(value)} characters long; the limit is {TOPIC_MAX_LENGTH}")
    # fullmatch, not match: "$" also matches before a final "\n", which the database's
    # CHECK constraint refuses (a CheckViolation at enqueue instead of our error).
    if not TOPIC_PATTERN.fullmatch(value):
        raise error(
            f"{field} {value!r} does not match {TOPIC_PATTERN.pattern} "
            "(lowercase letters and digits, words joined by '.', '_' or '-')"
        )
    if value.__class__ is str and len(_VALID_NAMES) < _VALID_NAMES_MAX:
        _VALID_NAMES.add(value)
    return value


def validate_topic(topic: object) -> str:
    return validate_name(topic, "topic", InvalidTopic)


def validate_queue(queue: object) -> str:
    """A queue name: the topic rule, errors naming ``queue``."""
    return validate_name(queue, "queue", InvalidQueue)


def validate_priority(priority: object) -> int:
    """An int (not a bool, not a float) that the smallint column holds."""
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise InvalidPriority(f"priority must be an integer, not {type(priority).__name__}")
    if not PRIORITY_MIN <= priority <= PRIORITY_MAX:
        raise InvalidPriority(
            f"priority must be from {PRIORITY_MIN} to {PRIORITY_MAX} (higher runs first), "
            f"got {priority}"
        )
    return int(priority)  # an IntEnum's member, say, as the int every door stores


def normalise_key(key: object) -> str | None:
    if key is None:
        return None
    if not isinstance(key, str):
        raise InvalidIdempotencyKey(
            f"idempotency_key must be a string or None, not {type(key).__name__}"
        )
    if key == "":
        return None
    if "\x00" in key:
        raise InvalidIdempotencyKey("idempotency_key contains the character \\x00")
    if len(key) > IDEMPOTENCY_KEY_MAX_LENGTH:
        raise InvalidIdempotencyKey(
            f"idempotency_key is {len(key)} characters long; "
            f"the limit is {IDEMPOTENCY_KEY_MAX_LENGTH}"
        )
    try:
        size = len(key.encode("utf-8"))
    except UnicodeEncodeError:
        raise InvalidIdempotencyKey("idempotency_key is not valid Unicode") from None
    if size > IDEMPOTENCY_KEY_MAX_BYTES:
        raise InvalidIdempotencyKey(
            f"idempotency_key is {size} bytes long in UTF-8; "
            f"the limit is {IDEMPOTENCY_KEY_MAX_BYTES}"
        )
    return key


def require_aware(value: object, name: str) -> datetime:
    if not isinstance(value, datetime):
        raise NaiveDatetime(f"{name} must be a datetime, not {type(value).__name__}")
    if value.tzinfo is None or value.tzinfo.utcoffset(value) is None:
        raise NaiveDatetime(
            f"{name} is a naive datetime; give it a time zone, "
            "e.g. datetime.now(timezone.utc) + timedelta(minutes=5)"
        )
    try:
        in_range = _EARLIEST <= value.astimezone(timezone.utc) <= _LATEST
    except OverflowError:  # the UTC instant falls outside year 1..9999
        in_range = False
    if not in_range:
        raise InvalidJob(f"{name} {value.isoformat()} is out of range (years 1 to 9999)")
    return value


def check_held(held: object, unique_key: str | None, after: object) -> bool:
    """Job(held=...): a bool; not beside a unique_key (a job on hold gives its key up, so
    the next enqueue of the key would run while this one waits) nor beside after (a
    waiting job is released by its upstream jobs, not by an operator)."""
    if not isinstance(held, bool):
        raise InvalidJob(f"held must be True or False, not {type(held).__name__}")
    if held and unique_key is not None:
        raise InvalidJob(
            "held cannot be combined with unique_key: a job on hold gives its key up "
            "(hold the key's job once enqueued, or enqueue without the key)"
        )
    if held and after is not None:
        raise InvalidJob(
            "held cannot be combined with after: a waiting job starts when its upstream "
            "jobs end; hold it once it is pending"
        )
    return held


def parse_job_id(value: object) -> uuid.UUID:
    if isinstance(value, uuid.UUID):
        return value
    if isinstance(value, str):
        try:
            return uuid.UUID(value.strip())
        except ValueError:
            pass
    raise InvalidJobId(f"job id {value!r} is not a UUID")


class Job:
    """A job to enqueue. Validated when built, so a bad job never reaches the database.
    ``idempotency_key``: one job per (topic, key) while its row lives. ``unique_key``: one
    pending, failed or processing job per (topic, key). ``debounce`` (with it): a burst
    folds into one run, the last payload. ``tags``: up to 8 labels to list, cancel and
    retry by (docs/how-to/unique-and-debounce.md). ``after``: the job ids or Jobs of the
    same batch it waits for, ``on_upstream_failure`` (docs/how-to/workflows.md).
    ``held``: enqueued on hold, never claimed until released (docs/how-to/hold.md).
    ``ordering_key``: the jobs of one (topic, key) start one at a time, in enqueue order
    (docs/how-to/ordered-keys.md)."""

    __slots__ = (
        "after",
        "available_at",
        "debounce",
        "group",
        "held",
        "idempotency_key",
        "on_upstream_failure",
        "ordering_key",
        "payload",
        "payload_json",
        "priority",
        "queue",
        "tags",
        "topic",
        "unique_key",
    )

    def __init__(
        self,
        topic: str,
        payload: Any = None,
        *,
        idempotency_key: str | None = None,
        available_at: datetime | None = None,
        queue: str | None = None,
        priority: int = 0,
        unique_key: str | None = None,
        debounce: timedelta | float | str | None = None,
        tags: Iterable[str] | None = None,
        group: str | None = None,
        after: Iterable[Any] | None = None,
        on_upstream_failure: Literal["cancel", "run"] = "cancel",
        held: bool = False,
        ordering_key: str | None = None,
    ) -> None:
        # The common case (a known topic, no queue, key, time or option, priority 0) skips
        # the validators' calls: a web request builds one Job per enqueue.
        self.topic = (
            topic if topic.__class__ is str and topic in _VALID_NAMES else validate_topic(topic)
        )
        # None: the queue the topic's handler declares when enqueued through a Queue
        # that has it, else "default" (brooq.producer.insert resolves it).
        self.queue = None if queue is None else validate_queue(queue)
        self.priority = (
            0 if priority.__class__ is int and priority == 0 else validate_priority(priority)
        )
        self.payload = payload  # a model instance stays one; it is stored as its JSON
        if payload.__class__ not in JSON_TYPES:  # the only cost for a plain one
            payload = to_json(payload)
        self.payload_json = encode_payload(payload)
        self.idempotency_key = None if idempotency_key is None else normalise_key(idempotency_key)
        self.available_at = (
            None if available_at is None else require_aware(available_at, "available_at")
        )
        # brooq.job_options: None for a plain job, which enqueue_line then sends as always.
        self.unique_key = None if unique_key is None else check_unique_key(unique_key)
        self.debounce = None if debounce is None else check_debounce(debounce)  # seconds
        self.tags = None if tags is None else check_tags(tags)
        if debounce is not None:
            check_combination(
                self.unique_key, self.debounce, self.idempotency_key, available_at is not None
            )
        # The group the topic's group_limit and group_rate_limit count it in; None: none.
        self.group = None if group is None else validate_group(group)
        # The jobs it waits for (brooq.job_options.check_after); None: none.
        self.on_upstream_failure = on_upstream_failure
        self.after = None
        if after is not None or on_upstream_failure != "cancel":
            self.after = check_after(after, on_upstream_failure, Job)
        self.held = False if held is False else check_held(held, self.unique_key, self.after)
        # Its key's turn (brooq.job_options.check_ordering_key); None: none.
        self.ordering_key = (
            None
            if ordering_key is None
            else check_ordering_key(ordering_key, self.unique_key, self.after, self.held)
        )

    def __repr__(self) -> str:
        options = "".join(
            f", {name}={value!r}"
            for name, value in (
                ("unique_key", self.unique_key),
                ("debounce", self.debounce),
                ("tags", self.tags),
                ("group", self.group),
                ("after", self.after),
                ("held", self.held or None),
                ("ordering_key", self.ordering_key),
            )
            if value is not None
        )
        return (
            f"Job(topic={self.topic!r}, payload={self.payload!r}, "
            f"idempotency_key={self.idempotency_key!r}, available_at={self.available_at!r}, "
            f"queue={self.queue!r}, priority={self.priority!r}{options})"
        )


@dataclass(frozen=True)
class JobRecord:
    """A row of the job table, as ``queue.get`` returns it."""

    id: uuid.UUID
    topic: str
    payload: Any
    state: str
    attempts: int
    available_at: datetime
    locked_by: str | None
    locked_until: datetime | None
    last_error: str | None
    idempotency_key: str | None
    created_at: datetime
    updated_at: datetime
    queue: str = DEFAULT_QUEUE
    priority: int = 0
    # What the handler returned (decoded JSON), None when nothing was stored.
    result: Any = None
    # The error history: one entry per failed attempt (and per lease expiry or cancel by
    # the handler), the last 20, oldest first: {"attempt", "at", "started_at", "worker",
    # "error", "kind", "traceback"} ("at" and "started_at" the ISO text jsonb writes;
    # "traceback" a bounded text on the newest 5 entries, else null; entries written
    # before schema version 18 have only attempt, at, error and worker).
    errors: list[dict[str, Any]] = field(default_factory=list)
    unique_key: str | None = None
    tags: list[str] = field(default_factory=list)
    # A debounced job waiting for its key's running job: its earliest start once that ends.
    start_after: datetime | None = None
    group: str | None = None  # Job(group=...), None when it has none
    # The handler's last claim.progress(): the running attempt's (written within about a
    # quarter of a second), or the last attempt's, frozen with its outcome; None when the
    # attempt reported nothing (each claim starts with none).
    progress: float | None = None
    progress_message: str | None = None
    traceparent: str | None = None  # its enqueue's W3C trace context (brooq.tracing)
    # When the current (or, once it ended, the last) attempt was claimed; None until the
    # first claim (and for a job last claimed before schema version 19).
    started_at: datetime | None = None
    # Job(ordering_key=...): its jobs start one at a time, in enqueue order; None: none.
    ordering_key: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict: UUID and datetimes as strings."""
        out: dict[str, Any] = {}
        for name in self.__dataclass_fields__:
            value = getattr(self, name)
            if isinstance(value, uuid.UUID):
                value = str(value)
            elif isinstance(value, datetime):
                value = value.isoformat()
            out[name] = value
        return out


@dataclass(frozen=True)
class UpstreamJob:
    """A job another one waited for (``claim.upstream``, ``Queue.upstream``): its id,
    topic, state and what its handler returned (decoded JSON, None when nothing)."""

    id: uuid.UUID
    topic: str
    state: str
    result: Any = None


@dataclass
class Claim(Generic[P]):
    """A claimed job as a handler sees it. ``Claim[Signup]``: a handler registered with
    ``payload=Signup`` gets a Signup (typing only; a bare Claim is Claim[Any])."""

    id: uuid.UUID
    topic: str
    payload: P
    attempt: int
    locked_by: str
    locked_until: datetime
    queue: str = DEFAULT_QUEUE
    priority: int = 0
    # Empty tuples until the handler adds the first (chain, on_success): four containers
    # made per claim, mostly never used, were a tenth of a no-op job's claim object.
    chained: Sequence[Job] = field(default=(), repr=False)
    success_hooks: Sequence[Callable[[Any], None]] = field(default=(), repr=False)
    # How ``upstream`` is read, set once per process (brooq.worker.upstream, drain).
    reader: ClassVar[Callable[[uuid.UUID], list[UpstreamJob]] | None] = None
    # The durable operations' backend, set once per process after the fork
    # (brooq.worker.durable.Durable, drain): steps, sleeps, waits, child jobs.
    durable: ClassVar[Any] = None
    _upstream: list[UpstreamJob] | None = field(default=None, init=False, repr=False, compare=False)
    # This attempt's recorded steps (read at its first step), the names it used, and how
    # many times each internal operation was called (the n of "__sleep:<n>").
    steps_recorded: dict[str, Any] | None = field(
        default=None, init=False, repr=False, compare=False
    )
    # None until the first durable operation (brooq.worker.durable makes them).
    steps_used: set[str] | None = field(default=None, init=False, repr=False, compare=False)
    calls: dict[str, int] | None = field(default=None, init=False, repr=False, compare=False)
    # This attempt's last claim.progress(): (fraction, message), None before any report.
    reported: tuple[float, str] | None = field(default=None, init=False, repr=False, compare=False)

    @property
    def upstream(self) -> list[UpstreamJob]:
        """The jobs this one waited for (``after``), in the order named; [] for none."""
        if self._upstream is None:
            if Claim.reader is None:
                raise RuntimeError("claim.upstream is read in brooq's workers and drain only")
            self._upstream = Claim.reader(self.id)
        return self._upstream

    def chain(self, job: Job) -> None:
        """Enqueue ``job`` in the transaction that writes ``done`` (only on success)."""
        if not isinstance(job, Job):
            raise TypeError(f"chain() takes a brooq.Job, not {type(job).__name__}")
        if isinstance(self.chained, list):
            self.chained.append(job)
        else:
            self.chained = [*self.chained, job]

    def on_success(self, fn: Callable[[Any], None]) -> None:
        """Run ``fn(conn)`` inside the transaction that writes ``done``."""
        if not callable(fn):
            raise TypeError("on_success() takes a callable fn(conn)")
        if isinstance(self.success_hooks, list):
            self.success_hooks.append(fn)
        else:
            self.success_hooks = [*self.success_hooks, fn]

    progress = report  # claim.progress(fraction, message=""): brooq.ipc.progress

    # -- durable operations (docs/how-to/durable-handlers.md): in an async handler each returns an
    # awaitable (``await claim.step(...)``), in a sync one it runs.

    def _backend(self) -> Any:
        if Claim.durable is None:
            raise RuntimeError("durable operations run in brooq's workers and drain only")
        return Claim.durable

    def step(
        self,
        name: str,
        fn: Callable[..., Any],
        /,
        *args: Any,
        transaction: bool = False,
        **kwargs: Any,
    ) -> Any:
        """Run ``fn(*args, **kwargs)`` once for this job: its result (as JSON, decoded) is
        recorded under ``name`` before this returns, and a later attempt gets the record
        back without calling ``fn``. ``transaction=True``: ``fn(conn, *args, **kwargs)``
        runs in the transaction that records it (its writes commit with the record, or
        not at all)."""
        return self._backend().step(self, name, fn, args, kwargs, transaction)

    def sleep(self, duration: timedelta | float | str) -> Any:
        """Sleep ``duration`` (brooq's durations) without holding a worker: the first
        time, the attempt ends (not spent) and the job is claimable at its wake time."""
        return self._backend().sleep(self, duration)

    def sleep_until(self, when: datetime) -> Any:
        """``sleep`` until ``when`` (an aware datetime)."""
        require_aware(when, "sleep_until")
        return self._backend().sleep_until(self, when)

    def wait_event(self, key: str, timeout: timedelta | float | str | None = None) -> Any:
        """The payload of the first event emitted under ``key``; until then the job is
        parked. ``timeout``, counted from this wait's first call: past it,
        brooq.WaitTimeout is raised here."""
        return self._backend().wait_event(self, key, timeout)

    def spawn(self, job: Job) -> Any:
        """Enqueue ``job`` as this job's child, once per call site: a later attempt gets
        the same id back and enqueues nothing."""
        if not isinstance(job, Job):
            raise TypeError(f"spawn() takes a brooq.Job, not {type(job).__name__}")
        return self._backend().spawn(self, job)

    def wait_jobs(self, ids: Iterable[Any]) -> Any:
        """Park until every job of ``ids`` ended; their records (ChildJob), in that order."""
        return self._backend().wait_jobs(self, [parse_job_id(i) for i in ids])


@dataclass(frozen=True)
class ChildJob:
    """A job ``claim.wait_jobs`` waited for: its id, topic, state, what its handler
    returned (decoded JSON, None when nothing) and its last error."""

    id: uuid.UUID
    topic: str
    state: str
    result: Any = None
    last_error: str | None = None


# -- handler signals and interruptions -------------------------------------------------------------
# The signals a handler raises to choose its outcome (Delay, PreserveAttempt,
# CancelJob) and the interruptions brooq raises into a running handler (AttemptTimeout,
# LeaseLost). brooq.job names them too, as does the package.
#
# Owns: the exception classes and their words. Must never: do I/O or import from brooq.


class HandlerSignal(Exception):
    """Base of the exceptions a handler raises to choose its outcome."""


class Delay(HandlerSignal):
    """Retry after ``seconds`` (clamped to backoff_max). The attempt stays spent."""

    def __init__(self, seconds: float) -> None:
        seconds = float(seconds)
        if not seconds >= 0:
            raise ValueError(f"Delay needs a non-negative number of seconds, got {seconds!r}")
        self.seconds = seconds
        super().__init__(f"delay {seconds:g}s")


class PreserveAttempt(HandlerSignal):
    """Retry later without spending this attempt; never leads to dead."""


class CancelJob(HandlerSignal):
    """The job is no longer relevant: canceled, whatever attempts remain."""


class Parked(HandlerSignal):
    """Raised by brooq's durable operations once the job is parked (a sleep, a wait for an
    event or for child jobs): the attempt ends and nothing more is written (the park
    committed; the attempt is not spent). ``reason``: sleep, event or jobs."""

    def __init__(self, reason: str, until: datetime | None = None, key: str | None = None) -> None:
        self.reason = reason
        self.until = until
        self.key = key
        super().__init__(f"parked ({reason})")


# Raised into handlers by brooq.


class Interruption(BaseException):
    """Raised into a running handler by brooq. A BaseException, so ``except Exception``
    in user code does not swallow it by accident."""


class AttemptTimeout(Interruption):
    """The handler ran past its attempt_timeout; the attempt counts as failed."""


class LeaseLost(Interruption):
    """The job is no longer ours (canceled, reaped): stop, nothing will be written."""
