"""Dubhe's client half: the client's own registry, the R_A it learned, its own coins.

Everything here reads only this client's counts, the public parameters, what the server
announced (K and the σ to use, as indices into the public grid) and what this client learned
from the registry sums. Per request:

* ``dubhe_registry`` — its category u under the announced σ (Algorithm 1), one-hot; the sum
  R_A comes back to the clients only (:meth:`DubheClient.learned`);
* ``dubhe_volunteers`` — H coin flips with P = min(1, K / (R_A(u)·‖R_A‖₀)) (Eq. 6), from its
  own generator keyed by (round, client): the server learns whom to count as volunteers;
* ``dubhe_label_counts`` — its counts, encrypted by the protocol for the server's try sums;
* ``dubhe_search_registry`` / ``dubhe_search_volunteers`` — the same under every candidate σ of
  a search step.

The registration (round, K, σ, u, R_A) is the client's state: it goes into the node's snapshot.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import numpy.typing as npt

from protocols import PolicyError
from secure_fl.stats import Learned, StatisticDeclaration

from .dubhe import (
    ANNOUNCE_SIGMA,
    ANNOUNCE_STEP,
    STATISTICS,
    declarations,
    max_candidates,
    read_announcement,
    sigma_of,
    sigma_values,
)
from .registry import participation_probability
from .strategy import ClientSelectionContext, SelectionClient, SelectionStrategy

if TYPE_CHECKING:
    from .dubhe_server import DubheSelection

__all__ = ["DubheClient", "Registration"]

COINS = "dubhe_volunteers"
SEARCH_COINS = "dubhe_search"
"""This client's generator streams (keyed by round and client; a search also by its step)."""


@dataclass
class Registration:
    """One registration epoch as this client knows it."""

    round: int
    per_round: int
    sigma: dict[int, float]
    category: int
    overall: npt.NDArray[np.int64] | None = None
    """R_A, once the registry sum came back."""


@dataclass
class SearchStep:
    """The search step under way: its candidates, this client's categories, R_A under each."""

    round: int
    per_round: int
    step: int
    sigmas: list[dict[int, float]]
    categories: npt.NDArray[np.int64] | None = None
    overall: npt.NDArray[np.int64] | None = None


