"""Handler registration and per-topic policy (attempts, timeouts, backoff).

Owns: what ``@queue.handler(topic, ...)`` accepts and refuses (all problems reported
together, each prefixed with the topic), the Policy a topic runs under once the
queue's settings fill the options left unset (brooq.settings orders and caps the limits),
and a topic's fleet-wide limits as the master publishes them (``Handler.limits``; what a
rate is and accepts is brooq.declare.rates').
Must never: do I/O, run a handler, or word the limits' ordering itself (brooq.settings does,
for settings too).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from brooq.declare.payloads import Codec, codec_for
from brooq.declare.rates import Rate, parse_rate
from brooq.durations import Duration, to_seconds, too_long
from brooq.errors import InvalidJob, InvalidSettings
from brooq.job import DEFAULT_QUEUE, validate_queue, validate_topic
from brooq.settings import NAMES, ordering_problems, resolve

if TYPE_CHECKING:
    from brooq.job import Claim
    from brooq.settings import Settings

HandlerFn = Callable[["Claim[Any]"], Any]
# fn(claim, call_next) -> what call_next(claim) returned (or raise).
Middleware = Callable[["Claim[Any]", HandlerFn], Any]
# fn(attempt, exc) -> the delay before the next attempt, or None: no more attempts.
RetryPolicy = Callable[[int, BaseException], "timedelta | None"]
MAX_ATTEMPTS = 2**31 - 1  # the job's attempts column is a PostgreSQL integer
MAX_GLOBAL_LIMIT = 2**31 - 1  # bound as a PostgreSQL integer (global_limit, group_limit)
KEEP_LOGS_BYTES = 65536  # keep_logs=True: the log text kept per attempt
_LIMITS = NAMES  # attempt_timeout, max_execution_timeout, backoff_base, backoff_max


@dataclass(frozen=True)
class Policy:
    """How one topic is run. Times in seconds."""

    max_attempts: int
    attempt_timeout: float
    max_execution_timeout: float
    backoff_base: float
    backoff_max: float


@dataclass(frozen=True)
class Handler:
    topic: str
    fn: HandlerFn
    # Values given at registration; None falls back to the queue's settings.
    max_attempts: int | None
    attempt_timeout: float | None
    max_execution_timeout: float | None
    backoff_base: float | None
    backoff_max: float | None
    # The queue a job of this topic goes to when it names none (enqueued through the
    # Queue that has this handler), and the fleet-wide cap on its processing jobs.
    queue: str = DEFAULT_QUEUE
    global_limit: int | None = None
    # payload=Model: claim.payload is decoded to it before the middleware runs.
    codec: Codec | None = None
    middleware: tuple[Middleware, ...] = ()  # this topic's, inside the Queue's
    retry: RetryPolicy | None = None
    # An `async def` handler: it runs in an async child, many at once (docs/async.md).
    is_async: bool = False
    # At most so many starts per window fleet-wide; at most so many processing per group
    # (Job(group=...)); at most so many starts per window per group
    # (docs/how-to/rate-limits.md).
    rate_limit: Rate | None = None
    group_limit: int | None = None
    group_rate_limit: Rate | None = None
    # keep_logs: the bytes of log text kept per attempt (0: none kept).
    keep_logs: int = 0
    # Its claims take the groups in turn, each an equal share (docs/how-to/rate-limits.md).
    fair_groups: bool = False
    # A dead job of an ordered key (Job(ordering_key=...)) hands the key on instead of
    # blocking it (docs/how-to/ordered-keys.md).
    ordering_skip_dead: bool = False

    @property
    def coordinated(self) -> bool:
        """Claimed apart in batches through brooq_claim_batch: a rate, a limit per group,
        or the groups taken in turn."""
        return (
            self.rate_limit is not None
            or self.group_limit is not None
            or self.group_rate_limit is not None
            or self.fair_groups
        )

    @property
    def holds_back(self) -> bool:
        """Whether a limit may hold a ready job of the topic back: a limit declared, or a
        group's own set at runtime (``brooq limits set``), which any topic claimed in turn
        obeys. The master then counts the jobs held back (job_held_by_topic, which reads
        the ready rows of a topic claimed in turn only while one of its groups has a
        limit of its own)."""
        return self.global_limit is not None or self.coordinated

    def limits(self) -> dict[str, object]:
        """The fleet-wide limits given, as published in brooq_master.limits (empty: none)."""
        given: dict[str, object] = {}
        if self.global_limit is not None:
            given["global_limit"] = self.global_limit
        if self.rate_limit is not None:
            given["rate_limit"] = self.rate_limit.to_dict()
        if self.group_limit is not None:
            given["group_limit"] = self.group_limit
        if self.group_rate_limit is not None:
            given["group_rate_limit"] = self.group_rate_limit.to_dict()
        if self.fair_groups:
            given["fair_groups"] = True
        return given

    def policy(self, settings: Settings) -> Policy:
        """The options given at registration, the queue's settings for the others (a
        default capped so that it never contradicts a value given: brooq.settings.resolve)."""
        given = {name: getattr(self, name) for name in _LIMITS}
        defaults = {name: getattr(settings, name) for name in _LIMITS}
        max_attempts = settings.max_attempts if self.max_attempts is None else self.max_attempts
        return Policy(max_attempts=max_attempts, **resolve(given, defaults))


def policy_problems(topic: str, policy: Policy) -> list[str]:
    problems = []
    if policy.max_attempts < 1:
        problems.append(f"{topic}: max_attempts must be at least 1, got {policy.max_attempts}")
    seconds = {name: getattr(policy, name) for name in _LIMITS}
    for name, value in seconds.items():
        if value <= 0:
            problems.append(f"{topic}: {name} must be positive, got {value:g}s")
    problems += ordering_problems(seconds, prefix=f"{topic}: ")
    return problems


def build(
    topic: str,
    fn: HandlerFn,
    *,
    max_attempts: int | None,
    attempt_timeout: Duration | None,
    max_execution_timeout: Duration | None,
    backoff_base: Duration | None,
    backoff_max: Duration | None,
    queue: str = DEFAULT_QUEUE,
    global_limit: int | None = None,
    payload: object = None,
    middleware: Sequence[Middleware] | None = None,
    retry: RetryPolicy | None = None,
    rate_limit: Rate | str | None = None,
    group_limit: int | None = None,
    group_rate_limit: Rate | str | None = None,
    keep_logs: bool | int = False,
    fair_groups: bool = False,
    ordering_skip_dead: bool = False,
) -> Handler:
    """Validate what was given at registration and return the Handler. Every step reads
    one group of options, appends why it refuses any of them to ``problems`` (in the order
    the message lists them) and returns what it read; all are reported together."""
    validate_topic(topic)
    problems: list[str] = []
    if not callable(fn):
        problems.append(f"{topic}: the handler must be callable")
    codec = _read_payload(topic, payload, problems)
    is_async = is_async_callable(fn)
    layers = _read_middleware(topic, middleware, is_async, problems)
    _check_retry(topic, retry, problems)
    _check_placement(topic, queue, global_limit, group_limit, problems)
    rates = _read_rates(topic, rate_limit, group_rate_limit, problems)
    given = {
        "attempt_timeout": attempt_timeout,
        "max_execution_timeout": max_execution_timeout,
        "backoff_base": backoff_base,
        "backoff_max": backoff_max,
    }
    seconds = _read_seconds(topic, given, problems)
    max_attempts = _read_max_attempts(topic, max_attempts, problems)
    _check_seconds(topic, seconds, problems)
    kept = _read_keep_logs(topic, keep_logs, problems)
    for name, flag in (("fair_groups", fair_groups), ("ordering_skip_dead", ordering_skip_dead)):
        if not isinstance(flag, bool):
            problems.append(f"{topic}: {name} must be True or False, not {flag!r}")
    if problems:
        raise InvalidSettings(problems)
    return Handler(
        topic=topic,
        fn=fn,
        max_attempts=max_attempts,
        queue=queue,
        global_limit=global_limit,
        codec=codec,
        middleware=layers,
        retry=retry,
        is_async=is_async,
        rate_limit=rates["rate_limit"],
        group_limit=group_limit,
        group_rate_limit=rates["group_rate_limit"],
        keep_logs=kept,
        fair_groups=fair_groups,
        ordering_skip_dead=ordering_skip_dead,
        **seconds,
    )


# -- build's steps: each reads one group of options and appends what it refuses ---------------


def _read_payload(topic: str, payload: object, problems: list[str]) -> Codec | None:
    """The payload type's codec, or None (no type given, or refused)."""
    if payload is None:
        return None
    try:
        return codec_for(payload)
    except ValueError as exc:
        problems.append(f"{topic}: payload: {exc}")
        return None


