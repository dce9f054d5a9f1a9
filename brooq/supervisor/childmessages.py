"""What a child says on its pipe (brooq.ipc.protocol's JSON lines), applied to what the
master knows of it (brooq.supervisor.childproc.ChildProc).

A child says which jobs it holds, whether its claims work, which batchmates it gives
back, the stack it was asked for, that it is ready (with the options of the handlers it
imported), and that it retires. Each message
updates the ChildProc's fields; a stack is returned to the caller, which writes it
(the master's loop, on its maintenance connection).

Owns: reading the lines and what each one means. Must never wait (the pipe is
non-blocking), never write to a child or the database, nor raise on what a child sends
(a line it cannot read is logged and skipped).
"""

from __future__ import annotations

import json
import logging
import uuid

from brooq.producer.ids import uuid_from_int
from brooq.supervisor.childproc import ChildProc
from brooq.supervisor.settlement import retire_reason

log = logging.getLogger("brooq.master")

# A stack a child sent for `brooq jobs stack`: (worker, job, text), to be written.
StackAnswer = tuple[str, uuid.UUID, str]


def parse_job_id(text: str) -> uuid.UUID:
    """``uuid.UUID(text)`` for the canonical text a child sends (8-4-4-4-12 hex digits),
    in half its time: the master reads every job's id of every child's held list once.
    ValueError for anything else."""
    if len(text) != 36 or text[8] != "-" or text[13] != "-" or text[18] != "-" or text[23] != "-":
        raise ValueError(f"not a job id: {text[:40]!r}")
    digits = text.replace("-", "")
    # int() would take more: "_" between digits, signs, spaces, non-ASCII digits.
    if len(digits) != 32 or not (digits.isascii() and digits.isalnum()):
        raise ValueError(f"not a job id: {text[:40]!r}")
    return uuid_from_int(int(digits, 16))


def read_messages(c: ChildProc, now: float) -> list[StackAnswer]:
    """Apply every line the child wrote since the last read; the stacks it sent."""
    stacks: list[StackAnswer] = []
    for line in c.reader.read():
        try:
            msg = json.loads(line)
        except ValueError:
            log.warning("event=bad_message pid=%d line=%r", c.pid, line[:100])
            continue
        if "held" in msg:
            # Each id parsed once, when it first appears; compared by its text and its
            # int, hashed in C (a UUID's hash is Python code).
            known = c.held_text
            try:
                now_held = {h: known.get(h) or parse_job_id(h) for h in msg["held"]}
            except (TypeError, ValueError, AttributeError):
                log.warning("event=bad_message pid=%d line=%r", c.pid, line[:100])
                continue
            if c.held:  # what it no longer holds, for Renewal (ChildProc.dropped)
                ints = {u.int for u in now_held.values()}
                c.dropped.update(u for u in c.held if u.int not in ints)
            c.held_text = now_held
            c.held = list(now_held.values())
            c.progress_at = now
            if not c.jobs:
                c.stack_requested_at = None  # a stall's stack request is moot now
        elif "claims" in msg:
            failing = msg["claims"] != "ok"
            c.claims_failing = str(msg.get("error") or "?")[:200] if failing else None
        elif "release" in msg:
            c.to_release.extend(uuid.UUID(i) for i in msg["release"])
            c.progress_at = now
        elif "stack" in msg:
            # The answer to a `where <id>` (ask_stack): written by the master's loop.
            try:
                job_id = uuid.UUID(str(msg["stack"]))
            except ValueError:
                log.warning("event=bad_message pid=%d line=%r", c.pid, line[:100])
                continue
            stacks.append((c.identity, job_id, str(msg.get("text", ""))))
        elif "ready" in msg:
            c.ready = True
            if isinstance(msg.get("handlers"), dict):
                c.handlers = msg["handlers"]
            c.progress_at = now
        elif "retire" in msg:
            reason = retire_reason(msg["retire"])
            if reason is None:
                log.warning("event=bad_message pid=%d line=%r", c.pid, line[:100])
                continue
            c.retiring = reason
            log.info("event=child_retiring pid=%d reason=%s", c.pid, c.retiring)
    return stacks
