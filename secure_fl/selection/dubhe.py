"""Dubhe (paper 004, §5): what both halves share — parameters, statistics, the public rules.

The two halves of a run (:mod:`.dubhe_server`, :mod:`.dubhe_client`) and the in-process study
(:mod:`.dubhe_embedded`) follow the same rules from here: the registry codebook and Eq. 6
(:mod:`.registry`), σ's candidate values (:func:`sigma_values`), the top-up/trim of volunteers
to K (:func:`complete`), and the declarations of the statistics a run asks for
(:func:`declarations`). See docs/dubhe.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
import numpy.typing as npt

from protocols import PolicyError
from secure_fl.stats import StatisticDeclaration

from .registry import RegistryCodebook, default_search_grid

__all__ = [
    "ANNOUNCE_SIGMA", "ANNOUNCE_STEP", "STATISTICS", "TAG", "Candidate", "DubheParams", "complete",
    "declarations", "max_candidates", "read_announcement", "sigma_of", "sigma_values",
]

STATISTICS = {
    "setup": "dubhe_setup",
    "counts": "dubhe_label_counts",
    "search_registry": "dubhe_search_registry",
    "search_volunteers": "dubhe_search_volunteers",
    "search": "dubhe_search",
    "registry": "dubhe_registry",
    "volunteers": "dubhe_volunteers",
    "selection": "dubhe_selection",
}
"""Transcript statistic names of each step."""

TAG = "dubhe"
"""Dubhe's own Paillier session (``keyholder="all"``, its own key size), beside the run's."""

ANNOUNCE_STEP = "dubhe_search_step"
"""Server → every client: K, the step number and the step's candidate σ (as indices)."""
ANNOUNCE_SIGMA = "dubhe_sigma"
"""Server → every client: K and the σ to register under (as indices)."""

Uploads = Literal["registration", "round"]

Candidate = tuple[int, ...]
"""A setting of σ: for each i of the codebook's thresholds, an index into :func:`sigma_values`."""


@dataclass(frozen=True, kw_only=True)
class DubheParams:
    """Dubhe's knobs. ``sigma`` (σ_i for the i ∈ G below C, ascending) skips the search.

    * ``reference_set`` — G; default {1, 2, C} (C ≤ 20) or {1, C}.
    * ``tries`` — H of the client determination (1 = single shot).
    * ``search_grid`` — candidate values of each σ_i (same order as ``sigma``); the search tries
      their Cartesian product. Default :func:`~secure_fl.selection.registry.default_search_grid`.
    * ``search_tries`` — H of the parameter search.
    * ``search`` — ``"coordinate"`` (default): one pass over σ_1, then σ_2, …, each over its grid
      with the others at their best so far (starting from each grid's middle value), one batched
      registration per pass; ``"grid"``: the whole Cartesian product in one batched registration
      (Σ_i |grid_i| versus Π_i |grid_i| registries per client).
    * ``uploads`` — ``"registration"``: clients encrypt their counts once per registration epoch
      and the server reuses the ciphertexts for every try; ``"round"``: the clients of the tries
      encrypt afresh every round (the paper's per-round cost; same information to every party).
    * ``protocol`` — ``"paillier"``; ``"plain"`` is the selection study's in-the-clear simulation
      (a run always sums registries with Paillier).
    * ``key_bits``, ``allow_weak_keys`` — Dubhe's own Paillier keys (every client holds the secret key).
    * ``count_bound`` — public bound on one client's count of one class (sizes the packing).
    * ``min_contributors`` — the agent decrypts no try sum over fewer clients.
    """

    reference_set: tuple[int, ...] | None = None
    sigma: tuple[float, ...] | None = None
    tries: int = 1
    search_grid: tuple[tuple[float, ...], ...] | None = None
    search_tries: int = 20
    search: Literal["coordinate", "grid"] = "coordinate"
    protocol: Literal["paillier", "plain"] = "paillier"
    key_bits: int = 2048
    allow_weak_keys: bool = False
    uploads: Uploads = "registration"
    count_bound: int = 65535
    min_contributors: int = 2

    def __post_init__(self) -> None:
        if self.tries < 1 or self.search_tries < 1:
            raise ValueError("tries and search_tries must be at least 1")
        if self.protocol not in ("paillier", "plain"):
            raise ValueError(f"protocol must be 'paillier' or 'plain', got {self.protocol!r}")
        if self.search not in ("coordinate", "grid"):
            raise ValueError(f"search must be 'coordinate' or 'grid', got {self.search!r}")
        if self.uploads not in ("registration", "round"):
            raise ValueError(f"uploads must be 'registration' or 'round', got {self.uploads!r}")
        if self.count_bound < 1 or self.min_contributors < 1:
            raise ValueError("count_bound and min_contributors must be positive")
        if self.sigma is not None:
            object.__setattr__(self, "sigma", tuple(float(s) for s in self.sigma))
        if self.reference_set is not None:
            object.__setattr__(self, "reference_set", tuple(int(i) for i in self.reference_set))
        if self.search_grid is not None:
            object.__setattr__(self, "search_grid", tuple(tuple(float(v) for v in values)
                                                          for values in self.search_grid))

    def codebook(self, num_classes: int) -> RegistryCodebook:
        if self.reference_set is None:
            return RegistryCodebook.paper(num_classes)
        return RegistryCodebook(num_classes, self.reference_set)

    def sigma_for(self, codebook: RegistryCodebook) -> dict[int, float] | None:
        if self.sigma is None:
            return None
        if len(self.sigma) != len(codebook.thresholds):
            raise ValueError(f"sigma needs one value per i in {list(codebook.thresholds)}, got {self.sigma}")
        return codebook.check_sigma(dict(zip(codebook.thresholds, self.sigma)))

    def grid_for(self, codebook: RegistryCodebook) -> dict[int, tuple[float, ...]]:
        """Candidate values of each σ_i (i ∈ G below C)."""
        keys = codebook.thresholds
        if self.search_grid is None:
            grid = default_search_grid(codebook)
        else:
            if len(self.search_grid) != len(keys):
                raise ValueError(f"search_grid needs one tuple per i in {list(keys)}")
            grid = dict(zip(keys, self.search_grid))
        for i in keys:
            if not grid[i]:
                raise ValueError(f"sigma_{i} needs at least one candidate value")
            codebook.check_sigma({j: grid[i][0] if j == i else 0.0 for j in keys})
            codebook.check_sigma({j: max(grid[i]) if j == i else 0.0 for j in keys})
        return {i: tuple(grid[i]) for i in keys}


