"""`brooq stats`: jobs per queue, topic and state, as a table or JSON.

Owns: the stats command and its table (``stats_lines``, a pure function).
Must never: read the database but through Queue.stats, or count done jobs (a queue's
done rows grow without bound; job_stats_by_topic leaves them out).
"""

from __future__ import annotations

import click

import brooq
from brooq.cli.common import cli, emit_json, open_queue, table
from brooq.durations import format_age


def stats_lines(rows: list[brooq.TopicStats]) -> list[str]:
    """`brooq stats` as text (one row per queue and topic, a total row when there are
    several)."""
    if not rows:
        return ["(no pending, processing, failed or dead jobs)"]
    headers = [
        "QUEUE",
        "TOPIC",
        "PENDING",
        "READY",
        "FAILED",
        "PROCESSING",
        "BUSY",
        "DEAD",
        "OLDEST READY",
    ]

    def cells(r: brooq.TopicStats) -> list[str]:
        numbers = (r.pending, r.ready, r.failed, r.processing, r.busy, r.dead)
        oldest = format_age(r.oldest_ready_age) if r.ready else "-"
        return [r.queue, r.topic, *map(str, numbers), oldest]

    body = [cells(r) for r in rows]
    if len(rows) > 1:
        total = brooq.TopicStats(
            queue="(total)",
            topic="",
            pending=sum(r.pending for r in rows),
            ready=sum(r.ready for r in rows),
            failed=sum(r.failed for r in rows),
            processing=sum(r.processing for r in rows),
            busy=sum(r.busy for r in rows),
            dead=sum(r.dead for r in rows),
            oldest_ready_age=max(r.oldest_ready_age for r in rows),
        )
        body.append(cells(total))
    return table(headers, body, right={2, 3, 4, 5, 6, 7})


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_context
def stats(ctx: click.Context, as_json: bool) -> None:
    """Jobs per queue, topic and state, busy children, oldest ready age.

    Per queue and topic: pending, ready (due now), failed (waiting for a retry), processing, busy
    (processing under a live lease: a child working on it), dead, and the age of the
    oldest ready job."""
    rows = open_queue(ctx).stats()
    if as_json:
        emit_json({"topics": [r.to_dict() for r in rows]})
        return
    for line in stats_lines(rows):
        click.echo(line)
