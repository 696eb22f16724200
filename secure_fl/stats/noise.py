"""Distributed DP for declared statistics, as the statistics service applies it.

A run that configures ``[privacy.statistics]`` hands :class:`GlobalStatistics` a
:class:`StatisticsPrivacy`: per statistic name (or ``default`` for every other one) a
:class:`StatisticPrivacy` — the budget (ε, δ) over the planned releases, the level and the
mechanism. On the first request of such a statistic the service builds one
:class:`~secure_fl.privacy.NoisySum` for it (sensitivity from the declaration's
``record_sensitivity`` / ``contribution_bound``, noise sized for the contributors of that
first request), and from then on every request of it goes through that ``NoisySum``: each
client clips and noises its own vector, the secure sum adds the noisy vectors, and the
release is recorded in the run's :class:`~secure_fl.privacy.PrivacyLedger`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from .declaration import StatisticDeclaration

if TYPE_CHECKING:
    from secure_fl.privacy import DistributedDP, NoisySum, Sensitivity

__all__ = ["DEFAULT_STATISTIC", "StatisticPrivacy", "StatisticsPrivacy", "inputs_digest"]

DEFAULT_STATISTIC = "default"
"""Key of the entry that applies to every statistic without an entry of its own."""

MECHANISM_NAMES = ("auto", "skellam", "ddg")


@dataclass(frozen=True, kw_only=True)
class StatisticPrivacy:
    """The distributed-DP budget of one statistic (a ``[privacy.statistics]`` entry).

    ``releases``: how many releases the budget (ε, δ) covers; ``None`` — the run's rounds for
    a per-round statistic, 1 for a once-per-run one. A release beyond the plan raises
    :class:`~secure_fl.privacy.PrivacyBudgetError` (the noise was not sized for it).
    ``colluders``: contributors whose noise the analysis discounts. ``secure_mode = false``
    (tests, experiments only) draws the noise from a generator keyed by the run seed.
    """

    epsilon: float
    delta: float = 1e-5
    level: Literal["record", "client"] = "record"
    releases: int | None = None
    mechanism: str = "auto"
    colluders: int = 0
    secure_mode: bool = True

    def __post_init__(self) -> None:
        if isinstance(self.epsilon, bool) or not isinstance(self.epsilon, (int, float)) \
                or not math.isfinite(self.epsilon) or self.epsilon <= 0:
            raise ValueError(f"epsilon must be finite and > 0, got {self.epsilon!r}")
        if isinstance(self.delta, bool) or not isinstance(self.delta, (int, float)) or not 0 < self.delta < 1:
            raise ValueError(f"delta must lie in (0, 1), got {self.delta!r}")
        if self.level not in ("record", "client"):
            raise ValueError(f"level must be 'record' or 'client', got {self.level!r}")
        if self.releases is not None and self.releases < 1:
            raise ValueError(f"releases must be >= 1, got {self.releases}")
        if self.mechanism not in MECHANISM_NAMES:
            raise ValueError(f"mechanism must be one of {', '.join(MECHANISM_NAMES)}, got {self.mechanism!r}")
        if self.colluders < 0:
            raise ValueError(f"colluders must be >= 0, got {self.colluders}")

    def planned_releases(self, declaration: StatisticDeclaration, rounds: int) -> int:
        if self.releases is not None:
            return self.releases
        return max(1, rounds) if declaration.per_round else 1

    def distributed_dp(self, declaration: StatisticDeclaration, *, rounds: int, seed: int) -> DistributedDP:
        from secure_fl.privacy import DistributedDP

        return DistributedDP(
            epsilon=float(self.epsilon), delta=float(self.delta), level=self.level, mechanism=self.mechanism,
            releases=self.planned_releases(declaration, rounds), colluders=self.colluders,
            secure_mode=self.secure_mode, seed=None if self.secure_mode else seed,
        )

    def as_dict(self) -> dict[str, Any]:
        out = {"epsilon": self.epsilon, "delta": self.delta, "level": self.level, "mechanism": self.mechanism,
               "colluders": self.colluders, "secure_mode": self.secure_mode}
        if self.releases is not None:
            out["releases"] = self.releases
        return out


@dataclass(frozen=True)
class StatisticsPrivacy:
    """Which statistics of a run are noised, and how (see the module docstring).

    ``rounds`` (the run's planned rounds) sizes per-round statistics without an explicit
    ``releases``; ``seed`` keys the noise of ``secure_mode = false`` entries (each release
    draws from a generator keyed by the statistic and its release index, so a resumed run
    draws what the uninterrupted one draws).
    """

    statistics: Mapping[str, StatisticPrivacy] = field(default_factory=dict)
    rounds: int = 1
    seed: int = 0
    update_l2: float | None = None
    """Client-level DP on model updates (mitigation ``dp``): every client clips its scaled update
    to this L2 norm before noising, so one client moves the sum by at most this much."""
    counts_at_record_level: bool = False
    """Mitigation ``dp`` with ``counts = "record"``: statistics that declare a per-record
    sensitivity are noised at record level, every other release at the entry's level."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "statistics", dict(self.statistics))

    def entry(self, name: str) -> StatisticPrivacy | None:
        return self.statistics.get(name, self.statistics.get(DEFAULT_STATISTIC))

    def __bool__(self) -> bool:
        return bool(self.statistics)

    @staticmethod
    def sensitivity(declaration: StatisticDeclaration) -> tuple[Sensitivity, Sensitivity]:
        """(record, contribution) sensitivity for :class:`~secure_fl.privacy.NoisySum`: the
        declared ``record_sensitivity``, else the whole contribution (sound, noisier)."""
        from secure_fl.privacy import Sensitivity

        contribution = Sensitivity(*declaration.contribution_norms())
        record = declaration.record_norms()
        return (Sensitivity(*record) if record is not None else contribution), contribution

    def noisy_sum(self, declaration: StatisticDeclaration, *, clients: int, contributors: int,
                  ledger: Any, update: bool = False) -> NoisySum | None:
        """The ``NoisySum`` of ``declaration`` (None when the statistic is not noised); a model
        update (``update``) is sized by :attr:`update_l2` (L1 ≤ √d·L2, L∞ ≤ L2)."""
        from secure_fl.privacy import NoisySum, SeededRandom, Sensitivity

        entry = self.entry(declaration.name)
        if entry is None:
            return None
        config = entry.distributed_dp(declaration, rounds=self.rounds, seed=self.seed)
        if self.counts_at_record_level and not update and declaration.record_norms() is not None:
            config = dataclasses.replace(config, level="record")
        record, contribution = self.sensitivity(declaration)
        if update and self.update_l2 is not None:
            # A model-sized vector has thousands of entries: the per-entry tail event (charged to δ
            # for every client, entry and release) must be rarer than for a short statistic.
            budget = config.delta / (100 * (1 + math.exp(config.epsilon)) * clients * declaration.length
                                     * config.releases)
            config = dataclasses.replace(config, tail_probability=min(config.tail_probability, budget))
            width = 2.0 * float(self.update_l2)
            contribution = record = Sensitivity(math.sqrt(declaration.length) * width, width,
                                                min(width, 2.0 * float(declaration.bound)))
        rng = None if config.secure_mode else SeededRandom(self.noise_seed(declaration.name, 0))
        survivors = max(1, min(contributors, clients))
        return NoisySum(declaration, config, clients=clients, expected_survivors=survivors, record=record,
                        contribution=contribution, ledger=ledger, rng=rng)

    def client_noise_seed(self, name: str, round: int, client: int) -> np.random.SeedSequence:
        """The seed of one client's noise in one release (``secure_mode = false`` only): keyed by
        statistic, round and client, so a resumed run draws what the uninterrupted one draws."""
        key = int.from_bytes(hashlib.sha256(f"dp_noise:{name}".encode()).digest()[:4], "big")
        return np.random.SeedSequence(self.seed, spawn_key=(key, int(round) + 1, int(client)))

    def noise_seed(self, name: str, release: int) -> np.random.SeedSequence:
        key = int.from_bytes(hashlib.sha256(f"dp_noise:{name}".encode()).digest()[:4], "big")
        return np.random.SeedSequence(self.seed, spawn_key=(key, int(release)))

    def as_dict(self) -> dict[str, Any]:
        return {name: entry.as_dict() for name, entry in sorted(self.statistics.items())}


def inputs_digest(inputs: Mapping[int, Any]) -> str:
    """A digest of the clients' vectors (which client sent what), for replaying a release."""
    h = hashlib.sha256()
    for cid in sorted(int(c) for c in inputs):
        h.update(cid.to_bytes(8, "big", signed=True))
        h.update(np.ascontiguousarray(np.asarray(inputs[cid], dtype=np.float64).reshape(-1)).tobytes())
    return h.hexdigest()
