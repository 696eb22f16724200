"""SCAFFOLD (Karimireddy et al. 2020), option II control variates.

The server keeps c; client i keeps c_i (zero at first, in its own state). Local steps use
g + c − c_i; after K local steps with learning rate η the client sets
``c_i⁺ = c_i − c + (x − y_i) / (K η)`` (or η/(1−β) with ``momentum_aware``). The server moves the
model by the weighted mean of y_i − x (as FedAvg) and sets ``c ← c + (1/N) Σ_{i∈S} (c_i⁺ − c_i)``:
each client scales its own change by 1/N (N, the number of clients, is public) and the changes
are summed as the statistic ``control_update`` through the update protocol. c travels to the
cohort with the model (``control`` broadcast, counted in the transcript).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from secure_fl.algorithms.base import (
    ClientContext,
    LocalUpdate,
    Method,
    RunInfo,
    ServerRound,
    ServerSetup,
    register_algorithm,
)
from secure_fl.algorithms.fedavg import FedAvgClient, FedAvgParams, FedAvgServer
from secure_fl.stats import MODEL_UPDATE
from secure_fl.training import LocalObjective

__all__ = ["CONTROL", "CONTROL_UPDATE", "Scaffold", "ScaffoldClient", "ScaffoldParams", "ScaffoldServer"]

CONTROL = "control"
CONTROL_UPDATE = "control_update"


@dataclass(frozen=True, kw_only=True)
class ScaffoldParams(FedAvgParams):
    momentum_aware: bool = True
    """Estimate c_i⁺ with the momentum-SGD step η/(1−β) in place of η. The paper assumes plain
    SGD (β = 0, where both agree); with momentum β the plain estimate (x − y_i)/(Kη) is about
    1/(1−β) times the mean gradient, and the correction it feeds back diverges (β = 0.9 made
    the demo's SCAFFOLD diverge within 4 rounds). ``false`` reproduces the plain formula."""


class ScaffoldServer(FedAvgServer):
    params: ScaffoldParams

    def __init__(self, params: ScaffoldParams, info: RunInfo) -> None:
        super().__init__(params, info)
        self.control: torch.Tensor | None = None

    def setup(self, ctx: ServerSetup) -> None:
        self.control = torch.zeros(ctx.info.dimension, dtype=torch.float32, device=ctx.device)

    def broadcast(self, ctx: ServerRound) -> dict[str, torch.Tensor]:
        assert self.control is not None, "setup() was not called"
        return {CONTROL: self.control}

    def aggregate(self, ctx: ServerRound) -> torch.Tensor:
        assert self.control is not None, "setup() was not called"
        new_global = super().aggregate(ctx)
        self.control = self.control + ctx.update_sum(CONTROL_UPDATE)
        return new_global

    def state_dict(self) -> dict[str, Any]:
        assert self.control is not None, "setup() was not called"
        return {CONTROL: self.control.detach().cpu().clone()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if set(state) != {CONTROL}:
            raise ValueError(f"SCAFFOLD state needs exactly {{'{CONTROL}'}}, got {sorted(state)}")
        device = self.control.device if self.control is not None else torch.device("cpu")
        self.control = state[CONTROL].to(device=device, dtype=torch.float32).clone()


class ScaffoldClient(FedAvgClient):
    params: ScaffoldParams
    update_statistics = (MODEL_UPDATE, CONTROL_UPDATE)

    def __init__(self, params: ScaffoldParams, info: RunInfo) -> None:
        super().__init__(params, info)
        self.sources[CONTROL_UPDATE] = self._control_update

    @staticmethod
    def _control_update(ctx: Any) -> torch.Tensor:
        if ctx.update is None:
            from protocols import PolicyError

            raise PolicyError("asked for a control-variate change before this client trained in this round")
        change: torch.Tensor = ctx.update.extras["control_delta"]
        return change

    def train(self, ctx: ClientContext) -> LocalUpdate:
        control = ctx.broadcast[CONTROL]
        own = ctx.state.get(CONTROL)
        if own is None:
            own = torch.zeros_like(control)
        correction = ctx.layout.parameter_views(control - own)

        def drift_correction(params: Sequence[torch.Tensor], grads: Sequence[torch.Tensor]) -> None:
            torch._foreach_add_(list(grads), correction)

        result = ctx.train(LocalObjective(gradient_correction=drift_correction))
        delta = result.vector - ctx.global_vector
        step = ctx.lr
        if self.params.momentum_aware:
            step /= 1.0 - ctx.trainer.training.momentum
        updated = own - control - delta / (result.steps * step)
        ctx.state[CONTROL] = updated
        return LocalUpdate(delta=delta, num_samples=ctx.data.num_samples, steps=result.steps, loss=result.loss,
                           extras={"control_delta": (updated - own) / ctx.num_clients})


@register_algorithm("scaffold")
class Scaffold(Method):
    Params = ScaffoldParams
    Server = ScaffoldServer
    Client = ScaffoldClient
