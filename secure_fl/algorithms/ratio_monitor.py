"""Ratio Loss's monitor (Wang, Xu, Wang, Zhu — AAAI'21, Eq. 5–7): a round's class composition
from two consecutive global models, a little auxiliary data and the round's total sample count.

The monitor is an *inference attack on the round's composition*: it reads nothing but the
aggregated global models ``G_t`` and ``G_{t+1}``, public auxiliary samples (``n_a`` per
class) and ``N = Σ_j |D_j|`` over the round's ``K`` clients (a secure sum: the server learns
the total only). No secure-sum protocol hides it. This module is pure functions plus a small
stateful helper; the method that uses it is :mod:`secure_fl.algorithms.ratio_loss`, and the
audit (:mod:`secure_fl.audit`) may call :func:`estimate_composition` directly.

Notation (the paper's). ``W`` is the output layer's weight matrix, ``W_(p,i)`` the link from
hidden unit ``i`` to output node ``p`` (C × s). ``aux_updates[q, p, i]`` is the update of
``W_(p,i)`` from feeding class ``q``'s auxiliary samples alone to ``G_t`` (``g_{L_q}``, one SGD
pass of the clients' recipe: ``−step · Σ_{x ∈ aux_q} ∂ℓ/∂W``, gradients at ``G_t``).

Eq. 6, per output node ``p`` and hidden unit ``i``::

    Ra_{p,i} = (Q − 1) ΔW^(p)_(p,i) / (Σ_j ΔW^(j)_(p,i) − ΔW^(p)_(p,i))

For cross-entropy with non-negative hidden activations the own-class update is positive
and the others' negative, so ``Ra`` is negative: the filter keeps ``|Ra_{p,i}| > T_Ra``
(``T_Ra = 1.25``) and the loss uses ``Ra_p = |mean_i Ra_{p,i}|`` (the paper: "their average
value and its corresponding absolute value").

Eq. 7, per kept component (``u = ΔW^(p)_(p,i)`` per auxiliary sample of class ``p``, ``u/Ra``
the mean per-sample update of the other classes on the same weight)::

    u N̂_{p,i} + (N − N̂_{p,i}) u / Ra_{p,i} = K (W^{G_{t+1}}_(p,i) − W^{G_t}_(p,i))

(the paper writes it with ``n_a^p`` multiplied through). ``N̂_p`` is the mean of
``N̂_{p,i}`` over the kept components, and ``v_pt = [N̂_1 … N̂_Q]`` is the estimate. The
``K ΔG`` on the right is the *sum* of the clients' updates: it assumes the unweighted FedAvg
of Eq. 4 (``G_{t+1} = G_t + (1/K) Σ_j Δ_j``).

Estimators (``estimator=``):

``paper``
    Eq. 7 exactly as above.
``pooled``
    Eq. 7 with the kept components pooled before dividing (``Σ_i numerator / Σ_i
    denominator``) instead of averaging the per-component solutions; insensitive to the
    components whose own update is tiny (an extension, not in the paper).
``lstsq``
    non-negative least squares of ``K ΔG`` on all the classes' per-sample templates
    (``K ΔG_(p,i) ≈ Σ_q N_q u_q(p,i)``), scaled to sum to ``N`` — the full linear model
    that Eq. 7 approximates by replacing the other classes with their mean (an extension).

``calibrate=True`` replaces the recipe's step by the one that makes ``Σ_p N̂_p = N`` (the
estimates are affine in the step, so it is one division): it absorbs momentum, drift within
local training and learning-rate schedules the recipe cannot describe exactly.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import numpy.typing as npt
import torch
import torch.nn.functional as F
from torch import nn

from secure_fl.stats import StatisticDeclaration
from secure_fl.training import FlatLayout, output_linear

__all__ = [
    "MONITOR_TOTAL",
    "RATIO_AVERAGES",
    "TEMPLATES",
    "Estimator",
    "ImbalanceDetector",
    "OutputLayer",
    "RatioAverage",
    "RatioMonitor",
    "Snapshot",
    "Templates",
    "auxiliary_class_updates",
    "class_ratios",
    "cosine_similarity",
    "estimate_composition",
    "monitor_total_declaration",
    "ratio_matrix",
    "recipe_step",
]

FloatArray = npt.NDArray[np.float64]
Estimator = Literal["paper", "pooled", "lstsq"]
ESTIMATORS = ("paper", "pooled", "lstsq")

MONITOR_TOTAL = "ratio_monitor_total"
"""Name of the monitor's per-round statistic: Σ_j |D_j| over the round's clients."""


def monitor_total_declaration(bound: int = 2**24) -> StatisticDeclaration:
    """The round's total sample count, learned by the server alone (Eq. 7 needs only the total)."""
    return StatisticDeclaration(
        name=MONITOR_TOTAL, length=1, bound=int(bound), kind="int", learners=frozenset({"server"}),
        per_round=True, record_sensitivity=1,
        description=(
            "Ratio Loss monitor: Σ_j |D_j| over the round's clients, for Eq. 7. The paper has each "
            "client upload its own count; here the server learns the total only. The bound is a "
            "public cap on one client's sample count."
        ),
    )


