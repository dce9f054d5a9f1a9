"""A Job's coordination options: ``unique_key`` (at most one active job per topic and
key), ``debounce`` (a burst of enqueues becomes one run), ``tags`` (labels to list,
cancel and retry by), ``group`` (what group_limit and group_rate_limit count by) and
``after`` with ``on_upstream_failure`` (the jobs it waits for, docs/how-to/workflows.md).
Their checks, made when a Job is built, and the words of their refusals, each naming the
option and the forms it takes.

What they promise, and how the table keeps it, is docs/how-to/unique-and-debounce.md and
docs/explanation/unique-keys.md; the statements are brooq/sql/producer.sql's job_unique_*
and job_debounce.

Owns: the limits (TAGS_MAX, TAG_MAX_LENGTH, TAG_PATTERN, DEBOUNCE_MAX_SECONDS, the key's
lengths, UPSTREAM_POLICIES), ``check_unique_key``, ``check_debounce``, ``check_tags``,
``check_combination``, ``validate_group``, ``check_after`` and ``key_taken`` (the refusal
of a retry whose key another job holds).
Must never: do I/O, or accept a value the database's CHECKs (migrations 0011 to 0013)
refuse.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterable
from typing import Any, Final

from brooq.durations import to_seconds
from brooq.errors import (
    InvalidAfter,
    InvalidDebounce,
    InvalidGroup,
    InvalidOrderingKey,
    InvalidTags,
    InvalidUniqueKey,
)

# The key is indexed with the topic (job_unique_key_idx), as idempotency_key is: a btree
# entry holds at most 2,704 bytes.
UNIQUE_KEY_MAX_LENGTH: Final = 1024
UNIQUE_KEY_MAX_BYTES: Final = 2048
# A debounce longer than a day is far more likely a unit mistaken (milliseconds given as
# seconds) than a wish.
DEBOUNCE_MAX_SECONDS: Final = 86400.0
# Tags are labels, not data: a few short words, in an alphabet that needs no quoting in
# a URL, an array literal or a shell. job_tags_check of migration 0011 holds the same rule.
TAGS_MAX: Final = 8
TAG_MAX_LENGTH: Final = 64
TAG_PATTERN: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:=/-]{0,63}")
TAG_FORM: Final = (
    f"1 to {TAG_MAX_LENGTH} characters: letters, digits and _ . : = / -, "
    "starting with a letter or a digit"
)


def check_unique_key(key: object) -> str | None:
    """The key, or None for no key ("" too, as for idempotency_key); InvalidUniqueKey
    naming what cannot be stored."""
    if key is None or key == "":
        return None
    if not isinstance(key, str):
        raise InvalidUniqueKey(f"unique_key must be a string or None, not {type(key).__name__}")
    if "\x00" in key:
        raise InvalidUniqueKey("unique_key contains the character \\x00")
    if len(key) > UNIQUE_KEY_MAX_LENGTH:
        raise InvalidUniqueKey(
            f"unique_key is {len(key)} characters long; the limit is {UNIQUE_KEY_MAX_LENGTH}"
        )
    try:
        size = len(key.encode("utf-8"))
    except UnicodeEncodeError:
        raise InvalidUniqueKey("unique_key is not valid Unicode") from None
    if size > UNIQUE_KEY_MAX_BYTES:
        raise InvalidUniqueKey(
            f"unique_key is {size} bytes long in UTF-8; the limit is {UNIQUE_KEY_MAX_BYTES}"
        )
    return key


def check_debounce(debounce: object) -> float:
    """The debounce in seconds: a timedelta, a number of seconds or a text like "2s",
    more than 0 and at most a day."""
    form = "a timedelta, a number of seconds or a text like '2s'"
    try:
        seconds = to_seconds(debounce)  # type: ignore[arg-type]
    except ValueError as exc:
        raise InvalidDebounce(f"debounce must be {form}: {exc}") from None
    if not 0 < seconds <= DEBOUNCE_MAX_SECONDS:
        raise InvalidDebounce(
            f"debounce must be more than 0 s and at most 1 day ({form}), got {seconds:g} s"
        )
    return seconds


def check_tags(tags: object) -> tuple[str, ...] | None:
    """The tags in the order given, each once; None when there are none. A list (or any
    iterable) of at most TAGS_MAX strings of TAG_FORM; a single string is refused (it
    would be read as its letters)."""
    if tags is None:
        return None
    if isinstance(tags, (str, bytes)) or not isinstance(tags, Iterable):
        raise InvalidTags(
            f"tags must be a list of strings, not {type(tags).__name__} (one tag: tags=['billing'])"
        )
    seen: dict[str, None] = {}
    for tag in tags:
        if not isinstance(tag, str):
            raise InvalidTags(f"tags must be strings, not {type(tag).__name__}")
        if not TAG_PATTERN.fullmatch(tag):
            shown = tag if len(tag) <= 80 else tag[:80] + "..."
            raise InvalidTags(f"tag {shown!r} is not a tag: {TAG_FORM}")
        seen[tag] = None
    if len(seen) > TAGS_MAX:
        raise InvalidTags(f"a job has at most {TAGS_MAX} tags, got {len(seen)}")
    return tuple(seen) or None


def check_tag(tag: object, option: str = "tag") -> str:
    """One tag to filter by (list_jobs(tag=...), --tag): TAG_FORM, or InvalidTags naming
    ``option``."""
    if not isinstance(tag, str) or not TAG_PATTERN.fullmatch(tag):
        raise InvalidTags(f"{option} {tag!r} is not a tag: {TAG_FORM}")
    return tag


def check_combination(
    unique_key: str | None, debounce: float | None, idempotency_key: str | None, scheduled: bool
) -> None:
    """debounce needs a unique_key, and sets the start itself: an idempotency_key (one job
    for the key's whole life) or an available_at beside it is refused."""
    if debounce is None:
        return
    if unique_key is None:
        raise InvalidDebounce(
            "debounce needs a unique_key: the jobs it folds into one are those of one key "
            "(Job(topic, payload, unique_key='k', debounce=timedelta(seconds=2)))"
        )
    if idempotency_key is not None:
        raise InvalidDebounce(
            "debounce cannot be combined with idempotency_key: a debounced job takes each "
            "new enqueue's payload, an idempotency key keeps the first one for good"
        )
    if scheduled:
        raise InvalidDebounce(
            "debounce cannot be combined with available_at: the job starts `debounce` "
            "after the last enqueue of its key"
        )


def key_taken(job_id: object, key: str, holder: object, holder_state: str) -> str:
    """Why a retry of ``job_id`` was refused: another active job holds its unique_key."""
    return (
        f"cannot retry job {job_id}: its unique_key {key!r} is taken by job {holder} "
        f"({holder_state}); retry it once that job is done, dead or canceled"
    )


# A job's group (group_limit, group_rate_limit): the job_group_key_check of migration 0012.
GROUP_MAX_LENGTH: Final = 128


def validate_group(group: object) -> str | None:
    """A job's group: None (no group) or 1 to GROUP_MAX_LENGTH characters without a
    control character; "" is taken as None, as for idempotency_key."""
    if group is None or group == "":
        return None
    if not isinstance(group, str):
        raise InvalidGroup(f"group must be a string or None, not {type(group).__name__}")
    if len(group) > GROUP_MAX_LENGTH:
        raise InvalidGroup(
            f"group is {len(group)} characters long; the limit is {GROUP_MAX_LENGTH}"
        )
    if not group.isprintable():
        raise InvalidGroup(f"group {group!r} holds a control character")
    return group


# A job's ordering key (Job(ordering_key=...)): a customer's id, an account's, a document's.
ORDERING_KEY_MAX_LENGTH: Final = 256


def check_ordering_key(
    key: object, unique_key: str | None, after: object, held: bool
) -> str | None:
    """A job's ordering key: None (none; "" too, as for idempotency_key) or 1 to
    ORDERING_KEY_MAX_LENGTH printable characters; refused beside a unique_key (a debounced
    or unique job waits by its own rule), after (a waiting job starts when its upstream
    jobs end, not in its key's turn) and held (a job enqueued on hold would be released
    beside its key's running job)."""
    if key is None or key == "":
        return None
    if not isinstance(key, str):
        raise InvalidOrderingKey(f"ordering_key must be a string or None, not {type(key).__name__}")
    if len(key) > ORDERING_KEY_MAX_LENGTH:
        raise InvalidOrderingKey(
            f"ordering_key is {len(key)} characters long; the limit is {ORDERING_KEY_MAX_LENGTH}"
        )
    if not key.isprintable():
        raise InvalidOrderingKey(f"ordering_key {key!r} holds a control character")
    for name, given in (("unique_key", unique_key), ("after", after), ("held", held or None)):
        if given is not None:
            raise InvalidOrderingKey(
                f"ordering_key cannot be combined with {name}: its jobs start one at a time "
                "in their key's order, which that option would break"
            )
    return key


# What happens to a job when a job it waits for ends dead or canceled (migration 0013's
# job_on_upstream_failure_check): canceled with it, or run once every one has ended.
UPSTREAM_POLICIES: Final = ("cancel", "run")


def check_after(after: object, policy: object, job_type: type) -> tuple[Any, ...]:
    """The jobs ``after`` names, each once, in the order named: a UUID (a job id, also
    as text) or a ``job_type`` instance (a Job of the same enqueue_many call);
    InvalidAfter naming what is neither, or a ``policy`` other than UPSTREAM_POLICIES."""
    if policy not in UPSTREAM_POLICIES:
        raise InvalidAfter(f"on_upstream_failure must be 'cancel' or 'run', not {policy!r}")
    if after is None:
        raise InvalidAfter("on_upstream_failure is given without after: name the jobs")
    if isinstance(after, (str, bytes)) or not isinstance(after, Iterable):
        raise InvalidAfter(f"after must be a list of job ids or Jobs, not {type(after).__name__}")
    named: dict[Any, None] = {}
    for item in after:
        if isinstance(item, job_type):
            named[_Identity(item)] = None
        elif isinstance(item, uuid.UUID):
            named[item] = None
        elif isinstance(item, str):
            try:
                named[uuid.UUID(item.strip())] = None
            except ValueError:
                raise InvalidAfter(f"after names {item!r}, which is not a job id") from None
        else:
            raise InvalidAfter(f"after names a {type(item).__name__}; it takes job ids and Jobs")
    if not named:
        raise InvalidAfter("after is empty: name at least one job, or leave it out")
    return tuple(k.job if isinstance(k, _Identity) else k for k in named)


class _Identity:
    """A Job as a dict key by identity: two equal Jobs are two jobs."""

    __slots__ = ("job",)

    def __init__(self, job: object) -> None:
        self.job = job

    def __hash__(self) -> int:
        return id(self.job)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Identity) and other.job is self.job
