"""What an attacker computes from the global model and a little auxiliary data.

The server knows the global model of every round (it produced it) and may hold a small
auxiliary labelled set (Ratio Loss's monitor assumes 32 samples per class from public
data). :class:`OutputLayerProbe` evaluates a model given as a flat vector (in
:class:`~secure_fl.algorithms.FlatLayout` order) on that set and returns

* the per-class mean gradient of the cross-entropy with respect to the output layer
  (weights and bias) — the "signatures" label-count inference regresses updates on;
* per-class mean losses — what CLIMB's visible loss values are compared with;
* per-class output-layer updates of one SGD pass on each class alone — the input of
  Ratio Loss's monitor (Eq. 6).

The output layer is the last ``nn.Linear`` of the model (all registered models end in one).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt
import torch
import torch.nn.functional as F
from torch import nn

from secure_fl.training import FlatLayout, output_linear

__all__ = ["OutputLayerProbe", "auxiliary_set"]


def auxiliary_set(x: torch.Tensor, y: torch.Tensor, *, per_class: int, num_classes: int,
                  rng: np.random.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Up to ``per_class`` samples of each class drawn from (x, y) — the attacker's public data."""
    labels = y.cpu().numpy()
    chosen = []
    for c in range(num_classes):
        idx = np.flatnonzero(labels == c)
        if idx.size:
            chosen.append(rng.choice(idx, size=min(per_class, idx.size), replace=False))
    index = torch.from_numpy(np.sort(np.concatenate(chosen))).to(x.device)
    return x[index], y[index]


class OutputLayerProbe:
    """Output-layer gradients and losses of a model (as a flat vector) on auxiliary data."""

    def __init__(self, model: nn.Module, layout: FlatLayout, *, aux_x: torch.Tensor, aux_y: torch.Tensor,
                 num_classes: int) -> None:
        name, layer = output_linear(model, num_classes)
        self.model, self.layout, self.layer = model, layout, layer
        self.num_classes = num_classes
        self.hidden = layer.in_features
        prefix = f"{name}." if name else ""
        self.weight_slice = layout.slice_of(f"{prefix}weight")
        self.bias_slice = layout.slice_of(f"{prefix}bias") if layer.bias is not None else None
        self.aux_x, self.aux_y = aux_x, aux_y
        self.aux_counts = np.bincount(aux_y.cpu().numpy(), minlength=num_classes).astype(np.float64)

    @property
    def size(self) -> int:
        """Entries of the output layer (weights then bias)."""
        return self.num_classes * self.hidden + (self.num_classes if self.bias_slice is not None else 0)

    def output_part(self, vector: torch.Tensor | npt.ArrayLike) -> npt.NDArray[np.float64]:
        """The output layer's entries of a flat model-sized vector (weights then bias)."""
        v = vector.detach().cpu().numpy() if isinstance(vector, torch.Tensor) else np.asarray(vector)
        v = v.astype(np.float64).reshape(-1)
        parts = [v[self.weight_slice]]
        if self.bias_slice is not None:
            parts.append(v[self.bias_slice])
        return np.concatenate(parts)

    def _forward(self, vector: torch.Tensor, logit_shift: torch.Tensor | None = None
                 ) -> tuple[torch.Tensor, torch.Tensor]:
        """(penultimate features, logits) of the aux set under ``vector``."""
        captured: list[torch.Tensor] = []
        handle = self.layer.register_forward_hook(lambda _m, inputs, _out: captured.append(inputs[0].detach()))
        saved = self.layout.flatten()
        was_training = self.model.training
        try:
            self.layout.load(vector.to(saved.device, torch.float32))
            self.model.eval()
            with torch.no_grad():
                logits = self.model(self.aux_x).float()
        finally:
            handle.remove()
            self.layout.load(saved)
            self.model.train(was_training)
        if logit_shift is not None:
            logits = logits + logit_shift.to(logits.device)
        return captured[0].float(), logits

    def _per_sample_grads(self, vector: torch.Tensor, logit_shift: torch.Tensor | None
                          ) -> tuple[torch.Tensor, torch.Tensor]:
        h, logits = self._forward(vector, logit_shift)
        p = torch.softmax(logits, dim=1)
        err = p - F.one_hot(self.aux_y, self.num_classes).to(p.dtype)     # (n, C)
        gw = err[:, :, None] * h[:, None, :]                              # (n, C, s)
        return gw, err

    def signatures(self, vectors: Sequence[torch.Tensor], *, logit_shift: torch.Tensor | None = None,
                   class_weight: npt.ArrayLike | None = None) -> npt.NDArray[np.float64]:
        """(P, C): column k is the mean output-layer gradient of a class-k sample.

        Averaged over the models in ``vectors`` (e.g. the start and end of local training,
        as RLU does); ``class_weight`` scales class k's column (a weighted loss).
        """
        cols = np.zeros((self.size, self.num_classes))
        labels = self.aux_y.cpu().numpy()
        for vector in vectors:
            gw, gb = self._per_sample_grads(vector, logit_shift)
            gw_np, gb_np = gw.cpu().numpy().astype(np.float64), gb.cpu().numpy().astype(np.float64)
            for k in range(self.num_classes):
                mask = labels == k
                if not mask.any():
                    continue
                parts = [gw_np[mask].mean(axis=0).reshape(-1)]
                if self.bias_slice is not None:
                    parts.append(gb_np[mask].mean(axis=0))
                cols[:, k] += np.concatenate(parts)
        cols /= max(len(vectors), 1)
        if class_weight is not None:
            cols = cols * np.asarray(class_weight, dtype=np.float64)[None, :]
        return cols

    def class_losses(self, vector: torch.Tensor, *, logit_shift: torch.Tensor | None = None
                     ) -> npt.NDArray[np.float64]:
        """(C,) mean cross-entropy of each class's aux samples under ``vector``."""
        _, logits = self._forward(vector, logit_shift)
        losses = F.cross_entropy(logits, self.aux_y, reduction="none").cpu().numpy().astype(np.float64)
        labels = self.aux_y.cpu().numpy()
        return np.array([losses[labels == k].mean() if (labels == k).any() else np.nan
                         for k in range(self.num_classes)])

    def class_updates(self, vector: torch.Tensor, *, lr: float, batch_size: int) -> npt.NDArray[np.float64]:
        """(C, C, s): output-weight update of one SGD pass over each class's aux samples alone.

        ``[q, p, i]`` is ``−(lr / batch_size) Σ_{aux of class q} ∂ℓ/∂W_(p,i)`` (Ratio Loss's
        ``g_{L_q}``, gradients taken at the round's start model).
        """
        gw, _ = self._per_sample_grads(vector, None)
        gw_np = gw.cpu().numpy().astype(np.float64)
        labels = self.aux_y.cpu().numpy()
        out = np.zeros((self.num_classes, self.num_classes, self.hidden))
        for q in range(self.num_classes):
            mask = labels == q
            if mask.any():
                out[q] = -(lr / batch_size) * gw_np[mask].sum(axis=0)
        return out

    def weight_part(self, vector: torch.Tensor | npt.ArrayLike) -> npt.NDArray[np.float64]:
        """(C, s) output weights of a flat vector (or of a flat difference of two)."""
        v = vector.detach().cpu().numpy() if isinstance(vector, torch.Tensor) else np.asarray(vector)
        return v.astype(np.float64).reshape(-1)[self.weight_slice].reshape(self.num_classes, self.hidden)
