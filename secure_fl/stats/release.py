"""What a statistic request gives back: the value its learners got, and how it came about."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = ["Learned", "Release"]


@dataclass(frozen=True, eq=False)
class Release:
    """One request of a statistic, as the server knows it.

    ``value`` is the sum when the server is one of its learners (``None`` otherwise);
    ``contributors`` the clients whose input it holds, ``dropouts`` those asked who are not in
    it (lost, refused, rejected); ``clipped`` the entries the contributors clipped, summed
    inside the secure sum (``None`` for a noised statistic, whose count would escape the noise);
    ``bytes`` what the run's messages cost; ``epsilon`` the statistic's distributed-DP ε so far
    (``None`` when not noised); ``refusals`` why clients declined. ``reused_from`` is the round
    of the release this one repeats (a constant statistic over the same contributors: nothing was
    summed, the contributors were pointed at that release), ``None`` for a sum.
    """

    name: str
    round: int
    protocol: str
    value: npt.NDArray[np.float64] | None
    contributors: tuple[int, ...]
    dropouts: tuple[int, ...]
    learned_by: tuple[str, ...]
    clipped: int | None
    bytes: int
    epsilon: float | None = None
    noise: dict[str, Any] | None = None
    refusals: tuple[str, ...] = field(default_factory=tuple)
    reused_from: int | None = None

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "name": self.name, "round": self.round, "protocol": self.protocol,
            "contributors": list(self.contributors), "dropped": list(self.dropouts),
            "learned_by": list(self.learned_by), "clipped": self.clipped, "bytes": self.bytes,
        }
        if self.epsilon is not None:
            out["epsilon"] = self.epsilon
        if self.reused_from is not None:
            out["reused_from"] = self.reused_from
        return out

    def scalar(self) -> float:
        """The value of a one-entry statistic the server learned."""
        if self.value is None:
            raise ValueError(f"statistic {self.name!r} is not learned by the server")
        return float(self.value.reshape(-1)[0])

    def means(self) -> npt.NDArray[np.float64] | None:
        """Each entry of the sum divided by the (public) number of contributors; ``None`` when the
        server does not learn the statistic."""
        return None if self.value is None else _per_contributor(self.value, self.contributors)


@dataclass(frozen=True, eq=False)
class Learned:
    """What one client learned from a run: the statistic's value and whose inputs it holds."""

    name: str
    round: int
    value: npt.NDArray[np.float64]
    contributors: tuple[int, ...]
    clipped: int | None

    def mean(self) -> float:
        """A one-entry sum divided by its number of contributors (public)."""
        return float(self.means()[0])

    def means(self) -> npt.NDArray[np.float64]:
        """Each entry of the sum divided by its number of contributors (public)."""
        return _per_contributor(self.value, self.contributors)


def _per_contributor(value: npt.NDArray[np.float64], contributors: tuple[int, ...]) -> npt.NDArray[np.float64]:
    out: npt.NDArray[np.float64] = np.asarray(value, dtype=np.float64).reshape(-1) / max(len(contributors), 1)
    return out
