"""The status page's own process: its loop. Pages are rendered here, off the master's.

The master (brooq.supervisor.pagekeeper) forks this process at the first page request
and hands it each page request with the client's socket (brooq.opsport.handover). This
loop takes one message at a time and answers it (brooq.page.dispatch) on the client's
socket, reporting to the master when it starts a request, when its answer is being
written and when it is done; a bulk action goes on in a helper process
(brooq.page.bulk), reported as background, with a heartbeat every HEARTBEAT until the
helper's pipe closes, then the end. So a slow page query, a page of 1,000 rows or a
client slow to read its answer costs this process time, never the master's.

The process ends when the master's end of the socket closes (the master stopped or
died) or on SIGTERM; the master kills it (and its helper: its process group) when a
request runs over its limit.

Owns: the loop, its signal table and its reports. Must never wake the master's loop
(the master's wakeup fd is dropped first) nor wait on anything but its socket and its
helper's pipe.
"""

from __future__ import annotations

import contextlib
import functools
import select
import signal
import socket
import time

from brooq.opsport import handover
from brooq.opsport.handover import (
    ALIVE,
    BACKGROUND,
    CONTROL,
    END,
    HEARTBEAT,
    MESSAGE_BYTES,
    SEQ,
    START,
    TOKEN,
    WRITING,
)
from brooq.opsport.hosts import HostRule
from brooq.page.dispatch import Dispatcher


def run(
    sock: socket.socket,
    dsn: str,
    token: bytes | None,
    mask: set[int | signal.Signals] | None = None,
    schema: str | None = None,
    hosts: HostRule | None = None,
    revoked: dict[str, int] | None = None,
    read_dsn: str | None = None,
) -> int:
    """The page process's loop: one page at a time (a bulk action in a helper beside),
    until the master's end closes. The pages read on ``read_dsn`` when given (a standby:
    QUEUE_READ_DATABASE_URL); the actions write on ``dsn``."""
    from setproctitle import setproctitle

    signal.set_wakeup_fd(-1)  # the master's: a signal here must not wake the master
    for signum in (signal.SIGTERM, signal.SIGQUIT, signal.SIGCHLD):
        signal.signal(signum, signal.SIG_DFL)
    for signum in (signal.SIGINT, signal.SIGHUP, signal.SIGTTIN, signal.SIGTTOU):
        signal.signal(signum, signal.SIG_IGN)
    if mask is not None:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    setproctitle("brooq-pages: status page")
    pages = Dispatcher(
        dsn, token, schema, hosts, revoked, functools.partial(_revoked, sock), read_dsn
    )
    pages.bulk.master_fd = sock.fileno()
    sock.setblocking(True)
    beat = time.monotonic()
    try:
        while True:
            helper = pages.bulk.helper
            watched = [sock.fileno(), *pages.bulk.fds()]
            try:
                readable, _, _ = select.select(watched, [], [], HEARTBEAT if helper else None)
            except InterruptedError:
                continue
            pages.bulk.reap(readable)  # helpers that answered before, now gone
            if helper is not None and helper.fd in readable:
                pages.bulk.ended()
                _report(sock, END, helper.seq)
            if pages.bulk.helper is not None and time.monotonic() - beat >= HEARTBEAT:
                beat = time.monotonic()
                _report(sock, ALIVE, SEQ.pack(CONTROL))
            if sock.fileno() in readable and not _serve_one(sock, pages):
                return 0  # the master is gone
    finally:
        pages.bulk.stop()


def _serve_one(sock: socket.socket, pages: Dispatcher) -> bool:
    """Take the master's next message and answer it; False when the master is gone."""
    try:
        data, fds, _, _ = socket.recv_fds(sock, MESSAGE_BYTES, 1)
    except InterruptedError:
        return True
    except OSError:
        return False
    if not data and not fds:
        return False
    seq, data = data[: SEQ.size], data[SEQ.size :]
    if not fds and SEQ.unpack(seq)[0] == CONTROL and data[:1] == TOKEN:
        pages.set_token(data[1:] or None)
        return True
    for fd in fds:
        client = socket.socket(fileno=fd)
        background = False
        try:
            _report(sock, START, seq)
            background = pages.answer(client, data, functools.partial(_report, sock, WRITING, seq))
            if background:
                assert pages.bulk.helper is not None
                pages.bulk.helper.seq = seq
                _report(sock, BACKGROUND, seq)
        finally:
            with contextlib.suppress(OSError):
                client.close()  # a helper answering it has its own copy
            if not background:
                _report(sock, END, seq)
    return True


def _revoked(sock: socket.socket, nonce: str, expires: int) -> None:
    """Tell the master of a signed-out session (it outlives this process there)."""
    with contextlib.suppress(OSError):
        sock.send(handover.revoked(nonce, expires))


def _report(sock: socket.socket, kind: bytes, seq: bytes) -> None:
    """Tell the master where this process is (it bounds a request by these)."""
    with contextlib.suppress(OSError):
        sock.send(kind + seq)
