"""Everything the attacks of one cell work from: the server's view, the method model, the probe.

:class:`CellContext` answers the questions the attacks ask of what the server holds — which
statistics reveal counts or sample sizes (from the method's client half, not from names), what
each client scaled its update by, which objective it trained with, Σ|D_j| of a round — each from
the server's view (:mod:`secure_fl.audit.views`) and public knowledge only. ``truth`` (every
client's label counts, read from the simulated nodes) and ``prior`` (P(y), which the threat model
grants the attacker) are used to score, and ``prior`` as the fallback guess.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

from secure_fl.algorithms import LocalObjective
from secure_fl.algorithms.ratio_monitor import recipe_step
from secure_fl.audit import attacks as A
from secure_fl.audit.knowledge import CountMap, MethodModel
from secure_fl.audit.ledger import Ledger
from secure_fl.audit.probe import OutputLayerProbe
from secure_fl.audit.settings import AuditSettings
from secure_fl.audit.views import PartyView, Read, ServerView
from secure_fl.stats import Learned, Release

__all__ = ["CellContext", "UpdateModel"]

FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True)
class UpdateModel:
    """What a client of |D_i| = n scales its update by in one round: ``w(n) = slope · n + offset``."""

    slope: float
    offset: float

    @property
    def weighted(self) -> bool:
        """The weight grows with |D_i| (FedAvg's |D_i|/Σ|D_j|), so sums are size-weighted."""
        return abs(self.slope) > 1e-15

    def weight(self, n: float) -> float:
        return self.slope * n + self.offset

    def size_from(self, mass: float) -> float:
        """n with ``w(n) · n = mass`` (the mass of a least-squares composition of one update)."""
        if self.weighted:
            disc = self.offset ** 2 + 4 * self.slope * max(mass, 0.0)
            return max((-self.offset + math.sqrt(disc)) / (2 * self.slope), 0.0)
        return max(mass, 0.0) / self.offset if self.offset else 0.0


@dataclass(eq=False)
class CellContext:
    """What every attack of one cell needs (see the module docstring)."""

    view: ServerView
    ledger: Ledger
    model: MethodModel
    probe: OutputLayerProbe
    settings: AuditSettings
    truth: dict[int, FloatArray]
    prior: FloatArray
    client_view: Callable[[int], PartyView]
    """A client's own view (for coalitions of the server with that client)."""
    _signatures: dict[tuple[Any, ...], FloatArray] = field(default_factory=dict)

    # --- the run's shape -------------------------------------------------------------------------

    @property
    def rounds(self) -> int:
        return self.view.rounds

    @property
    def clients(self) -> list[int]:
        return sorted(self.truth)

    @cached_property
    def first_rounds(self) -> dict[int, int]:
        first: dict[int, int] = {}
        for r, cohort in enumerate(self.view.cohorts):
            for c in cohort:
                first.setdefault(c, r)
        return first

    def start(self, round: int) -> torch.Tensor:
        return torch.as_tensor(self.view.models[round])

    def end(self, round: int) -> torch.Tensor:
        return torch.as_tensor(self.view.models[round + 1])

    def step(self, round: int) -> float:
        t = self.model.info.training
        return recipe_step(t.lr_at(round), epochs=t.epochs, batch_size=t.batch_size, momentum=t.momentum)

    # --- statistics by what they reveal ------------------------------------------------------

    def count_map(self, name: str) -> CountMap | None:
        return self.model.count_map(name)

    @cached_property
    def count_statistics(self) -> list[str]:
        """Statistics whose one contribution gives the client's label counts."""
        return [n for n in sorted(self.model.declarations) if (m := self.count_map(n)) is not None and m.reveals_counts]

    @cached_property
    def size_statistics(self) -> list[str]:
        """Statistics whose contribution is a multiple of |D_i|."""
        return [n for n in sorted(self.model.declarations) if (m := self.count_map(n)) is not None and m.reveals_size]

    @cached_property
    def update_statistic(self) -> str:
        """The model-sized statistic the round's model comes from (the half's first)."""
        return self.model.update_statistics[0]

    def noised(self, statistic: str) -> bool:
        """Released with distributed DP (the server's release says so)."""
        return any(r.noise is not None for r in self.view.releases_of(statistic))

    # --- what the server learned -------------------------------------------------------------

    def release(self, statistic: str, round: int) -> Release | None:
        return next((r for r in self.view.releases_of(statistic) if r.round == round and r.value is not None), None)

    def round_total(self, round: int) -> float | None:
        """Σ|D_j| of the round, where the server learned a size statistic's sum."""
        for name in self.size_statistics:
            release = self.release(name, round)
            if release is not None and release.value is not None:
                cmap = self.count_map(name)
                assert cmap is not None
                return cmap.size(release.value, contributors=len(release.contributors))
        return None

    def read_sizes(self) -> dict[int, float]:
        """|D_i| of the clients whose size statistic the server reads in the clear."""
        out: dict[int, float] = {}
        for name in self.size_statistics:
            cmap = self.count_map(name)
            assert cmap is not None
            for read in self.view.inputs(name):
                if read.owner is not None:
                    out.setdefault(read.owner, cmap.size(read.values))
        return out

    def update_read(self, client: int, round: int) -> Read | None:
        return next((r for r in self.view.inputs(self.update_statistic) if r.owner == client and r.round == round), None)

    def update_sum(self, round: int) -> Release | None:
        return self.release(self.update_statistic, round)

    # --- what each client learned and was sent -------------------------------------------------

    def learned(self, client: int, *, before: int | None = None, round: int | None = None) -> list[Learned]:
        """Releases the server knows ``client`` learned (before message ``before``, or of ``round``)."""
        reads = [r for r in self.view.learned.get(client, [])
                 if (before is None or r.index < before) and (round is None or r.round == round)]
        return self.model.learned_values(reads)

    def trained_with(self, client: int, round: int) -> list[Learned]:
        """What ``client`` had learned when the server sent it the round's model."""
        index = self.view.train_index.get((round, client))
        return self.learned(client, before=index) if index is not None else []

    def broadcast(self, client: int, round: int) -> dict[str, FloatArray]:
        return self.view.broadcasts.get((round, client), {})

    def cohort_size(self, statistic: str, round: int) -> int:
        run = next((r for r in self.view.runs.values()
                    if r.request.statistic == statistic and r.request.round == round), None)
        return len(run.request.participants) if run is not None else len(self.view.cohorts[round])

    def update_model(self, round: int, client: int | None = None) -> UpdateModel | None:
        """How ``client`` (default: the round's first contributor) weighted its update."""
        cohort = self.view.cohorts[round]
        who = client if client is not None else cohort[0]
        learned = {x.name: x for x in self.learned(who, round=round)}
        size = self.cohort_size(self.update_statistic, round)
        w1, w2 = (self.model.update_weight(n, round=round, learned=learned, cohort_size=size,
                                           statistic=self.update_statistic) for n in (1.0, 2.0))
        if w1 is None or w2 is None:
            return None
        return UpdateModel(slope=w2 - w1, offset=2 * w1 - w2)

    def objective(self, counts: npt.ArrayLike, *, client: int, round: int) -> LocalObjective:
        return self.model.objective(counts, round=round, start=self.start(round),
                                    learned=self.trained_with(client, round), broadcast=self.broadcast(client, round))

    def class_weight(self, round: int) -> FloatArray | None:
        """Per-class loss weights a typical client of the round trained with (from the half)."""
        client = self.view.cohorts[round][0]
        weight = self.objective(self.prior, client=client, round=round).class_weight
        return None if weight is None else np.asarray(weight.detach().cpu().numpy(), dtype=np.float64)

    def signatures(self, round: int, objective: LocalObjective) -> FloatArray:
        shift, weight = objective.logit_shift, objective.class_weight
        key = (round, None if shift is None else tuple(shift.tolist()), None if weight is None else tuple(weight.tolist()))
        if key not in self._signatures:
            self._signatures[key] = self.probe.signatures([self.start(round), self.end(round)], logit_shift=shift,
                                                          class_weight=weight)
        return self._signatures[key]

    # --- label counts from model updates -------------------------------------------------------

    def client_update_counts(self, client: int, round: int) -> FloatArray | None:
        """Label counts behind the update of ``client`` the server read in ``round``.

        The objective comes from the method's client half for the counts estimated so far
        (FedShift's shift ln(P_i/P) depends on them): estimate, recompute the objective, up to
        five passes until it no longer changes."""
        read = self.update_read(client, round)
        weights = self.update_model(round, client)
        if read is None:
            return None
        update = self.probe.output_part(read.values)
        known = self.read_sizes().get(client)
        counts = np.asarray(self.prior, dtype=np.float64) * (known or 1.0) / max(float(self.prior.sum()), 1e-12)
        objective = self.objective(counts, client=client, round=round)
        for _ in range(5):
            m = A.composition_from_update(update, self.signatures(round, objective), step=self.step(round))
            mass = float(m.sum())
            n = known if known is not None else (weights.size_from(mass) if weights is not None else mass)
            counts = m * (n / mass) if mass > 0 else m
            following = self.objective(counts, client=client, round=round)
            if _same(following, objective):
                break
            objective = following
        return counts

    def sum_update_counts(self, round: int) -> tuple[FloatArray, bool] | None:
        """(Σ of label counts behind the round's update sum, whether size-weighted: Σ_i n_i · n_i,k).

        A sum mixes clients with different objectives: a typical client's (counts ∝ P(y)) is used."""
        release = self.update_sum(round)
        if release is None or release.value is None:
            return None
        objective = self.objective(self.prior, client=self.view.cohorts[round][0], round=round)
        m = A.composition_from_update(self.probe.output_part(release.value), self.signatures(round, objective),
                                      step=self.step(round))
        weights = self.update_model(round)
        if weights is None:
            return m, False
        if weights.weighted:
            return m / weights.slope, True
        return (m / weights.offset if weights.offset else m), False


def _same(a: LocalObjective, b: LocalObjective) -> bool:
    """Do two objectives train alike (same class weights and logit shifts)?"""
    for x, y in ((a.class_weight, b.class_weight), (a.logit_shift, b.logit_shift)):
        if (x is None) != (y is None):
            return False
        if x is not None and y is not None and not torch.allclose(x.float(), y.float(), atol=1e-6):
            return False
    return True
