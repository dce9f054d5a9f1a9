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

from brooq.supervisor.childproc import ChildProc, parse_job_id
from brooq.supervisor.settlement import retire_reason

log = logging.getLogger("brooq.master")

# A stack a child sent for `brooq jobs stack`: (worker, job, text), to be written.
StackAnswer = tuple[str, uuid.UUID, str]


# A held list as a child writes it (brooq.ipc.protocol.encode of canonical ids) is read
# with a few whole-line operations in C, not a parse per id: every hex digit turned into
# "x", the line must be the held form repeated. Any other form is read id by id (and
# refused whole if one is not an id).
_HEX_DIGITS = bytes.maketrans(b"0123456789abcdef", b"x" * 16)
_ID_FORM = b'"xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx",'
_HELD_START, _HELD_END = b'{"held":[', b"]}"


def canonical_held(line: bytes) -> list[str] | None:
    """The ids of a held list in the child's own form (lowercase 8-4-4-4-12 hex digits,
    no spaces), or None when the line is anything else."""
    if not (line.startswith(_HELD_START) and line.endswith(_HELD_END)):
        return None
    body = line[len(_HELD_START) : -len(_HELD_END)]
    if not body:
        return []
    n, extra = divmod(len(body) + 1, len(_ID_FORM))
    if extra or body.translate(_HEX_DIGITS) != (_ID_FORM * n)[:-1]:
        return None
    return body[1:-1].decode("ascii").split('","')


def read_messages(c: ChildProc, now: float) -> list[StackAnswer]:
    """Apply every line the child wrote since the last read; the stacks it sent."""
    stacks: list[StackAnswer] = []
    for line in c.reader.read():
        ids = canonical_held(line)
        if ids is not None:
            _held(c, ids, now)
            continue
        try:
            msg = json.loads(line)
        except ValueError:
            log.warning("event=bad_message pid=%d line=%r", c.pid, line[:100])
            continue
        if "held" in msg:
            try:  # another form than the child's: each id read, the canonical text kept
                ids = [str(parse_job_id(h)) for h in msg["held"]]
            except (TypeError, ValueError, AttributeError):
                log.warning("event=bad_message pid=%d line=%r", c.pid, line[:100])
                continue
            _held(c, ids, now)
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


def _held(c: ChildProc, ids: list[str], now: float) -> None:
    c.hold(ids)
    c.progress_at = now
    if not c.jobs:
        c.stack_requested_at = None  # a stall's stack request is moot now
