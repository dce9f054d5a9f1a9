"""An application whose include= names a module that does not exist."""

from __future__ import annotations

import brooq

queue = brooq.Queue(include=["brooq_incapp_nothing_here.tasks"])


@queue.handler("t.x")
def x(claim: brooq.Claim) -> None:
    return None
