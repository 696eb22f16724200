"""Every noisy release of a run, composed into formal (ε, δ) per statistic, for the model and overall.

The :class:`PrivacyLedger` is the run's record of distributed-DP releases (one
:class:`Release` per noisy secure sum); it composes them by adding RDP curves and converts
at the run's δ. :func:`formal_guarantees` is what the audit calls: per statistic name, for
the model (DP-SGD, worst client) and for the whole run, the formal (ε, δ). Both the ledger
and DP-SGD states are plain JSON (``to_dict``/``from_dict``), so the run store can keep
them per round and a resumed run continues the same accounting.

Composition is conservative: every release of a run is assumed to touch the protected
unit (a record at record level, a client's whole data at client level), client selection
is not credited as subsampling, and a client-level guarantee is also a record-level one
(a record is part of one client's data), so the whole-run total composes both.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from .accounting import ORDERS, Sensitivity, create_mechanism, with_failure

if TYPE_CHECKING:
    from .dpsgd import DPSGDState

__all__ = ["MODEL", "RUN", "Guarantee", "PrivacyLedger", "Release", "composition_delta", "formal_guarantees"]

MODEL = "model"
"""Key of the DP-SGD (model) guarantee in :func:`formal_guarantees`."""
RUN = "run"
"""Key of the whole-run composition in :func:`formal_guarantees`."""


@dataclass(frozen=True)
class Guarantee:
    """A formal (ε, δ) and what it covers."""

    epsilon: float
    delta: float
    releases: int
    level: str
    order: int | None = None
    mechanism: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {
            "epsilon": self.epsilon if math.isfinite(self.epsilon) else None,
            "delta": self.delta, "releases": self.releases, "level": self.level,
            "order": self.order, "mechanism": self.mechanism,
        }


@dataclass(frozen=True)
class Release:
    """One noisy secure sum: enough to recompute its RDP curve from scratch."""

    statistic: str
    round: int
    mechanism: str
    level: str
    sigma: float
    """Per-client noise parameter, integer domain."""
    contributors: int
    honest: int
    """Contributors whose noise the adversary does not know (contributors − assumed colluders)."""
    sensitivity: Sensitivity
    """Integer domain (after fixed-point scaling and rounding)."""
    dim: int
    failure: float
    """P(some entry's noise exceeded the encoding's tail bound) + sampler TV, for this release."""

    def rdp(self, orders: Sequence[int] = ORDERS) -> np.ndarray:
        return create_mechanism(self.mechanism).rdp(
            orders, sigma=self.sigma, honest=self.honest, sensitivity=self.sensitivity, dim=self.dim
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "statistic": self.statistic, "round": self.round, "mechanism": self.mechanism,
            "level": self.level, "sigma": self.sigma, "contributors": self.contributors,
            "honest": self.honest, "sensitivity": self.sensitivity.as_dict(), "dim": self.dim,
            "failure": self.failure,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Release:
        return cls(
            statistic=str(data["statistic"]), round=int(data["round"]), mechanism=str(data["mechanism"]),
            level=str(data["level"]), sigma=float(data["sigma"]), contributors=int(data["contributors"]),
            honest=int(data["honest"]), sensitivity=Sensitivity.from_dict(data["sensitivity"]),
            dim=int(data["dim"]), failure=float(data["failure"]),
        )


def _compose(rdp_curves: Iterable[np.ndarray], failures: float, delta: float, *, count: int, level: str,
             mechanism: str) -> Guarantee:
    total = np.zeros(len(ORDERS))
    for curve in rdp_curves:
        total = total + curve
    if count == 0:
        return Guarantee(epsilon=0.0, delta=0.0, releases=0, level=level, mechanism=mechanism)
    eps, _, order = with_failure(total, delta, failures)
    return Guarantee(epsilon=eps, delta=delta, releases=count, level=level, order=order, mechanism=mechanism)


def _label(values: Iterable[str]) -> str:
    distinct = sorted(set(values))
    return distinct[0] if len(distinct) == 1 else "+".join(distinct)


@dataclass
class PrivacyLedger:
    """The distributed-DP releases of one run, in order."""

    releases: list[Release] = field(default_factory=list)

    def record(self, release: Release) -> None:
        self.releases.append(release)

    def count(self, statistic: str) -> int:
        return sum(1 for r in self.releases if r.statistic == statistic)

    def statistics(self) -> list[str]:
        return sorted({r.statistic for r in self.releases})

    def guarantee(self, delta: float, *, statistic: str | None = None, up_to_round: int | None = None) -> Guarantee:
        """Composed (ε, δ) of one statistic's releases (or of all of them), optionally up to a round."""
        chosen = [
            r for r in self.releases
            if (statistic is None or r.statistic == statistic) and (up_to_round is None or r.round <= up_to_round)
        ]
        return _compose(
            (r.rdp() for r in chosen), sum(r.failure for r in chosen), delta, count=len(chosen),
            level=_label(r.level for r in chosen) if chosen else "", mechanism=_label(r.mechanism for r in chosen),
        )

    def by_statistic(self, delta: float, *, up_to_round: int | None = None) -> dict[str, Guarantee]:
        return {name: self.guarantee(delta, statistic=name, up_to_round=up_to_round) for name in self.statistics()}

    def to_dict(self) -> dict[str, Any]:
        return {"version": 1, "releases": [r.as_dict() for r in self.releases]}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PrivacyLedger:
        if data.get("version") != 1:
            raise ValueError(f"unsupported privacy ledger version {data.get('version')!r}")
        return cls([Release.from_dict(r) for r in data["releases"]])

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> PrivacyLedger:
        return cls.from_dict(json.loads(text))


