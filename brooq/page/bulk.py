"""The page process's bulk helper: a bulk retry or cancel (seconds to minutes of batches)
runs in a process of its own, forked by the page process, so that pages are answered
meanwhile.

One at a time: a second bulk action while one runs is answered 503. The helper answers
its client itself and exits. It writes a byte into its pipe before it sends that answer,
so the page process's loop sees the action ended (read_fd) before the client can ask
again (else a second bulk action sent as soon as the first is answered could meet the
helper still exiting, and a 503), and reports it to the master (brooq.opsport.handover: BACKGROUND,
then END); the helper, still sending or exiting then, is reaped when its pipe ends.
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
        self.exiting: list[Helper] = []  # helpers that have answered, not exited yet

    def start(self, client: socket.socket, work: Callable[[], bytes]) -> bytes | None:
        """Fork a helper that runs ``work`` and sends its answer to ``client``: None; or,
        while another runs, the answer to give at once (503)."""
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
        os.set_blocking(r, False)  # the loop reads its byte and its end without waiting
        self.helper = Helper(pid, r, time.monotonic())
        return None

    def ended(self) -> None:
        """The helper's pipe is readable: it is answering its client, or has gone. Kept
        among the exiting, its pipe watched until the end (``reap``), unless gone."""
        helper, self.helper = self.helper, None
        if helper is None:
            return
        if _read(helper.fd) == b"":  # the end of the pipe: it has exited (or died)
            _collect(helper)
        else:
            self.exiting.append(helper)

    def fds(self) -> list[int]:
        """The pipes to watch: the running helper's, then the exiting ones'."""
        running = [] if self.helper is None else [self.helper.fd]
        return running + [h.fd for h in self.exiting]

    def reap(self, readable: list[int]) -> None:
        """Reap each exiting helper whose pipe has come to its end."""
        for helper in list(self.exiting):
            if helper.fd in readable and _read(helper.fd) == b"":
                self.exiting.remove(helper)
                _collect(helper)

    def stop(self) -> None:
        if self.helper is not None:
            self.exiting.append(self.helper)
            self.helper = None
        for helper in self.exiting:
            with contextlib.suppress(ProcessLookupError):
                os.kill(helper.pid, signal.SIGKILL)
            _collect(helper)
        self.exiting.clear()


def _read(fd: int) -> bytes | None:
    """What the pipe holds (b"" at its end), None when nothing yet (it never blocks)."""
    try:
        return os.read(fd, 16)
    except BlockingIOError:
        return None


def _collect(helper: Helper) -> None:
    """Close the pipe of a helper that has closed its end (exited, or exiting) and wait
    for it."""
    os.close(helper.fd)
    with contextlib.suppress(ChildProcessError):
        os.waitpid(helper.pid, 0)
