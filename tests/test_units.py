"""Plain unit tests: durations, settings, handler validation, backoff, job validation, DSNs.

No database here except one connection attempt to a closed port (the DSN error path).
"""

from __future__ import annotations

import logging
import random
import re
import string
from datetime import timedelta
from fractions import Fraction
from typing import Any
from urllib.parse import quote

import pytest
from hypothesis import assume, example, given
from hypothesis import strategies as st
from psycopg import conninfo

import brooq
from brooq import dsn as dsn_mod
from brooq import handlers, settings
from brooq.db import connect
from brooq.durations import format_seconds, parse_duration_string, to_seconds
from brooq.errors import DatabaseUnavailable, InvalidDsn, InvalidSettings, InvalidTopic
from brooq.job import TOPIC_MAX_LENGTH, Job, validate_topic
from brooq.worker import retry

# -- durations ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("1h30m", 5400.0),
        ("250ms", 0.25),
        ("2.5s", 2.5),
        ("1m30s", 90.0),
        ("1d", 86400.0),
        ("0s", 0.0),
        ("  45s ", 45.0),
        ("1h1m1s1ms", 3661.001),
    ],
)
def test_parse_duration(text: str, seconds: float) -> None:
    assert parse_duration_string(text) == pytest.approx(seconds, abs=1e-12)


@pytest.mark.parametrize("bare", ["120", "1.5", " 30 "])
def test_bare_number_is_rejected_with_a_hint(bare: str) -> None:
    with pytest.raises(ValueError, match="no unit") as info:
        parse_duration_string(bare)
    assert f"'{bare.strip()}s'" in str(info.value)


@pytest.mark.parametrize(
    "garbage",
    [
        "",
        "   ",
        "s",
        "abc",
        "5x",
        "-5s",
        "+5s",
        "5s5",
        "1e3s",
        "1h 30m",
        "5 s",
        ".5s",
        "5.s",
        "inf s",
        "infs",
        "nan",
        "5S",
        "\u0665s",  # ARABIC-INDIC DIGIT FIVE: ASCII digits only
        "\uff15s",  # FULLWIDTH DIGIT FIVE
        "1" * 400 + "s",  # float("1" * 400) is inf
    ],
)
def test_garbage_durations_are_rejected(garbage: str) -> None:
    with pytest.raises(ValueError):
        parse_duration_string(garbage)
    with pytest.raises(ValueError):
        to_seconds(garbage)


def test_to_seconds_accepts_timedelta_numbers_and_strings() -> None:
    assert to_seconds(timedelta(minutes=2, milliseconds=500)) == 120.5
    assert to_seconds(5) == 5.0 and isinstance(to_seconds(5), float)
    assert to_seconds(2.5) == 2.5
    assert to_seconds("3m") == 180.0
    assert to_seconds(timedelta(0)) == 0.0


@pytest.mark.parametrize(
    "value", [True, False, None, float("inf"), float("-inf"), float("nan"), [1], b"5s", 10**400]
)
def test_to_seconds_rejects_non_durations_with_value_error(value: Any) -> None:
    with pytest.raises(ValueError):
        to_seconds(value)


def test_to_seconds_of_a_huge_int_does_not_overflow_or_echo_it() -> None:
    # float(10**5000) raises OverflowError and repr(10**5000) raises ValueError by itself.
    with pytest.raises(ValueError, match="integer this large") as info:
        to_seconds(10**5000)
    assert len(str(info.value)) < 200


def test_bare_number_refused_when_asked() -> None:
    with pytest.raises(ValueError, match="no unit"):
        to_seconds(5, allow_bare_number=False)


_UNIT_SECONDS = {"ms": Fraction(1, 1000), "s": 1, "m": 60, "h": 3600, "d": 86400}


@given(
    st.lists(st.tuples(st.integers(0, 10**6), st.sampled_from(sorted(_UNIT_SECONDS))), min_size=1)
)
def test_composed_durations_parse_to_their_sum(parts: list[tuple[int, str]]) -> None:
    text = "".join(f"{n}{unit}" for n, unit in parts)
    expected = sum(n * _UNIT_SECONDS[unit] for n, unit in parts)
    assert parse_duration_string(text) == pytest.approx(float(expected), rel=1e-12)


@given(st.integers(0, 10**7))
def test_format_seconds_round_trips(seconds: int) -> None:
    assert parse_duration_string(format_seconds(seconds)) == seconds


# -- settings ----------------------------------------------------------------------------


