"""The job (brooq.job): topic names and their cache, queue and priority bounds, and the rules
written once of which states an operator may cancel or retry (held against the SQL and the
CLI's help).
"""

from __future__ import annotations

import re
import uuid
from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

import brooq
from brooq.cli import cancel_retry as cli_cancel_retry
from brooq.errors import (
    InvalidTopic,
)
from brooq.job import (
    BULK_FROM_STATES,
    CANCELABLE_STATES,
    FROM_STATES,
    HOLDABLE_STATES,
    RELEASABLE_STATES,
    RETRYABLE_STATES,
    STATES,
    TOPIC_MAX_LENGTH,
    Job,
    Transition,
    bulk_rule,
    bulk_state_refusal,
    transition_refusal,
    transition_rule,
    validate_topic,
)
from brooq.operator.changes import transition_params
from brooq.sql import Q

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


JOB = uuid.UUID("7d4c5e0a-3f41-4c77-9d3e-2b1f6a0c9e51")

# -- which states may be canceled or retried -----------------------------------------------


def test_the_transitions_are_the_documented_ones() -> None:
    assert CANCELABLE_STATES == ("pending", "failed", "processing", "waiting", "on_hold")
    assert RETRYABLE_STATES == ("dead", "canceled")
    assert HOLDABLE_STATES == ("pending", "failed")
    assert RELEASABLE_STATES == ("on_hold",)
    assert FROM_STATES == {
        "cancel": CANCELABLE_STATES,
        "retry": RETRYABLE_STATES,
        "hold": HOLDABLE_STATES,
        "release": RELEASABLE_STATES,
    }
    assert set(CANCELABLE_STATES) | set(RETRYABLE_STATES) <= set(STATES)
    assert not set(CANCELABLE_STATES) & set(RETRYABLE_STATES)  # no state allows both
    assert not set(HOLDABLE_STATES) & set(RELEASABLE_STATES)
    assert "processing" not in HOLDABLE_STATES  # a running job is not held: cancel it
    assert "done" not in CANCELABLE_STATES + RETRYABLE_STATES  # done is final


def test_the_rule_in_words() -> None:
    assert (
        transition_rule("cancel")
        == "only pending, failed, processing, waiting or on_hold jobs can be canceled"
    )
    assert transition_rule("retry") == "only dead or canceled jobs can be retried"
    assert transition_rule("hold") == "only pending or failed jobs can be held"
    assert transition_rule("release") == "only on_hold jobs can be released"


@pytest.mark.parametrize(
    ("action", "state", "expected"),
    [
        (
            "cancel",
            "done",
            f"cannot cancel job {JOB}: it is done; "
            "only pending, failed, processing, waiting or on_hold jobs can be canceled",
        ),
        (
            "retry",
            "pending",
            f"cannot retry job {JOB}: it is pending; only dead or canceled jobs can be retried",
        ),
        (
            "cancel",
            "pending",
            f"cannot cancel job {JOB}: its state changed meanwhile and is now pending; try again",
        ),
        (
            "retry",
            "dead",
            f"cannot retry job {JOB}: its state changed meanwhile and is now dead; try again",
        ),
        (
            "hold",
            "processing",
            f"cannot hold job {JOB}: it is processing; only pending or failed jobs can be held",
        ),
        (
            "release",
            "pending",
            f"cannot release job {JOB}: it is pending; only on_hold jobs can be released",
        ),
    ],
)
def test_the_refusal_an_operator_reads(action: Transition, state: str, expected: str) -> None:
    """The CLI's and Queue.explain_refusal's words (README and docs/operator.md show them)."""
    assert transition_refusal(action, state, JOB) == expected


def test_the_refusal_of_the_admin_http() -> None:
    """The 409 of POST /admin/jobs/<id>/cancel|retry, as the master words it."""
    assert transition_refusal("cancel", "canceled") == (
        "job is canceled; only pending, failed, processing, waiting or on_hold jobs can be canceled"
    )
    assert (
        transition_refusal("retry", "done")
        == "job is done; only dead or canceled jobs can be retried"
    )
    assert transition_refusal("cancel", "failed") == (
        "job is now failed: its state changed meanwhile; try again"
    )


