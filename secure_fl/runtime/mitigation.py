"""A run's ``[mitigation]`` (issue 25) as the parts of a run use it, one builder per name.

* the **release policy** every client enforces (in the public statistics plan): the span guard
  or the fixed cohorts (:mod:`secure_fl.stats.guard`);
* the **selection** that follows it on the server (:class:`~secure_fl.selection.mitigation.PolicySelection`);
* for ``dp``, the **distributed DP** of every release: a client-level ``default`` entry for every
  statistic and the model updates clipped to ``update_l2`` (:class:`~secure_fl.stats.StatisticsPrivacy`).

A selection's own statistics that its design reads per client (``SelectionStrategy.protocols``:
Dubhe's volunteer coins, greedy's counts) are exempt from the policy; docs/audit.md says so.
"""

from __future__ import annotations

from collections.abc import Callable

from secure_fl.config import CohortMitigation, DPMitigation, GuardMitigation, RunConfig
from secure_fl.selection.mitigation import PolicySelection
from secure_fl.selection.strategy import SelectionStrategy
from secure_fl.stats import StatisticPrivacy, StatisticsPrivacy
from secure_fl.stats.guard import FixedCohorts, ReleasePolicy, SpanGuard, make_cohorts
from secure_fl.stats.noise import DEFAULT_STATISTIC

__all__ = ["mitigated_selection", "release_policy", "run_privacy"]


def _guard(config: RunConfig, exempt: frozenset[str]) -> ReleasePolicy:
    params = config.mitigation.params
    assert isinstance(params, GuardMitigation)
    return SpanGuard(k=params.k, exempt=exempt)


def _cohorts(config: RunConfig, exempt: frozenset[str]) -> ReleasePolicy:
    params = config.mitigation.params
    assert isinstance(params, CohortMitigation)
    return FixedCohorts(cohorts=make_cohorts(config.data.num_clients, size=params.size, seed=config.seed), exempt=exempt)


POLICIES: dict[str, Callable[[RunConfig, frozenset[str]], ReleasePolicy]] = {"guard": _guard, "cohorts": _cohorts}
"""Mitigations that restrict participant sets, by ``[mitigation] name``."""


def release_policy(config: RunConfig, selection: SelectionStrategy) -> ReleasePolicy | None:
    """The public rule on participant sets (``None`` for mitigations that have none)."""
    build = POLICIES.get(config.mitigation.name)
    return None if build is None else build(config, frozenset(selection.protocols))


def mitigated_selection(selection: SelectionStrategy, policy: ReleasePolicy | None) -> SelectionStrategy:
    """The server's selection under ``policy`` (the strategy itself when there is none)."""
    return selection if policy is None else PolicySelection(selection, policy)


def run_privacy(config: RunConfig) -> StatisticsPrivacy | None:
    """The run's distributed DP: ``[privacy.statistics]``, or every release under mitigation ``dp``."""
    params = config.mitigation.params
    if isinstance(params, DPMitigation):
        entry = StatisticPrivacy(epsilon=params.epsilon, delta=params.delta, level="client", mechanism="ddg",
                                 secure_mode=params.secure_mode)
        return StatisticsPrivacy(statistics={DEFAULT_STATISTIC: entry}, rounds=config.train.rounds,
                                 seed=config.seed, update_l2=params.update_l2,
                                 counts_at_record_level=params.counts == "record")
    statistics = config.privacy.statistics
    return StatisticsPrivacy(statistics=statistics, rounds=config.train.rounds, seed=config.seed) \
        if statistics else None
