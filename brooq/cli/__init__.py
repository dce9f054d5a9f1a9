"""The `brooq` command: migrations and the operator's reads and writes.

Exit codes: 0 success; 1 refused (unknown id, a transition the job's state does not allow,
database unreachable or schema missing) or an internal error; 2 bad usage (unknown option,
malformed id or value, no database configured). Errors are one line on stderr, never a
traceback.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from datetime import datetime, timedelta, timezone
from typing import Any

import click
import psycopg
from setproctitle import setproctitle

import brooq
from brooq import dsn as dsn_mod
from brooq import migrate as migrate_mod
from brooq.cli import top as top_mod
from brooq.durations import format_age, parse_duration_string
from brooq.errors import (
    BrooqError,
    InvalidDsn,
    InvalidIdempotencyKey,
    InvalidJob,
    InvalidJobId,
    InvalidPayload,
    InvalidSettings,
    InvalidTopic,
    JobNotFound,
)
from brooq.job import MAX_PAYLOAD_DEPTH, JobRecord

# Errors that mean "the command was given something wrong" (exit 2); every other
# BrooqError means "refused" (exit 1).
USAGE_ERRORS = (InvalidDsn, InvalidJob, InvalidJobId, InvalidSettings)

# click >= 8.2 raises this for a group called without a command.
NO_ARGS_IS_HELP = getattr(click.exceptions, "NoArgsIsHelpError", ())

SCREEN_LINES = 24  # `jobs show` fits a classic terminal
SHOW_INLINE_PAYLOAD = 80  # characters of compact JSON shown on the payload line
# `brooq top` sleeps in select(), which refuses a timeout past the platform's time_t.
TOP_MAX_INTERVAL = 86400.0
# --payload-file reads at most this much: a stored payload is far smaller (max_payload_bytes,
# 1 MiB by default), but a file may be indented; /dev/zero must not fill the memory.
PAYLOAD_FILE_MAX_BYTES = 64 * 1024 * 1024

DSN_IN_ARGV_NOTE = (
    " A password given here shows in ps (/proc/PID/cmdline) while Python starts, before "
    "brooq replaces its command line; prefer DATABASE_URL_FILE or the credential."
)


def _hide_database(argv: list[str]) -> str:
    """The command line as ps should show it: the value of --database replaced by ***
    (only what ps shows changes; click parses sys.argv, a copy)."""
    words = ["brooq"]
    hide_next = False
    for word in argv:
        if hide_next:
            word, hide_next = "***", False
        elif word == "--database":
            hide_next = True
        elif word.startswith("--database="):
            word = "--database=***"
        words.append(word)
    return " ".join(words)


def _dsn(ctx: click.Context) -> str:
    return dsn_mod.resolve(ctx.obj.get("database"))


def _queue(ctx: click.Context) -> brooq.Queue:
    # One plain connection first: an unreachable database is reported at once, where the
    # pool would keep retrying until its timeout.
    queue = brooq.Queue(_checked_dsn(ctx), pool_size=1)
    ctx.call_on_close(queue.close)
    return queue


def _emit_json(value: Any) -> None:
    click.echo(json.dumps(value, indent=2, ensure_ascii=False))


def _one_line(text: str) -> str:
    """A message on one line: "invalid settings:\n  - a\n  - b" -> "invalid settings: a; b"."""
    parts = [line.strip().lstrip("- ") for line in str(text).splitlines() if line.strip()]
    if len(parts) < 2:
        return "".join(parts)
    return parts[0] + (" " if parts[0].endswith(":") else "; ") + "; ".join(parts[1:])


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(brooq.__version__, prog_name="brooq")
@click.option(
    "--database",
    metavar="DSN",
    help="PostgreSQL connection string (default: DATABASE_URL, DATABASE_URL_FILE "
    "or the systemd credential database-url)." + DSN_IN_ARGV_NOTE,
)
@click.pass_context
def cli(ctx: click.Context, database: str | None) -> None:
    """brooq: a PostgreSQL job queue. Operator commands."""
    ctx.ensure_object(dict)
    ctx.obj["database"] = database


# -- migrations ----------------------------------------------------------------------------


@cli.group()
def migrate() -> None:
    """Apply or revert the schema (a deployment step, never done at start-up)."""


@migrate.command("up")
@click.option("--to", "target", type=int, help="Stop at this version.")
@click.pass_context
def migrate_up(ctx: click.Context, target: int | None) -> None:
    """Apply every migration not yet applied."""
    applied = migrate_mod.up(_checked_dsn(ctx), target)
    for m in applied:
        click.echo(f"applied {m.version:04d}_{m.name}")
    if not applied:
        click.echo("nothing to apply: the schema is up to date")


@migrate.command("down")
@click.option("--steps", default=1, show_default=True, type=click.IntRange(min=1))
@click.pass_context
def migrate_down(ctx: click.Context, steps: int) -> None:
    """Revert the last applied migration (or --steps of them)."""
    undone = migrate_mod.down(_checked_dsn(ctx), steps)
    for m in undone:
        click.echo(f"reverted {m.version:04d}_{m.name}")
    if not undone:
        click.echo("nothing to revert")


@migrate.command("status")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_context
def migrate_status(ctx: click.Context, as_json: bool) -> None:
    """Show which migrations are applied."""
    statuses = migrate_mod.status(_checked_dsn(ctx))
    if as_json:
        _emit_json(
            [
                {
                    "version": s.version,
                    "name": s.name,
                    "applied_at": s.applied_at.isoformat() if s.applied_at else None,
                }
                for s in statuses
            ]
        )
        return
    for s in statuses:
        when = s.applied_at.isoformat(timespec="seconds") if s.applied_at else "pending"
        click.echo(f"{s.version:04d}_{s.name:<30} {when}")


@migrate.command("sql")
@click.argument("direction", type=click.Choice(["up", "down"]), default="up")
def migrate_sql(direction: str) -> None:
    """Print the migrations' SQL, for teams that apply schema with their own tool."""
    click.echo(migrate_mod.script(direction), nl=False)


