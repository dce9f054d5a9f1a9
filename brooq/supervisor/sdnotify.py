"""systemd's notify protocol (sd_notify): one datagram per message to $NOTIFY_SOCKET.

Owns the socket address and the watchdog period systemd asks for (WATCHDOG_USEC; the
ping itself is a duty: brooq.supervisor.duties.sdwatchdog). It must never block or fail the
master: a systemd that is gone or a socket that is not ours is silently ignored.
"""

from __future__ import annotations

import os
import socket


class Notifier:
    def __init__(self) -> None:
        address = os.environ.get("NOTIFY_SOCKET", "")
        self.address = "\0" + address[1:] if address.startswith("@") else address
        usec = os.environ.get("WATCHDOG_USEC", "")
        pid = os.environ.get("WATCHDOG_PID", "")
        wanted = usec.isdigit() and (not pid or pid == str(os.getpid()))
        # Ping twice per WatchdogSec, as sd_watchdog_enabled(3) advises.
        self.watchdog_period = int(usec) / 2e6 if wanted else 0.0

    @property
    def enabled(self) -> bool:
        return bool(self.address)

    def send(self, *lines: str) -> None:
        if not self.address:
            return
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            try:
                sock.connect(self.address)
                sock.sendall("\n".join(lines).encode())
            except OSError:
                pass  # systemd gone or socket not ours: nothing useful to do