def composition_delta(statistic_deltas: Iterable[float], *, fallback: float) -> float:
    """The δ at which a run's releases compose into one ε: the sum of the noised statistics' δ,
    capped at 0.5. Each statistic's calibration charges up to its own δ for sampler and tail
    failures, so composing several at one statistic's δ would be vacuous (ε = ∞). ``fallback``
    (the run's reporting δ) when no statistic is noised."""
    deltas = list(statistic_deltas)
    return min(sum(deltas), 0.5) if deltas else fallback


def formal_guarantees(
    ledger: PrivacyLedger | None,
    *,
    delta: float,
    model: Mapping[int, DPSGDState] | None = None,
) -> dict[str, Guarantee]:
    """What the audit reports: per released statistic, for the model and for the whole run.

    ``model`` maps client id to that client's DP-SGD state: the model's guarantee is the
    worst client's (each client's records are protected by its own accountant). The
    :data:`RUN` entry composes every release with the worst client's DP-SGD curve at the
    RDP level (record level; it assumes the worst client's records are in every release).
    """
    out: dict[str, Guarantee] = {}
    releases = ledger.releases if ledger is not None else []
    if ledger is not None:
        out.update(ledger.by_statistic(delta))
    worst_curve: np.ndarray | None = None
    if model:
        worst_eps = -1.0
        worst: Guarantee | None = None
        for state in model.values():
            g = state.guarantee(delta)
            if g.epsilon > worst_eps:
                worst_eps, worst, worst_curve = g.epsilon, g, state.rdp(ORDERS)
        assert worst is not None
        out[MODEL] = worst
    if releases or worst_curve is not None:
        curves = [r.rdp() for r in releases] + ([worst_curve] if worst_curve is not None else [])
        levels = [r.level for r in releases] + (["record"] if worst_curve is not None else [])
        mechanisms = [r.mechanism for r in releases] + (["dp-sgd"] if worst_curve is not None else [])
        out[RUN] = _compose(
            curves, sum(r.failure for r in releases), delta, count=len(curves),
            level="record" if len(set(levels)) > 1 else levels[0], mechanism=_label(mechanisms),
        )
    return out
