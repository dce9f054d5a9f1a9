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

from brooq.supervisor.childproc import ChildProc
from brooq.supervisor.settlement import retire_reason

log = logging.getLogger("brooq.master")

# A stack a child sent for `brooq jobs stack`: (worker, job, text), to be written.
StackAnswer = tuple[str, uuid.UUID, str]


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
            known = c.held_text
            c.held_text = {h: known.get(h) or uuid.UUID(h) for h in msg["held"]}
            held = list(c.held_text.values())
            if c.held:  # what it no longer holds, for Renewal (ChildProc.dropped)
                c.dropped.update(set(c.held).difference(held))
            c.held = held
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
