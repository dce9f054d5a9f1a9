"""`brooq jobs list|show`, `brooq [jobs] cancel`, `brooq [jobs] retry`: one job's fate, read
or changed, or the fate of every job of a topic in a state (the bulk form: --topic and
--state instead of an id, confirmed unless --yes).

Owns: those commands, the listing's table and ``show_lines``, the one-screen view of a
job (a pure function of the record and the time), the bulk form's confirmation.
Must never: spell which states cancel or retry accept (brooq.job does; Queue binds them to
the SQL and words the refusal), write a job but through Queue.cancel, Queue.retry,
Queue.cancel_many and Queue.retry_many, or change anything in bulk unconfirmed (no --yes
and no terminal to ask at: refused).
"""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

import click

import brooq
from brooq.cli.common import cli, emit_json, open_queue, table, utc
from brooq.durations import format_age, parse_duration_string
from brooq.errors import JobNotFound
from brooq.job import BULK_FROM_STATES, JobRecord, Transition, bulk_rule, bulk_state_refusal
from brooq.operator.reads import LIST_LIMIT_MAX

SCREEN_LINES = 24  # `jobs show` fits a classic terminal
SHOW_INLINE_PAYLOAD = 80  # characters of compact JSON shown on the payload (result) line
HISTORY_ERROR_WIDTH = 80  # characters of an error's first line in the history


def _when(moment: datetime, now: datetime) -> str:
    """An instant with how far it is from now: "2030-01-31 09:00:00 UTC (in 5.0m)"."""
    delta = (moment - now).total_seconds()
    relative = f"in {format_age(delta)}" if delta > 0 else f"{format_age(delta)} ago"
    return f"{utc(moment)} ({relative})"


@cli.group()
def jobs() -> None:
    """List jobs, show one, cancel or retry one or many."""


def _last_line(text: str | None, width: int = 60) -> str:
    lines = [line.strip() for line in (text or "").splitlines() if line.strip()]
    if not lines:
        return ""
    last = lines[-1]
    return last if len(last) <= width else last[: width - 1] + "…"


@jobs.command("list")
@click.option("--topic", help="Only this topic.")
@click.option("--queue", "queue_name", metavar="QUEUE", help="Only this queue.")
@click.option("--state", type=click.Choice(brooq.job.STATES), help="Only this state.")
@click.option(
    "--limit",
    default=100,
    show_default=True,
    type=int,
    help=f"How many, newest first; at most {LIST_LIMIT_MAX}.",
)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_context
def jobs_list(
    ctx: click.Context,
    topic: str | None,
    queue_name: str | None,
    state: str | None,
    limit: int,
    as_json: bool,
) -> None:
    """Jobs, newest first (by creation time)."""
    if not 1 <= limit <= LIST_LIMIT_MAX:
        raise click.BadParameter(
            f"{limit} is out of range: a listing holds 1 to {LIST_LIMIT_MAX} "
            "jobs; narrow it with --topic, --queue or --state",
            param_hint="--limit",
        )
    if queue_name is not None:
        try:
            brooq.job.validate_queue(queue_name)
        except brooq.InvalidQueue as exc:
            raise click.BadParameter(str(exc), param_hint="--queue") from None
    records = open_queue(ctx).list_jobs(topic=topic, state=state, limit=limit, queue=queue_name)
    if as_json:
        emit_json({"jobs": [r.to_dict() for r in records]})
        return
    if not records:
        click.echo("(no jobs)")
        return
    rows = [
        [
            str(r.id),
            r.topic,
            r.queue,
            str(r.priority),
            r.state,
            str(r.attempts),
            utc(r.created_at),
            _last_line(r.last_error),
        ]
        for r in records
    ]
    headers = ["ID", "TOPIC", "QUEUE", "PRIORITY", "STATE", "ATTEMPTS", "CREATED", "LAST ERROR"]
    for line in table(headers, rows, right={3, 5}):
        click.echo(line)


