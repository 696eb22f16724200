"""Selection under a public release policy (issue 25): whole cohorts, or sets the guard admits.

:class:`PolicySelection` wraps any strategy (random, fixed, greedy, Dubhe...). The inner
strategy picks as it always does; the wrapper turns its pick into a set the run's
:class:`~secure_fl.stats.guard.ReleasePolicy` admits, so that an honest server is never refused
by clients who enforce the same rule:

* **fixed cohorts**: the cohorts holding most of the pick (ties: the round's generator), as
  many as the round's K takes (⌈K / cohort size⌉ rounded to the nearest, at least one);
* **guard**: the pick itself when the rule admits it over the full history of the run's
  cohorts (which the server knows); otherwise the earlier cohort sharing most clients with the
  pick (a repeated set adds nothing to the span), the least recently used among equals.
  :attr:`PolicySelection.fallbacks` counts those rounds: the guard's cost in selection freedom.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from secure_fl.stats.guard import FixedCohorts, ReleasePolicy, SpanGuard

from .strategy import SelectionClient, SelectionContext, SelectionStrategy

__all__ = ["PolicySelection"]


class PolicySelection(SelectionStrategy):
    """The inner strategy's pick, made admissible under ``policy`` (module docstring)."""

    name = "policy"

    def __init__(self, inner: SelectionStrategy, policy: ReleasePolicy) -> None:
        self.inner = inner
        self.policy = policy
        self.history: list[tuple[int, ...]] = []
        self.fallbacks = 0

    def setup(self, **kwargs: Any) -> None:
        self.inner.setup(**kwargs)

    def client(self, *, num_classes: int) -> SelectionClient | None:
        return self.inner.client(num_classes=num_classes)

    def sessions(self) -> dict[tuple[str, str], Any]:
        return self.inner.sessions()

    def select(self, ctx: SelectionContext) -> tuple[int, ...]:
        pick = tuple(sorted(self.inner.select(ctx)))
        if isinstance(self.policy, FixedCohorts):
            chosen = self._cohorts(pick, ctx, self.policy)
        elif isinstance(self.policy, SpanGuard):
            chosen = self._guarded(pick, ctx.num_clients, self.policy)
        else:
            raise TypeError(f"no selection rule for policy {type(self.policy).__name__}")
        self.history.append(chosen)
        return chosen

    @staticmethod
    def _cohorts(pick: tuple[int, ...], ctx: SelectionContext, policy: FixedCohorts) -> tuple[int, ...]:
        groups = policy.cohorts
        mean = sum(len(g) for g in groups) / len(groups)
        wanted = min(len(groups), max(1, round(ctx.clients_per_round / mean)))
        ties = ctx.rng.permutation(len(groups))
        order = sorted(range(len(groups)), key=lambda i: (-len(set(groups[i]) & set(pick)), int(ties[i])))
        return tuple(sorted(c for i in order[:wanted] for c in groups[i]))

    def _guarded(self, pick: tuple[int, ...], num_clients: int, policy: SpanGuard) -> tuple[int, ...]:
        if policy.violation(self.history, pick, num_clients=num_clients) is None:
            return pick
        self.fallbacks += 1
        earlier = list(dict.fromkeys(self.history))
        if not earlier:
            raise RuntimeError(f"the guard admits no set of the {len(pick)} clients picked (k = {policy.k}); "
                               "pick at least k clients per round")
        last = {s: i for i, s in enumerate(self.history)}
        return max(earlier, key=lambda s: (len(set(s) & set(pick)), -last[s]))

    def state_dict(self) -> dict[str, Any]:
        return {"inner": self.inner.state_dict(), "history": [list(s) for s in self.history],
                "fallbacks": self.fallbacks}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if not state:
            self.inner.load_state_dict({})
            self.history, self.fallbacks = [], 0
            return
        self.inner.load_state_dict(state["inner"])
        self.history = [tuple(int(c) for c in s) for s in state["history"]]
        self.fallbacks = int(state["fallbacks"])
