"""The interface every federated method implements: a server half and a client half.

A method is a :class:`Method` subclass registered by name (:func:`register_algorithm`) with
frozen dataclass hyper-parameters (``Params``), a ``Server`` class (a :class:`ServerMethod`)
and a ``Client`` class (a :class:`ClientMethod`). The two halves share only the frozen params
and the run's public :class:`RunInfo`; everything else crosses the network as messages.

Server half (one per run, on the server), driven by the server loop:

``setup(ctx: ServerSetup)``
    before the first round (and again on resume): request once-per-run statistics from every
    client (FedShift's label histogram); ``ctx.holdout`` is the server's own data where a paper
    gives it some (Ratio Loss's auxiliary set), ``ctx.model`` its copy of the public model.
``broadcast(ctx: ServerRound) -> {name: tensor}``
    vectors sent to the round's cohort with the global model (SCAFFOLD's control variate).
``aggregate(ctx: ServerRound) -> new global vector``
    through ``ctx.weighted_mean`` / ``ctx.updates.sum`` / ``ctx.stats.request``: the server gets
    releases (:class:`~secure_fl.stats.Release`) — aggregates, never a client's own value when
    the statistic goes through a secure protocol.
``after_round(ctx)``, ``round_metrics()``, ``state_dict()`` / ``load_state_dict()``.

Client half (one per client, in its node; the node keeps its persistent ``state`` dict, which
serialises to bytes with the node's snapshot):

``train(ctx: ClientContext) -> LocalUpdate``
    local training from the broadcast model; what it returns stays in the node.
``contribution(name, ctx: ContributionContext)``
    this client's vector of a statistic the server opened (the node checks the request first).
    The base class answers ``total_samples`` (|D_i|) and ``model_update`` (the update scaled by
    :meth:`ClientMethod.update_weight`); subclasses add theirs to :attr:`ClientMethod.sources`.
``learned(learned: Learned, ctx: ClientState)``
    a statistic this client learned (FedShift's prior, CLIMB's f̄ and λ̄).

The simulator's harness may also ask the :class:`Method` for :meth:`Method.simulator_telemetry`:
numbers scored against every client's data, which no party holds (stored prefixed ``sim.``).

Under DP-SGD (``[privacy.dp_sgd]``) :meth:`ClientContext.train` trains through
:meth:`~secure_fl.privacy.dpsgd.DPSGD.train_client`; a method that trains any other way is
refused by the node.
"""

from __future__ import annotations

import math
import re
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, is_dataclass
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

import numpy as np
import numpy.typing as npt
import torch

from protocols import PolicyError
from secure_fl.stats import (
    MODEL_UPDATE,
    TOTAL_SAMPLES,
    Learned,
    Release,
    StatisticDeclaration,
    UpdateSettings,
)
from secure_fl.suggest import did_you_mean
from secure_fl.training import (
    ClientData,
    FlatLayout,
    LocalObjective,
    LocalResult,
    LocalTrainer,
    LocalTraining,
)

if TYPE_CHECKING:
    from secure_fl.privacy.dpsgd import DPSGD
    from secure_fl.stats.coordinator import StatsCoordinator
    from secure_fl.stats.updates import UpdateSum

__all__ = [
    "ALGORITHMS",
    "DP_SGD_STATE",
    "SIMULATOR_TELEMETRY_PREFIX",
    "ClientContext",
    "ClientMethod",
    "ClientState",
    "ContributionContext",
    "HeldOut",
    "LocalUpdate",
    "Method",
    "RunInfo",
    "ServerMethod",
    "ServerRound",
    "ServerSetup",
    "algorithm_class",
    "check_round_metrics",
    "make_algorithm",
    "register_algorithm",
]

DP_SGD_STATE = "dp_sgd"
"""Key of the DP-SGD accountant state (``DPSGDState.to_dict()``) in a client's state."""

Vector = torch.Tensor | npt.NDArray[Any]


@dataclass(frozen=True, kw_only=True)
class RunInfo:
    """What both halves of a method know of the run: public parameters only."""

    num_clients: int
    num_classes: int
    dimension: int
    rounds: int
    training: LocalTraining
    updates: UpdateSettings


@dataclass(frozen=True, eq=False)
class HeldOut:
    """Training samples that no client holds: rows ``index`` of the training set ``(x, y)``.

    Server-side data (Ratio Loss's monitor draws its auxiliary samples here). It refers to the
    training arrays instead of copying them; :meth:`take` copies only the rows asked for.
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


# --- the server half ---------------------------------------------------------------------------

@dataclass(eq=False)
class ServerSetup:
    """What the server half may use before training: public facts, its own data and model."""

    info: RunInfo
    stats: StatsCoordinator
    clients: tuple[int, ...]
    device: torch.device
    holdout: HeldOut | None = None
    """Training samples outside every client's data (the server's own); ``None`` when there are none."""
    model: LocalTrainer | None = None
    """The server's copy of the public model, recipe and loss: it may evaluate global vectors on it."""


