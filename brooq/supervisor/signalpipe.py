"""The master's signals as a source of its loop: the handlers only wake the loop.

Each signal the master catches has a handler that does nothing; Python writes the
signal's number to the wakeup pipe (signal.set_wakeup_fd), which the loop waits on like
any other descriptor, and the numbers read are handed to the master's signal table
(brooq.supervisor.master). So all work, logging included, happens in the loop, never in
a handler.

Owns: the pipe, the handlers and reading the numbers. Must never do anything in a
handler, nor block (both ends are non-blocking).
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Callable, Collection, Iterable

from brooq.supervisor.source import Source


class SignalPipe(Source):
    """``handle`` gets the signal numbers read, in the order they came."""

    def __init__(self, handle: Callable[[bytes], None]) -> None:
        self.handle = handle
        self.r = self.w = -1

    def open(self, signals: Iterable[signal.Signals]) -> None:
        """The pipe, and a handler that only wakes the loop for each of ``signals``."""
        self.r, self.w = os.pipe()
        for fd in (self.r, self.w):
            os.set_blocking(fd, False)
        signal.set_wakeup_fd(self.w, warn_on_full_buffer=False)
        for signum in signals:
            signal.signal(signum, _wake_only)

    def read_fds(self) -> list[int]:
        return [self.r] if self.r >= 0 else []

    def service(self, readable: Collection[int], writable: Collection[int] = ()) -> None:
        if self.r < 0 or self.r not in readable:
            return
        try:
            data = os.read(self.r, 4096)
        except BlockingIOError:
            return
        self.handle(data)

    def fds(self) -> list[int]:
        return [fd for fd in (self.r, self.w) if fd >= 0]

    def close(self) -> None:
        """At the master's end: signals wake nothing any more (their handlers stay)."""
        signal.set_wakeup_fd(-1)
        for fd in self.fds():
            with contextlib.suppress(OSError):
                os.close(fd)
        self.r = self.w = -1


def _wake_only(signum: int, frame: object) -> None:
    """Signal handlers only wake the loop (through the wakeup fd)."""
