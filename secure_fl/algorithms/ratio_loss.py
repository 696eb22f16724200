"""Ratio Loss (Wang, Xu, Wang, Zhu — AAAI'21): a server-side monitor of each round's class
composition, and a loss whose class weights come from that monitor.

Per round ``t`` (method ``ratio_loss``):

1. **broadcast** — the server feeds its auxiliary samples (``aux_per_class`` per class, held
   out of the training set) class by class to ``G_t`` and gets the per-class output-layer
   updates ``g_{L_q}`` (:func:`~secure_fl.algorithms.ratio_monitor.auxiliary_class_updates`),
   hence ``ℝ = [Ra_1 … Ra_Q]`` (Eq. 6, ``Ra_p = |mean_i Ra_{p,i}|``). While mitigation is on it
   sends ℝ to the round's clients with the model, as the broadcast vector ``ratio_weights``
   (C float32, its bytes counted as ``ratio_weights_broadcast``).
2. **clients** — train with the run's loss. With loss ``ratio`` (:class:`~secure_fl.losses.RatioLoss`)
   the client turns ℝ into class weights ``α + β Ra_p`` (Eq. 11) and trains on
   ``−(α + β Ra_p) log f_p``; ``α``, ``β`` are the loss's parameters (``[loss] name = "ratio"
   alpha = 1.0 beta = 0.1``). With ``mitigation = "off"`` no ℝ is sent and the clients train with
   whatever loss the run names (CE, Focal, GHMC, MSE, MFE): the monitored baselines.
3. **aggregate** — ``aggregation = "uniform"``: the paper's Eq. 4, ``G_{t+1} = G_t + (1/K) Σ_j Δ_j``
   (each client scales its own update by the public 1/K, the sum goes through the run's update
   protocol as ``model_update``); ``"samples"``: FedAvg's |D_j|-weighted mean. Eq. 7 holds for
   the uniform mean only; with ``"samples"`` the monitor estimates a size-weighted composition.
4. **monitor** (``after_round``) — the round's ``N = Σ_j |D_j|`` is the declared statistic
   ``ratio_monitor_total`` (one integer per client, learned by the server only, through the
   run's statistics protocol); Eq. 7 on ``G_{t+1} − G_t`` gives ``v_pt``
   (:func:`~secure_fl.algorithms.ratio_monitor.estimate_composition`), and the
   :class:`~secure_fl.algorithms.ratio_monitor.ImbalanceDetector` flags global imbalance when a
   similar imbalanced ``v_pt`` persists for ``detect_rounds`` rounds.

``mitigation``: ``"always"`` applies Ratio Loss from round 0 (the paper's Table 2 and the CLIMB
authors' re-implementation); ``"detect"`` from the round after the detector fires (the paper's
Fig. 1 workflow); ``"off"`` never.

**Telemetry.** Every round appends to :attr:`RatioLossMethod.history`: the estimate ``v_pt``,
the true composition of the round's clients (``truth`` — simulator knowledge from the
clients' class counts, *never* used by the method), their cosine similarity, ``N``, ℝ and the
detector's state. It is part of the algorithm's ``state_dict``, so the run store keeps it with
the run's latest checkpoint; :func:`monitor_history` reads it back (the report uses it for
Fig. 2).

**Auxiliary data.** Training samples that no client holds. The runtime hands them over as
``SetupContext.holdout`` (a :class:`~secure_fl.algorithms.base.HeldOut`: the training rows outside
every client's partition), and the method draws ``aux_per_class`` of each class there. Without a
holdout (the method used outside the runtime) it loads the run's dataset itself (``aux_dataset``;
``"auto"`` picks the registered dataset whose training split contains the clients' samples) and
keeps the training samples that are in no client's data (matched by content); datasets split by
a seed (``digits``, ``mnist5k``) then need ``data_seed`` = the run's data seed, and a mismatch is
detected and reported. Both paths draw with one generator in class order, so they pick the same
samples (checked on every Ratio Loss config under ``experiments/``). Either way a run must leave
some training samples unassigned: the ``ratio`` partition at Γ > 1 does for its minority classes,
and ``data.train_samples`` below the training-set size does for every class.

**The server's model.** The runtime hands set-up its trainer (``SetupContext.trainer``: the
model, its flat layout, the clients' recipe and loss — public knowledge); the monitor evaluates
global vectors on that model (weights and mode restored) and so prepares every round's ℝ in
``broadcast``, round 0 and a resumed run's first round included. A runtime that gives no trainer
still works: the method then takes the first client context's trainer, computes that round's ℝ
at the first client update and logs its broadcast bytes in ``after_round`` (same values and byte
counts).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, cast

import numpy as np
import torch

from secure_fl.algorithms.base import (
    ClientContext,
    ClientUpdate,
    HeldOut,
    ServerContext,
    SetupContext,
    register_algorithm,
)
from secure_fl.algorithms.fedavg import FedAvg, FedAvgParams
from secure_fl.algorithms.local import ClientData, LocalObjective, LocalTrainer, LocalTraining
from secure_fl.algorithms.ratio_monitor import (
    ESTIMATORS,
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
from secure_fl.losses import Loss, RatioLoss

__all__ = [
    "BROADCAST",
    "RatioLossMethod",
    "RatioLossParams",
    "auxiliary_from_dataset",
    "auxiliary_from_holdout",
    "monitor_history",
]

BROADCAST = "ratio_weights"
"""Name of the broadcast vector ℝ (its bytes are counted as ``ratio_weights_broadcast``)."""

VARIANTS: tuple[tuple[Estimator, Templates], ...] = (
    ("paper", "start"), ("paper", "midpoint"), ("pooled", "start"), ("lstsq", "start"), ("lstsq", "midpoint"))
"""Estimator/template pairs whose cosine similarity the telemetry records every round besides the configured one."""

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
    aux_dataset: str = "auto"
    """Where the auxiliary samples come from when the runtime gives none (see the module docstring)."""
    aux_root: str = ""
    """The dataset's root directory ('' = the loader's default)."""
    data_seed: int = 0
    """The run's data seed, for datasets split by seed (digits, mnist5k)."""
    test_fraction: float = 0.2
    """The run's ``data.test_fraction``, for the same datasets."""
    aux_seed: int = 0
    """Seed of the draw of the auxiliary samples among the held-out ones."""

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
        for name in ("data_seed", "aux_seed"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be a non-negative integer, got {value!r}")
        if not (isinstance(self.threshold, (int, float)) and math.isfinite(self.threshold) and self.threshold >= 0):
            raise ValueError(f"threshold must be a finite number >= 0, got {self.threshold!r}")
        if not (isinstance(self.detect_similarity, (int, float)) and -1.0 <= self.detect_similarity <= 1.0):
            raise ValueError(f"detect_similarity must lie in [-1, 1], got {self.detect_similarity!r}")
        if not (isinstance(self.detect_ratio, (int, float)) and math.isfinite(self.detect_ratio)
                and self.detect_ratio >= 1.0):
            raise ValueError(f"detect_ratio must be a finite number >= 1, got {self.detect_ratio!r}")
        if not 0.0 < self.test_fraction < 1.0:
            raise ValueError(f"test_fraction must lie in (0, 1), got {self.test_fraction!r}")
        if not isinstance(self.calibrate, bool):
            raise ValueError(f"calibrate must be true or false, got {self.calibrate!r}")  # noqa: TRY004


# --- the auxiliary data ---------------------------------------------------------------------------

def _row_hashes(x: np.ndarray) -> np.ndarray:
    rows = np.ascontiguousarray(x).reshape(x.shape[0], -1)
    return np.fromiter((hash(r.tobytes()) for r in rows), dtype=np.int64, count=rows.shape[0])


KNOWN_SHAPES = {"digits": (1, 8, 8), "mnist5k": (1, 28, 28), "fashion-mnist": (1, 28, 28), "cifar10": (3, 32, 32)}
"""Sample shapes of the registered datasets: ``auto`` tries those matching the clients' shape first."""


@functools.lru_cache(maxsize=1)
def _load(name: str, root: str | None, seed: int, test_fraction: float) -> Any:
    """One dataset kept per process: the runs of a batch (usually one dataset) load it once."""
    from secure_fl.data import load_dataset

    return load_dataset(name, root=root, seed=seed, test_fraction=test_fraction)


def _draw_per_class(labels: np.ndarray, *, num_classes: int, per_class: int, seed: int, source: str,
                    pool: int) -> np.ndarray:
    """Sorted positions of up to ``per_class`` samples of each class (label −1: not available).

    One generator, classes in order: both sources of auxiliary data draw exactly alike, so a run
    gets the same samples whether the runtime hands them over or the method reloads the dataset.
    """
    rng = np.random.default_rng(seed)
    chosen, short = [], []
    for k in range(num_classes):
        idx = np.flatnonzero(labels == k)
        if idx.size == 0:
            short.append(k)
            continue
        chosen.append(rng.choice(idx, size=min(per_class, idx.size), replace=False))
    if short:
        raise ValueError(
            f"{source}: no training sample of class(es) {short} is held out of the clients' data, so the "
            "monitor has no auxiliary sample of them; leave some out (e.g. data.train_samples below "
            f"the {pool} training samples)")
    return np.sort(np.concatenate(chosen))


def auxiliary_from_holdout(holdout: HeldOut, *, num_classes: int, per_class: int,
                           seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Up to ``per_class`` samples per class of the runtime's held-out training samples: ``(x, y)``."""
    positions = _draw_per_class(holdout.labels, num_classes=num_classes, per_class=per_class, seed=seed,
                                source="the run's held-out samples", pool=len(holdout.y))
    return holdout.take(positions)


def auxiliary_from_dataset(
    clients: Mapping[int, ClientData],
    *,
    num_classes: int,
    per_class: int,
    dataset: str = "auto",
    root: str | None = None,
    data_seed: int = 0,
    test_fraction: float = 0.2,
    seed: int = 0,
) -> tuple[np.ndarray, np.ndarray, str]:
    """Up to ``per_class`` training samples per class that no client holds: ``(x, y, dataset name)``.

    ``dataset="auto"`` tries every registered dataset whose samples have the clients' shape and
    keeps the one whose training split contains the clients' samples. Raises ``ValueError``
    when no dataset fits, when the split differs from the run's (``data_seed``), or when a
    class has no held-out sample.
    """
    from secure_fl.data import DATASETS
    from secure_fl.data.errors import DatasetNotFoundError, UnknownDatasetError

    first = next((c for c in clients.values() if c.num_samples), None)
    if first is None:
        raise ValueError("no client holds any sample")
    shape = tuple(first.x.shape[1:])
    probe = first.x[: min(16, first.num_samples)].detach().cpu().numpy()
    probe_keys = set(_row_hashes(probe).tolist())
    names = sorted(DATASETS, key=lambda n: (KNOWN_SHAPES.get(n) != shape, n)) if dataset == "auto" else [dataset]
    tried: list[str] = []
    for name in names:
        if dataset == "auto" and KNOWN_SHAPES.get(name, shape) != shape:
            tried.append(f"{name} (shape {KNOWN_SHAPES[name]})")
            continue
        try:
            data = _load(name, root or None, data_seed, test_fraction)
        except (DatasetNotFoundError, UnknownDatasetError, OSError) as error:  # not installed here
            tried.append(f"{name} ({type(error).__name__})")
            continue
        if tuple(data.x_train.shape[1:]) != shape:
            tried.append(f"{name} (shape {tuple(data.x_train.shape[1:])})")
            continue
        train_keys = _row_hashes(data.x_train)
        if not probe_keys <= set(train_keys.tolist()):
            if probe_keys & set(_row_hashes(data.x_test).tolist()):
                raise ValueError(
                    f"{name}: client samples are in the test split this method reloaded with "
                    f"data_seed={data_seed}, test_fraction={test_fraction}; set method.data_seed and "
                    "method.test_fraction to the run's data.seed (else its seed) and data.test_fraction")
            tried.append(f"{name} (not the clients' data)")
            continue
        held: set[int] = set()
        for c in clients.values():
            held.update(_row_hashes(c.x.detach().cpu().numpy()).tolist())
        free = ~np.isin(train_keys, np.fromiter(held, dtype=np.int64, count=len(held)))
        index = _draw_per_class(np.where(free, data.y_train, -1), num_classes=num_classes,
                                per_class=per_class, seed=seed, source=name, pool=data.y_train.size)
        return data.x_train[index], data.y_train[index], name
    raise ValueError(f"no registered dataset holds the clients' samples (tried: {', '.join(tried)}); "
                     "set method.aux_dataset / method.aux_root")


# --- the method -----------------------------------------------------------------------------------

@register_algorithm("ratio_loss")
class RatioLossMethod(FedAvg):
    """Monitored FedAvg whose clients train with Ratio Loss weights ℝ broadcast by the server."""

    Params = RatioLossParams
    params: RatioLossParams

    def __init__(self, params: RatioLossParams | None = None) -> None:
        super().__init__(params)
        self._total = monitor_total_declaration(self.params.total_bound)
        self.detector = self._new_detector()
        self.history: list[dict[str, Any]] = []
        """Per-round telemetry (see the module docstring); checkpointed."""
        self.monitor: RatioMonitor | None = None
        self.aux_source = ""
        self.partition_cosine = math.nan
        """Telemetry: mean over clients of CS_j = cos(v_j, V) (the paper's local/global mismatch)."""
        self._num_classes = 0
        self._truth: dict[int, np.ndarray] = {}
        """Simulator telemetry only: each client's class counts, to score the monitor. Never used by it."""
        self._model: tuple[torch.nn.Module, Any] | None = None
        self._training: LocalTraining | None = None
        self._loss: Loss | None = None
        self._snapshot: Snapshot | None = None
        self._ratios: np.ndarray | None = None
        self._weights: np.ndarray | None = None
        self._prepared = -1
        self._broadcast_logged = -1
        self._lr: dict[int, float] = {}

    def _new_detector(self) -> ImbalanceDetector:
        p = self.params
        return ImbalanceDetector(rounds=p.detect_rounds, similarity=p.detect_similarity, ratio=p.detect_ratio)

    # --- set-up -------------------------------------------------------------------------------------

    def setup(self, ctx: SetupContext) -> None:
        self._num_classes = ctx.num_classes
        self._truth = {cid: np.asarray(d.class_counts, dtype=np.int64) for cid, d in ctx.clients.items()}
        overall = np.sum(list(self._truth.values()), axis=0)
        similarities = [cosine_similarity(v, overall) for v in self._truth.values() if v.sum() > 0]
        self.partition_cosine = float(np.mean(similarities)) if similarities else math.nan
        p = self.params
        if ctx.holdout is not None:
            x, y = auxiliary_from_holdout(ctx.holdout, num_classes=ctx.num_classes, per_class=p.aux_per_class,
                                          seed=p.aux_seed)
            source = "runtime holdout"
        else:
            x, y, source = auxiliary_from_dataset(
                ctx.clients, num_classes=ctx.num_classes, per_class=p.aux_per_class, dataset=p.aux_dataset,
                root=p.aux_root or None, data_seed=p.data_seed, test_fraction=p.test_fraction, seed=p.aux_seed)
        self.aux_source = source
        if ctx.trainer is not None:
            self._adopt(ctx.trainer)
        self.monitor = RatioMonitor(
            aux_x=torch.from_numpy(np.ascontiguousarray(x)).to(ctx.device),
            aux_y=torch.from_numpy(np.ascontiguousarray(y)).long().to(ctx.device),
            num_classes=ctx.num_classes, threshold=self.params.threshold,
            # the three strings were checked against ESTIMATORS / RATIO_AVERAGES / TEMPLATES in
            # RatioLossParams.__post_init__
            estimator=cast(Estimator, self.params.estimator),
            calibrate=self.params.calibrate, ratio_average=cast(RatioAverage, self.params.ratio_average),
            templates=cast(Templates, self.params.templates))
        ctx.stats.declare(self._total)

    # --- per round: ℝ at G_t ------------------------------------------------------------------------

    def mitigating(self, round: int) -> bool:
        """Whether the clients of ``round`` train with ℝ."""
        if self.params.mitigation == "always":
            return True
        if self.params.mitigation == "off":
            return False
        detected = self.detector.detected_round
        return detected is not None and detected < round

    def _set_round(self, round: int, snapshot: Snapshot) -> None:
        """``G_round``'s snapshot, ℝ and (while mitigating with Ratio Loss) the clients' class weights."""
        if self.monitor is None:
            raise RuntimeError("ratio_loss: setup() was not called")
        self._snapshot, self._prepared = snapshot, round
        self._ratios = self.monitor.ratios(snapshot)
        self._weights = None
        if self.mitigating(round) and isinstance(self._loss, RatioLoss):
            self._weights = self._loss.class_weights(torch.as_tensor(self._ratios)).numpy().astype(np.float64)

    def _adopt(self, trainer: LocalTrainer) -> None:
        """The model the monitor evaluates global vectors on, and the clients' recipe and loss."""
        self._model = (trainer.model, trainer.layout)
        self._training = trainer.training
        self._loss = trainer.loss

    def _snap(self, vector: torch.Tensor) -> Snapshot:
        if self.monitor is None or self._model is None:
            raise RuntimeError("ratio_loss: setup() was not called or no model is known yet")
        model, layout = self._model
        return self.monitor.snapshot(model, layout, vector)

    def broadcast(self, ctx: ServerContext) -> dict[str, torch.Tensor]:
        if self._prepared != ctx.round:
            if self._model is None:  # no trainer at set-up: the first client prepares the round
                return {}
            self._set_round(ctx.round, self._snap(ctx.global_vector))
        if not self.mitigating(ctx.round):
            return {}
        self._broadcast_logged = ctx.round
        return {BROADCAST: torch.as_tensor(self._ratios, dtype=torch.float32)}

    # --- client side --------------------------------------------------------------------------------

    def _attach(self, ctx: ClientContext) -> None:
        if self._model is None:  # a runtime that gave no trainer at set-up: the clients' one
            self._adopt(ctx.trainer)
        self._lr[ctx.round] = float(ctx.lr)
        if self._prepared != ctx.round:
            self._set_round(ctx.round, self._snap(ctx.global_vector))

    def local_objective(self, ctx: ClientContext) -> LocalObjective:
        if not self.mitigating(ctx.round):
            return LocalObjective()
        loss = ctx.trainer.loss
        if not isinstance(loss, RatioLoss):
            raise ValueError(  # noqa: TRY004  (a config error, reported like the others)
                f"method 'ratio_loss' applies Ratio Loss through loss 'ratio', but this run's loss is "
                f"{getattr(loss, 'name', type(loss).__name__)!r}: set [loss] name = \"ratio\", or "
                "method.mitigation = \"off\" for a monitored baseline")
        sent = ctx.broadcast.get(BROADCAST)
        ratios = sent if sent is not None else torch.as_tensor(self._ratios, dtype=torch.float32)
        weights = loss.class_weights(ratios.to(torch.float32)).to(ctx.data.x.device)
        return LocalObjective(class_weight=weights)

    def client_update(self, ctx: ClientContext) -> ClientUpdate:
        self._attach(ctx)
        return super().client_update(ctx)

    # --- aggregation --------------------------------------------------------------------------------

    def aggregate(self, updates: Sequence[ClientUpdate], ctx: ServerContext) -> torch.Tensor:
        if self.params.aggregation == "samples":
            return super().aggregate(updates, ctx)
        k = len(updates)
        # client side: each client scales its own update by the public 1/K (Eq. 4)
        mean = ctx.updates.sum({u.client_id: u.delta / k for u in updates}, statistic="model_update",
                               round=ctx.round)
        if self.params.server_lr == 1.0:
            return ctx.global_vector + mean
        return ctx.global_vector + self.params.server_lr * mean

    # --- the monitor --------------------------------------------------------------------------------

    def after_round(self, updates: Sequence[ClientUpdate], ctx: ServerContext) -> None:
        monitor, before, t = self.monitor, self._snapshot, self._training
        if monitor is None or before is None or t is None or self._prepared != ctx.round:
            raise RuntimeError("ratio_loss: the monitor was not prepared for this round")
        r = ctx.round
        mitigating = self.mitigating(r)
        if mitigating and self._broadcast_logged != r:
            self._broadcast_logged = r
            ctx.stats.log_broadcast(f"{BROADCAST}_broadcast", receivers=ctx.selected, round=r,
                                    dimension=self._num_classes, bytes_per_client=4 * self._num_classes)
        counts = {u.client_id: np.array([u.num_samples], dtype=np.int64) for u in updates}
        total = float(ctx.stats.request(self._total, counts, round=r)[0])
        step = recipe_step(self._lr.pop(r, t.lr_at(r)), epochs=t.epochs, batch_size=t.batch_size,
                           momentum=t.momentum)
        k = len(updates)
        after = self._snap(ctx.global_vector)          # G_{t+1}: also the next round's snapshot
        weights = self._weights if mitigating else None
        estimate = monitor.estimate(before, after, total=total, clients=k, step=step, class_weight=weights)
        truth = np.zeros(self._num_classes, dtype=np.int64)
        for c in ctx.selected:
            truth += self._truth.get(c, 0)
        variants = {
            f"{e}/{tm}": cosine_similarity(monitor.estimate(before, after, total=total, clients=k, step=step,
                                                            class_weight=weights, templates=tm, estimator=e),
                                           truth)
            for e, tm in VARIANTS
        }
        detected = self.detector.observe(r, estimate)
        self.history.append({
            "round": r, "estimate": [float(v) for v in estimate], "truth": [int(v) for v in truth],
            "cosine": cosine_similarity(estimate, truth), "variants": variants, "total": total, "clients": k,
            "ratios": [float(v) for v in (self._ratios if self._ratios is not None else [])],
            "mitigating": mitigating, "detected": detected,
        })
        self._set_round(r + 1, after)

    # --- checkpoints --------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        return {"history": [dict(h) for h in self.history], "detector": self.detector.state_dict(),
                "telemetry": {"partition_cosine": self.partition_cosine, "aux_source": self.aux_source,
                              "aux_counts": [] if self.monitor is None else self.monitor.aux_counts.tolist()}}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        expected = {"history", "detector", "telemetry"}
        if set(state) != expected:
            raise ValueError(f"ratio_loss state needs keys {sorted(expected)}, got {sorted(state)}")
        self.history = [dict(h) for h in state["history"]]
        self.detector = self._new_detector()
        self.detector.load_state_dict(dict(state["detector"]))

    def describe(self) -> dict[str, Any]:
        out = super().describe()
        if self.history:
            cos = [h["cosine"] for h in self.history if h["cosine"] == h["cosine"]]
            out["monitor_mean_cosine"] = float(np.mean(cos)) if cos else None
            out["imbalance_detected_round"] = self.detector.detected_round
        return out


def monitor_history(state: Mapping[str, Any] | bytes) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """``(history, telemetry)`` from a stored ``ratio_loss`` algorithm state (``Checkpoint.algorithm``)."""
    if isinstance(state, (bytes, bytearray)):
        from secure_fl.runtime.simulation import load_state

        state = load_state(bytes(state))
    history = state.get("history") if isinstance(state, Mapping) else None
    if not isinstance(state, Mapping) or not isinstance(history, list):
        raise ValueError("not a ratio_loss algorithm state (no 'history')")  # noqa: TRY004
    return [dict(h) for h in history], dict(state.get("telemetry") or {})

