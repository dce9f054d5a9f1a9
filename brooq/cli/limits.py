"""`brooq limits`: the groups' own limits, set at runtime (a tenant's plan): `set TOPIC
--group G --limit N`, `clear TOPIC --group G`, and `list [TOPIC]`.

Owns: those commands and the table of the groups' own limits (``group_limits_lines``,
pure), which `brooq queues` prints too.
Must never: read or write the database but through Queue.set_group_limit and
Queue.group_limits.
"""

from __future__ import annotations

import click

import brooq
from brooq.cli.common import cli, emit_json, name_check, open_queue, open_reads, table, utc
from brooq.cli.terminal import say, say_lines
from brooq.declare.handlers import MAX_GLOBAL_LIMIT
from brooq.job_options import validate_group


def group_limits_lines(rows: list[brooq.GroupLimit]) -> list[str]:
    """The groups' own limits as a table (empty: none set)."""
    if not rows:
        return []
    body = [[r.topic, r.group, str(r.limit), utc(r.updated_at)] for r in rows]
    return table(["TOPIC", "GROUP", "OWN LIMIT", "SET"], body, right={2})


def _group(ctx: click.Context, param: click.Parameter, value: str) -> str:
    checked = validate_group(value)
    if checked is None:
        raise click.BadParameter("a group is 1 to 128 characters", ctx=ctx, param=param)
    return checked


@cli.group("limits", invoke_without_command=True)
@click.pass_context
def limits(ctx: click.Context) -> None:
    """The groups' own limits, set at runtime (a tenant's plan): each replaces its topic's
    group_limit for that group in the claims of a topic whose groups are taken in turn
    (group_limit or fair_groups, without a rate). Every master obeys a change at its next
    claim of the topic. Without a command: `brooq limits list`."""
    if ctx.invoked_subcommand is None:
        ctx.invoke(limits_list, topic=None, as_json=False)


@limits.command("list")
@click.argument("topic", required=False, callback=name_check(brooq.job.validate_topic))
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output (a list).")
@click.pass_context
def limits_list(ctx: click.Context, topic: str | None, as_json: bool) -> None:
    """The groups' own limits, every topic's or TOPIC's."""
    rows = open_reads(ctx).group_limits(topic)
    if as_json:
        emit_json([r.to_dict() for r in rows])
        return
    lines = group_limits_lines(rows)
    say_lines(lines if lines else ["(no group has its own limit)"])


@limits.command("set")
@click.argument("topic", callback=name_check(brooq.job.validate_topic))
@click.option("--group", "group", required=True, callback=_group, help="The group.")
@click.option(
    "--limit",
    "limit",
    required=True,
    type=click.IntRange(0, MAX_GLOBAL_LIMIT),
    help="At most so many of its jobs processing at once, fleet-wide (0: they wait).",
)
@click.pass_context
def limits_set(ctx: click.Context, topic: str, group: str, limit: int) -> None:
    """Give GROUP of TOPIC its own group_limit, replacing the topic's for that group."""
    open_queue(ctx).set_group_limit(topic, group, limit)
    say(f"group {group} of {topic}: at most {limit} processing at once, from the next claim")


@limits.command("clear")
@click.argument("topic", callback=name_check(brooq.job.validate_topic))
@click.option("--group", "group", required=True, callback=_group, help="The group.")
@click.pass_context
def limits_clear(ctx: click.Context, topic: str, group: str) -> None:
    """Take GROUP of TOPIC back to the topic's group_limit."""
    if open_queue(ctx).set_group_limit(topic, group, None):
        say(f"group {group} of {topic}: back to the topic's group_limit")
    else:
        say(f"group {group} of {topic} had no limit of its own: nothing changed")
