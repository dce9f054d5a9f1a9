"""`brooq limits`: the groups' own limits and rates, set at runtime (a tenant's plan):
`set TOPIC --group G [--limit N] [--rate R]`, `clear TOPIC --group G [--limit] [--rate]`,
and `list [TOPIC]`.

Owns: those commands and the table of the groups' own limits (``group_limits_lines``,
pure), which `brooq queues` prints too.
Must never: read or write the database but through Queue.set_group_limit,
Queue.set_group_rate and Queue.group_limits.
"""

from __future__ import annotations

import click

import brooq
from brooq.cli.common import cli, emit_json, name_check, open_queue, open_reads, table, utc
from brooq.cli.terminal import say, say_lines
from brooq.declare.handlers import MAX_GLOBAL_LIMIT
from brooq.declare.rates import parse_rate
from brooq.job_options import validate_group


def group_limits_lines(rows: list[brooq.GroupLimit]) -> list[str]:
    """The groups' own limits as a table (empty: none set)."""
    if not rows:
        return []
    body = [
        [
            r.topic,
            r.group,
            "-" if r.limit is None else str(r.limit),
            r.rate_text or "-",
            utc(r.updated_at),
        ]
        for r in rows
    ]
    return table(["TOPIC", "GROUP", "OWN LIMIT", "OWN RATE", "SET"], body, right={2})


def _rate(ctx: click.Context, param: click.Parameter, value: str | None) -> brooq.Rate | None:
    if value is None:
        return None
    try:
        return parse_rate(value, "--rate")
    except ValueError as exc:
        raise click.BadParameter(str(exc).removeprefix("--rate: "), ctx=ctx, param=param) from None


def _group(ctx: click.Context, param: click.Parameter, value: str) -> str:
    checked = validate_group(value)
    if checked is None:
        raise click.BadParameter("a group is 1 to 128 characters", ctx=ctx, param=param)
    return checked


@cli.group("limits", invoke_without_command=True)
@click.pass_context
def limits(ctx: click.Context) -> None:
    """The groups' own limits and rates, set at runtime (a tenant's plan): each replaces
    its topic's group_limit or group_rate_limit for that group in the claims of a topic
    claimed apart (a rate, a group limit or fair_groups; an own rate counts on a topic
    under a rate). Every master obeys a change at its next claim of the topic. Without a
    command: `brooq limits list`."""
    if ctx.invoked_subcommand is None:
        ctx.invoke(limits_list, topic=None, as_json=False)


@limits.command("list")
@click.argument("topic", required=False, callback=name_check(brooq.job.validate_topic))
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output (a list).")
@click.pass_context
def limits_list(ctx: click.Context, topic: str | None, as_json: bool) -> None:
    """The groups' own limits and rates, every topic's or TOPIC's."""
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
    type=click.IntRange(0, MAX_GLOBAL_LIMIT),
    help="At most so many of its jobs processing at once, fleet-wide (0: they wait).",
)
@click.option(
    "--rate",
    "rate",
    callback=_rate,
    help="At most so many starts in any window, fleet-wide: N/s, N/m or N/h.",
)
@click.pass_context
def limits_set(
    ctx: click.Context, topic: str, group: str, limit: int | None, rate: brooq.Rate | None
) -> None:
    """Give GROUP of TOPIC its own group_limit (--limit), its own rate (--rate), or both,
    replacing the topic's for that group."""
    if limit is None and rate is None:
        raise click.UsageError("give --limit, --rate or both")
    queue = open_queue(ctx)
    said = []
    if limit is not None:
        queue.set_group_limit(topic, group, limit)
        said.append(f"at most {limit} processing at once")
    if rate is not None:
        queue.set_group_rate(topic, group, rate)
        said.append(f"at most {rate} starts")
    say(f"group {group} of {topic}: {' and '.join(said)}, from the next claim")


@limits.command("clear")
@click.argument("topic", callback=name_check(brooq.job.validate_topic))
@click.option("--group", "group", required=True, callback=_group, help="The group.")
@click.option("--limit", "only_limit", is_flag=True, help="Its own limit only.")
@click.option("--rate", "only_rate", is_flag=True, help="Its own rate only.")
@click.pass_context
def limits_clear(
    ctx: click.Context, topic: str, group: str, only_limit: bool, only_rate: bool
) -> None:
    """Take GROUP of TOPIC back to the topic's group_limit and group_rate_limit (or only
    one of them, with --limit or --rate)."""
    both = not only_limit and not only_rate
    queue = open_queue(ctx)
    cleared = []
    if (both or only_limit) and queue.set_group_limit(topic, group, None):
        cleared.append("group_limit")
    if (both or only_rate) and queue.set_group_rate(topic, group, None):
        cleared.append("group_rate_limit")
    if cleared:
        say(f"group {group} of {topic}: back to the topic's {' and '.join(cleared)}")
    else:
        say(f"group {group} of {topic} had no limit of its own: nothing changed")
