"""Greedy selection with full knowledge (paper 004's upper bound, Astraea-style).

A first client uniformly at random, then repeatedly the client that makes the KL divergence
KL(p_S ‖ p_u) = Σ_j p_S(j) log(C·p_S(j)) of the selected set's label distribution to the
uniform one smallest (ties to the lowest id) — :func:`kl_greedy`, shared with the selection
study's :class:`~secure_fl.selection.GreedySelector`.

In a run the server must know every client's label counts, and it learns them the only honest
way: it asks each client for ``greedy_label_counts`` in a request of its own (a cohort of one)
through ``plain``, whatever the run's protocol, so the transcript shows the server reading
every client's counts in the clear. That is the point of this baseline: it is not private.
The counts are read at the first selection and kept in the checkpoint.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import numpy.typing as npt

from secure_fl.stats import StatisticDeclaration

from .strategy import (
    SelectionClient,
    SelectionContext,
    SelectionStrategy,
    ask_each,
    register_selection,
)

if TYPE_CHECKING:
    from secure_fl.stats.coordinator import StatsCoordinator

__all__ = ["LABEL_COUNTS", "GreedyClient", "GreedySelection", "kl_greedy", "kl_to_uniform"]

LABEL_COUNTS = "greedy_label_counts"


def kl_to_uniform(counts: npt.ArrayLike) -> npt.NDArray[np.float64]:
    """KL(p ‖ p_u) = Σ_j p_j log(C p_j) for each row of counts (0·log 0 = 0; +inf for an empty row)."""
    arr = np.atleast_2d(np.asarray(counts, dtype=np.float64))
    totals = arr.sum(axis=1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        p = arr / totals
        terms = np.where(p > 0, p * np.log(p * arr.shape[1]), 0.0)
    out: npt.NDArray[np.float64] = terms.sum(axis=1)
    out[totals[:, 0] <= 0] = np.inf
    return out


def kl_greedy(counts: npt.ArrayLike, per_round: int, rng: np.random.Generator) -> tuple[int, ...]:
    """``per_round`` clients (rows of ``counts``): a random first one, then greedily by KL to uniform."""
    matrix = np.asarray(counts, dtype=np.float64)
    n = matrix.shape[0]
    if not 1 <= per_round <= n:
        raise ValueError(f"per_round must lie in [1, {n}], got {per_round}")
    available = np.ones(n, dtype=bool)
    first = int(rng.integers(n))
    chosen = [first]
    available[first] = False
    current = matrix[first].copy()
    for _ in range(per_round - 1):
        candidates = np.flatnonzero(available)
        pick = int(candidates[int(np.argmin(kl_to_uniform(current + matrix[candidates])))])
        chosen.append(pick)
        available[pick] = False
        current += matrix[pick]
    return tuple(sorted(chosen))


def label_counts(num_classes: int, bound: int) -> StatisticDeclaration:
    """One client's label counts, read by the server in the clear."""
    return StatisticDeclaration(
        name=LABEL_COUNTS, length=num_classes, bound=bound, learners=frozenset({"server"}),
        record_sensitivity=1,
        description="one client's label counts, asked of each client alone through plain: greedy selection "
                    "reads every client's counts in the clear (the full-knowledge upper bound)",
    )


class GreedyClient(SelectionClient):
    """Hands the server its label counts when asked."""

    strategy: GreedySelection

    def __init__(self, strategy: SelectionStrategy, *, num_classes: int) -> None:
        super().__init__(strategy, num_classes=num_classes)
        self.sources[LABEL_COUNTS] = lambda ctx: np.asarray(ctx.counts, dtype=np.int64)

    def declarations(self) -> dict[str, StatisticDeclaration]:
        return {LABEL_COUNTS: label_counts(self.num_classes, self.strategy.count_bound)}


@register_selection("greedy")
@dataclass(eq=False)
class GreedySelection(SelectionStrategy):
    """Greedy KL-to-uniform selection on every client's counts, read in the clear (see the module)."""

    Client: ClassVar[type[SelectionClient] | None] = GreedyClient
    protocols: ClassVar[Mapping[str, str]] = {LABEL_COUNTS: "plain"}

    count_bound: int = 65535
    """Public bound on one client's count of one class (a client above it refuses)."""
    counts: npt.NDArray[np.int64] | None = field(default=None, init=False, repr=False)
    """Every client's counts as the server read them (a lost or refusing client: zeros)."""
    _num_classes: int = field(default=0, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.count_bound < 1:
            raise ValueError("count_bound must be positive")

    def setup(self, *, num_clients: int, num_classes: int, stats: StatsCoordinator) -> None:
        self._num_classes = num_classes

    def select(self, ctx: SelectionContext) -> tuple[int, ...]:
        if not self._num_classes:
            raise RuntimeError("selection 'greedy': call setup() before select()")
        if self.counts is None or self.counts.shape[0] != ctx.num_clients:
            rows = ask_each(ctx, label_counts(self._num_classes, self.count_bound))
            self.counts = np.rint(rows).astype(np.int64)
        return kl_greedy(self.counts, ctx.clients_per_round, ctx.rng)

    def state_dict(self) -> dict[str, Any]:
        return {} if self.counts is None else {"counts": self.counts.tolist()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if set(state) - {"counts"}:
            raise ValueError(f"selection 'greedy' expects the key 'counts', got {sorted(state)}")
        counts = None if state.get("counts") is None else np.asarray(state["counts"], dtype=np.int64)
        if counts is not None and (counts.ndim != 2 or np.any(counts < 0)):
            raise ValueError("selection 'greedy': stored counts must be a (clients, classes) matrix of counts")
        self.counts = counts