def _checked_dsn(ctx: click.Context) -> str:
    dsn = _dsn(ctx)
    from brooq.db import connect

    connect(dsn).close()  # a readable error now rather than a traceback later
    return dsn


# -- reads ---------------------------------------------------------------------------------


def _utc(moment: datetime) -> str:
    return moment.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def _when(moment: datetime, now: datetime) -> str:
    """An instant with how far it is from now: "2030-01-31 09:00:00 UTC (in 5.0m)"."""
    delta = (moment - now).total_seconds()
    relative = f"in {format_age(delta)}" if delta > 0 else f"{format_age(delta)} ago"
    return f"{_utc(moment)} ({relative})"


def _table(headers: list[str], rows: list[list[str]], right: set[int]) -> list[str]:
    """Columns as wide as their widest cell; the ``right`` ones (numbers) right-aligned."""
    widths = [max(len(c) for c in column) for column in zip(headers, *rows, strict=True)]
    return [
        "  ".join(
            cell.rjust(width) if i in right else cell.ljust(width)
            for i, (cell, width) in enumerate(zip(row, widths, strict=True))
        ).rstrip()
        for row in [headers, *rows]
    ]


def stats_lines(rows: list[brooq.TopicStats]) -> list[str]:
    """`brooq stats` as text (one row per topic, a total row when there are several)."""
    if not rows:
        return ["(no pending, processing, failed or dead jobs)"]
    headers = ["TOPIC", "PENDING", "READY", "FAILED", "PROCESSING", "BUSY", "DEAD", "OLDEST READY"]

    def cells(name: str, r: brooq.TopicStats) -> list[str]:
        numbers = (r.pending, r.ready, r.failed, r.processing, r.busy, r.dead)
        return [name, *map(str, numbers), format_age(r.oldest_ready_age) if r.ready else "-"]

    body = [cells(r.topic, r) for r in rows]
    if len(rows) > 1:
        total = brooq.TopicStats(
            topic="(total)",
            pending=sum(r.pending for r in rows),
            ready=sum(r.ready for r in rows),
            failed=sum(r.failed for r in rows),
            processing=sum(r.processing for r in rows),
            busy=sum(r.busy for r in rows),
            dead=sum(r.dead for r in rows),
            oldest_ready_age=max(r.oldest_ready_age for r in rows),
        )
        body.append(cells(total.topic, total))
    return _table(headers, body, right={1, 2, 3, 4, 5, 6})


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_context
def stats(ctx: click.Context, as_json: bool) -> None:
    """Jobs per topic and state, busy children, oldest ready age.

    Per topic: pending, ready (due now), failed (waiting for a retry), processing, busy
    (processing under a live lease: a child working on it), dead, and the age of the
    oldest ready job."""
    rows = _queue(ctx).stats()
    if as_json:
        _emit_json({"topics": [r.to_dict() for r in rows]})
        return
    for line in stats_lines(rows):
        click.echo(line)