class DubheClient(SelectionClient):
    """Dubhe's client half (see the module docstring)."""

    announcements: ClassVar[frozenset[str]] = frozenset({ANNOUNCE_SIGMA, ANNOUNCE_STEP})
    strategy: DubheSelection

    def __init__(self, strategy: SelectionStrategy, *, num_classes: int) -> None:
        super().__init__(strategy, num_classes=num_classes)
        self.params = self.strategy.params
        self.codebook = self.params.codebook(num_classes)
        self.values = sigma_values(self.params, self.codebook)
        self.most = max_candidates(self.params, self.codebook)
        self._declarations = declarations(self.params, num_classes)
        self.sources.update({
            STATISTICS["registry"]: self._registry,
            STATISTICS["volunteers"]: self._volunteers,
            STATISTICS["counts"]: lambda ctx: np.asarray(ctx.counts, dtype=np.int64),
            STATISTICS["search_registry"]: self._search_registry,
            STATISTICS["search_volunteers"]: self._search_volunteers,
        })
        self.registration: Registration | None = None
        self._announced: tuple[int, int, dict[int, float]] | None = None
        """(round, K, σ) of the last ``dubhe_sigma`` announcement."""
        self._step: SearchStep | None = None

    def declarations(self) -> dict[str, StatisticDeclaration]:
        return dict(self._declarations)

    # --- what the server announced and what this client learned --------------------------------

    def heard(self, name: str, round: int, vector: npt.NDArray[np.float32]) -> None:
        if name == ANNOUNCE_SIGMA:
            (k,), candidates = read_announcement(vector, header=1, values=self.values, most=1)
            self._announced = (round, _positive(k), sigma_of(self.values, candidates[0]))
        elif name == ANNOUNCE_STEP:
            (k, step), candidates = read_announcement(vector, header=2, values=self.values, most=self.most)
            self._step = SearchStep(round, _positive(k), step, [sigma_of(self.values, c) for c in candidates])
        else:
            super().heard(name, round, vector)

    def learned(self, learned: Learned) -> None:
        if learned.name == STATISTICS["registry"]:
            registration = self.registration
            if registration is not None and registration.round == learned.round:
                registration.overall = np.rint(learned.value).astype(np.int64)
        elif learned.name == STATISTICS["search_registry"]:
            step = self._step
            if step is not None and step.round == learned.round:
                matrix = np.rint(learned.value).astype(np.int64).reshape(self.most, self.codebook.length)
                step.overall = matrix[: len(step.sigmas)]

    # --- contributions ---------------------------------------------------------------------------

    def _category(self, counts: npt.ArrayLike, sigma: dict[int, float]) -> int:
        return int(self.codebook.categorize(np.asarray(counts).reshape(1, -1), sigma)[0])

    def _registry(self, ctx: ClientSelectionContext) -> npt.NDArray[np.int64]:
        announced = self._announced
        if announced is None or announced[0] != ctx.round:
            raise PolicyError("a Dubhe registration without the σ announced for it")
        _, k, sigma = announced
        self.registration = Registration(ctx.round, k, sigma, self._category(ctx.counts, sigma))
        one_hot: npt.NDArray[np.int64] = self.codebook.one_hot([self.registration.category])[0]
        return one_hot

    def _volunteers(self, ctx: ClientSelectionContext) -> npt.NDArray[np.float64]:
        """H coins; a client without R_A (it missed the registration) never volunteers."""
        tries = self.params.tries
        reg = self.registration
        if reg is None or reg.overall is None:
            return np.zeros(tries)
        p = participation_probability(reg.overall, [reg.category], reg.per_round)[0]
        coins: npt.NDArray[np.float64] = (ctx.rng(COINS).random(tries) < p).astype(np.float64)
        return coins

    def _current_step(self, ctx: ClientSelectionContext) -> SearchStep:
        step = self._step
        if step is None or step.round != ctx.round:
            raise PolicyError("a Dubhe search request without its announced step")
        return step

    def _search_registry(self, ctx: ClientSelectionContext) -> npt.NDArray[np.int64]:
        step = self._current_step(ctx)
        step.categories = np.array([self._category(ctx.counts, s) for s in step.sigmas], dtype=np.int64)
        step.overall = None
        out = np.zeros((self.most, self.codebook.length), dtype=np.int64)
        out[: len(step.sigmas)] = self.codebook.one_hot(step.categories)
        return out.reshape(-1)

    def _search_volunteers(self, ctx: ClientSelectionContext) -> npt.NDArray[np.float64]:
        step = self._current_step(ctx)
        tries = self.params.search_tries
        out = np.zeros((self.most, tries))
        if step.categories is not None and step.overall is not None:
            p = np.array([participation_probability(r, [u], step.per_round)[0]
                          for r, u in zip(step.overall, step.categories, strict=True)])
            coins = ctx.rng(SEARCH_COINS, step.step).random((len(step.sigmas), tries))
            out[: len(step.sigmas)] = coins < p[:, None]
        return out.reshape(-1)

    # --- snapshot --------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        reg = self.registration
        if reg is None:
            return {}
        return {"round": reg.round, "per_round": reg.per_round, "sigma": {str(i): v for i, v in reg.sigma.items()},
                "category": reg.category, "overall": None if reg.overall is None else reg.overall.tolist()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self._announced, self._step = None, None
        if not state:
            self.registration = None
            return
        if set(state) != {"round", "per_round", "sigma", "category", "overall"}:
            raise ValueError(f"selection 'dubhe': not a client registration, keys {sorted(state)}")
        overall, k = state["overall"], int(state["per_round"])
        if k < 1 or not -1 <= int(state["category"]) < self.codebook.length:
            raise ValueError("selection 'dubhe': impossible K or category in the client's registration")
        self.registration = Registration(
            round=int(state["round"]), per_round=k,
            sigma=self.codebook.check_sigma({int(i): float(v) for i, v in state["sigma"].items()}),
            category=int(state["category"]),
            overall=None if overall is None else np.asarray(overall, dtype=np.int64).reshape(self.codebook.length),
        )


def _positive(k: int) -> int:
    if k < 1:
        raise PolicyError("K must be at least 1")
    return k
