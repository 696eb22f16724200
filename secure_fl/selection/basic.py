"""Selections that need no client knowledge: ``random`` and ``fixed``."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .strategy import SelectionContext, SelectionStrategy, register_selection

__all__ = ["FixedSelection", "RandomSelection"]


def draw_uniform(ctx: SelectionContext) -> tuple[int, ...]:
    """K of N uniformly without replacement with the round's generator (everyone when K >= N)."""
    if ctx.clients_per_round >= ctx.num_clients:
        return tuple(range(ctx.num_clients))
    chosen = ctx.rng.choice(ctx.num_clients, size=ctx.clients_per_round, replace=False)
    return tuple(sorted(int(c) for c in chosen))


@register_selection("random")
@dataclass(eq=False)
class RandomSelection(SelectionStrategy):
    """Uniformly at random without replacement (every client when clients_per_round = N)."""

    def select(self, ctx: SelectionContext) -> tuple[int, ...]:
        return draw_uniform(ctx)


@register_selection("fixed")
@dataclass(eq=False)
class FixedSelection(SelectionStrategy):
    """The first round's clients in every round (Ratio Loss, Table 2: "to keep Γ unchanged").

    Round 0 draws exactly as ``random`` does with that round's seeded generator; later rounds
    reuse the draw. The draw is saved in ``state_dict`` with every checkpoint, so a resumed run
    keeps the same clients (the round-0 generator is not available at a later round to re-draw).
    """

    clients: tuple[int, ...] | None = field(default=None, init=False)
    """The fixed clients, or ``None`` before round 0 was selected (or restored)."""
    num_clients: int | None = field(default=None, init=False)
    """The population size they were drawn from."""

    def select(self, ctx: SelectionContext) -> tuple[int, ...]:
        if ctx.clients_per_round < 1 or ctx.clients_per_round > ctx.num_clients:
            raise ValueError(
                f"selection 'fixed' needs 1 <= clients_per_round <= num_clients, "
                f"got clients_per_round={ctx.clients_per_round}, num_clients={ctx.num_clients}"
            )
        if self.clients is None:
            if ctx.round != 0:
                raise RuntimeError(
                    f"selection 'fixed' has no clients at round {ctx.round}: they are drawn at round 0 "
                    "and restored from the checkpoint on resume, which held none"
                )
            self.clients, self.num_clients = draw_uniform(ctx), ctx.num_clients
        if self.num_clients != ctx.num_clients or len(self.clients) != ctx.clients_per_round:
            raise ValueError(
                f"selection 'fixed' drew {len(self.clients)} of {self.num_clients} clients, but this round "
                f"asks for {ctx.clients_per_round} of {ctx.num_clients}"
            )
        return self.clients

    def state_dict(self) -> dict[str, Any]:
        if self.clients is None:
            return {}
        return {"clients": list(self.clients), "num_clients": self.num_clients}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if not state:
            self.clients, self.num_clients = None, None
            return
        unknown = sorted(set(state) - {"clients", "num_clients"})
        if unknown or "clients" not in state or "num_clients" not in state:
            raise ValueError(f"selection 'fixed' expects keys ['clients', 'num_clients'], got {sorted(state)}")
        clients = tuple(int(c) for c in state["clients"])
        num_clients = int(state["num_clients"])
        if not clients or list(clients) != sorted(set(clients)) or clients[0] < 0 or clients[-1] >= num_clients:
            raise ValueError(f"selection 'fixed': invalid stored clients {clients} for {num_clients} clients")
        self.clients, self.num_clients = clients, num_clients
