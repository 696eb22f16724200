"""Ratio Loss (Wang, Xu, Wang, Zhu — AAAI'21): a server-side monitor of each round's class
composition, and a loss whose class weights come from that monitor.

The method is two halves (:mod:`secure_fl.algorithms.base`). Per round ``t``:

1. **broadcast** (:class:`RatioLossServer`) — the server feeds its auxiliary samples
   (``aux_per_class`` per class of its own held-out training samples) class by class to ``G_t``
   on its copy of the public model and gets the per-class output-layer updates ``g_{L_q}``
   (:func:`~secure_fl.algorithms.ratio_monitor.auxiliary_class_updates`), hence
   ``ℝ = [Ra_1 … Ra_Q]`` (Eq. 6). While mitigating it sends ℝ to the round's cohort with the
   model, as the broadcast vector ``ratio_weights`` (C float32; the runtime counts its bytes as
   ``ratio_weights_broadcast``).
2. **clients** (:class:`RatioLossClient`) — train with the run's loss. A client that received ℝ
   turns it into class weights ``α + β Ra_p`` (Eq. 11) of loss ``ratio``
   (:class:`~secure_fl.losses.RatioLoss`) and trains on ``−(α + β Ra_p) log f_p``; without ℝ
   (``mitigation = "off"``, or before the detector fired) it trains with whatever loss the run
   names (CE, Focal, GHMC, MSE, MFE): the monitored baselines.
3. **aggregate** — ``aggregation = "uniform"``: the paper's Eq. 4, ``G_{t+1} = G_t + (1/K) Σ_j Δ_j``:
   each client scales its own update by the public 1/K (K: the size of the cohort the update
   request names) and the server sums them as ``model_update``; ``"samples"``: FedAvg's
   |D_j|-weighted mean. Eq. 7 holds for the uniform mean only; with ``"samples"`` the monitor
   estimates a size-weighted composition.
4. **monitor** (``after_round``) — the round's ``N = Σ_j |D_j|`` is the declared statistic
   ``ratio_monitor_total`` (one integer per client, learned by the server only, through the
   run's statistics protocol); Eq. 7 on ``G_{t+1} − G_t`` with the public recipe's step
   (``lr_at(t)·E/B``) gives ``v_pt``
   (:func:`~secure_fl.algorithms.ratio_monitor.estimate_composition`), and the
   :class:`~secure_fl.algorithms.ratio_monitor.ImbalanceDetector` flags global imbalance when a
   similar imbalanced ``v_pt`` persists for ``detect_rounds`` rounds.

``mitigation``: ``"always"`` applies Ratio Loss from round 0 (the paper's Table 2 and the CLIMB
authors' re-implementation); ``"detect"`` from the round after the detector fires (the paper's
Fig. 1 workflow); ``"off"`` never.

**The server's data.** The monitor's auxiliary samples are the server's own: the training
samples outside every client's partition (``ServerSetup.holdout``), ``aux_per_class`` of each
class drawn with ``aux_seed``. A run must leave some out — the ``ratio`` partition at Γ > 1 does
for its minority classes, ``data.train_samples`` below the training-set size for every class —
and set-up fails saying so when it does not. The server never reads a client's data or counts.

**Server history.** Every round appends to :attr:`RatioLossServer.history` what the server
knows: the cohort and the contributors of N, the estimate ``v_pt``, the estimates of the other
estimator/template variants (:data:`VARIANTS`), N, ℝ and the detector's state. It is the server
half's checkpointed state, so the run store keeps it with the run's latest checkpoint.

**Simulator telemetry.** How good the estimate is needs the round's *true* composition, which
no party has. The simulator's harness scores it (:meth:`RatioLossMethod.simulator_telemetry`,
from every node's class counts): the cosine of ``v_pt`` and of each variant to the truth, and
the partition's mean local/global cosine CS. They are stored as round metrics named ``sim.*``;
:func:`monitor_history` joins them to the stored server history for the report (Fig. 2,
Tables 2 and 4), and :func:`score_history` scores a history in memory.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, cast

import numpy as np
import numpy.typing as npt
import torch

from protocols import PolicyError
from secure_fl.algorithms.base import (
    SIMULATOR_TELEMETRY_PREFIX,
    ClientContext,
    ContributionContext,
    HeldOut,
    Method,
    RunInfo,
    ServerMethod,
    ServerRound,
    ServerSetup,
    register_algorithm,
)
from secure_fl.algorithms.fedavg import FedAvgClient, FedAvgParams, FedAvgServer
from secure_fl.algorithms.ratio_monitor import (
    ESTIMATORS,
    MONITOR_TOTAL,
    RATIO_AVERAGES,
    TEMPLATES,
    Estimator,
    ImbalanceDetector,
    RatioAverage,
    RatioMonitor,
    Snapshot,
    Templates,
    cosine_similarity,
    monitor_total_declaration,
    recipe_step,
)
from secure_fl.losses import RatioLoss
from secure_fl.snapshots import load_state
from secure_fl.stats import MODEL_UPDATE, StatisticDeclaration
from secure_fl.training import LocalObjective, LocalTrainer

__all__ = [
    "BROADCAST",
    "MONITOR_COSINE",
    "PARTITION_COSINE",
    "VARIANTS",
    "RatioLossClient",
    "RatioLossMethod",
    "RatioLossParams",
    "RatioLossServer",
    "auxiliary_from_holdout",
    "monitor_history",
    "partition_cosine",
    "score_history",
    "true_composition",
    "variant_metric",
]

BROADCAST = "ratio_weights"
"""Name of the broadcast vector ℝ (its bytes are counted as ``ratio_weights_broadcast``)."""

VARIANTS: tuple[tuple[Estimator, Templates], ...] = (
    ("paper", "start"), ("paper", "midpoint"), ("pooled", "start"), ("lstsq", "start"), ("lstsq", "midpoint"))
"""Estimator/template pairs whose estimates the server also records every round (``"paper/start"`` …)."""

MONITOR_COSINE = "monitor_cosine"
"""Simulator telemetry: cos(v_pt, the round's true composition) (stored as ``sim.monitor_cosine``)."""
PARTITION_COSINE = "partition_cosine"
"""Simulator telemetry: mean over clients of CS_j = cos(v_j, V), the paper's local/global mismatch."""

Aggregation = Literal["uniform", "samples"]
Mitigation = Literal["always", "detect", "off"]


@dataclass(frozen=True, kw_only=True)
class RatioLossParams(FedAvgParams):
    aggregation: Aggregation = "uniform"
    """``uniform``: Eq. 4's unweighted mean over the K clients (what Eq. 7 assumes); ``samples``: FedAvg's."""
    mitigation: Mitigation = "always"
    """When clients train with ℝ: ``always``, after the detector fires (``detect``), or never (``off``)."""
    aux_per_class: int = 32
    """n_a: auxiliary samples per class (the paper: 32; the CLIMB authors' re-implementation: 5)."""
    threshold: float = 1.25
    """T_Ra: Eq. 7 uses the components with |Ra_{p,i}| > T_Ra."""
    estimator: str = "paper"
    """``paper`` (Eq. 7), ``pooled`` or ``lstsq`` (extensions; see :mod:`~secure_fl.algorithms.ratio_monitor`)."""
    ratio_average: str = "median"
    """How ℝ averages the components Ra_{p,i} of class p: ``mean`` (the paper's words; unstable, see
    :func:`~secure_fl.algorithms.ratio_monitor.class_ratios`), ``median`` or ``pooled``."""
    templates: str = "start"
    """Eq. 7's per-class updates at ``G_t`` (``start``, the paper) or the mean of those at ``G_t`` and
    ``G_{t+1}`` (``midpoint``, an extension)."""
    calibrate: bool = False
    """Fit the step so that Σ_p N̂_p = N instead of taking it from the recipe (lr·E/B)."""
    detect_rounds: int = 3
    detect_similarity: float = 0.8
    detect_ratio: float = 5.0
    """The detector: ``detect_rounds`` consecutive estimates with max/min > ``detect_ratio``, each with
    the same rarest class as the previous one and cosine ≥ ``detect_similarity`` to it."""
    total_bound: int = 2**24
    """Public per-client bound of the ``ratio_monitor_total`` sum."""
    aux_seed: int = 0
    """Seed of the draw of the auxiliary samples among the server's held-out ones."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.aggregation not in ("uniform", "samples"):
            raise ValueError(f"aggregation must be 'uniform' or 'samples', got {self.aggregation!r}")
        if self.mitigation not in ("always", "detect", "off"):
            raise ValueError(f"mitigation must be 'always', 'detect' or 'off', got {self.mitigation!r}")
        if self.ratio_average not in RATIO_AVERAGES:
            raise ValueError(f"ratio_average must be one of {', '.join(RATIO_AVERAGES)}, got {self.ratio_average!r}")
        if self.templates not in TEMPLATES:
            raise ValueError(f"templates must be one of {', '.join(TEMPLATES)}, got {self.templates!r}")
        if self.estimator not in ESTIMATORS:
            raise ValueError(f"estimator must be one of {', '.join(ESTIMATORS)}, got {self.estimator!r}")
        for name in ("aux_per_class", "detect_rounds", "total_bound"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if isinstance(self.aux_seed, bool) or not isinstance(self.aux_seed, int) or self.aux_seed < 0:
            raise ValueError(f"aux_seed must be a non-negative integer, got {self.aux_seed!r}")
        if not (isinstance(self.threshold, (int, float)) and math.isfinite(self.threshold) and self.threshold >= 0):
            raise ValueError(f"threshold must be a finite number >= 0, got {self.threshold!r}")
        if not (isinstance(self.detect_similarity, (int, float)) and -1.0 <= self.detect_similarity <= 1.0):
            raise ValueError(f"detect_similarity must lie in [-1, 1], got {self.detect_similarity!r}")
        if not (isinstance(self.detect_ratio, (int, float)) and math.isfinite(self.detect_ratio)
                and self.detect_ratio >= 1.0):
            raise ValueError(f"detect_ratio must be a finite number >= 1, got {self.detect_ratio!r}")
        if not isinstance(self.calibrate, bool):
            raise ValueError(f"calibrate must be true or false, got {self.calibrate!r}")  # noqa: TRY004


def _needs_ratio_loss(loss: object) -> RatioLoss:
    """The run's loss, which must be Ratio Loss wherever ℝ is applied (a config error otherwise)."""
    if not isinstance(loss, RatioLoss):
        raise ValueError(  # noqa: TRY004  (a config error, reported like the others)
            f"method 'ratio_loss' applies Ratio Loss through loss 'ratio', but this run's loss is "
            f"{getattr(loss, 'name', type(loss).__name__)!r}: set [loss] name = \"ratio\", or "
            "method.mitigation = \"off\" for a monitored baseline")
    return loss


# --- the server's auxiliary data ------------------------------------------------------------------

def auxiliary_from_holdout(holdout: HeldOut | None, *, num_classes: int, per_class: int,
                           seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Up to ``per_class`` samples of each class of the server's held-out training samples: ``(x, y)``.

    One generator, classes in order, so a run's seed fixes the draw. Raises ``ValueError`` when
    the server holds no sample at all or none of some class: the monitor needs every class.
    """
    advice = ("leave some training samples out of every client's partition (data.train_samples below "
              "the training set's size, or the ratio partition at global_ratio > 1 for its minority classes)")
    if holdout is None or len(holdout) == 0:
        raise ValueError("ratio_loss: the server holds no held-out training samples, so its monitor has no "
                         f"auxiliary data; {advice}")
    labels = holdout.labels
    rng = np.random.default_rng(seed)
    chosen, short = [], []
    for k in range(num_classes):
        idx = np.flatnonzero(labels == k)
        if idx.size == 0:
            short.append(k)
            continue
        chosen.append(rng.choice(idx, size=min(per_class, idx.size), replace=False))
    if short:
        raise ValueError(f"ratio_loss: the server's held-out samples hold no sample of class(es) {short}, so "
                         f"its monitor has no auxiliary sample of them; {advice}")
    return holdout.take(np.sort(np.concatenate(chosen)))


# --- the server half ------------------------------------------------------------------------------

class RatioLossServer(FedAvgServer):
    """The monitor: ℝ at every global model, the round total, Eq. 7, the detector (see the module docstring)."""

    params: RatioLossParams

    def __init__(self, params: RatioLossParams, info: RunInfo) -> None:
        super().__init__(params, info)
        self._total = monitor_total_declaration(params.total_bound)
        self.detector = self._new_detector()
        self.history: list[dict[str, Any]] = []
        """Per-round server knowledge (see the module docstring); checkpointed."""
        self.monitor: RatioMonitor | None = None
        self._model: LocalTrainer | None = None
        self._snapshot: Snapshot | None = None
        self._ratios: np.ndarray | None = None
        self._sent: torch.Tensor | None = None
        """ℝ as broadcast (float32): the clients' class weights come from these values."""
        self._weights: np.ndarray | None = None
        self._prepared = -1

    def _new_detector(self) -> ImbalanceDetector:
        p = self.params
        return ImbalanceDetector(rounds=p.detect_rounds, similarity=p.detect_similarity, ratio=p.detect_ratio)

    def setup(self, ctx: ServerSetup) -> None:
        """The auxiliary set from the server's held-out samples; the monitor on the server's model."""
        if ctx.model is None:
            raise RuntimeError("ratio_loss: the server half needs its copy of the public model (ServerSetup.model)")
        if self.params.mitigation != "off":
            _needs_ratio_loss(ctx.model.loss)
        p = self.params
        x, y = auxiliary_from_holdout(ctx.holdout, num_classes=ctx.info.num_classes, per_class=p.aux_per_class,
                                      seed=p.aux_seed)
        self._model = ctx.model
        self.monitor = RatioMonitor(
            aux_x=torch.from_numpy(np.ascontiguousarray(x)).to(ctx.device),
            aux_y=torch.from_numpy(np.ascontiguousarray(y)).long().to(ctx.device),
            num_classes=ctx.info.num_classes, threshold=p.threshold,
            # the three strings were checked against ESTIMATORS / RATIO_AVERAGES / TEMPLATES in
            # RatioLossParams.__post_init__
            estimator=cast(Estimator, p.estimator), calibrate=p.calibrate,
            ratio_average=cast(RatioAverage, p.ratio_average), templates=cast(Templates, p.templates))
        ctx.stats.declare(self._total)

    def mitigating(self, round: int) -> bool:
        """Whether the clients of ``round`` train with ℝ (public: the server decides and sends it)."""
        if self.params.mitigation == "always":
            return True
        if self.params.mitigation == "off":
            return False
        detected = self.detector.detected_round
        return detected is not None and detected < round

    def _snap(self, vector: torch.Tensor) -> Snapshot:
        if self.monitor is None or self._model is None:
            raise RuntimeError("ratio_loss: setup() was not called")
        return self.monitor.snapshot(self._model.model, self._model.layout, vector)

    def _prepare(self, round: int, snapshot: Snapshot) -> None:
        """``G_round``'s snapshot, ℝ and (while mitigating) the class weights the clients will use."""
        if self.monitor is None or self._model is None:
            raise RuntimeError("ratio_loss: setup() was not called")
        self._snapshot, self._prepared = snapshot, round
        self._ratios = self.monitor.ratios(snapshot)
        self._sent = torch.as_tensor(self._ratios, dtype=torch.float32)
        self._weights = None
        if self.mitigating(round):
            weights = _needs_ratio_loss(self._model.loss).class_weights(self._sent)
            self._weights = weights.detach().cpu().numpy().astype(np.float64)

    def broadcast(self, ctx: ServerRound) -> dict[str, torch.Tensor]:
        if self._prepared != ctx.round:  # round 0, or the first round after a resume
            self._prepare(ctx.round, self._snap(ctx.global_vector))
        if not self.mitigating(ctx.round) or self._sent is None:
            return {}
        return {BROADCAST: self._sent}

    def aggregate(self, ctx: ServerRound) -> torch.Tensor:
        if self.params.aggregation == "samples":
            return super().aggregate(ctx)
        # Eq. 4: each client scaled its own update by the public 1/K (RatioLossClient.update_weight)
        return self.step(ctx, ctx.update_sum(MODEL_UPDATE))

    def after_round(self, ctx: ServerRound) -> None:
        """N through the declared sum, then Eq. 7 on G_t → G_{t+1}, the detector and the history."""
        monitor, before = self.monitor, self._snapshot
        if monitor is None or before is None or self._prepared != ctx.round:
            raise RuntimeError("ratio_loss: the monitor was not prepared for this round")
        r = ctx.round
        release = ctx.request(self._total)
        if release.value is None:
            raise RuntimeError(f"{MONITOR_TOTAL}: the protocol did not reveal the round's total to the server")
        total = release.scalar()
        t = self.info.training
        step = recipe_step(t.lr_at(r), epochs=t.epochs, batch_size=t.batch_size, momentum=t.momentum)
        k = len(ctx.cohort)
        mitigating = self.mitigating(r)
        weights = self._weights if mitigating else None
        after = self._snap(ctx.global_vector)          # G_{t+1}: also the next round's snapshot
        estimate = monitor.estimate(before, after, total=total, clients=k, step=step, class_weight=weights)
        variants = {
            f"{e}/{tm}": [float(v) for v in monitor.estimate(before, after, total=total, clients=k, step=step,
                                                             class_weight=weights, templates=tm, estimator=e)]
            for e, tm in VARIANTS
        }
        detected = self.detector.observe(r, estimate)
        self.history.append({
            "round": r, "cohort": [int(c) for c in ctx.cohort], "contributors": [int(c) for c in release.contributors],
            "estimate": [float(v) for v in estimate], "variant_estimates": variants, "total": total, "clients": k,
            "ratios": [float(v) for v in (self._ratios if self._ratios is not None else [])],
            "mitigating": mitigating, "detected": detected,
        })
        self._prepare(r + 1, after)

    def state_dict(self) -> dict[str, Any]:
        return {"history": [dict(h) for h in self.history], "detector": self.detector.state_dict(),
                "monitor": {"aux_counts": [] if self.monitor is None else self.monitor.aux_counts.tolist()}}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        expected = {"history", "detector", "monitor"}
        if set(state) != expected:
            raise ValueError(f"ratio_loss state needs keys {sorted(expected)}, got {sorted(state)}")
        self.history = [dict(h) for h in state["history"]]
        self.detector = self._new_detector()
        self.detector.load_state_dict(dict(state["detector"]))

    def describe(self) -> dict[str, Any]:
        return {"imbalance_detected_round": self.detector.detected_round} if self.history else {}


# --- the client half ------------------------------------------------------------------------------

class RatioLossClient(FedAvgClient):
    """Contributes |D_i| to the round total; trains with ℝ when the server sent it; scales by 1/K."""

    params: RatioLossParams

    def __init__(self, params: RatioLossParams, info: RunInfo) -> None:
        super().__init__(params, info)
        self.sources[MONITOR_TOTAL] = lambda ctx: np.array([ctx.data.num_samples], dtype=np.int64)

    def declarations(self) -> dict[str, StatisticDeclaration]:
        out = super().declarations()
        out[MONITOR_TOTAL] = monitor_total_declaration(self.params.total_bound)
        return out

    def local_objective(self, ctx: ClientContext) -> LocalObjective:
        """Ratio Loss weights α + β Ra_p from the broadcast ℝ; the run's plain loss when none came."""
        ratios = ctx.broadcast.get(BROADCAST)
        if ratios is None:
            return LocalObjective()
        if tuple(ratios.shape) != (ctx.num_classes,) or not bool(torch.isfinite(ratios).all()):
            raise PolicyError(f"{BROADCAST}: expected {ctx.num_classes} finite ratios, got shape {tuple(ratios.shape)}")
        loss = _needs_ratio_loss(ctx.trainer.loss)
        weights = loss.class_weights(ratios.to(torch.float32)).to(ctx.data.x.device)
        return LocalObjective(class_weight=weights)

    def update_weight(self, ctx: ContributionContext) -> float:
        """1/K for the uniform mean (K from the request, public); FedAvg's |D_i|/Σ|D_j| for ``samples``."""
        if self.params.aggregation == "samples":
            return super().update_weight(ctx)
        if ctx.cohort_size < 1:
            raise PolicyError("asked for a model update by a request that names no client")
        return 1.0 / ctx.cohort_size

    def scaled_update(self, ctx: ContributionContext) -> torch.Tensor:
        """Δ_i / K for the uniform mean (a division, as Eq. 4 writes it); FedAvg's scaling for ``samples``."""
        if self.params.aggregation == "samples" or ctx.update is None:
            return super().scaled_update(ctx)
        if ctx.cohort_size < 1:
            raise PolicyError("asked for a model update by a request that names no client")
        return ctx.update.delta / ctx.cohort_size


# --- the method, and the simulator's scoring of its monitor -------------------------------------

def true_composition(class_counts: Mapping[int, npt.ArrayLike], clients: Iterable[int]) -> np.ndarray:
    """Σ of the clients' class counts: a round's true composition (simulator knowledge)."""
    members = list(clients)
    if not members:
        raise ValueError("no client: the composition of an empty round is undefined")
    return np.asarray(np.sum([np.asarray(class_counts[c], dtype=np.int64) for c in members], axis=0),
                      dtype=np.int64)


def partition_cosine(class_counts: Iterable[npt.ArrayLike]) -> float:
    """Mean over clients (with data) of cos(v_j, V), V the counts over all clients (simulator knowledge)."""
    counts = [np.asarray(v, dtype=np.float64) for v in class_counts]
    if not counts:
        return math.nan
    overall = np.sum(counts, axis=0)
    similarities = [cosine_similarity(v, overall) for v in counts if v.sum() > 0]
    return float(np.mean(similarities)) if similarities else math.nan


def variant_metric(variant: str) -> str:
    """The telemetry name of a variant's cosine: ``paper/start`` → ``monitor_cosine.paper.start``."""
    return f"{MONITOR_COSINE}.{variant.replace('/', '.')}"


def _score(entry: Mapping[str, Any], truth: npt.ArrayLike) -> dict[str, Any]:
    v = np.asarray(truth, dtype=np.int64)
    return {**entry, "truth": [int(x) for x in v], "cosine": cosine_similarity(entry["estimate"], v),
            "variants": {k: cosine_similarity(est, v) for k, est in (entry.get("variant_estimates") or {}).items()}}


def score_history(history: Iterable[Mapping[str, Any]],
                  truth_by_round: Mapping[int, npt.ArrayLike]) -> list[dict[str, Any]]:
    """Copies of the server's history entries scored against the truth (simulator telemetry).

    Entries of rounds in ``truth_by_round`` gain ``truth``, ``cosine`` (of ``v_pt``) and
    ``variants`` (the cosine of each variant's estimate); the others are copied unscored.
    """
    return [_score(h, truth_by_round[int(h["round"])]) if int(h["round"]) in truth_by_round else dict(h)
            for h in history]


@register_algorithm("ratio_loss")
class RatioLossMethod(Method):
    """Monitored FedAvg whose clients train with Ratio Loss weights ℝ broadcast by the server."""

    Params = RatioLossParams
    Server = RatioLossServer
    Client = RatioLossClient
    params: RatioLossParams

    def simulator_telemetry(self, server: ServerMethod, *, round: int, cohort: tuple[int, ...],
                            class_counts: Mapping[int, npt.NDArray[np.int64]]) -> dict[str, float | None]:
        """The monitor's cosine to the round's truth (Σ counts of the contributors of N), per variant
        too, and the partition's CS: the harness scores the server's estimate, the server never does."""
        if not isinstance(server, RatioLossServer):
            raise TypeError(f"ratio_loss telemetry needs the ratio_loss server half, got {type(server).__name__}")
        entry = next((h for h in reversed(server.history) if h["round"] == round), None)
        if entry is None:
            return {}
        out: dict[str, float | None] = {MONITOR_COSINE: None}
        if entry["contributors"]:  # else no count reached N: nothing to score
            scored = _score(entry, true_composition(class_counts, entry["contributors"]))
            out[MONITOR_COSINE] = scored["cosine"]
            out.update({variant_metric(k): v for k, v in scored["variants"].items()})
        out[PARTITION_COSINE] = partition_cosine(class_counts.values())
        return out


def _number(value: float | None) -> float:
    return math.nan if value is None else float(value)


def monitor_history(state: Mapping[str, Any] | bytes | None,
                    metrics: Mapping[int, Mapping[str, float | None]] | None = None,
                    ) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """``(history, telemetry)`` of a stored ``ratio_loss`` run, for the report.

    ``state``: the server half's stored state (``Checkpoint.algorithm``; ``None`` when the run's
    checkpoint was dropped); ``metrics``: the stored round metrics by round, whose ``sim.*``
    simulator telemetry is joined to the history as each entry's ``cosine`` and ``variants``
    (and the partition's CS as ``telemetry["partition_cosine"]``). Without a state the history
    has one entry per round with telemetry.
    """
    if isinstance(state, (bytes, bytearray)):
        state = load_state(bytes(state))
    if state is None:
        history: list[dict[str, Any]] = []
        telemetry: dict[str, Any] = {}
    else:
        stored = state.get("history") if isinstance(state, Mapping) else None
        if not isinstance(state, Mapping) or not isinstance(stored, list):
            raise ValueError("not a ratio_loss algorithm state (no 'history')")
        history = [dict(h) for h in stored]
        telemetry = dict(state.get("monitor") or {})
    sim = {int(r): {k[len(SIMULATOR_TELEMETRY_PREFIX):]: v for k, v in values.items()
                    if k.startswith(SIMULATOR_TELEMETRY_PREFIX)} for r, values in (metrics or {}).items()}
    sim = {r: values for r, values in sim.items() if MONITOR_COSINE in values}
    if state is None:
        history = [{"round": r} for r in sorted(sim)]
    for h in history:
        values = sim.get(int(h["round"]))
        if values is None:
            continue
        h["cosine"] = _number(values[MONITOR_COSINE])
        h["variants"] = {variant: _number(values[variant_metric(variant)])
                         for variant in (f"{e}/{tm}" for e, tm in VARIANTS) if variant_metric(variant) in values}
    cs = [v.get(PARTITION_COSINE) for _, v in sorted(sim.items())]
    present = [float(c) for c in cs if c is not None]
    if present:
        telemetry[PARTITION_COSINE] = present[-1]
    return history, telemetry
