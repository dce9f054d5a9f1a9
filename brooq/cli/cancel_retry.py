"""`brooq [jobs] cancel`, `brooq [jobs] retry`: one job's fate changed, or the fate of
every job of a topic in a state (the bulk form: --topic and --state instead of an id,
confirmed unless --yes).

Owns: those two commands, registered on the top group and on `jobs`, their options and
the bulk form's confirmation.
Must never: spell which states cancel or retry accept (brooq.job does; Queue binds them to
the SQL and words the refusal), write a job but through Queue.cancel, Queue.retry,
Queue.cancel_many and Queue.retry_many, or change anything in bulk unconfirmed (no --yes
and no terminal to ask at: refused).
"""

from __future__ import annotations

import sys
from collections.abc import Callable

import click

import brooq
from brooq.cli.common import cli, emit_json, name_check, open_queue
from brooq.cli.jobs import jobs
from brooq.cli.terminal import say
from brooq.job import BULK_FROM_STATES, Transition, bulk_rule, bulk_state_refusal
from brooq.job_options import check_tag

# -- writes --------------------------------------------------------------------------------
# Their help spells the rule of brooq.job (CANCELABLE_STATES, RETRYABLE_STATES) in words;
# tests/test_rules_units.py checks that the two agree. Each command is registered twice,
# `brooq cancel` and `brooq jobs cancel` (the same for retry): one id, or the bulk form
# with --topic and --state (BULK_FROM_STATES) instead of the id.

_DONE: dict[Transition, str] = {"cancel": "canceled", "retry": "retried"}
_AFTER: dict[Transition, str] = {"cancel": "", "retry": ": pending now, attempts reset"}


def _bulk_options(action: Transition) -> Callable[[Callable[..., None]], Callable[..., None]]:
    def check_state(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
        if value is not None and bulk_state_refusal(action, value) is not None:
            # "Invalid value for '--state': 'done': only dead or canceled jobs can be ..."
            raise click.BadParameter(f"{value!r}: {bulk_rule(action)}", ctx=ctx, param=param)
        return value

    states = "|".join(BULK_FROM_STATES[action])
    options: list[Callable[[Callable[..., None]], Callable[..., None]]] = [
        click.argument("job_id", required=False),
        click.option(
            "--topic",
            metavar="TOPIC",
            callback=name_check(brooq.job.validate_topic),
            help="Bulk: every job of this topic in --state (instead of JOB_ID).",
        ),
        click.option(
            "--state",
            metavar=states,
            callback=check_state,
            help=f"Bulk: the state they are in ({bulk_rule(action)}).",
        ),
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
            "--json",
            "as_json",
            is_flag=True,
            help='Bulk: print {"matched": N, "changed": N}; needs --yes.',
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
    fresh: bool = False,
) -> None:
    """One job by id, or the bulk form; every usage error before the database is opened."""
    given = (("--topic", topic), ("--state", state), ("--queue", queue_name), ("--tag", tag))
    bulk = [name for name, value in given if value is not None]
    if fresh and job_id is None:
        raise click.UsageError("--fresh takes one job id (JOB_ID), not the bulk form", ctx=ctx)
    if job_id is not None:
        extra = bulk + [name for name, on in (("--yes", yes), ("--json", as_json)) if on]
        if extra:
            raise click.UsageError(
                f"give a job id or the bulk filters (--topic, --state), not both: "
                f"{', '.join(extra)} with JOB_ID {job_id}",
                ctx=ctx,
            )
        _one(ctx, action, job_id, fresh)
        return
    if topic is None or state is None:
        missing = " and ".join(
            name for name, v in (("--topic", topic), ("--state", state)) if v is None
        )
        raise click.UsageError(
            f"Missing argument JOB_ID: give a job id, or {missing} for the bulk form "
            f"(--state {'|'.join(BULK_FROM_STATES[action])})",
            ctx=ctx,
        )
    # No prompt can be shown inside JSON output: --json without --yes is refused even at a
    # terminal, so a script cannot get a prompt where it expected JSON.
    if as_json and not yes:
        raise click.UsageError(
            f"with --json, --yes is required: no prompt is shown (nothing was {_DONE[action]})",
            ctx=ctx,
        )
    _bulk(ctx, action, topic, state, queue_name, tag, yes=yes, as_json=as_json)


def _one(ctx: click.Context, action: Transition, job_id: str, fresh: bool = False) -> None:
    jid = brooq.job.parse_job_id(job_id)
    queue = open_queue(ctx)
    moved = queue.cancel(jid) if action == "cancel" else queue.retry(jid, fresh=fresh)
    if not moved:
        raise queue.explain_refusal(jid, action)
    say(f"{_DONE[action]} {jid}{_AFTER[action]}")


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
) -> None:
    queue = open_queue(ctx)
    change = queue.cancel_many if action == "cancel" else queue.retry_many
    where = f"topic {topic}, state {state}" + (f", queue {queue_name}" if queue_name else "")
    where += f", tag {tag}" if tag else ""
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
        line += f" ({left} changed state meanwhile and were left alone)"
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
    as_json: bool,
) -> None:
    """Cancel a job: pending, failed, processing or waiting -> canceled (and what waits
    on it, unless it runs on an upstream failure). A running handler gets brooq.LeaseLost
    at once (its child is killed if it still runs the job QUEUE_WATCHDOG_GRACE later).

    Bulk: --topic T --state S instead of JOB_ID (narrowed by --queue Q, --tag TAG)
    cancels every such job, in batches; it prints how many match and asks first, unless
    --yes."""
    _run(ctx, "cancel", job_id, topic, state, queue_name, tag, yes, as_json)


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
    as_json: bool,
    fresh: bool,
) -> None:
    """Run a finished job again: dead or canceled -> pending now, attempts reset, last
    error kept.

    Bulk: --topic T --state S instead of JOB_ID (narrowed by --queue Q, --tag TAG)
    retries every such job, in batches; it prints how many match and asks first, unless
    --yes. A job whose unique_key another active job holds is not retried (named, with
    that job). A durable handler's job resumes from its recorded steps, unless --fresh."""
    _run(ctx, "retry", job_id, topic, state, queue_name, tag, yes, as_json, fresh)


for _command in (cancel, retry):
    cli.add_command(_command)  # brooq cancel, brooq retry
    jobs.add_command(_command)  # brooq jobs cancel, brooq jobs retry
