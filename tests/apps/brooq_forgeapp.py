"""An application whose handlers fail with, and log, the text their payload gives (a
newline and a forged record in it), for tests/process/test_log_forging.py."""

from __future__ import annotations

import logging

import brooq

queue = brooq.Queue()
log = logging.getLogger("myapp.forge")


@queue.handler("f.dead", max_attempts=1)
def dead(claim: brooq.Claim) -> None:
    raise ValueError(claim.payload["error"])


@queue.handler("f.logs")
def logs(claim: brooq.Claim) -> None:
    log.warning("%s", claim.payload["error"])