def _clip(lines: list[str], room: int, *, tail: bool, job_id: object) -> list[str]:
    """At most ``room`` lines: the first ones (or the last ones) and a note on the rest."""
    if len(lines) <= room:
        return lines
    keep = max(room - 1, 1)
    note = f"… {len(lines) - keep} more lines: brooq jobs show {job_id} --json"
    return [note, *lines[-keep:]] if tail else [*lines[:keep], note]


def show_lines(record: JobRecord, now: datetime) -> list[str]:
    """`brooq jobs show` as text: the job's fate on one screen. A long error keeps its
    last lines (where a traceback names the exception), a long error history its newest
    entries, a long payload or result its first lines."""
    fields: list[tuple[str, str]] = [
        ("id", str(record.id)),
        ("topic", record.topic),
        ("queue", f"{record.queue}, priority {record.priority}"),
        ("state", record.state),
        ("attempts", str(record.attempts)),
        ("idempotency key", record.idempotency_key or "-"),
        ("created", _when(record.created_at, now)),
        ("updated", _when(record.updated_at, now)),
        ("available at", _when(record.available_at, now)),
    ]
    if record.state == "processing" and record.locked_until is not None:
        left = (record.locked_until - now).total_seconds()
        lease = _when(record.locked_until, now)
        if left <= 0:
            lease += ", expired: the reaper will make the job pending again"
        fields += [("holder", record.locked_by or "-"), ("lease until", lease)]
    elif record.locked_by:
        fields += [("holder", f"- (last held by {record.locked_by})"), ("lease until", "-")]
    else:
        fields += [("holder", "-"), ("lease until", "-")]
    lines = [f"{name + ':':<16} {value}" for name, value in fields]

    error = (record.last_error or "-").rstrip().splitlines() or ["-"]
    # A result is never JSON null: a handler returning None stores nothing (SQL NULL).
    result = ["-"] if record.result is None else _json_lines(record.result)
    payload = _json_lines(record.payload)
    history = [_history_line(entry) for entry in record.errors]
    blocks = [
        # name, body, on its name's line, keep the end when clipped (a traceback names the
        # exception last; the newest failures are the last entries)
        ("result", result, len(result) == 1, False),
        (f"errors ({len(history)}, oldest first)", history, False, True)
        if history
        else ("errors", ["-"], True, True),
        ("last error", error, len(error) == 1, True),
        ("payload", payload, len(payload) == 1, False),
    ]
    # What does not fit on its field's line shares the rest of the screen.
    room = SCREEN_LINES - len(lines) - len(blocks)
    needs = [0 if inline else len(body) for _, body, inline, _ in blocks]
    for (name, body, inline, tail), body_room in zip(blocks, _share(needs, room), strict=True):
        if inline:
            lines.append(f"{name + ':':<16} {body[0]}")
        else:
            lines.append(name + ":")
            lines += ["  " + b for b in _clip(body, body_room, tail=tail, job_id=record.id)]
    return lines


def _json_lines(value: object) -> list[str]:
    """Compact JSON on one line when short, else indented over several."""
    text = json.dumps(value, ensure_ascii=False)
    if len(text) <= SHOW_INLINE_PAYLOAD:
        return [text]
    return json.dumps(value, indent=2, ensure_ascii=False).splitlines()


def _history_line(entry: dict[str, Any]) -> str:
    """One error history entry: "attempt 2  2026-12-01 10:00:00 UTC  host:1/child-1
    ValueError: ..." (the error's first line)."""
    at = str(entry.get("at") or "-")
    with contextlib.suppress(ValueError):
        at = utc(_parse_at(at))
    first = next(
        (ln.strip() for ln in str(entry.get("error") or "").splitlines() if ln.strip()), ""
    )
    if len(first) > HISTORY_ERROR_WIDTH:
        first = first[: HISTORY_ERROR_WIDTH - 1] + "…"
    return f"attempt {entry.get('attempt', '?')}  {at}  {entry.get('worker') or '-'}  {first}"


