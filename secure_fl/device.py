"""Where training runs: ``auto`` (CUDA when present, else the CPU), ``cpu`` or ``cuda[:N]``.

Everything else (protocols, statistics, the store) stays on the CPU; only models and the
clients' pre-sliced tensors move to the device.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

__all__ = ["DEVICE_CHOICES", "configure_threads", "resolve_device"]

DEVICE_CHOICES = ("auto", "cpu", "cuda")


def resolve_device(spec: str | torch.device = "auto") -> torch.device:
    """Turn ``auto|cpu|cuda|cuda:N`` into a device, refusing CUDA where there is none."""
    import torch  # here, not at import: the CLI's parser needs DEVICE_CHOICES only

    if isinstance(spec, torch.device):
        spec = str(spec)
    name = spec.strip().lower()
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cpu":
        return torch.device("cpu")
    if name == "cuda" or name.startswith("cuda:"):
        if not torch.cuda.is_available():
            raise ValueError(f"device {spec!r} asked for, but this machine has no usable CUDA device; "
                             "use --device cpu (or auto: CUDA when present)")
        device = torch.device(name)
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ValueError(f"device {spec!r}: only {torch.cuda.device_count()} CUDA device(s) here")
        return device
    raise ValueError(f"unknown device {spec!r}; choose auto, cpu, cuda or cuda:N")


def configure_threads(threads: int | str = "auto") -> int:
    """Set torch's intra-op threads and return the number in use.

    ``auto`` uses half the visible cores (at least one): federated simulation trains small
    models on small batches, where extra intra-op threads buy little and oversubscribed
    cores (protocol work, other processes) cost a lot — on 2 busy cores, 2 threads made an
    MLP step 20× slower than 1. An integer sets that many.
    """
    if threads == "auto":
        count = max(1, (os.cpu_count() or 2) // 2)
    elif isinstance(threads, int) and not isinstance(threads, bool) and threads >= 1:
        count = threads
    else:
        raise ValueError(f"threads must be 'auto' or a positive integer, got {threads!r}")
    import torch

    torch.set_num_threads(count)
    return count
