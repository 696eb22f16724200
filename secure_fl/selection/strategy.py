"""Client selection in a run: a strategy's server half, its client half, and the registry by name.

A :class:`SelectionStrategy` is the server's half: it picks each round's clients from the ids
``0 .. num_clients-1`` (:meth:`SelectionStrategy.select`). It holds only what the server may
know — its public parameters, releases of the statistics it asked for, what clients announced
— and asks for client knowledge as declared statistics through the run's
:class:`~secure_fl.stats.coordinator.StatsCoordinator` (greedy's label counts, Dubhe's
registries). The :class:`SelectionContext` of a round gives it a generator keyed by the run
seed and the round only, so a resumed run selects the same clients, and a way to announce
public values to every client (Dubhe's σ).

A strategy that asks clients for statistics names its client half in
:attr:`SelectionStrategy.Client`: a :class:`SelectionClient` lives in each client node and
computes those statistics from the client's own counts and its own seeded generator
(:class:`ClientSelectionContext`), hears what the client learned and what the server
announced, and keeps its state in the node's snapshot.

Strategies are dataclasses whose init fields are a config's flat ``[selection]`` keys; what a
strategy gathers during a run lives in its ``init=False`` fields and goes through
``state_dict`` / ``load_state_dict`` (the checkpoint). They register by name with
:func:`register_selection`; :func:`make_selection` builds one from a config.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

import numpy as np
import numpy.typing as npt

from protocols import AbortedError, PolicyError
from secure_fl.stats import Learned, StatisticDeclaration
from secure_fl.suggest import did_you_mean

if TYPE_CHECKING:
    from secure_fl.stats.coordinator import StatsCoordinator

__all__ = [
    "SELECTION_STRATEGIES",
    "Announce",
    "ClientSelectionContext",
    "SelectionClient",
    "SelectionContext",
    "SelectionStrategy",
    "ask_each",
    "make_selection",
    "refuse_unknown",
    "register_selection",
    "selection_class",
]

Announce = Callable[[str, npt.NDArray[np.float64]], None]
"""Queue a public, named vector for every client (delivered with the server's next exchange)."""


@dataclass(eq=False)
class SelectionContext:
    """One round as the server's half sees it."""

    round: int
    num_clients: int
    clients_per_round: int
    rng: np.random.Generator
    """Keyed by the run seed and the round only."""
    stats: StatsCoordinator
    announce: Announce | None = None
    """``None`` where the caller cannot reach the clients (a strategy that needs it says so)."""


@dataclass(frozen=True, eq=False)
class ClientSelectionContext:
    """What a node gives its selection half when asked for a statistic: its own counts and coins."""

    client_id: int
    round: int
    counts: npt.NDArray[np.int64]
    """This client's label counts (its private knowledge)."""
    rng: Callable[..., np.random.Generator]
    """``rng(stream, *keys)``: this client's generator keyed by (stream, round, client, *keys), so
    its draws are the same in a resumed run."""


class SelectionClient:
    """A strategy's client half (see the module docstring).

    ``sources`` maps a declared statistic to a function of the :class:`ClientSelectionContext`;
    :attr:`announcements` names the server's announcements this half listens to.
    """

    announcements: ClassVar[frozenset[str]] = frozenset()

    def __init__(self, strategy: SelectionStrategy, *, num_classes: int) -> None:
        self.strategy = strategy
        self.num_classes = num_classes
        self.sources: dict[str, Callable[[ClientSelectionContext], npt.NDArray[Any]]] = {}

    def declarations(self) -> dict[str, StatisticDeclaration]:
        return {}

    def contribution(self, name: str, ctx: ClientSelectionContext) -> npt.NDArray[Any]:
        source = self.sources.get(name)
        if source is None:
            raise PolicyError(f"selection {self.strategy.name!r} asks clients for no statistic {name!r}")
        return source(ctx)

    def learned(self, learned: Learned) -> None:
        """A statistic this client learned (Dubhe's registry sum)."""

    def heard(self, name: str, round: int, vector: npt.NDArray[np.float32]) -> None:
        """An announcement of the server (one of :attr:`announcements`); raise
        :class:`~protocols.PolicyError` to refuse it."""
        raise PolicyError(f"selection {self.strategy.name!r} listens to no announcement {name!r}")

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if state:
            raise ValueError(f"selection {self.strategy.name!r} keeps no client state, got keys {sorted(state)}")


class SelectionStrategy(ABC):
    """The server's half: ``clients_per_round`` distinct client ids per round."""

    name: ClassVar[str]
    Client: ClassVar[type[SelectionClient] | None] = None
    """The client half, when the strategy asks clients for statistics."""
    protocols: ClassVar[Mapping[str, str]] = {}
    """Statistics that go through a fixed protocol whatever the run's (greedy reads counts in the clear)."""

    def setup(self, *, num_clients: int, num_classes: int, stats: StatsCoordinator) -> None:
        """Once per run (and again on resume, before ``load_state_dict``), on the server."""

    def client(self, *, num_classes: int) -> SelectionClient | None:
        """A node's client half of this strategy (``None`` when the strategy needs none)."""
        return None if self.Client is None else self.Client(self, num_classes=num_classes)

    def sessions(self) -> dict[tuple[str, str], Any]:
        """Protocol sessions of its own besides the run's: (protocol, tag) → options."""
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


def ask_each(ctx: SelectionContext, declaration: StatisticDeclaration) -> npt.NDArray[np.float64]:
    """Each client's vector of ``declaration``, asked of it alone (rows of zeros for the silent).

    For what the server must read per client (greedy's counts, Dubhe's volunteers): a request of
    one client through a protocol that reveals the sum to the server reveals that client's vector.
    """
    rows = np.zeros((ctx.num_clients, declaration.length))
    for client in range(ctx.num_clients):
        try:
            release = ctx.stats.request(declaration, cohort=[client], round=ctx.round)
        except AbortedError:  # lost or refused: nothing from this client
            continue
        if release.value is not None and release.contributors == (client,):
            rows[client] = release.value
    return rows


def refuse_unknown(name: str, params: Mapping[str, Any], known: set[str]) -> None:
    """A typed error naming the parameters a selection does not know, and those it does."""
    unknown = sorted(set(params) - known)
    if unknown:
        raise ValueError(
            f"unknown parameter(s) {', '.join(unknown)} for selection {name!r}{did_you_mean(unknown[0], known)}; "
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
    try:
        return SELECTION_STRATEGIES[name]
    except KeyError:
        raise ValueError(f"unknown selection {name!r}{did_you_mean(name, SELECTION_STRATEGIES)}; "
                         f"known: {', '.join(sorted(SELECTION_STRATEGIES))}") from None


def make_selection(name: str, params: Mapping[str, Any] | None = None) -> SelectionStrategy:
    return selection_class(name).from_params(dict(params or {}))