def test_defaults_without_environment() -> None:
    assert settings.load(environ={}) == settings.Settings()


def test_environment_layer() -> None:
    loaded = settings.load(
        environ={
            "QUEUE_WORKERS": "4",
            "QUEUE_LEASE": "45s",
            "QUEUE_POLL_INTERVAL": "250ms",
            "QUEUE_ATTEMPT_TIMEOUT": "2m",
            "QUEUE_MAX_EXECUTION_TIMEOUT": "1h",
            "QUEUE_OPS_ADDR": "0.0.0.0:9000",
            "UNRELATED": "ignored",
        }
    )
    assert (loaded.workers, loaded.lease, loaded.poll_interval) == (4, 45.0, 0.25)
    assert (loaded.attempt_timeout, loaded.max_execution_timeout) == (120.0, 3600.0)
    assert loaded.ops_addr == "0.0.0.0:9000"
    assert loaded.renew_period == 15.0


@pytest.mark.parametrize("empty", ["", "   ", "\t"])
def test_empty_environment_value_counts_as_unset(empty: str) -> None:
    environ = {var: empty for var in settings.ENVIRONMENT}
    # The one exception: QUEUE_OPS_ADDR= turns the ops surface off.
    assert settings.load(environ=environ) == settings.Settings(ops_addr="")
    del environ["QUEUE_OPS_ADDR"]
    assert settings.load(environ=environ) == settings.Settings()
    assert settings.getenv("QUEUE_LEASE", {"QUEUE_LEASE": empty}) is None
    assert settings.getenv("QUEUE_LEASE", {"QUEUE_LEASE": "5s"}) == "5s"


def test_layers_in_order_defaults_environment_overrides_flags() -> None:
    environ = {"QUEUE_WORKERS": "3", "QUEUE_LEASE": "40s", "QUEUE_MAX_ATTEMPTS": "7"}
    loaded = settings.load(
        environ=environ,
        overrides={"workers": 5, "lease": timedelta(seconds=50)},
        flags={"workers": 8, "lease": None},  # None: the flag was not given
    )
    assert loaded.workers == 8  # flag beats Queue(...) beats environment
    assert loaded.lease == 50.0  # Queue(...) beats environment; an absent flag changes nothing
    assert loaded.max_attempts == 7  # environment beats the default
    assert loaded.poll_interval == settings.Settings().poll_interval


def test_numbers_in_code_are_seconds_but_the_environment_needs_a_unit() -> None:
    assert settings.load(environ={}, overrides={"lease": 12}).lease == 12.0
    with pytest.raises(InvalidSettings) as info:
        settings.load(environ={"QUEUE_LEASE": "12"})
    assert len(info.value.problems) == 1
    assert "QUEUE_LEASE" in info.value.problems[0] and "'12s'" in info.value.problems[0]


def test_every_problem_is_listed_at_once() -> None:
    environ = {
        "QUEUE_LEASE": "0s",
        "QUEUE_WORKERS": "0",
        "QUEUE_ATTEMPT_TIMEOUT": "10m",
        "QUEUE_MAX_EXECUTION_TIMEOUT": "5m",
        "QUEUE_POLL_INTERVAL": "120",
    }
    with pytest.raises(InvalidSettings) as info:
        settings.load(environ=environ)
    problems = info.value.problems
    assert len(problems) == 4, problems
    text = "\n".join(problems)
    assert "QUEUE_POLL_INTERVAL" in text and "'120s'" in text
    assert any(p.startswith("workers must be at least 1") for p in problems)
    assert any(p.startswith("lease must be positive") for p in problems)
    assert any(
        "attempt_timeout (600s) must not exceed max_execution_timeout (300s)" in p for p in problems
    )
    # The message lists them all too, one a line.
    assert str(info.value).count("\n  - ") == 4


def test_problems_from_every_layer_are_collected() -> None:
    with pytest.raises(InvalidSettings) as info:
        settings.load(
            environ={"QUEUE_MAX_ATTEMPTS": "many", "QUEUE_BACKOFF_BASE": "2m"},
            overrides={"workers": "x", "lease": True, "nonsense": 1},
            flags={"graceful_timeout": -1, "ops_addr": "localhost"},
        )
    problems = info.value.problems
    text = "\n".join(problems)
    assert "QUEUE_MAX_ATTEMPTS='many'" in text
    assert "Queue(workers=...)" in text and "Queue(lease=...)" in text
    assert "unknown setting 'nonsense'" in text
    assert "graceful_timeout must be positive" in text
    assert "backoff_base (120s) must not exceed backoff_max (60s)" in text
    assert "ops_addr must be HOST:PORT" in text
    assert len(problems) == 7, problems


