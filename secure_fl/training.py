"""Local training shared by every method and by DP-SGD: data, the local objective, local SGD.

* :class:`ClientData` — one client's samples as pre-sliced tensors on the training device
  (no DataLoader, no worker processes);
* :class:`LocalTraining` — the client optimiser as the papers use it: SGD with momentum and
  weight decay, a learning rate decayed by a factor every so many rounds, E local epochs of
  batches of B (the last batch of an epoch may be smaller);
* :class:`LocalObjective` — what a method changes in local training: per-class loss
  weights, an additive logit shift, a gradient correction;
* :class:`LocalTrainer` — one model and one optimiser reused for every client (the global
  weights are copied in, the optimiser state is cleared), so a round costs about one
  epoch of centralised training;
* :class:`FlatLayout` — the model's float state as one flat vector, the currency of
  aggregation, secure sums and checkpoints.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from secure_fl.losses import Loss

__all__ = [
    "ClientData", "FlatLayout", "LocalObjective", "LocalResult", "LocalTrainer", "LocalTraining", "output_linear",
]


@dataclass(frozen=True, eq=False)
class ClientData:
    """One client's training samples (on the training device) and its class counts.

    The counts are the client's private knowledge: a method may use them in client-side code
    or feed them to a declared statistic, nothing else.
    """

    client_id: int
    x: torch.Tensor
    y: torch.Tensor
    class_counts: np.ndarray

    @property
    def num_samples(self) -> int:
        return int(self.y.shape[0])


@dataclass(frozen=True, kw_only=True)
class LocalTraining:
    """The client optimiser: SGD(lr, momentum, weight_decay), E epochs of batches of B.

    The learning rate of round ``t`` is ``lr * lr_decay ** (t // lr_decay_every)``
    (FedShift: 0.01, decay 0.95 every 10 rounds, momentum 0.9, weight decay 1e-4).
    """

    epochs: int = 1
    batch_size: int = 32
    lr: float = 0.01
    momentum: float = 0.0
    weight_decay: float = 0.0
    lr_decay: float = 1.0
    lr_decay_every: int = 1
    nesterov: bool = False

    def __post_init__(self) -> None:
        if self.epochs < 1:
            raise ValueError(f"epochs must be >= 1, got {self.epochs}")
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")
        if not (math.isfinite(self.lr) and self.lr > 0):
            raise ValueError(f"lr must be a positive number, got {self.lr}")
        if not 0.0 <= self.momentum < 1.0:
            raise ValueError(f"momentum must lie in [0, 1), got {self.momentum}")
        if self.weight_decay < 0:
            raise ValueError(f"weight_decay must be >= 0, got {self.weight_decay}")
        if not 0.0 < self.lr_decay <= 1.0:
            raise ValueError(f"lr_decay must lie in (0, 1], got {self.lr_decay}")
        if self.lr_decay_every < 1:
            raise ValueError(f"lr_decay_every must be >= 1, got {self.lr_decay_every}")
        if self.nesterov and self.momentum == 0:
            raise ValueError("nesterov needs momentum > 0")

    def lr_at(self, round: int) -> float:
        return self.lr * self.lr_decay ** (round // self.lr_decay_every)

    def steps_per_epoch(self, num_samples: int) -> int:
        return -(-num_samples // self.batch_size)


GradientCorrection = Callable[[Sequence[torch.Tensor], Sequence[torch.Tensor]], None]
"""Called after each backward pass with (parameters, their gradients); edits the gradients in place."""


@dataclass(frozen=True, eq=False)
class LocalObjective:
    """How a method changes plain local training (all optional).

    ``class_weight`` (length C) scales each sample's loss by its class's weight; with
    ``weighted_mean`` the batch loss is then divided by the batch's mean weight, Σ w ℓ / Σ w
    (what PyTorch's ``CrossEntropyLoss(weight=…)`` computes), so one rare, heavily weighted
    sample cannot scale the step; ``logit_shift`` (length C) is added to the logits before the
    loss (FedShift); ``gradient_correction`` edits gradients before the optimiser step
    (FedProx, SCAFFOLD).
    """

    class_weight: torch.Tensor | None = None
    weighted_mean: bool = False
    logit_shift: torch.Tensor | None = None
    gradient_correction: GradientCorrection | None = None


@dataclass(frozen=True, eq=False)
class LocalResult:
    """The local model after training, the number of optimiser steps and the mean batch loss."""

    vector: torch.Tensor
    steps: int
    loss: float


def output_linear(model: nn.Module, num_classes: int) -> tuple[str, nn.Linear]:
    """The model's last ``nn.Linear`` and its name: the classifier the monitor and the audit read."""
    linears = [(name, m) for name, m in model.named_modules() if isinstance(m, nn.Linear)]
    if not linears:
        raise ValueError("the model has no nn.Linear output layer")
    name, layer = linears[-1]
    if layer.out_features != num_classes:
        raise ValueError(f"last linear layer {name!r} has {layer.out_features} outputs, expected {num_classes}")
    return name, layer


class FlatLayout:
    """Maps ``model``'s float tensors to and from one flat vector (in ``state_dict`` order).

    Covers every parameter and every floating-point buffer (batch-norm running statistics
    are averaged like weights); integer buffers (batch counters) stay with the model.
    """

    def __init__(self, model: nn.Module) -> None:
        state = model.state_dict(keep_vars=True)
        self.names: tuple[str, ...] = tuple(k for k, t in state.items() if t.is_floating_point())
        self.tensors: list[torch.Tensor] = [state[k].data for k in self.names]
        self.shapes: tuple[torch.Size, ...] = tuple(t.shape for t in self.tensors)
        self.numels: tuple[int, ...] = tuple(t.numel() for t in self.tensors)
        self.dimension = sum(self.numels)
        self.parameters: list[nn.Parameter] = [p for p in model.parameters() if p.requires_grad]
        index = {id(state[k]): i for i, k in enumerate(self.names)}
        self._parameter_index = [index[id(p)] for p in self.parameters]
        self.other: dict[str, torch.Tensor] = {k: t.data for k, t in state.items() if not t.is_floating_point()}

    def slice_of(self, name: str) -> slice:
        """Where the tensor ``name`` (a ``state_dict`` key) lies in the flat vector."""
        index = self.names.index(name)
        start = int(sum(self.numels[:index]))
        return slice(start, start + self.numels[index])

    def flatten(self) -> torch.Tensor:
        """A new flat float32 vector of the model's current state."""
        return torch.cat([t.reshape(-1) for t in self.tensors]).to(torch.float32)

    def views(self, vector: torch.Tensor) -> list[torch.Tensor]:
        """Tensors shaped like the model's that share ``vector``'s storage."""
        if vector.numel() != self.dimension:
            raise ValueError(f"expected a vector of {self.dimension} entries, got {vector.numel()}")
        return [chunk.view(shape) for chunk, shape in zip(torch.split(vector, list(self.numels)), self.shapes)]

    def parameter_views(self, vector: torch.Tensor) -> list[torch.Tensor]:
        """Views of ``vector`` matching :attr:`parameters` (for gradient corrections)."""
        views = self.views(vector)
        return [views[i] for i in self._parameter_index]

    def load(self, vector: torch.Tensor) -> None:
        """Copy ``vector`` into the model's tensors."""
        torch._foreach_copy_(self.tensors, self.views(vector))

    def other_state(self) -> dict[str, torch.Tensor]:
        return {k: t.detach().cpu().clone() for k, t in self.other.items()}

    def load_other(self, state: dict[str, torch.Tensor]) -> None:
        for key, value in state.items():
            self.other[key].copy_(value)


class LocalTrainer:
    """Runs local SGD for one client after another on one reused model and optimiser."""

    def __init__(self, model: nn.Module, *, training: LocalTraining, loss: Loss) -> None:
        self.model = model
        self.layout = FlatLayout(model)
        self.training = training
        self.loss = loss
        self._optimizer: torch.optim.SGD | None = None

    @property
    def optimizer(self) -> torch.optim.SGD:
        """Built on first use: the client pool never steps it, and a process's first ``torch.optim``
        optimiser imports ``torch._dynamo`` (~0.9 s of a run's start-up)."""
        if self._optimizer is None:
            self._optimizer = torch.optim.SGD(
                self.layout.parameters, lr=self.training.lr, momentum=self.training.momentum,
                weight_decay=self.training.weight_decay, nesterov=self.training.nesterov,
            )
        return self._optimizer

    def train(
        self,
        data: ClientData,
        start: torch.Tensor,
        *,
        lr: float,
        shuffle: torch.Generator,
        objective: LocalObjective | None = None,
    ) -> LocalResult:
        """Train from the flat weights ``start`` on ``data``; the batch order comes from ``shuffle``.

        The optimiser starts fresh (no momentum carried over from another client or round).
        """
        objective = objective or LocalObjective()
        model, opt, loss_fn = self.model, self.optimizer, self.loss
        self.layout.load(start)
        opt.state.clear()
        for group in opt.param_groups:
            group["lr"] = lr
        params = self.layout.parameters
        shift, weight, correct = objective.logit_shift, objective.class_weight, objective.gradient_correction
        n, batch = data.num_samples, self.training.batch_size
        device = data.x.device
        total = torch.zeros((), dtype=torch.float32, device=device)
        steps = 0
        model.train()
        for _ in range(self.training.epochs):
            order = torch.randperm(n, generator=shuffle, device=shuffle.device).to(device)
            for begin in range(0, n, batch):
                index = order[begin : begin + batch]
                logits = model(data.x[index])
                if shift is not None:
                    logits = logits + shift
                target = data.y[index]
                loss = loss_fn(logits, target, class_weight=weight)
                if weight is not None and objective.weighted_mean:
                    loss = loss / weight[target].mean()
                opt.zero_grad(set_to_none=False)
                loss.backward()  # type: ignore[no-untyped-call]
                if correct is not None:
                    with torch.no_grad():
                        correct(params, [p.grad for p in params])  # type: ignore[misc]
                opt.step()
                total += loss.detach()
                steps += 1
        mean_loss = float(total) / max(steps, 1)
        return LocalResult(vector=self.layout.flatten(), steps=steps, loss=mean_loss)

    def mean_loss(self, data: ClientData, vector: torch.Tensor, *, chunk: int = 4096) -> float:
        """The run's loss of the flat weights ``vector`` on all of ``data`` (eval mode, no gradient)."""
        if data.num_samples == 0:
            return 0.0
        self.layout.load(vector)
        model = self.model
        model.eval()
        total = 0.0
        try:
            with torch.no_grad():
                for begin in range(0, data.num_samples, chunk):
                    x, y = data.x[begin : begin + chunk], data.y[begin : begin + chunk]
                    total += float(self.loss(model(x), y)) * int(y.shape[0])
        finally:
            model.train()
        return total / data.num_samples
