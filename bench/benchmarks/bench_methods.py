"""What each method's secure statistics cost, through the same code paths a run uses.

* FedShift's prior: the label histogram (C counts per client, once before training),
  requested from :class:`secure_fl.stats.GlobalStatistics` with FedShift's declaration,
  over every protocol;
* Dubhe's registration (the packed registry sum, with the label-count uploads that
  multi-time selection needs when H > 1) and one multi-time selection round (H tries,
  the agent's argmin), with :class:`secure_fl.selection.DubheSelector`;
* CLIMB's per-round averages (Σ λ_i and Σ f_i of a dual round), with CLIMB's declarations;
* Ratio Loss's per-round total Σ |D_j| (its monitor's declared statistic).

Paillier keys come from ``setup_cache``; every client's obfuscators r^n are filled before
each timed call from a few reused values (the online phase, as with
``PaillierOptions.pool_size``; the r^n themselves are timed by bench_paillier.ClientUpload).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, ClassVar
from unittest import mock

import numpy as np

from protocols.errors import CapacityError
from protocols.paillier import PaillierSum
from protocols.primitives import paillier as raw

from . import _harness as h

PROTOCOLS = ("plain", "paillier", "masking", "secagg+", "ckks")
NUM_CLASSES = 10
SAMPLES = 60_000
"""Fashion-MNIST's training set, split across the clients."""
POOL = 4
"""Obfuscators per client refilled before each timed call (every Dubhe step needs one or two)."""


def paillier_keys() -> dict[int, tuple[int, int]]:
    _, private = raw.generate_keypair(2048)
    return {2048: private.export_secret()}


@contextmanager
def preset_keys(cache: Any) -> Iterator[None]:
    """Key generation returns the key pair made in setup_cache (key_bits 2048)."""
    p, q = cache[2048]
    public = raw.PublicKey(p * q)
    private = raw.PrivateKey(public, p, q)
    with mock.patch.object(raw, "generate_keypair", lambda *a, **k: (public, private)):
        yield


def fill_pools(session: PaillierSum, per_client: int, cheap: list[Any]) -> None:
    cycle = itertools.cycle(cheap)
    with mock.patch.object(raw, "obfuscator", lambda key, r=None, **_: next(cycle)):
        for pid in session.clients:
            pool = session.client_keys(pid).pool
            if len(pool) < per_client:
                pool.fill(per_client - len(pool))


# --- statistics requested through GlobalStatistics ------------------------------------------------

class _Statistics:
    """One method's statistic requests, as its code makes them, over every protocol."""

    params: ClassVar[list[Any]] = [h.CLIENTS, h.pick(PROTOCOLS, ("paillier",))]
    param_names: ClassVar[list[str]] = ["clients", "protocol"]
    timeout = 1800.0
    rounds = 1
    repeat = (1, 5, 30.0)
    warmup_time = 0.0

    def setup_cache(self) -> Any:
        return paillier_keys()

    def requests(self, clients: int) -> list[tuple[Any, dict[int, np.ndarray], bool]]:
        """(declaration, inputs, clip) of each request, in the method's order."""
        raise NotImplementedError

    def setup(self, cache: Any, clients: int, protocol: str) -> None:
        from secure_fl.stats import GlobalStatistics

        if protocol == "masking" and clients > 100:
            h.skip("the complete graph at 1000 clients (use secagg+)")
        self.batch = self.requests(clients)
        self.stats = GlobalStatistics(clients=range(clients), protocol=protocol)
        session = self.stats.session(protocol)
        for declaration, inputs, _ in self.batch:
            try:
                session.tolerance(declaration.spec(len(inputs)), len(inputs))
            except CapacityError as error:  # e.g. CKKS: the sum would not round exactly
                h.skip(f"{protocol} cannot carry {declaration.name} for {len(inputs)} clients: {error}")
        if hasattr(session, "setup"):
            with preset_keys(cache):
                session.setup()
        if isinstance(session, PaillierSum):
            assert session.public_key is not None
            fill_pools(session, POOL * len(self.batch), [raw.obfuscator(session.public_key) for _ in range(8)])

    def _request_all(self) -> int:
        start = len(self.stats.records)
        for declaration, inputs, clip in self.batch:
            self.stats.request(declaration, inputs, round=0, clip=clip)
        return sum(record.bytes for record in self.stats.records[start:])


class FedShiftPrior(_Statistics):
    """FedShift's prior P(y): the clients' label counts (C integers each) summed once before
    training, learned by the server and the clients."""

    def requests(self, clients: int) -> list[tuple[Any, dict[int, np.ndarray], bool]]:
        from secure_fl.algorithms.fedshift import label_histogram_declaration

        rng = np.random.default_rng(7)
        per_client = SAMPLES // clients
        counts = {pid: rng.multinomial(per_client, np.full(NUM_CLASSES, 1 / NUM_CLASSES))
                  for pid in range(clients)}
        return [(label_histogram_declaration(NUM_CLASSES, per_client), counts, False)]

    def time_prior(self, *args: Any) -> None:
        self._request_all()

    def track_prior_bytes(self, *args: Any) -> int:
        """Bytes of the prior's sum (key set-up excluded)."""
        return self._request_all()

    track_prior_bytes.unit = "bytes"  # type: ignore[attr-defined]