@pytest.mark.parametrize(
    ("environ", "overrides"),
    [
        ({}, {"lease": 10**400}),  # float() of it raised OverflowError
        ({"QUEUE_LEASE": "1" * 400 + "s"}, {}),  # parsed as inf and accepted
        ({}, {"lease": float("inf")}),
    ],
)
def test_absurd_durations_are_settings_problems(
    environ: dict[str, str], overrides: dict[str, Any]
) -> None:
    with pytest.raises(InvalidSettings) as info:
        settings.load(environ=environ, overrides=overrides)
    assert len(info.value.problems) == 1 and "lease" in info.value.problems[0].lower()


@given(st.dictionaries(st.sampled_from(sorted(settings.ENVIRONMENT)), st.text(max_size=12)))
def test_load_never_raises_anything_but_invalid_settings(environ: dict[str, str]) -> None:
    try:
        loaded = settings.load(environ=environ)
    except InvalidSettings as exc:
        assert exc.problems
    else:
        assert settings.validate(loaded) == []


# -- handler registration ----------------------------------------------------------------


def _build(**options: Any) -> handlers.Handler:
    given_options = {
        "max_attempts": None,
        "attempt_timeout": None,
        "max_execution_timeout": None,
        "backoff_base": None,
        "backoff_max": None,
    }
    given_options.update(options)
    return handlers.build("report.render", lambda claim: None, **given_options)


def test_handler_options_in_seconds_and_fallback_to_settings() -> None:
    h = _build(max_attempts=3, attempt_timeout="10s", backoff_max=timedelta(minutes=2))
    assert (h.max_attempts, h.attempt_timeout, h.backoff_max) == (3, 10.0, 120.0)
    policy = h.policy(settings.Settings(max_execution_timeout=600.0, backoff_base=2.0))
    assert policy == handlers.Policy(
        max_attempts=3,
        attempt_timeout=10.0,
        max_execution_timeout=600.0,
        backoff_base=2.0,
        backoff_max=120.0,
    )
    assert handlers.policy_problems("report.render", policy) == []


def test_handler_attempt_timeout_above_max_execution_timeout() -> None:
    with pytest.raises(InvalidSettings) as info:
        _build(attempt_timeout="10m", max_execution_timeout="5m")
    assert info.value.problems == [
        "report.render: attempt_timeout (600s) must not exceed max_execution_timeout (300s)"
    ]


def test_handler_problems_are_all_reported() -> None:
    with pytest.raises(InvalidSettings) as info:
        _build(
            max_attempts=0,
            attempt_timeout="10m",
            max_execution_timeout="5m",
            backoff_base=0,
            backoff_max=-1,
        )
    problems = info.value.problems
    assert len(problems) == 4, problems
    text = "\n".join(problems)
    assert "max_attempts must be at least 1, got 0" in text
    assert "backoff_base must be positive, got 0s" in text
    assert "backoff_max must be positive, got -1s" in text
    assert "attempt_timeout (600s) must not exceed max_execution_timeout (300s)" in text
    assert all(p.startswith("report.render: ") for p in problems)


@pytest.mark.parametrize(
    "options",
    [
        {"max_attempts": True},
        {"max_attempts": "3"},
        {"max_attempts": -2},
        {"attempt_timeout": "30"},
        {"attempt_timeout": "soon"},
        {"attempt_timeout": 0},
        {"max_execution_timeout": timedelta(seconds=-1)},
        {"backoff_base": "1m", "backoff_max": "1s"},
        {"backoff_base": 10**400},
    ],
)
def test_bad_handler_options(options: dict[str, Any]) -> None:
    with pytest.raises(InvalidSettings) as info:
        _build(**options)
    assert len(info.value.problems) == 1, info.value.problems


def test_queue_handler_validates_at_registration() -> None:
    q = brooq.Queue("postgresql://nobody@127.0.0.1:1/nothing")
    with pytest.raises(InvalidSettings):
        q.handler("a", attempt_timeout="10m", max_execution_timeout="5m")(lambda claim: None)
    with pytest.raises(InvalidTopic):
        q.handler("Not A Topic")(lambda claim: None)
    assert q.handlers == {}


