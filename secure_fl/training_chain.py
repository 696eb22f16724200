"""A cohort step written by hand for models that are a chain of Linear and ReLU layers (the MLP).

Why: :func:`~secure_fl.training_pool.train_cohort` runs a step through ``torch.func``
(``functional_call`` under ``vmap``, gradients by ``grad``), which works for every model but
spends time per step tracing and dispatching the batched rules. For a chain ``Flatten, Linear,
ReLU, …, Linear`` the gradients are three batched products per layer, written here with
``baddbmm``/``bmm`` on the stacked ``[K, …]`` parameters. The loss is the cohort's own batched
objective (every batched loss, class weights, logit shift, the weighted mean) on the ``[K, b, C]``
logits, and autograd gives its gradient with respect to them; the gradient correction and
optimiser step after the step are the cohort's own too.

Invariant (tested against the ``torch.func`` step and the per-client loop): the gradients are
those of the same loss, to float tolerance — padded samples get a zero logit gradient from the
masked loss, so they add nothing to any product.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from secure_fl.models import MLP

__all__ = ["ChainLayer", "LogitsLoss", "chain_step", "linear_chain"]

LogitsLoss = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None],
                      torch.Tensor]
"""``(logits [K, b, C], target [K, b], mask [K, b], class_weight [K, C] | None, logit_shift [K, C] | None)
-> [K]``: each client's loss of its batch (the cohort's objective applied to the logits)."""

StepResult = tuple[dict[str, torch.Tensor], tuple[torch.Tensor, dict[str, torch.Tensor]]]


@dataclass(frozen=True)
class ChainLayer:
    """One Linear layer of the chain: its parameters' names in the model's state, and whether a ReLU follows."""

    weight: str
    bias: str | None
    relu: bool


def linear_chain(model: nn.Module) -> tuple[ChainLayer, ...] | None:
    """The layers of ``model`` if it is exactly ``Flatten, (Linear, ReLU?)+`` in an ``nn.Sequential``
    (or an :class:`~secure_fl.models.MLP`, whose forward is its ``net``); ``None`` for anything else.

    Exact types only: a subclass may have its own ``forward``.
    """
    if type(model) is MLP:
        sequence, prefix = model.net, "net."
    elif type(model) is nn.Sequential:
        sequence, prefix = model, ""
    else:
        return None
    modules = list(sequence.named_children())
    if not modules or type(modules[0][1]) is not nn.Flatten:
        return None
    flatten = modules[0][1]
    assert isinstance(flatten, nn.Flatten)
    if flatten.start_dim != 1 or flatten.end_dim != -1:
        return None
    layers: list[ChainLayer] = []
    for name, module in modules[1:]:
        if type(module) is nn.Linear:
            layers.append(ChainLayer(weight=f"{prefix}{name}.weight",
                                     bias=None if module.bias is None else f"{prefix}{name}.bias", relu=False))
        elif type(module) is nn.ReLU and layers and not layers[-1].relu:
            last = layers[-1]
            layers[-1] = ChainLayer(weight=last.weight, bias=last.bias, relu=True)
        else:
            return None
    if not layers or any(True for _ in model.buffers()):
        return None
    named = {name for name, _ in model.named_parameters()}
    if named != {n for layer in layers for n in (layer.weight, layer.bias) if n is not None}:
        return None
    return tuple(layers)


def chain_step(layers: tuple[ChainLayer, ...], loss: LogitsLoss) -> Callable[..., StepResult]:
    """A step function with the signature of the ``torch.func`` one in ``train_cohort``:
    ``(params, buffers, x, y, mask, class_weight, logit_shift, counters) -> (grads, (losses, buffers))``,
    every tensor stacked over the ``K`` clients of the step (``x``: ``[K, b, *input_shape]``)."""

    def step(params: dict[str, torch.Tensor], buffers: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor,
             mask: torch.Tensor, class_weight: torch.Tensor | None, logit_shift: torch.Tensor | None,
             counters: dict[str, torch.Tensor]) -> StepResult:
        with torch.no_grad():
            h = x.reshape(x.shape[0], x.shape[1], -1)
            inputs = []  # each layer's input, kept for its weight gradient
            for layer in layers:
                inputs.append(h)
                weight = params[layer.weight]
                if layer.bias is None:
                    h = torch.bmm(h, weight.transpose(1, 2))
                else:
                    h = torch.baddbmm(params[layer.bias].unsqueeze(1), h, weight.transpose(1, 2))
                if layer.relu:
                    h = h.clamp_min_(0.0)
        logits = h.requires_grad_()
        with torch.enable_grad():  # the clients' losses are independent: d(sum)/d(logits) is each one's gradient
            values = loss(logits, y, mask, class_weight, logit_shift)
            (g,) = torch.autograd.grad(values.sum(), logits)
        values = values.detach()
        grads: dict[str, torch.Tensor] = {}
        with torch.no_grad():
            output = h
            for i in range(len(layers) - 1, -1, -1):
                layer = layers[i]
                if layer.relu:  # ReLU's own backward: g where the output is positive, in one pass
                    g = torch.ops.aten.threshold_backward(g, output, 0.0)
                grads[layer.weight] = torch.bmm(g.transpose(1, 2), inputs[i])
                if layer.bias is not None:
                    grads[layer.bias] = g.sum(1)
                if i:
                    g = torch.bmm(g, params[layer.weight])
                    output = inputs[i]
        return grads, (values, {})

    return step