# --- the pure functions -------------------------------------------------------------------------

def _updates(aux_updates: npt.ArrayLike) -> FloatArray:
    u = np.asarray(aux_updates, dtype=np.float64)
    if u.ndim != 3 or u.shape[0] != u.shape[1] or u.shape[0] < 2:
        raise ValueError(f"aux_updates must be (C, C, s) with C >= 2, got shape {u.shape}")
    return u


def ratio_matrix(aux_updates: npt.ArrayLike) -> FloatArray:
    """Eq. 6: ``Ra[p, i] = (Q − 1) u[p, p, i] / (Σ_j u[j, p, i] − u[p, p, i])``; NaN where undefined.

    ``aux_updates[q, p, i]`` is the update of ``W_(p,i)`` from class ``q``'s auxiliary samples.
    """
    u = _updates(aux_updates)
    q = u.shape[0]
    own = u[np.arange(q), np.arange(q)]                # (C, s): u[p, p, :]
    others = u.sum(axis=0) - own                       # (C, s): Σ_{j≠p} u[j, p, :]
    with np.errstate(divide="ignore", invalid="ignore"):
        ra: FloatArray = (q - 1) * own / others
    ra[~np.isfinite(ra)] = np.nan
    return ra


RatioAverage = Literal["mean", "median", "pooled"]
RATIO_AVERAGES = ("mean", "median", "pooled")


def class_ratios(aux_updates: npt.ArrayLike, average: RatioAverage = "mean") -> FloatArray:
    """``ℝ = [Ra_1 … Ra_Q]`` for the loss (Eq. 10–11) from the per-class auxiliary updates.

    ``average="mean"`` is the paper's ``Ra_p = |mean_i Ra_{p,i}|`` over the defined components;
    it is dominated by any unit whose other-class update is near zero (one such unit gave
    Ra_p ≈ 3·10⁴ in a Fashion-MNIST run, i.e. a class weight of ~3,500). ``"median"`` takes
    ``|median_i Ra_{p,i}|`` (the typical component), ``"pooled"`` the ratio of the summed
    updates ``|(Q − 1) Σ_i ΔW^(p)_(p,i) / Σ_i Σ_{j≠p} ΔW^(j)_(p,i)|``. A class none of whose
    components is defined (no auxiliary sample, or dead units) gets 0.
    """
    if average not in RATIO_AVERAGES:
        raise ValueError(f"average must be one of {', '.join(RATIO_AVERAGES)}, got {average!r}")
    u = _updates(aux_updates)
    q = u.shape[0]
    if average == "pooled":
        own = u[np.arange(q), np.arange(q)].sum(axis=1)
        others = u.sum(axis=0).sum(axis=1) - own
        with np.errstate(divide="ignore", invalid="ignore"):
            pooled = np.abs((q - 1) * own / others)
        return np.where(np.isfinite(pooled), pooled, 0.0)
    ra = ratio_matrix(u)
    out = np.zeros(q)
    for p in range(q):
        finite = ra[p][np.isfinite(ra[p])]
        if finite.size:
            out[p] = abs(float(finite.mean() if average == "mean" else np.median(finite)))
    return out


def _per_sample(u: FloatArray, aux_counts: FloatArray) -> FloatArray:
    with np.errstate(divide="ignore", invalid="ignore"):
        out = u / aux_counts[:, None, None]
    out[aux_counts == 0] = 0.0
    return out


