"""The public plan of a run's statistics: which protocol sums what, with which options and noise.

Both sides of the run build the same :class:`StatisticsPlan` from the run's config — the
server's coordinator to open runs, each client's participant to check what it is asked — so
nothing in it may depend on a client's data. Model-sized sums (weighted updates, control
variates) are declared from :class:`UpdateSettings`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from protocols import VectorSpec, descriptor

from .declaration import StatisticDeclaration
from .guard import ReleasePolicy
from .noise import StatisticsPrivacy
from .tally import digits_for

if TYPE_CHECKING:
    from secure_fl.privacy import NoisySum

__all__ = ["MODEL_UPDATE", "Layout", "StatisticsPlan", "UpdateSettings"]

MODEL_UPDATE = "model_update"
"""The round's sum of (scaled) model updates."""


@dataclass(frozen=True, kw_only=True)
class UpdateSettings:
    """How model-sized vectors are summed: the protocol, and for encoded protocols the per-entry
    bound (entries beyond it are clipped and counted) and fixed-point precision."""

    dimension: int
    protocol: str = "clear"
    clip: float = 1.0
    frac_bits: int = 16

    def __post_init__(self) -> None:
        if self.dimension < 1:
            raise ValueError(f"dimension must be >= 1, got {self.dimension}")
        descriptor(self.protocol)
        if not self.clip > 0:
            raise ValueError(f"update clip must be positive, got {self.clip}")

    def declaration(self, name: str) -> StatisticDeclaration:
        return StatisticDeclaration(
            name=name, length=self.dimension, bound=self.clip, kind="float", signed=True,
            learners=frozenset({"server"}), per_round=True, frac_bits=self.frac_bits,
            clip=descriptor(self.protocol).encoded,
            description="sum of the round's scaled client vectors (model-sized)",
        )


@dataclass(frozen=True, kw_only=True)
class StatisticsPlan:
    """Which protocol each statistic uses and with which (public) options and noise.

    ``protocol`` is the default; ``overrides`` maps a statistic name to another protocol;
    ``options`` holds each protocol's keyword options; ``privacy`` names the statistics that get
    distributed DP; ``updates`` sizes the model-sized sums named in ``update_statistics``;
    ``policy`` is the public rule on participant sets every client enforces (issue 25's guard or
    fixed cohorts, :mod:`.guard`).
    """

    clients: tuple[int, ...]
    protocol: str = "plain"
    overrides: Mapping[str, str] = field(default_factory=dict)
    options: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    privacy: StatisticsPrivacy | None = None
    updates: UpdateSettings | None = None
    policy: ReleasePolicy | None = None

    def __post_init__(self) -> None:
        if not self.clients or list(self.clients) != sorted(set(self.clients)):
            raise ValueError("clients must be a non-empty ascending list of distinct ids")
        for name in {self.protocol, *self.overrides.values()}:
            if not descriptor(name).encoded:
                raise ValueError(f"protocol {name!r} carries raw floats: it is for model updates only; "
                                 "use 'plain' for an insecure statistic")
        object.__setattr__(self, "overrides", dict(self.overrides))
        object.__setattr__(self, "options", {k: dict(v) for k, v in self.options.items()})
        if self.privacy is not None and not self.privacy:
            object.__setattr__(self, "privacy", None)

    def protocol_for(self, declaration: StatisticDeclaration) -> str:
        if self.updates is not None and declaration == self.updates.declaration(declaration.name):
            return self.updates.protocol
        return self.overrides.get(declaration.name, self.protocol)

    def options_for(self, protocol: str) -> Any:
        return descriptor(protocol).options(**self.options.get(protocol, {}))

    def protocols(self) -> tuple[str, ...]:
        names = {self.protocol, *self.overrides.values()}
        if self.updates is not None:
            names.add(self.updates.protocol)
        return tuple(sorted(names))

    def is_update(self, declaration: StatisticDeclaration) -> bool:
        return self.updates is not None and declaration == self.updates.declaration(declaration.name)

    def noised(self, declaration: StatisticDeclaration) -> bool:
        """Model-sized sums get distributed DP only when the privacy plan bounds their L2 norm
        (``update_l2``, mitigation ``dp``); otherwise DP-SGD protects updates."""
        if self.privacy is None or self.privacy.entry(declaration.name) is None:
            return False
        return not self.is_update(declaration) or self.privacy.update_l2 is not None

    def layout(self, declaration: StatisticDeclaration, summands: int, protocol: str) -> Layout:
        """The encoding of a request over ``summands`` clients (both sides compute the same)."""
        noisy: NoisySum | None = None
        if self.noised(declaration):
            assert self.privacy is not None
            noisy = self.privacy.noisy_sum(declaration, clients=len(self.clients), contributors=summands, ledger=None,
                                           update=self.is_update(declaration))
        base = noisy.spec(summands) if noisy is not None else declaration.spec(summands)
        digits = 0 if noisy is not None else self.tally_digits(declaration, base, protocol)
        spec = base if not digits else VectorSpec(
            length=base.length + digits, bound=base.bound, summands=base.summands, kind=base.kind,
            signed=base.signed, frac_bits=base.frac_bits)
        return Layout(declaration=declaration, protocol=protocol, spec=spec, digits=digits, noisy=noisy)

    def tally_digits(self, declaration: StatisticDeclaration, spec: VectorSpec, protocol: str) -> int:
        """Entries appended for the clip count (:mod:`.tally`): only where clients clip an encoded sum."""
        if not declaration.clip or not descriptor(protocol).encoded:
            return 0
        return digits_for(spec, declaration.length)


@dataclass(frozen=True, eq=False)
class Layout:
    """How one request of a statistic is summed: protocol, the encoding on the wire (the declared
    entries, widened for noise when noised, then the clip-count digits), and the noise."""

    declaration: StatisticDeclaration
    protocol: str
    spec: VectorSpec
    digits: int
    noisy: NoisySum | None

    @property
    def base(self) -> VectorSpec:
        """The encoding of the statistic's own entries (without the clip-count digits)."""
        return self.spec if not self.digits else VectorSpec(
            length=self.spec.length - self.digits, bound=self.spec.bound, summands=self.spec.summands,
            kind=self.spec.kind, signed=self.spec.signed, frac_bits=self.spec.frac_bits)


class Layouts:
    """:meth:`StatisticsPlan.layout` with the noise calibration cached (it solves for σ)."""

    def __init__(self, plan: StatisticsPlan) -> None:
        self.plan = plan
        self._cache: dict[tuple[StatisticDeclaration, int, str], Layout] = {}

    def __call__(self, declaration: StatisticDeclaration, summands: int, protocol: str | None = None) -> Layout:
        name = protocol or self.plan.protocol_for(declaration)
        key = (declaration, summands, name)
        if key not in self._cache:
            self._cache[key] = self.plan.layout(declaration, summands, name)
        return self._cache[key]


def ascending(ids: Sequence[int]) -> tuple[int, ...]:
    out = tuple(sorted({int(c) for c in ids}))
    if not out:
        raise ValueError("a request needs at least one client")
    return out
