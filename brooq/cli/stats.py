"""`brooq stats`: jobs per queue, topic and count (docs/explanation/guarantees.md,
"Counts"), as a table or JSON, with whether a live master handles each queue and topic
(HANDLER); read on the read target when one is set, with a line (a field in JSON) saying
how far behind its primary that is.

Owns: the stats command and its table (``stats_lines``, a pure function).
Must never: read the database but through Queue.stats, brooq.operator.masters.live and
brooq.operator.replica, or count done jobs (a queue's done rows grow without bound;
job_stats_by_topic leaves them out).
"""

from __future__ import annotations

from collections.abc import Container

import click
import psycopg

import brooq
from brooq.cli.common import cli, emit_json, open_reads, reads_from, reads_line, table
from brooq.cli.terminal import say, say_lines
from brooq.durations import format_age
from brooq.operator.masters import Handled, Pair, handled, live, no_handler
from brooq.operator.records import COUNTS
from brooq.sql import queries

# The HANDLER column: a live master handles the queue and topic, none does, or it cannot
# be told (a schema without brooq_master, an older brooq's: `brooq migrate up` adds it).
HANDLED = "yes"
NO_HANDLER = "none"
UNKNOWN = "-"
EMPTY = "(no unfinished or dead jobs)"


def total(rows: list[brooq.TopicStats]) -> brooq.TopicStats:
    """The rows' counts summed, the greatest oldest ready age."""
    return brooq.TopicStats(
        queue="(total)",
        topic="",
        oldest_ready_age=max((r.oldest_ready_age for r in rows), default=0.0),
        **{
            name: sum(getattr(r, name) for r in rows)
            for name in (*COUNTS, "pending", "failed", "busy")
        },
    )


def stats_lines(
    rows: list[brooq.TopicStats], live_pairs: Container[Pair] | None = None
) -> list[str]:
    """`brooq stats` as text: one row per queue and topic, a total row when there are
    several. HANDLER: "yes" when ``live_pairs`` (the pairs the live masters handle) holds
    the row's queue and topic, "none" when it does not, "-" without it (None)."""
    if not rows:
        return [EMPTY]
    headers = ["QUEUE", "TOPIC", *(name.upper() for name in COUNTS), "OLDEST READY", "HANDLER"]

    def cells(r: brooq.TopicStats, handler: str) -> list[str]:
        oldest = format_age(r.oldest_ready_age) if r.ready > r.held else "-"
        return [r.queue, r.topic, *(str(getattr(r, name)) for name in COUNTS), oldest, handler]

    def handler(r: brooq.TopicStats) -> str:
        if live_pairs is None:
            return UNKNOWN
        return HANDLED if (r.queue, r.topic) in live_pairs else NO_HANDLER

    body = [cells(r, handler(r)) for r in rows]
    if len(rows) > 1:
        body.append(cells(total(rows), ""))
    return table(headers, body, right=set(range(2, 2 + len(COUNTS))))


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
    """Jobs per queue and topic: each count, the oldest ready age, and whether a live
    master handles them.

    The counts (docs/explanation/guarantees.md, "Counts"): waiting (for the jobs named in
    their after), scheduled (pending, due later), ready (due now), held (part of ready:
    held back now by the topic's limits, its rate_limit or global_limit, their group's
    group_limit or group_rate_limit), retrying (failed, waiting out the backoff), parked
    (a durable handler's jobs sleeping or waiting for an event or their child jobs),
    processing, dead; then the age of the oldest ready job not held back. HANDLER: "yes"
    when a live master handles the queue and topic, "none" when none does (no master has
    a handler for the topic, or none works the queue: its ready jobs wait for ever; see
    `brooq fleet`), "-" on a schema without the masters' table.

    With --json, each row also has the state counts pending, failed and busy (processing
    under a live lease), "handler" (true, false or null) and "no_handler" (ready jobs no
    live master handles). With a read target (--read-database-url), the figures are read
    there, and a last line ("read_from" in JSON) says how far behind its primary it is."""
    queue = open_reads(ctx)
    rows = queue.stats()
    pairs = _live_pairs(queue)
    standing = reads_from(ctx, queue)
    if as_json:
        found: dict[str, object] = {
            "topics": [
                {
                    **r.to_dict(),
                    "handler": (r.queue, r.topic) in pairs if pairs is not None else None,
                    "no_handler": no_handler(r.queue, r.topic, r.ready, pairs)
                    if pairs is not None
                    else None,
                }
                for r in rows
            ]
        }
        if standing is not None:
            database, lag = standing
            found["read_from"] = {"database": database, **lag.to_dict()}
        emit_json(found)
        return
    say_lines(stats_lines(rows, pairs))
    if standing is not None:
        say(reads_line(*standing))
