"""The child's side of its two pipes to the master, and its process title.

Owns the control thread ("brooq-control"): it reads the master's "w" (wake: jobs may be
ready) and "lost <id>" (that job's lease is lost: interrupt it if it runs), flushes what
waited in a full pipe, and keeps the process title. Owns the write side too: `tell`
(ready, held, retire; see brooq.ipc.protocol) through _ToMaster, which never blocks.

When the master is gone (its pipe ends or breaks) the child stops: the main thread
writes what it finished and gives back what it did not start, and the process exits
within one renewal period (EXIT_MASTER_GONE), since nobody renews its leases any more.

What the master's words mean for the jobs running is the loop's to say: the control
thread asks whichever loop runs (ChildState.loop) through brooq.worker.control's
protocol, and never looks at which kind it is.

Must never touch the database, never renew a lease (the master does), and never raise
in the main thread itself (a loop told of a lost lease interrupts its job its own way).
"""

from __future__ import annotations

import os
import select
import threading
import time
import uuid
from typing import Any

from setproctitle import setproctitle

from brooq.ipc import protocol
from brooq.ipc.reasons import EXIT_MASTER_GONE
from brooq.producer.ids import uuid_text
from brooq.settings import Settings
from brooq.worker.state import TITLE_TICK, ChildState


class MasterLink:
    def __init__(
        self,
        to_master: int,
        from_master: int,
        settings: Settings,
        state: ChildState,
        stack_file: str = "",
    ):
        self.settings = settings
        self.stack_file = stack_file
        self.state = state
        self.from_master = from_master
        self.title = ""
        self._to_master = _ToMaster(to_master)  # never blocks, see there
        # What the master was last told we hold, the ids' ints (compared in C).
        self._told_held: list[int] = []
        # Their text, by the id's int (hashed in C, a UUID's hash is Python): the next
        # list repeats most of them (an async child's is long), and the job_done lines
        # name them (text_of).
        self._held_text: dict[int, str] = {}
        os.set_blocking(from_master, True)

    def start(self) -> None:
        threading.Thread(target=self._read_master, name="brooq-control", daemon=True).start()

    def tell(self, message: dict[str, Any], key: str | None = None) -> None:
        if not self._to_master.send(message, key):
            self.state.master_is_gone()

    def tell_held(self, held: list[uuid.UUID]) -> None:
        """Tell the master what we hold (it renews those leases), if that changed."""
        ints = [i.int for i in held]
        if ints != self._told_held:
            known = self._held_text
            text = [known.get(n) or uuid_text(n) for n in ints]
            self._held_text = dict(zip(ints, text, strict=True))
            self.tell({"held": text})
            self._told_held = ints

    def text_of(self, job_id: uuid.UUID) -> str:
        """``str(job_id)``, made once for the held list when the job was held."""
        n = job_id.int
        return self._held_text.get(n) or uuid_text(n)

    # -- the control thread ------------------------------------------------------------

    def _read_master(self) -> None:
        reader = protocol.LineReader(self.from_master)
        state = self.state
        while True:
            ready, _, _ = select.select([self.from_master], [], [], TITLE_TICK)
            if ready:
                for line in reader.read():
                    if line == b"w":
                        state.wake(b"w")
                    elif line.startswith(b"lost "):
                        self._on_lost(uuid.UUID(line[5:].decode()))
                    elif line == b"drain" and state.loop is not None:
                        state.loop.on_drain()
                    elif line.startswith(b"stack "):
                        self._write_await_chain(uuid.UUID(line[6:].decode()))
                    elif line.startswith(b"where "):
                        self._tell_stack(uuid.UUID(line[6:].decode()))
                if reader.eof:
                    self._on_master_gone()
                    return
            # What waited for room in a full pipe goes out once the master reads again.
            if not state.master_gone and not self._to_master.flush():
                state.master_is_gone()
                state.wake(b"x")
            loop = state.loop
            if loop is not None:
                now = time.monotonic()
                self._give_back(loop.batchmates_due(now))
                loop.watch(now)
            self.update_title()

    def _give_back(self, ids: list[uuid.UUID]) -> None:
        """A job running for LONG_JOB gives back the jobs claimed after it in its batch
        now, not when it returns, so that other children run them meanwhile. The loop
        decides (it will not run them) and the master writes it, on its own connection:
        this thread never touches the database."""
        if ids:
            text = [str(i) for i in ids]
            self.tell({"release": text}, key=f"release {text[0]}")

    def _on_lost(self, job_id: uuid.UUID) -> None:
        self.state.lost.add(job_id)
        loop = self.state.loop
        if loop is not None:
            loop.on_lost(job_id)

    def _write_await_chain(self, job_id: uuid.UUID) -> None:
        """The master kills a child for a job past max_execution_timeout: a suspended
        job's thread stacks show only the loop; write its await chain beside them (the
        master reads both into last_error)."""
        loop = self.state.loop
        if loop is None or not self.stack_file:
            return
        chain = loop.await_chain(job_id)
        if chain:
            with open(self.stack_file + ".await", "w") as f:
                f.write(chain + "\n")

    def _tell_stack(self, job_id: uuid.UUID) -> None:
        """`brooq jobs stack`: the job's current stack, as a traceback, to the master
        (empty when it is not running here any more)."""
        loop = self.state.loop
        text = loop.stack_text(job_id) if loop is not None else ""
        self.tell({"stack": str(job_id), "text": text}, key=f"stack {job_id}")

    def _on_master_gone(self) -> None:
        # Without a master nobody renews our lease: finish within one renewal period or go.
        self.state.master_is_gone()
        self.state.wake(b"x")
        time.sleep(self.settings.renew_period)
        os._exit(EXIT_MASTER_GONE)

    def update_title(self) -> None:
        """The process title shows the running jobs or idle. The control thread keeps it,
        a few times a second, rather than the main thread twice per job: setting it costs
        about as much as a short job, and a job too short to be seen needs no title."""
        loop = self.state.loop
        title = loop.title() if loop is not None else "brooq-child: idle"
        if title != self.title:
            self.title = title
            setproctitle(title)


