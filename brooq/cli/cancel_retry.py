"""`brooq [jobs] cancel`, `brooq [jobs] retry`, `brooq [jobs] hold`, `brooq [jobs] release`:
one job's fate changed, or the fate of every job of a topic in a state (the bulk form:
--topic and --state instead of an id, confirmed unless --yes).

Owns: those four commands, registered on the top group and on `jobs`, their options and
the bulk form's confirmation.
Must never: spell which states each accepts (brooq.job does; Queue binds them to the SQL
and words the refusal), write a job but through Queue's cancel, retry, hold and release
and their _many forms, or change anything in bulk unconfirmed (no --yes and no terminal
to ask at: refused).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import click

import brooq
from brooq.cli.common import cli, emit_json, name_check, open_queue
from brooq.cli.jobs import jobs
from brooq.cli.terminal import say
from brooq.job import (
    BULK_FROM_STATES,
    ON_HOLD,
    Transition,
    bulk_rule,
    bulk_state_refusal,
)
from brooq.job_options import check_tag
from brooq.operator.records import BulkResult

# -- writes --------------------------------------------------------------------------------
# Their help spells the rule of brooq.job (CANCELABLE_STATES, RETRYABLE_STATES,
# HOLDABLE_STATES, RELEASABLE_STATES) in words; tests/unit/test_job.py and
# tests/unit/cli/test_hold_release.py check that the two agree. Each command is registered
# twice, `brooq cancel` and `brooq jobs cancel` (the same for the others): one id, or the
# bulk form with --topic and --state (BULK_FROM_STATES) instead of the id.

_DONE: dict[Transition, str] = {
    "cancel": "canceled",
    "retry": "retried",
    "hold": "held",
    "release": "released",
}
_AFTER: dict[Transition, str] = {
    "cancel": "",
    "retry": ": pending now, attempts reset",
    "hold": ": on hold until released",
    "release": ": pending again, in line where it was",
}
# Why a bulk change moved fewer jobs than it counted. A hold also leaves alone the jobs
# that job_hold refuses one by one (a unique_key, parked), which the count includes.
_LEFT: dict[Transition, str] = {
    "cancel": "changed state meanwhile and were left alone",
    "retry": "changed state meanwhile and were left alone",
    "hold": (
        "left alone: they have a unique_key, a durable handler parked them, "
        "or they changed state meanwhile"
    ),
    "release": "changed state meanwhile and were left alone",
}
# The state a bulk form takes when --state is left out: release takes only one.
_IMPLIED_STATE: dict[Transition, str] = {"release": ON_HOLD}


def _bulk_options(action: Transition) -> Callable[[Callable[..., None]], Callable[..., None]]:
    def check_state(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
        if value is not None and bulk_state_refusal(action, value) is not None:
            # "Invalid value for '--state': 'done': only dead or canceled jobs can be ..."
            raise click.BadParameter(f"{value!r}: {bulk_rule(action)}", ctx=ctx, param=param)
        return value

    states = "|".join(BULK_FROM_STATES[action])
    topic_help = "Bulk: every job of this topic in --state (instead of JOB_ID)."
    state_help = f"Bulk: the state they are in ({bulk_rule(action)})."
    if action in _IMPLIED_STATE:
        topic_help = f"Bulk: every {_IMPLIED_STATE[action]} job of this topic (instead of JOB_ID)."
        state_help = f"Bulk: the state they are in, {_IMPLIED_STATE[action]} when left out."
    options: list[Callable[[Callable[..., None]], Callable[..., None]]] = [
        click.argument("job_id", required=False),
        click.option(
            "--topic",
            metavar="TOPIC",
            callback=name_check(brooq.job.validate_topic),
            help=topic_help,
        ),
        click.option("--state", metavar=states, callback=check_state, help=state_help),
        click.option(
            "--queue",
            "queue_name",
            metavar="QUEUE",
            callback=name_check(brooq.job.validate_queue),
            help="Bulk: only in this queue.",
        ),
        click.option(
            "--tag",
            metavar="TAG",
            callback=name_check(lambda value: check_tag(value, "--tag")),
            help="Bulk: only the jobs carrying this tag.",
        ),
        click.option("--yes", is_flag=True, help="Bulk: do not ask for confirmation."),
        click.option(
            "--dry-run",
            is_flag=True,
            help="Bulk: print how many match and change nothing (nothing is asked).",
        ),
        click.option(
            "--json",
            "as_json",
            is_flag=True,
            help='Bulk: print {"matched": N, "changed": N}; needs --yes or --dry-run.',
        ),
        click.pass_context,
    ]

    def decorate(fn: Callable[..., None]) -> Callable[..., None]:
        for option in reversed(options):
            fn = option(fn)
        return fn

    return decorate


def _run(
    ctx: click.Context,
    action: Transition,
    job_id: str | None,
    topic: str | None,
    state: str | None,
    queue_name: str | None,
    tag: str | None,
    yes: bool,
    as_json: bool,
    dry_run: bool,
    fresh: bool = False,
) -> None:
    """One job by id, or the bulk form; every usage error before the database is opened."""
    given = (("--topic", topic), ("--state", state), ("--queue", queue_name), ("--tag", tag))
    bulk = [name for name, value in given if value is not None]
    if fresh and job_id is None:
        raise click.UsageError("--fresh takes one job id (JOB_ID), not the bulk form", ctx=ctx)
    if job_id is not None:
        flags = (("--yes", yes), ("--dry-run", dry_run), ("--json", as_json))
        extra = bulk + [name for name, on in flags if on]
        if extra:
            raise click.UsageError(
                f"give a job id or the bulk filters (--topic, --state), not both: "
                f"{', '.join(extra)} with JOB_ID {job_id}",
                ctx=ctx,
            )
        _one(ctx, action, job_id, fresh)
        return
    state = state or _IMPLIED_STATE.get(action)
    if topic is None or state is None:
        missing = " and ".join(
            name for name, v in (("--topic", topic), ("--state", state)) if v is None
        )
        form = f" (--state {'|'.join(BULK_FROM_STATES[action])})" if state is None else ""
        raise click.UsageError(
            f"Missing argument JOB_ID: give a job id, or {missing} for the bulk form{form}",
            ctx=ctx,
        )
    # No prompt can be shown inside JSON output: --json without --yes is refused even at a
    # terminal, so a script cannot get a prompt where it expected JSON.
    if as_json and not (yes or dry_run):
        raise click.UsageError(
            f"with --json, --yes is required: no prompt is shown (nothing was {_DONE[action]})",
            ctx=ctx,
        )
    _bulk(ctx, action, topic, state, queue_name, tag, yes=yes, as_json=as_json, dry_run=dry_run)


def _one(ctx: click.Context, action: Transition, job_id: str, fresh: bool = False) -> None:
    jid = brooq.job.parse_job_id(job_id)
    queue = open_queue(ctx)
    if action == "retry":
        moved = queue.retry(jid, fresh=fresh)
    else:
        moved = {"cancel": queue.cancel, "hold": queue.hold, "release": queue.release}[action](jid)
    if not moved:
        raise queue.explain_refusal(jid, action)
    say(f"{_DONE[action]} {jid}{_AFTER[action]}")


def _change_many(queue: brooq.Queue, action: Transition) -> Callable[..., BulkResult]:
    """The Queue method of the bulk ``action``, called with topic, state, queue, tag and
    dry_run whatever the action (release_many takes no state: on_hold is its only one,
    and check_state has refused any other)."""
    if action == "release":

        def release_many(*, state: str, **filters: Any) -> BulkResult:
            return queue.release_many(**filters)

        return release_many
    return {"cancel": queue.cancel_many, "retry": queue.retry_many, "hold": queue.hold_many}[action]


def can_ask() -> bool:
    """Whether a prompt can be answered: stdin is a terminal (a test replaces this)."""
    return sys.stdin.isatty()


class _NotConfirmed(click.ClickException):
    """The bulk change was not confirmed: exit 2 (bad usage), nothing changed."""

    exit_code = 2


def _bulk(
    ctx: click.Context,
    action: Transition,
    topic: str,
    state: str,
    queue_name: str | None,
    tag: str | None,
    *,
    yes: bool,
    as_json: bool,
    dry_run: bool,
) -> None:
    queue = open_queue(ctx)
    change = _change_many(queue, action)
    where = f"topic {topic}, state {state}" + (f", queue {queue_name}" if queue_name else "")
    where += f", tag {tag}" if tag else ""
    if dry_run:
        counted = change(topic=topic, state=state, queue=queue_name, tag=tag, dry_run=True)
        if as_json:
            emit_json(counted.to_dict())
            return
        jobs_word = "job matches" if counted.matched == 1 else "jobs match"
        say(f"{counted.matched} {jobs_word} ({where})")
        say(f"nothing was {_DONE[action]} (--dry-run)")
        return
    if not yes:
        matched = change(topic=topic, state=state, queue=queue_name, tag=tag, dry_run=True).matched
        jobs_word = "job matches" if matched == 1 else "jobs match"
        if not can_ask():
            # A script (or a pipe) cannot answer a prompt: refuse rather than guess.
            raise _NotConfirmed(
                f"{matched} {jobs_word} ({where}); stdin is not a terminal, so nothing was "
                f"{_DONE[action]}: pass --yes to {action} them"
            )
        say(f"{matched} {jobs_word} ({where})")
        if matched == 0:
            return
        if not click.confirm(f"{action.capitalize()} them?", default=False):
            raise _NotConfirmed(f"not confirmed; nothing was {_DONE[action]}")
    result = change(topic=topic, state=state, queue=queue_name, tag=tag)
    if as_json:
        emit_json(result.to_dict())
        return
    if yes:
        jobs_word = "job matches" if result.matched == 1 else "jobs match"
        say(f"{result.matched} {jobs_word} ({where})")
    if result.matched == 0:
        return
    line = f"{_DONE[action]} {result.changed} of {result.matched}{_AFTER[action]}"
    left = result.matched - result.changed - result.key_taken
    if left > 0:
        line += f" ({left} {_LEFT[action]})"
    say(line)
    if result.key_taken:
        say(
            f"{result.key_taken} not retried: another active job holds their unique_key "
            "(retry them once that job is done, dead or canceled):"
        )
        for job_id, holder in result.taken:
            say(f"  {job_id}: its key is held by job {holder}")
        if result.key_taken > len(result.taken):
            say(f"  … and {result.key_taken - len(result.taken)} more")


@click.command("cancel")
@_bulk_options("cancel")
def cancel(
    ctx: click.Context,
    job_id: str | None,
    topic: str | None,
    state: str | None,
    queue_name: str | None,
    tag: str | None,
    yes: bool,
    dry_run: bool,
    as_json: bool,
) -> None:
    """Cancel a job: pending, failed, processing, waiting or on_hold -> canceled (and what
    waits on it, unless it runs on an upstream failure). A running handler gets
    brooq.LeaseLost at once (its child is killed if it still runs the job
    QUEUE_WATCHDOG_GRACE later).

    Bulk: --topic T --state S instead of JOB_ID (narrowed by --queue Q, --tag TAG)
    cancels every such job, in batches; it prints how many match and asks first, unless
    --yes."""
    _run(ctx, "cancel", job_id, topic, state, queue_name, tag, yes, as_json, dry_run)


@click.command("retry")
@_bulk_options("retry")
@click.option(
    "--fresh",
    is_flag=True,
    help="One job: forget its durable handler's recorded steps (it runs from its first).",
)
def retry(
    ctx: click.Context,
    job_id: str | None,
    topic: str | None,
    state: str | None,
    queue_name: str | None,
    tag: str | None,
    yes: bool,
    dry_run: bool,
    as_json: bool,
    fresh: bool,
) -> None:
    """Run a finished job again: dead or canceled -> pending now, attempts reset, last
    error kept.

    Bulk: --topic T --state S instead of JOB_ID (narrowed by --queue Q, --tag TAG)
    retries every such job, in batches; it prints how many match and asks first, unless
    --yes. A job whose unique_key another active job holds is not retried (named, with
    that job). A durable handler's job resumes from its recorded steps, unless --fresh."""
    _run(ctx, "retry", job_id, topic, state, queue_name, tag, yes, as_json, dry_run, fresh)


