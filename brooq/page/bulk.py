"""The page process's bulk helper: a bulk retry or cancel (seconds to minutes of batches)
runs in a process of its own, forked by the page process, so that pages are answered
meanwhile.

One at a time: a second bulk action while one runs is answered 503. The helper answers
its client itself and exits; its pipe's end closes then, which the page process's loop
sees (read_fd) and reports to the master (brooq.opsport.handover: BACKGROUND, then END).
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
        """The helper's pipe closed: it has answered (or died); reap it."""
        helper, self.helper = self.helper, None
        if helper is None:
            return
        os.close(helper.fd)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(helper.pid, 0)  # it has closed its end: it is exiting

    def stop(self) -> None:
        if self.helper is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.helper.pid, signal.SIGKILL)
            self.ended()
