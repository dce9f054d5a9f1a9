"""In what order a child tries its worked queues, round after round.

Owns RoundOrder (the worked queues themselves are resolved by brooq.rules, which
the master reads too), the per-round order: the first queue is picked by
smooth weighted round robin (nginx's: each queue's current value grows by its weight,
the largest goes first and gives back the total), the others follow by weight, then
name. Every worked queue is in every round, so a weight decides how often a queue is
tried first, never whether it is tried: a low-weight queue is slower, never starved.
Must never do I/O or look at the clock: the order is a pure function of the rounds.
"""

from __future__ import annotations

from brooq.settings import QueueWeights

__all__ = ["RoundOrder"]


class RoundOrder:
    """``next()`` is the order of one claim round; deterministic from the weights."""

    def __init__(self, weights: QueueWeights) -> None:
        if not weights:
            raise ValueError("a child works at least one queue")
        self.names = [name for name, _ in weights]
        self.weights = [weight for _, weight in weights]
        self.total = sum(self.weights)
        self.current = [0] * len(self.names)
        # The order after the first: heavier queues sooner, then by name.
        self.by_weight = [name for _, name in sorted((-w, name) for name, w in weights)]
        self._rounds = {
            name: [name, *(n for n in self.by_weight if n != name)] for name in self.names
        }

    @property
    def single(self) -> str | None:
        """The queue, when there is only one (the claim's fast path)."""
        return self.names[0] if len(self.names) == 1 else None

    def first(self) -> str:
        best = 0
        for i, weight in enumerate(self.weights):
            self.current[i] += weight
            if self.current[i] > self.current[best]:
                best = i
        self.current[best] -= self.total
        return self.names[best]

    def next(self) -> list[str]:
        return self._rounds[self.first()]
