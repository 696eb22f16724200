"""Dubhe's server half: sums registries it cannot read, learns who volunteered, picks K.

The server holds Dubhe's public parameters, its own Paillier session (``keyholder="all"``:
every client holds the secret key, the server none; tag ``dubhe``, with Dubhe's own key size)
and its stored ciphertexts of the clients' counts — never a registry, a count vector or R_A.
A registration epoch, at the first round (and when K changes, or every ``reregister_every``
rounds):

1. *counts* — when H > 1 or σ is searched: each client uploads Enc(counts) once (a ``store``
   run of :class:`~protocols.argmin.ArgminCoordinator`);
2. *search* (no ``sigma`` configured) — per step, the server announces the step's candidate σ
   (indices into the public grid); the clients register under every candidate in one batched
   sum (R_A for the clients only) and flip ``search_tries`` coins per candidate; the server
   completes each set of volunteers to K and the agent returns the index of the candidate with
   the best mean balance (§5.3.2);
3. *registration* — the server announces K and σ; the clients' one-hot registries are summed
   into R_A, which only the clients decrypt.

Each round: every client reports its H coin flips (each client in a request of its own, through
``plain``: the server learns who volunteered for which try, nothing else); the server completes
each try to exactly K (:func:`~secure_fl.selection.dubhe.complete`, with the round's generator);
with H > 1 the agent returns h* over the encrypted try sums (§5.3.1).

The checkpoint keeps the registration's public facts (round, K, σ, the search's indices). A
resumed server sets up fresh keys and, for H > 1, has the counts uploaded again; the clients kept
R_A in their snapshots and draw the same coins, so it selects what the uninterrupted run selects.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from protocols.argmin import ArgminCoordinator
from protocols.paillier import PaillierOptions, PaillierServerSession

from .dubhe import (
    ANNOUNCE_SIGMA,
    ANNOUNCE_STEP,
    STATISTICS,
    TAG,
    Candidate,
    DubheParams,
    complete,
    declarations,
    sigma_of,
    sigma_values,
)
from .dubhe_client import DubheClient
from .registry import RegistryCodebook
from .strategy import (
    SelectionClient,
    SelectionContext,
    SelectionStrategy,
    ask_each,
    refuse_unknown,
    register_selection,
)

if TYPE_CHECKING:
    from secure_fl.stats import StatisticDeclaration
    from secure_fl.stats.coordinator import StatsCoordinator

__all__ = ["DubheSelection", "Epoch"]


@dataclass
class Epoch:
    """A registration as the server knows it: public facts only (checkpointed)."""

    round: int
    per_round: int
    sigma: dict[int, float]
    steps: list[tuple[int, int]] = field(default_factory=list)
    """Each search step's number of candidates and the index the agent released."""


@dataclass
class _Run:
    """What ``setup`` fixes for the run: sizes, the codebook, σ's values, the declarations."""

    num_clients: int
    codebook: RegistryCodebook
    values: dict[int, tuple[float, ...]]
    declarations: dict[str, StatisticDeclaration]


