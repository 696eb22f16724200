"""What a method asks for: a named, bounded sum over clients, and who may learn it.

A :class:`StatisticDeclaration` is public and fixed before any input is seen: it sizes the
encoding (length, bound, integer or fixed-point), picks who learns the result (the
server, the clients, or both) and is kept with the run for the leakage audit.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any, Literal

from protocols import Reveal, VectorSpec

__all__ = ["LEARNERS", "TOTAL_SAMPLES", "StatisticDeclaration"]

LEARNERS = frozenset({"server", "clients"})
_NAME = re.compile(r"^[a-z][a-z0-9_]*$")


@dataclass(frozen=True, kw_only=True)
class StatisticDeclaration:
    """A sum over clients: ``length`` entries, each in ``[0, bound]`` (or ``[-bound, bound]``).

    ``learners`` names who learns the sum ({"server"}, {"clients"} or both); ``per_round``
    says whether it is asked for every round (over that round's clients) or once per run.
    ``frac_bits`` is the fixed-point precision of a ``float`` statistic.

    Two optional fields size distributed-DP noise when the run configures it for this
    statistic (``[privacy.statistics]``; see docs/runtime.md):

    ``record_sensitivity``
        how far adding or removing *one record* of a client can move the sum: a number ``s``
        (one record moves at most one entry, by at most ``s``: L1 = L2 = L∞ = s — a count or a
        histogram has 1) or the three norms ``(l1, l2, linf)``. ``None`` (the default) means
        unknown: a record-level guarantee then uses the whole-contribution sensitivity below,
        which is sound (a client-level guarantee implies the record-level one) but noisier.
    ``contribution_bound``
        a bound on the L1 norm of one client's whole vector, tighter than the box
        ``[0, bound]^length`` (a histogram of at most n samples: n). ``None``: the box.
    """

    name: str
    length: int
    bound: float
    kind: Literal["int", "float"] = "int"
    signed: bool = False
    learners: frozenset[str] = field(default_factory=lambda: frozenset({"server"}))
    per_round: bool = True
    frac_bits: int = 16
    description: str = ""
    record_sensitivity: float | tuple[float, float, float] | None = None
    contribution_bound: float | None = None
    clip: bool = False
    """Whether a client clips entries beyond the bound (and the release counts them) instead of
    refusing to contribute. Public, like the bound: a client never clips what the declaration
    says it must refuse."""
    constant: bool = False
    """Whether each client's input stays the same for the whole run (|D_i|): a release over
    exactly the contributors of the statistic's last release would repeat it, so the server
    points those clients at that release instead of summing again (see
    :meth:`~secure_fl.stats.coordinator.StatsCoordinator.request`). Nothing new is released."""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _NAME.match(self.name):
            raise ValueError(f"statistic name must be lower-case snake_case, got {self.name!r}")
        if not isinstance(self.length, int) or isinstance(self.length, bool) or self.length < 1:
            raise ValueError(f"statistic {self.name}: length must be a positive integer, got {self.length!r}")
        if not isinstance(self.bound, (int, float)) or not math.isfinite(self.bound) or self.bound <= 0:
            raise ValueError(f"statistic {self.name}: bound must be a finite positive number, got {self.bound!r}")
        if self.kind not in ("int", "float"):
            raise ValueError(f"statistic {self.name}: kind must be 'int' or 'float', got {self.kind!r}")
        learners = frozenset(self.learners)
        if not learners or not learners <= LEARNERS:
            raise ValueError(
                f"statistic {self.name}: learners must be a non-empty subset of {sorted(LEARNERS)}, "
                f"got {sorted(learners)}"
            )
        object.__setattr__(self, "learners", learners)
        if self.record_sensitivity is not None:
            norms = self.record_sensitivity
            if isinstance(norms, (int, float)) and not isinstance(norms, bool):
                norms = (float(norms),) * 3
            elif isinstance(norms, (tuple, list)) and len(norms) == 3:
                norms = (float(norms[0]), float(norms[1]), float(norms[2]))
            else:
                raise ValueError(f"statistic {self.name}: record_sensitivity must be a number or (l1, l2, linf), "
                                 f"got {self.record_sensitivity!r}")
            l1, l2, linf = norms
            if not all(math.isfinite(v) and v > 0 for v in norms) or not linf <= l2 <= l1:
                raise ValueError(f"statistic {self.name}: record_sensitivity needs finite 0 < linf <= l2 <= l1, "
                                 f"got {self.record_sensitivity!r}")
            if isinstance(self.record_sensitivity, list):
                object.__setattr__(self, "record_sensitivity", norms)
        if not isinstance(self.clip, bool):
            raise ValueError(f"statistic {self.name}: clip must be true or false, got {self.clip!r}")  # noqa: TRY004
        if not isinstance(self.constant, bool):
            raise ValueError(f"statistic {self.name}: constant must be true or false, got {self.constant!r}")  # noqa: TRY004
        if self.contribution_bound is not None and (
            isinstance(self.contribution_bound, bool) or not isinstance(self.contribution_bound, (int, float))
            or not math.isfinite(self.contribution_bound) or self.contribution_bound <= 0
        ):
            raise ValueError(f"statistic {self.name}: contribution_bound must be a finite positive number, "
                             f"got {self.contribution_bound!r}")

    @property
    def reveal(self) -> Reveal:
        return Reveal(server="server" in self.learners, clients="clients" in self.learners)

    def spec(self, summands: int) -> VectorSpec:
        """The encoding of a sum of ``summands`` client vectors."""
        return VectorSpec(
            length=self.length, bound=float(self.bound), summands=summands, kind=self.kind,
            signed=self.signed, frac_bits=self.frac_bits,
        )

    def record_norms(self) -> tuple[float, float, float] | None:
        """``record_sensitivity`` as (l1, l2, linf), or ``None`` when not declared."""
        s = self.record_sensitivity
        if s is None:
            return None
        if isinstance(s, (int, float)):
            return (float(s),) * 3
        return (float(s[0]), float(s[1]), float(s[2]))

    def contribution_norms(self) -> tuple[float, float, float]:
        """(l1, l2, linf) of one client's whole contribution: the declared box, tightened by
        ``contribution_bound`` (an L1 bound, hence also an L2 and L∞ bound)."""
        width = 2.0 * float(self.bound) if self.signed else float(self.bound)
        box = (self.length * width, math.sqrt(self.length) * width, width)
        if self.contribution_bound is None:
            return box
        c = float(self.contribution_bound)
        return (min(c, box[0]), min(c, box[1]), min(c, box[2]))

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "name": self.name, "length": self.length, "bound": self.bound, "kind": self.kind,
            "signed": self.signed, "learners": sorted(self.learners), "per_round": self.per_round,
            "frac_bits": self.frac_bits, "description": self.description,
        }
        # only when set, so that stored declarations without DP fields stay as they were
        if self.record_sensitivity is not None:
            norms = self.record_sensitivity
            out["record_sensitivity"] = list(norms) if isinstance(norms, tuple) else norms
        if self.contribution_bound is not None:
            out["contribution_bound"] = self.contribution_bound
        if self.clip:
            out["clip"] = True
        if self.constant:
            out["constant"] = True
        return out


TOTAL_SAMPLES = StatisticDeclaration(
    name="total_samples",
    length=1,
    bound=2**24,
    kind="int",
    learners=frozenset({"server", "clients"}),
    per_round=True,
    record_sensitivity=1,
    constant=True,
    description=(
        "Σ |D_i| over the round's clients. Clients learn it to scale their own update by "
        "|D_i| / Σ|D_j| before the update sum (weighted averaging); the bound 2^24 is a public "
        "cap on one client's sample count. Constant: a round whose clients are exactly the last "
        "release's contributors reuses that release."
    ),
)
"""Weighted averaging's denominator; every method that averages by |D_i| asks for it."""
