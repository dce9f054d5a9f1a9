"""`brooq keys`: the ordered keys (Job(ordering_key=...)) whose next job cannot start, a
dead job or a retry awaited in the way; `brooq keys unblock TOPIC KEY`: a key a dead job
blocks handed on to its next job, the dead job left dead.

Owns: those commands, the table of blocked keys (``blocked_lines``, pure) and the words
of an unblock. The list reads on the read target when one is set
(brooq.cli.common.open_reads); the unblock writes on the database itself.
Must never: read or write the database but through Queue.blocked_keys and
Queue.unblock_key, or write anything for a malformed topic or key, or a key no dead job
blocks (each is a usage error, exit 2).
"""

from __future__ import annotations

import click

import brooq
from brooq.cli.common import cli, emit_json, name_check, open_queue, open_reads, table, utc
from brooq.cli.terminal import say, say_lines
from brooq.errors import BrooqError, InvalidOrderingKey
from brooq.job_options import ORDERING_KEY_MAX_LENGTH, check_ordering_key
from brooq.operator.keys import BLOCKED_LIMIT, BLOCKED_LIMIT_MAX


def blocked_lines(rows: list[brooq.BlockedKey]) -> list[str]:
    """The blocked keys as a table, oldest first (empty: none)."""
    if not rows:
        return []
    headers = ["TOPIC", "KEY", "REASON", "JOB", "QUEUE", "SINCE", "RETRY AT", "WAITING"]
    body = [
        [
            r.topic,
            r.ordering_key,
            r.reason,
            str(r.job_id),
            r.queue,
            utc(r.since),
            "-" if r.retry_at is None else utc(r.retry_at),
            str(r.waiting),
        ]
        for r in rows
    ]
    return table(headers, body, right={7})


def _key(ctx: click.Context, param: click.Parameter, value: str) -> str:
    """KEY as Job(ordering_key=...) takes it, or a usage error naming KEY."""
    try:
        checked = check_ordering_key(value, None, None, False)
    except InvalidOrderingKey as exc:
        raise click.BadParameter(str(exc), ctx=ctx, param=param) from None
    if checked is None:
        raise click.BadParameter(
            f"an ordering key is 1 to {ORDERING_KEY_MAX_LENGTH} characters, not empty",
            ctx=ctx,
            param=param,
        )
    return checked


class _NotBlocked(click.ClickException):
    """No dead job blocks the key: exit 2 (bad usage), nothing changed."""

    exit_code = 2


@cli.group("keys", invoke_without_command=True)
@click.option(
    "--topic",
    "topic",
    metavar="TOPIC",
    default=None,
    callback=name_check(brooq.job.validate_topic),
    help="Only the keys of this topic.",
)
@click.option(
    "--limit",
    metavar="N",
    type=click.IntRange(1, BLOCKED_LIMIT_MAX),
    default=None,
    help=f"At most this many, oldest first.  [default: {BLOCKED_LIMIT}]",
)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output (a list).")
@click.pass_context
def keys(ctx: click.Context, topic: str | None, limit: int | None, as_json: bool) -> None:
    """The ordered keys (Job(ordering_key=...)) whose next job cannot start, oldest first;
    unblock one a dead job holds.

    Per key: its topic and key, the reason (dead: its job JOB is dead and blocks the key
    until it is retried or the key unblocked; retrying: JOB failed and runs again at
    RETRY AT), the job's queue, since when (when it died, or its last failure) and how
    many jobs of the key wait their turn."""
    if ctx.invoked_subcommand is not None:
        given = [
            name
            for name, value in (("--topic", topic), ("--limit", limit), ("--json", as_json))
            if value not in (None, False)
        ]
        if given:
            verb = "they list" if len(given) > 1 else "it lists"
            raise click.UsageError(
                f"give {' and '.join(given)} without unblock: {verb} the blocked keys"
            )
        return
    rows = open_reads(ctx).blocked_keys(topic, BLOCKED_LIMIT if limit is None else limit)
    if as_json:
        emit_json([r.to_dict() for r in rows])
        return
    if not rows:
        say(f"(no ordered key of {topic} is blocked)" if topic else "(no ordered key is blocked)")
        return
    say_lines(blocked_lines(rows))


@keys.command("unblock")
@click.argument("topic", callback=name_check(brooq.job.validate_topic))
@click.argument("key", callback=_key)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_context
def keys_unblock(ctx: click.Context, topic: str, key: str, as_json: bool) -> None:
    """Let KEY of TOPIC go on past its dead job: the dead job stays dead (retrying it
    instead runs it first again), the key's next waiting job becomes pending. Refused
    (exit 2, nothing changed) when no dead job blocks the key: a key whose job awaits a
    retry goes on once that job ends."""
    try:
        started = open_queue(ctx).unblock_key(topic, key)
    except BrooqError as exc:
        if type(exc) is not BrooqError:  # the database unreachable, the schema missing: exit 1
            raise
        hint = "nothing to unblock (brooq keys lists the blocked keys)"
        raise _NotBlocked(f"{exc}: {hint}") from None
    if as_json:
        emit_json(
            {
                "topic": topic,
                "ordering_key": key,
                "started": None if started is None else str(started),
            }
        )
    elif started is None:
        say(
            f"unblocked key {key!r} of topic {topic}: no job started (none waits its turn, "
            "or another job of the key is unfinished)"
        )
    else:
        say(f"unblocked key {key!r} of topic {topic}: its next job {started} is pending")
