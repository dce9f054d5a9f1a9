"""`brooq queues`, `brooq queues pause NAME`, `brooq queues resume NAME`: the queues, and
stopping one during an incident without stopping the workers.

Owns: those commands, the table of queues (with the blocked ordered keys of each, when
any key is blocked) and the table of the topics' limits (``queues_lines``,
``limits_lines``: pure functions) and the words of a pause and a resume.
The list reads on the read target when one is set (brooq.cli.common.open_reads); pause
and resume, and the figures they print after, on the database itself.
Must never: read or write the database but through Queue.queues, Queue.limits,
Queue.pause, Queue.resume and brooq.operator.keys.blocked_counts, or write anything for
a malformed name (it is refused before any I/O).
"""

from __future__ import annotations

from typing import Any

import click
import psycopg

import brooq
from brooq.cli.common import cli, emit_json, open_queue, open_reads, table
from brooq.cli.limits import group_limits_lines
from brooq.cli.terminal import say, say_lines
from brooq.durations import format_age
from brooq.errors import InvalidQueue
from brooq.job import validate_queue
from brooq.operator import keys as keys_mod
from brooq.operator.records import COUNTS
from brooq.sql import queries

EMPTY = "(no queues: no unfinished or dead jobs, none paused)"

# Per queue: its ordered keys a dead job blocks, and those whose job awaits a retry.
Blocked = dict[str, tuple[int, int]]


def queues_lines(rows: list[brooq.QueueStats], blocked: Blocked | None = None) -> list[str]:
    """`brooq queues` as text: one row per queue, by name, with the counts of
    docs/explanation/guarantees.md ("Counts"); then, when any ordered key is blocked
    (``blocked``: keys.blocked_counts), a BLOCKED KEYS column: "2 dead, 1 retrying", "-"."""
    blocked = {name: n for name, n in (blocked or {}).items() if any(n)}
    rows = _with_queues(rows, blocked)
    if not rows:
        return [EMPTY]
    headers = ["QUEUE", "PAUSED", *(name.upper() for name in COUNTS), "OLDEST READY"]
    body = [
        [
            r.name,
            "yes" if r.paused else "no",
            *(str(getattr(r, name)) for name in COUNTS),
            format_age(r.oldest_ready_seconds) if r.ready > r.held else "-",
        ]
        for r in rows
    ]
    if blocked:
        headers.append("BLOCKED KEYS")
        for row, r in zip(body, rows, strict=True):
            row.append(blocked_cell(*blocked.get(r.name, (0, 0))))
    return table(headers, body, right=set(range(2, 2 + len(COUNTS))))


def blocked_cell(dead: int, retrying: int) -> str:
    """A queue's blocked keys in a cell: "2 dead, 1 retrying", "1 dead", "-" for none."""
    parts = [f"{n} {reason}" for n, reason in ((dead, "dead"), (retrying, "retrying")) if n]
    return ", ".join(parts) or "-"


def _with_queues(rows: list[brooq.QueueStats], names: Blocked) -> list[brooq.QueueStats]:
    """``rows`` and a row of zeros for each queue of ``names`` they lack, by name."""
    known = {r.name for r in rows}
    missing = [brooq.QueueStats(name=name) for name in names if name not in known]
    return sorted([*rows, *missing], key=lambda r: r.name) if missing else rows


def blocked_counts(queue: brooq.Queue) -> Blocked:
    """The blocked ordered keys per queue; none on a schema without ordered keys (an older
    brooq's: `brooq migrate up` adds them)."""
    with queue.connection() as conn:
        try:
            with conn.transaction():
                return keys_mod.blocked_counts(conn, queries(queue.schema))
        except (psycopg.errors.UndefinedTable, psycopg.errors.UndefinedColumn):
            return {}


def limits_lines(limits: list[brooq.TopicLimits]) -> list[str]:
    """The topics' limits as the live masters publish them, and what they hold back now
    (nothing when no topic has a limit)."""
    if not limits:
        return []
    headers = ["TOPIC", "QUEUE", "GLOBAL LIMIT", "RATE LIMIT", "GROUP LIMIT",
               "GROUP RATE LIMIT", "HOLDING BACK"]  # fmt: skip

    def shown(value: object) -> str:
        return "-" if value is None else str(value)

    body = [
        [
            t.topic,
            t.queue,
            shown(t.global_limit),
            shown(t.rate_limit),
            shown(t.group_limit),
            shown(t.group_rate_limit),
            t.holding() or "-",
        ]
        for t in limits
    ]
    return table(headers, body, right={2, 3, 4, 5})


