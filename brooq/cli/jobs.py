"""`brooq jobs list|show|logs|stack`: one job's fate or kept logs, or a listing of jobs,
read; the `jobs` group, on which brooq.cli.cancel_retry registers the writes too.

Owns: the `jobs` group, those commands, the listing's table and ``show_lines``, the
one-screen view of a job (a pure function of the record and the time).
`list`, `show` and `logs` read on the read target when one is set (brooq.cli.common.open_reads);
`stack` asks through the database itself (its request is a write).
Must never: write a job (brooq.cli.cancel_retry does, through Queue).
"""

from __future__ import annotations

import contextlib
import json
from datetime import datetime, timezone
from typing import Any

import click

import brooq
from brooq.cli.common import cli, emit_json, open_queue, open_reads, standby_note, table, utc
from brooq.cli.terminal import say, say_lines
from brooq.durations import format_age, parse_duration_string
from brooq.errors import JobNotFound
from brooq.ipc import progress
from brooq.job import JobRecord
from brooq.job_options import check_tag
from brooq.operator import reads as operator_reads
from brooq.operator.reads import LIST_LIMIT_MAX
from brooq.sql import queries

SCREEN_LINES = 24  # `jobs show` fits a classic terminal
SHOW_INLINE_PAYLOAD = 80  # characters of compact JSON shown on the payload (result) line
HISTORY_ERROR_WIDTH = 80  # characters of an error's first line in the history
TRACEBACK_HEAD = 2  # lines a clipped traceback keeps from its start (the handler's frame)


def _when(moment: datetime, now: datetime) -> str:
    """An instant with how far it is from now: "2030-01-31 09:00:00 UTC (in 5.0m)"."""
    delta = (moment - now).total_seconds()
    relative = f"in {format_age(delta)}" if delta > 0 else f"{format_age(delta)} ago"
    return f"{utc(moment)} ({relative})"


@cli.group()
def jobs() -> None:
    """List jobs, show one, cancel, retry, hold or release one or many."""


def _last_line(text: str | None, width: int = 60) -> str:
    lines = [line.strip() for line in (text or "").splitlines() if line.strip()]
    if not lines:
        return ""
    last = lines[-1]
    return last if len(last) <= width else last[: width - 1] + "…"


@jobs.command("list")
@click.option("--topic", help="Only this topic.")
@click.option("--queue", "queue_name", metavar="QUEUE", help="Only this queue.")
@click.option("--state", type=click.Choice(brooq.job.STATES), help="Only this state.")
@click.option("--tag", metavar="TAG", help="Only the jobs carrying this tag.")
@click.option(
    "--limit",
    default=100,
    show_default=True,
    type=int,
    help=f"How many, newest first; at most {LIST_LIMIT_MAX}.",
)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_context
def jobs_list(
    ctx: click.Context,
    topic: str | None,
    queue_name: str | None,
    state: str | None,
    tag: str | None,
    limit: int,
    as_json: bool,
) -> None:
    """Jobs, newest first (by creation time). A TAGS column is shown when a job listed
    has tags."""
    if not 1 <= limit <= LIST_LIMIT_MAX:
        raise click.BadParameter(
            f"{limit} is out of range: a listing holds 1 to {LIST_LIMIT_MAX} "
            "jobs; narrow it with --topic, --queue or --state",
            param_hint="--limit",
        )
    if queue_name is not None:
        try:
            brooq.job.validate_queue(queue_name)
        except brooq.InvalidQueue as exc:
            raise click.BadParameter(str(exc), param_hint="--queue") from None
    if tag is not None:
        try:
            check_tag(tag, "--tag")
        except brooq.InvalidTags as exc:
            raise click.BadParameter(str(exc), param_hint="--tag") from None
    records = open_reads(ctx).list_jobs(
        topic=topic, state=state, limit=limit, queue=queue_name, tag=tag
    )
    if as_json:
        emit_json({"jobs": [r.to_dict() for r in records]})
        return
    if not records:
        say("(no jobs)")
        return
    rows = [
        [
            str(r.id),
            r.topic,
            r.queue,
            str(r.priority),
            r.state,
            str(r.attempts),
            utc(r.created_at),
            _last_line(r.last_error),
        ]
        for r in records
    ]
    headers = ["ID", "TOPIC", "QUEUE", "PRIORITY", "STATE", "ATTEMPTS", "CREATED", "LAST ERROR"]
    if any(r.tags for r in records):
        headers.insert(7, "TAGS")
        for row, r in zip(rows, records, strict=True):
            row.insert(7, ",".join(r.tags) or "-")
    say_lines(table(headers, rows, right={3, 5}))