def test_policy_problems_for_settings_fallbacks() -> None:
    h = _build(attempt_timeout="10m")
    policy = h.policy(settings.Settings(max_execution_timeout=300.0))
    assert handlers.policy_problems("t", policy) == [
        "t: attempt_timeout (600s) must not exceed max_execution_timeout (300s)"
    ]


# -- backoff -----------------------------------------------------------------------------


def test_backoff_ceiling_doubles_until_the_maximum() -> None:
    ceilings = [retry.backoff_ceiling(a, 1.0, 60.0) for a in range(1, 9)]
    assert ceilings == [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 60.0, 60.0]
    assert retry.backoff_ceiling(0, 1.0, 60.0) == 1.0  # never below base


@pytest.mark.parametrize("attempts", [1000, 1024, 1025, 1100, 10_000, 10**9])
def test_backoff_of_huge_attempt_numbers_is_the_maximum(attempts: int) -> None:
    assert retry.backoff_ceiling(attempts, 1.0, 60.0) == 60.0
    assert 30.0 <= retry.backoff(attempts, 1.0, 60.0, random.Random(attempts).random()) <= 60.0


def test_jitter_spans_half_to_full_ceiling() -> None:
    assert retry.backoff(4, 1.0, 60.0, 0.0) == 4.0
    assert retry.backoff(4, 1.0, 60.0, 0.5) == 6.0
    assert retry.backoff(4, 1.0, 60.0, 0.999999) == pytest.approx(8.0, abs=1e-5)


def test_jitter_actually_varies() -> None:
    rand = random.Random(7)
    waits = {retry.backoff(5, 1.0, 60.0, rand.random()) for _ in range(50)}
    assert len(waits) > 40
    assert all(8.0 <= w <= 16.0 for w in waits)


def test_delay_is_clamped() -> None:
    assert retry.delay_seconds(5.0, 60.0) == 5.0
    assert retry.delay_seconds(3600.0, 60.0) == 60.0
    assert retry.delay_seconds(-1.0, 60.0) == 0.0


@given(
    attempts=st.integers(1, 20_000),
    base=st.floats(1e-3, 1e6),
    spread=st.floats(1.0, 1e6),
    r=st.floats(0.0, 1.0, exclude_max=True),
)
@example(attempts=10_000, base=1.0, spread=60.0, r=0.0)
@example(attempts=1024, base=1e6, spread=1.0, r=0.5)
def test_backoff_property(attempts: int, base: float, spread: float, r: float) -> None:
    maximum = base * spread
    exact = min(Fraction(base) * 2 ** (attempts - 1), Fraction(maximum))
    d = retry.backoff_ceiling(attempts, base, maximum)
    assert d == float(exact)
    assert base <= d <= maximum
    # Another attempt never lowers the ceiling (once at the maximum, it stays there).
    assert d <= retry.backoff_ceiling(attempts + 1, base, maximum) <= maximum
    wait = retry.backoff(attempts, base, maximum, r)
    assert d / 2 <= wait <= d


# -- job validation ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "topic", ["a", "0", "email.send", "a-b_c.d", "v2.report-render_pdf", "x" * TOPIC_MAX_LENGTH]
)
def test_valid_topics(topic: str) -> None:
    assert Job(topic).topic == topic


@pytest.mark.parametrize(
    "topic",
    [
        "",
        "A",
        "Email",
        "a..b",
        ".a",
        "a.",
        "-a",
        "a__b",
        "a b",
        "é",
        "a;drop table job",
        "a'b",
        'a"b',
        "a\n",  # Python's "$" matches before a final newline; the database's does not
        "\na",
        "a\x00",
        "x" * (TOPIC_MAX_LENGTH + 1),
        5,
        None,
        b"abc",
    ],
)
def test_invalid_topics(topic: Any) -> None:
    with pytest.raises(InvalidTopic):
        Job(topic)
    with pytest.raises(brooq.InvalidJob):
        validate_topic(topic)


_TOPIC_ORACLE = re.compile(r"[a-z0-9]+(?:[._-][a-z0-9]+)*")


@given(
    st.one_of(
        st.text(max_size=140),
        st.from_regex(_TOPIC_ORACLE, fullmatch=True),
        st.builds(
            lambda t, c, i: t[:i] + c + t[i:],
            st.from_regex(_TOPIC_ORACLE, fullmatch=True),
            st.characters(),
            st.integers(0, 200),
        ),
    )
)
@example("abc\n")
@example("x" * 129)
def test_topic_acceptance_matches_the_rule(topic: str) -> None:
    valid = len(topic) <= TOPIC_MAX_LENGTH and _TOPIC_ORACLE.fullmatch(topic) is not None
    try:
        Job(topic)
    except InvalidTopic:
        assert not valid, topic
    else:
        assert valid, topic


