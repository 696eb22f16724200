"""FedAvg (McMahan et al. 2017): local SGD, updates averaged with weights |D_i|."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from secure_fl.algorithms.base import (
    ClientContext,
    ClientMethod,
    LocalUpdate,
    Method,
    ServerMethod,
    ServerRound,
    register_algorithm,
)
from secure_fl.training import LocalObjective

__all__ = ["FedAvg", "FedAvgClient", "FedAvgParams", "FedAvgServer"]


@dataclass(frozen=True, kw_only=True)
class FedAvgParams:
    server_lr: float = 1.0
    """Step of the server along the averaged update (1.0: the new model is the weighted mean)."""

    def __post_init__(self) -> None:
        if not self.server_lr > 0:
            raise ValueError(f"server_lr must be positive, got {self.server_lr}")


class FedAvgServer(ServerMethod):
    """x ← x + η_g Σ_i (|D_i| / Σ_j |D_j|) (y_i − x); Σ|D_j| and the weighted sum are secure sums."""

    params: FedAvgParams

    def step(self, ctx: ServerRound, mean: torch.Tensor) -> torch.Tensor:
        """Move the global model along the averaged update."""
        if self.params.server_lr == 1.0:
            return ctx.global_vector + mean
        return ctx.global_vector + self.params.server_lr * mean

    def aggregate(self, ctx: ServerRound) -> torch.Tensor:
        return self.step(ctx, ctx.weighted_mean())


class FedAvgClient(ClientMethod):
    """Plain local training; subclasses change the objective in :meth:`local_objective`."""

    params: FedAvgParams

    def local_objective(self, ctx: ClientContext) -> LocalObjective:
        return LocalObjective()

    def train(self, ctx: ClientContext) -> LocalUpdate:
        result = ctx.train(self.local_objective(ctx))
        return LocalUpdate(delta=result.vector - ctx.global_vector, num_samples=ctx.data.num_samples,
                           steps=result.steps, loss=result.loss)


@register_algorithm("fedavg")
class FedAvg(Method):
    Params = FedAvgParams
    Server = FedAvgServer
    Client = FedAvgClient
