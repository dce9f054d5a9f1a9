"""`brooq fleet`: the live masters and their children, as text or JSON.

Owns: the fleet command and its text (``fleet_lines``, a pure function).
Read on the read target when one is set (brooq.cli.common.open_reads).
Must never: read the database but through brooq.operator.masters.live, or show a row whose master
missed its beats (brooq.operator.masters.MISSED_BEATS).
"""

from __future__ import annotations

import click

from brooq.cli.common import cli, emit_json, open_reads, reads_from, reads_line, table, utc
from brooq.cli.terminal import say_lines
from brooq.durations import format_age
from brooq.operator.masters import MISSED_BEATS, MasterRow, live
from brooq.sql import queries


def fleet_lines(masters: list[MasterRow]) -> list[str]:
    """`brooq fleet` as text: per master a line, its queues and topics, its children."""
    if not masters:
        return [f"(no live master: none has written its row within {MISSED_BEATS} of its beats)"]
    lines: list[str] = []
    for m in masters:
        if lines:
            lines.append("")
        lines.append(
            f"{m.host} pid {m.pid}: brooq {m.version}, app {m.app}, started "
            f"{utc(m.started_at)}, seen {format_age(m.seen_seconds_ago)} ago"
        )
        if m.malformed:
            lines.append(f"  (malformed row: {m.malformed})")
        lines.append(f"  queues: {', '.join(m.queues) or '-'}")
        lines.append(f"  topics: {', '.join(m.topics) or '-'}")
        rows = [
            [
                str(c.pid),
                c.kind,
                str(c.generation),
                utc(c.started_at) if c.started_at else "-",
            ]
            for c in m.children
        ]
        if rows:
            lines += [
                "  " + line for line in table(["PID", "KIND", "GEN", "STARTED"], rows, {0, 2})
            ]
        else:
            lines.append("  (no children)")
    children = sum(len(m.children) for m in masters)
    lines += ["", f"{_count(len(masters), 'master')}, {_count(children, 'child')}"]
    return lines


def _count(n: int, noun: str) -> str:
    plural = "children" if noun == "child" else noun + "s"
    return f"{n} {noun if n == 1 else plural}"


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_context
def fleet(ctx: click.Context, as_json: bool) -> None:
    """The live masters: host, pid, version, application, queues and topics, children.

    Each brooq-master writes its row every QUEUE_FLEET_BEAT (10 s) and deletes it when it
    stops; one that missed three of its beats (killed, its host gone) is not listed."""
    queue = open_reads(ctx)
    with queue.connection() as conn:
        masters = live(conn, queries(queue.schema))
    if as_json:
        emit_json({"masters": [m.to_dict() for m in masters]})
        return
    say_lines(fleet_lines(masters))
    if (standing := reads_from(ctx, queue)) is not None:  # rows as of a standby's replay
        say_lines(["", reads_line(*standing)])