def _clip(lines: list[str], room: int, *, tail: bool, job_id: object, head: int = 0) -> list[str]:
    """At most ``room`` lines: the first ones (or the last ones) and a note on the rest;
    with ``tail`` and ``head``, the first ``head`` lines stay too while there is room for
    them and a few of the last (a traceback: where the handler started, then where it
    failed)."""
    if len(lines) <= room:
        return lines
    keep = max(room - 1, 1)
    note = f"… {len(lines) - keep} more lines: brooq jobs show {job_id} --json"
    if tail and head and keep - head >= 3:
        return [*lines[:head], note, *lines[-(keep - head) :]]
    return [note, *lines[-keep:]] if tail else [*lines[:keep], note]


def show_lines(record: JobRecord, now: datetime) -> list[str]:
    """`brooq jobs show` as text: the job's fate on one screen. A long error keeps its
    last lines (where a traceback names the exception), a long error history its newest
    entries, a long payload or result its first lines."""
    fields: list[tuple[str, str]] = [
        ("id", str(record.id)),
        ("topic", record.topic),
        ("queue", f"{record.queue}, priority {record.priority}"),
        ("state", record.state),
        ("attempts", str(record.attempts)),
        ("idempotency key", record.idempotency_key or "-"),
        ("created", _when(record.created_at, now)),
        ("updated", _when(record.updated_at, now)),
        ("available at", _when(record.available_at, now)),
    ]
    # A job's options take lines only when it has them (a plain job's screen is unchanged).
    if record.unique_key is not None:
        fields.insert(6, ("unique key", record.unique_key))
    if record.start_after is not None:
        waits = f"the active job of its key, then from {_when(record.start_after, now)}"
        fields[-1] = ("available at", waits)
    if record.state in ("done", "dead", "canceled"):
        fields.pop()  # a finished job is claimable at no time: "available at" would mislead
    elif record.state == brooq.job.ON_HOLD:  # its time holds its place in line, no more
        fields[-1] = (
            "available at",
            f"when released, in line from {_when(record.available_at, now)}",
        )
    if record.tags:
        fields.insert(6, ("tags", ", ".join(record.tags)))
    if record.group is not None:  # a line only for a job that has one
        fields.insert(6, ("group", record.group))
    if record.ordering_key is not None:  # its key's jobs start one at a time, in order
        waits = ", behind an earlier job of its key" if record.state == "waiting" else ""
        fields.insert(6, ("ordering key", record.ordering_key + waits))
    if record.started_at is not None:  # the last claim; a job never claimed has none
        at = [name for name, _ in fields].index("updated")
        fields.insert(at, ("started", _when(record.started_at, now)))
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
    # claim.progress(): the running attempt's last report, or the last attempt's, frozen
    # with its outcome (a job that ended keeps it; a new claim starts with none).
    if record.progress is not None:
        fields.append(("progress", progress.text(record.progress, record.progress_message)))
    lines = [f"{name + ':':<16} {value}" for name, value in fields]

    error = (record.last_error or "-").rstrip().splitlines() or ["-"]
    # A result is never JSON null: a handler returning None stores nothing (SQL NULL).
    result = ["-"] if record.result is None else _json_lines(record.result)
    payload = _json_lines(record.payload)
    history = [_history_line(entry) for entry in record.errors]
    kept = _latest_traceback(record.errors)
    if kept is not None:  # the traceback has its block: the last error's first line here
        error = error[:1]
    blocks = [
        # name, body, on its name's line, keep the end when clipped (a traceback names the
        # exception last; the newest failures are the last entries)
        ("result", result, len(result) == 1, False),
        (f"errors ({len(history)}, oldest first)", history, False, True)
        if history
        else ("errors", ["-"], True, True),
        ("last error", error, len(error) == 1, True),
    ]
    if kept is not None:
        blocks.append((kept[0], kept[1], False, True))
    blocks.append(("payload", payload, len(payload) == 1, False))
    # What does not fit on its field's line shares the rest of the screen.
    room = SCREEN_LINES - len(lines) - len(blocks)
    needs = [0 if inline else len(body) for _, body, inline, _ in blocks]
    for (name, body, inline, tail), body_room in zip(blocks, _share(needs, room), strict=True):
        if inline:
            lines.append(f"{name + ':':<16} {body[0]}")
        else:
            lines.append(name + ":")
            if name.startswith("traceback") and len(body) > body_room:
                # Its frames and exception first: the source lines and carets go.
                body = [ln for ln in body if not ln.startswith("    ")]
                keep = TRACEBACK_HEAD
            else:
                keep = 0
            lines += [
                "  " + b for b in _clip(body, body_room, tail=tail, job_id=record.id, head=keep)
            ]
    return lines


