"""`brooq purge --queue Q / --topic T`: cancel every job of a queue or topic that no worker
has taken yet (pending, failed, waiting, on_hold; not processing, not parked), as `celery purge`
discards the messages not yet taken; confirmed unless --yes.

Owns: the command, its options and its confirmation (the bulk cancel's: a count and a
question at a terminal, a refusal without --yes anywhere else).
Must never: change a job but through Queue.purge, or purge unconfirmed.
"""

from __future__ import annotations

import sys

import click

import brooq
from brooq.cli.common import cli, emit_json, name_check, open_queue
from brooq.cli.terminal import say


def can_ask() -> bool:
    """Whether a prompt can be answered: stdin is a terminal (a test replaces this)."""
    return sys.stdin.isatty()


class _NotConfirmed(click.ClickException):
    """The purge was not confirmed: exit 2 (bad usage), nothing changed."""

    exit_code = 2


def _jobs(n: int) -> str:
    return f"{n} job" if n == 1 else f"{n} jobs"


@cli.command("purge")
@click.option(
    "--queue",
    "queue_name",
    metavar="QUEUE",
    callback=name_check(brooq.job.validate_queue),
    help="Every job of this queue not yet taken.",
)
@click.option(
    "--topic",
    metavar="TOPIC",
    callback=name_check(brooq.job.validate_topic),
    help="Every job of this topic not yet taken (with --queue: only in that queue).",
)
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@click.option("--json", "as_json", is_flag=True, help='Print {"purged": N}; needs --yes.')
@click.pass_context
def purge(
    ctx: click.Context, queue_name: str | None, topic: str | None, yes: bool, as_json: bool
) -> None:
    """Cancel every job of a queue or topic that no worker has taken yet: pending (ready
    or scheduled), failed (waiting to be retried), waiting (on the jobs named in its
    `after`) and on_hold. Processing and finished jobs, and a durable handler's parked
    jobs, are left alone; the jobs waiting on a purged job are canceled with it. In
    batches, each its own transaction; jobs enqueued once it has started are left alone.
    It prints how many match and asks first, unless --yes."""
    if queue_name is None and topic is None:
        raise click.UsageError("give --queue, --topic or both: nothing was purged", ctx=ctx)
    if as_json and not yes:
        raise click.UsageError(
            "with --json, --yes is required: no prompt is shown (nothing was purged)", ctx=ctx
        )
    where = ", ".join(
        f"{word} {value}" for word, value in (("queue", queue_name), ("topic", topic)) if value
    )
    queue = open_queue(ctx)
    if not yes:
        matched = queue.purge(queue=queue_name, topic=topic, dry_run=True)
        if not can_ask():
            raise _NotConfirmed(
                f"{_jobs(matched)} not yet taken ({where}); stdin is not a terminal, so "
                "nothing was purged: pass --yes to cancel them"
            )
        say(f"{_jobs(matched)} not yet taken ({where})")
        if matched == 0:
            return
        if not click.confirm("Cancel them?", default=False):
            raise _NotConfirmed("not confirmed; nothing was purged")
    purged = queue.purge(queue=queue_name, topic=topic)
    if as_json:
        emit_json({"purged": purged})
        return
    say(f"purged {_jobs(purged)} ({where}): canceled")
