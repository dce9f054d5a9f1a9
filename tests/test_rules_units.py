"""The rules written once: which states an operator may cancel or retry (brooq.job), and the
ordering of the time limits (brooq.limits), for settings and handler options alike.

The unit tests need no database; the last section runs every state x action through
Queue.cancel and Queue.retry against PostgreSQL, so the SQL is seen to follow the constants.
"""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta, timezone
from typing import Any

import psycopg
import pytest

import brooq
from brooq import handlers, limits, settings
from brooq.cli import cancel_retry as cli_cancel_retry
from brooq.errors import InvalidSettings, InvalidTransition, JobNotFound
from brooq.job import (
    BULK_FROM_STATES,
    CANCELABLE_STATES,
    FROM_STATES,
    RETRYABLE_STATES,
    STATES,
    Transition,
    bulk_rule,
    bulk_state_refusal,
    transition_refusal,
    transition_rule,
)
from brooq.queue import transition_params
from brooq.sql import Q

JOB = uuid.UUID("7d4c5e0a-3f41-4c77-9d3e-2b1f6a0c9e51")

# -- which states may be canceled or retried -----------------------------------------------


def test_the_transitions_are_the_documented_ones() -> None:
    assert CANCELABLE_STATES == ("pending", "failed", "processing")
    assert RETRYABLE_STATES == ("dead", "canceled")
    assert FROM_STATES == {"cancel": CANCELABLE_STATES, "retry": RETRYABLE_STATES}
    assert set(CANCELABLE_STATES) | set(RETRYABLE_STATES) <= set(STATES)
    assert not set(CANCELABLE_STATES) & set(RETRYABLE_STATES)  # no state allows both
    assert "done" not in CANCELABLE_STATES + RETRYABLE_STATES  # done is final


def test_the_rule_in_words() -> None:
    assert transition_rule("cancel") == "only pending, failed or processing jobs can be canceled"
    assert transition_rule("retry") == "only dead or canceled jobs can be retried"


