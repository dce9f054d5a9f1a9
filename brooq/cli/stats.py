"""`brooq stats`: jobs per queue, topic and state, as a table or JSON, with the "no
handler" mark of a queue and topic whose ready jobs no live master handles; read on the
read target when one is set, with a line (a field in JSON) saying how far behind its
primary that is.

Owns: the stats command and its table (``stats_lines``, a pure function).
Must never: read the database but through Queue.stats, brooq.operator.masters.live and
brooq.operator.replica, or count done jobs (a queue's done rows grow without bound;
job_stats_by_topic leaves them out).
"""

from __future__ import annotations

from collections.abc import Collection

import click
import psycopg

import brooq
from brooq.cli.common import cli, emit_json, open_reads, reads_from, reads_line, table
from brooq.cli.terminal import say, say_lines
from brooq.durations import format_age
from brooq.operator.masters import Handled, Pair, handled, live, no_handler
from brooq.sql import queries

NO_HANDLER = "no handler"


def stats_lines(rows: list[brooq.TopicStats], unhandled: Collection[Pair] = ()) -> list[str]:
    """`brooq stats` as text (one row per queue and topic, a total row when there are
    several); a row whose (queue, topic) is in ``unhandled`` ends with "no handler"."""
    if not rows:
        return ["(no waiting, pending, processing, failed or dead jobs)"]
    headers = [
        "QUEUE",
        "TOPIC",
        "WAITING",
        "PENDING",
        "READY",
        "HELD",
        "FAILED",
        "PROCESSING",
        "BUSY",
        "DEAD",
        "PARKED",
        "OLDEST READY",
    ]

    def cells(r: brooq.TopicStats) -> list[str]:
        numbers = [r.waiting, r.pending, r.ready, r.held, r.failed, r.processing, r.busy, r.dead]
        numbers.append(r.parked)
        oldest = format_age(r.oldest_ready_age) if r.ready > r.held else "-"
        return [r.queue, r.topic, *map(str, numbers), oldest]

    body = [cells(r) for r in rows]
    if len(rows) > 1:
        total = brooq.TopicStats(
            queue="(total)",
            topic="",
            waiting=sum(r.waiting for r in rows),
            pending=sum(r.pending for r in rows),
            ready=sum(r.ready for r in rows),
            failed=sum(r.failed for r in rows),
            processing=sum(r.processing for r in rows),
            busy=sum(r.busy for r in rows),
            dead=sum(r.dead for r in rows),
            oldest_ready_age=max(r.oldest_ready_age for r in rows),
            held=sum(r.held for r in rows),
            parked=sum(r.parked for r in rows),
        )
        body.append(cells(total))
    lines = table(headers, body, right={2, 3, 4, 5, 6, 7, 8, 9, 10})
    for i, r in enumerate(rows, start=1):
        if (r.queue, r.topic) in unhandled:
            lines[i] += f"  {NO_HANDLER}"
    return lines


def _live_pairs(queue: brooq.Queue) -> Handled | None:
    """The pairs the live masters handle; None on a schema without brooq_master (an older
    brooq's: `brooq migrate up` adds it), where nothing is marked."""
    try:
        with queue.connection() as conn:
            return handled(live(conn, queries(queue.schema)))
    except psycopg.errors.UndefinedTable:
        return None


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_context
def stats(ctx: click.Context, as_json: bool) -> None:
    """Jobs per queue, topic and state, busy children, oldest ready age.

    Per queue and topic: waiting (for the jobs named in their after), pending, ready (due
    now), held (ready, but held back by the topic's limits now: its rate_limit or
    global_limit, their group's group_limit or group_rate_limit), failed (waiting for a
    retry), processing, busy (processing under a live lease: a child working on it),
    dead, parked (a durable handler's jobs sleeping or waiting for an event or their
    child jobs, counted in waiting or pending too, never in ready), and the age of the
    oldest ready job not held back. "no handler": ready jobs
    that no live master handles (no master has a handler for the topic, or none works
    the queue; see `brooq fleet`).

    With a read target (--read-database-url), the figures are read there, and a last
    line ("read_from" in JSON) says how far behind its primary it is."""
    queue = open_reads(ctx)
    rows = queue.stats()
    pairs = _live_pairs(queue)
    standing = reads_from(ctx, queue)
    marked = {
        (r.queue, r.topic)
        for r in rows
        if pairs is not None and no_handler(r.queue, r.topic, r.ready, pairs)
    }
    if as_json:
        found: dict[str, object] = {
            "topics": [
                {
                    **r.to_dict(),
                    "no_handler": (r.queue, r.topic) in marked if pairs is not None else None,
                }
                for r in rows
            ]
        }
        if standing is not None:
            database, lag = standing
            found["read_from"] = {"database": database, **lag.to_dict()}
        emit_json(found)
        return
    say_lines(stats_lines(rows, marked))
    if standing is not None:
        say(reads_line(*standing))
