"""Hostile input at enqueue, property-tested with Hypothesis against a real PostgreSQL.

Every generated job is either accepted and comes back from the database exactly as its
JSON round trip (types included: a float stays a float), or refused with a brooq.InvalidJob
subclass with nothing written. Any other exception fails the test.

About 10,000 cases in all: validation alone is cheap and gets most of them; the database
round trips get fewer.
"""

from __future__ import annotations

import json
import math
import random
import re
import sys
import time
from collections.abc import Callable, Iterator
from datetime import date, datetime, timedelta, timezone
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import brooq
from brooq import InvalidIdempotencyKey, InvalidJob, InvalidPayload, InvalidTopic, Job
from brooq.encoding import MAX_PAYLOAD_DEPTH
from brooq.job import IDEMPOTENCY_KEY_MAX_BYTES, IDEMPOTENCY_KEY_MAX_LENGTH, TOPIC_MAX_LENGTH

LIMIT = 16 * 1024  # max_payload_bytes of the database tests' queue

CHEAP = settings(
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
WITH_DB = settings(
    CHEAP,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.function_scoped_fixture,  # one database per test function, on purpose
    ],
)

# -- strategies ------------------------------------------------------------------------

HOSTILE_CHARS = st.one_of(
    st.characters(exclude_categories=()),  # any code point, lone surrogates included
    st.sampled_from([*"\x00\ud800\udfff\\\"';\n\u2028\ufeff\U0001f600", *"e+[]{}\x7f\uffff"]),
)
TEXT = st.one_of(
    st.text(HOSTILE_CHARS, max_size=30),
    st.sampled_from(["\\u0000", "\\\\u0000", "1e+16", '"]}', "a\x00b", "\ud83d\ude00", "é"]),
)
FLOATS = st.one_of(
    st.floats(),  # nan and infinities included
    st.sampled_from([1e16, 1.5e16, 1e23, 1e300, -1.7976931348623157e308, 5e-324, -0.0, 1e-7]),
)
INTS = st.one_of(
    st.integers(),
    st.integers(-(10**400), 10**400),
    # Built, not listed: repr() of an int over 4,300 digits raises (Hypothesis shows it).
    st.sampled_from([4299, 4300, 5000]).map(lambda n: 10**n),
    st.sampled_from([2**63, -(2**63) - 1]),
)
SCALARS = st.one_of(st.none(), st.booleans(), INTS, FLOATS, TEXT)
UNSUPPORTED = st.one_of(
    st.binary(max_size=8),
    st.sets(st.integers(), max_size=3),
    st.frozensets(st.integers(), max_size=2),
    st.complex_numbers(),
    st.timedeltas(),  # datetime, Decimal and UUID are written as text (brooq.encoding.as_text)
    st.builds(object),
)
KEYS = st.one_of(
    TEXT,
    st.integers(),
    FLOATS,
    st.booleans(),
    st.none(),
    st.tuples(st.integers()),
    st.binary(max_size=4),
    st.frozensets(st.integers(), max_size=1),
)


def _containers(children: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(
        st.lists(children, max_size=4),
        st.tuples(children, children),
        st.dictionaries(KEYS, children, max_size=4),
    )


def nest(depth: int, leaf: Any, objects: bool) -> Any:
    value = leaf
    for i in range(depth):
        value = {"k": value} if objects and i % 2 else [value]
    return value


TREES = st.recursive(st.one_of(SCALARS, SCALARS, SCALARS, UNSUPPORTED), _containers, max_leaves=20)
DEEP = st.builds(
    nest,
    st.one_of(
        st.integers(0, 1200), st.sampled_from([MAX_PAYLOAD_DEPTH - 1, MAX_PAYLOAD_DEPTH])
    ).map(lambda d: d if d < 1200 else 10_000),
    SCALARS,
    st.booleans(),
)
PAYLOADS = st.one_of(TREES, TREES, DEEP)

_TOO_MANY_DIGITS = 10**4300  # Python refuses int <-> str beyond 4,300 digits


def _text_ok(text: str) -> bool:
    if "\x00" in text:
        return False
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _scalar_ok(value: Any) -> bool:
    if value is None or isinstance(value, bool):
        return True
    if isinstance(value, int):
        return abs(value) < _TOO_MANY_DIGITS
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, str):
        return _text_ok(value)
    return False