@pytest.mark.parametrize(
    ("action", "state", "expected"),
    [
        (
            "cancel",
            "done",
            f"cannot cancel job {JOB}: it is done; "
            "only pending, failed or processing jobs can be canceled",
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
    ],
)
def test_the_refusal_an_operator_reads(action: Transition, state: str, expected: str) -> None:
    """The CLI's and Queue.explain_refusal's words (README and docs/operator.md show them)."""
    assert transition_refusal(action, state, JOB) == expected


def test_the_refusal_of_the_admin_http() -> None:
    """The 409 of POST /admin/jobs/<id>/cancel|retry, as the master words it."""
    assert transition_refusal("cancel", "canceled") == (
        "job is canceled; only pending, failed or processing jobs can be canceled"
    )
    assert (
        transition_refusal("retry", "done")
        == "job is done; only dead or canceled jobs can be retried"
    )
    assert transition_refusal("cancel", "failed") == (
        "job is now failed: its state changed meanwhile; try again"
    )


@pytest.mark.parametrize("state", STATES)
@pytest.mark.parametrize("action", ["cancel", "retry"])
def test_every_state_and_action_has_one_answer(action: Transition, state: str) -> None:
    allowed = state in FROM_STATES[action]
    for text in (transition_refusal(action, state), transition_refusal(action, state, JOB)):
        assert ("try again" in text) == allowed
        assert (transition_rule(action) in text) == (not allowed)
        assert state in text


def test_an_unknown_action_is_refused() -> None:
    with pytest.raises(ValueError, match="cancel or retry"):
        transition_refusal("delete", "pending")  # type: ignore[arg-type]


def test_the_sql_takes_the_states_as_a_parameter() -> None:
    """job_cancel and job_retry name no state they start from: the constants are bound."""
    for text in (Q.job_cancel, Q.job_retry):
        assert "state = ANY(%(from_states)s::text[])" in text
        where = text[text.index("WHERE") :]
        assert not any(f"'{state}'" in where for state in STATES), where
    assert transition_params("cancel", JOB) == {"id": JOB, "from_states": list(CANCELABLE_STATES)}
    assert transition_params("retry", JOB) == {"id": JOB, "from_states": list(RETRYABLE_STATES)}


def test_the_bulk_forms_take_a_subset_of_the_transitions() -> None:
    """Bulk cancel leaves processing out (a running handler is canceled by id only)."""
    assert BULK_FROM_STATES == {"cancel": ("pending", "failed"), "retry": RETRYABLE_STATES}
    for action in ("cancel", "retry"):
        assert set(BULK_FROM_STATES[action]) <= set(FROM_STATES[action])  # type: ignore[index]
    assert bulk_rule("cancel") == "only pending or failed jobs can be canceled in bulk"
    assert bulk_rule("retry") == "only dead or canceled jobs can be retried in bulk"


@pytest.mark.parametrize("state", [*STATES, "bogus", None, 3])
@pytest.mark.parametrize("action", ["cancel", "retry"])
def test_the_bulk_refusal(action: Transition, state: Any) -> None:
    refusal = bulk_state_refusal(action, state)
    if state in BULK_FROM_STATES[action]:
        assert refusal is None
    else:
        assert refusal == f"state {state!r}: {bulk_rule(action)}"
    with pytest.raises(ValueError, match="cancel or retry"):
        bulk_state_refusal("delete", "dead")  # type: ignore[arg-type]


def test_the_bulk_sql_takes_the_states_as_a_parameter() -> None:
    """Like job_cancel and job_retry: the UPDATE re-checks the bound from_states and names
    no state it starts from."""
    for text in (Q.job_cancel_batch, Q.job_retry_batch):
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
    assert "pending, failed or processing -> canceled" in cancel_help
    assert "dead or canceled -> pending" in retry_help
    for state in CANCELABLE_STATES:
        assert state in cancel_help.split("->")[0]
    for state in RETRYABLE_STATES:
        assert state in retry_help.split("->")[0]


# -- the ordering of timeouts and backoff ---------------------------------------------------


def test_ordering_problems_word_each_pair() -> None:
    seconds = {
        "attempt_timeout": 600.0,
        "max_execution_timeout": 300.0,
        "backoff_base": 120.0,
        "backoff_max": 60.0,
    }
    assert limits.ordering_problems(seconds) == [
        "attempt_timeout (600s) must not exceed max_execution_timeout (300s)",
        "backoff_base (120s) must not exceed backoff_max (60s)",
    ]
    assert limits.ordering_problems(seconds, prefix="t: ") == [
        "t: attempt_timeout (600s) must not exceed max_execution_timeout (300s)",
        "t: backoff_base (120s) must not exceed backoff_max (60s)",
    ]


@pytest.mark.parametrize(
    "seconds",
    [
        {"attempt_timeout": 60.0, "max_execution_timeout": 60.0},  # equal is fine
        {"attempt_timeout": 600.0, "max_execution_timeout": None},  # unset: not judged
        {"attempt_timeout": None, "max_execution_timeout": 1.0},
        {"attempt_timeout": 600.0, "max_execution_timeout": 0.0},  # "must be positive" instead
        {"backoff_base": 5.0, "backoff_max": -1.0},
        {},
    ],
)
def test_ordering_problems_judge_only_complete_positive_pairs(
    seconds: dict[str, float | None],
) -> None:
    assert limits.ordering_problems(seconds) == []


def test_settings_and_handlers_word_the_ordering_alike() -> None:
    values = {"attempt_timeout": 600.0, "max_execution_timeout": 300.0}
    expected = limits.ordering_problems(values)
    with pytest.raises(InvalidSettings) as from_settings:
        settings.load(environ={}, overrides=values)
    assert from_settings.value.problems == expected
    with pytest.raises(InvalidSettings) as from_handler:
        handlers.build(
            "t",
            lambda claim: None,
            max_attempts=None,
            attempt_timeout="10m",
            max_execution_timeout="5m",
            backoff_base=None,
            backoff_max=None,
        )
    assert from_handler.value.problems == [f"t: {p}" for p in expected]
    bad_policy = handlers.Policy(5, 600.0, 300.0, 1.0, 60.0)
    assert handlers.policy_problems("t", bad_policy) == [f"t: {p}" for p in expected]


def test_resolve_prefers_what_was_given() -> None:
    defaults = {
        "attempt_timeout": 60.0,
        "max_execution_timeout": 300.0,
        "backoff_base": 1.0,
        "backoff_max": 60.0,
    }
    assert limits.resolve({}, defaults) == defaults
    given = {
        "attempt_timeout": 5.0,
        "max_execution_timeout": 10.0,
        "backoff_base": 2.0,
        "backoff_max": 3.0,
    }
    assert limits.resolve(given, defaults) == given


def test_resolve_caps_an_unset_lower_limit_by_the_upper_one_given() -> None:
    defaults = {
        "attempt_timeout": 60.0,
        "max_execution_timeout": 300.0,
        "backoff_base": 1.0,
        "backoff_max": 60.0,
    }
    given: dict[str, float | None] = {"max_execution_timeout": 30.0, "backoff_max": 0.5}
    assert limits.resolve(given, defaults) == {
        "attempt_timeout": 30.0,
        "max_execution_timeout": 30.0,
        "backoff_base": 0.5,
        "backoff_max": 0.5,
    }
    # A lower limit given is never capped: the ordering check reports it instead.
    given = {"attempt_timeout": 600.0}
    assert limits.resolve(given, defaults)["attempt_timeout"] == 600.0


def test_a_handler_policy_uses_the_capping_rule() -> None:
    handler = handlers.build(
        "t",
        lambda claim: None,
        max_attempts=None,
        attempt_timeout=None,
        max_execution_timeout="30s",
        backoff_base=None,
        backoff_max="500ms",
    )
    policy = handler.policy(settings.Settings())
    assert policy == handlers.Policy(
        max_attempts=5,
        attempt_timeout=30.0,
        max_execution_timeout=30.0,
        backoff_base=0.5,
        backoff_max=0.5,
    )
    assert handlers.policy_problems("t", policy) == []


# -- against the database: the SQL follows the constants ------------------------------------


def _job_in(db: psycopg.Connection[Any], state: str) -> uuid.UUID:
    """A job put straight into ``state`` (processing with a lease, as the table demands)."""
    job_id = uuid.uuid4()
    db.execute(
        "INSERT INTO job (id, topic, state, locked_by, locked_until) VALUES "
        "(%(id)s, 'rules.t', %(state)s, %(holder)s, %(until)s)",
        {
            "id": job_id,
            "state": state,
            "holder": "someone" if state == "processing" else None,
            "until": datetime.now(timezone.utc) + timedelta(hours=1)
            if state == "processing"
            else None,
        },
    )
    return job_id


@pytest.mark.parametrize("state", STATES)
@pytest.mark.parametrize("action", ["cancel", "retry"])
def test_queue_transitions_follow_the_constants(
    queue: brooq.Queue, db: psycopg.Connection[Any], action: Transition, state: str
) -> None:
    job_id = _job_in(db, state)
    moved = queue.cancel(job_id) if action == "cancel" else queue.retry(job_id)
    assert moved == (state in FROM_STATES[action])
    record = queue.get(job_id)
    assert record is not None
    if moved:
        assert record.state == ("canceled" if action == "cancel" else "pending")
        return
    assert record.state == state  # refused: untouched
    refusal = queue.explain_refusal(job_id, action)
    assert isinstance(refusal, InvalidTransition)
    assert str(refusal) == transition_refusal(action, state, job_id)


def test_queue_explains_an_unknown_job(queue: brooq.Queue) -> None:
    assert not queue.cancel(JOB) and not queue.retry(JOB)
    refusal = queue.explain_refusal(JOB, "cancel")
    assert isinstance(refusal, JobNotFound) and str(refusal) == f"no job with id {JOB}"
