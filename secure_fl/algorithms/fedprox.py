"""FedProx (Li et al. 2020): FedAvg with a proximal term μ/2 ‖w − x‖² in each local objective."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from secure_fl.algorithms.base import ClientContext, Method, register_algorithm
from secure_fl.algorithms.fedavg import FedAvgClient, FedAvgParams, FedAvgServer
from secure_fl.training import LocalObjective

__all__ = ["FedProx", "FedProxClient", "FedProxParams"]


@dataclass(frozen=True, kw_only=True)
class FedProxParams(FedAvgParams):
    mu: float = 0.01
    """Weight of the proximal term (FedShift tunes it in {0.001, 0.01, 0.1})."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.mu >= 0:
            raise ValueError(f"mu must be >= 0, got {self.mu}")


class FedProxClient(FedAvgClient):
    """The proximal term enters as its gradient μ (w − x), added after each backward pass."""

    params: FedProxParams

    def local_objective(self, ctx: ClientContext) -> LocalObjective:
        mu = self.params.mu
        if mu == 0:
            return LocalObjective()
        anchor = ctx.layout.parameter_views(ctx.global_vector)

        def proximal(params: Sequence[torch.Tensor], grads: Sequence[torch.Tensor]) -> None:
            torch._foreach_add_(list(grads), torch._foreach_sub(list(params), anchor), alpha=mu)

        return LocalObjective(gradient_correction=proximal)


@register_algorithm("fedprox")
class FedProx(Method):
    Params = FedProxParams
    Server = FedAvgServer
    Client = FedProxClient
