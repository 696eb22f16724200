"""The interface every federated method implements, and the registry of methods by name.

A method is one :class:`Algorithm` subclass whose hyper-parameters are a frozen dataclass
(its ``Params``), registered under a lower-case name with :func:`register_algorithm`. The
runtime drives it through these hooks, once per run or per round:

``setup(ctx: SetupContext)``
    before the first round (and again when a run resumes): declare and request the global
    statistics the method needs up front (FedShift's label histogram).
``broadcast(ctx: ServerContext) -> {name: tensor}``
    what the server sends every selected client besides the global model (SCAFFOLD's
    control variate); the runtime counts its bytes.
``client_update(ctx: ClientContext) -> ClientUpdate``
    client side: local training from the global model with the method's
    :class:`~secure_fl.algorithms.local.LocalObjective`; ``ctx.state`` is this client's own
    dict that persists across rounds (SCAFFOLD's c_i, CLIMB's λ_i).
``aggregate(updates, ctx: ServerContext) -> new global vector``
    server side, through ``ctx.weighted_mean`` / ``ctx.updates`` / ``ctx.stats`` so that
    every sum over clients goes through the configured protocol.
``after_round(updates, ctx: ServerContext)``
    after the new global model is set (Ratio Loss's monitor, CLIMB's dual step).
``round_metrics() -> {name: float}``
    after ``after_round``: the method's own per-round numbers (Ratio Loss's monitor cosine,
    CLIMB's λ̄), stored by the runtime next to the round's accuracy (``RoundRow.metrics``).
    Values put into ``ServerContext.metrics`` during ``aggregate`` / ``after_round`` are
    stored the same way.

Server-side state that must survive a resume goes through ``state_dict`` /
``load_state_dict``; client-side state lives in ``ctx.state`` (checkpointed by the runtime).

When the run enables DP-SGD (``[privacy.dp_sgd]``), :meth:`ClientContext.train` trains
through :meth:`~secure_fl.privacy.dpsgd.DPSGD.train_client` and keeps the client's accountant
in ``ctx.state["dp_sgd"]``; a method that trains by any other way than ``ctx.train`` is
refused by the runtime under DP-SGD.
"""

from __future__ import annotations

import math
import re
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields, is_dataclass
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

import numpy as np
import torch

from secure_fl.algorithms.local import (
    ClientData,
    FlatLayout,
    LocalObjective,
    LocalResult,
    LocalTrainer,
)
from secure_fl.stats import TOTAL_SAMPLES, GlobalStatistics, StatisticDeclaration

if TYPE_CHECKING:
    from secure_fl.privacy.dpsgd import DPSGD
    from secure_fl.stats.updates import UpdateSum

__all__ = [
    "ALGORITHMS",
    "DP_SGD_STATE",
    "Algorithm",
    "ClientContext",
    "ClientUpdate",
    "HeldOut",
    "ServerContext",
    "SetupContext",
    "algorithm_class",
    "check_round_metrics",
    "make_algorithm",
    "register_algorithm",
]

DP_SGD_STATE = "dp_sgd"
"""Key of the DP-SGD accountant state (``DPSGDState.to_dict()``) in a client's ``ctx.state``."""


@dataclass(frozen=True, eq=False)
class ClientUpdate:
    """What a client hands back after local training (before any secure sum).

    ``delta`` is the local model minus the global one (flat); ``extras`` carries further
    vectors a method sums (SCAFFOLD's control-variate change). ``loss`` is the mean batch
    loss of local training.
    """

    client_id: int
    delta: torch.Tensor
    num_samples: int
    steps: int
    loss: float
    extras: Mapping[str, torch.Tensor] = field(default_factory=dict)


