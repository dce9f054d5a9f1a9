"""`brooq enqueue TOPIC`: one job from the command line.

Owns: the enqueue command, reading its payload (--payload, --payload-file, standard
input), its time (--at, --in), its queue and priority, its unique key, debounce and tags,
its ordering key,
the application it may name (--app: its handlers then place and check the job as
``queue.enqueue`` does), and naming the option a refused value came from.
Must never: insert but through Queue.enqueue (the producer's checks and SQL), or accept
input that brooq.Job would refuse: every refusal is a usage error (exit 2) naming the
argument or option.
"""

from __future__ import annotations

import json
import re
import sys
from datetime import datetime, timedelta, timezone
from typing import Any, Literal

import click

import brooq
from brooq import app as app_mod
from brooq.cli.common import checked_dsn, cli, emit_json, open_queue, schema
from brooq.durations import parse_duration_string
from brooq.encoding import MAX_PAYLOAD_DEPTH
from brooq.errors import (
    AppLoadError,
    InvalidAfter,
    InvalidDebounce,
    InvalidGroup,
    InvalidIdempotencyKey,
    InvalidJob,
    InvalidOrderingKey,
    InvalidPayload,
    InvalidPriority,
    InvalidQueue,
    InvalidTags,
    InvalidTopic,
    InvalidUniqueKey,
)
from brooq.job import PRIORITY_MAX, PRIORITY_MIN
from brooq.job_options import ORDERING_KEY_MAX_LENGTH

# --payload-file reads at most this much: a stored payload is far smaller (max_payload_bytes,
# 1 MiB by default), but a file may be indented; /dev/zero must not fill the memory.
PAYLOAD_FILE_MAX_BYTES = 64 * 1024 * 1024


def _parse_at(text: str) -> datetime:
    value = text.strip()
    if value[-1:] in ("Z", "z"):  # fromisoformat accepts Z only from Python 3.11
        value = value[:-1] + "+00:00"
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise click.BadParameter(
            f"{text!r} is not an ISO 8601 time such as 2030-01-31T09:00:00+01:00",
            param_hint="--at",
        ) from None
    if moment.tzinfo is None:
        raise click.BadParameter(
            f"{text!r} has no time zone; add one, e.g. {text}Z or {text}+01:00",
            param_hint="--at",
        )
    return moment


def _parse_priority(text: str) -> int:
    """--priority as an int, or a usage error that never echoes a huge value whole (the
    range itself is brooq.Job's check)."""
    value = text.strip()
    shown = value if len(value) <= 24 else f"{value[:12]}… ({len(value)} characters)"
    if not re.fullmatch(r"[+-]?[0-9]+", value):
        raise click.BadParameter(
            f"{shown!r} is not an integer; a priority is from {PRIORITY_MIN} to "
            f"{PRIORITY_MAX}, higher runs first",
            param_hint="--priority",
        )
    if len(value.lstrip("+-").lstrip("0")) > len(str(PRIORITY_MAX)):
        raise click.BadParameter(
            f"priority must be from {PRIORITY_MIN} to {PRIORITY_MAX} (higher runs first), "
            f"got {shown}",
            param_hint="--priority",
        )
    return int(value)


def _read_payload_file(path: str) -> str:
    """The text of --payload-file (``-``: standard input), or a usage error naming it."""
    name = "standard input" if path == "-" else path
    try:
        if path == "-":
            raw = sys.stdin.buffer.read(PAYLOAD_FILE_MAX_BYTES + 1)
        else:
            with open(path, "rb") as f:
                raw = f.read(PAYLOAD_FILE_MAX_BYTES + 1)
    except OSError as exc:
        raise click.BadParameter(
            f"cannot read {name}: {exc.strerror or exc}", param_hint="--payload-file"
        ) from None
    if len(raw) > PAYLOAD_FILE_MAX_BYTES:
        raise click.BadParameter(
            f"{name} is larger than {PAYLOAD_FILE_MAX_BYTES // (1024 * 1024)} MiB",
            param_hint="--payload-file",
        )
    try:
        return raw.decode("utf-8-sig")  # a byte order mark, as some editors write, is fine
    except UnicodeDecodeError as exc:
        raise click.BadParameter(
            f"{name} is not UTF-8 text (byte {exc.start})", param_hint="--payload-file"
        ) from None


