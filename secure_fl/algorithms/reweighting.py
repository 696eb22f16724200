"""Reweighting: each client weights its loss by the inverse of its local class frequencies.

The baseline FedShift (paper 001, Table 1) compares against: client i trains on
``mean_j w[y_j] ℓ_j`` with ``w_k ∝ P_i(y=k)^-power`` over the classes it holds, normalised
so that ``Σ_k P_i(k) w_k = 1`` (the expected weight is 1, so the learning rate keeps its
meaning). Needs no global statistic: the weights are client-side knowledge.

The paper does not say how a batch's weighted losses are averaged. ``mean = "samples"`` (the
default) is the mean above, an unbiased estimate of the reweighted risk whose steps blow up
when a batch holds a rare class of weight in the hundreds; ``mean = "weights"`` divides by the
batch's weights instead, Σ w ℓ / Σ w, as ``torch.nn.CrossEntropyLoss(weight=…)`` does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch

from secure_fl.algorithms.base import ClientContext, Method, register_algorithm
from secure_fl.algorithms.fedavg import FedAvgClient, FedAvgParams, FedAvgServer
from secure_fl.training import LocalObjective

__all__ = ["Reweighting", "ReweightingClient", "ReweightingParams", "inverse_frequency_weights"]


@dataclass(frozen=True, kw_only=True)
class ReweightingParams(FedAvgParams):
    power: float = 1.0
    """Exponent of the inverse frequency (1: fully balanced local objective, 0: FedAvg)."""
    mean: Literal["samples", "weights"] = "samples"
    """Average a batch's weighted losses over its samples, or over its weights (Σ w ℓ / Σ w)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.power >= 0:
            raise ValueError(f"power must be >= 0, got {self.power}")
        if self.mean not in ("samples", "weights"):
            raise ValueError(f"mean must be 'samples' or 'weights', got {self.mean!r}")


def inverse_frequency_weights(class_counts: np.ndarray, power: float = 1.0) -> np.ndarray:
    """w_k = P(k)^-power for present classes (0 for absent ones), scaled so Σ_k P(k) w_k = 1."""
    counts = np.asarray(class_counts, dtype=np.float64)
    total = counts.sum()
    if total <= 0:
        raise ValueError("a client without samples has no class frequencies")
    freq = counts / total
    present = counts > 0
    weights = np.zeros_like(freq)
    weights[present] = freq[present] ** -power
    normalised: np.ndarray = weights / float((freq * weights).sum())
    return normalised


class ReweightingClient(FedAvgClient):
    """Client side only: the weights come from the client's own class counts."""

    params: ReweightingParams

    def local_objective(self, ctx: ClientContext) -> LocalObjective:
        weights = inverse_frequency_weights(ctx.data.class_counts, self.params.power)
        return LocalObjective(class_weight=torch.as_tensor(weights, dtype=torch.float32, device=ctx.data.x.device),
                              weighted_mean=self.params.mean == "weights")


@register_algorithm("reweighting")
class Reweighting(Method):
    Params = ReweightingParams
    Server = FedAvgServer
    Client = ReweightingClient