def storable(payload: Any) -> bool:
    """An independent judgement: can this payload be stored as JSON in jsonb?"""
    stack = [(payload, 0)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, list | tuple):
            if depth + 1 > MAX_PAYLOAD_DEPTH:
                return False
            stack.extend((item, depth + 1) for item in value)
        elif isinstance(value, dict):
            if depth + 1 > MAX_PAYLOAD_DEPTH:
                return False
            for key, item in value.items():
                if isinstance(key, list | tuple | dict) or not _scalar_ok(key):
                    return False
                stack.append((item, depth + 1))
        elif not _scalar_ok(value):
            return False
    return True


def same(a: Any, b: Any) -> bool:
    """Equal with the same types all the way down (1 is not 1.0, True is not 1)."""
    stack = [(a, b)]
    while stack:
        x, y = stack.pop()
        if type(x) is not type(y):
            return False
        if isinstance(x, dict):
            if x.keys() != y.keys():
                return False
            stack.extend((x[k], y[k]) for k in x)
        elif isinstance(x, list):
            if len(x) != len(y):
                return False
            stack.extend(zip(x, y, strict=True))
        elif x != y:
            return False
    return True


def json_round_trip(payload: Any) -> Any:
    return json.loads(json.dumps(payload, allow_nan=False))


# -- fixtures ----------------------------------------------------------------------------


@pytest.fixture
def small_queue(dsn: str) -> Iterator[brooq.Queue]:
    q = brooq.Queue(dsn, max_payload_bytes=LIMIT)
    yield q
    q.close()


@pytest.fixture
def conn(dsn: str) -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(dsn) as c:
        yield c


def rows(db: psycopg.Connection[Any]) -> int:
    row = db.execute("SELECT count(*) FROM job_all").fetchone()
    assert row is not None
    return int(row[0])


# -- payloads ----------------------------------------------------------------------------


@settings(CHEAP, max_examples=4000)
@given(PAYLOADS)
@example(1e23)
@example({"x": [1e16, -1.5e300]})
@example("\x00")
@example({"\ud800": 1})
@example(10**4300)
@example({float("nan"): 1})
def test_payload_is_validated_exactly(payload: Any) -> None:
    # (No deep @example here: Hypothesis pretty-prints explicit examples recursively.
    # test_any_accepted_payload_is_readable_from_a_deep_stack has them.)
    good = storable(payload)
    try:
        job = Job("t", payload)
    except InvalidPayload:
        assert not good, "refused a storable payload"
        return
    assert good, "accepted a payload that cannot be stored"
    assert same(json.loads(job.payload_json), json_round_trip(payload))


@settings(WITH_DB, max_examples=1200)
@given(payload=PAYLOADS, path=st.sampled_from(["queue", "conn", "many"]))
@example(payload=1e23, path="queue")
@example(payload=[1e300, {"a": -1.7976931348623157e308}], path="conn")
@example(payload="x" * LIMIT, path="many")
@example(payload={"\\N": "\\.\t\n\\\\ \\u0000 é"}, path="many")
def test_payload_round_trips_through_the_database_or_nothing_is_written(
    small_queue: brooq.Queue,
    conn: psycopg.Connection[Any],
    db: psycopg.Connection[Any],
    payload: Any,
    path: str,
) -> None:
    before = rows(db)
    good = storable(payload)
    built = False
    try:
        job = Job("t", payload)
        built = True
        if path == "queue":
            job_id, created = small_queue.enqueue(job)
        elif path == "conn":
            with conn.transaction():
                job_id, created = brooq.enqueue(conn, job, max_payload_bytes=LIMIT)
        else:  # the whole batch or nothing
            (_, first_created), (job_id, created) = small_queue.enqueue_many(
                [Job("t", "companion"), job]
            )
            assert first_created
    except InvalidJob as exc:
        assert rows(db) == before, "something was written despite the error"
        assert isinstance(exc, InvalidPayload)
        if good:  # only the size limit may refuse a storable payload, after it was built
            assert built and "the limit is" in str(exc), exc
        return
    assert good, "accepted a payload that cannot be stored"
    assert created
    assert rows(db) == before + (2 if path == "many" else 1)
    record = small_queue.get(job_id)
    assert record is not None
    assert same(record.payload, json_round_trip(payload)), (record.payload, payload)