def _solve_paper(per: FloatArray, target: FloatArray, total: float, threshold: float,
                 pooled: bool) -> tuple[FloatArray, FloatArray]:
    """Eq. 7 per class as ``N̂_p = slope_p + offset_p``: ``slope`` from ``K ΔG``, ``offset`` from ``N``.

    Dividing the step of the templates ``per`` by λ multiplies ``slope`` by λ and leaves
    ``offset`` unchanged, which is what calibration uses.
    """
    q = per.shape[0]
    own = per[np.arange(q), np.arange(q)]                       # u per sample (C, s)
    others = (per.sum(axis=0) - own) / (q - 1)                  # mean per-sample update of the others
    with np.errstate(divide="ignore", invalid="ignore"):
        ra = own / others                                       # = Eq. 6 when n_a is equal across classes
        denominator = own - others                              # u − u/Ra
    slope, offset = np.zeros(q), np.zeros(q)
    for p in range(q):
        ok = np.isfinite(ra[p]) & np.isfinite(denominator[p]) & (denominator[p] != 0)
        pick = ok & (np.abs(ra[p]) > threshold)
        if not pick.any():
            pick = ok
        if not pick.any():
            continue
        num_t, num_n, den = target[p][pick], others[p][pick], denominator[p][pick]
        if pooled:
            slope[p] = num_t.sum() / den.sum()
            offset[p] = -total * num_n.sum() / den.sum()
        else:
            slope[p] = float(np.mean(num_t / den))
            offset[p] = -total * float(np.mean(num_n / den))
    return slope, offset


def _nnls(a: FloatArray, b: FloatArray) -> FloatArray:
    from scipy.optimize import nnls

    scale = float(np.abs(a).max()) or 1.0
    x, _ = nnls(a / scale, b / scale, maxiter=50 * a.shape[1])
    return np.asarray(x, dtype=np.float64)


def estimate_composition(
    global_before: npt.ArrayLike,
    global_after: npt.ArrayLike,
    aux_updates: npt.ArrayLike,
    total_samples: float,
    *,
    aux_counts: npt.ArrayLike,
    clients: int,
    threshold: float = 1.25,
    estimator: Estimator = "paper",
    calibrate: bool = False,
) -> FloatArray:
    """The monitor's estimate ``v_pt = [N̂_1 … N̂_Q]`` of the round's class counts (Eq. 7).

    ``global_before`` / ``global_after``: the output-layer weights ``W`` (C × s) of ``G_t`` and
    ``G_{t+1}`` (or their flat weight entries in row-major order); ``aux_updates``: (C, C, s),
    ``[q, p, i]`` the update of ``W_(p,i)`` from class ``q``'s ``aux_counts[q]`` auxiliary
    samples at ``G_t`` with the clients' step (:func:`auxiliary_class_updates`);
    ``total_samples``: ``N = Σ_j |D_j|`` over the round's ``clients`` (``K``) clients, which
    were averaged unweighted (Eq. 4). Entries are clipped at 0; the result sums to about ``N``
    (exactly with ``calibrate`` or ``estimator="lstsq"``). See the module docstring for the
    estimators and calibration.
    """
    u = _updates(aux_updates)
    c, s = u.shape[0], u.shape[2]
    before = np.asarray(global_before, dtype=np.float64).reshape(c, s)
    after = np.asarray(global_after, dtype=np.float64).reshape(c, s)
    n_a = np.asarray(aux_counts, dtype=np.float64).reshape(-1)
    if n_a.shape != (c,) or np.any(n_a < 0):
        raise ValueError(f"aux_counts must hold {c} non-negative counts, got {n_a.tolist()}")
    if isinstance(clients, bool) or not isinstance(clients, (int, np.integer)) or clients < 1:
        raise ValueError(f"clients must be a positive integer, got {clients!r}")
    total = float(total_samples)
    if not (math.isfinite(total) and total >= 0):
        raise ValueError(f"total_samples must be a finite non-negative number, got {total_samples!r}")
    if estimator not in ESTIMATORS:
        raise ValueError(f"estimator must be one of {', '.join(ESTIMATORS)}, got {estimator!r}")
    if not threshold >= 0:
        raise ValueError(f"threshold must be >= 0, got {threshold}")
    per = _per_sample(u, n_a)
    target = clients * (after - before)                   # K ΔG: the sum of the clients' updates
    if estimator == "lstsq":
        present = n_a > 0
        a = per[present].reshape(int(present.sum()), -1).T    # (C·s, classes with aux data)
        x = np.zeros(c)
        x[present] = _nnls(a, target.reshape(-1))
        return x * (total / x.sum()) if x.sum() > 0 else x
    slope, offset = _solve_paper(per, target, total, threshold, pooled=estimator == "pooled")
    lam = 1.0
    if calibrate and slope.sum() != 0:
        # N̂(λ) = λ·slope + offset with Σ N̂ = N: the step that explains the total.
        solved = (total - offset.sum()) / slope.sum()
        lam = solved if solved > 0 else 1.0
    return np.asarray(np.clip(lam * slope + offset, 0.0, None), dtype=np.float64)