@dataclass(eq=False)
class ServerRound:
    """The server's view of one round: the global model, the cohort and the secure sums."""

    round: int
    global_vector: torch.Tensor
    cohort: tuple[int, ...]
    info: RunInfo
    stats: StatsCoordinator
    updates: UpdateSum
    metrics: dict[str, float] = field(default_factory=dict)
    """The round's method metrics (stored with the round, as :meth:`ServerMethod.round_metrics`)."""
    releases: list[Release] = field(default_factory=list)
    """This round's releases so far (the runtime reports clipping from them)."""

    @property
    def num_clients(self) -> int:
        return self.info.num_clients

    def request(self, declaration: StatisticDeclaration, *, cohort: tuple[int, ...] | None = None) -> Release:
        release = self.stats.request(declaration, cohort=self.cohort if cohort is None else cohort, round=self.round)
        self.releases.append(release)
        return release

    def update_sum(self, statistic: str, *, cohort: tuple[int, ...] | None = None) -> torch.Tensor:
        total, release = self.updates.sum(statistic, cohort=self.cohort if cohort is None else cohort,
                                          round=self.round)
        self.releases.append(release)
        return total

    def weighted_mean(self, *, statistic: str = MODEL_UPDATE,
                      weight: StatisticDeclaration = TOTAL_SAMPLES) -> torch.Tensor:
        """Σ_i (a_i / Σ_j a_j) v_i with both sums secure.

        First the weights a_i are summed as ``weight`` (learned by the clients, which scale their
        own vector by a_i / Σ a_j — client-side, so every scaled entry stays within the update
        bound); then the contributors of that sum send their scaled vectors as ``statistic``.

        When ``weight`` repeated an earlier release (a constant statistic, ``reused_from``) and a
        client it counts sent no vector, the weights are summed again over those who did and the
        sum rescaled by the ratio of the two totals: the mean a fresh sum would have given.
        """
        if "clients" not in weight.learners:
            raise ValueError(f"statistic {weight.name!r} must be learned by the clients to scale by it")
        total = self.request(weight)
        if total.value is not None and total.scalar() <= 0:
            hint = ("" if total.noise is None else
                    f": its distributed-DP noise (σ {total.noise.get('sigma_total', float('nan')):.3g} for a "
                    f"sensitivity of {total.noise.get('sensitivity', {}).get('linf', float('nan')):.3g}) "
                    f"swamps {len(total.contributors)} clients' counts; client-level counts need far more "
                    "clients per round: use [mitigation] counts = \"record\" or a larger epsilon")
            raise ValueError(f"statistic {weight.name!r} summed to {total.scalar():g}; cannot average{hint}")
        mean = self.update_sum(statistic, cohort=total.contributors)
        sent = self.releases[-1].contributors
        if total.reused_from is None or sent == total.contributors or not sent or total.value is None:
            return mean
        actual = self.request(weight, cohort=sent)
        if actual.value is None or actual.contributors != sent or actual.scalar() <= 0:
            return mean  # another client lost meanwhile: unscaled, as after a fresh total and a lost update
        return mean * float(total.scalar() / actual.scalar())


class ServerMethod(ABC):
    """A method's server half (see the module docstring)."""

    def __init__(self, params: Any, info: RunInfo) -> None:
        self.params = params
        self.info = info

    def setup(self, ctx: ServerSetup) -> None:
        """Before the first round (and on resume): request once-per-run statistics."""

    def broadcast(self, ctx: ServerRound) -> dict[str, torch.Tensor]:
        """Vectors the server sends each member of the cohort with the global model."""
        return {}

    @abstractmethod
    def aggregate(self, ctx: ServerRound) -> torch.Tensor:
        """The new global flat vector, from releases only."""

    def after_round(self, ctx: ServerRound) -> None:
        """After the new global model is in place."""

    def round_metrics(self) -> Mapping[str, float]:
        """The method's numbers for the round that just ended: server knowledge only."""
        return {}

    def state_dict(self) -> dict[str, Any]:
        """Server-side state to checkpoint (tensors are fine)."""
        return {}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if state:
            raise ValueError(f"{type(self).__name__} keeps no state, got keys {sorted(state)}")

    def describe(self) -> dict[str, Any]:
        return {}


