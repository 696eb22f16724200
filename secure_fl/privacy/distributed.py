"""Distributed DP for secure sums: each client noises its own vector, the secure sum adds the noise up.

One :class:`NoisySum` serves one declared statistic in one run. From the declaration, a
privacy level and a budget it derives, before any input is seen:

* the **sensitivity** — record level: what one record can change (given by the caller,
  e.g. :meth:`Sensitivity.unit_count` for counts); client level: the client's whole
  contribution (by default the declaration's box ``[0, bound]^length``);
* the per-client noise σ — the budget's (ε, δ) over ``releases`` planned releases, the
  noise of ``expected_survivors − colluders`` honest clients adding up to the total the
  accountant needs (σ_client = σ_total / √honest for Skellam, exactly);
* the **widened encoding** — noisy values are signed and may exceed the bound, so the
  declaration's bound grows by the noise tail ``t`` (P(|noise| > t) ≤ ``tail_probability``
  per entry and client) and the :class:`~protocols.VectorSpec` is signed: bit width and
  modulus follow from it. A noisy entry beyond ``bound + t`` is clipped and counted; that
  event (and the samplers' TV) is charged to δ, never ignored.

Clients call :meth:`NoisySum.perturb` (clip the input to the declared box, add noise in the
integer domain — counts as they are, fixed-point values after scaling by 2**frac_bits),
then the ordinary secure sum runs on the widened spec. In a run, each client's
:class:`~secure_fl.stats.StatsParticipant` perturbs its own vector and the server's
:class:`~secure_fl.stats.StatsCoordinator` records the release — with the *actual* number of
contributors — in the run's ledger; :meth:`sum` does both on an embedded protocol session
(``secure-fl dp-check``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import numpy.typing as npt

from protocols import DropoutPlan, SecureSum, SumOutcome, VectorSpec

from .accounting import NoiseMechanism, Sensitivity, calibrate_sigma, create_mechanism
from .ledger import Guarantee, PrivacyLedger, Release
from .sources import RandomSource, random_source

if TYPE_CHECKING:
    from secure_fl.stats import StatisticDeclaration

__all__ = ["AUTO", "DistributedDP", "Level", "NoisyRelease", "NoisySum", "PrivacyBudgetError"]

Level = Literal["record", "client"]
AUTO = "auto"


class PrivacyBudgetError(RuntimeError):
    """A release would go beyond the releases the noise was calibrated for."""


@dataclass(frozen=True, kw_only=True)
class DistributedDP:
    """The privacy a noisy statistic promises, and how its noise is drawn.

    ``mechanism`` is ``"skellam"``, ``"ddg"`` or ``"auto"`` (the default): Skellam whenever its
    exact-table sampler covers the per-client σ (≤ 512, e.g. every record-level count), else
    the distributed discrete Gaussian, whose extra τ term vanishes at such σ.
    ``epsilon``/``delta`` are the budget of this statistic over ``releases`` planned
    releases (e.g. the number of rounds of a per-round statistic). ``colluders`` is how many
    contributors the analysis assumes may reveal their noise to the adversary (their noise
    does not count). ``strict`` refuses a release beyond the plan instead of just reporting a
    larger ε. ``secure_mode=False`` (tests only) allows a ``seed`` and a non-cryptographic
    generator.
    """

    epsilon: float
    delta: float
    level: Level = "record"
    mechanism: str = AUTO
    releases: int = 1
    colluders: int = 0
    tail_probability: float = 2.0**-40
    strict: bool = True
    secure_mode: bool = True
    seed: int | None = None

    def __post_init__(self) -> None:
        if not (math.isfinite(self.epsilon) and self.epsilon > 0):
            raise ValueError(f"epsilon must be finite and > 0, got {self.epsilon}")
        if not 0 < self.delta < 1:
            raise ValueError(f"delta must be in (0, 1), got {self.delta}")
        if self.level not in ("record", "client"):
            raise ValueError(f"level must be 'record' or 'client', got {self.level!r}")
        if self.mechanism != AUTO:
            create_mechanism(self.mechanism)
        if self.releases < 1:
            raise ValueError("releases must be >= 1")
        if self.colluders < 0:
            raise ValueError("colluders must be >= 0")
        if not 0 < self.tail_probability < 1e-3:
            raise ValueError("tail_probability must be in (0, 1e-3)")
        if self.secure_mode and self.seed is not None:
            raise ValueError("a seed is refused in secure mode; pass secure_mode=False (tests only)")

    def as_dict(self) -> dict[str, Any]:
        return {k: v for k, v in dataclasses.asdict(self).items() if k != "seed"}


@dataclass(frozen=True)
class NoisyRelease:
    """A noisy sum as its learners see it, the protocol outcome and the accounting entry."""

    total: npt.NDArray[np.float64]
    outcome: SumOutcome | None
    release: Release
    clipped_inputs: int
    clipped_noise: int


def _declared_box(declaration: StatisticDeclaration) -> tuple[float, float]:
    bound = float(declaration.bound)
    return (-bound if declaration.signed else 0.0), bound


class NoisySum:
    """Distributed DP for one declared statistic of a run (see the module docstring)."""

    def __init__(
        self,
        declaration: StatisticDeclaration,
        config: DistributedDP,
        *,
        clients: int,
        expected_survivors: int | None = None,
        record: Sensitivity | None = None,
        contribution: Sensitivity | None = None,
        ledger: PrivacyLedger | None = None,
        rng: RandomSource | None = None,
    ) -> None:
        if clients < 1:
            raise ValueError("clients must be >= 1")
        survivors = clients if expected_survivors is None else expected_survivors
        if not 1 <= survivors <= clients:
            raise ValueError(f"expected_survivors must be in [1, {clients}], got {survivors}")
        honest = survivors - config.colluders
        if honest < 1:
            raise ValueError(f"{config.colluders} colluders leave no honest survivor out of {survivors}")
        self.declaration = declaration
        self.config = config
        self.clients = clients
        self.expected_survivors = survivors
        self.ledger = ledger if ledger is not None else PrivacyLedger()
        if rng is not None and rng.secure != config.secure_mode:
            raise ValueError("the random source's security does not match config.secure_mode")
        self.rng = rng if rng is not None else random_source(secure_mode=config.secure_mode, seed=config.seed)

        self.scale = 1 if declaration.kind == "int" else 1 << declaration.frac_bits
        if config.level == "record":
            if record is None:
                raise ValueError(
                    f"statistic {declaration.name!r}: record-level DP needs the per-record sensitivity "
                    "(e.g. Sensitivity.unit_count() for counts)"
                )
            self.sensitivity = record
        else:
            self.sensitivity = contribution if contribution is not None else Sensitivity.box(
                length=declaration.length, bound=float(declaration.bound), signed=declaration.signed
            )
        self.dim = declaration.length
        self.integer_sensitivity = self.sensitivity.scaled(
            self.scale, rounding_dim=0 if declaration.kind == "int" else self.dim
        )
        self.mechanism, self.sigma = self._choose(honest)
        self.noise_bound = self.mechanism.tail(self.sigma, config.tail_probability)
        low, high = _declared_box(declaration)
        self._low_int = round(low * self.scale)
        self._high_int = round(high * self.scale)
        widened = (self._high_int + self.noise_bound) / self.scale
        self.noisy_bound: float = float(math.ceil(widened)) if declaration.kind == "int" else widened
        self.noisy_declaration = dataclasses.replace(declaration, bound=self.noisy_bound, signed=True)
        self.spec(clients)  # refuse now, not at the first release, if the widened encoding cannot fit

    # -- derived quantities --------------------------------------------------------------------

    def _choose(self, honest: int) -> tuple[NoiseMechanism, float]:
        names = ["skellam", "ddg"] if self.config.mechanism == AUTO else [self.config.mechanism]
        for name in names:
            mechanism = create_mechanism(name)
            sigma = self._calibrate(mechanism, honest)
            if sigma <= mechanism.max_sigma:
                return mechanism, sigma
        raise ValueError(
            f"statistic {self.declaration.name!r}: the per-client σ = {sigma:.4g} exceeds what the "
            f"{self.config.mechanism} sampler supports ({mechanism.max_sigma:.4g}); use mechanism='ddg' or 'auto'"
        )

    def _failure(self, contributors: int, sigma: float, mechanism: NoiseMechanism | None = None) -> float:
        tv = (mechanism or self.mechanism).tv(min(sigma, (mechanism or self.mechanism).max_sigma))
        return contributors * self.dim * (self.config.tail_probability + tv)

    def _calibrate(self, mechanism: NoiseMechanism, honest: int) -> float:
        cfg = self.config
        guess = 1.0
        for _ in range(6):  # the failure term depends (weakly) on σ through the sampler's TV
            failure = self._failure(self.clients, guess, mechanism)
            if (1 + math.exp(cfg.epsilon)) * failure * cfg.releases > cfg.delta / 2:
                raise ValueError(
                    f"tail_probability {cfg.tail_probability:g} is too large for δ = {cfg.delta:g} over "
                    f"{cfg.releases} releases of {self.clients} × {self.dim} entries"
                )
            sigma = calibrate_sigma(
                mechanism, epsilon=cfg.epsilon, delta=cfg.delta, sensitivity=self.integer_sensitivity,
                dim=self.dim, honest=honest, releases=cfg.releases, failure_per_release=failure,
            )
            if self._failure(self.clients, sigma, mechanism) <= failure:
                return sigma  # the δ charge used covers the σ found
            guess = max(guess, sigma) * 1.05
        raise ValueError(f"statistic {self.declaration.name!r}: noise calibration did not settle")

    @property
    def sigma_total(self) -> float:
        """σ of the summed noise when the expected honest survivors contribute (integer domain)."""
        return math.sqrt(self.expected_survivors - self.config.colluders) * self.sigma

    def spec(self, summands: int) -> VectorSpec:
        """The widened encoding of a sum of ``summands`` noisy vectors."""
        return self.noisy_declaration.spec(summands)

    def describe(self) -> dict[str, Any]:
        spec = self.spec(self.clients)
        return {
            "statistic": self.declaration.name, **self.config.as_dict(), "mechanism": self.mechanism.name,
            "sensitivity": self.sensitivity.as_dict(), "sigma_per_client": self.sigma / self.scale,
            "sigma_total": self.sigma_total / self.scale, "noise_bound": self.noise_bound / self.scale,
            "noisy_bound": self.noisy_bound, "slot_bits": spec.slot_bits, "modulus_bits": spec.slot_bits,
            "expected_survivors": self.expected_survivors, "clients": self.clients,
        }

    # -- client side ---------------------------------------------------------------------------

    def noise(self, n: int) -> npt.NDArray[np.int64]:
        """``n`` raw noise draws of one client, integer domain."""
        return self.mechanism.sample(self.sigma, n, self.rng)

    def perturb(self, vector: npt.ArrayLike) -> tuple[npt.NDArray[np.float64], int, int]:
        """One client's noisy vector (declared units) plus (inputs clipped, noisy entries clipped)."""
        values = np.asarray(vector, dtype=np.float64).reshape(-1)
        if values.shape != (self.dim,):
            raise ValueError(f"statistic {self.declaration.name!r}: expected {self.dim} entries, got {values.size}")
        if not np.all(np.isfinite(values)):
            raise ValueError("vector holds NaN or infinity")
        if self.declaration.kind == "int":
            if np.any(values != np.round(values)):
                raise ValueError(f"statistic {self.declaration.name!r} is integral; got non-integral values")
            integer = values.astype(np.int64)
        else:
            integer = np.rint(values * self.scale).astype(np.int64)
        clipped_inputs = int(np.count_nonzero((integer < self._low_int) | (integer > self._high_int)))
        integer = np.clip(integer, self._low_int, self._high_int)
        noisy = integer + self.noise(self.dim)
        top = round(self.noisy_bound * self.scale)
        clipped_noise = int(np.count_nonzero(np.abs(noisy) > top))
        noisy = np.clip(noisy, -top, top)
        return noisy.astype(np.float64) / self.scale, clipped_inputs, clipped_noise

    # -- one release ---------------------------------------------------------------------------

    def _check_budget(self) -> None:
        done = self.ledger.count(self.declaration.name)
        if self.config.strict and done >= self.config.releases:
            raise PrivacyBudgetError(
                f"statistic {self.declaration.name!r} was calibrated for {self.config.releases} release(s) "
                f"and has made {done}; plan more releases (more noise) or pass strict=False"
            )

    def _record(self, *, round: int, contributors: int) -> Release:
        release = Release(
            statistic=self.declaration.name, round=round, mechanism=self.mechanism.name,
            level=self.config.level, sigma=self.sigma, contributors=contributors,
            honest=max(0, contributors - self.config.colluders), sensitivity=self.integer_sensitivity,
            dim=self.dim, failure=self._failure(contributors, self.sigma),
        )
        self.ledger.record(release)
        return release

    def perturb_all(self, inputs: Mapping[int, npt.ArrayLike]) -> tuple[dict[int, npt.NDArray[np.float64]], int, int]:
        noisy: dict[int, npt.NDArray[np.float64]] = {}
        clipped_inputs = clipped_noise = 0
        for cid, vec in inputs.items():
            noisy[int(cid)], ci, cn = self.perturb(vec)
            clipped_inputs += ci
            clipped_noise += cn
        return noisy, clipped_inputs, clipped_noise

    def sum(
        self,
        session: SecureSum,
        inputs: Mapping[int, npt.ArrayLike],
        *,
        round: int,
        dropouts: DropoutPlan | None = None,
    ) -> NoisyRelease:
        """Noise each client's vector, securely sum on ``session`` and record the release."""
        self._check_budget()
        if len(inputs) > self.clients:
            raise ValueError(f"{len(inputs)} inputs but the noise was planned for {self.clients} clients")
        noisy, clipped_inputs, clipped_noise = self.perturb_all(inputs)
        outcome = session.sum(
            noisy, spec=self.spec(len(noisy)), statistic=self.declaration.name, round=round,
            reveal=self.declaration.reveal, dropouts=dropouts,
        )
        release = self._record(round=round, contributors=len(outcome.contributors))
        return NoisyRelease(np.asarray(outcome.total, dtype=np.float64), outcome, release,
                            clipped_inputs, clipped_noise)

    def guarantee(self, delta: float | None = None) -> Guarantee:
        """Formal (ε, δ) of this statistic's releases so far."""
        return self.ledger.guarantee(self.config.delta if delta is None else delta,
                                     statistic=self.declaration.name)