def cosine_similarity(a: npt.ArrayLike, b: npt.ArrayLike) -> float:
    """``a·b / (‖a‖ ‖b‖)``; NaN when either is zero."""
    x, y = np.asarray(a, dtype=np.float64).reshape(-1), np.asarray(b, dtype=np.float64).reshape(-1)
    if x.shape != y.shape:
        raise ValueError(f"shapes differ: {x.shape} vs {y.shape}")
    norm = float(np.linalg.norm(x) * np.linalg.norm(y))
    return float(x @ y / norm) if norm > 0 else math.nan


def recipe_step(lr: float, *, epochs: int, batch_size: int, momentum: float = 0.0) -> float:
    """The per-sample step of the clients' recipe: ``lr · E / B``, × ``1/(1 − β)`` with momentum β.

    Local SGD moves the weights by ``−(lr/B) Σ_batch ∇ℓ`` per step; over E epochs each sample
    contributes E times; heavy-ball momentum amplifies a persistent gradient by up to 1/(1−β).
    """
    if not (lr > 0 and epochs >= 1 and batch_size >= 1 and 0.0 <= momentum < 1.0):
        raise ValueError(f"bad recipe: lr={lr}, epochs={epochs}, batch_size={batch_size}, momentum={momentum}")
    return lr * epochs / batch_size / (1.0 - momentum)


# --- the model side -----------------------------------------------------------------------------

@dataclass(frozen=True, eq=False)
class OutputLayer:
    """The model's last ``nn.Linear`` (the link weights ``W`` between HL and the output nodes)."""

    module: nn.Linear
    weight: slice
    """Where ``W`` (C × s, row-major) lies in the model's flat vector."""
    num_classes: int
    hidden: int

    @classmethod
    def of(cls, model: nn.Module, layout: FlatLayout, num_classes: int) -> OutputLayer:
        name, layer = output_linear(model, num_classes)
        weight = layout.slice_of(f"{name}.weight" if name else "weight")
        return cls(module=layer, weight=weight, num_classes=num_classes, hidden=layer.in_features)

    def weights(self, vector: torch.Tensor | npt.ArrayLike) -> FloatArray:
        """``W`` (C × s, float64) of a flat model vector (or of a difference of two)."""
        v = vector.detach().cpu().numpy() if isinstance(vector, torch.Tensor) else np.asarray(vector)
        return v.astype(np.float64).reshape(-1)[self.weight].reshape(self.num_classes, self.hidden)