@dataclass(frozen=True, eq=False)
class HeldOut:
    """Training samples that no client holds: rows ``index`` of the training set ``(x, y)``.

    Server-side data (Ratio Loss's monitor draws its auxiliary samples here). It refers to the
    training arrays instead of copying them, so a run whose clients use a small subset of a
    large set does not pay for the rest twice; :meth:`take` copies only the rows asked for.
    ``index`` is sorted, so positions follow the training set's order.
    """

    x: np.ndarray
    y: np.ndarray
    index: np.ndarray

    def __post_init__(self) -> None:
        if self.index.ndim != 1 or (self.index.size and (self.index.min() < 0 or self.index.max() >= len(self.y))):
            raise ValueError("held-out rows must be a 1-d index into the training set")
        if np.any(np.diff(self.index) <= 0):
            raise ValueError("held-out rows must be sorted and distinct")

    def __len__(self) -> int:
        return int(self.index.size)

    @property
    def labels(self) -> np.ndarray:
        return np.asarray(self.y[self.index])

    def take(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(x, y)`` of the held-out samples at ``positions`` (0 .. len − 1)."""
        rows = self.index[np.asarray(positions, dtype=np.int64)]
        return np.asarray(self.x[rows]), np.asarray(self.y[rows])


@dataclass(eq=False)
class SetupContext:
    """What a method may use before training. ``clients`` is client-side knowledge only."""

    num_clients: int
    num_classes: int
    dimension: int
    stats: GlobalStatistics
    clients: Mapping[int, ClientData]
    device: torch.device
    holdout: HeldOut | None = None
    """Training samples outside every client's data (server side); ``None`` when the runtime has none."""
    trainer: LocalTrainer | None = None
    """The run's model (with its flat layout), local-training recipe and loss: public knowledge the
    server shares. Server-side code may evaluate a global vector on ``trainer.model`` and must
    restore its weights; ``None`` when the runtime gives no model."""


@dataclass(eq=False)
class ClientContext:
    """One client's view during one round: its data, its persistent state, the broadcast."""

    round: int
    data: ClientData
    state: dict[str, Any]
    global_vector: torch.Tensor
    broadcast: Mapping[str, torch.Tensor]
    lr: float
    num_clients: int
    num_classes: int
    trainer: LocalTrainer
    shuffle: torch.Generator
    dp_sgd: DPSGD | None = None
    """The run's DP-SGD (``None``: plain local SGD); set by the runtime from ``[privacy.dp_sgd]``."""
    dp_epsilon: float | None = None
    """This client's DP-SGD ε so far, after :meth:`train` ran under DP-SGD."""
    trainings: int = 0
    """How many times :meth:`train` ran for this client this round."""

    @property
    def client_id(self) -> int:
        return self.data.client_id

    @property
    def layout(self) -> FlatLayout:
        return self.trainer.layout

    def train(self, objective: LocalObjective | None = None) -> LocalResult:
        """Local SGD from the global model with the run's client optimiser and loss.

        Under DP-SGD: the same model, optimiser, loss, epochs and B through
        :meth:`DPSGD.train_client <secure_fl.privacy.dpsgd.DPSGD.train_client>` (per-sample
        clipping, Gaussian noise, Poisson batches); the client's accountant state lives in
        ``self.state["dp_sgd"]`` and grows with every call.
        """
        self.trainings += 1
        if self.dp_sgd is None or self.data.num_samples == 0:
            return self.trainer.train(self.data, self.global_vector, lr=self.lr, shuffle=self.shuffle,
                                      objective=objective)
        from secure_fl.privacy.dpsgd import DPSGDState

        state = DPSGDState.from_dict(self.state.get(DP_SGD_STATE))
        local, result = self.dp_sgd.train_client(self.trainer, self.data, self.global_vector, lr=self.lr,
                                                 objective=objective, state=state)
        self.state[DP_SGD_STATE] = result.state.to_dict()
        self.dp_epsilon = result.epsilon
        return local


@dataclass(eq=False)
class ServerContext:
    """The server's view of one round: the global model and the secure-sum services."""

    round: int
    global_vector: torch.Tensor
    selected: tuple[int, ...]
    num_clients: int
    stats: GlobalStatistics
    updates: UpdateSum
    metrics: dict[str, float] = field(default_factory=dict)
    """The round's method metrics: ``ctx.metrics["name"] = value`` in ``aggregate`` or
    ``after_round`` is stored with the round (as :meth:`Algorithm.round_metrics` values are)."""

    def weighted_mean(
        self,
        vectors: Mapping[int, torch.Tensor],
        weights: Mapping[int, float],
        *,
        statistic: str = "model_update",
        weight_statistic: StatisticDeclaration = TOTAL_SAMPLES,
    ) -> torch.Tensor:
        """Σ_i (a_i / Σ_j a_j) v_i with both sums secure.

        First the clients' weights a_i are summed as ``weight_statistic`` (its learners
        must include the clients); then each client scales its own vector by a_i / Σ a_j
        — client-side work, so every scaled entry stays within the update bound — and the
        scaled vectors are summed as ``statistic``.
        """
        if set(vectors) != set(weights):
            raise ValueError("weighted_mean needs a weight for every vector and no other")
        if "clients" not in weight_statistic.learners:
            raise ValueError(f"statistic {weight_statistic.name!r} must be learned by the clients to scale by it")
        ids = sorted(vectors)
        total = float(self.stats.request(
            weight_statistic, {c: np.array([weights[c]]) for c in ids}, round=self.round
        )[0])
        if total <= 0:
            raise ValueError(f"statistic {weight_statistic.name!r} summed to {total}; cannot average")
        scaled = {c: vectors[c] * (float(weights[c]) / total) for c in ids}
        return self.updates.sum(scaled, statistic=statistic, round=self.round)


class Algorithm(ABC):
    """A federated method. Subclasses set ``Params`` (a frozen dataclass) and register a name."""

    name: ClassVar[str]
    Params: ClassVar[type[Any]]

    def __init__(self, params: Any = None) -> None:
        params = self.Params() if params is None else params
        if not isinstance(params, self.Params):
            raise TypeError(f"{type(self).__name__} takes {self.Params.__name__}, got {type(params).__name__}")
        self.params = params

    def setup(self, ctx: SetupContext) -> None:
        """Before the first round (and on resume): request once-per-run statistics."""

    def broadcast(self, ctx: ServerContext) -> dict[str, torch.Tensor]:
        """Vectors the server sends each selected client with the global model."""
        return {}

    @abstractmethod
    def client_update(self, ctx: ClientContext) -> ClientUpdate:
        """Client side: train locally and return the update."""

    @abstractmethod
    def aggregate(self, updates: Sequence[ClientUpdate], ctx: ServerContext) -> torch.Tensor:
        """Server side: the new global flat vector from the round's updates."""

    def after_round(self, updates: Sequence[ClientUpdate], ctx: ServerContext) -> None:
        """After the new global model is in place."""

    def round_metrics(self) -> Mapping[str, float]:
        """The method's numbers for the round that just ended (after ``after_round``).

        Names are ``[A-Za-z][A-Za-z0-9_.-]*`` (at most 64 characters), values real numbers
        (``None``, ``nan`` and ``inf`` are stored as missing). The runtime stores them per round
        (``RoundRow.metrics``), shows them in ``secure-fl run``'s table and in the JSON
        ``metrics`` object. Server-side knowledge only: what the method has learned.
        """
        return {}

    def state_dict(self) -> dict[str, Any]:
        """Server-side state to checkpoint (tensors are fine)."""
        return {}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if state:
            raise ValueError(f"{self.name} keeps no state, got keys {sorted(state)}")

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, **{f.name: getattr(self.params, f.name) for f in fields(self.params)}}