# --- the client half ---------------------------------------------------------------------------

@dataclass(frozen=True, eq=False)
class LocalUpdate:
    """What local training produced; it stays in the client's node.

    ``delta`` is the local model minus the global one (flat); ``extras`` further vectors the
    client may contribute (SCAFFOLD's control-variate change); ``loss`` the mean batch loss.
    """

    delta: torch.Tensor
    num_samples: int
    steps: int
    loss: float
    extras: Mapping[str, torch.Tensor] = field(default_factory=dict)


@dataclass(eq=False)
class ClientState:
    """One client's own knowledge: its data, its persistent state and what it learned this round."""

    client_id: int
    round: int
    data: ClientData
    state: dict[str, Any]
    learned: dict[str, Learned]
    """Statistics this client learned in this round, by name."""


@dataclass(eq=False)
class ContributionContext(ClientState):
    """A client asked for its vector of a statistic."""

    update: LocalUpdate | None = None
    """This round's local update (``None`` before training)."""
    cohort_size: int = 0
    """How many clients the request asks (public: the request names them)."""


@dataclass(eq=False)
class ClientContext:
    """One client's view while training: its data, its persistent state, the broadcast."""

    round: int
    data: ClientData
    state: dict[str, Any]
    global_vector: torch.Tensor
    broadcast: Mapping[str, torch.Tensor]
    lr: float
    info: RunInfo
    trainer: LocalTrainer
    shuffle: torch.Generator
    dp_sgd: DPSGD | None = None
    """The run's DP-SGD (``None``: plain local SGD)."""
    dp_epsilon: float | None = None
    """This client's DP-SGD ε so far, after :meth:`train` ran under DP-SGD."""
    trainings: int = 0
    """How many times :meth:`train` ran for this client this round."""

    @property
    def client_id(self) -> int:
        return self.data.client_id

    @property
    def num_clients(self) -> int:
        return self.info.num_clients

    @property
    def num_classes(self) -> int:
        return self.info.num_classes

    @property
    def layout(self) -> FlatLayout:
        return self.trainer.layout

    def train(self, objective: LocalObjective | None = None) -> LocalResult:
        """Local SGD from the global model with the run's client optimiser and loss (DP-SGD when on)."""
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


Source = Callable[[ContributionContext], Vector]


class ClientMethod(ABC):
    """A method's client half (see the module docstring)."""

    update_statistics: ClassVar[tuple[str, ...]] = (MODEL_UPDATE,)
    """Model-sized statistics this half contributes to (declared from the run's update settings)."""

    def __init__(self, params: Any, info: RunInfo) -> None:
        self.params = params
        self.info = info
        self.sources: dict[str, Source] = {
            TOTAL_SAMPLES.name: lambda ctx: np.array([float(ctx.data.num_samples)]),
            MODEL_UPDATE: self.scaled_update,
        }
        """Statistic name → how this client computes its vector."""

    def declarations(self) -> dict[str, StatisticDeclaration]:
        """Every statistic this half contributes to, as declared (public)."""
        out = {TOTAL_SAMPLES.name: TOTAL_SAMPLES}
        for name in self.update_statistics:
            out[name] = self.info.updates.declaration(name)
        return out

    @abstractmethod
    def train(self, ctx: ClientContext) -> LocalUpdate:
        """Train locally from the broadcast model."""

    def local_objective(self, ctx: ClientContext) -> LocalObjective:
        """How this half changes plain local training for this client this round (class weights,
        a logit shift, a gradient correction). Public code: the leakage audit's attacker asks it
        too, for a client with hypothesised counts."""
        return LocalObjective()

    def contribution(self, name: str, ctx: ContributionContext) -> Vector:
        source = self.sources.get(name)
        if source is None:
            raise PolicyError(f"the client half of {type(self).__name__} contributes no statistic {name!r}")
        return source(ctx)

    def learned(self, learned: Learned, ctx: ClientState) -> None:
        """A statistic this client learned (the node also keeps it in ``ctx.learned`` for the round)."""

    # --- the weighted update -------------------------------------------------------------------

    def update_weight(self, ctx: ContributionContext) -> float:
        """The factor this client scales its update by: |D_i| / Σ_j |D_j| (FedAvg), from the round's
        ``total_samples`` it learned."""
        total = ctx.learned.get(TOTAL_SAMPLES.name)
        if total is None:
            raise PolicyError("asked for a weighted update before this round's total_samples reached this client")
        return float(ctx.data.num_samples) / float(total.value.reshape(-1)[0])

    def scaled_update(self, ctx: ContributionContext) -> torch.Tensor:
        if ctx.update is None:
            raise PolicyError("asked for a model update before this client trained in this round")
        return ctx.update.delta * self.update_weight(ctx)


