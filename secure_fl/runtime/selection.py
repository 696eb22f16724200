"""Client selection strategies by name: ``random`` and ``fixed`` here; greedy and Dubhe register later.

Selection lives on the server, in one place: a :class:`SelectionStrategy` picks the round's
clients from the ids ``0 .. num_clients-1``. It gets the run's statistics coordinator in
:meth:`SelectionStrategy.setup` (a strategy that needs the clients' knowledge asks for it as
declared statistics: greedy's label counts, Dubhe's encrypted registries) and, each round, a
:class:`SelectionContext` whose ``rng`` is derived from the run seed and the round only, so a
resumed run selects exactly the same clients. State that must survive a resume goes through
``state_dict`` / ``load_state_dict``. A strategy whose statistics clients compute names its
client half in :attr:`SelectionStrategy.Client` (a :class:`SelectionClient`, in each node), and
the protocols those statistics must go through in :attr:`SelectionStrategy.protocols`.

New strategies register with :func:`register_selection`; :func:`selection_class` also
imports :mod:`secure_fl.selection` (if installed) the first time a name is unknown, so
strategies defined there are found by name from a config.
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar, TypeVar

import numpy as np

from secure_fl.stats import Learned, StatisticDeclaration
from secure_fl.stats.coordinator import StatsCoordinator

__all__ = [
    "SELECTION_STRATEGIES",
    "FixedSelection",
    "SelectionClient",
    "RandomSelection",
    "SelectionContext",
    "SelectionStrategy",
    "make_selection",
    "register_selection",
    "selection_class",
]

EXTENSION_MODULE = "secure_fl.selection"


@dataclass(eq=False)
class SelectionContext:
    round: int
    num_clients: int
    clients_per_round: int
    rng: np.random.Generator
    stats: StatsCoordinator


class SelectionClient:
    """A selection strategy's client half: the statistics it computes from the client's own data.

    ``sources`` maps a statistic name to a function of the node's
    :class:`~secure_fl.algorithms.ContributionContext`; :meth:`learned` hears what the client
    learned (Dubhe's registry sum); :meth:`state_dict` is part of the node's snapshot.
    """

    def __init__(self, strategy: SelectionStrategy, *, num_classes: int) -> None:
        self.strategy = strategy
        self.num_classes = num_classes
        self.sources: dict[str, Callable[[Any], Any]] = {}

    def declarations(self) -> dict[str, StatisticDeclaration]:
        return {}

    def contribution(self, name: str, ctx: Any) -> Any:
        from protocols import PolicyError

        source = self.sources.get(name)
        if source is None:
            raise PolicyError(f"selection {self.strategy.name!r} asks clients for no statistic {name!r}")
        return source(ctx)

    def learned(self, learned: Learned, ctx: Any) -> None:
        """A statistic this client learned."""

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if state:
            raise ValueError(f"selection {self.strategy.name!r} keeps no client state, got keys {sorted(state)}")


class SelectionStrategy(ABC):
    """Picks ``clients_per_round`` distinct client ids per round. Subclasses are frozen dataclasses."""

    name: ClassVar[str]
    Client: ClassVar[type[SelectionClient] | None] = None
    """The client half, when the strategy asks clients for statistics."""
    protocols: ClassVar[Mapping[str, str]] = {}
    """Statistics the strategy needs through a fixed protocol (greedy reads counts in the clear)."""

    def setup(self, *, num_clients: int, num_classes: int, stats: StatsCoordinator) -> None:
        """Once per run (and on resume), before the first selection, on the server."""

    def client(self, *, num_classes: int) -> SelectionClient | None:
        """A node's client half of this strategy (``None`` when the strategy needs none)."""
        return None if self.Client is None else self.Client(self, num_classes=num_classes)

    def sessions(self) -> dict[tuple[str, str], Any]:
        """Protocol sessions of its own the strategy uses besides the run's: (protocol, tag) → options."""
        return {}

    @abstractmethod
    def select(self, ctx: SelectionContext) -> tuple[int, ...]:
        """The round's clients, sorted ascending."""

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if state:
            raise ValueError(f"selection {self.name!r} keeps no state, got keys {sorted(state)}")

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> SelectionStrategy:
        """The strategy from a config's flat ``[selection]`` keys (its init fields by default)."""
        refuse_unknown(cls.name, params, {f.name for f in fields(cls) if f.init})  # type: ignore[arg-type]
        return cls(**params)


def refuse_unknown(name: str, params: Mapping[str, Any], known: set[str]) -> None:
    """A typed error naming the parameters a selection does not know, and those it does."""
    unknown = sorted(set(params) - known)
    if unknown:
        raise ValueError(
            f"unknown parameter(s) {', '.join(unknown)} for selection {name!r}; "
            f"known: {', '.join(sorted(known)) or 'none'}"
        )


SELECTION_STRATEGIES: dict[str, type[SelectionStrategy]] = {}

S = TypeVar("S", bound=type[SelectionStrategy])


def register_selection(name: str) -> Callable[[S], S]:
    if name != name.lower():
        raise ValueError(f"selection names are lower-case, got {name!r}")

    def deco(cls: S) -> S:
        if name in SELECTION_STRATEGIES and SELECTION_STRATEGIES[name] is not cls:
            raise ValueError(f"selection {name!r} is already registered")
        cls.name = name
        SELECTION_STRATEGIES[name] = cls
        return cls

    return deco


def selection_class(name: str) -> type[SelectionStrategy]:
    if name not in SELECTION_STRATEGIES:
        try:
            importlib.import_module(EXTENSION_MODULE)
        except ModuleNotFoundError as error:
            if error.name != EXTENSION_MODULE:
                raise
    try:
        return SELECTION_STRATEGIES[name]
    except KeyError:
        raise ValueError(
            f"unknown selection {name!r}; known: {', '.join(sorted(SELECTION_STRATEGIES))}"
        ) from None


def make_selection(name: str, params: Mapping[str, Any] | None = None) -> SelectionStrategy:
    return selection_class(name).from_params(dict(params or {}))


@register_selection("random")
@dataclass(frozen=True)
class RandomSelection(SelectionStrategy):
    """Uniformly at random without replacement (every client when clients_per_round = N)."""

    def select(self, ctx: SelectionContext) -> tuple[int, ...]:
        if ctx.clients_per_round >= ctx.num_clients:
            return tuple(range(ctx.num_clients))
        chosen = ctx.rng.choice(ctx.num_clients, size=ctx.clients_per_round, replace=False)
        return tuple(sorted(int(c) for c in chosen))


@dataclass
class _Fixed:
    """The clients a :class:`FixedSelection` drew, and the population size they were drawn from."""

    clients: tuple[int, ...] | None = None
    num_clients: int | None = None


@register_selection("fixed")
@dataclass(frozen=True)
class FixedSelection(SelectionStrategy):
    """The first round's clients in every round (Ratio Loss, Table 2: "to keep Γ unchanged").

    Round 0 draws exactly as ``random`` does with that round's seeded generator; later rounds
    reuse the draw. The draw is saved in ``state_dict`` with every checkpoint, so a resumed run
    keeps the same clients (the round-0 generator is not available at a later round to re-draw).
    """

    _fixed: _Fixed = field(default_factory=_Fixed, init=False, repr=False, compare=False)

    @property
    def clients(self) -> tuple[int, ...] | None:
        """The fixed clients, or ``None`` before round 0 was selected (or restored)."""
        return self._fixed.clients

    def select(self, ctx: SelectionContext) -> tuple[int, ...]:
        if ctx.clients_per_round < 1 or ctx.clients_per_round > ctx.num_clients:
            raise ValueError(
                f"selection 'fixed' needs 1 <= clients_per_round <= num_clients, "
                f"got clients_per_round={ctx.clients_per_round}, num_clients={ctx.num_clients}"
            )
        fixed = self._fixed
        if fixed.clients is None:
            if ctx.round != 0:
                raise RuntimeError(
                    f"selection 'fixed' has no clients at round {ctx.round}: they are drawn at round 0 "
                    "and restored from the checkpoint on resume, which held none"
                )
            fixed.clients = RandomSelection().select(ctx)
            fixed.num_clients = ctx.num_clients
        if fixed.num_clients != ctx.num_clients or len(fixed.clients) != ctx.clients_per_round:
            raise ValueError(
                f"selection 'fixed' drew {len(fixed.clients)} of {fixed.num_clients} clients, but this round "
                f"asks for {ctx.clients_per_round} of {ctx.num_clients}"
            )
        return fixed.clients

    def state_dict(self) -> dict[str, Any]:
        if self._fixed.clients is None:
            return {}
        return {"clients": list(self._fixed.clients), "num_clients": self._fixed.num_clients}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if not state:
            self._fixed.clients, self._fixed.num_clients = None, None
            return
        unknown = sorted(set(state) - {"clients", "num_clients"})
        if unknown or "clients" not in state or "num_clients" not in state:
            raise ValueError(f"selection 'fixed' expects keys ['clients', 'num_clients'], got {sorted(state)}")
        clients = tuple(int(c) for c in state["clients"])
        num_clients = int(state["num_clients"])
        if not clients or list(clients) != sorted(set(clients)) or clients[0] < 0 or clients[-1] >= num_clients:
            raise ValueError(f"selection 'fixed': invalid stored clients {clients} for {num_clients} clients")
        self._fixed.clients, self._fixed.num_clients = clients, num_clients