@click.command("hold")
@_bulk_options("hold")
def hold(
    ctx: click.Context,
    job_id: str | None,
    topic: str | None,
    state: str | None,
    queue_name: str | None,
    tag: str | None,
    yes: bool,
    dry_run: bool,
    as_json: bool,
) -> None:
    """Hold a job: pending or failed -> on_hold. No worker claims it until it is released;
    its place in line and its attempts are kept, and cancel still takes it. Refused for a
    job with a unique_key (on hold it would give its key up to the next enqueue) and for a
    durable handler's parked job (it has started: cancel it instead).

    Bulk: --topic T --state S instead of JOB_ID (narrowed by --queue Q, --tag TAG) holds
    every such job but those with a unique_key or parked, in batches; it prints how many
    match and asks first, unless --yes."""
    _run(ctx, "hold", job_id, topic, state, queue_name, tag, yes, as_json, dry_run)


@click.command("release")
@_bulk_options("release")
def release(
    ctx: click.Context,
    job_id: str | None,
    topic: str | None,
    state: str | None,
    queue_name: str | None,
    tag: str | None,
    yes: bool,
    dry_run: bool,
    as_json: bool,
) -> None:
    """Release a held job: on_hold -> pending, its place in line kept: it runs when its
    time comes, at once if that passed while it was held (the masters are woken).

    Bulk: --topic T instead of JOB_ID (narrowed by --queue Q, --tag TAG) releases every
    held job of the topic, in batches; it prints how many match and asks first, unless
    --yes."""
    _run(ctx, "release", job_id, topic, state, queue_name, tag, yes, as_json, dry_run)


for _command in (cancel, retry, hold, release):
    cli.add_command(_command)  # brooq cancel, brooq retry, brooq hold, brooq release
    jobs.add_command(_command)  # brooq jobs cancel, ... brooq jobs release
