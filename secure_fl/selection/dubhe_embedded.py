"""Dubhe with every party in one process, for the selection study (``secure-fl select``).

:class:`DubheSelector` plays a whole population — every client's registry, coins and counts —
and the server, through an embedded Paillier :class:`~protocols.SecureSum` (``keyholder="all"``)
and :class:`~protocols.argmin.ArgminSession` on one :class:`~protocols.LocalNetwork`, so its
transcript is what each party sent. A run uses the two halves instead
(:mod:`.dubhe_server`, :mod:`.dubhe_client`); both follow the rules of :mod:`.dubhe`.

One registration epoch (:meth:`DubheSelector.register`): key set-up (once per selector); the
clients' encrypted counts when H > 1 or σ is searched (``uploads="registration"``); the σ
search (each step one batched registry sum, ``search_tries`` tentative sets per candidate, the
agent's index); the registration under σ (R_A decrypted by every client, not by the server).
Each selection: coins with Eq. 6's probabilities, top-up/trim to K, and with H > 1 the agent's
h*. The coins and the server's draws come from one generator here (a run gives each client its
own); ``protocol="plain"`` computes every sum in the clear (no transcript) and selects exactly
what the encrypted path selects for the same generator.
"""

from __future__ import annotations

import itertools
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence

import numpy as np
import numpy.typing as npt

from protocols import SERVER, AbortedError, LocalNetwork, Reveal, SecureSum, VectorSpec, make_sum
from protocols.argmin import ArgminSession, argmin_index, score_groups

from .base import Population, Selector
from .dubhe import STATISTICS, DubheParams, complete
from .registry import RegistryCodebook, participation_probability

__all__ = ["DubheSelector", "PaillierBackend", "PlainBackend"]


# --- backends: who computes the sums -------------------------------------------------------------

class DubheBackend(ABC):
    """The two sums Dubhe needs (registry sum to the clients, argmin to the server)."""

    shape: tuple[int, int]
    """(clients, classes) the backend was built for."""

    @abstractmethod
    def setup(self) -> None: ...

    @abstractmethod
    def register(self, registries: npt.NDArray[np.int64], *, statistic: str, round: int) -> npt.NDArray[np.int64]:
        """Sum one registry row per client; returns R_A as every client learned it."""

    @abstractmethod
    def upload_counts(self, counts: Mapping[int, npt.NDArray[np.int64]], *, statistic: str, round: int) -> None:
        """Clients hand their label counts (encrypted) to the server for later try sums."""

    @abstractmethod
    def stored(self) -> frozenset[int]: ...

    @abstractmethod
    def forget(self) -> None: ...

    @abstractmethod
    def argmin(self, candidates: Sequence[Sequence[Sequence[int]]], *, statistic: str, round: int) -> int:
        """The index the agent releases (see :mod:`protocols.argmin`)."""


class PaillierBackend(DubheBackend):
    """The real protocol: packed Paillier with every client holding the key, the server none."""

    def __init__(self, *, num_clients: int, num_classes: int, params: DubheParams, network: LocalNetwork) -> None:
        self.session: SecureSum = make_sum(
            "paillier", clients=range(num_clients), network=network, key_bits=params.key_bits, keyholder="all",
            allow_weak_keys=params.allow_weak_keys, min_contributors=params.min_contributors)
        self.argmin_session = ArgminSession(self.session, length=num_classes, bound=params.count_bound,
                                            max_try_size=num_clients, min_contributors=params.min_contributors)
        self.num_clients = num_clients
        self.shape = (num_clients, num_classes)
        self.last_agent: int | None = None

    def setup(self) -> None:
        if not self.session.ready:
            self.session.setup(round=-1, statistic=STATISTICS["setup"])

    def register(self, registries: npt.NDArray[np.int64], *, statistic: str, round: int) -> npt.NDArray[np.int64]:
        spec = VectorSpec(length=int(registries.shape[1]), bound=1, summands=self.num_clients)
        outcome = self.session.sum({k: registries[k] for k in range(self.num_clients)}, spec=spec,
                                   statistic=statistic, round=round, reveal=Reveal(server=False, clients=True))
        if SERVER in outcome.learned_by:
            raise AbortedError("the server learned a registry sum")  # cannot happen with keyholder='all'
        if outcome.dropped or outcome.rejected:
            raise AbortedError(f"registration incomplete: dropped {outcome.dropped}, rejected {outcome.rejected}")
        return np.rint(outcome.total).astype(np.int64)

    def upload_counts(self, counts: Mapping[int, npt.NDArray[np.int64]], *, statistic: str, round: int) -> None:
        outcome = self.argmin_session.upload(counts, round=round, statistic=statistic)
        if outcome.rejected:
            raise AbortedError(f"count uploads rejected: {outcome.rejected}")

    def stored(self) -> frozenset[int]:
        return self.argmin_session.stored

    def forget(self) -> None:
        self.argmin_session.forget()

    def argmin(self, candidates: Sequence[Sequence[Sequence[int]]], *, statistic: str, round: int) -> int:
        outcome = self.argmin_session.argmin(candidates, round=round, statistic=statistic)
        self.last_agent = outcome.agent
        return outcome.index