def _latest_traceback(errors: list[dict[str, Any]]) -> tuple[str, list[str]] | None:
    """The newest entry's traceback kept in the error history: its block's name
    ("traceback (attempt 3, raised)") and lines; None when no entry keeps one."""
    for entry in reversed(errors):
        text = entry.get("traceback") if isinstance(entry, dict) else None
        if isinstance(text, str) and text.strip():
            kind = entry.get("kind")
            what = f", {kind}" if isinstance(kind, str) else ""
            return f"traceback (attempt {entry.get('attempt', '?')}{what})", text.splitlines()
    return None


def _json_lines(value: object) -> list[str]:
    """Compact JSON on one line when short, else indented over several."""
    text = json.dumps(value, ensure_ascii=False)
    if len(text) <= SHOW_INLINE_PAYLOAD:
        return [text]
    return json.dumps(value, indent=2, ensure_ascii=False).splitlines()


def _history_line(entry: dict[str, Any]) -> str:
    """One error history entry: "attempt 2  2026-12-01 10:00:00 UTC  host:1/child-1
    ValueError: ..." (the error's first line)."""
    at = str(entry.get("at") or "-")
    with contextlib.suppress(ValueError):
        at = utc(_parse_at(at))
    first = next(
        (ln.strip() for ln in str(entry.get("error") or "").splitlines() if ln.strip()), ""
    )
    if len(first) > HISTORY_ERROR_WIDTH:
        first = first[: HISTORY_ERROR_WIDTH - 1] + "…"
    return f"attempt {entry.get('attempt', '?')}  {at}  {entry.get('worker') or '-'}  {first}"


def _parse_at(text: str) -> datetime:
    """The ISO text jsonb writes for a timestamptz ("2026-12-01T10:00:00.1234+00:00");
    Python 3.10's fromisoformat takes only 3 or 6 digits of fraction."""
    head, dot, rest = text.partition(".")
    if dot:
        digits = len(rest) - len(rest.lstrip("0123456789"))
        text = f"{head}.{rest[:digits][:6].ljust(6, '0')}{rest[digits:]}"
    return datetime.fromisoformat(text)


