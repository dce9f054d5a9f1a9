"""The unhandled-topic watch: ready jobs whose (queue, topic) no live master handles.

A job on a topic no master has a handler for (a producer's typo: ``calc.hsah``), or in a
queue no master works, waits for ever without a word anywhere; so the master that
notices says so. Fed by the stats duty's count (its rows, per queue and topic) and the
pairs the live fleet handles (brooq.supervisor.duties.beat's last answer).

Owns: the once-per-pair log line (``event=unhandled_topic``, said again only after the
pair was handled and then was not), the line saying a flagged pair is handled now, and
the gauge brooq_jobs_unhandled (a pair that is handled again, or has no ready job left,
is written once as 0: a multiprocess gauge cannot drop a label set).
Must never read the database or wait: it is handed what was read.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from brooq.metrics import Metrics
from brooq.operator.masters import Pair, unhandled

log = logging.getLogger("brooq.master")


class Unhandled:
    """``live``: the pairs the live masters handle, None while unknown (nothing is
    judged then)."""

    def __init__(self, live: Callable[[], frozenset[Pair] | None], metrics: Metrics | None) -> None:
        self.live = live
        self.metrics = metrics
        self.flagged: set[Pair] = set()  # said, and not handled since
        self.gauged: set[Pair] = set()  # written non-zero at the last check

    def check(self, rows: Iterable[Mapping[str, Any]]) -> dict[Pair, int]:
        """Judge one count's rows (queue, topic, ready); {pair: ready jobs} unhandled."""
        live = self.live()
        if live is None:
            return {}
        found = unhandled(rows, live)
        for queue, topic in sorted(set(found) - self.flagged):
            log.warning(
                "event=unhandled_topic topic=%s queue=%s count=%d: ready jobs no live master "
                "handles (no handler for this topic, or nobody works this queue); they wait "
                "until one does",
                topic,
                queue,
                found[(queue, topic)],
            )
        for queue, topic in sorted(p for p in self.flagged if p in live):
            log.info("event=unhandled_topic_handled topic=%s queue=%s", topic, queue)
        self.flagged = {p for p in self.flagged if p not in live} | set(found)
        if self.metrics is not None:
            for queue, topic in self.gauged | set(found):
                self.metrics.unhandled.labels(topic=topic, queue=queue).set(
                    found.get((queue, topic), 0)
                )
        self.gauged = set(found)
        return found