def _with_limits(
    rows: list[brooq.QueueStats],
    limits: list[brooq.TopicLimits],
    own: list[dict[str, Any]] | None = None,
    blocked: Blocked | None = None,
) -> list[dict[str, Any]]:
    """The queues as JSON, each with its blocked ordered keys ("blocked_keys": a dead job
    in the way, a retry awaited) and the limits of the topics whose handler declares it
    (and, under "group_limits", the groups' own limits set at runtime, when any is); a
    queue known only that way is listed with zeros."""
    blocked = {name: n for name, n in (blocked or {}).items() if any(n)}
    found: dict[str, dict[str, Any]] = {r.name: r.to_dict() for r in _with_queues(rows, blocked)}
    by_queue: dict[str, dict[str, Any]] = {}
    for t in limits:
        found.setdefault(t.queue, brooq.QueueStats(name=t.queue).to_dict())
        entry = {k: v for k, v in t.to_dict().items() if k not in ("topic", "queue")}
        groups = {g["group"]: g["limit"] for g in own or () if g["topic"] == t.topic}
        if groups:
            entry["group_limits"] = groups
        by_queue.setdefault(t.queue, {})[t.topic] = entry
    return [
        {
            **found[name],
            "blocked_keys": dict(zip(("dead", "retrying"), blocked.get(name, (0, 0)), strict=True)),
            "limits": by_queue.get(name, {}),
        }
        for name in sorted(found)
    ]


def _checked_name(name: str) -> str:
    """The queue name, or a usage error naming NAME (before the database is opened)."""
    try:
        return validate_queue(name)
    except InvalidQueue as exc:
        raise click.BadParameter(str(exc), param_hint="NAME") from None


def _one(queue: brooq.Queue, name: str) -> brooq.QueueStats:
    for stats in queue.queues():
        if stats.name == name:
            return stats
    return brooq.QueueStats(name=name)


@cli.group(invoke_without_command=True)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output (a list).")
@click.pass_context
def queues(ctx: click.Context, as_json: bool) -> None:
    """The queues: paused or not, and their jobs; the topics' limits; pause or resume one.

    Per queue: paused, then the counts of `brooq stats` summed over its topics (waiting,
    scheduled, ready, held, retrying, parked, processing, dead:
    docs/explanation/guarantees.md, "Counts") and the age of the oldest ready job not
    held back. Every queue holding such jobs is shown, and every queue paused or resumed,
    even one that never had a job. With --json, each queue also has "failed" (the
    state's count: its jobs are ready or retrying). Then each topic's limits of the fleet, as the
    live masters publish them (global_limit, rate_limit, group_limit, group_rate_limit),
    and what they hold back now: every ready job of the topic (at its global_limit, or
    its rate's window full) or some groups; then the groups' own limits set at runtime
    (`brooq limits set`). With --json, each queue lists the limits of the topics whose
    handler declares it, and their groups' own limits.

    When an ordered key (Job(ordering_key=...)) is blocked, a BLOCKED KEYS column: per
    queue, the keys a dead job blocks and those whose job awaits its retry (`brooq keys`
    lists them); with --json, every queue has "blocked_keys": {"dead": N, "retrying": N}."""
    if ctx.invoked_subcommand is not None:
        if as_json:
            raise click.UsageError("give --json without pause or resume: it lists the queues")
        return
    queue = open_reads(ctx)
    rows = queue.queues()
    limits = queue.limits()
    blocked = blocked_counts(queue)
    if as_json:
        own = [g.to_dict() for g in queue.group_limits()]
        emit_json(_with_limits(rows, limits, own, blocked))
        return
    say_lines(queues_lines(rows, blocked))
    if limits:
        say("")
        say_lines(limits_lines(limits))
    own_lines = group_limits_lines(queue.group_limits())
    if own_lines:
        say("")
        say_lines(own_lines)


@queues.command("pause")
@click.argument("name")
@click.pass_context
def queues_pause(ctx: click.Context, name: str) -> None:
    """Stop claims from queue NAME: every master stops taking its jobs within its
    poll_interval, running jobs finish, producers go on enqueueing. A queue that has no
    jobs yet may be paused; the pause holds when they come."""
    checked = _checked_name(name)
    queue = open_queue(ctx)
    queue.pause(checked)
    now = _one(queue, checked)
    say(
        f"paused queue {checked}: no new claims within poll_interval, running jobs finish "
        f"({now.ready} ready, {now.processing} processing)"
    )


@queues.command("resume")
@click.argument("name")
@click.pass_context
def queues_resume(ctx: click.Context, name: str) -> None:
    """Let the masters claim from queue NAME again."""
    checked = _checked_name(name)
    queue = open_queue(ctx)
    queue.resume(checked)
    now = _one(queue, checked)
    say(f"resumed queue {checked}: claims go on ({now.ready} ready)")