def _share(needs: list[int], room: int) -> list[int]:
    """Lines for each block beyond its header: ``room`` split evenly among the blocks
    that need more, what one does not use going to the others (the earlier ones first)."""
    given = [0] * len(needs)
    left = max(room, 0)
    while left > 0:
        wanting = [i for i, need in enumerate(needs) if given[i] < need]
        if not wanting:
            break
        each = max(left // len(wanting), 1)
        for i in wanting:
            add = min(each, needs[i] - given[i], left)
            given[i] += add
            left -= add
    return given


GRAPH_LIMIT = 100  # the downstream jobs (and children) `jobs show` lists
STEPS_SHOWN = 50  # the newest recorded steps `jobs show` lists (--json: all)


@jobs.command("show")
@click.argument("job_id")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_context
def jobs_show(ctx: click.Context, job_id: str, as_json: bool) -> None:
    """A job's fate on one screen: state, attempts, times, holder and lease, result,
    error history (attempt, time, worker, first line of each error), last error, the
    newest traceback kept (the handler's first frame and the innermost ones when it is
    long), payload; for a job of a workflow, the jobs it waits for and those waiting on
    it, with their states. --json: every field whole, the error history with its
    tracebacks (``errors``)."""
    jid = brooq.job.parse_job_id(job_id)
    reads = open_reads(ctx)
    record = reads.get(jid)
    if record is None:  # on a standby behind its primary: not there yet, maybe
        raise JobNotFound(f"no job with id {jid}{standby_note(ctx, reads)}")
    # A job of a graph (docs/how-to/workflows.md): what it waits for and what waits on it.
    graph = {"upstream": reads.upstream(jid), "downstream": reads.downstream(jid, GRAPH_LIMIT)}
    # A durable handler's job (brooq.worker.durable): its steps, park and children.
    with reads.connection() as conn:
        q = queries(reads.schema)
        side = operator_reads.durable(conn, jid, q=q)
        graph["children"] = operator_reads.children(conn, jid, GRAPH_LIMIT, q=q)
    if as_json:
        out = record.to_dict()
        for name, jobs in graph.items():
            if jobs:
                out[name] = [{"id": str(j.id), "topic": j.topic, "state": j.state} for j in jobs]
        if side is not None and (side["steps"] or side["parked"]):
            out["steps"] = [
                {"name": s["name"], "at": s["at"].isoformat(), "size": s["size"]}
                for s in side["steps"]
            ]
            out["parked"] = side["parked"]
            out["parked_until"] = None if side["until"] is None else side["until"].isoformat()
            out["waits_for_event"] = side["event"]
        emit_json(out)
        return
    now = datetime.now(timezone.utc)
    say_lines(show_lines(record, now))
    if side is not None:
        say_lines(durable_lines(side, now))
    for name, jobs in graph.items():
        if jobs:
            more = " (the first 100)" if len(jobs) == GRAPH_LIMIT else ""
            say(f"{name}{more}:")
            for j in jobs:
                say_lines([f"  {j.id}  {j.state:<10} {j.topic}"])


def durable_lines(side: dict[str, Any], now: datetime) -> list[str]:
    """A durable handler's job: what it sleeps until or waits for, and its recorded
    steps (name, when, size); nothing for a job that used none of it."""
    lines = []
    parked, until = side["parked"], side["until"]
    if parked == "sleep" and until is not None:
        lines.append(f"{'sleeps until:':<16} {_when(until, now)}")
    elif parked == "event":
        deadline = "" if until is None else f", until {_when(until, now)}"
        lines.append(f"{'waits for:':<16} event {side['event']!r}{deadline}")
    elif parked == "jobs":
        lines.append(f"{'waits for:':<16} its child jobs")
    if side["steps"]:
        lines.append(f"steps ({len(side['steps'])}, oldest first):")
        lines += [
            f"  {s['name']}  {utc(s['at'])}  {s['size']} B" for s in side["steps"][-STEPS_SHOWN:]
        ]
    return lines


@jobs.command("logs")
@click.argument("job_id")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_context
def jobs_logs(ctx: click.Context, job_id: str, as_json: bool) -> None:
    """The log records a keep_logs handler emitted while it ran job ID, per attempt
    (the last 20 attempts), oldest first. --json: a list of {attempt, at, text}."""
    jid = brooq.job.parse_job_id(job_id)
    reads = open_reads(ctx)
    try:
        kept = reads.logs(jid)
    except JobNotFound as exc:  # on a standby behind its primary: not there yet, maybe
        raise JobNotFound(f"{exc}{standby_note(ctx, reads)}") from None
    if as_json:
        emit_json([entry.to_dict() for entry in kept])
        return
    if not kept:
        note = standby_note(ctx, reads)
        say(f"(no logs kept for job {jid}: its handler keeps none, or no attempt logged{note})")
        return
    for i, entry in enumerate(kept):
        if i:
            say("")
        say(f"== attempt {entry.attempt}, ended {utc(entry.at)}")
        say(entry.text)


MAX_STACK_TIMEOUT = 60.0


@jobs.command("stack")
@click.argument("job_id")
@click.option(
    "--timeout",
    default="5s",
    show_default=True,
    metavar="DURATION",
    help="How long to wait for the master running the job to answer.",
)
@click.pass_context
def jobs_stack(ctx: click.Context, job_id: str, timeout: str) -> None:
    """The current Python stack of the handler running job ID, as a traceback (most
    recent call last). The job may run on any host: the request and the answer travel
    through PostgreSQL. Exit 1 if the job is not running or no master answered."""
    jid = brooq.job.parse_job_id(job_id)
    try:
        seconds = parse_duration_string(timeout)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--timeout") from None
    if not 0 < seconds <= MAX_STACK_TIMEOUT:
        raise click.BadParameter(
            f"{timeout} is out of range: more than 0s, at most {MAX_STACK_TIMEOUT:g}s",
            param_hint="--timeout",
        )
    answer = open_queue(ctx).stack(jid, timeout=seconds)
    say(answer.text)
    say(f"(job {jid}, worker {answer.worker})", err=True)
