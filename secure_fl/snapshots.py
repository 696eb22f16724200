"""Plain-data state as bytes: checkpoints of the server, snapshots of client nodes.

``torch.save`` of tensors, numbers, strings and containers of them (moved to the CPU), read
back with ``weights_only=True`` so a snapshot can never run code when loaded.
"""

from __future__ import annotations

import io
from typing import Any

import torch

__all__ = ["dump_state", "load_state"]


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