@pytest.mark.parametrize(
    "value",
    [1e16, 1.5e16, 1e23, 1e300, -1.7976931348623157e308, 123456789012345680.0, 5e-324, 1e-7],
)
def test_large_floats_come_back_as_the_same_floats(queue: brooq.Queue, value: float) -> None:
    """Regression: jsonb keeps 1e+23 as the integer 100000000000000000000000, so the
    payload came back as an int (and 1e23 != 10**23)."""
    job_id, _ = queue.enqueue(Job("t", {"v": value, "list": [value, -value]}))
    record = queue.get(job_id)
    assert record is not None
    assert same(record.payload, {"v": value, "list": [value, -value]})


def test_huge_integers_are_encoded_in_linear_time() -> None:
    """Regression: the first float rewrite could start a match at every digit of a
    4,300-digit integer and backtrack from each (0.9 s per such integer)."""
    payload = [10**4299, -(10**4299), 1e23] * 30
    started = time.perf_counter()
    job = Job("t", payload)
    assert time.perf_counter() - started < 2.0
    assert same(json.loads(job.payload_json), payload)


def test_float_like_text_is_left_alone(queue: brooq.Queue) -> None:
    text = 'a "1e+16" \\"2e+5\\" [3e+7]'
    job_id, _ = queue.enqueue(Job("t", {text: text, "n": 3e16}))
    record = queue.get(job_id)
    assert record is not None and same(record.payload, {text: text, "n": 3e16})


def _from_a_deeper_stack(frames: int, fn: Callable[[], Any]) -> Any:
    return fn() if frames == 0 else _from_a_deeper_stack(frames - 1, fn)


def test_any_accepted_payload_is_readable_from_a_deep_stack(queue: brooq.Queue) -> None:
    """Regression: the deepest payload accepted was whatever the producer's stack allowed
    (about 950 levels); a reader 100 frames deeper (a worker) then hit RecursionError on
    a job already stored. The limit is now fixed, far below the recursion limit."""
    deepest = nest(MAX_PAYLOAD_DEPTH, "leaf", True)
    job_id, _ = queue.enqueue(Job("t", deepest))
    frames = sys.getrecursionlimit() - MAX_PAYLOAD_DEPTH - 200
    record = _from_a_deeper_stack(frames, lambda: queue.get(job_id))
    assert record is not None and same(record.payload, json_round_trip(deepest))
    for depth in (MAX_PAYLOAD_DEPTH + 1, 900, 990, 10_000):
        with pytest.raises(InvalidPayload, match="nested"):
            Job("t", nest(depth, "leaf", True))


def test_depth_counts_brackets_outside_strings_only() -> None:
    brackets = "[{" * 500
    payload = nest(MAX_PAYLOAD_DEPTH - 1, {brackets: brackets}, False)
    assert json.loads(Job("t", payload).payload_json) == payload
    wide = [[[]] for _ in range(1000)]  # many containers, shallow
    assert json.loads(Job("t", wide).payload_json) == wide


# -- topics ------------------------------------------------------------------------------

_TOPIC = re.compile(r"[a-z0-9]+(?:[._-][a-z0-9]+)*")
VALID_TOPICS = st.builds(
    lambda first, rest: first + "".join(sep + word for sep, word in rest),
    st.text("abcxyz0189", min_size=1, max_size=6),
    st.lists(st.tuples(st.sampled_from("._-"), st.text("abz09", min_size=1, max_size=4))),
)
TOPICS = st.one_of(
    st.text(HOSTILE_CHARS, max_size=40),
    st.text(st.sampled_from("abz09._-A;' \n\x00é"), max_size=20),
    VALID_TOPICS,
    st.builds(  # a valid topic with one hostile character put somewhere
        lambda t, c, i: t[:i] + c + t[i:], VALID_TOPICS, HOSTILE_CHARS, st.integers(0, 50)
    ),
    st.builds(lambda n: "a" * n, st.integers(TOPIC_MAX_LENGTH - 2, TOPIC_MAX_LENGTH + 80)),
    st.sampled_from(
        ["t'; DROP TABLE job; --", 'a"b', "a;b", "jobs\n", "\uff54", "\u0130", "\u0131"]
    ),
)


