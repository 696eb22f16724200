"""Training losses by name: one frozen dataclass per loss, a small registry (Opacus-style).

Every loss maps ``(logits, target)`` to a scalar and accepts an optional per-class weight
vector. With weights ``w`` the loss is ``mean_j w[y_j] · ℓ_j`` — the plain mean of the
weighted per-sample losses, **not** PyTorch's ``Σ w ℓ / Σ w``: a method that reweights
(e.g. :class:`~secure_fl.algorithms.Reweighting`) changes the objective, not just the
per-batch normalisation.

Later losses (``focal``, ``ghmc``, ``ratio``, ``mse``, ``mfe``) register themselves with
:func:`register_loss`; a method that needs per-round information in its loss (Ratio Loss)
passes it through the algorithm, never through globals.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from typing import Any, ClassVar, TypeVar

import torch
import torch.nn.functional as F

from secure_fl.suggest import did_you_mean

__all__ = ["LOSSES", "CrossEntropy", "Focal", "Loss", "loss_class", "make_loss", "register_loss"]


class Loss(ABC):
    """A training loss; subclasses are frozen dataclasses of their hyper-parameters."""

    name: ClassVar[str]

    @abstractmethod
    def __call__(
        self, logits: torch.Tensor, target: torch.Tensor, *, class_weight: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Scalar loss of a batch; ``class_weight`` (length C) scales each sample by its class's weight."""


LOSSES: dict[str, type[Loss]] = {}

L = TypeVar("L", bound=type[Loss])


def register_loss(name: str) -> Callable[[L], L]:
    """Class decorator: make a loss available under its lower-case registry ``name``."""
    if name != name.lower():
        raise ValueError(f"loss names are lower-case, got {name!r}")

    def deco(cls: L) -> L:
        if name in LOSSES and LOSSES[name] is not cls:
            raise ValueError(f"loss {name!r} is already registered to {LOSSES[name].__qualname__}")
        cls.name = name
        LOSSES[name] = cls
        return cls

    return deco


def loss_class(name: str) -> type[Loss]:
    try:
        return LOSSES[name]
    except KeyError:
        raise ValueError(f"unknown loss {name!r}{did_you_mean(name, LOSSES)}; "
                         f"known: {', '.join(sorted(LOSSES))}") from None


def make_loss(name: str, params: Mapping[str, Any] | None = None) -> Loss:
    """Build a loss from its name and hyper-parameters; unknown parameters are named in the error."""
    cls = loss_class(name)
    given = dict(params or {})
    known = {f.name for f in fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(given) - known)
    if unknown:
        raise ValueError(
            f"unknown parameter(s) {', '.join(unknown)} for loss {name!r}{did_you_mean(unknown[0], known)}; "
            f"known: {', '.join(sorted(known)) or 'none'}"
        )
    return cls(**given)


@register_loss("ce")
@dataclass(frozen=True)
class CrossEntropy(Loss):
    """Softmax cross-entropy, optionally with label smoothing."""

    label_smoothing: float = 0.0

    def __post_init__(self) -> None:
        if not 0.0 <= self.label_smoothing < 1.0:
            raise ValueError(f"label_smoothing must lie in [0, 1), got {self.label_smoothing}")

    def __call__(
        self, logits: torch.Tensor, target: torch.Tensor, *, class_weight: torch.Tensor | None = None
    ) -> torch.Tensor:
        if class_weight is None:
            return F.cross_entropy(logits, target, label_smoothing=self.label_smoothing)
        per_sample = F.cross_entropy(logits, target, reduction="none", label_smoothing=self.label_smoothing)
        return (class_weight[target] * per_sample).mean()