@pytest.mark.parametrize("state", STATES)
@pytest.mark.parametrize("action", ["cancel", "retry", "hold", "release"])
def test_every_state_and_action_has_one_answer(action: Transition, state: str) -> None:
    allowed = state in FROM_STATES[action]
    for text in (transition_refusal(action, state), transition_refusal(action, state, JOB)):
        assert ("try again" in text) == allowed
        assert (transition_rule(action) in text) == (not allowed)
        assert state in text


def test_an_unknown_action_is_refused() -> None:
    with pytest.raises(ValueError, match="cancel, retry, hold or release"):
        transition_refusal("delete", "pending")  # type: ignore[arg-type]


def test_the_sql_takes_the_states_as_a_parameter() -> None:
    """job_cancel and job_retry name no state they start from: the constants are bound."""
    for text in (Q.job_cancel, Q.job_retry, Q.job_hold, Q.job_hold_release):
        assert "state = ANY(%(from_states)s::text[])" in text
        # Every WHERE line: job_cancel's SET and its notification name states, its
        # conditions do not.
        wheres = [line for line in text.splitlines() if line.lstrip().startswith("WHERE")]
        assert wheres
        for where in wheres:
            assert not any(f"'{state}'" in where for state in STATES), where
    assert transition_params("cancel", JOB) == {"id": JOB, "from_states": list(CANCELABLE_STATES)}
    assert transition_params("retry", JOB) == {"id": JOB, "from_states": list(RETRYABLE_STATES)}
    assert transition_params("hold", JOB) == {"id": JOB, "from_states": list(HOLDABLE_STATES)}


def test_the_bulk_forms_take_a_subset_of_the_transitions() -> None:
    """Bulk cancel leaves processing out (a running handler is canceled by id only)."""
    assert BULK_FROM_STATES == {
        "cancel": ("pending", "failed", "waiting", "on_hold"),
        "retry": RETRYABLE_STATES,
        "hold": HOLDABLE_STATES,
        "release": RELEASABLE_STATES,
    }
    for action in ("cancel", "retry", "hold", "release"):
        assert set(BULK_FROM_STATES[action]) <= set(FROM_STATES[action])  # type: ignore[index]
    assert (
        bulk_rule("cancel")
        == "only pending, failed, waiting or on_hold jobs can be canceled in bulk"
    )
    assert bulk_rule("retry") == "only dead or canceled jobs can be retried in bulk"


@pytest.mark.parametrize("state", [*STATES, "bogus", None, 3])
@pytest.mark.parametrize("action", ["cancel", "retry", "hold", "release"])
def test_the_bulk_refusal(action: Transition, state: Any) -> None:
    refusal = bulk_state_refusal(action, state)
    if state in BULK_FROM_STATES[action]:
        assert refusal is None
    else:
        assert refusal == f"state {state!r}: {bulk_rule(action)}"
    with pytest.raises(ValueError, match="cancel, retry, hold or release"):
        bulk_state_refusal("delete", "dead")  # type: ignore[arg-type]


def test_the_bulk_sql_takes_the_states_as_a_parameter() -> None:
    """Like job_cancel and job_retry: the UPDATE re-checks the bound from_states and names
    no state it starts from."""
    for text in (Q.job_cancel_batch, Q.job_retry_batch, Q.job_hold_batch, Q.job_hold_release_batch):
        update = text[text.index("UPDATE job") :]
        assert "state = ANY(%(from_states)s::text[])" in update
        where = update[update.index("WHERE") :]
        assert not any(f"'{state}'" in where for state in STATES), where
    # the retried row gets job_retry's treatment, written the same way
    retry_set = Q.job_retry[Q.job_retry.index("SET") : Q.job_retry.index("WHERE")]
    batch_set = Q.job_retry_batch[Q.job_retry_batch.index("SET") :]
    assert batch_set.startswith(retry_set)


def test_the_cli_help_spells_the_same_rule() -> None:
    """`brooq cancel --help` and `brooq retry --help` say the rule in words; they must say
    the constants' states."""
    cancel_help = cli_cancel_retry.cancel.help or ""
    retry_help = cli_cancel_retry.retry.help or ""
    assert "pending, failed, processing, waiting or on_hold -> canceled" in cancel_help
    assert "dead or canceled -> pending" in retry_help
    for state in CANCELABLE_STATES:
        assert state in cancel_help.split("->")[0]
    for state in RETRYABLE_STATES:
        assert state in retry_help.split("->")[0]


