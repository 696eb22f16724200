"""The client pool: the client nodes of one process train their round together.

Client-side compute shared by the nodes of one process, like the shared
:class:`~secure_fl.algorithms.LocalTrainer` scratch: a node hands it its training and gets its own
result back; nothing in it outlives the round or reaches another party.

A method's client half trains in one call, ``train(ctx)``, that calls ``ctx.train(objective)``
somewhere in the middle. The pool runs that call twice:

1. **collect** (:meth:`ClientPool.submit`, when the node receives its training message): the
   method runs up to ``ctx.train``; a recording trainer keeps the job (data, start, learning
   rate, shuffle generator, objective) and stops the method there. The node's state is put back
   as it was before the call.
2. **replay** (:meth:`ClientPool.resolve`, at the first use of any pending result): every job
   collected so far trains together (:func:`~secure_fl.training_pool.train_cohort`, chunked by a
   memory estimate, largest clients first); then each method runs again from the same state and
   the same seeded generators, and its ``ctx.train`` returns the cohort's result for that
   client. A loss the method evaluated before ``ctx.train`` (``trainer.mean_loss``: CLIMB's f_i)
   is computed in the collect run only; the replay gets the same value back.

So a method's ``train`` must depend only on its context, its state and the seeded generators
(every method here does); the objective is recorded in the first run and the shuffle generator
is the first run's, untouched. A second ``ctx.train`` in one call trains on the loop.
The engine delivers a round's training messages to every node before any node answers a
protocol message (:attr:`protocols.LocalNetwork.before_handlers`), so the whole cohort is
pending when the first result is needed.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from secure_fl.algorithms import ClientData, LocalObjective, LocalResult, LocalTrainer, LocalUpdate
from secure_fl.training_pool import (
    CohortJob,
    chunk_size,
    client_bytes,
    cohort_key,
    train_cohort,
    vectorisable,
)

__all__ = ["ClientPool", "PendingTraining"]

log = logging.getLogger("secure_fl.run")

DEFAULT_CPU_BUDGET = 4 << 30
"""Bytes a cohort chunk may take on the CPU (CUDA: 80 % of the free device memory)."""


def last_level_cache(root: Path = Path("/sys/devices/system/cpu/cpu0/cache")) -> int | None:
    """Bytes of the first CPU's largest cache as Linux reports it (``index*/size``: "32768K");
    ``None`` where the kernel does not say (another OS, a container without sysfs)."""
    sizes = []
    for entry in root.glob("index*/size"):
        try:
            text = entry.read_text().strip().upper()
        except OSError:
            continue
        scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
        digits = text[:-1] if text[-1:] in "KMG" else text
        if digits.isdigit():
            sizes.append(int(digits) * scale)
    return max(sizes) if sizes else None


def cpu_state_budget(cache: int | None) -> int:
    """Half the last-level cache, within [16, 128] MiB; 128 MiB when it is unknown."""
    if cache is None:
        return 128 << 20
    return min(128 << 20, max(16 << 20, cache // 2))


CPU_STATE_BUDGET = cpu_state_budget(last_level_cache())
"""On the CPU, a chunk's per-client model state (weights, gradients, momentum: 6 × 4 bytes per entry)
is also kept within the last-level cache: each step streams it several times. One FedAvg round of
100 MLP clients (docs/performance.md, issue 24): with a 32 MiB L3 (AMD EPYC) and the hand-written
MLP step, chunks of 16-24 MiB (5-8 clients) took 0.55 s, 64 MiB 0.65 s, 8 MiB (2 clients, where
each step's fixed cost dominates) 0.68 s; on another day, when the same VM ran a fifth slower,
12-16 MiB took 0.59-0.61 s and 24 MiB 0.62-0.66 s (a shared L3 holds less), hence half the L3.
With a 480 MiB L3 (Intel Xeon, before that step), 128 MiB was the fastest of 16-512 MiB. The GPU
takes the whole cohort its memory allows."""

Attempt = Callable[[LocalTrainer], tuple[LocalUpdate, Any]]
"""One run of a node's ``method.train`` on the given trainer: (its update, its context)."""


class _Deferred(BaseException):
    """Stops a method at ``ctx.train`` in the collect run (a BaseException: no ``except Exception`` eats it)."""


class _Recorder(LocalTrainer):
    """The shared trainer as the method sees it; ``train`` records the job (collect) or returns the
    cohort's result (replay)."""

    def __init__(self, base: LocalTrainer, results: Sequence[LocalResult] = (),
                 losses: Sequence[float] = ()) -> None:
        self.model, self.layout, self.training, self.loss = base.model, base.layout, base.training, base.loss
        self.base = base
        self.job: CohortJob | None = None
        self.results = list(results)
        self.losses = list(losses)
        """Collect: the ``mean_loss`` values computed so far; replay: the collect run's, in order."""
        self.replaying = bool(results)

    @property
    def optimizer(self) -> torch.optim.SGD:
        return self.base.optimizer

    def mean_loss(self, data: ClientData, vector: torch.Tensor, *, chunk: int = 4096) -> float:
        """Computed once, in the collect run; the replay gets the same value back (same weights, same data)."""
        if self.replaying and self.losses:
            return self.losses.pop(0)
        value = self.base.mean_loss(data, vector, chunk=chunk)
        if not self.replaying:
            self.losses.append(value)
        return value

    def train(self, data: ClientData, start: torch.Tensor, *, lr: float, shuffle: torch.Generator,
              objective: LocalObjective | None = None) -> LocalResult:
        if self.results:
            return self.results.pop(0)
        if self.job is None:
            self.job = CohortJob(data=data, start=start, lr=lr, shuffle=shuffle, objective=objective or LocalObjective())
            raise _Deferred
        return self.base.train(data, start, lr=lr, shuffle=shuffle, objective=objective)  # a second call: loop


@dataclass(eq=False)
class PendingTraining:
    """One node's training, collected and waiting for the cohort."""

    pool: ClientPool
    attempt: Attempt
    job: CohortJob
    losses: tuple[float, ...] = ()
    """What ``mean_loss`` gave the collect run before ``ctx.train``: the replay reuses it."""
    outcome: tuple[LocalUpdate, Any] | None = None

    def result(self) -> tuple[LocalUpdate, Any]:
        """The node's update and context, training the pending cohort first if needed."""
        if self.outcome is None:
            self.pool.resolve()
        assert self.outcome is not None
        return self.outcome


class ClientPool:
    """Trains the pending jobs of a process's nodes together (see the module docstring)."""

    def __init__(self, trainer: LocalTrainer, *, memory_budget: int | None = None) -> None:
        reason = vectorisable(trainer)
        if reason is not None:
            raise ValueError(reason)
        self.trainer = trainer
        self.memory_budget = memory_budget
        self._pending: list[PendingTraining] = []
        self.cohorts = 0
        """How many :func:`train_cohort` calls ran (chunks included): telemetry for tests and benchmarks."""

    def submit(self, attempt: Attempt, state: dict[str, Any]) -> PendingTraining | tuple[LocalUpdate, Any]:
        """Run ``attempt`` up to its ``ctx.train``: a pending training, or the outcome if it never trained."""
        saved = copy.deepcopy(state)
        recorder = _Recorder(self.trainer)
        try:
            return attempt(recorder)
        except _Deferred:
            state.clear()
            state.update(saved)
        assert recorder.job is not None
        pending = PendingTraining(pool=self, attempt=attempt, job=recorder.job, losses=tuple(recorder.losses))
        self._pending.append(pending)
        return pending

    def resolve(self) -> None:
        """Train every pending job together, then finish each method's call (in submission order)."""
        pending, self._pending = self._pending, []
        if not pending:
            return
        results = self._train([p.job for p in pending])
        for item, result in zip(pending, results):
            item.outcome = item.attempt(_Recorder(self.trainer, [result], item.losses))

    def _train(self, jobs: Sequence[CohortJob]) -> list[LocalResult]:
        groups: dict[tuple[bool, bool, bool], list[int]] = {}
        for position, job in enumerate(jobs):
            groups.setdefault(cohort_key(job), []).append(position)
        out: list[LocalResult | None] = [None] * len(jobs)
        for positions in groups.values():
            # by size, largest first: a chunk runs as many steps as its largest client, so chunks of
            # like sizes run fewer steps in all (results do not depend on the chunk a client is in)
            positions.sort(key=lambda p: -jobs[p].data.num_samples)
            for chunk in self._chunks([jobs[p] for p in positions]):
                trained = train_cohort(self.trainer, [jobs[positions[i]] for i in chunk])
                self.cohorts += 1
                for i, result in zip(chunk, trained):
                    out[positions[i]] = result
        assert all(r is not None for r in out)
        return [r for r in out if r is not None]

    def _chunks(self, jobs: Sequence[CohortJob]) -> list[list[int]]:
        """Consecutive slices of ``jobs`` that fit the memory budget."""
        device = jobs[0].start.device
        budget = self.memory_budget
        if budget is None:
            budget = int(torch.cuda.mem_get_info(device)[0] * 0.8) if device.type == "cuda" else DEFAULT_CPU_BUDGET
        largest = max(job.data.num_samples for job in jobs)
        sample = next((job.data.x for job in jobs if job.data.num_samples), jobs[0].data.x)
        per_client = client_bytes(self.trainer, sample, batch_size=self.trainer.training.batch_size,
                                  samples=largest) if sample.shape[0] else 4 * 6 * self.trainer.layout.dimension
        size = chunk_size(per_client, budget=budget, clients=len(jobs))
        if device.type == "cpu" and self.memory_budget is None:
            size = min(size, chunk_size(24 * self.trainer.layout.dimension, budget=CPU_STATE_BUDGET,
                                        clients=len(jobs)))
        count = -(-len(jobs) // size)
        size = -(-len(jobs) // count)  # equal chunks: no small remainder
        return [list(range(begin, min(begin + size, len(jobs)))) for begin in range(0, len(jobs), size)]