@cli.group()
def jobs() -> None:
    """List jobs or show one."""


def _last_line(text: str | None, width: int = 60) -> str:
    lines = [line.strip() for line in (text or "").splitlines() if line.strip()]
    if not lines:
        return ""
    last = lines[-1]
    return last if len(last) <= width else last[: width - 1] + "…"


@jobs.command("list")
@click.option("--topic", help="Only this topic.")
@click.option("--state", type=click.Choice(brooq.job.STATES), help="Only this state.")
@click.option(
    "--limit",
    default=100,
    show_default=True,
    type=int,
    help=f"How many, newest first; at most {brooq.queue.LIST_LIMIT_MAX}.",
)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_context
def jobs_list(
    ctx: click.Context, topic: str | None, state: str | None, limit: int, as_json: bool
) -> None:
    """Jobs, newest first (by creation time)."""
    if not 1 <= limit <= brooq.queue.LIST_LIMIT_MAX:
        raise click.BadParameter(
            f"{limit} is out of range: a listing holds 1 to {brooq.queue.LIST_LIMIT_MAX} "
            "jobs; narrow it with --topic or --state",
            param_hint="--limit",
        )
    records = _queue(ctx).list_jobs(topic=topic, state=state, limit=limit)
    if as_json:
        _emit_json({"jobs": [r.to_dict() for r in records]})
        return
    if not records:
        click.echo("(no jobs)")
        return
    rows = [
        [
            str(r.id),
            r.topic,
            r.state,
            str(r.attempts),
            _utc(r.created_at),
            _last_line(r.last_error),
        ]
        for r in records
    ]
    headers = ["ID", "TOPIC", "STATE", "ATTEMPTS", "CREATED", "LAST ERROR"]
    for line in _table(headers, rows, right={3}):
        click.echo(line)


def _clip(lines: list[str], room: int, *, tail: bool, job_id: object) -> list[str]:
    """At most ``room`` lines: the first ones (or the last ones) and a note on the rest."""
    if len(lines) <= room:
        return lines
    keep = max(room - 1, 1)
    note = f"… {len(lines) - keep} more lines: brooq jobs show {job_id} --json"
    return [note, *lines[-keep:]] if tail else [*lines[:keep], note]