def _read_middleware(
    topic: str, middleware: Sequence[Middleware] | None, is_async: bool, problems: list[str]
) -> tuple[Middleware, ...]:
    """The layers, each callable as fn(claim, call_next) and of the handler's kind."""
    layers = tuple(middleware or ())
    for i, layer in enumerate(layers):
        problem = callable_problem(layer, 2, "fn(claim, call_next)")
        if problem:
            problems.append(f"{topic}: middleware[{i}] {problem}")
        elif is_async_callable(layer) != is_async:
            problems.append(f"{topic}: middleware[{i}] {kind_mismatch(is_async)}")
    return layers


def _check_retry(topic: str, retry: RetryPolicy | None, problems: list[str]) -> None:
    if retry is not None:
        problem = callable_problem(retry, 2, "fn(attempt, exc)")
        if problem:
            problems.append(f"{topic}: retry {problem}")


def _check_placement(
    topic: str,
    queue: str,
    global_limit: int | None,
    group_limit: int | None,
    problems: list[str],
) -> None:
    """The queue's name and the concurrency caps."""
    try:
        validate_queue(queue)
    except InvalidJob as exc:
        problems.append(f"{topic}: {exc}")
    for name, cap in (("global_limit", global_limit), ("group_limit", group_limit)):
        problem = cap_problem(name, cap)
        if problem:
            problems.append(f"{topic}: {problem}")


