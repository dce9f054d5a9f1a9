"""The child's side of its two pipes to the master, and its process title.

Owns the control thread ("brooq-control"): it reads the master's "w" (wake: jobs may be
ready) and "lost <id>" (that job's lease is lost: interrupt it if it runs), flushes what
waited in a full pipe, and keeps the process title. Owns the write side too: `tell`
(ready, held, retire; see brooq.ipc.protocol) through _ToMaster, which never blocks.

When the master is gone (its pipe ends or breaks) the child stops: the main thread
writes what it finished and gives back what it did not start, and the process exits
within one renewal period (EXIT_MASTER_GONE), since nobody renews its leases any more.

Must never touch the database, never renew a lease (the master does), and never raise
in the main thread other than through SIGUSR1 for a job whose lease is lost (the signal
handler of brooq.worker.interrupts decides whether a handler is running to receive it).
"""

from __future__ import annotations

import os
import select
import signal
import sys
import threading
import time
import traceback
import uuid
from pathlib import Path
from typing import Any

from setproctitle import setproctitle

from brooq.ipc import protocol
from brooq.ipc.reasons import EXIT_MASTER_GONE
from brooq.settings import Settings
from brooq.worker.config import LONG_JOB, TITLE_TICK
from brooq.worker.state import ChildState


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
        self._told_held: list[uuid.UUID] = []  # what the master was last told we hold
        self._gave_back_at: float | None = None  # the start of the job whose batch went back
        self._main_thread = threading.get_ident()
        os.set_blocking(from_master, True)

    def start(self) -> None:
        threading.Thread(target=self._read_master, name="brooq-control", daemon=True).start()

    def tell(self, message: dict[str, Any], key: str | None = None) -> None:
        if not self._to_master.send(message, key):
            self.state.master_is_gone()

    def tell_held(self, held: list[uuid.UUID]) -> None:
        """Tell the master what we hold (it renews those leases), if that changed."""
        if held != self._told_held:
            self.tell({"held": [str(i) for i in held]})
            self._told_held = list(held)

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
                    elif line == b"drain" and state.aio is not None:
                        state.aio.drain_from_thread()
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
            self._give_back_batchmates()
            aio = state.aio
            if aio is not None:
                aio.watch_loop(time.monotonic())
            self.update_title()

    def _give_back_batchmates(self) -> None:
        """A job running for LONG_JOB gives back the jobs claimed after it in its batch
        now, not when it returns, so that other children run them meanwhile. The child
        decides (the main thread will not run them: see ChildState.tail) and the master
        writes it, on its own connection: this thread never touches the database."""
        tail = self.state.tail
        if tail is None or tail[0] == self._gave_back_at:
            return
        started, batch, after = tail
        if time.monotonic() - started < LONG_JOB:
            return
        self._gave_back_at = started
        ids = [str(c.id) for c in batch[after:]]
        self.tell({"release": ids}, key=f"release {ids[0]}")

    def _on_lost(self, job_id: uuid.UUID) -> None:
        self.state.lost.add(job_id)
        aio = self.state.aio
        if aio is not None:  # an async child: cancel that job's task, never a signal
            aio.lost_from_thread(job_id)
            return
        running = self.state.running
        if running is not None and running.id == job_id:
            signal.pthread_kill(self._main_thread, signal.SIGUSR1)

    def _write_await_chain(self, job_id: uuid.UUID) -> None:
        """The master kills an async child for a job past max_execution_timeout: that job
        is suspended, so the thread stacks show only the loop; write its await chain
        beside them (the master reads both into last_error)."""
        aio = self.state.aio
        if aio is None or not self.stack_file:
            return
        chain = aio.await_chain(job_id)
        if chain:
            with open(self.stack_file + ".await", "w") as f:
                f.write(chain + "\n")

    def _tell_stack(self, job_id: uuid.UUID) -> None:
        """`brooq jobs stack`: the job's current stack, as a traceback, to the master
        (empty when it is not running here any more). A sync job's is the main thread's
        frames, read from this thread (sys._current_frames); an async job's the await
        chain of its task."""
        aio = self.state.aio
        if aio is not None:
            text = aio.stack_text(job_id)
        else:
            running = self.state.running
            text = ""
            if running is not None and running.id == job_id:
                frame = sys._current_frames().get(self._main_thread)
                text = format_frames(traceback.extract_stack(frame)) if frame else ""
        self.tell({"stack": str(job_id), "text": text}, key=f"stack {job_id}")

    def _on_master_gone(self) -> None:
        # Without a master nobody renews our lease: finish within one renewal period or go.
        self.state.master_is_gone()
        self.state.wake(b"x")
        time.sleep(self.settings.renew_period)
        os._exit(EXIT_MASTER_GONE)

    def update_title(self) -> None:
        """The process title shows the running job or idle. The control thread keeps it,
        a few times a second, rather than the main thread twice per job: setting it costs
        about as much as a short job, and a job too short to be seen needs no title."""
        aio = self.state.aio
        claim, started = self.state.running, self.state.started
        if aio is not None:
            count, topics, oldest = aio.counts
            if count:
                per_topic = ", ".join(f"{t} {n}" for t, n in sorted(topics.items()))
                title = (
                    f"brooq-child: async {count}/{aio.capacity} jobs ({per_topic}) "
                    f"oldest {oldest:.1f}s"
                )
            else:
                title = f"brooq-child: async idle 0/{aio.capacity}"
        elif claim is None:
            title = "brooq-child: idle"
        else:
            title = (
                f"brooq-child: {claim.topic} {claim.id} attempt {claim.attempt} "
                f"running {time.monotonic() - started:.0f}s"
            )
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


_WORKER_DIR = str(Path(__file__).resolve().parent)
_WORKER_DIR = str(Path(__file__).resolve().parent)
_BROOQ_DIR = str(Path(__file__).resolve().parent.parent)


def format_frames(frames: traceback.StackSummary) -> str:
    """A stack as Python prints a traceback (most recent call last), from the first frame
    of the application's code under brooq's: the interpreter's start and brooq's own
    loop around the handler are left out (middleware frames stay)."""
    summaries = list(frames)
    first = 0
    for i in range(len(summaries) - 1):  # after the frame brooq's worker calls it from
        here, below = summaries[i].filename, summaries[i + 1].filename
        if here.startswith(_WORKER_DIR) and not below.startswith(_BROOQ_DIR):
            first = i + 1
            break
    lines = "".join(traceback.format_list(summaries[first:]))
    return f"Traceback (most recent call last):\n{lines}".rstrip()
