"""The two baselines of Dubhe's evaluation (paper 004, §6.1) for the selection study.

* :class:`RandomSelector` — K clients uniformly without replacement; needs no knowledge and
  draws exactly as a run's :class:`~secure_fl.selection.RandomSelection` does.
* :class:`GreedySelector` — :func:`~secure_fl.selection.greedy.kl_greedy` with full knowledge of
  every client's label counts (the upper bound, not private), as a run's ``greedy`` selects.
  The server reads every client's counts in the clear; :meth:`GreedySelector.register` writes
  that to the transcript.
"""

from __future__ import annotations

import numpy as np

from protocols import SERVER, TranscriptEntry, Visibility

from .base import Population, Selector
from .greedy import LABEL_COUNTS, kl_greedy, kl_to_uniform

__all__ = ["GreedySelector", "RandomSelector", "kl_to_uniform"]

COUNT_BYTES = 8
"""A clear label count on the wire (uint64)."""


class RandomSelector(Selector):
    name = "random"

    def select(self, per_round: int, rng: np.random.Generator, *, round: int = 0) -> tuple[int, ...]:
        n = self._require().num_clients
        self._check_k(per_round, n)
        with self.timed("selection"):
            if per_round >= n:
                return tuple(range(n))
            chosen = rng.choice(n, size=per_round, replace=False)
            return tuple(sorted(int(c) for c in chosen))


class GreedySelector(Selector):
    name = "greedy"

    def register(self, population: Population, rng: np.random.Generator, *, per_round: int,
                 round: int = -1) -> None:
        super().register(population, rng, per_round=per_round, round=round)
        with self.timed("registration"):
            for cid in range(population.num_clients):
                self.transcript.append(TranscriptEntry(
                    round=round, protocol="clear", run_id="", stage="upload", sender=cid, receiver=SERVER,
                    statistic=LABEL_COUNTS, bytes=COUNT_BYTES * population.num_classes,
                    visibility=Visibility.CLEAR, k=1, dimension=population.num_classes, owner=cid,
                ))

    def select(self, per_round: int, rng: np.random.Generator, *, round: int = 0) -> tuple[int, ...]:
        pop = self._require()
        n = pop.num_clients
        self._check_k(per_round, n)
        with self.timed("selection"):
            return kl_greedy(pop.counts, per_round, rng)