def _decode_payload(text: str, hint: str, name: str = "") -> Any:
    """JSON text as a value, or a usage error: one line, whatever the text (json.loads
    raises RecursionError on deep nesting and ValueError on a 5,000-digit integer)."""
    where = f"{name}: " if name else ""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        message = f"{where}not JSON: {exc}"
    except RecursionError:
        message = (
            f"{where}nested too deeply; a payload holds at most {MAX_PAYLOAD_DEPTH} levels "
            "of arrays and objects"
        )
    except ValueError as exc:  # "Exceeds the limit (4300 digits) for integer string ..."
        message = f"{where}not usable JSON: {str(exc).split(';')[0]}"
    raise click.BadParameter(message, param_hint=hint)


def _job_error_hint(exc: InvalidJob, payload_hint: str, time_hint: str) -> str:
    """The argument or option that an InvalidJob raised by brooq.Job is about."""
    if isinstance(exc, InvalidTopic):
        return "TOPIC"
    if isinstance(exc, InvalidPayload):
        return payload_hint
    if isinstance(exc, InvalidIdempotencyKey):
        return "--key"
    if isinstance(exc, InvalidQueue):
        return "--queue"
    if isinstance(exc, InvalidPriority):
        return "--priority"
    if isinstance(exc, InvalidUniqueKey):
        return "--unique-key"
    if isinstance(exc, InvalidDebounce):
        return "--debounce"
    if isinstance(exc, InvalidTags):
        return "--tag"
    if isinstance(exc, InvalidGroup):
        return "--group"
    if isinstance(exc, InvalidAfter):
        return "--after"
    if isinstance(exc, InvalidOrderingKey):
        return "--ordering-key"
    return time_hint  # available_at out of range


def _app_queue(ctx: click.Context, spec: str) -> brooq.Queue:
    """A Queue of one pooled connection that knows the handlers of the application
    ``spec`` names (its include= imported): ``enqueue`` then places and checks a job as
    the application's own Queue would. The application's DSN and schema unless
    --database and --schema are given."""
    try:
        app = app_mod.load(spec)
    except AppLoadError as exc:
        raise click.BadParameter(str(exc), param_hint="--app") from None
    if not ctx.obj.get("database") and app._dsn_arg:
        ctx.obj["database"] = app._dsn_arg
    opened = brooq.Queue(checked_dsn(ctx), pool_size=1, schema=schema(ctx, app.schema))
    ctx.call_on_close(opened.close)
    opened.handlers = app.handlers
    opened.strict_topics = app.strict_topics
    return opened


