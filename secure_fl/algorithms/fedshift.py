"""FedShift (Shen, Wang, Lv — paper 001): a classifier shift during local training only.

Client i trains on ``ℓ(f(w; x) + s_i, y)`` (Eq. 4) with

    s_{i,k} = ln(P_i(y=k) / P(y=k))                                   (Eq. 5)

where ``P_i`` is the client's own label frequency with Laplace smoothing,
``P_i(y=k) = (n_{i,k} + λ) / (|D_i| + Cλ)`` (footnote 2), and ``P(y)`` is the global label
distribution ``Σ_i |D_i|/|D| · P_i(y)`` over the clients' empirical frequencies, i.e. the
global label counts divided by their total. Evaluation uses the unshifted logits (the
runtime's evaluation never sees the objective), so the global model predicts under P(y).

``P(y)`` is computed once, before the first round, as the declared statistic
``label_histogram`` (C integers per client, each in ``[0, count_bound]`` — a public cap, fixed
before any input is seen — learned by the server and the clients) through the run's configured
secure-sum protocol — ``plain``, ``paillier``, ``masking``, ``secagg+`` or ``ckks``, set by
``[secure] protocol`` or ``[secure.statistics] label_histogram = "..."``. The server half
(:class:`FedShiftServer`) opens the sum over every client and keeps the aggregate counts; each
client half (:class:`FedShiftClient`) contributes its own counts, learns P(y) from the release
and keeps it in its own state. Under a secure protocol the server reads only the aggregate
counts; the shift never leaves the client. A class no client holds (global count 0) gets shift
0: no one has information about it, and it never appears as a training label.

The server side is otherwise FedAvg's (weighted mean of the updates); FedShift adds no
per-round communication.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

from secure_fl.algorithms.base import (
    ClientContext,
    ClientState,
    Method,
    RunInfo,
    ServerSetup,
    register_algorithm,
)
from secure_fl.algorithms.fedavg import FedAvgClient, FedAvgParams, FedAvgServer
from secure_fl.stats import Learned, StatisticDeclaration
from secure_fl.training import LocalObjective

__all__ = [
    "PRIOR_STATISTIC",
    "FedShift",
    "FedShiftClient",
    "FedShiftParams",
    "FedShiftServer",
    "classifier_shift",
    "global_prior",
    "label_histogram_declaration",
    "smoothed_distribution",
]

PRIOR_STATISTIC = "label_histogram"
"""Name of FedShift's once-per-run statistic (the global label counts)."""

PRIOR_STATE = "prior"
"""Key of the learned P(y) in a client's state."""

PRIOR_ROUND = 0
"""Transcript round of the set-up request: its bytes count toward round 0's communication."""


@dataclass(frozen=True, kw_only=True)
class FedShiftParams(FedAvgParams):
    smoothing: float = 1.0
    """Laplace pseudo-count λ added to every class of a client's counts before P_i (> 0)."""
    count_bound: int = 65535
    """Public per-entry bound of the label histogram: no client may hold more samples of one
    class (a client that does refuses to contribute, with the reason)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if not (math.isfinite(self.smoothing) and self.smoothing > 0):
            raise ValueError(f"smoothing must be a positive number, got {self.smoothing}")
        if isinstance(self.count_bound, bool) or not isinstance(self.count_bound, int) or self.count_bound < 1:
            raise ValueError(f"count_bound must be a positive integer, got {self.count_bound!r}")


def smoothed_distribution(counts: npt.ArrayLike, smoothing: float = 1.0) -> np.ndarray:
    """``(n_k + λ) / (Σ n + Cλ)``: a client's label frequency with Laplace smoothing."""
    n = np.asarray(counts, dtype=np.float64).reshape(-1)
    if n.size == 0 or np.any(n < 0) or not np.all(np.isfinite(n)):
        raise ValueError("counts must be a non-empty vector of non-negative numbers")
    if not smoothing > 0:
        raise ValueError(f"smoothing must be positive, got {smoothing}")
    return np.asarray((n + smoothing) / (n.sum() + smoothing * n.size), dtype=np.float64)


def global_prior(histogram: npt.ArrayLike) -> np.ndarray:
    """``P(y) = counts / total`` from the summed label histogram (= Σ_i |D_i|/|D| · P_i(y))."""
    h = np.asarray(histogram, dtype=np.float64).reshape(-1)
    if h.size == 0 or np.any(h < 0) or not np.all(np.isfinite(h)):
        raise ValueError("the label histogram must be a non-empty vector of non-negative counts")
    total = h.sum()
    if total <= 0:
        raise ValueError("the label histogram is empty: no client holds any sample")
    return np.asarray(h / total, dtype=np.float64)