def sigma_values(params: DubheParams, codebook: RegistryCodebook) -> dict[int, tuple[float, ...]]:
    """Each σ_i's possible values: the configured σ_i alone, else its search grid (public)."""
    fixed = params.sigma_for(codebook)
    if fixed is not None:
        return {i: (v,) for i, v in fixed.items()}
    return params.grid_for(codebook)


def sigma_of(values: dict[int, tuple[float, ...]], candidate: Candidate) -> dict[int, float]:
    return {i: values[i][j] for i, j in zip(values, candidate, strict=True)}


def max_candidates(params: DubheParams, codebook: RegistryCodebook) -> int:
    """The most candidates one search step evaluates (sizes the search statistics)."""
    sizes = [len(v) for v in sigma_values(params, codebook).values()]
    if params.search == "grid":
        return int(np.prod(sizes)) if sizes else 1
    return max(sizes, default=1)


def read_announcement(vector: npt.ArrayLike, *, header: int, values: dict[int, tuple[float, ...]],
                      most: int) -> tuple[list[int], list[Candidate]]:
    """``header`` integers, then candidates of one index per σ_i each (a client's strict parse)."""
    raw = np.asarray(vector, dtype=np.float64).reshape(-1)
    if raw.size < header or not np.all(np.isfinite(raw)) or np.any(raw != np.rint(raw)) or np.any(raw < 0):
        raise PolicyError("a Dubhe announcement holds non-negative integers")
    ints = [int(v) for v in raw]
    head, body = ints[:header], ints[header:]
    width = len(values)
    count = 1 if width == 0 else len(body) // width
    if (width == 0 and body) or (width and len(body) % width) or not 1 <= count <= most:
        raise PolicyError(f"a Dubhe announcement must name 1..{most} settings of {width} thresholds")
    sizes = [len(v) for v in values.values()]
    candidates = [tuple(body[m * width : (m + 1) * width]) for m in range(count)]
    if any(j >= size for candidate in candidates for j, size in zip(candidate, sizes)):
        raise PolicyError("a Dubhe announcement names a threshold outside the public grid")
    return head, candidates


def complete(volunteers: npt.NDArray[np.int64], num_clients: int, per_round: int,
             rng: np.random.Generator) -> tuple[int, ...]:
    """The server's step (§5.2): trim the volunteers, or top them up, uniformly to exactly K."""
    if volunteers.size > per_round:
        chosen = rng.choice(volunteers, size=per_round, replace=False)
    elif volunteers.size < per_round:
        rest = np.setdiff1d(np.arange(num_clients), volunteers, assume_unique=True)
        chosen = np.concatenate([volunteers, rng.choice(rest, size=per_round - volunteers.size, replace=False)])
    else:
        chosen = volunteers
    return tuple(sorted(int(k) for k in chosen))


def declarations(params: DubheParams, num_classes: int) -> dict[str, StatisticDeclaration]:
    """Every statistic a Dubhe run may ask a client for: both halves build them from here."""
    codebook = params.codebook(num_classes)
    searching = params.sigma is None
    out = [
        StatisticDeclaration(
            name=STATISTICS["registry"], length=codebook.length, bound=1, learners=frozenset({"clients"}),
            description="Dubhe registry: a one-hot category under σ, summed (Paillier, every client holds "
                        "the key) into R_A for the clients only"),
        StatisticDeclaration(
            name=STATISTICS["volunteers"], length=params.tries, bound=1, learners=frozenset({"server"}),
            description="one client's H coin flips (Eq. 6), asked of each client alone: the server learns "
                        "who volunteered for each try, which it needs to top up or trim to K"),
    ]
    if params.tries > 1 or searching:
        out.append(StatisticDeclaration(
            name=STATISTICS["counts"], length=num_classes, bound=params.count_bound,
            learners=frozenset({"server"}),
            description="Enc(label counts), stored by the server for try sums; an agent client decrypts "
                        "sums of >= min_contributors clients and releases only the argmin index"))
    if searching:
        most = max_candidates(params, codebook)
        out.append(StatisticDeclaration(
            name=STATISTICS["search_registry"], length=most * codebook.length, bound=1,
            learners=frozenset({"clients"}),
            description="a search step's registries, one per candidate σ (padded), summed for the clients"))
        out.append(StatisticDeclaration(
            name=STATISTICS["search_volunteers"], length=most * params.search_tries, bound=1,
            learners=frozenset({"server"}),
            description="one client's coin flips for a search step's tentative sets (padded)"))
    return {d.name: d for d in out}