# -- connection strings ------------------------------------------------------------------

_SECRET = "Hunter2-s3cret"


@pytest.mark.parametrize(
    "bad",
    [
        f"host=db password={_SECRET} 'unterminated",
        f"password={_SECRET} host",
        f"postgresql://u:{_SECRET}@db:5432/app?nonsense_option=1",
        f"postgresql://u:{_SECRET}@[::1/app",
    ],
)
def test_check_refuses_without_echoing_the_password(bad: str) -> None:
    with pytest.raises(InvalidDsn) as info:
        dsn_mod.check(bad)
    assert _SECRET not in str(info.value)
    assert info.value.__cause__ is None and info.value.__suppress_context__
    assert dsn_mod.describe(bad) == "<unparsable dsn>"
    with pytest.raises(InvalidDsn) as info:
        dsn_mod.resolve(environ={"DATABASE_URL": bad})
    assert _SECRET not in str(info.value)


def test_describe_names_the_database_without_the_password() -> None:
    uri = f"postgresql://alice:{_SECRET}@db.example.org:6543/app"
    assert dsn_mod.check(uri) == uri
    assert dsn_mod.describe(uri) == "alice@db.example.org:6543/app"
    kv = f"host=/run/postgresql user=bob password={_SECRET} dbname=jobs"
    assert dsn_mod.describe(kv) == "bob@/run/postgresql:5432/jobs"


_NAME = st.text(alphabet=string.ascii_letters + string.digits + "_-", min_size=1, max_size=20)


@given(
    user=_NAME,
    host=st.from_regex(r"[a-z][a-z0-9-]{0,20}(\.[a-z][a-z0-9-]{0,10}){0,2}", fullmatch=True),
    port=st.integers(1, 65535),
    dbname=_NAME,
    password=st.text(
        alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"),
        min_size=8,
        max_size=30,
    ),
    uri=st.booleans(),
)
def test_describe_never_shows_the_password(
    user: str, host: str, port: int, dbname: str, password: str, uri: bool
) -> None:
    assume(password not in f"{user}@{host}:{port}/{dbname}")
    if uri:
        text = f"postgresql://{quote(user)}:{quote(password, safe='')}@{host}:{port}/{dbname}"
    else:
        text = conninfo.make_conninfo(
            user=user, password=password, host=host, port=str(port), dbname=dbname
        )
    described = dsn_mod.describe(dsn_mod.check(text))
    assert described == f"{user}@{host}:{port}/{dbname}"
    assert password not in described
    assert quote(password, safe="") not in described


def test_unreachable_database_error_hides_the_password() -> None:
    dsn = f"postgresql://alice:{_SECRET}@127.0.0.1:1/app"
    with pytest.raises(DatabaseUnavailable) as info:
        connect(dsn, connect_timeout=2)
    message = str(info.value)
    assert _SECRET not in message
    assert message.startswith("cannot reach the database alice@127.0.0.1:1/app")


# -- respawn storms ----------------------------------------------------------------------


def test_children_dying_before_ready_five_times_in_a_row_is_fatal() -> None:
    from brooq.ipc.reasons import EXIT_APP_LOAD_ERROR, EXIT_BOOT_ERROR
    from brooq.supervisor.respawn import STORM_FATAL, CrashStreak
    from brooq.supervisor.settlement import ChildEnd, outside_job, settle, storm_verdict

    dead_at_boot = ChildEnd(
        code=EXIT_BOOT_ERROR,
        kill_reason=None,
        retiring=None,
        ready=False,
        jobs=(),
        stopping=False,
        now=0.0,
    )
    assert settle(dead_at_boot).outside_job  # it counts in the streak
    assert outside_job(EXIT_BOOT_ERROR, 0, 0, None) == "streak"
    streak = CrashStreak()
    for _ in range(STORM_FATAL - 1):
        streak.died(0.0)
        assert storm_verdict(EXIT_BOOT_ERROR, streak) is None  # not yet
    streak.died(0.0)
    verdict = storm_verdict(EXIT_BOOT_ERROR, streak)
    assert verdict is not None and "died before becoming ready" in verdict

    # A child that could not load the application is fatal at once.
    first = CrashStreak()
    first.died(0.0)
    assert storm_verdict(EXIT_APP_LOAD_ERROR, first) == "children cannot load the application"


