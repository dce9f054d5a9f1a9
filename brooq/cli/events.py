"""`brooq events emit KEY [--payload JSON]` and `brooq events waits`: the events durable
handlers wait for (``claim.wait_event``), emitted by an operator, and the waits pending.

Owns: the `events` group and those commands, reading --payload (a usage error, one line,
for text that is not JSON) and the table of waits.
Must never: emit but through Queue.emit_event (its checks and SQL), or write anything else.
"""

from __future__ import annotations

from datetime import datetime, timezone

import click

from brooq.cli.common import cli, emit_json, open_queue, open_reads, table, utc
from brooq.cli.enqueue import _decode_payload
from brooq.cli.terminal import say, say_lines
from brooq.durations import format_age
from brooq.errors import InvalidPayload
from brooq.operator import reads
from brooq.operator.reads import IN_FLIGHT_LIMIT_MAX
from brooq.sql import queries


@cli.group()
def events() -> None:
    """Emit the events durable handlers wait for; list the waits pending."""


@events.command("emit")
@click.argument("key")
@click.option("--payload", metavar="JSON", help="The event's payload, as JSON (default: null).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_context
def events_emit(ctx: click.Context, key: str, payload: str | None, as_json: bool) -> None:
    """Emit the event KEY: the jobs waiting on it are released. The first emit of a key
    wins; a later one changes nothing (and says so)."""
    value = None if payload is None else _decode_payload(payload, "--payload")
    queue = open_queue(ctx)
    try:
        first = queue.emit_event(key, value)
    except InvalidPayload as exc:
        raise click.BadParameter(str(exc), param_hint="--payload") from None
    except ValueError as exc:  # the key (brooq.producer.events.check_key)
        raise click.BadParameter(str(exc), param_hint="KEY") from None
    if as_json:
        emit_json({"key": key, "first": first})
    elif first:
        say(f"emitted {key}: the jobs waiting on it are released")
    else:
        say(f"{key} was emitted before: this emit changed nothing")


@events.command("waits")
@click.option(
    "--limit",
    type=click.IntRange(1, IN_FLIGHT_LIMIT_MAX),
    default=100,
    show_default=True,
    help="At most this many, oldest first.",
)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_context
def events_waits(ctx: click.Context, limit: int, as_json: bool) -> None:
    """The jobs waiting for an event, oldest first: the key, since when, until when (a
    wait's timeout; "-" without one)."""
    queue = open_reads(ctx)
    with queue.connection() as conn:
        found = reads.event_waits(conn, limit, q=queries(queue.schema))
    if as_json:
        emit_json(
            [
                {
                    "job": str(w["job"]),
                    "topic": w["topic"],
                    "key": w["key"],
                    "since": w["since"].isoformat(),
                    "until": None if w["until"] is None else w["until"].isoformat(),
                }
                for w in found
            ]
        )
        return
    if not found:
        say("no job waits for an event")
        return
    now = datetime.now(timezone.utc)
    rows = [
        [
            str(w["job"]),
            w["topic"],
            w["key"],
            f"{utc(w['since'])} ({format_age((now - w['since']).total_seconds())} ago)",
            "-" if w["until"] is None else utc(w["until"]),
        ]
        for w in found
    ]
    say_lines(table(["JOB", "TOPIC", "KEY", "SINCE", "UNTIL"], rows, right=set()))
