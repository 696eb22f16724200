"""What every selection strategy shares: the population it selects from and the selector API.

A :class:`Population` is the (clients × classes) matrix of label counts; row k is client k's
private knowledge. p_o, the *population distribution* of a selected set S (paper 004, §4.2), is
the normalised sum of the selected clients' counts — the quantity an encrypted sum of counts
delivers exactly. It equals the paper's mean of per-client distributions when every client holds
the same number of samples (the paper's virtual clients of size N_VC); with unequal sizes it is
the sample-weighted version, which is what sample-weighted aggregation trains on.

A :class:`Selector` is told the population once per registration epoch (:meth:`Selector.register`)
and then picks K clients per round (:meth:`Selector.select`). How much of the population the
*server side* may read is the strategy's business: random reads nothing, greedy reads every row
in the clear (and says so in its transcript), Dubhe reads only ciphertexts.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import numpy.typing as npt

from protocols import Transcript
from secure_fl.data.imbalance import l1_to_uniform
from secure_fl.data.partition import DubheProfile

__all__ = ["Population", "Selector", "dubhe_population", "synthetic_labels"]


@dataclass(frozen=True, eq=False)
class Population:
    """Label counts per client: ``counts[k, j]`` samples of class j on client k (client ids 0..N-1)."""

    counts: npt.NDArray[np.int64]

    def __post_init__(self) -> None:
        arr = np.asarray(self.counts)
        if arr.ndim != 2 or arr.shape[0] < 1 or arr.shape[1] < 2:
            raise ValueError(f"counts must be a (clients, classes >= 2) matrix, got shape {arr.shape}")
        if not np.issubdtype(arr.dtype, np.integer) and (
                not np.all(np.isfinite(arr)) or np.any(arr != np.round(arr))):
            raise ValueError("counts must be integers")
        arr = arr.astype(np.int64)
        if np.any(arr < 0):
            raise ValueError("counts must be non-negative")
        arr.setflags(write=False)
        object.__setattr__(self, "counts", arr)

    @classmethod
    def from_clients(cls, counts: Mapping[int, npt.ArrayLike]) -> Population:
        ids = sorted(counts)
        if ids != list(range(len(ids))):
            raise ValueError("client ids must be 0 .. N-1")
        return cls(np.stack([np.asarray(counts[i]) for i in ids]))

    @property
    def num_clients(self) -> int:
        return int(self.counts.shape[0])

    @property
    def num_classes(self) -> int:
        return int(self.counts.shape[1])

    @property
    def global_distribution(self) -> npt.NDArray[np.float64]:
        total: npt.NDArray[np.float64] = self.counts.sum(axis=0).astype(np.float64)
        return total / total.sum()  # type: ignore[no-any-return]

    def distribution(self, selected: Sequence[int] | npt.NDArray[np.int64]) -> npt.NDArray[np.float64]:
        """p_o of a selected set: its summed counts, normalised."""
        total: npt.NDArray[np.float64] = self.counts[np.asarray(selected, dtype=np.int64)].sum(axis=0).astype(
            np.float64)
        if total.sum() <= 0:
            raise ValueError("the selected clients hold no samples")
        return total / total.sum()  # type: ignore[no-any-return]

    def l1(self, selected: Sequence[int] | npt.NDArray[np.int64]) -> float:
        """‖p_o − p_u‖₁ of a selected set."""
        return l1_to_uniform(self.counts[np.asarray(selected, dtype=np.int64)].sum(axis=0))

    def baseline_l1(self) -> float:
        """‖p_g − p_u‖₁: full participation."""
        return l1_to_uniform(self.counts.sum(axis=0))


def synthetic_labels(num_classes: int, samples_per_class: int) -> npt.NDArray[np.int64]:
    """A balanced label array (``samples_per_class`` of each class), for partitions without a dataset."""
    if num_classes < 2 or samples_per_class < 1:
        raise ValueError("need at least two classes and one sample per class")
    return np.repeat(np.arange(num_classes, dtype=np.int64), samples_per_class)


def dubhe_population(*, num_clients: int, rho: float, emd_avg: float, rng: np.random.Generator,
                     num_classes: int = 10, samples_per_class: int = 6000,
                     profile: DubheProfile = "dirichlet") -> Population:
    """Per-client counts of Dubhe's synthetic sets (half-normal skew ρ, target EMD_avg).

    Calls :func:`secure_fl.data.dubhe_partition` on a balanced synthetic label array (6000 per
    class by default, Fashion-MNIST's and MNIST's training size), so the population is the one a
    training run on those datasets gets.
    """
    from secure_fl.data import dubhe_partition

    labels = synthetic_labels(num_classes, samples_per_class)
    partition = dubhe_partition(labels, num_clients=num_clients, rho=rho, emd_avg=emd_avg, rng=rng,
                                profile=profile)
    return Population(partition.class_counts(labels, num_classes))


class Selector(ABC):
    """A client-selection strategy: register a population, then pick K clients per round."""

    name: ClassVar[str]

    def __init__(self, *, transcript: Transcript | None = None) -> None:
        self.transcript = transcript if transcript is not None else Transcript()
        self.timings: dict[str, float] = {}
        self.cpu_timings: dict[str, float] = {}
        self.population: Population | None = None

    @contextmanager
    def timed(self, label: str) -> Iterator[None]:
        """Add the wall-clock seconds of the block to ``timings`` and its CPU seconds to ``cpu_timings``.

        Every party runs in this one process, so CPU seconds measure the work even on a busy machine.
        """
        start, cpu = time.perf_counter(), time.process_time()
        try:
            yield
        finally:
            self.timings[label] = self.timings.get(label, 0.0) + time.perf_counter() - start
            self.cpu_timings[label] = self.cpu_timings.get(label, 0.0) + time.process_time() - cpu

    def register(self, population: Population, rng: np.random.Generator, *, per_round: int,
                 round: int = -1) -> None:
        """A registration epoch: the clients' data as of now (again whenever it changes)."""
        self.population = population

    @abstractmethod
    def select(self, per_round: int, rng: np.random.Generator, *, round: int = 0) -> tuple[int, ...]:
        """``per_round`` distinct client ids, sorted ascending."""

    def _require(self) -> Population:
        if self.population is None:
            raise RuntimeError(f"{self.name}: register a population before selecting")
        return self.population

    @staticmethod
    def _check_k(per_round: int, num_clients: int) -> None:
        if not 1 <= per_round <= num_clients:
            raise ValueError(f"per_round must lie in [1, {num_clients}], got {per_round}")