def test_a_crash_streak_backs_off_doubling_and_ends_at_five() -> None:
    from brooq.supervisor.respawn import RESPAWN_MAX, STORM_FATAL, CrashStreak

    streak = CrashStreak()
    assert streak.delay() == 0.0 and streak.fork_at() == float("-inf") and not streak.fatal
    delays = []
    for n in range(1, STORM_FATAL):
        streak.died(100.0 + n)
        delays.append(streak.delay())
        assert streak.fork_at() == 100.0 + n + streak.delay()
        assert not streak.fatal
    assert delays == [0.5, 1.0, 2.0, 4.0]
    streak.died(200.0)
    assert streak.fatal
    for _ in range(10):
        streak.died(300.0)
    assert streak.delay() == RESPAWN_MAX  # capped
    streak.healthy()
    assert streak.count == 0 and streak.delay() == 0.0 and streak.fork_at() == float("-inf")


def test_a_child_holding_jobs_without_progress_is_killed_after_the_lease() -> None:
    from brooq.supervisor.watchdog import STACK_GRACE, Decision, HoldingChild, decide_stalled

    lease = 2.0
    fresh = HoldingChild(pid=1, progress_at=10.0, stack_requested_at=None)
    assert decide_stalled([fresh], now=11.9, limit=lease) == []
    assert decide_stalled([fresh], now=12.0, limit=lease) == [Decision(1, "dump_stack", "stalled")]
    asked = HoldingChild(pid=1, progress_at=10.0, stack_requested_at=12.0)
    assert decide_stalled([asked], now=12.0 + STACK_GRACE / 2, limit=lease) == []
    assert decide_stalled([asked], now=12.0 + STACK_GRACE * 1.5, limit=lease) == [
        Decision(1, "kill", "stalled")
    ]


