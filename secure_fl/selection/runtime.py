"""Adapters that put ``greedy`` and ``dubhe`` into the runtime's selection registry.

The runtime (:mod:`secure_fl.runtime.selection`) imports :mod:`secure_fl.selection` the first
time a config names a strategy it does not know, which runs the ``register_selection``
decorators below. ``random`` is the runtime's own :class:`~secure_fl.runtime.RandomSelection`
(it draws exactly as :class:`~secure_fl.selection.RandomSelector`), so it is not registered
again. Both adapters are frozen dataclasses of hyper-parameters, as the runtime expects; the
live selector is built in ``setup`` from the clients' class counts (client-side knowledge) and
writes its messages to the run's transcript (``stats.transport``).

Dubhe registers (and, without ``sigma``, searches) at the first round it is asked to select,
because the search needs the run's K. Its search draws come from ``seed`` (``setup`` gets no
round generator); given the same seed and data, a resumed run re-registers under new keys and
reaches the same σ and R_A, so it selects the same clients as the uninterrupted run.
``reregister_every`` > 0 repeats the registration every that many rounds (Dubhe re-registers
when the clients' data changes; the simulated data does not).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar

import numpy as np

from secure_fl.algorithms.local import ClientData
from secure_fl.runtime.selection import (
    SelectionContext,
    SelectionStrategy,
    refuse_unknown,
    register_selection,
)
from secure_fl.stats import GlobalStatistics, StatisticDeclaration

from .base import Population
from .baselines import GreedySelector
from .dubhe import STATISTICS, DubheParams, DubheSelector

__all__ = ["DubheSelection", "GreedySelection"]


def _population(clients: Mapping[int, ClientData]) -> Population:
    return Population.from_clients({int(k): np.asarray(v.class_counts) for k, v in clients.items()})


@dataclass
class _Live:
    """What an adapter builds in ``setup``: the selector, the clients' counts, the last registration."""

    selector: GreedySelector | DubheSelector
    population: Population
    registered: tuple[int, int] | None = None
    """(round, K) of the last registration."""


def _live(strategy: SelectionStrategy) -> _Live:
    live: _Live | None = getattr(strategy, "_live", None)
    if live is None:
        raise RuntimeError(f"selection {strategy.name!r}: call setup() before select()")
    return live


@register_selection("greedy")
@dataclass(frozen=True)
class GreedySelection(SelectionStrategy):
    """Greedy KL-to-uniform selection with full knowledge (the upper bound; the server reads every
    client's label counts in the clear, which the transcript records)."""

    _live: _Live | None = field(default=None, init=False, repr=False, compare=False)

    def setup(self, *, num_clients: int, stats: GlobalStatistics, clients: Mapping[int, ClientData]) -> None:
        population = _population(clients)
        stats.declare(StatisticDeclaration(
            name="greedy_label_counts", length=population.num_classes, bound=float(max(1, population.counts.max())),
            learners=frozenset({"server"}), per_round=False,
            description="every client's label counts, in the clear, for greedy selection",
        ))
        selector = GreedySelector(transcript=stats.transcript)
        selector.register(population, np.random.default_rng(0), per_round=1)
        object.__setattr__(self, "_live", _Live(selector, population))

    def select(self, ctx: SelectionContext) -> tuple[int, ...]:
        return _live(self).selector.select(ctx.clients_per_round, ctx.rng, round=ctx.round)


@register_selection("dubhe")
@dataclass(frozen=True)
class DubheSelection(SelectionStrategy):
    """Dubhe (paper 004) over the run's transport.

    A config's ``[selection]`` keys are :class:`~secure_fl.selection.DubheParams`' fields (one flat
    table) plus this adapter's own ``seed`` and ``reregister_every``.
    """

    params: DubheParams = field(default_factory=DubheParams)
    seed: int = 0
    reregister_every: int = 0
    _live: _Live | None = field(default=None, init=False, repr=False, compare=False)

    OWN: ClassVar[tuple[str, ...]] = ("seed", "reregister_every")

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> DubheSelection:
        own = {k: v for k, v in params.items() if k in cls.OWN}
        dubhe = {k: v for k, v in params.items() if k not in cls.OWN}
        refuse_unknown(cls.name, dubhe, {f.name for f in fields(DubheParams)} | set(cls.OWN))
        return cls(params=DubheParams(**dubhe), **own)

    def __post_init__(self) -> None:
        if self.reregister_every < 0:
            raise ValueError("reregister_every must be >= 0")

    def setup(self, *, num_clients: int, stats: GlobalStatistics, clients: Mapping[int, ClientData]) -> None:
        params = self.params
        population = _population(clients)
        codebook = params.codebook(population.num_classes)
        for declaration in (
            StatisticDeclaration(name=STATISTICS["registry"], length=codebook.length, bound=1,
                                 learners=frozenset({"clients"}), per_round=False,
                                 description="Dubhe registry (one-hot category), summed for the clients"),
            StatisticDeclaration(name=STATISTICS["counts"], length=population.num_classes,
                                 bound=float(params.count_bound), learners=frozenset({"clients"}),
                                 per_round=False,
                                 description="label counts of tentative sets, decrypted by the agent only"),
        ):
            stats.declare(declaration)
        transport = stats.transport if params.protocol == "paillier" else None
        object.__setattr__(self, "_live", _Live(DubheSelector(params, transport=transport), population))

    @property
    def selector(self) -> DubheSelector:
        """The live selector (after ``setup``): R_A, σ, timings, the search log."""
        selector = _live(self).selector
        assert isinstance(selector, DubheSelector)
        return selector

    def select(self, ctx: SelectionContext) -> tuple[int, ...]:
        live = _live(self)
        selector = self.selector
        last = live.registered
        due = last is None or last[1] != ctx.clients_per_round or (
            self.reregister_every > 0 and ctx.round - last[0] >= self.reregister_every)
        if due:
            selector.register(live.population, np.random.default_rng([self.seed, 1]),
                              per_round=ctx.clients_per_round, round=ctx.round)
            live.registered = (ctx.round, ctx.clients_per_round)
        return selector.select(ctx.clients_per_round, ctx.rng, round=ctx.round)

    def state_dict(self) -> dict[str, Any]:
        return {}
