"""The one LISTEN connection that every queue.wait and wait_async of a Queue shares.

A connection per waiter would let the waiters fill the server's ``max_connections``
and refuse the producers beside them. So a Queue keeps, in each process, one connection
(``application_name=brooq-wait``, on the direct ``listen_dsn``: docs/poolers.md) that
LISTENs to brooq_outcome, read by a daemon thread of its own; waiters subscribe to
their job's id and read the row themselves on the Queue's bounded pool. However many
wait at once, they cost the server one connection more than the pool.

No lost wake-up: a waiter subscribes before it flags and reads its row, and clears its
wake-up before each read. A notification for its job wakes it; so does every successful
LISTEN (the first one, and each after the connection was lost), because notifications
sent before it may not have reached us: each waiter then reads its row again. A waiter
also polls (brooq.producer.wait's backoff), so a listener that cannot reconnect costs latency only.
The first connection failing is the waiters' error (DatabaseUnavailable): those that
never saw the listener listening are told, and a new subscriber makes a listener that is
waiting to reconnect try at once.

The thread and its connection live while someone waits, and LINGER seconds after the
last one left (a process that waits often does not reconnect for each call); then the
thread closes the connection and ends. Waking an asyncio waiter goes through its loop's
``call_soon_threadsafe`` (``async_waker``), so one listener serves every thread and every
event loop of the process. brooq.producer.wait drops its listener unused in a fork's child (the
thread does not exist there and the socket is the parent's; psycopg closes nothing it
did not open in this process).

Owns: that connection, its thread, the subscriptions by job id and waking them.
Must never: read or write a job row (the waiters do, on the pool), call a waiter's code
other than its wake-up, or keep its connection across fork().
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import psycopg

from brooq.db import open_connection
from brooq.dsn import attempt_timeout

if TYPE_CHECKING:
    from typing_extensions import LiteralString

log = logging.getLogger("brooq")

APPLICATION_NAME = "brooq-wait"
# Seconds the connection stays open after the last waiter left.
LINGER = 30.0
# How often the thread looks up from its notifications: to end after LINGER, or when
# closed. A notification wakes it at once; this bounds only how long close() waits.
TICK = 0.25
# Between two failed connects: 0.1 s doubling to 5 s (a new subscriber cuts it short).
RECONNECT_FIRST = 0.1
RECONNECT_MAX = 5.0


class Subscription:
    """One waiter's interest in one job. ``error``: why the listener could not connect,
    set only while this waiter never saw it listening (the waiter raises it)."""

    __slots__ = ("error", "job", "listened", "wake")

    def __init__(self, job: str, wake: Callable[[], None]) -> None:
        self.job = job
        self.wake = wake
        self.listened = False
        self.error: BaseException | None = None


def async_waker(event: asyncio.Event) -> Callable[[], None]:
    """A wake-up that sets ``event`` from the listener's thread, in the event's loop (the
    running one). A loop that closed meanwhile has no waiter left to wake."""
    loop = asyncio.get_running_loop()

    def wake() -> None:
        with contextlib.suppress(RuntimeError):  # the loop is closed
            loop.call_soon_threadsafe(event.set)

    return wake


class OutcomeListener:
    """See the module docstring. Thread-safe; ``subscribe`` never blocks on I/O."""

    def __init__(self, dsn: str, listen: LiteralString) -> None:
        self._dsn = dsn
        self._listen = listen
        self._lock = threading.Lock()
        self._subs: dict[str, list[Subscription]] = {}
        self._thread: threading.Thread | None = None
        self._conn: psycopg.Connection[Any] | None = None
        self._idle_since = time.monotonic()
        self._closed = False
        self._kick = threading.Event()  # cuts a reconnect pause short

    # -- the waiters' side --------------------------------------------------------------

    def subscribe(self, job_id: uuid.UUID, wake: Callable[[], None]) -> Subscription:
        """Call ``wake`` (from the listener's thread) when ``job_id``'s outcome is
        notified, and whenever the listener (re)starts listening. Starts the thread if
        none runs."""
        sub = Subscription(str(job_id), wake)
        with self._lock:
            self._subs.setdefault(sub.job, []).append(sub)
            sub.listened = self._conn is not None
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="brooq-wait-listener", daemon=True
                )
                self._thread.start()
            elif self._conn is None:
                self._kick.set()  # waiting to reconnect: try now, this waiter needs a verdict
        return sub

    def unsubscribe(self, sub: Subscription) -> None:
        with self._lock:
            subs = self._subs.get(sub.job)
            if subs is not None:
                with contextlib.suppress(ValueError):
                    subs.remove(sub)
                if not subs:
                    del self._subs[sub.job]
            if not self._subs:
                self._idle_since = time.monotonic()

    def close(self) -> None:
        """End the thread and close the connection (within TICK). Waiters still
        subscribed are woken and go on by polling."""
        with self._lock:
            self._closed = True
            thread = self._thread
            for subs in self._subs.values():
                for sub in subs:
                    sub.wake()
        self._kick.set()
        if thread is not None and thread is not threading.current_thread():
            thread.join(TICK + attempt_timeout(self._dsn))

    @property
    def listening(self) -> bool:
        return self._conn is not None

    @property
    def waiting(self) -> int:
        """How many waiters are subscribed."""
        with self._lock:
            return sum(len(subs) for subs in self._subs.values())

    # -- the thread ---------------------------------------------------------------------

    def _run(self) -> None:
        delay = RECONNECT_FIRST
        while not self._retire():
            try:
                # The DSN's connect timeout (else brooq's), the host that answered
                # last in the process first: brooq.db.open_connection.
                conn = open_connection(
                    self._dsn, autocommit=True, application_name=APPLICATION_NAME
                )
            except psycopg.Error as exc:
                self._failed(exc)
                self._kick.wait(delay)
                self._kick.clear()
                delay = min(delay * 2, RECONNECT_MAX)
                continue
            delay = RECONNECT_FIRST
            retired = False
            try:
                conn.execute(self._listen)
                self._listening(conn)
                retired = self._serve(conn)
            except psycopg.Error as exc:
                # Its waiters poll meanwhile, and read their rows again once it listens.
                log.info("event=wait_listener_lost error=%r: reconnecting", str(exc).strip())
            finally:
                with self._lock:
                    if self._conn is conn:
                        self._conn = None
                with contextlib.suppress(Exception):
                    conn.close()
            if retired:  # another thread may be the listener's by now: this one ends
                return

    def _retire(self) -> bool:
        """True (and the thread is no longer the listener's) when it should end: closed,
        or nobody waits and either there is no connection to keep or it lingered long
        enough. Decided under the lock, so a subscriber either sees this thread still
        running or starts another."""
        with self._lock:
            idle = not self._subs and (
                self._conn is None or time.monotonic() - self._idle_since >= LINGER
            )
            if self._closed or idle:
                self._thread = None
                return True
            return False

    def _listening(self, conn: psycopg.Connection[Any]) -> None:
        """LISTEN is in force: every waiter reads its row again (what was notified
        before this moment may never have reached us)."""
        with self._lock:
            self._conn = conn
            for subs in self._subs.values():
                for sub in subs:
                    sub.listened = True
                    sub.error = None
                    sub.wake()

    def _failed(self, exc: BaseException) -> None:
        """The connect failed: the waiters that never saw the listener listening raise
        it; the others keep polling while it tries again."""
        with self._lock:
            for subs in self._subs.values():
                for sub in subs:
                    if not sub.listened:
                        sub.error = exc
                        sub.wake()

    def _serve(self, conn: psycopg.Connection[Any]) -> bool:
        """Wake the subscribers of each notified job until the thread should end (True);
        a lost connection raises (psycopg.OperationalError)."""
        while True:
            for notify in conn.notifies(timeout=TICK):
                with self._lock:
                    for sub in self._subs.get(notify.payload, ()):
                        sub.wake()
            if self._retire():
                return True