# -- logs --------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["kv", "json"])
def test_no_timestamps_of_our_own_under_the_journal(
    fmt: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import json
    import logging

    from brooq import logs

    record = logging.LogRecord(
        "brooq.x", logging.ERROR, __file__, 1, "event=job_dead job=%s", ("j1",), None
    )
    monkeypatch.delenv("JOURNAL_STREAM", raising=False)
    logs.setup(fmt)
    with_time = logging.getLogger("brooq").handlers[0].format(record)
    monkeypatch.setenv("JOURNAL_STREAM", "8:12345")
    logs.setup(fmt)
    journal = logging.getLogger("brooq").handlers[0].format(record)
    assert "time" in with_time and "time" not in journal
    assert "job_dead" in journal and "j1" in journal
    if fmt == "json":
        assert json.loads(journal)["event"] == "job_dead"


def test_log_lines_of_a_batch_go_out_in_one_write_in_order(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import io
    import logging
    import threading

    from brooq import logs

    class Writes(io.StringIO):
        def __init__(self) -> None:
            super().__init__()
            self.writes: list[str] = []

        def write(self, text: str) -> int:
            self.writes.append(text)
            return len(text)

    stream = Writes()
    monkeypatch.setattr("sys.stderr", stream)
    logs.setup("kv")
    log = logging.getLogger("brooq.child")
    try:
        log.info("event=before")
        assert len(stream.writes) == 1  # outside a batch: at once
        with logs.batch():
            log.info("event=job_done job=%s", "a")
            with logs.batch():  # nested: held until the outer block ends
                log.info("event=job_done job=%s", "b")
            other = threading.Thread(target=log.info, args=("event=from_another_thread",))
            other.start()
            other.join()
            assert len(stream.writes) == 2  # only the other thread's line went out
            assert "from_another_thread" in stream.writes[1]
            log.info("event=job_done job=%s", "c")
        assert len(stream.writes) == 3
        batch = stream.writes[2].splitlines()
        assert [line.rsplit(" ", 1)[-1] for line in batch] == ["job=a", "job=b", "job=c"]
        assert all(line.startswith("time=") and "level=info" in line for line in batch)
        log.info("event=after")
        assert len(stream.writes) == 4

        # An application that configured logging itself keeps its handler's behaviour.
        own = logging.StreamHandler(stream)
        logging.getLogger("brooq").handlers[:] = [own]
        with logs.batch():
            log.info("event=job_done job=%s", "d")
            assert len(stream.writes) == 5
    finally:
        logging.getLogger("brooq").handlers[:] = []


@pytest.mark.parametrize("fmt", ["kv", "json"])
def test_per_job_lines_made_without_a_log_record_read_as_logged_ones(
    fmt: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import io
    import json
    import logging

    from brooq import logs
    from brooq.worker import outcome

    stream = io.StringIO()
    monkeypatch.setattr("sys.stderr", stream)
    monkeypatch.setenv("JOURNAL_STREAM", "8:1")  # no timestamps: the lines compare whole
    logs.setup(fmt)
    made_plain: list[bool] = []
    real_emit_plain = logs.emit_plain

    def spy(*args: object) -> bool:
        made_plain.append(real_emit_plain(*args))  # type: ignore[arg-type]
        return made_plain[-1]

    monkeypatch.setattr(logs, "emit_plain", spy)
    fmt_args = ("event=job_%s job=%s attempt=%d duration=%.3fs", "done", "j1", 2, 0.0123)
    try:
        with logs.batch(outcome.log):
            outcome._log_quick(logging.INFO, *fmt_args)
            outcome._log_quick(logging.DEBUG, *fmt_args)  # below the level: nothing
        assert made_plain == [True, True]
        outcome.log.info(*fmt_args)  # the usual way, outside a batch
        plain, usual = stream.getvalue().splitlines()
        assert plain == usual
        if fmt == "json":
            assert json.loads(plain)["event"] == "job_done"

        # A filter on the way must see every record: then lines take the usual path.
        stream.truncate(0)
        stream.seek(0)
        made_plain.clear()
        dropper = logging.Filter("nothing.matches")
        outcome.log.addFilter(dropper)
        try:
            with logs.batch(outcome.log):
                outcome._log_quick(logging.INFO, *fmt_args)
        finally:
            outcome.log.removeFilter(dropper)
        assert made_plain == [False] and stream.getvalue() == ""

        # Another handler further up would miss the line: the usual path again.
        root = logging.getLogger()
        seen = _Collect()
        logging.getLogger("brooq").propagate = True
        root.addHandler(seen)
        made_plain.clear()
        try:
            with logs.batch(outcome.log):
                outcome._log_quick(logging.INFO, *fmt_args)
        finally:
            root.removeHandler(seen)
        assert made_plain == [False] and len(seen.records) == 1
    finally:
        logging.getLogger("brooq").handlers[:] = []
        logging.getLogger("brooq").propagate = False


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def test_log_timestamps_keep_their_milliseconds_across_seconds() -> None:
    from datetime import datetime, timezone

    from brooq.logs import _Clock

    clock = _Clock()
    # Across a second, rounding into the next one, and back (threads log out of order).
    times = (1764565508.4289, 1764565508.9999, 1764565508.9999996, 1764565509.001, 1764565508.5)
    for t in times:
        expected = datetime.fromtimestamp(t, timezone.utc).isoformat(timespec="milliseconds")
        assert clock.iso(t) == expected


# -- the board (shared memory between a child and the master) ----------------------------


def test_board_shows_what_the_child_posted_across_a_fork() -> None:
    import os
    import uuid

    from brooq.ipc.board import Board, Running

    board = Board()
    assert board.read() is None  # a new board: idle
    job = Running(
        id=uuid.uuid4(),
        topic="mail.send",
        attempt=3,
        started=12.5,
        max_execution_timeout=60.0,
    )
    pid = os.fork()
    if pid == 0:  # the child writes; the parent reads after it is gone
        board.post_running(job)
        os._exit(0)
    os.waitpid(pid, 0)
    assert board.read() == job
    board.clear()
    assert board.read() is None
    board.close()


def test_board_keeps_a_long_topic_readable() -> None:
    import uuid

    from brooq.ipc.board import Board, Running

    board = Board()
    topic = "t" * 128
    job = Running(uuid.uuid4(), topic, 1, 0.0, 1.0)
    board.post_running(job)
    assert board.read() == job
    board.close()


def test_board_read_waits_out_a_write_in_progress() -> None:
    # A reader that finds the sequence odd (a write under way) reads again; when the
    # writer never finishes (killed mid-write) it takes what is there.
    import struct
    import uuid

    from brooq.ipc.board import Board, Running

    board = Board()
    job = Running(uuid.uuid4(), "a", 1, 1.0, 2.0)
    board.post_running(job)
    struct.pack_into("<Q", board._mem, 0, 3)  # odd: as if a writer stopped half-way
    assert board.read() == job
    board.close()


# -- metrics tallied per batch -----------------------------------------------------------


def test_tally_writes_what_the_same_observations_would_have() -> None:
    from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

    from brooq.metrics import Tally

    def exposition(tallied: bool, values: list[float]) -> bytes:
        registry = CollectorRegistry()
        hist = Histogram("h_seconds", "h", ["topic"], buckets=(0.01, 0.1, 1.0), registry=registry)
        count = Counter("c_total", "c", ["topic", "outcome"], registry=registry)
        tally = Tally()
        for i, v in enumerate(values):
            topic = "a" if i % 3 else "b"
            if tallied:
                tally.observe(hist, topic, v)
                tally.inc(count, topic, "done")
                if i % 4 == 0:
                    tally.flush()
            else:
                hist.labels(topic).observe(v)
                count.labels(topic, "done").inc()
        tally.flush()
        tally.flush()  # a second flush adds nothing
        lines = generate_latest(registry).splitlines()
        return b"\n".join(line for line in lines if b"_created" not in line)

    # bucket edges, in between, above the last bound, zero
    values = [0.0, 0.01, 0.0100001, 0.05, 0.1, 0.5, 1.0, 1.5, 100.0, 0.001] * 7
    assert exposition(True, values) == exposition(False, values)
    assert b'h_seconds_bucket{le="0.01",topic="b"}' in exposition(True, values)


def test_the_channel_is_spelled_the_same_wherever_sql_names_it() -> None:
    import re

    from brooq.ipc.channel import (
        CHANNEL,
        OUTCOME_CHANNEL,
        STACK_ANSWER_CHANNEL,
        STACK_CHANNEL,
    )
    from brooq.migration_files import load
    from brooq.sql import Q

    assert Q.listen_jobs == f"LISTEN {CHANNEL}"
    assert Q.listen_outcomes == f"LISTEN {OUTCOME_CHANNEL}"
    assert Q.listen_stack_requests == f"LISTEN {STACK_CHANNEL}"
    assert Q.listen_stack_answers == f"LISTEN {STACK_ANSWER_CHANNEL}"
    texts = [getattr(Q, name) for name in Q.names()] + [m.up for m in load()]
    # pg_notify('name' in a statement, pg_notify(''name'' inside a quoted function body
    spelled = [c for text in texts for c in re.findall(r"pg_notify\((''?)(\w*)\1", text)]
    assert [name for _, name in spelled].count(OUTCOME_CHANNEL) == 1  # 0006's trigger
    assert spelled and {name for _, name in spelled} == {
        CHANNEL,
        OUTCOME_CHANNEL,
        STACK_CHANNEL,
        STACK_ANSWER_CHANNEL,
    }


def test_a_one_line_error_keeps_an_options_dashes_and_drops_only_bullets() -> None:
    from brooq.cli import _one_line

    assert _one_line("--timeout: 0s is out of range") == "--timeout: 0s is out of range"
    assert _one_line("cannot start:\n  - a\n  - --queues: bad") == "cannot start: a; --queues: bad"


def test_the_cache_of_valid_names_never_lets_an_invalid_one_through(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from brooq import job as job_mod

    monkeypatch.setattr(job_mod, "_VALID_NAMES", set())
    assert Job("cached.topic").topic == "cached.topic"
    assert "cached.topic" in job_mod._VALID_NAMES
    with pytest.raises(InvalidTopic):
        Job("cached.topic\n")  # the pattern's job, not the cache's

    class Lookalike(str):
        """Hashes and compares equal to a cached name; is something else."""

        def __hash__(self) -> int:
            return hash("cached.topic")

        def __eq__(self, other: object) -> bool:
            return other == "cached.topic" or str.__eq__(self, other)

    with pytest.raises(InvalidTopic):
        Job(Lookalike("NOT VALID"))
    assert {"cached.topic"} == job_mod._VALID_NAMES  # a subclass is never cached


def test_the_cache_of_valid_names_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    from brooq import job as job_mod

    monkeypatch.setattr(job_mod, "_VALID_NAMES", set())
    monkeypatch.setattr(job_mod, "_VALID_NAMES_MAX", 10)
    for i in range(50):
        assert Job(f"made.up.{i}", queue=f"q{i}").topic == f"made.up.{i}"
    assert len(job_mod._VALID_NAMES) == 10
    with pytest.raises(InvalidTopic):
        Job("made.up.49\n")
