"""Vectorised local training: a cohort of clients trained together, one stacked model per client.

:func:`train_cohort` does what :meth:`~secure_fl.training.LocalTrainer.train` does for one client,
for many at once: each client's float state is a row of one ``[K, D]`` tensor, the model runs
through ``torch.func`` (``functional_call`` under ``vmap``, gradients by ``grad``), and the SGD
step (momentum, weight decay, Nesterov) is applied to the stacked rows. Each client keeps what
the loop gives it:

* its own batch order and batch boundaries — the permutations are drawn from its own shuffle
  generator exactly as the loop draws them, epoch by epoch;
* its own optimiser state (a momentum row per client) and learning rate;
* its own number of steps: clients are ordered by steps, so the clients still training at a
  step are a prefix of the cohort, and a finished client is left out (its rows stay as they are);
* its own last, smaller batch: shorter batches are padded and the padding masked out of the loss
  (BatchNorm models instead run each batch size on its own, since padding would enter the batch
  statistics); BatchNorm running statistics are rows of the stacked state too;
* its own objective: per-client class weights and logit shift, and a gradient correction
  (FedProx, SCAFFOLD) called on that client's rows after each gradient, as the loop calls it.

A model that is only ``Flatten, Linear, ReLU, …`` (the MLP) skips ``torch.func`` for its
forward and backward: :mod:`secure_fl.training_chain` writes them as batched products, which
saves that machinery's per-step cost; the loss and everything after the gradient are shared.

The loss enters through :data:`BATCHED_LOSSES`: a masked form of each registered loss over a
cohort axis (``[K, b, C]`` logits to ``[K]`` losses) that gives each client the loss of its
unpadded batch. A loss without one (or a model ``torch.func`` cannot run) is not vectorisable:
:func:`vectorisable` says why, and the caller trains those clients one after another.

Results agree with the loop to float tolerance (summation order differs), not bit for bit.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, grad_and_value, vmap

from secure_fl.losses import GHMC, MFE, CrossEntropy, Focal, Loss, MeanSquaredError, RatioLoss
from secure_fl.training import ClientData, LocalObjective, LocalResult, LocalTrainer, LocalTraining
from secure_fl.training_chain import chain_step, linear_chain

__all__ = [
    "BATCHED_LOSSES", "BatchedLoss", "CohortJob", "chunk_size", "client_bytes", "cohort_key", "register_batched_loss",
    "train_cohort", "vectorisable",
]

BatchedLoss = Callable[[Loss, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None], torch.Tensor]
"""``(loss, logits [K, b, C], target [K, b], mask [K, b], class_weight [K, C] | None) -> [K]``: each
of ``K`` clients' loss of its batch's unmasked samples, every reduction over the batch axis only and
without data-dependent control flow (the torch.func path runs it under vmap with ``K = 1``)."""

BATCHED_LOSSES: dict[type[Loss], BatchedLoss] = {}


def register_batched_loss(cls: type[Loss]) -> Callable[[BatchedLoss], BatchedLoss]:
    """Decorator: the masked, per-client batched form of loss class ``cls``."""
    def deco(fn: BatchedLoss) -> BatchedLoss:
        BATCHED_LOSSES[cls] = fn
        return fn
    return deco


def _weighted_mean(per_sample: torch.Tensor, target: torch.Tensor, mask: torch.Tensor,
                   class_weight: torch.Tensor | None) -> torch.Tensor:
    """``mean_j w[y_j] ℓ_j`` over each client's unmasked samples (every loss here but GHM-C's and MFE's batch terms)."""
    if class_weight is not None:
        per_sample = class_weight.gather(-1, target) * per_sample
    return (per_sample * mask).sum(-1) / mask.sum(-1)


def _cross_entropy(logits: torch.Tensor, target: torch.Tensor, label_smoothing: float = 0.0) -> torch.Tensor:
    """Per-sample cross-entropy, ``[K, b]`` (F.cross_entropy wants the classes on axis 1)."""
    return F.cross_entropy(logits.flatten(0, -2), target.flatten(), reduction="none",
                           label_smoothing=label_smoothing).view_as(target)


