"""The systemd watchdog ping as a duty: WATCHDOG=1 twice per WatchdogSec.

Owns: when to ping (brooq.supervisor.sdnotify sends it). Must never block: a ping that
cannot be sent is lost, never waited for.
Stands alone: each duty is a module of its own (brooq.supervisor.duties).
"""

from __future__ import annotations

from brooq.supervisor.duties.scheduler import Counts
from brooq.supervisor.sdnotify import Notifier

SD_WATCHDOG = "sd_watchdog"


class SdWatchdog:
    """WATCHDOG=1 to systemd; only scheduled when systemd asks for it (WATCHDOG_USEC)."""

    name = SD_WATCHDOG
    first_after = 0.0

    def __init__(self, notifier: Notifier) -> None:
        self.notifier = notifier
        self.period = notifier.watchdog_period

    def run_once(self, now: float) -> Counts:
        self.notifier.send("WATCHDOG=1")
        return {"pings": 1}