@cli.command()
@click.argument("topic")
@click.option("--payload", default=None, help="The payload, as JSON.  [default: null]")
@click.option(
    "--payload-file",
    "payload_file",
    metavar="PATH",
    default=None,
    help="Read the payload (JSON) from this file; - reads standard input. "
    f"At most {PAYLOAD_FILE_MAX_BYTES // (1024 * 1024)} MiB of text.",
)
@click.option("--key", "key", default=None, help="Idempotency key: one job per topic and key.")
@click.option(
    "--unique-key",
    "unique_key",
    metavar="K",
    default=None,
    help="At most one pending, failed or processing job per topic and key.",
)
@click.option(
    "--debounce",
    metavar="DURATION",
    default=None,
    help="With --unique-key: the key's job not yet started takes this payload and starts "
    "this long from now, e.g. 2s.",
)
@click.option(
    "--ordering-key",
    "ordering_key",
    metavar="K",
    default=None,
    help="The jobs of one topic and ordering key start one at a time, in enqueue order "
    "(not with --unique-key or --after).",
)
@click.option("--tag", "tags", metavar="TAG", multiple=True, help="A tag (repeat for more).")
@click.option("--at", "at", default=None, help="Run at this ISO 8601 time (with a zone).")
@click.option("--in", "delay", default=None, help="Run after this duration, e.g. 5m.")
@click.option(
    "--queue",
    "queue_name",
    metavar="QUEUE",
    default=None,
    help="The queue of the job.  [default: with --app, the queue the topic's handler "
    "declares; else default]",
)
@click.option(
    "--priority",
    "priority_text",
    metavar="N",
    default="0",
    show_default=True,
    help=f"From {PRIORITY_MIN} to {PRIORITY_MAX}; higher runs first within its queue.",
)
@click.option(
    "--group",
    "group",
    metavar="GROUP",
    default=None,
    help="The job's group, for its topic's group_limit and group_rate_limit (1 to 128 "
    "characters).  [default: none]",
)
@click.option(
    "--after",
    "after",
    metavar="ID",
    multiple=True,
    help="Wait for this job to end done (repeat for more): the job is created waiting "
    "(docs/how-to/workflows.md).",
)
@click.option(
    "--on-upstream-failure",
    type=click.Choice(["cancel", "run"]),
    default="cancel",
    show_default=True,
    help="When a job of --after ends dead or canceled: cancel this one, or run it once "
    "they have all ended.",
)
@click.option(
    "--app",
    "app_spec",
    metavar="MODULE:ATTR",
    default=None,
    help="The application's brooq.Queue, as given to brooq-master: the job goes to the "
    "queue the topic's handler declares (unless --queue), a typed topic's payload is "
    "checked, and a strict_topics Queue refuses a topic no handler declares. Its DSN and "
    "schema apply unless --database and --schema are given.",
)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_context
def enqueue(
    ctx: click.Context,
    topic: str,
    payload: str | None,
    payload_file: str | None,
    key: str | None,
    at: str | None,
    delay: str | None,
    queue_name: str | None,
    priority_text: str,
    unique_key: str | None,
    debounce: str | None,
    ordering_key: str | None,
    tags: tuple[str, ...],
    group: str | None,
    after: tuple[str, ...],
    on_upstream_failure: Literal["cancel", "run"],
    app_spec: str | None,
    as_json: bool,
) -> None:
    """Put one job on the queue. Prints "enqueued ID", or "exists ID" when a job with
    this topic and key is already there (nothing is written then; with --debounce, that
    job took this payload)."""
    if at and delay:
        raise click.UsageError("give --at or --in, not both")
    if payload is not None and payload_file is not None:
        raise click.UsageError("give --payload or --payload-file, not both")
    if ordering_key == "":  # brooq.Job takes "" for none; given here, it is a mistake
        raise click.BadParameter(
            f"an ordering key is 1 to {ORDERING_KEY_MAX_LENGTH} characters, not empty",
            param_hint="--ordering-key",
        )
    if payload_file is not None:
        payload_hint = "--payload-file"
        name = "standard input" if payload_file == "-" else payload_file
        data = _decode_payload(_read_payload_file(payload_file), payload_hint, name)
    else:
        payload_hint = "--payload"
        data = _decode_payload("null" if payload is None else payload, payload_hint)
    priority = _parse_priority(priority_text)
    available_at: datetime | None = None
    if at:
        available_at = _parse_at(at)
    elif delay:
        try:
            seconds = parse_duration_string(delay)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--in") from None
        try:
            available_at = datetime.now(timezone.utc) + timedelta(seconds=seconds)
        except OverflowError:  # past timedelta's 999,999,999 days or datetime's year 9999
            raise click.BadParameter(
                f"{delay} is too large: the job would run after the year 9999", param_hint="--in"
            ) from None
    if debounce is not None:
        try:
            debounce_seconds: float | None = parse_duration_string(debounce)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--debounce") from None
    else:
        debounce_seconds = None
    try:
        job = brooq.Job(
            topic,
            data,
            idempotency_key=key,
            available_at=available_at,
            queue=queue_name,
            priority=priority,
            unique_key=unique_key,
            debounce=debounce_seconds,
            tags=list(tags) or None,
            group=group,
            after=list(after) or None,
            on_upstream_failure=on_upstream_failure if after else "cancel",
            ordering_key=ordering_key,
        )
    except InvalidJob as exc:
        hint = _job_error_hint(exc, payload_hint, "--at" if at else "--in")
        raise click.BadParameter(str(exc), param_hint=hint) from None
    queue = open_queue(ctx) if app_spec is None else _app_queue(ctx, app_spec)
    try:
        job_id, created = queue.enqueue(job)
    except InvalidTopic as exc:  # --app's strict_topics: no handler declares it
        raise click.BadParameter(str(exc), param_hint="TOPIC") from None
    except InvalidPayload as exc:  # larger than max_payload_bytes, or not its handler's type
        raise click.BadParameter(str(exc), param_hint=payload_hint) from None
    except InvalidAfter as exc:  # an id that is no job's
        raise click.BadParameter(str(exc), param_hint="--after") from None
    if as_json:
        emit_json({"id": str(job_id), "created": created})
    else:
        click.echo(f"{'enqueued' if created else 'exists'} {job_id}")