class PlainBackend(DubheBackend):
    """Insecure simulation: the same sums and the same decision rule, computed in the clear."""

    def __init__(self, *, num_clients: int, num_classes: int, params: DubheParams) -> None:
        self.num_clients = num_clients
        self.shape = (num_clients, num_classes)
        self.min_contributors = params.min_contributors
        self._counts: dict[int, npt.NDArray[np.int64]] = {}

    def setup(self) -> None:
        pass

    def register(self, registries: npt.NDArray[np.int64], *, statistic: str, round: int) -> npt.NDArray[np.int64]:
        total: npt.NDArray[np.int64] = np.asarray(registries, dtype=np.int64).sum(axis=0)
        return total

    def upload_counts(self, counts: Mapping[int, npt.NDArray[np.int64]], *, statistic: str, round: int) -> None:
        self._counts.update({int(k): np.asarray(v, dtype=np.int64) for k, v in counts.items()})

    def stored(self) -> frozenset[int]:
        return frozenset(self._counts)

    def forget(self) -> None:
        self._counts.clear()

    def argmin(self, candidates: Sequence[Sequence[Sequence[int]]], *, statistic: str, round: int) -> int:
        sums: list[list[npt.NDArray[np.int64]]] = []
        for group in candidates:
            row = []
            for members in group:
                kept = [m for m in set(members) if m in self._counts]
                if len(kept) < self.min_contributors:
                    raise AbortedError(f"a try holds {len(kept)} clients; at least {self.min_contributors} needed")
                row.append(np.sum([self._counts[m] for m in kept], axis=0))
            sums.append(row)
        return argmin_index(score_groups(sums))



# --- the selector --------------------------------------------------------------------------------