def _read_rates(
    topic: str,
    rate_limit: Rate | str | None,
    group_rate_limit: Rate | str | None,
    problems: list[str],
) -> dict[str, Rate | None]:
    """rate_limit and group_rate_limit as Rates (None: not given, or refused)."""
    rates: dict[str, Rate | None] = {}
    for name, given in (("rate_limit", rate_limit), ("group_rate_limit", group_rate_limit)):
        try:
            rates[name] = None if given is None else parse_rate(given, name)
        except ValueError as exc:
            problems.append(f"{topic}: {exc}")
            rates[name] = None
    return rates


def _read_seconds(
    topic: str, given: dict[str, Duration | None], problems: list[str]
) -> dict[str, float | None]:
    """The time limits in seconds (None: not given, or not a duration)."""
    seconds: dict[str, float | None] = {}
    for name, value in given.items():
        if value is None:
            seconds[name] = None
            continue
        try:
            seconds[name] = to_seconds(value)
        except ValueError as exc:
            problems.append(f"{topic}: {name}: {exc}")
            seconds[name] = None
    return seconds


def _read_max_attempts(topic: str, max_attempts: object, problems: list[str]) -> int | None:
    """max_attempts, a whole number from 1 (None: not given, or not a whole number)."""
    if max_attempts is None:
        return None
    if isinstance(max_attempts, bool) or not isinstance(max_attempts, int):
        problems.append(f"{topic}: max_attempts must be an integer, got {max_attempts!r}")
        return None
    if max_attempts < 1:
        problems.append(f"{topic}: max_attempts must be at least 1, got {max_attempts}")
    if max_attempts > MAX_ATTEMPTS:
        # attempts is an integer column; and not {max_attempts}: a huge int's text raises.
        problems.append(f"{topic}: max_attempts must be at most {MAX_ATTEMPTS}")
    return max_attempts