def auxiliary_class_updates(
    model: nn.Module,
    layout: FlatLayout,
    vector: torch.Tensor,
    aux_x: torch.Tensor,
    aux_y: torch.Tensor,
    *,
    num_classes: int,
    step: float,
    class_weight: npt.ArrayLike | None = None,
    output: OutputLayer | None = None,
    chunk: int = 1024,
) -> FloatArray:
    """(C, C, s): ``[q, p, i] = −step · Σ_{x ∈ aux_q} w_q ∂CE(x)/∂W_(p,i)`` at the model ``vector``.

    The last-layer gradient of cross-entropy is ``(softmax − onehot) ⊗ h`` (``h`` the input of
    the output layer), computed in closed form in eval mode; ``class_weight`` (the clients'
    per-class loss weights, e.g. Ratio Loss's ``α + β Ra_p``) scales class ``q``'s template.
    The model's weights and mode are restored afterwards.
    """
    output = output or OutputLayer.of(model, layout, num_classes)
    weights = None if class_weight is None else torch.as_tensor(np.asarray(class_weight, dtype=np.float32))
    saved = layout.flatten()
    was_training = model.training
    captured: list[torch.Tensor] = []
    handle = output.module.register_forward_hook(lambda _m, inputs, _out: captured.append(inputs[0].detach()))
    sums = torch.zeros(num_classes, num_classes, output.hidden, dtype=torch.float64)
    try:
        layout.load(vector.to(saved.device, torch.float32))
        model.eval()
        with torch.no_grad():
            for begin in range(0, int(aux_y.shape[0]), chunk):
                captured.clear()
                x, y = aux_x[begin : begin + chunk], aux_y[begin : begin + chunk]
                logits = model(x).float()
                h = captured[0].float().reshape(x.shape[0], -1)
                err = torch.softmax(logits, dim=1) - F.one_hot(y, num_classes).to(logits.dtype)   # (n, C)
                if weights is not None:
                    err = err * weights.to(err.device)[y][:, None]
                onehot = F.one_hot(y, num_classes).to(torch.float64).cpu()                       # (n, Q)
                per = (err[:, :, None] * h[:, None, :]).to(torch.float64).cpu()                   # (n, C, s)
                sums += torch.einsum("nq,ncs->qcs", onehot, per)
    finally:
        handle.remove()
        layout.load(saved)
        model.train(was_training)
    return -step * sums.numpy()


# --- imbalance detection ------------------------------------------------------------------------

@dataclass
class ImbalanceDetector:
    """Flags global imbalance when a similar imbalanced composition persists (the paper's Fig. 1).

    A round's estimate is *imbalanced* when its largest class exceeds ``ratio`` times its
    smallest (counts floored at 1). Two consecutive estimates are *similar* when their rarest
    class is the same and their cosine similarity is ≥ ``similarity``. The detector fires after
    ``rounds`` consecutive imbalanced estimates, each similar to the previous one, and stays
    fired. (The rarest-class condition matters: near-balanced compositions all have cosine
    ≈ 1 with each other, but their rarest class changes from round to round.)

    The defaults were set on the Fashion-MNIST runs of Fig. 2 (Γ = 1) and Table 2 (Γ = 10, 50):
    with them the balanced run is never flagged (its estimates' max/min has median 2.2) and the
    eight imbalanced runs are flagged at rounds 2–5.
    """

    rounds: int = 3
    similarity: float = 0.8
    ratio: float = 5.0
    streak: int = 0
    previous: list[float] | None = None
    detected_round: int | None = None
    history: list[bool] = field(default_factory=list)

    def observe(self, round: int, estimate: npt.ArrayLike) -> bool:
        """Feed one round's estimate; returns whether imbalance is detected (now or before)."""
        v = np.clip(np.asarray(estimate, dtype=np.float64), 0.0, None)
        imbalanced = bool(v.max() > self.ratio * max(float(v.min()), 1.0)) if v.size else False
        similar = (self.previous is not None and int(np.argmin(self.previous)) == int(np.argmin(v))
                   and cosine_similarity(v, self.previous) >= self.similarity)
        self.streak = (self.streak + 1 if similar else 1) if imbalanced else 0
        self.previous = [float(x) for x in v]
        if self.detected_round is None and self.streak >= self.rounds:
            self.detected_round = int(round)
        self.history.append(self.detected_round is not None)
        return self.detected_round is not None

    def state_dict(self) -> dict[str, object]:
        return {"streak": self.streak, "previous": self.previous, "detected_round": self.detected_round,
                "history": list(self.history)}

    def load_state_dict(self, state: dict[str, object]) -> None:
        self.streak = int(state["streak"])  # type: ignore[call-overload]
        previous = state["previous"]
        self.previous = None if previous is None else [float(x) for x in previous]  # type: ignore[attr-defined]
        detected = state["detected_round"]
        self.detected_round = None if detected is None else int(detected)  # type: ignore[call-overload]
        self.history = [bool(x) for x in state["history"]]  # type: ignore[attr-defined]