def _parse_at(text: str) -> datetime:
    """The ISO text jsonb writes for a timestamptz ("2026-12-01T10:00:00.1234+00:00");
    Python 3.10's fromisoformat takes only 3 or 6 digits of fraction."""
    head, dot, rest = text.partition(".")
    if dot:
        digits = len(rest) - len(rest.lstrip("0123456789"))
        text = f"{head}.{rest[:digits][:6].ljust(6, '0')}{rest[digits:]}"
    return datetime.fromisoformat(text)


def _share(needs: list[int], room: int) -> list[int]:
    """Lines for each block beyond its header: ``room`` split evenly among the blocks
    that need more, what one does not use going to the others (the earlier ones first)."""
    given = [0] * len(needs)
    left = max(room, 0)
    while left > 0:
        wanting = [i for i, need in enumerate(needs) if given[i] < need]
        if not wanting:
            break
        each = max(left // len(wanting), 1)
        for i in wanting:
            add = min(each, needs[i] - given[i], left)
            given[i] += add
            left -= add
    return given


@jobs.command("show")
@click.argument("job_id")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_context
def jobs_show(ctx: click.Context, job_id: str, as_json: bool) -> None:
    """A job's fate on one screen: state, attempts, times, holder and lease, result,
    error history (attempt, time, worker, first line of each error), last error, payload.
    --json: every field whole."""
    jid = brooq.job.parse_job_id(job_id)
    record = open_queue(ctx).get(jid)
    if record is None:
        raise JobNotFound(f"no job with id {jid}")
    if as_json:
        emit_json(record.to_dict())
        return
    for line in show_lines(record, datetime.now(timezone.utc)):
        click.echo(line)


MAX_STACK_TIMEOUT = 60.0


@jobs.command("stack")
@click.argument("job_id")
@click.option(
    "--timeout",
    default="5s",
    show_default=True,
    metavar="DURATION",
    help="How long to wait for the master running the job to answer.",
)
@click.pass_context
def jobs_stack(ctx: click.Context, job_id: str, timeout: str) -> None:
    """The current Python stack of the handler running job ID, as a traceback (most
    recent call last). The job may run on any host: the request and the answer travel
    through PostgreSQL. Exit 1 if the job is not running or no master answered."""
    jid = brooq.job.parse_job_id(job_id)
    try:
        seconds = parse_duration_string(timeout)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--timeout") from None
    if not 0 < seconds <= MAX_STACK_TIMEOUT:
        raise click.BadParameter(
            f"{timeout} is out of range: more than 0s, at most {MAX_STACK_TIMEOUT:g}s",
            param_hint="--timeout",
        )
    answer = open_queue(ctx).stack(jid, timeout=seconds)
    click.echo(answer.text)
    click.echo(f"(job {jid}, worker {answer.worker})", err=True)


# -- writes --------------------------------------------------------------------------------
# Their help spells the rule of brooq.job (CANCELABLE_STATES, RETRYABLE_STATES) in words;
# tests/unit/test_job.py checks that the two agree. Each command is registered twice,
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

    def check_name(validate: Callable[[object], str]) -> Callable[..., str | None]:
        def check(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
            if value is None:
                return None
            try:
                return validate(value)
            except brooq.InvalidJob as exc:
                raise click.BadParameter(str(exc), ctx=ctx, param=param) from None

        return check

    states = "|".join(BULK_FROM_STATES[action])
    options: list[Callable[[Callable[..., None]], Callable[..., None]]] = [
        click.argument("job_id", required=False),
        click.option(
            "--topic",
            metavar="TOPIC",
            callback=check_name(brooq.job.validate_topic),
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
            callback=check_name(brooq.job.validate_queue),
            help="Bulk: only in this queue.",
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
    yes: bool,
    as_json: bool,
) -> None:
    """One job by id, or the bulk form; every usage error before the database is opened."""
    bulk = [
        name
        for name, value in (("--topic", topic), ("--state", state), ("--queue", queue_name))
        if value is not None
    ]
    if job_id is not None:
        extra = bulk + [name for name, on in (("--yes", yes), ("--json", as_json)) if on]
        if extra:
            raise click.UsageError(
                f"give a job id or the bulk filters (--topic, --state), not both: "
                f"{', '.join(extra)} with JOB_ID {job_id}",
                ctx=ctx,
            )
        _one(ctx, action, job_id)
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
    _bulk(ctx, action, topic, state, queue_name, yes=yes, as_json=as_json)


def _one(ctx: click.Context, action: Transition, job_id: str) -> None:
    jid = brooq.job.parse_job_id(job_id)
    queue = open_queue(ctx)
    moved = queue.cancel(jid) if action == "cancel" else queue.retry(jid)
    if not moved:
        raise queue.explain_refusal(jid, action)
    click.echo(f"{_DONE[action]} {jid}{_AFTER[action]}")


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
    *,
    yes: bool,
    as_json: bool,
) -> None:
    queue = open_queue(ctx)
    change = queue.cancel_many if action == "cancel" else queue.retry_many
    where = f"topic {topic}, state {state}" + (f", queue {queue_name}" if queue_name else "")
    if not yes:
        matched = change(topic=topic, state=state, queue=queue_name, dry_run=True).matched
        jobs_word = "job matches" if matched == 1 else "jobs match"
        if not can_ask():
            # A script (or a pipe) cannot answer a prompt: refuse rather than guess.
            raise _NotConfirmed(
                f"{matched} {jobs_word} ({where}); stdin is not a terminal, so nothing was "
                f"{_DONE[action]}: pass --yes to {action} them"
            )
        click.echo(f"{matched} {jobs_word} ({where})")
        if matched == 0:
            return
        if not click.confirm(f"{action.capitalize()} them?", default=False):
            raise _NotConfirmed(f"not confirmed; nothing was {_DONE[action]}")
    result = change(topic=topic, state=state, queue=queue_name)
    if as_json:
        emit_json(result.to_dict())
        return
    if yes:
        jobs_word = "job matches" if result.matched == 1 else "jobs match"
        click.echo(f"{result.matched} {jobs_word} ({where})")
    if result.matched == 0:
        return
    line = f"{_DONE[action]} {result.changed} of {result.matched}{_AFTER[action]}"
    left = result.matched - result.changed
    if left > 0:
        line += f" ({left} changed state meanwhile and were left alone)"
    click.echo(line)


@click.command("cancel")
@_bulk_options("cancel")
def cancel(
    ctx: click.Context,
    job_id: str | None,
    topic: str | None,
    state: str | None,
    queue_name: str | None,
    yes: bool,
    as_json: bool,
) -> None:
    """Cancel a job: pending, failed or processing -> canceled. A running handler gets
    brooq.LeaseLost at the next lease renewal.

    Bulk: --topic T --state S [--queue Q] instead of JOB_ID cancels every
    such job, in batches; it prints how many match and asks first, unless --yes."""
    _run(ctx, "cancel", job_id, topic, state, queue_name, yes, as_json)


@click.command("retry")
@_bulk_options("retry")
def retry(
    ctx: click.Context,
    job_id: str | None,
    topic: str | None,
    state: str | None,
    queue_name: str | None,
    yes: bool,
    as_json: bool,
) -> None:
    """Run a finished job again: dead or canceled -> pending now, attempts reset, last
    error kept.

    Bulk: --topic T --state S [--queue Q] instead of JOB_ID retries every
    such job, in batches; it prints how many match and asks first, unless --yes."""
    _run(ctx, "retry", job_id, topic, state, queue_name, yes, as_json)


for _command in (cancel, retry):
    cli.add_command(_command)  # brooq cancel, brooq retry
    jobs.add_command(_command)  # brooq jobs cancel, brooq jobs retry