class ClimbAverages(_Statistics):
    """CLIMB's per-round averages at a dual round: Σ λ_i (for λ̄ in the update weights) and
    Σ f_i (the mean loss of the dual step), both scalars over the round's clients."""

    def requests(self, clients: int) -> list[tuple[Any, dict[int, np.ndarray], bool]]:
        from secure_fl.algorithms.climb import ClimbParams, lambda_declaration, loss_declaration

        params = ClimbParams()
        rng = np.random.default_rng(11)
        lambdas = {pid: rng.uniform(0.0, params.lambda_max, 1) for pid in range(clients)}
        losses = {pid: rng.uniform(0.0, 3.0, 1) for pid in range(clients)}
        return [(lambda_declaration(params), lambdas, False), (loss_declaration(params), losses, True)]

    def time_dual_round(self, *args: Any) -> None:
        self._request_all()

    def track_dual_round_bytes(self, *args: Any) -> int:
        """Bytes of both sums of one dual round."""
        return self._request_all()

    track_dual_round_bytes.unit = "bytes"  # type: ignore[attr-defined]


class RatioLossTotal(_Statistics):
    """Ratio Loss's monitor total: Σ_j |D_j| over the round's clients (one integer each),
    learned by the server alone, every round."""

    def requests(self, clients: int) -> list[tuple[Any, dict[int, np.ndarray], bool]]:
        from secure_fl.algorithms.ratio_monitor import monitor_total_declaration

        per_client = SAMPLES // clients
        counts = {pid: np.array([per_client], dtype=np.int64) for pid in range(clients)}
        return [(monitor_total_declaration(), counts, False)]

    def time_total(self, *args: Any) -> None:
        self._request_all()

    def track_total_bytes(self, *args: Any) -> int:
        """Bytes of one round's total."""
        return self._request_all()

    track_total_bytes.unit = "bytes"  # type: ignore[attr-defined]


# --- Dubhe -------------------------------------------------------------------------------------

DUBHE_CLIENTS = h.pick((100, 1000), (20,))
TRIES = h.pick((1, 5, 20), (5,))


def per_round(clients: int) -> int:
    return max(2, min(20, clients // 5))


class _Dubhe:
    timeout = 1800.0
    rounds = 1
    repeat = (1, 5, 60.0)
    warmup_time = 0.0

    def setup_cache(self) -> Any:
        return paillier_keys()

    def _selector(self, cache: Any, clients: int, tries: int) -> None:
        """A registered selector per benchmark process (keys shared among the clients once);
        every call only refills the clients' obfuscator pools."""
        key = (type(self).__name__, clients, tries)
        if key not in _SELECTORS:
            _SELECTORS.clear()
            _SELECTORS[key] = self._make(cache, clients, tries)
        self.selector, self.population, self.k, self.rng, refill = _SELECTORS[key]
        self._refill = refill
        refill()

    @staticmethod
    def _make(cache: Any, clients: int, tries: int) -> tuple[Any, ...]:
        from secure_fl.selection import DubheParams, DubheSelector
        from secure_fl.selection.base import dubhe_population

        population = dubhe_population(num_clients=clients, rho=10, emd_avg=1.5, rng=np.random.default_rng(0))
        params = DubheParams(tries=tries)
        grid = params.grid_for(params.codebook(NUM_CLASSES))
        sigma = tuple(values[(len(values) - 1) // 2] for values in grid.values())
        selector = DubheSelector(DubheParams(tries=tries, sigma=sigma))
        k, rng = per_round(clients), np.random.default_rng(1)
        p, q = cache[2048]
        cheap = [raw.obfuscator(raw.PublicKey(p * q)) for _ in range(8)]
        cycle = itertools.cycle(cheap)
        with preset_keys(cache), mock.patch.object(raw, "obfuscator", lambda key, r=None, **_: next(cycle)):
            selector.register(population, rng, per_round=k)  # key set-up and sharing, untimed
        session = getattr(selector.backend, "session", None)

        def refill() -> None:
            if isinstance(session, PaillierSum):
                fill_pools(session, POOL, cheap)

        return selector, population, k, rng, refill

    def _register(self) -> None:
        self.selector.register(self.population, self.rng, per_round=self.k)


_SELECTORS: dict[tuple[Any, ...], tuple[Any, ...]] = {}


class DubheRegistration(_Dubhe):
    """One registration epoch with σ given: the packed registry sum (R_A, learned by the clients
    only) and, for H > 1, every client's encrypted label counts kept for the epoch."""

    params: ClassVar[list[Any]] = [DUBHE_CLIENTS, TRIES]
    param_names: ClassVar[list[str]] = ["clients", "tries"]

    def setup(self, cache: Any, clients: int, tries: int) -> None:
        self._selector(cache, clients, tries)

    def time_registration(self, *args: Any) -> None:
        self._register()

    def track_registration_bytes(self, *args: Any) -> int:
        transcript = self.selector.transcript
        before = transcript.total_bytes()
        self._register()
        return transcript.total_bytes() - before

    track_registration_bytes.unit = "bytes"  # type: ignore[attr-defined]


class DubheSelection(_Dubhe):
    """One round of multi-time selection: H tries of K clients, the agent's argmin over their
    encrypted label-count sums, the server learning only the chosen index."""

    params: ClassVar[list[Any]] = [DUBHE_CLIENTS, tuple(t for t in TRIES if t > 1)]
    param_names: ClassVar[list[str]] = ["clients", "tries"]

    def setup(self, cache: Any, clients: int, tries: int) -> None:
        self._selector(cache, clients, tries)

    def time_selection_round(self, *args: Any) -> None:
        self.selector.select(self.k, self.rng, round=1)

    def track_selection_bytes(self, *args: Any) -> int:
        transcript = self.selector.transcript
        before = transcript.total_bytes()
        self.selector.select(self.k, self.rng, round=1)
        return transcript.total_bytes() - before

    track_selection_bytes.unit = "bytes"  # type: ignore[attr-defined]
