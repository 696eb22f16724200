"""The embedded in-process simulation: select → broadcast → local training → aggregation.

One :class:`Simulation` holds a run's live objects: the clients' pre-sliced data, one model
and optimiser reused for every client, the global model as a flat vector, the method, the
selection strategy, the statistics service and the update sum. :meth:`Simulation.run_round`
plays one round, :meth:`Simulation.evaluate` scores the global model on the test set, and
:meth:`Simulation.checkpoint` / :meth:`Simulation.restore` serialise everything a resumed run
needs. Every random draw comes from :class:`~secure_fl.runtime.rng.Seeds` keyed by round and
client, so the same config and seed give the same metrics, resumed or not.

Privacy (when the run configures it): with DP-SGD every client trains through
:meth:`ClientContext.train` → ``DPSGD.train_client`` (its accountant in the client's state),
and each round reports the largest and mean client ε; the statistics service noises the
statistics ``[privacy.statistics]`` names and keeps the run's ledger, whose per-statistic ε
is reported with the round too (:meth:`Simulation.privacy_report`). The ledger travels in
the checkpoint; once-per-run releases made in ``setup`` are replayed, not re-noised, when a
resumed run calls ``setup`` again.
"""

from __future__ import annotations

import io
import json
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from secure_fl.algorithms import (
    Algorithm,
    ClientContext,
    ClientData,
    ClientUpdate,
    LocalTrainer,
    LocalTraining,
    ServerContext,
    SetupContext,
)
from secure_fl.algorithms.base import DP_SGD_STATE, HeldOut, check_round_metrics
from secure_fl.losses import Loss
from secure_fl.metrics import evaluate_predictions
from secure_fl.privacy import MODEL, RUN, PrivacyLedger, formal_guarantees
from secure_fl.runtime.rng import Seeds
from secure_fl.runtime.selection import SelectionContext, SelectionStrategy
from secure_fl.stats import GlobalStatistics, UpdateSum
from secure_fl.store import Checkpoint, RoundPrivacy

if TYPE_CHECKING:
    from secure_fl.privacy.dpsgd import DPSGD, DPSGDConfig

__all__ = ["RoundResult", "Simulation", "dump_state", "load_state"]

FLOAT32_BYTES = 4
MODEL_BROADCAST = "model_broadcast"


def dump_state(obj: Any) -> bytes:
    """Serialise tensors, numbers, strings and containers of them (moved to the CPU)."""
    buffer = io.BytesIO()
    torch.save(_to_cpu(obj), buffer)
    return buffer.getvalue()


def load_state(data: bytes, *, device: torch.device | str = "cpu") -> Any:
    """Inverse of :func:`dump_state`; refuses anything but plain data (``weights_only``)."""
    return torch.load(io.BytesIO(data), map_location=device, weights_only=True)


def _to_cpu(obj: Any) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj.detach().cpu()
    if isinstance(obj, dict):
        return {k: _to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_to_cpu(v) for v in obj)
    return obj


@dataclass(frozen=True)
class RoundResult:
    """What one round did (metrics come from :meth:`Simulation.evaluate`)."""

    round: int
    selected: tuple[int, ...]
    train_loss: float
    """Sample-weighted mean of the clients' local losses: simulator telemetry, not a protocol output."""
    clipped: int
    seconds: float
    metrics: dict[str, float | None] = field(default_factory=dict)
    """The method's numbers for this round (``Algorithm.round_metrics`` and ``ServerContext.metrics``)."""
    privacy: dict[str, RoundPrivacy] = field(default_factory=dict)
    """Privacy spent up to the end of this round (:meth:`Simulation.privacy_report`); empty without DP."""