class DubheSelector(Selector):
    """Dubhe over a whole :class:`~secure_fl.selection.base.Population` (see the module docstring).

    Client-side steps (Algorithm 1, Eq. 6, the coin flips) read only each client's own row of the
    population and what the clients decrypted; server-side steps (top-up/trim, try bookkeeping)
    read only who volunteered and what the agent released.
    """

    name = "dubhe"

    def __init__(self, params: DubheParams | None = None, *, network: LocalNetwork | None = None) -> None:
        super().__init__(transcript=network.transcript if network is not None else None)
        self.params = params if params is not None else DubheParams()
        self.network = network if network is not None else LocalNetwork(self.transcript)
        self.backend: DubheBackend | None = None
        self.codebook: RegistryCodebook | None = None
        self.sigma: dict[int, float] | None = None
        self.overall: npt.NDArray[np.int64] | None = None
        """R_A as the clients decrypted it (the server never holds it)."""
        self.categories: npt.NDArray[np.int64] | None = None
        """Each client's own category u_k (client-side)."""
        self.search_log: list[tuple[list[dict[int, float]], int]] = []
        """Each search step's candidates and the index the agent released (public)."""
        self.last_tries: list[tuple[int, ...]] = []
        self.last_choice: int = 0
        self.rounds = 0

    # -- registration epoch --

    def register(self, population: Population, rng: np.random.Generator, *, per_round: int,
                 round: int = -1) -> None:
        super().register(population, rng, per_round=per_round, round=round)
        p = self.params
        n, c = population.num_clients, population.num_classes
        self._check_k(per_round, n)
        codebook = p.codebook(c)
        if self.backend is None or self.backend.shape != (n, c):
            self.backend = self._make_backend(n, c)
            with self.timed("setup"):
                self.backend.setup()
        else:
            self.backend.forget()  # a new epoch: last epoch's counts are stale
        sigma = p.sigma_for(codebook)
        counts = {k: population.counts[k] for k in range(n)}
        if (p.tries > 1 or sigma is None) and p.uploads == "registration":
            with self.timed("counts_upload"):
                self.backend.upload_counts(counts, statistic=STATISTICS["counts"], round=round)
        if sigma is None:
            with self.timed("search"):
                sigma = self._search(population, codebook, rng, per_round, round)
        with self.timed("registration"):
            categories = codebook.categorize(population.counts, sigma)  # client-side
            overall = self.backend.register(codebook.one_hot(categories), statistic=STATISTICS["registry"],
                                            round=round)
        self.codebook, self.sigma, self.categories, self.overall = codebook, sigma, categories, overall

    def _make_backend(self, n: int, c: int) -> DubheBackend:
        if self.params.protocol == "plain":
            return PlainBackend(num_clients=n, num_classes=c, params=self.params)
        return PaillierBackend(num_clients=n, num_classes=c, params=self.params, network=self.network)

    def _search(self, population: Population, codebook: RegistryCodebook, rng: np.random.Generator,
                per_round: int, round: int) -> dict[int, float]:
        """The parameter search (§5.3.2): returns the σ the agent picked; the server learns only indices."""
        grid = self.params.grid_for(codebook)
        keys = codebook.thresholds
        self.search_log = []
        if self.params.search == "grid":
            candidates = [dict(zip(keys, combo)) for combo in itertools.product(*(grid[i] for i in keys))]
            return self._evaluate(population, codebook, candidates, rng, per_round, round)
        best = {i: grid[i][(len(grid[i]) - 1) // 2] for i in keys}
        for i in keys:
            if len(grid[i]) > 1:
                candidates = [{**best, i: value} for value in grid[i]]
                best = self._evaluate(population, codebook, candidates, rng, per_round, round)
        return best

    def _evaluate(self, population: Population, codebook: RegistryCodebook, candidates: list[dict[int, float]],
                  rng: np.random.Generator, per_round: int, round: int) -> dict[int, float]:
        """One search step: batched registration under every candidate, tries, the agent's argmin."""
        assert self.backend is not None
        if len(candidates) == 1:
            self.search_log.append((candidates, 0))
            return candidates[0]
        if per_round < self.params.min_contributors:
            raise ValueError(f"the search needs per_round >= min_contributors ({self.params.min_contributors})")
        categories = [codebook.categorize(population.counts, s) for s in candidates]  # client-side
        batched = np.concatenate([codebook.one_hot(cat) for cat in categories], axis=1)
        overall = self.backend.register(batched, statistic=STATISTICS["search_registry"], round=round)
        overall = overall.reshape(len(candidates), codebook.length)
        groups = []
        for m, cat in enumerate(categories):
            probability = participation_probability(overall[m], cat, per_round)  # client-side
            groups.append([self._draw(probability, per_round, rng) for _ in range(self.params.search_tries)])
        if self.params.uploads == "round":
            members = sorted({pid for group in groups for t in group for pid in t})
            self.backend.upload_counts({k: population.counts[k] for k in members},
                                       statistic=STATISTICS["counts"], round=round)
        index = self.backend.argmin(groups, statistic=STATISTICS["search"], round=round)
        self.search_log.append((candidates, index))
        return candidates[index]

    # -- rounds --

    def probabilities(self, per_round: int) -> npt.NDArray[np.float64]:
        """Every client's Eq. 6 probability (each computed client-side from R_A and its own u)."""
        if self.overall is None or self.categories is None:
            raise RuntimeError("dubhe: register a population before selecting")
        return participation_probability(self.overall, self.categories, per_round)

    @staticmethod
    def _draw(probability: npt.NDArray[np.float64], per_round: int, rng: np.random.Generator) -> tuple[int, ...]:
        """Clients flip their coins; the server tops the volunteers up or trims them uniformly to K."""
        n = probability.size
        return complete(np.flatnonzero(rng.random(n) < probability), n, per_round, rng)

    def select(self, per_round: int, rng: np.random.Generator, *, round: int = 0,
               tries: int | None = None) -> tuple[int, ...]:
        """Eq. 6 coins, top-up/trim to K, and with H > 1 the agent's h* (``tries`` overrides H)."""
        pop = self._require()
        n = pop.num_clients
        self._check_k(per_round, n)
        assert self.backend is not None
        h = self.params.tries if tries is None else int(tries)
        if h < 1:
            raise ValueError("tries must be at least 1")
        if h > 1 and self.params.uploads == "registration" and not self.backend.stored():
            raise RuntimeError("multi-time selection needs the counts uploaded at registration: "
                               "register with tries > 1 or without sigma")
        with self.timed("selection"):
            self.rounds += 1
            if per_round >= n:
                return tuple(range(n))
            probability = self.probabilities(per_round)
            if h == 1:
                return self._draw(probability, per_round, rng)
            if per_round < self.params.min_contributors:
                raise ValueError(f"multi-time selection needs per_round >= {self.params.min_contributors}")
            drawn = [self._draw(probability, per_round, rng) for _ in range(h)]
            if self.params.uploads == "round":
                members = sorted({pid for t in drawn for pid in t})
                self.backend.upload_counts({k: pop.counts[k] for k in members},
                                           statistic=STATISTICS["counts"], round=round)
            index = self.backend.argmin([[t] for t in drawn], statistic=STATISTICS["selection"], round=round)
            self.last_tries, self.last_choice = drawn, index
            return drawn[index]