_METRIC_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_.\-]{0,63}$")


def check_round_metrics(values: Mapping[str, Any], *, source: str) -> dict[str, float | None]:
    """Validated copy of a method's round metrics: str names, real values (None/non-finite → None)."""
    if not isinstance(values, Mapping):
        raise TypeError(f"{source}: round metrics must be a mapping of name to number, got {type(values).__name__}")
    out: dict[str, float | None] = {}
    for name, value in values.items():
        if not isinstance(name, str) or not _METRIC_NAME.match(name):
            raise ValueError(f"{source}: metric name {name!r} must match [A-Za-z][A-Za-z0-9_.-]* (<= 64 chars)")
        if value is None:  # "no value this round"
            out[name] = None
            continue
        if isinstance(value, torch.Tensor) and value.numel() == 1:
            value = value.item()
        if isinstance(value, np.generic):
            value = value.item()
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError(f"{source}: metric {name!r} must be a real number, got {value!r}")
        number = float(value)
        out[name] = number if math.isfinite(number) else None
    return out


ALGORITHMS: dict[str, type[Algorithm]] = {}

A = TypeVar("A", bound=type[Algorithm])


def register_algorithm(name: str) -> Callable[[A], A]:
    """Class decorator: make a method available under its lower-case registry ``name``."""
    if name != name.lower():
        raise ValueError(f"algorithm names are lower-case, got {name!r}")

    def deco(cls: A) -> A:
        if name in ALGORITHMS and ALGORITHMS[name] is not cls:
            raise ValueError(f"algorithm {name!r} is already registered to {ALGORITHMS[name].__qualname__}")
        params = getattr(cls, "Params", None)
        options = getattr(params, "__dataclass_params__", None)
        if not (isinstance(params, type) and is_dataclass(params) and options is not None and options.frozen):
            raise TypeError(f"{cls.__qualname__}.Params must be a frozen dataclass")
        cls.name = name
        ALGORITHMS[name] = cls
        return cls

    return deco


def algorithm_class(name: str) -> type[Algorithm]:
    try:
        return ALGORITHMS[name]
    except KeyError:
        raise ValueError(f"unknown method {name!r}; known: {', '.join(sorted(ALGORITHMS))}") from None


def make_algorithm(name: str, params: Mapping[str, Any] | None = None) -> Algorithm:
    """Build a method from its name and hyper-parameters; unknown parameters are named in the error."""
    cls = algorithm_class(name)
    given = dict(params or {})
    known = {f.name for f in fields(cls.Params)}
    unknown = sorted(set(given) - known)
    if unknown:
        raise ValueError(
            f"unknown parameter(s) {', '.join(unknown)} for method {name!r}; "
            f"known: {', '.join(sorted(known)) or 'none'}"
        )
    return cls(cls.Params(**given))