def topic_ok(topic: str) -> bool:
    return len(topic) <= TOPIC_MAX_LENGTH and _TOPIC.fullmatch(topic) is not None


@settings(CHEAP, max_examples=2500)
@given(TOPICS)
def test_topic_is_validated_exactly(topic: str) -> None:
    try:
        Job(topic)
    except InvalidTopic:
        assert not topic_ok(topic)
    else:
        assert topic_ok(topic)


@settings(WITH_DB, max_examples=400)
@given(TOPICS)
@example("abc\n")  # Python's "$" matches before a final newline; the CHECK's does not
@example("a" * TOPIC_MAX_LENGTH)
@example("t'; DROP TABLE job; --")
def test_topic_reaches_the_database_intact_or_not_at_all(
    queue: brooq.Queue, db: psycopg.Connection[Any], topic: str
) -> None:
    before = rows(db)
    try:
        job_id, _ = queue.enqueue(Job(topic, {"t": topic[:10]}))
    except InvalidTopic:
        assert not topic_ok(topic)
        assert rows(db) == before
        return
    assert topic_ok(topic)
    assert rows(db) == before + 1
    record = queue.get(job_id)
    assert record is not None and record.topic == topic


# -- idempotency keys --------------------------------------------------------------------


def random_astral_text(seed: int, length: int) -> str:
    """Long, varied, incompressible 4-byte characters (cheaper to draw than a list of
    700 characters)."""
    rand = random.Random(seed)
    return "".join(chr(rand.randrange(0x10000, 0x110000)) for _ in range(length))