def _check_seconds(topic: str, seconds: dict[str, float | None], problems: list[str]) -> None:
    """Each time limit positive and not too long, and their order."""
    for name, value in seconds.items():
        if value is not None and value <= 0:
            problems.append(f"{topic}: {name} must be positive, got {value:g}s")
        reason = None if value is None else too_long(value)
        if reason:
            problems.append(f"{topic}: {name}: {reason}")
    problems += ordering_problems(seconds, prefix=f"{topic}: ")


def _read_keep_logs(topic: str, keep_logs: bool | int, problems: list[str]) -> int:
    """The log bytes kept per attempt: 0 for none (False, or refused)."""
    kept = KEEP_LOGS_BYTES if keep_logs is True else keep_logs
    if keep_logs is not False and (
        isinstance(kept, bool) or not isinstance(kept, int) or not 1024 <= kept <= 1048576
    ):
        problems.append(
            f"{topic}: keep_logs must be True, False or a number of bytes from 1024 to "
            f"1048576, got {keep_logs!r}"
        )
        kept = 0
    return int(kept)


def cap_problem(name: str, cap: object) -> str | None:
    """Why ``cap`` is refused as global_limit or group_limit (a whole number from 1), or
    None."""
    if cap is None:
        return None
    if isinstance(cap, bool) or not isinstance(cap, int):
        return f"{name} must be an integer from 1 to {MAX_GLOBAL_LIMIT}, got {cap!r}"
    if cap < 1:
        return f"{name} must be from 1 to {MAX_GLOBAL_LIMIT}, got {cap}"
    if cap > MAX_GLOBAL_LIMIT:
        return f"{name} must be at most {MAX_GLOBAL_LIMIT}"
    return None


def is_async_callable(fn: object) -> bool:
    """An `async def` function, a partial of one, or an object whose __call__ is one."""
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
        getattr(fn, "__call__", None)  # noqa: B004 - the method itself, not callable()
    )


def kind_mismatch(handler_is_async: bool) -> str:
    """Why a middleware of the other kind cannot wrap this handler (docs/async.md)."""
    if handler_is_async:
        return (
            "is a sync function and the handler is async: its call_next(claim) would "
            "return before the job ran; write it as async def fn(claim, call_next)"
        )
    return (
        "is async and the handler is sync: sync handlers run in children without an "
        "event loop; write it as a plain def fn(claim, call_next)"
    )


def callable_problem(fn: object, arity: int, shape: str) -> str | None:
    """Why ``fn`` cannot be called with ``arity`` positional arguments, or None. A
    signature Python cannot read (some builtins) is given the benefit of the doubt."""
    if not callable(fn):
        return f"must be callable as {shape}, got {type(fn).__name__}"
    try:
        inspect.signature(fn).bind(*([None] * arity))
    except TypeError:
        return f"must be callable as {shape}: {getattr(fn, '__name__', fn)!r} is not"
    except ValueError:
        return None
    return None


POLICY_FIELDS = ("max_attempts", *_LIMITS)  # a Policy's, in the order ``described`` lists


def described(handlers: dict[str, Handler], settings: Settings) -> dict[str, Any]:
    """What a child tells its master of the handlers it imported (the master never
    imports the application again: after a reload it learns the new options this way,
    brooq.supervisor.options): each topic's policy, queue and limits of the fleet, as
    JSON."""
    return {
        topic: {
            "policy": [getattr(h.policy(settings), name) for name in POLICY_FIELDS],
            "queue": h.queue,
            "limits": h.limits(),
        }
        for topic, h in handlers.items()
    }


def described_policy(values: Sequence[Any]) -> Policy:
    """The Policy of one topic of ``described``."""
    return Policy(**dict(zip(POLICY_FIELDS, values, strict=True)))