@register_selection("dubhe")
@dataclass(eq=False)
class DubheSelection(SelectionStrategy):
    """Dubhe's server half (see the module docstring).

    A config's ``[selection]`` keys are :class:`~secure_fl.selection.DubheParams`' fields (one flat
    table) plus ``seed`` (of the search's tentative sets) and ``reregister_every``.
    """

    Client: ClassVar[type[SelectionClient] | None] = DubheClient
    protocols: ClassVar[Mapping[str, str]] = {STATISTICS["volunteers"]: "plain",
                                              STATISTICS["search_volunteers"]: "plain"}
    OWN: ClassVar[tuple[str, ...]] = ("seed", "reregister_every")

    params: DubheParams = field(default_factory=DubheParams)
    seed: int = 0
    reregister_every: int = 0
    epoch: Epoch | None = field(default=None, init=False)
    last_tries: list[tuple[int, ...]] = field(default_factory=list, init=False, repr=False)
    last_choice: int = field(default=0, init=False, repr=False)
    _run: _Run | None = field(default=None, init=False, repr=False)
    _argmin: ArgminCoordinator | None = field(default=None, init=False, repr=False)
    """Live only: the session's keys and the stored ciphertexts are not in the checkpoint."""

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> DubheSelection:
        own = {k: v for k, v in params.items() if k in cls.OWN}
        dubhe = {k: v for k, v in params.items() if k not in cls.OWN}
        refuse_unknown(cls.name, dubhe, {f.name for f in fields(DubheParams)} | set(cls.OWN))
        return cls(params=DubheParams(**dubhe), **own)

    def __post_init__(self) -> None:
        if self.reregister_every < 0:
            raise ValueError("reregister_every must be >= 0")
        if self.params.protocol != "paillier":
            raise ValueError("a run's Dubhe sums registries with Paillier; protocol='plain' is the "
                             "selection study's in-the-clear simulation (secure-fl select)")

    def sessions(self) -> dict[tuple[str, str], Any]:
        p = self.params
        return {("paillier", TAG): PaillierOptions(key_bits=p.key_bits, keyholder="all",
                                                   allow_weak_keys=p.allow_weak_keys,
                                                   min_contributors=p.min_contributors)}

    def setup(self, *, num_clients: int, num_classes: int, stats: StatsCoordinator) -> None:
        codebook = self.params.codebook(num_classes)
        self._run = _Run(num_clients, codebook, sigma_values(self.params, codebook),
                         declarations(self.params, num_classes))
        for declaration in self._run.declarations.values():
            stats.declare(declaration)
        self._argmin = None

    @property
    def codebook(self) -> RegistryCodebook | None:
        return None if self._run is None else self._run.codebook

    @property
    def sigma(self) -> dict[int, float] | None:
        """σ of the current registration (public: the server announced it)."""
        return None if self.epoch is None else dict(self.epoch.sigma)

    # --- rounds ----------------------------------------------------------------------------------

    def select(self, ctx: SelectionContext) -> tuple[int, ...]:
        run = self._require()
        n, k, tries = ctx.num_clients, ctx.clients_per_round, self.params.tries
        if n != run.num_clients or not 1 <= k <= n:
            raise ValueError(f"selection 'dubhe' needs 1 <= K <= {run.num_clients}, got K={k} of {n}")
        epoch = self.epoch
        if epoch is None or epoch.per_round != k or (
                self.reregister_every > 0 and ctx.round - epoch.round >= self.reregister_every):
            self._register(ctx, run)
        elif tries > 1 and self.params.uploads == "registration" and self._argmin is None:
            self._store_counts(ctx, range(n))  # a resumed server: fresh keys, the counts again
        if k >= n:
            return tuple(range(n))
        coins = ask_each(ctx, run.declarations[STATISTICS["volunteers"]]) > 0.5
        drawn = [complete(np.flatnonzero(coins[:, h]), n, k, ctx.rng) for h in range(tries)]
        if tries == 1:
            return drawn[0]
        self.last_tries = drawn
        self.last_choice = self._argmin_of(ctx, [[t] for t in drawn], STATISTICS["selection"])
        return drawn[self.last_choice]

    def _require(self) -> _Run:
        if self._run is None:
            raise RuntimeError("selection 'dubhe': call setup() before select()")
        return self._run

    # --- the registration epoch ------------------------------------------------------------------

    def _register(self, ctx: SelectionContext, run: _Run) -> None:
        p, k = self.params, ctx.clients_per_round
        if self._argmin is not None:
            self._argmin.forget()  # a new epoch: last epoch's counts are stale
        searching = p.sigma is None
        if (p.tries > 1 or searching) and p.uploads == "registration":
            self._store_counts(ctx, range(run.num_clients))
        steps: list[tuple[int, int]] = []
        best: Candidate = tuple(0 for _ in run.values)
        if searching:
            best = self._search(ctx, run, steps)
        self._announce(ctx, ANNOUNCE_SIGMA, [k, *best])
        ctx.stats.request(run.declarations[STATISTICS["registry"]], cohort=range(run.num_clients),
                          round=ctx.round, protocol="paillier", tag=TAG)
        self.epoch = Epoch(ctx.round, k, sigma_of(run.values, best), steps)

    def _search(self, ctx: SelectionContext, run: _Run, steps: list[tuple[int, int]]) -> Candidate:
        """Coordinate-wise (each σ_i over its grid, the others at their best so far) or the whole grid."""
        rng = np.random.default_rng([self.seed, ctx.round])
        sizes = [len(v) for v in run.values.values()]
        if self.params.search == "grid":
            candidates = list(itertools.product(*(range(s) for s in sizes)))
            return candidates[self._step(ctx, run, candidates, rng, steps)]
        best = tuple((s - 1) // 2 for s in sizes)
        for position, size in enumerate(sizes):
            if size > 1:
                candidates = [best[:position] + (j,) + best[position + 1:] for j in range(size)]
                best = candidates[self._step(ctx, run, candidates, rng, steps)]
        return best

    def _step(self, ctx: SelectionContext, run: _Run, candidates: Sequence[Candidate], rng: np.random.Generator,
              steps: list[tuple[int, int]]) -> int:
        """One search step: announce, batched registration, coins, tentative sets, the agent's index."""
        n, k, tries = run.num_clients, ctx.clients_per_round, self.params.search_tries
        if len(candidates) == 1:
            steps.append((1, 0))
            return 0
        if k < self.params.min_contributors:
            raise ValueError(f"the search needs K >= min_contributors ({self.params.min_contributors})")
        self._announce(ctx, ANNOUNCE_STEP, [k, len(steps), *itertools.chain.from_iterable(candidates)])
        ctx.stats.request(run.declarations[STATISTICS["search_registry"]], cohort=range(n), round=ctx.round,
                          protocol="paillier", tag=TAG)
        coins = ask_each(ctx, run.declarations[STATISTICS["search_volunteers"]]) > 0.5
        groups = [[complete(np.flatnonzero(coins[:, m * tries + t]), n, k, rng) for t in range(tries)]
                  for m in range(len(candidates))]
        index = self._argmin_of(ctx, groups, STATISTICS["search"])
        steps.append((len(candidates), index))
        return index

    @staticmethod
    def _announce(ctx: SelectionContext, name: str, values: Sequence[int]) -> None:
        if ctx.announce is None:
            raise RuntimeError("selection 'dubhe' announces K and σ to the clients; this context cannot")
        ctx.announce(name, np.asarray(values, dtype=np.float64))

    # --- encrypted counts and the private argmin -------------------------------------------------

    def _coordinator(self, ctx: SelectionContext) -> ArgminCoordinator:
        if self._argmin is None:
            run = self._require()
            session = ctx.stats.ensure_ready("paillier", round=ctx.round, tag=TAG)
            assert isinstance(session, PaillierServerSession)
            self._argmin = ArgminCoordinator(session, ctx.stats.network, length=run.codebook.num_classes,
                                             bound=self.params.count_bound, max_try_size=run.num_clients,
                                             min_contributors=self.params.min_contributors)
        return self._argmin

    def _store_counts(self, ctx: SelectionContext, clients: Sequence[int] | range) -> None:
        self._coordinator(ctx).upload(list(clients), round=ctx.round, statistic=STATISTICS["counts"])

    def _argmin_of(self, ctx: SelectionContext, groups: Sequence[Sequence[tuple[int, ...]]], statistic: str) -> int:
        if self.params.uploads == "round":
            coordinator = self._coordinator(ctx)
            coordinator.forget()
            self._store_counts(ctx, sorted({pid for group in groups for t in group for pid in t}))
        return self._coordinator(ctx).argmin(groups, round=ctx.round, statistic=statistic).index

    # --- checkpoint ------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        e = self.epoch
        if e is None:
            return {}
        return {"round": e.round, "per_round": e.per_round, "sigma": {str(i): v for i, v in e.sigma.items()},
                "steps": [list(s) for s in e.steps]}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if not state:
            self.epoch = None
            return
        if set(state) != {"round", "per_round", "sigma", "steps"}:
            raise ValueError(f"selection 'dubhe' expects a registration, got keys {sorted(state)}")
        sigma = {int(i): float(v) for i, v in state["sigma"].items()}
        if self._run is not None:
            self._run.codebook.check_sigma(sigma)
        self.epoch = Epoch(int(state["round"]), int(state["per_round"]), sigma,
                           [(int(m), int(i)) for m, i in state["steps"]])
