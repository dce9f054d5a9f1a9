"""The application's Queue, holding no handler itself: its include= names the modules
that register them (as Celery's autodiscover_tasks finds tasks)."""

from __future__ import annotations

import brooq

queue = brooq.Queue(
    include=["brooq_incapp.tasks", "brooq_incapp.billing"],
    strict_topics=True,
)
