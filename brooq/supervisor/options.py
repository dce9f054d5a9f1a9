"""The handler options the master acts on, and how a reload changes them.

The master imports the application once, at start-up; after SIGHUP only the new children
import it again (docs/design.md). Yet the master decides with handler options of its
own: a child killed in a job gets its failed attempt, dead or retried, from the master
(brooq.supervisor.accounting: max_attempts and the backoff), and the master's row in
brooq_master says the topics, queues and limits this master works (`brooq fleet`, the
unhandled-topic watch; brooq.supervisor.duties.beat), as the job counts do
(brooq.supervisor.duties.stats). A child of a reloaded generation says, when it is
ready, the options of the handlers it imported (brooq.declare.handlers.described); the first
such word of the generation the fleet now runs becomes the master's options. A reload
that fails goes back to the options of the generation it goes back to.

Owns: the options of each generation the master knows of, and applying them. The
policies are merged, not replaced: a topic the reload dropped keeps its last options,
for the old children still running its jobs.
Must never: import the application, or wait (it reads what the children already said).
"""

from __future__ import annotations

import logging
from typing import Any

from brooq.declare.handlers import Handler, described, described_policy
from brooq.job import DEFAULT_QUEUE
from brooq.settings import Settings
from brooq.supervisor.accounting import Accounting
from brooq.supervisor.duties.beat import Beat
from brooq.supervisor.duties.stats import Stats
from brooq.supervisor.fleet import Fleet

log = logging.getLogger("brooq.master")


class HandlerOptions:
    def __init__(
        self,
        fleet: Fleet,
        accounting: Accounting,
        beat: Beat,
        stats: Stats,
        settings: Settings,
        handlers: dict[str, Handler],
    ) -> None:
        self.fleet = fleet
        self.accounting = accounting
        self.beat = beat
        self.stats = stats
        self.settings = settings
        self.applied = fleet.generation  # the generation whose options are in force
        self.known: dict[int, dict[str, Any]] = {self.applied: described(handlers, settings)}

    def check(self) -> None:
        """On every pass of the loop: a look at one attribute unless a generation whose
        options are not in force runs (a reload, until its first child is ready)."""
        generation = self.fleet.generation
        if generation == self.applied:
            return
        options = self.known.get(generation)
        if options is None:
            options = next(
                (
                    c.handlers
                    for c in self.fleet.children.values()
                    if c.generation == generation and c.handlers is not None
                ),
                None,
            )
            if options is None:
                return
            self.known[generation] = options
        self.apply(options)
        self.applied = generation
        # The generations no child runs any more are forgotten (the one in force kept).
        alive = {c.generation for c in self.fleet.children.values()} | {generation}
        self.known = {g: o for g, o in self.known.items() if g in alive}
        log.info(
            "event=handler_options_reloaded generation=%d topics=%d",
            generation,
            len(options),
        )

    def apply(self, options: dict[str, Any]) -> None:
        self.accounting.policies.update(
            {topic: described_policy(o["policy"]) for topic, o in options.items()}
        )
        topics = sorted(options)
        declared = sorted({str(o["queue"]) for o in options.values()}) or [DEFAULT_QUEUE]
        queues = [name for name, _ in self.settings.queues] or declared  # rules.queues'
        limits = {
            topic: {"queue": o["queue"], **o["limits"]}
            for topic, o in sorted(options.items())
            if o["limits"]
        }
        self.beat.handlers_changed(queues, topics, limits)
        self.stats.handled = {(str(o["queue"]), topic) for topic, o in options.items()}
        self.stats.limited = bool(limits)
