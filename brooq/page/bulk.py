"""The page process's bulk helper: a bulk retry or cancel (seconds to minutes of batches)
runs in a process of its own, forked by the page process, so that pages are answered
meanwhile.

One at a time: a second bulk action while one runs is answered 503. The helper answers
its client itself and exits. It writes a byte into its pipe before it sends that answer,
so the page process's loop sees the action ended (read_fd) before the client can ask
again (a second bulk action sent as soon as the first was answered met the helper still
exiting, and a 503), and reports it to the master (brooq.opsport.handover: BACKGROUND,
then END); the helper, still sending or exiting then, is reaped later.
The helper closes the page process's socket to the master, so the master sees the page
process's end alone.

Owns: forking the helper, reaping it, killing it when the page process stops. Must
never run in the master (the page process forks it), nor outlive the page process (it
is in the page process's group, which the master kills with it).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass

from brooq.opsport.httpmsg import plain_response

log = logging.getLogger("brooq.pages")


@dataclass
class Helper:
    """A bulk action going on in a process of its own, forked by the page process: it
    answers its client itself; its pipe's end closes when it exits."""

    pid: int
    fd: int
    started: float
    seq: bytes = b""


class Bulk:
    """The page process's one bulk helper, if one runs."""

    def __init__(self) -> None:
        self.master_fd = -1  # the page process's socket to the master: a helper closes it
        self.helper: Helper | None = None
        self.exiting: list[int] = []  # helpers that have answered, not reaped yet

    def start(self, client: socket.socket, work: Callable[[], bytes]) -> bytes | None:
        """Fork a helper that runs ``work`` and sends its answer to ``client``: None; or,
        while another runs, the answer to give at once (503)."""
        self._reap()
        if self.helper is not None:
            running = time.monotonic() - self.helper.started
            return plain_response(
                503,
                f"a bulk action has been running for {running:.0f} s; try again once it "
                "has ended\n".encode(),
            )
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the helper: never returns
            code = 1
            try:
                os.close(r)
                os.close(self.master_fd)  # the master sees the page process's end alone
                response = work()
                with contextlib.suppress(OSError):
                    os.write(w, b".")  # ended, before the client can ask again
                client.sendall(response)
                client.shutdown(socket.SHUT_WR)
                code = 0
            except BaseException:
                log.exception("event=page_bulk_failed")
                with contextlib.suppress(OSError):
                    client.sendall(plain_response(500, b"internal error\n"))
            finally:
                os._exit(code)
        os.close(w)
        self.helper = Helper(pid, r, time.monotonic())
        return None

    def ended(self) -> None:
        """The helper's pipe is readable: it is answering its client (or died); reaped
        now if it has exited, else at a later call."""
        helper, self.helper = self.helper, None
        if helper is not None:
            os.close(helper.fd)
            self.exiting.append(helper.pid)
        self._reap()

    def _reap(self) -> None:
        for pid in list(self.exiting):
            try:
                done, _ = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                done = pid
            if done:
                self.exiting.remove(pid)

    def stop(self) -> None:
        if self.helper is not None:
            self.exiting.append(self.helper.pid)
            os.close(self.helper.fd)
            self.helper = None
        for pid in self.exiting:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)
        self.exiting.clear()