KEYS_TEXT = st.one_of(
    st.text(HOSTILE_CHARS, max_size=40),
    st.just(""),
    st.builds(
        lambda c, n: c * n,
        st.sampled_from(["k", "é", "€", "\U0001f600", "\x00", "\ud800"]),
        st.integers(IDEMPOTENCY_KEY_MAX_BYTES // 4 - 2, IDEMPOTENCY_KEY_MAX_LENGTH + 2),
    ),
    st.builds(random_astral_text, st.integers(0, 2**32), st.integers(500, 700)),
)


def key_ok(key: str) -> bool:
    return (
        len(key) <= IDEMPOTENCY_KEY_MAX_LENGTH
        and _text_ok(key)
        and len(key.encode("utf-8")) <= IDEMPOTENCY_KEY_MAX_BYTES
    )


@settings(CHEAP, max_examples=1000)
@given(KEYS_TEXT)
def test_idempotency_key_is_validated_exactly(key: str) -> None:
    try:
        job = Job("t", idempotency_key=key)
    except InvalidIdempotencyKey:
        assert not key_ok(key)
    else:
        assert key_ok(key)
        assert job.idempotency_key == (key or None)


@settings(WITH_DB, max_examples=400)
@given(KEYS_TEXT)
@example("\U0001f600" * 700)  # 2,800 bytes: over the btree limit with the topic
@example("".join(chr(0x10000 + i * 7919 % 0xFFFFF) for i in range(700)))
def test_idempotency_key_is_stored_and_deduplicates_or_nothing_is_written(
    queue: brooq.Queue, db: psycopg.Connection[Any], key: str
) -> None:
    before = rows(db)
    topic = f"k{before}"  # a fresh topic each time: no conflict with earlier examples
    try:
        first = queue.enqueue(Job(topic, idempotency_key=key))
    except InvalidIdempotencyKey:
        assert not key_ok(key)
        assert rows(db) == before
        return
    assert key_ok(key)
    again = queue.enqueue(Job(topic, idempotency_key=key))
    if key:
        assert first[1] is True and again == (first[0], False)
        assert rows(db) == before + 1
    else:  # "" is no key: never deduplicated
        assert first[1] is True and again[1] is True and rows(db) == before + 2
    record = queue.get(first[0])
    assert record is not None and record.idempotency_key == (key or None)


# -- available_at ------------------------------------------------------------------------

OFFSETS = st.builds(
    timezone,
    st.timedeltas(
        min_value=timedelta(hours=-23, minutes=-59), max_value=timedelta(hours=23, minutes=59)
    ),
)
WHEN = st.one_of(
    st.datetimes(timezones=OFFSETS),
    st.datetimes(min_value=datetime(1, 1, 1), max_value=datetime(1, 1, 4), timezones=OFFSETS),
    st.datetimes(min_value=datetime(9999, 12, 28), timezones=OFFSETS),
    st.datetimes(),  # naive
    st.dates(),
    st.sampled_from(["2030-01-01T00:00:00+00:00", 1_900_000_000, None]),
)


EARLIEST = datetime(1, 1, 3, tzinfo=timezone.utc)
LATEST = datetime(9999, 12, 29, 23, 59, 59, 999999, tzinfo=timezone.utc)


def when_ok(when: Any) -> bool:
    """None, or an aware datetime at least two days inside years 1 to 9999 in UTC."""
    if when is None:
        return True
    if not isinstance(when, datetime) or when.utcoffset() is None:
        return False
    try:
        utc = when.astimezone(timezone.utc)
    except OverflowError:
        return False
    return EARLIEST <= utc <= LATEST


@settings(WITH_DB, max_examples=300)
@given(WHEN)
@example(datetime(1, 1, 1, tzinfo=timezone(timedelta(hours=14))))  # year 0 in UTC
@example(datetime(9999, 12, 31, 23, 59, tzinfo=timezone(timedelta(hours=-14))))  # year 10000
@example(datetime(1, 1, 3, tzinfo=timezone.utc))
def test_available_at_is_readable_back_or_refused(
    queue: brooq.Queue, db: psycopg.Connection[Any], when: Any
) -> None:
    """Regression: an aware datetime whose UTC instant falls in year 0 or 10000 was stored,
    and then every read of the row (queue.get, brooq jobs list) raised DataError."""
    before = rows(db)
    try:
        job_id, _ = queue.enqueue(Job("t", available_at=when))
    except InvalidJob:
        assert not when_ok(when)
        assert rows(db) == before
        return
    assert when_ok(when)
    record = queue.get(job_id)
    assert record is not None
    if when is not None:
        assert record.available_at == when


@pytest.mark.parametrize("when", [date(2030, 1, 1), "2030-01-01", 0, datetime(2030, 1, 1)])
def test_available_at_must_be_an_aware_datetime(when: Any) -> None:
    with pytest.raises(brooq.NaiveDatetime):
        Job("t", available_at=when)


# -- the same hostile values in other places ---------------------------------------------


@settings(CHEAP, max_examples=300)
@given(UNSUPPORTED)
def test_unsupported_types_are_refused_as_invalid_payload(value: Any) -> None:
    with pytest.raises(InvalidPayload):
        Job("t", value)
    with pytest.raises(InvalidPayload):
        Job("t", {"nested": [value]})


def test_refused_payload_errors_name_the_reason_without_a_traceback_chain() -> None:
    for payload, reason in [
        (b"x", "not JSON-serialisable"),
        (float("inf"), "not JSON-serialisable"),
        ("\x00", "\\u0000"),
        ("\udc80", "unpaired surrogate"),
        (timedelta(seconds=1), "not JSON-serialisable"),
        (10**4300, "not JSON-serialisable"),
        (nest(MAX_PAYLOAD_DEPTH + 1, 0, False), f"more than {MAX_PAYLOAD_DEPTH} levels"),
    ]:
        with pytest.raises(InvalidPayload) as info:
            Job("t", payload)
        assert reason in str(info.value)
        assert info.value.__suppress_context__ or info.value.__context__ is None