# --- the stateful helper ------------------------------------------------------------------------

Templates = Literal["start", "midpoint"]
TEMPLATES = ("start", "midpoint")


@dataclass(frozen=True, eq=False)
class Snapshot:
    """What the monitor computes from one global model: ``W`` (C × s) and the unit-step updates (C, C, s)."""

    weights: FloatArray
    updates: FloatArray


class RatioMonitor:
    """The server's monitor over a run: the auxiliary set, the output layer, Eq. 6–7.

    :meth:`snapshot` evaluates a global model on the auxiliary set (its output weights and the
    per-class auxiliary updates with a unit step); :meth:`ratios` gives ℝ of a snapshot;
    :meth:`estimate` gives ``v_pt`` from the snapshots of ``G_t`` and ``G_{t+1}``.

    ``templates="start"`` uses the updates at ``G_t`` — the paper, explicitly ("feed samples of
    every class in the auxiliary data singly to the same global model of round t, i.e., G_t"),
    hence the default; ``"midpoint"`` their mean at
    ``G_t`` and ``G_{t+1}`` — the trapezoid rule along the round's path, which corrects for the
    gradients shrinking during local training (an extension; the monitor holds both models
    anyway, and ``G_{t+1}``'s updates are the next round's ``G_t`` updates, so it costs nothing).
    """

    def __init__(self, *, aux_x: torch.Tensor, aux_y: torch.Tensor, num_classes: int, threshold: float = 1.25,
                 estimator: Estimator = "paper", calibrate: bool = False,
                 ratio_average: RatioAverage = "mean", templates: Templates = "start") -> None:
        if aux_x.shape[0] != aux_y.shape[0] or aux_y.numel() == 0:
            raise ValueError("the auxiliary set needs as many labels as samples, and at least one")
        if templates not in TEMPLATES:
            raise ValueError(f"templates must be one of {', '.join(TEMPLATES)}, got {templates!r}")
        self.aux_x, self.aux_y = aux_x, aux_y.long()
        self.num_classes = num_classes
        self.aux_counts = np.bincount(self.aux_y.cpu().numpy(), minlength=num_classes).astype(np.float64)
        self.threshold, self.estimator, self.calibrate = threshold, estimator, calibrate
        self.ratio_average, self.templates = ratio_average, templates
        self.output: OutputLayer | None = None

    def snapshot(self, model: nn.Module, layout: FlatLayout, vector: torch.Tensor) -> Snapshot:
        """Output weights and per-class auxiliary updates (unit step) of the global model ``vector``."""
        if self.output is None:
            self.output = OutputLayer.of(model, layout, self.num_classes)
        updates = auxiliary_class_updates(model, layout, vector, self.aux_x, self.aux_y,
                                          num_classes=self.num_classes, step=1.0, output=self.output)
        return Snapshot(weights=self.output.weights(vector), updates=updates)

    def ratios(self, snapshot: Snapshot) -> FloatArray:
        """ℝ of a global model (a property of the model and the auxiliary data)."""
        return class_ratios(snapshot.updates, self.ratio_average)

    def estimate(self, before: Snapshot, after: Snapshot, *, total: float, clients: int, step: float,
                 class_weight: Sequence[float] | npt.ArrayLike | None = None,
                 templates: Templates | None = None, estimator: Estimator | None = None) -> FloatArray:
        """``v_pt`` of the round from ``G_t`` (``before``) to ``G_{t+1}`` (``after``).

        ``step`` is the clients' per-sample step (:func:`recipe_step`), ``class_weight`` the
        per-class loss weights they trained with (each scales its class's template);
        ``templates`` / ``estimator`` override the monitor's own choice.
        """
        kind = templates or self.templates
        updates = before.updates if kind == "start" else 0.5 * (before.updates + after.updates)
        updates = step * updates
        if class_weight is not None:
            updates = updates * np.asarray(class_weight, dtype=np.float64).reshape(-1)[:, None, None]
        return estimate_composition(before.weights, after.weights, updates, total,
                                    aux_counts=self.aux_counts, clients=clients, threshold=self.threshold,
                                    estimator=estimator or self.estimator, calibrate=self.calibrate)
