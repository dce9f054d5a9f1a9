"""An application that logs through its own loggers, for tests/process/test_app_logging.py."""

from __future__ import annotations

import logging
import warnings

import brooq

queue = brooq.Queue()
log = logging.getLogger("myapp.jobs")


@queue.handler("l.sync")
def sync_job(claim: brooq.Claim) -> None:
    log.info("charged %s cents", claim.payload["cents"])
    log.debug("a detail below INFO")
    warnings.warn("a deprecated call", UserWarning, stacklevel=1)


@queue.handler("l.async")
async def async_job(claim: brooq.Claim) -> None:
    log.warning("slow answer from %s", claim.payload["host"])