def show_lines(record: JobRecord, now: datetime) -> list[str]:
    """`brooq jobs show` as text: the job's fate on one screen. A long error keeps its
    last lines (where a traceback names the exception), a long payload its first ones."""
    fields: list[tuple[str, str]] = [
        ("id", str(record.id)),
        ("topic", record.topic),
        ("state", record.state),
        ("attempts", str(record.attempts)),
        ("idempotency key", record.idempotency_key or "-"),
        ("created", _when(record.created_at, now)),
        ("updated", _when(record.updated_at, now)),
        ("available at", _when(record.available_at, now)),
    ]
    if record.state == "processing" and record.locked_until is not None:
        left = (record.locked_until - now).total_seconds()
        lease = _when(record.locked_until, now)
        if left <= 0:
            lease += ", expired: the reaper will make the job pending again"
        fields += [("holder", record.locked_by or "-"), ("lease until", lease)]
    elif record.locked_by:
        fields += [("holder", f"- (last held by {record.locked_by})"), ("lease until", "-")]
    else:
        fields += [("holder", "-"), ("lease until", "-")]
    lines = [f"{name + ':':<16} {value}" for name, value in fields]

    error = (record.last_error or "-").rstrip().splitlines() or ["-"]
    payload = [json.dumps(record.payload, ensure_ascii=False)]
    if len(payload[0]) > SHOW_INLINE_PAYLOAD:
        payload = json.dumps(record.payload, indent=2, ensure_ascii=False).splitlines()
    # What does not fit on its field's line shares the rest of the screen.
    room = SCREEN_LINES - len(lines) - 2
    error_needs, payload_needs = (0 if len(b) == 1 else len(b) for b in (error, payload))
    payload_room = min(payload_needs, max(room - error_needs, room // 2))
    for name, body, body_room, tail in (
        ("last error", error, room - payload_room, True),
        ("payload", payload, payload_room, False),
    ):
        if len(body) == 1:
            lines.append(f"{name + ':':<16} {body[0]}")
        else:
            lines.append(name + ":")
            lines += ["  " + b for b in _clip(body, body_room, tail=tail, job_id=record.id)]
    return lines


@jobs.command("show")
@click.argument("job_id")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_context
def jobs_show(ctx: click.Context, job_id: str, as_json: bool) -> None:
    """A job's fate on one screen: state, attempts, times, holder and lease, last error,
    payload."""
    jid = brooq.job.parse_job_id(job_id)
    record = _queue(ctx).get(jid)
    if record is None:
        raise JobNotFound(f"no job with id {jid}")
    if as_json:
        _emit_json(record.to_dict())
        return
    for line in show_lines(record, datetime.now(timezone.utc)):
        click.echo(line)


@cli.command()
@click.option("--once", is_flag=True, help="Print one frame and exit.")
@click.option(
    "--interval",
    default="1s",
    show_default=True,
    help="Time between refreshes, with a unit (500ms, 2s).",
)
@click.option("--json", "as_json", is_flag=True, help="One snapshot as JSON (implies --once).")
@click.pass_context
def top(ctx: click.Context, once: bool, interval: str, as_json: bool) -> None:
    """A live view of the queue, refreshed every second.

    Per topic: ready, processing, busy, failed, dead, jobs finished in the last minute and
    the oldest ready age; then the jobs in flight with their holders. q or Ctrl-C quits."""
    try:
        period = parse_duration_string(interval)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--interval") from None
    if period < top_mod.MIN_INTERVAL:
        raise click.BadParameter(
            f"{interval} is too short; the least is {top_mod.MIN_INTERVAL * 1000:g}ms",
            param_hint="--interval",
        )
    if period > TOP_MAX_INTERVAL:
        raise click.BadParameter(f"{interval} is too long; the most is 1d", param_hint="--interval")
    dsn = _dsn(ctx)
    queue = _queue(ctx)

    def take() -> top_mod.Snapshot:
        return top_mod.take(queue, dsn_mod.describe(dsn))

    if as_json:
        _emit_json(take().to_dict())
    elif once:
        for line in top_mod.render(take()):
            click.echo(line)
    elif not sys.stdout.isatty():
        raise click.UsageError("brooq top draws on a terminal; use --once or --json for one frame")
    else:
        top_mod.run(take, interval=period)


# -- writes --------------------------------------------------------------------------------


@cli.command()
@click.argument("job_id")
@click.pass_context
def cancel(ctx: click.Context, job_id: str) -> None:
    """Cancel a job: pending, failed or processing -> canceled. A running handler gets
    brooq.LeaseLost at the next lease renewal."""
    jid = brooq.job.parse_job_id(job_id)
    queue = _queue(ctx)
    if not queue.cancel(jid):
        raise queue.explain_refusal(jid, "cancel")
    click.echo(f"canceled {jid}")


@cli.command()
@click.argument("job_id")
@click.pass_context
def retry(ctx: click.Context, job_id: str) -> None:
    """Run a finished job again: dead or canceled -> pending now, attempts reset, last
    error kept."""
    jid = brooq.job.parse_job_id(job_id)
    queue = _queue(ctx)
    if not queue.retry(jid):
        raise queue.explain_refusal(jid, "retry")
    click.echo(f"retried {jid}: pending now, attempts reset")


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
    return time_hint  # available_at out of range


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
@click.option("--at", "at", default=None, help="Run at this ISO 8601 time (with a zone).")
@click.option("--in", "delay", default=None, help="Run after this duration, e.g. 5m.")
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
    as_json: bool,
) -> None:
    """Put one job on the queue. Prints "enqueued ID", or "exists ID" when a job with
    this topic and key is already there (nothing is written then)."""
    if at and delay:
        raise click.UsageError("give --at or --in, not both")
    if payload is not None and payload_file is not None:
        raise click.UsageError("give --payload or --payload-file, not both")
    if payload_file is not None:
        payload_hint = "--payload-file"
        name = "standard input" if payload_file == "-" else payload_file
        data = _decode_payload(_read_payload_file(payload_file), payload_hint, name)
    else:
        payload_hint = "--payload"
        data = _decode_payload("null" if payload is None else payload, payload_hint)
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
    try:
        job = brooq.Job(topic, data, idempotency_key=key, available_at=available_at)
    except InvalidJob as exc:
        hint = _job_error_hint(exc, payload_hint, "--at" if at else "--in")
        raise click.BadParameter(str(exc), param_hint=hint) from None
    queue = _queue(ctx)
    try:
        job_id, created = queue.enqueue(job)
    except InvalidPayload as exc:  # larger than max_payload_bytes
        raise click.BadParameter(str(exc), param_hint=payload_hint) from None
    if as_json:
        _emit_json({"id": str(job_id), "created": created})
    else:
        click.echo(f"{'enqueued' if created else 'exists'} {job_id}")


def _fail(message: str, code: int) -> None:
    click.echo(f"error: {_one_line(message)}", err=True)
    sys.exit(code)


def main() -> None:
    """Entry point: every error becomes one line on stderr and the documented exit code."""
    # The pool logs each failed reconnection; the command reports the error itself, once
    # (and `brooq top` must not have log lines written over its screen).
    pool_log = logging.getLogger("psycopg.pool")
    pool_log.addHandler(logging.NullHandler())
    pool_log.propagate = False
    # A DSN with its password in the arguments is readable by every local user in
    # /proc/PID/cmdline; a command such as `brooq top` can run for hours.
    if any(arg.startswith("--database") for arg in sys.argv[1:]):
        setproctitle(_hide_database(sys.argv[1:]))
    try:
        code = cli.main(prog_name="brooq", standalone_mode=False)
    except NO_ARGS_IS_HELP as exc:  # `brooq` or `brooq jobs` alone: the help, as click does
        exc.show()
        sys.exit(2)
    except click.UsageError as exc:
        hint = f" (see: {exc.ctx.command_path} --help)" if exc.ctx is not None else ""
        _fail(exc.format_message() + hint, 2)
    except click.ClickException as exc:
        _fail(exc.format_message(), exc.exit_code)
    except click.Abort:  # Ctrl-C at a prompt or while waiting on the database
        sys.exit(130)
    except USAGE_ERRORS as exc:
        _fail(str(exc), 2)
    except BrooqError as exc:
        _fail(str(exc), 1)
    except psycopg.Error as exc:
        _fail(f"database error: {exc}", 1)
    except BrokenPipeError:
        # The reader went away (brooq jobs list | head): stop quietly.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(1)
    except Exception as exc:
        # A last resort: bad input is refused above with exit 2; anything arriving here is
        # a defect of brooq, still reported as one line (and exit 1), never a traceback.
        _fail(f"internal error: {type(exc).__name__}: {exc}", 1)
    sys.exit(code if isinstance(code, int) else 0)