@register_batched_loss(CrossEntropy)
def _ce(loss: Loss, logits: torch.Tensor, target: torch.Tensor, mask: torch.Tensor,
        class_weight: torch.Tensor | None) -> torch.Tensor:
    assert isinstance(loss, CrossEntropy)
    return _weighted_mean(_cross_entropy(logits, target, loss.label_smoothing), target, mask, class_weight)


@register_batched_loss(Focal)
def _focal(loss: Loss, logits: torch.Tensor, target: torch.Tensor, mask: torch.Tensor,
           class_weight: torch.Tensor | None) -> torch.Tensor:
    assert isinstance(loss, Focal)
    log_pt = F.log_softmax(logits, dim=-1).gather(-1, target.unsqueeze(-1)).squeeze(-1)
    per_sample = -log_pt if loss.gamma == 0 else -((1.0 - log_pt.exp()) ** loss.gamma) * log_pt
    return _weighted_mean(per_sample, target, mask, class_weight)


@register_batched_loss(RatioLoss)
def _ratio(loss: Loss, logits: torch.Tensor, target: torch.Tensor, mask: torch.Tensor,
           class_weight: torch.Tensor | None) -> torch.Tensor:
    assert isinstance(loss, RatioLoss)
    per_sample = _cross_entropy(logits, target)
    if class_weight is None:
        return loss.alpha * _weighted_mean(per_sample, target, mask, None)
    return _weighted_mean(per_sample, target, mask, class_weight)


def _squared_errors(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    p = F.softmax(logits, dim=-1)
    onehot = (target.unsqueeze(-1) == torch.arange(p.shape[-1], device=p.device)).to(p.dtype)
    return 0.5 * ((p - onehot) ** 2).sum(dim=-1)


@register_batched_loss(MeanSquaredError)
def _mse(loss: Loss, logits: torch.Tensor, target: torch.Tensor, mask: torch.Tensor,
         class_weight: torch.Tensor | None) -> torch.Tensor:
    return _weighted_mean(_squared_errors(logits, target), target, mask, class_weight)


@register_batched_loss(GHMC)
def _ghmc(loss: Loss, logits: torch.Tensor, target: torch.Tensor, mask: torch.Tensor,
          class_weight: torch.Tensor | None) -> torch.Tensor:
    """GHM-C with each client's bin counts of its unmasked samples only (see :class:`~secure_fl.losses.GHMC`)."""
    assert isinstance(loss, GHMC)
    with torch.no_grad():
        p_t = F.softmax(logits.detach().float(), dim=-1).gather(-1, target.unsqueeze(-1)).squeeze(-1)
        g = (1.0 - p_t).clamp(0.0, 1.0)
        index = torch.clamp((g * loss.bins).long(), max=loss.bins - 1)
        member = (index.unsqueeze(-1) == torch.arange(loss.bins, device=g.device)).to(g.dtype) * mask.unsqueeze(-1)
        counts = member.sum(-2, keepdim=True)  # [K, 1, bins]
        occupied = (counts > 0).sum(-1).to(g.dtype).clamp(min=1.0)  # [K, 1]
        beta = (mask.sum(-1, keepdim=True) / ((member * counts).sum(-1).clamp(min=1.0) * occupied)).to(logits.dtype)
    per_sample = _cross_entropy(logits, target) * beta
    return _weighted_mean(per_sample, target, mask, class_weight)


@register_batched_loss(MFE)
def _mfe(loss: Loss, logits: torch.Tensor, target: torch.Tensor, mask: torch.Tensor,
         class_weight: torch.Tensor | None) -> torch.Tensor:
    """MFE over the classes present among each client's unmasked samples (see :class:`~secure_fl.losses.MFE`)."""
    assert isinstance(loss, MFE)
    errors = _squared_errors(logits, target)
    member = (target.unsqueeze(-1) == torch.arange(logits.shape[-1], device=logits.device)).to(errors.dtype)
    member = member * mask.unsqueeze(-1)
    counts = member.sum(-2)  # [K, C]
    sums = (member * errors.unsqueeze(-1)).sum(-2)
    present = counts > 0
    per_class = torch.where(present, sums / counts.clamp(min=1.0), torch.zeros_like(sums))
    if loss.variant == "msfe":
        per_class = per_class ** 2
    if class_weight is not None:
        per_class = class_weight.to(per_class.dtype) * per_class
    total = per_class.sum(-1)
    return total / present.sum(-1).to(total.dtype) if loss.reduction == "mean" else total


# --- what can be vectorised ------------------------------------------------------------------------

_BATCH_NORM = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)
_UNSUPPORTED = (nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout, nn.SyncBatchNorm)