@register_loss("focal")
@dataclass(frozen=True)
class Focal(Loss):
    """Focal loss (Lin et al. 2017): ``−(1 − p_t)^γ log p_t``, the baseline of CLIMB and Ratio Loss.

    ``gamma = 0`` is cross-entropy. Per-sample losses are averaged (with ``class_weight``, each
    scaled by its class's weight first, as every loss here).
    """

    gamma: float = 2.0

    def __post_init__(self) -> None:
        if not (isinstance(self.gamma, (int, float)) and 0.0 <= self.gamma < float("inf")):
            raise ValueError(f"gamma must be a finite number >= 0, got {self.gamma!r}")

    def __call__(
        self, logits: torch.Tensor, target: torch.Tensor, *, class_weight: torch.Tensor | None = None
    ) -> torch.Tensor:
        log_pt = F.log_softmax(logits, dim=-1).gather(-1, target.unsqueeze(-1)).squeeze(-1)
        per_sample = -log_pt if self.gamma == 0 else -((1.0 - log_pt.exp()) ** self.gamma) * log_pt
        if class_weight is not None:
            per_sample = class_weight[target] * per_sample
        return per_sample.mean()


# --- Ratio Loss's paper (Wang et al., AAAI'21): GHMC, Ratio, MSE, MFE ------------------------------

__all__ += ["GHMC", "MFE", "MeanSquaredError", "RatioLoss"]


