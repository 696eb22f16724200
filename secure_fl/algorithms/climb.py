"""CLIMB (Shen, Cervino, Hassani, Ribeiro, ICLR 2022): FedAvg on the Lagrangian of
"every client's loss stays within ε of the mean loss".

The constrained problem ``min f̄(θ) s.t. f_i(θ) − f̄(θ) ≤ ε ∀i`` is solved by alternating

* **primal**: ``primal_steps`` rounds of FedAvg in which client i's update is scaled by
  ``w_i = 1 + λ_i − λ̄`` (Eq. 6: the Lagrangian is ``(1/N) Σ w_i f_i``);
* **dual**: ``λ_i ← clip(λ_i + s · (f_i(θ) − f̄(θ) − ε), 0, lambda_max)`` (Algorithm 1, line 6),
  with ``s = dual_lr / N`` (``dual_scaling = "num_clients"``, as the authors' code does) or
  ``s = dual_lr`` (``"none"``, the paper's literal step).

Who knows what (Remark 3.1). λ_i and f_i never leave client i. Two scalars are global, summed
over the round's clients through the configured protocol as one of two declared statistics:

``climb_dual`` (:data:`DUAL_SUM`)
    (Σ f_i(θ), Σ λ_i) at a dual round, one secure sum of a 2-vector: clients learn it (they need
    f̄ for their own dual step and λ̄ to weight their own update). Both are known to each client
    before the round's update is summed, so one sum — one protocol run, one key agreement — gives
    both; two sums would release exactly the same to the same parties at twice the cost.
``climb_lambda`` (:data:`LAMBDA_SUM`)
    Σ λ_i alone, at a primal round whose cohort differs from the last λ̄'s (partial
    participation with ``primal_steps > 1``): clients learn it.

The server needs neither; with ``server_learns = true`` (the default) it learns the two
aggregates as well, because pairwise masking unmasks every sum at the server. ``false``
declares clients as the only learners (minimal; needs a protocol that can release a sum to
the clients alone — Paillier or CKKS with ``keyholder = "all"``). Client i scales its own
update by ``w_i`` before the (secure) weighted sum of :meth:`ServerContext.weighted_mean`, so
the server never sees w_i either.

Schedule (identical to the authors' ``ImbalanceFL.step``). Round t is a *dual round* when
``t % primal_steps == 0``. In a dual round each participating client

1. applies its pending dual step — with f_i measured at its previous dual round r and the
   f̄_r it learned from that round's ``climb_dual`` sum;
2. measures f_i(θ^t) — its mean loss (the run's training loss) under the broadcast model, on
   its own training data, before local training — and keeps it pending;
3. trains as in FedAvg.

Then, at a dual round, f̄ and λ̄ are summed together (``climb_dual``); at a primal round λ̄ is
summed alone when a λ_i may have changed and the round's clients differ from the last λ̄'s. Each
client scales its update by w_i and the scaled updates are averaged with weights |D_i| (as
FedAvg, so λ = 0 gives FedAvg exactly). So the
weights of block k use λ stepped with the losses at the start of block k − 1, as in the
authors' code (the paper's Algorithm 1 writes f(θ^{t+1}); the authors evaluate the losses
before the primal step, which needs no extra round trip).

Per round the run stores ``lambda_mean`` (λ̄) and, at dual rounds, ``loss_mean`` (f̄) as the
method's metrics — when the server learns them (``server_learns``), since it then knows them.

Partial participation: f̄ and λ̄ are means over the round's participants (unbiased estimates
of the means over all N), and a client takes its dual step when it next joins a dual round;
``primal_steps = 1`` then gives every participation a dual step.

The two halves. :class:`ClimbServer` decides when each sum is needed (it knows the schedule and
the cohorts — public — never a λ_i or an f_i) and opens it; :class:`ClimbClient` keeps λ_i, its
pending loss and the f̄ and λ̄ it learned in its own state, and scales its own update by
``w_i |D_i| / Σ|D_j|``. The values involved reach the server only through the two declared
secure sums and the secure update sum. When the server reuses λ̄ (same cohort as its last λ
sum, no dual round since), every member of the cohort learned that λ̄ from that sum and uses
it; until a second dual round has started every λ_i is the public initial 0, so λ̄ = 0 without
a sum.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch

from secure_fl.algorithms.base import (
    ClientContext,
    ClientState,
    ContributionContext,
    LocalUpdate,
    Method,
    RunInfo,
    ServerRound,
    register_algorithm,
)
from secure_fl.algorithms.fedavg import FedAvgClient, FedAvgParams, FedAvgServer
from secure_fl.stats import Learned, StatisticDeclaration

__all__ = [
    "DUAL_SUM",
    "LAMBDA_SUM",
    "Climb",
    "ClimbClient",
    "ClimbParams",
    "ClimbServer",
    "client_loss",
    "climb_weight",
    "dual_declaration",
    "dual_step",
    "lambda_declaration",
]

DUAL_SUM = "climb_dual"
LAMBDA_SUM = "climb_lambda"
_LOSS = "climb_loss"
FRAC_BITS = 24
"""Fixed-point precision of both statistics (quantisation 6e-8 per client per entry; cheap)."""
DualScaling = Literal["num_clients", "none"]


@dataclass(frozen=True, kw_only=True)
class ClimbParams(FedAvgParams):
    dual_lr: float = 2.0
    """η_D, the dual step size (the authors' MNIST runs: 2)."""
    tolerance: float = 0.01
    """ε, how far a client's loss may exceed the mean loss."""
    lambda_max: float = 5.0
    """λ_i is clipped to [0, lambda_max] (the authors clamp to [0, 5]); also the public bound of
    the ``climb_lambda`` sum."""
    dual_scaling: DualScaling = "num_clients"
    """``num_clients``: the dual step is dual_lr / N (authors' code); ``none``: dual_lr (the
    paper's literal step, which drove λ to the clamp within a few rounds in our trial)."""
    primal_steps: int = 5
    """FedAvg rounds per dual step (the authors' default 5)."""
    loss_bound: float = 20.0
    """Public bound of one client's f_i in the ``climb_dual`` sum; larger losses are clipped
    (and counted in the run's statistic records) — the client uses the clipped value too."""
    server_learns: bool = True
    """Whether f̄ and λ̄ are declared as learned by the server too (masking requires it)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("dual_lr", "lambda_max", "loss_bound"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a finite positive number, got {value!r}")
        if not (isinstance(self.tolerance, (int, float)) and math.isfinite(self.tolerance)):
            raise ValueError(f"tolerance must be a finite number, got {self.tolerance!r}")
        if self.dual_scaling not in ("num_clients", "none"):
            raise ValueError(f"dual_scaling must be 'num_clients' or 'none', got {self.dual_scaling!r}")
        if isinstance(self.primal_steps, bool) or not isinstance(self.primal_steps, int) or self.primal_steps < 1:
            raise ValueError(f"primal_steps must be a positive integer, got {self.primal_steps!r}")
        if not isinstance(self.server_learns, bool):
            raise TypeError(f"server_learns must be true or false, got {self.server_learns!r}")

    def dual_step_size(self, num_clients: int) -> float:
        return self.dual_lr / num_clients if self.dual_scaling == "num_clients" else self.dual_lr


def _learners(server: bool) -> frozenset[str]:
    return frozenset({"server", "clients"}) if server else frozenset({"clients"})


def dual_declaration(params: ClimbParams) -> StatisticDeclaration:
    """(Σ f_i, Σ λ_i) over a dual round's clients; the clients divide by their (public) count.

    One public bound covers both entries: ``max(loss_bound, lambda_max)``. λ_i never exceeds
    ``lambda_max``, so clipping can only touch a loss above ``loss_bound``, as before."""
    return StatisticDeclaration(
        name=DUAL_SUM, length=2, bound=float(max(params.loss_bound, params.lambda_max)), kind="float",
        learners=_learners(params.server_learns), per_round=True, frac_bits=FRAC_BITS, clip=True,
        description=(
            "CLIMB, at each dual round: the sum of the clients' mean training losses f_i under the broadcast "
            f"model (each clipped to [0, {params.loss_bound:g}], clips counted) and the sum of their dual "
            f"variables λ_i ∈ [0, {params.lambda_max:g}], in one secure sum. Clients learn it for their own "
            "dual step and to weight their own update by 1 + λ_i − λ̄; the server learns it only where the "
            "protocol releases sums through it."
        ),
    )


def lambda_declaration(params: ClimbParams) -> StatisticDeclaration:
    """Σ λ_i over a primal round's clients (a new cohort); the clients divide by their count."""
    return StatisticDeclaration(
        name=LAMBDA_SUM, length=1, bound=float(params.lambda_max), kind="float",
        learners=_learners(params.server_learns), per_round=True, frac_bits=FRAC_BITS,
        description=(
            f"CLIMB: sum of the clients' dual variables λ_i ∈ [0, {params.lambda_max:g}]. Clients learn "
            "it to weight their own update by 1 + λ_i − λ̄; the server learns it only where the "
            "protocol releases sums through it."
        ),
    )


def dual_step(lam: float, loss: float, mean_loss: float, *, step: float, tolerance: float,
              lambda_max: float) -> float:
    """λ ← clip(λ + step · (f_i − f̄ − ε), 0, lambda_max)."""
    return float(min(max(lam + step * (loss - mean_loss - tolerance), 0.0), lambda_max))


def climb_weight(lam: float, mean_lambda: float) -> float:
    """w_i = 1 + λ_i − λ̄ (may be negative: the Lagrangian then ascends on that client's loss)."""
    return 1.0 + lam - mean_lambda


def client_loss(ctx: ClientContext) -> float:
    """f_i(θ): the client's mean training loss under the broadcast model (client-side)."""
    return ctx.trainer.mean_loss(ctx.data, ctx.global_vector)


def is_dual_round(params: ClimbParams, round: int) -> bool:
    return round % params.primal_steps == 0


class ClimbServer(FedAvgServer):
    """Opens the λ and loss sums when the schedule needs them; aggregates the weighted updates."""

    params: ClimbParams

    def __init__(self, params: ClimbParams, info: RunInfo) -> None:
        super().__init__(params, info)
        self._dual = dual_declaration(params)
        self._lambda = lambda_declaration(params)
        self.dual_rounds: list[int] = []
        """Rounds whose dual sum was taken (public: the server opened them)."""
        self.loss_means: dict[int, float] = {}
        """f̄ of each dual round, where the server learns it (``server_learns``)."""
        self.lambda_mean: float | None = None
        """λ̄ of the last λ sum (``None`` before any, or when the server does not learn it)."""
        self.lambda_clients: tuple[int, ...] | None = None
        """The cohort of the last λ̄ (a sum, or the public 0 before any dual step)."""

    def _lambda_may_have_moved(self) -> bool:
        """At a primal round: whether a client can have taken a dual step. The first step is at a
        client's second dual round (it needs the f̄ of its first), so not before two dual rounds."""
        return len(self.dual_rounds) >= 2

    def aggregate(self, ctx: ServerRound) -> torch.Tensor:
        if is_dual_round(self.params, ctx.round):
            means = ctx.request(self._dual).means()
            self.dual_rounds.append(ctx.round)
            self.lambda_mean = None if means is None else float(means[1])
            self.lambda_clients = ctx.cohort
            if means is not None:
                self.loss_means[ctx.round] = float(means[0])
                ctx.metrics["loss_mean"] = float(means[0])
        elif not self._lambda_may_have_moved():
            # no dual step can have happened yet: every λ_i is still the public initial 0
            self.lambda_mean, self.lambda_clients = 0.0, ctx.cohort
        elif self.lambda_clients is None or ctx.cohort != self.lambda_clients:
            means = ctx.request(self._lambda).means()
            self.lambda_mean, self.lambda_clients = None if means is None else float(means[0]), ctx.cohort
        mean = ctx.weighted_mean()
        if self.lambda_mean is not None and self.params.server_learns:
            ctx.metrics["lambda_mean"] = self.lambda_mean
        return self.step(ctx, mean)

    def state_dict(self) -> dict[str, Any]:
        return {
            "dual_rounds": list(self.dual_rounds),
            "loss_means": {int(r): float(v) for r, v in self.loss_means.items()},
            "lambda_mean": self.lambda_mean,
            "lambda_clients": None if self.lambda_clients is None else list(self.lambda_clients),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        expected = {"dual_rounds", "loss_means", "lambda_mean", "lambda_clients"}
        if set(state) != expected:
            raise ValueError(f"CLIMB state needs keys {sorted(expected)}, got {sorted(state)}")
        self.dual_rounds = [int(r) for r in state["dual_rounds"]]
        self.loss_means = {int(r): float(v) for r, v in state["loss_means"].items()}
        mean = state["lambda_mean"]
        self.lambda_mean = None if mean is None else float(mean)
        clients = state["lambda_clients"]
        self.lambda_clients = None if clients is None else tuple(int(c) for c in clients)


LAMBDA_STATE = "lambda"
PENDING_STATE = "pending"
LOSS_MEAN_STATE = "loss_mean"
LAMBDA_MEAN_STATE = "lambda_mean"


class ClimbClient(FedAvgClient):
    """Keeps λ_i, its pending loss and what it learned; scales its own update by w_i."""

    params: ClimbParams

    def __init__(self, params: ClimbParams, info: RunInfo) -> None:
        super().__init__(params, info)
        self.sources[DUAL_SUM] = lambda ctx: torch.cat([self._extra(ctx, _LOSS).reshape(1),
                                                        torch.tensor([self._lambda(ctx)], dtype=torch.float64)])
        self.sources[LAMBDA_SUM] = lambda ctx: np.array([self._lambda(ctx)])

    def declarations(self) -> dict[str, StatisticDeclaration]:
        out = super().declarations()
        out[DUAL_SUM] = dual_declaration(self.params)
        out[LAMBDA_SUM] = lambda_declaration(self.params)
        return out

    @staticmethod
    def _lambda(ctx: ContributionContext) -> float:
        return float(ctx.state.get(LAMBDA_STATE, 0.0))

    @staticmethod
    def _extra(ctx: ContributionContext, name: str) -> torch.Tensor:
        if ctx.update is None or name not in ctx.update.extras:
            from protocols import PolicyError

            raise PolicyError(f"asked for {name!r} in a round where this client measured none")
        return ctx.update.extras[name]

    def train(self, ctx: ClientContext) -> LocalUpdate:
        p, state = self.params, ctx.state
        lam = float(state.get(LAMBDA_STATE, 0.0))
        extras: dict[str, torch.Tensor] = {}
        if is_dual_round(p, ctx.round):
            pending = state.pop(PENDING_STATE, None)
            learned = state.get(LOSS_MEAN_STATE)
            if pending is not None and learned is not None and int(learned[0]) == int(pending[0]):
                lam = dual_step(lam, float(pending[1]), float(learned[1]), step=p.dual_step_size(ctx.num_clients),
                                tolerance=p.tolerance, lambda_max=p.lambda_max)
                state[LAMBDA_STATE] = lam
            loss = client_loss(ctx)
            state[PENDING_STATE] = (ctx.round, min(max(loss, 0.0), p.loss_bound))
            extras[_LOSS] = torch.tensor([loss], dtype=torch.float64)
        result = ctx.train(self.local_objective(ctx))
        return LocalUpdate(delta=result.vector - ctx.global_vector, num_samples=ctx.data.num_samples,
                           steps=result.steps, loss=result.loss, extras=extras)

    def learned(self, learned: Learned, ctx: ClientState) -> None:
        means = learned.means()
        if learned.name == DUAL_SUM:
            ctx.state[LOSS_MEAN_STATE] = (learned.round, float(means[0]))
            ctx.state[LAMBDA_MEAN_STATE] = float(means[1])
        elif learned.name == LAMBDA_SUM:
            ctx.state[LAMBDA_MEAN_STATE] = float(means[0])

    def scaled_update(self, ctx: ContributionContext) -> torch.Tensor:
        """(w_i Δ_i) · |D_i| / Σ|D_j|, with λ̄ learned this round, or the last one learned (0 before any)."""
        if ctx.update is None:
            from protocols import PolicyError

            raise PolicyError("asked for a model update before this client trained in this round")
        weight = climb_weight(self._lambda(ctx), self._lambda_mean(ctx))
        return (ctx.update.delta * weight) * self.update_weight(ctx)

    @staticmethod
    def _lambda_mean(ctx: ContributionContext) -> float:
        for name, entry in ((DUAL_SUM, 1), (LAMBDA_SUM, 0)):
            this_round = ctx.learned.get(name)
            if this_round is not None:
                return float(this_round.means()[entry])
        return float(ctx.state.get(LAMBDA_MEAN_STATE, 0.0))


@register_algorithm("climb")
class Climb(Method):
    """FedAvg with client weights 1 + λ_i − λ̄ and client-side dual ascent on λ_i."""

    Params = ClimbParams
    Server = ClimbServer
    Client = ClimbClient