def classifier_shift(client_counts: npt.ArrayLike, prior: npt.ArrayLike, smoothing: float = 1.0) -> np.ndarray:
    """Eq. 5: ``s_k = ln(P_i(y=k) / P(y=k))``, with ``s_k = 0`` where ``P(y=k) = 0``."""
    p_i = smoothed_distribution(client_counts, smoothing)
    p = np.asarray(prior, dtype=np.float64).reshape(-1)
    if p.shape != p_i.shape:
        raise ValueError(f"prior has {p.size} classes, the client's counts {p_i.size}")
    shift = np.zeros_like(p_i)
    known = p > 0
    shift[known] = np.log(p_i[known]) - np.log(p[known])
    return shift


def label_histogram_declaration(num_classes: int, bound: int) -> StatisticDeclaration:
    """The public declaration of FedShift's prior: C integer counts, learned by server and clients."""
    return StatisticDeclaration(
        name=PRIOR_STATISTIC,
        length=int(num_classes),
        bound=int(bound),
        kind="int",
        learners=frozenset({"server", "clients"}),
        per_round=False,
        record_sensitivity=1,   # one record adds 1 to one class's count
        description=(
            "FedShift's global label counts Σ_i n_{i,k}, summed once before training; every client "
            "divides by the total to get P(y) for its classifier shift ln(P_i(y)/P(y)). The server "
            "learns the aggregate counts only; the shift never leaves the client."
        ),
    )


class FedShiftServer(FedAvgServer):
    """Opens the label-histogram sum once; aggregates as FedAvg."""

    params: FedShiftParams

    def __init__(self, params: FedShiftParams, info: RunInfo) -> None:
        super().__init__(params, info)
        self.histogram: np.ndarray | None = None
        """The summed label counts (what the server learned)."""
        self.prior: np.ndarray | None = None
        """P(y) = histogram / total."""

    def setup(self, ctx: ServerSetup) -> None:
        """Sum every client's label counts through the configured protocol (answered from the
        checkpoint on resume: the statistic is released once)."""
        declaration = label_histogram_declaration(ctx.info.num_classes, self.params.count_bound)
        release = ctx.stats.request(declaration, cohort=ctx.clients, round=PRIOR_ROUND)
        if release.value is None:
            raise RuntimeError("the label histogram's protocol did not reveal the sum to the server")
        self.histogram = np.rint(release.value).astype(np.int64)
        self.prior = global_prior(self.histogram)

    def describe(self) -> dict[str, Any]:
        return {} if self.prior is None else {"prior": [float(p) for p in self.prior]}


class FedShiftClient(FedAvgClient):
    """Contributes its label counts; trains with its shift ln(P_i(y)/P(y)) from the learned prior."""

    params: FedShiftParams

    def __init__(self, params: FedShiftParams, info: RunInfo) -> None:
        super().__init__(params, info)
        self.sources[PRIOR_STATISTIC] = lambda ctx: np.asarray(ctx.data.class_counts, dtype=np.int64)

    def declarations(self) -> dict[str, StatisticDeclaration]:
        out = super().declarations()
        out[PRIOR_STATISTIC] = label_histogram_declaration(self.info.num_classes, self.params.count_bound)
        return out

    def learned(self, learned: Learned, ctx: ClientState) -> None:
        if learned.name == PRIOR_STATISTIC:
            ctx.state[PRIOR_STATE] = [float(p) for p in global_prior(np.rint(learned.value))]

    def shift_for(self, class_counts: npt.ArrayLike, state: dict[str, Any]) -> np.ndarray:
        """This client's shift from its own counts and the prior it learned."""
        prior = state.get(PRIOR_STATE)
        if prior is None:
            raise RuntimeError("FedShift: this client has not learned the prior P(y) (no label_histogram release)")
        return classifier_shift(class_counts, prior, self.params.smoothing)

    def local_objective(self, ctx: ClientContext) -> LocalObjective:
        shift = self.shift_for(ctx.data.class_counts, ctx.state)
        return LocalObjective(logit_shift=torch.as_tensor(shift, dtype=torch.float32, device=ctx.data.x.device))


@register_algorithm("fedshift")
class FedShift(Method):
    """FedAvg whose clients add ``ln(P_i(y)/P(y))`` to their logits while training (Algorithm 1)."""

    Params = FedShiftParams
    Server = FedShiftServer
    Client = FedShiftClient
