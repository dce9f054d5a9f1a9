"""The application of the fleet-view tests (tests/test_fleet_view.py): one no-op handler
per topic named in BROOQ_TOPICS (comma-separated), each in the queue given after a
colon (``calc.hash:bulk``; default: default), so that two masters of one test run
different topics from the same file."""

from __future__ import annotations

import os

import brooq

queue = brooq.Queue()


def _noop(claim: brooq.Claim) -> None:
    return None


for _entry in os.environ.get("BROOQ_TOPICS", "calc.hash").split(","):
    _topic, _, _queue = _entry.strip().partition(":")
    queue.handler(_topic, queue=_queue or "default")(_noop)