@pytest.mark.parametrize(
    ("kwargs", "error", "text"),
    [
        ({"priority": 32768}, brooq.InvalidPriority, "from -32768 to 32767"),
        ({"priority": -32769}, brooq.InvalidPriority, "from -32768 to 32767"),
        ({"priority": True}, brooq.InvalidPriority, "must be an integer, not bool"),
        ({"priority": 1.0}, brooq.InvalidPriority, "must be an integer, not float"),
        ({"priority": "1"}, brooq.InvalidPriority, "must be an integer, not str"),
        ({"queue": "Bulk"}, brooq.InvalidQueue, "queue 'Bulk' does not match"),
        ({"queue": "bulk\n"}, brooq.InvalidQueue, "does not match"),
        ({"queue": "q" * 129}, brooq.InvalidQueue, "queue is 129 characters long"),
        ({"queue": 7}, brooq.InvalidQueue, "queue must be a string, not int"),
    ],
)
def test_bad_queue_or_priority_is_refused_by_name(
    kwargs: dict[str, Any], error: type[Exception], text: str
) -> None:
    with pytest.raises(error, match=text.replace("(", r"\(")) as refused:
        brooq.Job("t", **kwargs)
    assert isinstance(refused.value, brooq.BrooqError)


def test_the_bounds_themselves_are_accepted() -> None:
    assert brooq.Job("t", priority=32767).priority == 32767
    assert brooq.Job("t", priority=-32768).priority == -32768
    assert brooq.Job("t", queue="a.b-c_d").queue == "a.b-c_d"


# -- a job's group ----------------------------------------------------------------------------


@pytest.mark.parametrize("group", ["tenant-42", "A", "Acme Corp", "é" * 128, "a/b:c"])
def test_a_group_is_one_to_128_printable_characters(group: str) -> None:
    assert Job("t", group=group).group == group


def test_no_group() -> None:
    assert Job("t").group is None and Job("t", group="").group is None  # "" is no group


@pytest.mark.parametrize(
    ("group", "text"),
    [
        ("x" * 129, "group is 129 characters long; the limit is 128"),
        ("a\nb", "group 'a\\\\nb' holds a control character"),
        ("a\x00", "holds a control character"),
        (42, "group must be a string or None, not int"),
        (b"a", "group must be a string or None, not bytes"),
    ],
)
def test_a_bad_group_is_refused_naming_it(group: Any, text: str) -> None:
    with pytest.raises(brooq.InvalidGroup, match=text):
        Job("t", group=group)


# -- a job enqueued on hold -------------------------------------------------------------------


def test_held_is_a_bool_and_off_by_default() -> None:
    assert Job("t").held is False
    assert Job("t", held=True).held is True
    assert "held=True" in repr(Job("t", held=True)) and "held" not in repr(Job("t"))
    with pytest.raises(brooq.InvalidJob, match="held must be True or False, not int"):
        Job("t", held=1)  # type: ignore[arg-type]


def test_held_is_refused_beside_a_unique_key_or_after() -> None:
    with pytest.raises(brooq.InvalidJob, match="held cannot be combined with unique_key"):
        Job("t", held=True, unique_key="k")
    with pytest.raises(brooq.InvalidJob, match="held cannot be combined with after"):
        Job("t", held=True, after=[Job("u")])
    assert Job("t", held=True, tags=["x"], group="g", priority=3).held


def _claim() -> brooq.Claim[Any]:
    from datetime import datetime, timezone

    return brooq.Claim(uuid.uuid4(), "t", {}, 1, "w", datetime.now(timezone.utc))


def test_a_claims_chained_jobs_and_hooks_are_made_on_first_use_and_kept_in_order() -> None:
    """A claim starts with no chained job and no hook (nothing made for them); each add
    keeps the earlier ones, and two claims never share what they hold."""
    a, b = _claim(), _claim()
    assert not a.chained and not a.success_hooks and a.steps_used is None and a.calls is None
    first, second = brooq.Job("x", {}), brooq.Job("y", {})
    a.chain(first)
    a.chain(second)
    hooks = [lambda conn: None, lambda conn: None]
    for hook in hooks:
        a.on_success(hook)
    assert list(a.chained) == [first, second] and list(a.success_hooks) == hooks
    assert not b.chained and not b.success_hooks
    with pytest.raises(TypeError):
        b.chain("not a job")  # type: ignore[arg-type]
    assert not b.chained
