"""The server's side of model-sized sums (weighted updates, control variates).

The protocol is the run's ``update_protocol``: ``clear`` (raw float32, the insecure baseline;
``4 · d`` bytes per client) or any encoded protocol (each client encodes its vector fixed-point,
clipping entries beyond the bound and counting them inside the sum). The clients' vectors are
scaled in their own nodes; the server gets the sum only, as a float32 tensor.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from .coordinator import StatsCoordinator
from .plan import UpdateSettings
from .release import Release

__all__ = ["UpdateSum"]


class UpdateSum:
    """Adds the round's client vectors through the run's update protocol."""

    def __init__(self, stats: StatsCoordinator, settings: UpdateSettings, *, device: torch.device | str = "cpu") -> None:
        self.stats = stats
        self.settings = settings
        self.device = torch.device(device)
        self.clipped_total = 0

    @property
    def dimension(self) -> int:
        return self.settings.dimension

    def sum(self, statistic: str, *, cohort: Sequence[int], round: int) -> tuple[torch.Tensor, Release]:
        """Σ over the cohort's contributors of their vectors ``statistic``, as float32."""
        release = self.stats.request(self.settings.declaration(statistic), cohort=cohort, round=round,
                                     protocol=self.settings.protocol)
        if release.value is None:
            raise RuntimeError(f"{statistic}: the server did not learn the sum")
        self.clipped_total += release.clipped or 0
        total = torch.from_numpy(np.ascontiguousarray(release.value, dtype=np.float32)).to(self.device)
        return total, release