# --- the method and its registry ---------------------------------------------------------------

class Method:
    """A registered method: its params and the classes of its two halves."""

    name: ClassVar[str]
    Params: ClassVar[type[Any]]
    Server: ClassVar[type[ServerMethod]]
    Client: ClassVar[type[ClientMethod]]

    def __init__(self, params: Any = None) -> None:
        params = self.Params() if params is None else params
        if not isinstance(params, self.Params):
            raise TypeError(f"{type(self).__name__} takes {self.Params.__name__}, got {type(params).__name__}")
        self.params = params

    def server(self, info: RunInfo) -> ServerMethod:
        return self.Server(self.params, info)

    def client(self, info: RunInfo) -> ClientMethod:
        return self.Client(self.params, info)

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, **{f.name: getattr(self.params, f.name) for f in fields(self.params)}}

    def simulator_telemetry(self, server: ServerMethod, *, round: int, cohort: tuple[int, ...],
                            class_counts: Mapping[int, npt.NDArray[np.int64]]) -> Mapping[str, float | None]:
        """Simulator telemetry of a finished round: the embedded engine's harness calls it, no party does.

        The harness knows every client's label counts (``class_counts``), which no party of the run
        may; a method can score its server half against them here (Ratio Loss: its monitor's estimate
        against the round's true composition). Real numbers by name, stored with the round's metrics
        under :data:`SIMULATOR_TELEMETRY_PREFIX` so that they never pass for a party's knowledge.
        """
        return {}


SIMULATOR_TELEMETRY_PREFIX = "sim."
"""Prefix of the stored names of :meth:`Method.simulator_telemetry` (they sit beside the method's own
round metrics in the run store, but are the harness's knowledge, not the server's)."""


_METRIC_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_.\-]{0,63}$")


def check_round_metrics(values: Mapping[str, Any], *, source: str) -> dict[str, float | None]:
    """Validated copy of a method's round metrics: str names, real values (None/non-finite → None)."""
    if not isinstance(values, Mapping):
        raise TypeError(f"{source}: round metrics must be a mapping of name to number, got {type(values).__name__}")
    out: dict[str, float | None] = {}
    for name, value in values.items():
        if not isinstance(name, str) or not _METRIC_NAME.match(name):
            raise ValueError(f"{source}: metric name {name!r} must match [A-Za-z][A-Za-z0-9_.-]* (<= 64 chars)")
        if value is None:
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


ALGORITHMS: dict[str, type[Method]] = {}

M = TypeVar("M", bound=type[Method])


def register_algorithm(name: str) -> Callable[[M], M]:
    """Class decorator: make a method available under its lower-case registry ``name``."""
    if name != name.lower():
        raise ValueError(f"algorithm names are lower-case, got {name!r}")

    def deco(cls: M) -> M:
        if name in ALGORITHMS and ALGORITHMS[name] is not cls:
            raise ValueError(f"algorithm {name!r} is already registered to {ALGORITHMS[name].__qualname__}")
        params = getattr(cls, "Params", None)
        options = getattr(params, "__dataclass_params__", None)
        if not (isinstance(params, type) and is_dataclass(params) and options is not None and options.frozen):
            raise TypeError(f"{cls.__qualname__}.Params must be a frozen dataclass")
        for half, base in (("Server", ServerMethod), ("Client", ClientMethod)):
            if not (isinstance(getattr(cls, half, None), type) and issubclass(getattr(cls, half), base)):
                raise TypeError(f"{cls.__qualname__}.{half} must be a {base.__name__} subclass")
        cls.name = name
        ALGORITHMS[name] = cls
        return cls

    return deco


def algorithm_class(name: str) -> type[Method]:
    try:
        return ALGORITHMS[name]
    except KeyError:
        raise ValueError(f"unknown method {name!r}{did_you_mean(name, ALGORITHMS)}; "
                         f"known: {', '.join(sorted(ALGORITHMS))}") from None


def make_algorithm(name: str, params: Mapping[str, Any] | None = None) -> Method:
    """Build a method from its name and hyper-parameters; unknown parameters are named in the error."""
    cls = algorithm_class(name)
    given = dict(params or {})
    known = {f.name for f in fields(cls.Params)}
    unknown = sorted(set(given) - known)
    if unknown:
        raise ValueError(
            f"unknown parameter(s) {', '.join(unknown)} for method {name!r}{did_you_mean(unknown[0], known)}; "
            f"known: {', '.join(sorted(known)) or 'none'}"
        )
    return cls(cls.Params(**given))