def vectorisable(trainer: LocalTrainer) -> str | None:
    """``None`` when :func:`train_cohort` can train this model and loss; otherwise why not."""
    if type(trainer.loss) not in BATCHED_LOSSES:
        return f"loss {type(trainer.loss).__name__} has no batched form (secure_fl.training_pool.BATCHED_LOSSES)"
    for name, module in trainer.model.named_modules():
        if isinstance(module, _UNSUPPORTED):
            return f"module {name!r} ({type(module).__name__}) draws randomness or syncs across processes"
        if isinstance(module, _BATCH_NORM) and (not module.track_running_stats or module.momentum is None):
            return f"module {name!r} is a BatchNorm without running statistics or with a cumulative average"
    return None


# --- memory --------------------------------------------------------------------------------------

def client_bytes(trainer: LocalTrainer, sample: torch.Tensor, *, batch_size: int, samples: int) -> int:
    """Bytes one client of a cohort needs on the device: its state, gradient, momentum and working
    copies (6 × D floats), its data (``samples`` rows like ``sample``), and the activations of one
    batch kept for the backward pass (every module's output, measured on one sample, × 3)."""
    outputs = 0

    def hook(_module: nn.Module, _inputs: object, output: object) -> None:
        nonlocal outputs
        if isinstance(output, torch.Tensor):
            outputs += output.numel()

    handles = [m.register_forward_hook(hook) for m in trainer.model.modules()]
    try:
        with torch.no_grad():
            was_training = trainer.model.training
            trainer.model.eval()
            trainer.model(sample[:1])
            trainer.model.train(was_training)
    finally:
        for handle in handles:
            handle.remove()
    row = sample[:1].numel() * sample.element_size()
    return 4 * 6 * trainer.layout.dimension + samples * row + 4 * 3 * batch_size * outputs