@register_loss("ghmc")
@dataclass(frozen=True)
class GHMC(Loss):
    """Gradient-harmonized cross-entropy (GHM-C, Li, Liu, Wang, AAAI'19), for a softmax classifier.

    Each sample's gradient norm on its true logit is ``g = 1 − p_t`` (detached); ``[0, 1]`` is
    cut into ``bins`` equal bins, and a sample in a bin holding ``m`` of the batch's ``n``
    samples gets weight ``n / (m · n_bins)``, ``n_bins`` the number of non-empty bins — so
    every occupied bin carries the same total weight and the many easy samples (small ``g``)
    stop dominating. The loss is ``mean_j β_j CE_j`` (× ``class_weight[y_j]`` when given).
    The gradient-density momentum of the GHM paper (``mmt``) keeps state across batches and
    is not used (mmdet's default, ``momentum = 0``): one loss object serves every client.
    """

    bins: int = 10

    def __post_init__(self) -> None:
        if isinstance(self.bins, bool) or not isinstance(self.bins, int) or self.bins < 1:
            raise ValueError(f"bins must be a positive integer, got {self.bins!r}")

    def harmonizing_weights(self, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """β_j = n / (m_bin(j) · n_bins), detached."""
        with torch.no_grad():
            p_t = F.softmax(logits.float(), dim=-1).gather(-1, target.unsqueeze(-1)).squeeze(-1)
            g = (1.0 - p_t).clamp(0.0, 1.0)
            index = torch.clamp((g * self.bins).long(), max=self.bins - 1)
            counts = torch.bincount(index, minlength=self.bins).to(g.dtype)
            occupied = int((counts > 0).sum())
            return (g.numel() / (counts[index] * max(occupied, 1))).to(logits.dtype)

    def __call__(
        self, logits: torch.Tensor, target: torch.Tensor, *, class_weight: torch.Tensor | None = None
    ) -> torch.Tensor:
        per_sample = F.cross_entropy(logits, target, reduction="none") * self.harmonizing_weights(logits, target)
        if class_weight is not None:
            per_sample = class_weight[target] * per_sample
        return per_sample.mean()


@register_loss("ratio")
@dataclass(frozen=True)
class RatioLoss(Loss):
    """Ratio Loss (Eq. 10–11): ``−(α + β Ra_p) log f_p`` for a sample of class ``p``.

    ``ℝ = [Ra_1 … Ra_Q]`` comes from the server's monitor (method ``ratio_loss``), which
    broadcasts it every round; the client turns it into class weights with
    :meth:`class_weights` and passes them as ``class_weight``, so the call is the weighted
    cross-entropy ``mean_j w[y_j] CE_j`` of every loss here. Without weights (no ℝ yet)
    the loss is ``α · CE``.
    """

    alpha: float = 1.0
    beta: float = 0.1

    def __post_init__(self) -> None:
        import math

        for name in ("alpha", "beta"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
        if self.alpha == 0 and self.beta == 0:
            raise ValueError("alpha and beta cannot both be 0")

    def class_weights(self, ratios: torch.Tensor) -> torch.Tensor:
        """``α + β |ℝ|`` (Eq. 11's coefficient per class)."""
        return self.alpha + self.beta * ratios.abs()

    def __call__(
        self, logits: torch.Tensor, target: torch.Tensor, *, class_weight: torch.Tensor | None = None
    ) -> torch.Tensor:
        per_sample = F.cross_entropy(logits, target, reduction="none")
        if class_weight is None:
            return self.alpha * per_sample.mean()
        return (class_weight[target] * per_sample).mean()


def _squared_errors(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """``e_j = ½ Σ_k (softmax_k − onehot_k)²`` per sample."""
    p = F.softmax(logits, dim=-1)
    onehot = F.one_hot(target, p.shape[-1]).to(p.dtype)
    return 0.5 * ((p - onehot) ** 2).sum(dim=-1)


@register_loss("mse")
@dataclass(frozen=True)
class MeanSquaredError(Loss):
    """Mean squared error of the softmax outputs against the one-hot label, ``mean_j ½ Σ_k (p_jk − y_jk)²``.

    The baseline of MFE (Wang et al., IJCNN'16) in the Ratio Loss paper's Table 4.
    """

    def __call__(
        self, logits: torch.Tensor, target: torch.Tensor, *, class_weight: torch.Tensor | None = None
    ) -> torch.Tensor:
        per_sample = _squared_errors(logits, target)
        if class_weight is not None:
            per_sample = class_weight[target] * per_sample
        return per_sample.mean()


@register_loss("mfe")
@dataclass(frozen=True)
class MFE(Loss):
    """Mean false error (Wang et al., IJCNN'16), with the local knowledge of one client's batch.

    MFE = FPE + FNE: the squared error ``e_j = ½ Σ_k (p_jk − y_jk)²`` averaged *separately*
    over the negative (majority) and the positive (minority) samples, so the minority class
    weighs as much as the majority however few its samples are; ``variant = "msfe"`` takes
    FPE² + FNE². For C classes each class present in the batch is its own group (the binary
    case is exactly FPE and FNE): ``Σ_c mean_{j: y_j = c} e_j`` — no client needs to know which
    classes are the global minority, which is the point of the paper's Table 4 (MFE can only
    use local data). ``reduction = "mean"`` divides by the number of classes present
    (= (FPE + FNE)/2 in the binary case) so that the loss has MSE's scale and the same
    learning rate compares fairly; ``"sum"`` is the paper's form.
    """

    variant: str = "mfe"
    reduction: str = "mean"

    def __post_init__(self) -> None:
        if self.variant not in ("mfe", "msfe"):
            raise ValueError(f"variant must be 'mfe' or 'msfe', got {self.variant!r}")
        if self.reduction not in ("mean", "sum"):
            raise ValueError(f"reduction must be 'mean' or 'sum', got {self.reduction!r}")

    def __call__(
        self, logits: torch.Tensor, target: torch.Tensor, *, class_weight: torch.Tensor | None = None
    ) -> torch.Tensor:
        errors = _squared_errors(logits, target)
        num_classes = logits.shape[-1]
        counts = torch.bincount(target, minlength=num_classes).to(errors.dtype)
        sums = torch.zeros(num_classes, dtype=errors.dtype, device=errors.device).index_add(0, target, errors)
        present = counts > 0
        per_class = sums[present] / counts[present]
        if self.variant == "msfe":
            per_class = per_class ** 2
        if class_weight is not None:
            per_class = class_weight[present].to(per_class.dtype) * per_class
        total = per_class.sum()
        return total / present.sum() if self.reduction == "mean" else total
