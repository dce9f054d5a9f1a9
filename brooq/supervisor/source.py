"""What the master's loop waits on: the Source protocol.

Every descriptor of the master's one select belongs to a source: the signal pipe, the
children's pipes, the LISTEN connection, the ops sockets, the page process's socket and
the answer of a statement sent off the loop. The loop holds one list of them and, on
every pass, asks each for its descriptors, calls its ``service`` with what was ready,
waits no longer than its ``next_deadline``, closes its ``fds`` in every process it forks
and ``close``s it at exit; so adding a source is one line of the list.

A source subclasses Source to inherit the defaults (nothing to write, no deadline,
nothing to close at exit).

Owns: the protocol. Must never: import another room of the master (a source imports
this module, not the reverse).
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Protocol


class Source(Protocol):
    def read_fds(self) -> list[int]:
        """The descriptors to wait on for reading, now."""
        ...

    def write_fds(self) -> list[int]:
        """The descriptors to wait on for writing, now."""
        return []

    def service(self, readable: Collection[int], writable: Collection[int]) -> None:
        """Do, without waiting, what the ready descriptors allow; called on every pass of
        the loop, whatever was ready (a source may have deadlines of its own)."""
        ...

    def next_deadline(self) -> float | None:
        """When service must run again at the latest (time.monotonic()), or None."""
        return None

    def fds(self) -> list[int]:
        """Every descriptor of this source: a process the master forks closes them."""
        ...

    def close(self) -> None:
        """At the master's end."""
        return None