def chunk_size(per_client: int, *, budget: int, clients: int) -> int:
    """How many clients train together within ``budget`` bytes (at least one)."""
    return max(1, min(clients, budget // max(per_client, 1)))


# --- the cohort ----------------------------------------------------------------------------------

@dataclass(frozen=True, eq=False)
class CohortJob:
    """One client's local training, as :meth:`LocalTrainer.train` takes it."""

    data: ClientData
    start: torch.Tensor
    lr: float
    shuffle: torch.Generator
    objective: LocalObjective


def _schedule(jobs: Sequence[CohortJob], *, epochs: int, batch: int, offsets: Sequence[int],
              device: torch.device) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    """Every client's batches as rows of global sample indices: ``[T, K, batch]`` indices, their
    ``[T, K, batch]`` mask, and each client's number of steps (jobs come sorted by steps)."""
    steps = [epochs * -(-job.data.num_samples // batch) for job in jobs]
    total = max(steps, default=0)
    index = torch.zeros((total, len(jobs), batch), dtype=torch.long)
    mask = torch.zeros((total, len(jobs), batch), dtype=torch.bool)
    for k, job in enumerate(jobs):
        n = job.data.num_samples
        if n == 0:
            continue
        per_epoch = -(-n // batch)
        padded = per_epoch * batch
        for e in range(epochs):
            # the loop's draw: one permutation per epoch from the client's own generator
            order = torch.randperm(n, generator=job.shuffle, device=job.shuffle.device).cpu()
            rows = torch.zeros(padded, dtype=torch.long)
            rows[:n] = order + offsets[k]
            valid = torch.zeros(padded, dtype=torch.bool)
            valid[:n] = True
            rows[n:] = offsets[k]
            index[e * per_epoch:(e + 1) * per_epoch, k] = rows.view(per_epoch, batch)
            mask[e * per_epoch:(e + 1) * per_epoch, k] = valid.view(per_epoch, batch)
    return index.to(device), mask.to(device), steps


def _stack_optional(values: Sequence[torch.Tensor | None], what: str) -> torch.Tensor | None:
    present = [v is not None for v in values]
    if not any(present):
        return None
    if not all(present):
        raise ValueError(f"a cohort mixes clients with and without a {what}; train them as separate cohorts")
    return torch.stack([v for v in values if v is not None]).to(torch.float32)


def train_cohort(trainer: LocalTrainer, jobs: Sequence[CohortJob]) -> list[LocalResult]:
    """Train every job as :meth:`LocalTrainer.train` would, together; results in the jobs' order.

    All jobs share the trainer's model architecture, loss and :class:`LocalTraining`; their
    objectives must agree on which parts they use (class weights or not, logit shift or not,
    ``weighted_mean``) — :func:`cohort_key` groups jobs that can share a call. The trainer's
    model is used as a template only (its weights are not read or changed).
    """
    if not jobs:
        return []
    reason = vectorisable(trainer)
    if reason is not None:
        raise ValueError(f"cannot train this cohort together: {reason}")
    keys = {cohort_key(job) for job in jobs}
    if len(keys) > 1:
        raise ValueError(f"jobs of different kinds in one cohort: {sorted(keys)}; group them with cohort_key")
    training, layout, model = trainer.training, trainer.layout, trainer.model
    device = jobs[0].start.device
    order = sorted(range(len(jobs)), key=lambda k: -jobs[k].data.num_samples)  # stable: ties keep job order
    sorted_jobs = [jobs[k] for k in order]
    sizes = [job.data.num_samples for job in sorted_jobs]
    offsets = [0]
    for n in sizes[:-1]:
        offsets.append(offsets[-1] + n)
    K = len(sorted_jobs)
    with torch.no_grad():
        xs = [job.data.x for job in sorted_jobs]
        y_all = torch.cat([job.data.y for job in sorted_jobs]) if sum(sizes) else jobs[0].data.y
        # one contiguous [K, *shape] tensor per model tensor (the optimiser's passes stay dense),
        # each row copied from its client's start in one pass, converted on the way
        views = {name: torch.empty((K, *shape), dtype=torch.float32, device=device) for name, shape in
                 zip(layout.names, layout.shapes)}
        parts = list(zip(layout.names, _slices(layout.numels), layout.shapes))
        for k, job in enumerate(sorted_jobs):
            for name, sl, shape in parts:
                views[name][k].copy_(job.start[sl].reshape(shape))
    index, mask, steps = _schedule(sorted_jobs, epochs=training.epochs, batch=training.batch_size,
                                   offsets=[0] * K, device=device)
    gather = _Gather(xs, y_all, torch.tensor(offsets, dtype=torch.long, device=device), training.batch_size)
    parameter_names = [layout.names[i] for i in layout._parameter_index]
    buffer_names = [name for name in layout.names if name not in set(parameter_names)]
    momentum = {name: torch.zeros_like(views[name]) for name in parameter_names} if training.momentum else {}
    objective = sorted_jobs[0].objective
    weights = _stack_optional([job.objective.class_weight for job in sorted_jobs], "class weight")
    shifts = _stack_optional([job.objective.logit_shift for job in sorted_jobs], "logit shift")
    weighted_mean = objective.weighted_mean and weights is not None
    corrections = [job.objective.gradient_correction for job in sorted_jobs]
    lrs = torch.tensor([job.lr for job in sorted_jobs], dtype=torch.float32, device=device)
    same_lr = all(job.lr == sorted_jobs[0].lr for job in sorted_jobs)
    loss_fn, loss = BATCHED_LOSSES[type(trainer.loss)], trainer.loss
    other = {k: v for k, v in layout.other.items()}  # integer buffers: shared, as in the loop

    def logits_loss(logits: torch.Tensor, y: torch.Tensor, m: torch.Tensor, w: torch.Tensor | None,
                    s: torch.Tensor | None) -> torch.Tensor:
        """Each client's objective on its batch's logits: ``[K, b, C]`` (with ``[K, b]`` targets and
        mask, ``[K, C]`` weights and shifts) to ``[K]``."""
        if s is not None:
            logits = logits + s.unsqueeze(-2)
        mf = m.to(logits.dtype)
        value = loss_fn(loss, logits, y, mf, w)
        if weighted_mean:
            assert w is not None
            value = value / ((w.gather(-1, y) * mf).sum(-1) / mf.sum(-1))
        return value

    def one(t: torch.Tensor | None) -> torch.Tensor | None:
        return None if t is None else t.unsqueeze(0)

    def client_loss(params: dict[str, torch.Tensor], buffers: dict[str, torch.Tensor], x: torch.Tensor,
                    y: torch.Tensor, m: torch.Tensor, w: torch.Tensor | None,
                    s: torch.Tensor | None, counters: dict[str, torch.Tensor],
                    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        before = {name: t.clone() for name, t in buffers.items()}  # whether or not the forward writes them
        logits = functional_call(model, ({**params, **buffers, **counters}), (x,))
        value = logits_loss(logits.unsqueeze(0), y.unsqueeze(0), m.unsqueeze(0), one(w), one(s))[0]  # a cohort of 1
        # vmap does not write BatchNorm's running statistics back: update them from the batch's moments
        updated = dict(before)
        for prefix_, (mean, var) in moments.items():
            bn = norms[prefix_]
            assert bn.momentum is not None  # vectorisable() refuses a cumulative average
            rate = float(bn.momentum)
            for key, moment in ((".running_mean", mean), (".running_var", var)):
                old = before[prefix_ + key]
                updated[prefix_ + key] = (1.0 - rate) * old + rate * moment.to(old.dtype)
        moments.clear()
        return value, {name: t.detach() for name, t in updated.items()}

    norms = {name: m for name, m in model.named_modules() if isinstance(m, _BATCH_NORM)}
    moments: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}

    def capture(name: str) -> Callable[[nn.Module, tuple[torch.Tensor, ...], torch.Tensor], None]:
        def hook(_module: nn.Module, inputs: tuple[torch.Tensor, ...], _output: torch.Tensor) -> None:
            x = inputs[0].detach()
            dims = [0, *range(2, x.dim())]
            moments[name] = (x.mean(dims), x.var(dims, unbiased=True))
        return hook

    chain = linear_chain(model)
    step_fn: Callable[..., tuple[dict[str, torch.Tensor], tuple[torch.Tensor, dict[str, torch.Tensor]]]]
    if chain is not None:  # Linear and ReLU only: gradients by hand, without torch.func's per-step cost
        step_fn = chain_step(chain, logits_loss)
    else:
        step_fn = vmap(grad_and_value(client_loss, has_aux=True),
                       in_dims=(0, 0, 0, 0, 0, None if weights is None else 0, None if shifts is None else 0, None))
    handles = [m.register_forward_hook(capture(name)) for name, m in norms.items()]
    totals = torch.zeros(K, dtype=torch.float32, device=device)
    groups_by_size = bool(norms)  # padding would enter BatchNorm's batch statistics
    model.train()
    try:
        for t in range(max(steps)):
            active = sum(1 for s in steps if s > t)
            step_mask = mask[t, :active]
            if groups_by_size:
                lengths = step_mask.sum(1).tolist()
                groups = [[k for k in range(active) if lengths[k] == b] for b in sorted(set(lengths), reverse=True)]
            else:
                groups = [list(range(active))]
            for group in groups:
                width = int(step_mask[group[0]].sum()) if groups_by_size else training.batch_size
                _step(step_fn, views, momentum, parameter_names, buffer_names, group, index[t, :, :width],
                      step_mask[:, :width], gather, weights, shifts, corrections, lrs, same_lr, totals,
                      training, other)
    finally:
        for handle in handles:
            handle.remove()
    if "num_batches_tracked" in "".join(other):
        for key, value in other.items():
            if key.endswith("num_batches_tracked"):
                value.add_(sum(steps))  # the loop counts every client's batches on the shared model
    flat = [views[name].reshape(K, -1) for name in layout.names]
    results: list[LocalResult | None] = [None] * K
    for k, position in enumerate(order):
        n_steps = steps[k]
        results[position] = LocalResult(vector=torch.cat([rows[k] for rows in flat]), steps=n_steps,
                                        loss=float(totals[k]) / max(n_steps, 1))
    return [r for r in results if r is not None]


class _Gather:
    """The step's batches: each client's rows gathered from its own data into one reused buffer
    (no copy of the cohort's data), labels from one concatenation (small).

    When every client's data are row slices of one tensor (as ``client_data`` lays them out), a
    step's batches come from that tensor in one ``index_select`` instead of one per client.
    """

    def __init__(self, xs: Sequence[torch.Tensor], y_all: torch.Tensor, offsets: torch.Tensor, batch: int) -> None:
        self.xs, self.y_all, self.offsets = xs, y_all, offsets
        self.buffer = torch.empty((len(xs) * batch, *xs[0].shape[1:]), dtype=xs[0].dtype, device=xs[0].device)
        self.rows = _rows_of_one_tensor(xs)

    def __call__(self, group: Sequence[int], index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        width, members = index.shape[-1], list(group)
        out = self.buffer[: len(members) * width].view(len(members), width, *self.buffer.shape[1:])
        chosen = index[members]
        if self.rows is not None:
            base, first = self.rows
            torch.index_select(base, 0, (chosen + first[members].unsqueeze(-1)).view(-1),
                               out=out.view(-1, *self.buffer.shape[1:]))
        else:
            for j, k in enumerate(members):
                torch.index_select(self.xs[k], 0, index[k], out=out[j])
        return out, self.y_all[chosen + self.offsets[members].unsqueeze(-1)]


def _rows_of_one_tensor(xs: Sequence[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The tensor whose row slices all of ``xs`` are, and each one's first row in it; ``None`` if
    they are not all slices of one contiguous tensor."""
    root = xs[0]._base if xs else None
    shape = xs[0].shape[1:] if xs else ()
    row = math.prod(shape)
    if root is None or not root.is_contiguous() or row == 0 or root.numel() % row:
        return None
    first = []
    for x in xs:
        offset = x.storage_offset() - root.storage_offset()
        if x._base is not root or not x.is_contiguous() or x.shape[1:] != shape or offset % row:
            return None
        first.append(offset // row)
    return root.view(-1, *shape), torch.tensor(first, dtype=torch.long, device=root.device)


def _slices(numels: Sequence[int]) -> list[slice]:
    out, begin = [], 0
    for n in numels:
        out.append(slice(begin, begin + n))
        begin += n
    return out


def _step(step_fn: Callable[..., tuple[dict[str, torch.Tensor], tuple[torch.Tensor, dict[str, torch.Tensor]]]], views: dict[str, torch.Tensor],
          momentum: dict[str, torch.Tensor], parameter_names: list[str], buffer_names: list[str], group: list[int],
          index: torch.Tensor, mask: torch.Tensor, gather: _Gather,
          weights: torch.Tensor | None, shifts: torch.Tensor | None,
          corrections: Sequence[Callable[..., None] | None], lrs: torch.Tensor, same_lr: bool,
          totals: torch.Tensor, training: LocalTraining, other: dict[str, torch.Tensor]) -> None:
    """One optimiser step of the clients ``group`` (a prefix of the cohort, or any subset)."""
    prefix = group == list(range(len(group)))
    if prefix:
        sel: slice | torch.Tensor = slice(0, len(group))
    else:
        sel = torch.tensor(group, dtype=torch.long, device=index.device)
    with torch.no_grad():
        x, y = gather(group, index)
        m = mask[sel]
        params = {name: views[name][sel] for name in parameter_names}
        buffers = {name: views[name][sel] for name in buffer_names}
    counters = {key: value.clone() for key, value in other.items()}  # integer buffers: counted at the end
    grads, (values, updated) = step_fn(params, buffers, x, y, m, None if weights is None else weights[sel],
                                       None if shifts is None else shifts[sel], counters)
    with torch.no_grad():
        for name in buffer_names:
            if prefix:
                views[name][sel].copy_(updated[name])
            else:
                views[name].index_copy_(0, sel, updated[name])  # type: ignore[arg-type]
        g = [grads[name] for name in parameter_names]
        p = [params[name] for name in parameter_names]
        for j, k in enumerate(group):
            correct = corrections[k]
            if correct is not None:
                correct([t[j] for t in p], [t[j] for t in g])
        if same_lr:
            _fused_sgd(p, g, momentum, parameter_names, sel, prefix, training, float(lrs[0]))
        else:
            _foreach_sgd(p, g, momentum, parameter_names, sel, prefix, training, lrs[sel])
        if not prefix:
            for name, value in zip(parameter_names, p):
                views[name].index_copy_(0, sel, value)  # type: ignore[arg-type]
        totals[sel] += values.detach().to(torch.float32)


def _fused_sgd(p: list[torch.Tensor], g: list[torch.Tensor], momentum: dict[str, torch.Tensor],
               parameter_names: list[str], sel: slice | torch.Tensor, prefix: bool, training: LocalTraining,
               lr: float) -> None:
    """torch.optim.SGD's step for every row at one learning rate, in one pass over the state
    (``torch._fused_sgd_``, the kernel behind ``SGD(fused=True)``): g += wd·p, buf ← m·buf + g,
    p −= lr·(buf, or g + m·buf with Nesterov). A zero momentum row gives the loop's first step (buf = g)."""
    bufs = [momentum[name][sel] for name in parameter_names] if training.momentum else []
    torch._fused_sgd_(p, g, bufs, weight_decay=training.weight_decay, momentum=training.momentum, lr=lr,
                      dampening=0.0, nesterov=training.nesterov, maximize=False, is_first_step=False)
    if not prefix:  # ``sel`` picked copies: write the momentum rows back
        for name, buf in zip(parameter_names, bufs):
            momentum[name].index_copy_(0, sel, buf)  # type: ignore[arg-type]


def _foreach_sgd(p: list[torch.Tensor], g: list[torch.Tensor], momentum: dict[str, torch.Tensor],
                 parameter_names: list[str], sel: slice | torch.Tensor, prefix: bool, training: LocalTraining,
                 lr: torch.Tensor) -> None:
    """The same step with a learning rate per row (clients of one cohort on different schedules)."""
    if training.weight_decay:
        torch._foreach_add_(g, p, alpha=training.weight_decay)
    if training.momentum:
        old = [momentum[name][sel] for name in parameter_names]
        raw = [t.clone() for t in g] if training.nesterov else None
        torch._foreach_add_(g, old, alpha=training.momentum)  # buf ← m·buf + g, in the gradient tensors
        for name, buf, before in zip(parameter_names, g, old):
            if prefix:
                before.copy_(buf)
            else:
                momentum[name].index_copy_(0, sel, buf)  # type: ignore[arg-type]
        if raw is not None:  # Nesterov: g + m·buf
            g = list(torch._foreach_add(raw, g, alpha=training.momentum))
    torch._foreach_sub_(p, [gi * lr.view(-1, *([1] * (gi.dim() - 1))) for gi in g])


def cohort_key(job: CohortJob) -> tuple[bool, bool, bool]:
    """Jobs with equal keys can train in one :func:`train_cohort` call: whether the objective has
    class weights, a logit shift, and divides by the batch's mean weight."""
    o = job.objective
    return (o.class_weight is not None, o.logit_shift is not None, bool(o.weighted_mean and o.class_weight is not None))