class Simulation:
    """A federated run in one process, one round at a time."""

    def __init__(
        self,
        *,
        clients: Mapping[int, ClientData],
        x_test: torch.Tensor,
        y_test: torch.Tensor,
        num_classes: int,
        model: nn.Module,
        algorithm: Algorithm,
        loss: Loss,
        selection: SelectionStrategy,
        training: LocalTraining,
        clients_per_round: int,
        stats: GlobalStatistics,
        updates: UpdateSum,
        seeds: Seeds,
        device: torch.device,
        minority_classes: Sequence[int] = (),
        eval_batch_size: int = 1024,
        dp_sgd: DPSGDConfig | None = None,
        privacy_delta: float | None = None,
        holdout: HeldOut | None = None,
    ) -> None:
        ids = sorted(clients)
        if ids != list(range(len(ids))):
            raise ValueError("client ids must be 0 .. N-1")
        if not 1 <= clients_per_round <= len(ids):
            raise ValueError(f"clients_per_round must lie in [1, {len(ids)}], got {clients_per_round}")
        self.clients = dict(clients)
        self.num_clients = len(ids)
        self.x_test, self.y_test = x_test, y_test
        self.y_test_np = y_test.cpu().numpy()
        self.num_classes = num_classes
        self.model = model
        self.algorithm = algorithm
        self.selection = selection
        self.training = training
        self.clients_per_round = clients_per_round
        self.stats = stats
        self.updates = updates
        self.seeds = seeds
        self.device = device
        self.minority_classes = tuple(minority_classes)
        self.eval_batch_size = eval_batch_size
        self.holdout = holdout
        """Training samples no client holds (handed to the method's set-up)."""
        self.trainer = LocalTrainer(model, training=training, loss=loss)
        self.layout = self.trainer.layout
        if updates.dimension != self.layout.dimension:
            raise ValueError(f"update sum sized {updates.dimension}, model has {self.layout.dimension} entries")
        self.global_vector = self.layout.flatten()
        self.client_states: dict[int, dict[str, Any]] = {}
        self.next_round = 0
        self._touched: set[int] = set()
        self.on_client: Callable[[int, int, int], None] | None = None
        """Progress hook: called with (round, clients done, clients selected) after each client."""
        self.dp_sgd_config = dp_sgd
        """DP-SGD for local training (``None``: plain local SGD)."""
        self.dp_epsilon: dict[int, float] = {}
        """Each client's DP-SGD ε so far (clients that have trained)."""
        self._dp_sgd: DPSGD | None = None
        if dp_sgd is not None:
            from secure_fl.privacy.dpsgd import DPSGD

            DPSGD.validate(model)
            if dp_sgd.secure_mode:
                self._dp_sgd = DPSGD(dp_sgd)  # one CSPRNG for the run
            else:
                from secure_fl.privacy import InsecureRandomWarning

                warnings.warn("DP-SGD with secure_mode = false: batches and noise come from seeded, "
                              "non-cryptographic generators (tests and experiments only)",
                              InsecureRandomWarning, stacklevel=2)
        self.privacy_delta = privacy_delta if privacy_delta is not None else (
            dp_sgd.delta if dp_sgd is not None else 1e-5)
        """δ at which the whole run's composition (``"run"``) is reported."""

    @property
    def dimension(self) -> int:
        return self.layout.dimension

    @property
    def privacy_ledger(self) -> PrivacyLedger | None:
        """The run's ledger of noisy statistic releases (``None`` without distributed DP)."""
        return self.stats.privacy_ledger

    @property
    def dp_enabled(self) -> bool:
        return self.dp_sgd_config is not None or self.stats.privacy_ledger is not None

    def setup(self) -> None:
        """Run the method's and the selection's once-per-run set-up (again after a restore).

        Noisy releases made here are remembered: a resumed run's ``setup`` gets the same values
        back (see :meth:`prepare_resume`) instead of new noise and a second ledger entry.
        """
        with self.stats.once_per_run():
            self.algorithm.setup(SetupContext(
                num_clients=self.num_clients, num_classes=self.num_classes, dimension=self.dimension,
                stats=self.stats, clients=self.clients, device=self.device, holdout=self.holdout,
                trainer=self.trainer,
            ))
            self.selection.setup(num_clients=self.num_clients, stats=self.stats, clients=self.clients)

    def _server_context(self, round: int, selected: tuple[int, ...],
                        metrics: dict[str, float] | None = None) -> ServerContext:
        return ServerContext(round=round, global_vector=self.global_vector, selected=selected,
                             num_clients=self.num_clients, stats=self.stats, updates=self.updates,
                             metrics=metrics if metrics is not None else {})

    def _dp_for(self, round: int, client: int) -> DPSGD | None:
        """The run's DP-SGD; in insecure mode one keyed by (round, client), so resumes repeat it."""
        if self.dp_sgd_config is None:
            return None
        if self._dp_sgd is not None:
            return self._dp_sgd
        from secure_fl.privacy import SeededRandom
        from secure_fl.privacy.dpsgd import DPSGD

        return DPSGD(self.dp_sgd_config, rng=SeededRandom(self.seeds.sequence("dp_sgd", round, client)))

    def run_round(self) -> RoundResult:
        """Select, broadcast, train every selected client, aggregate; returns what happened."""
        start = time.perf_counter()
        r = self.next_round
        clipped_before = self.updates.clipped_total
        selected = tuple(self.selection.select(SelectionContext(
            round=r, num_clients=self.num_clients, clients_per_round=self.clients_per_round,
            rng=self.seeds.numpy("selection", r), stats=self.stats,
        )))
        if not selected or len(set(selected)) != len(selected) or not set(selected) <= set(self.clients):
            raise RuntimeError(f"selection {self.selection.name!r} returned an invalid client set {selected}")
        metrics: dict[str, float] = {}
        ctx = self._server_context(r, selected, metrics)
        extra = self.algorithm.broadcast(ctx)
        self.stats.log_broadcast(MODEL_BROADCAST, receivers=selected, round=r, dimension=self.dimension,
                                 bytes_per_client=FLOAT32_BYTES * self.dimension)
        for name, vector in extra.items():
            self.stats.log_broadcast(f"{name}_broadcast", receivers=selected, round=r, dimension=vector.numel(),
                                     bytes_per_client=FLOAT32_BYTES * vector.numel())
        lr = self.training.lr_at(r)
        updates: list[ClientUpdate] = []
        for cid in selected:
            client_ctx = ClientContext(
                round=r, data=self.clients[cid], state=self.client_states.setdefault(cid, {}),
                global_vector=self.global_vector, broadcast=extra, lr=lr, num_clients=self.num_clients,
                num_classes=self.num_classes, trainer=self.trainer,
                shuffle=self.seeds.torch("shuffle", r, cid), dp_sgd=self._dp_for(r, cid),
            )
            with self.seeds.torch_global("client", r, cid, device=self.device):
                updates.append(self.algorithm.client_update(client_ctx))
            if self.dp_sgd_config is not None:
                self._check_private(client_ctx, updates[-1])
            self._touched.add(cid)
            if self.on_client is not None:
                self.on_client(r, len(updates), len(selected))
        new_global = self.algorithm.aggregate(updates, ctx)
        if new_global.shape != self.global_vector.shape:
            raise RuntimeError(f"{self.algorithm.name}.aggregate returned shape {tuple(new_global.shape)}")
        self.global_vector = new_global.detach().to(torch.float32)
        self.algorithm.after_round(updates, self._server_context(r, selected, metrics))
        source = f"method {self.algorithm.name!r}"
        reported = check_round_metrics(metrics, source=source)
        reported.update(check_round_metrics(self.algorithm.round_metrics(), source=source))
        self.next_round = r + 1
        samples = sum(u.num_samples for u in updates)
        train_loss = sum(u.loss * u.num_samples for u in updates) / max(samples, 1)
        return RoundResult(round=r, selected=selected, train_loss=train_loss,
                           clipped=self.updates.clipped_total - clipped_before,
                           seconds=time.perf_counter() - start, metrics=reported,
                           privacy=self.privacy_report() if self.dp_enabled else {})

    def _check_private(self, ctx: ClientContext, update: ClientUpdate) -> None:
        """Under DP-SGD a client's model may change only through ``ctx.train`` (private SGD)."""
        if ctx.dp_epsilon is not None:
            self.dp_epsilon[ctx.client_id] = ctx.dp_epsilon
        if ctx.trainings == 0 and ctx.data.num_samples > 0 and bool(torch.any(update.delta != 0)):
            raise RuntimeError(
                f"method {self.algorithm.name!r} changed client {ctx.client_id}'s model without "
                "ClientContext.train, so DP-SGD cannot protect it; train through ctx.train(objective)"
            )

    # --- privacy ------------------------------------------------------------------------------

    def _dp_state(self, client: int) -> Any:
        from secure_fl.privacy.dpsgd import DPSGDState

        return DPSGDState.from_dict(self.client_states.get(client, {}).get(DP_SGD_STATE))

    def privacy_report(self) -> dict[str, RoundPrivacy]:
        """Privacy spent so far: ``"model"`` (DP-SGD: largest and mean client ε), one entry per
        noised statistic (its releases composed at its δ) and ``"run"`` (everything composed at
        :attr:`privacy_delta`; only with noised statistics)."""
        out: dict[str, RoundPrivacy] = {}
        worst: int | None = None
        cfg = self.dp_sgd_config
        if cfg is not None:
            eps = self.dp_epsilon
            if eps:
                worst = max(sorted(eps), key=lambda c: eps[c])
                out[MODEL] = RoundPrivacy(epsilon=eps[worst], delta=cfg.delta,
                                          epsilon_mean=sum(eps.values()) / len(eps),
                                          releases=self._dp_state(worst).steps)
            else:
                out[MODEL] = RoundPrivacy(epsilon=0.0, delta=cfg.delta, epsilon_mean=0.0, releases=0)
        ledger = self.stats.privacy_ledger
        if ledger is not None:
            for name in ledger.statistics():
                noisy = self.stats.noisy.get(name)
                entry = self.stats.privacy.entry(name) if self.stats.privacy is not None else None
                delta = noisy.config.delta if noisy is not None else (entry.delta if entry else self.privacy_delta)
                g = ledger.guarantee(delta, statistic=name)
                out[name] = RoundPrivacy(epsilon=g.epsilon, delta=g.delta, releases=g.releases)
            model = {worst: self._dp_state(worst)} if worst is not None else None
            total = formal_guarantees(ledger, delta=self.privacy_delta, model=model).get(RUN)
            if total is not None:
                out[RUN] = RoundPrivacy(epsilon=total.epsilon, delta=total.delta, releases=total.releases)
        return out

    def dp_sgd_states(self) -> dict[int, Any]:
        """Each client's DP-SGD accountant (``DPSGDState``), for clients that have trained."""
        return {cid: self._dp_state(cid) for cid in sorted(self.client_states)
                if self.client_states[cid].get(DP_SGD_STATE)}

    def privacy_guarantees(self, delta: float | None = None) -> dict[str, Any]:
        """The audit's view: ``formal_guarantees`` of the run's ledger and DP-SGD states so far
        (per statistic, ``"model"``, ``"run"``) at ``delta`` (default :attr:`privacy_delta`)."""
        states = self.dp_sgd_states()
        return formal_guarantees(self.stats.privacy_ledger, delta=delta or self.privacy_delta,
                                 model=states or None)

    def prepare_resume(self, checkpoint: Checkpoint) -> None:
        """Before :meth:`setup` on a resume: load the privacy accounting, so that ``setup``'s
        noisy releases are replayed rather than drawn (and charged) again."""
        if checkpoint.privacy:
            self.stats.load_privacy_state(json.loads(checkpoint.privacy.decode()))

    def evaluate(self) -> dict[str, Any]:
        """Accuracy, per-class and minority accuracy, AUC and test loss of the global model."""
        self.layout.load(self.global_vector)
        self.model.eval()
        try:
            with torch.inference_mode():
                logits = torch.cat([
                    self.model(self.x_test[i : i + self.eval_batch_size])
                    for i in range(0, self.x_test.shape[0], self.eval_batch_size)
                ])
                test_loss = float(F.cross_entropy(logits.float(), self.y_test))
        finally:
            self.model.train()
        scores = logits.float().cpu().numpy()
        if not np.all(np.isfinite(scores)):
            return {"accuracy": None, "per_class_accuracy": [None] * self.num_classes,
                    "minority_accuracy": None, "auc": None, "test_loss": None, "diverged": True}
        metrics = evaluate_predictions(self.y_test_np, scores, num_classes=self.num_classes,
                                       minority_classes=self.minority_classes or None)
        metrics["test_loss"] = test_loss
        return metrics

    def checkpoint(self) -> Checkpoint:
        """Everything a resumed run needs after the last finished round (client states changed since)."""
        if self.next_round == 0:
            raise RuntimeError("no round finished yet")
        clients = {cid: dump_state(self.client_states[cid]) for cid in sorted(self._touched)}
        self._touched.clear()
        privacy = self.stats.privacy_state()
        return Checkpoint(
            round=self.next_round - 1,
            model=dump_state({"global": self.global_vector, "other": self.layout.other_state()}),
            algorithm=dump_state(self.algorithm.state_dict()),
            selection=dump_state(self.selection.state_dict()),
            clients=clients,
            privacy=json.dumps(privacy, sort_keys=True).encode() if privacy else b"",
        )

    def restore(self, checkpoint: Checkpoint) -> None:
        """Continue after ``checkpoint.round`` (call :meth:`setup` first)."""
        model = load_state(checkpoint.model, device=self.device)
        if model["global"].shape != self.global_vector.shape:
            raise ValueError("checkpoint belongs to another model (different number of weights)")
        self.global_vector = model["global"].to(torch.float32)
        self.layout.load(self.global_vector)
        self.layout.load_other(model["other"])
        self.algorithm.load_state_dict(load_state(checkpoint.algorithm, device=self.device))
        self.selection.load_state_dict(load_state(checkpoint.selection, device=self.device))
        self.client_states = {cid: load_state(blob, device=self.device) for cid, blob in checkpoint.clients.items()}
        self._touched.clear()
        self.next_round = checkpoint.round + 1
        self.prepare_resume(checkpoint)
        self.dp_epsilon = {}
        if self.dp_sgd_config is not None:
            for cid in sorted(self.client_states):
                if self.client_states[cid].get(DP_SGD_STATE):
                    self.dp_epsilon[cid] = self._dp_state(cid).epsilon(self.dp_sgd_config.delta)