class _ToMaster:
    """The child's end of its pipe to the master, written without ever blocking: a master
    that does not read (busy, stopped, frozen) must not stop the child. Most messages are
    a state -- ready, the held list, retire -- so when the pipe is full the latest of each
    kind waits here, replacing an older one of its kind, and goes out on a later send or
    flush (the control thread flushes every TITLE_TICK); a message that is not a state
    (release) comes with a key of its own, so none replaces another. A line partly written is always
    finished first, so the master only ever reads whole lines. The main thread and the
    control thread both write: one lock around the buffer and the write."""

    def __init__(self, fd: int) -> None:
        os.set_blocking(fd, False)
        self.fd = fd
        self.gone = False  # EPIPE: the master is gone
        self._lock = threading.Lock()
        self._partial = b""  # the rest of a line already partly written
        self._pending: dict[str, bytes] = {}  # kind -> its latest line, none of it written

    def send(self, message: dict[str, Any], key: str | None = None) -> bool:
        """Write the message, or keep it for later (replacing a pending one of the same
        key, by default its kind); False once the master is gone."""
        kind = key or next(iter(message))
        with self._lock:
            self._pending[kind] = protocol.encode(message)
            return self._flush()

    def flush(self) -> bool:
        with self._lock:
            return self._flush()

    def _flush(self) -> bool:
        while not self.gone:
            if not self._partial:
                if not self._pending:
                    break
                self._partial = self._pending.pop(next(iter(self._pending)))
            try:
                written = os.write(self.fd, self._partial)
            except BlockingIOError:
                break  # the pipe is full: the rest waits
            except OSError:
                self.gone = True
                break
            self._partial = self._partial[written:]
        return not self.gone
