"""What each method's secure statistics cost, through the same code paths a run uses.

The server's side is a :class:`secure_fl.stats.coordinator.StatsCoordinator`, each client's a
:class:`secure_fl.stats.participant.StatsParticipant` holding its own vector of the statistic;
they share nothing but bytes over a :class:`protocols.LocalNetwork` (the coordinator opens each
sum, every participant checks the request against its own declarations, clips, encodes and
joins through its own protocol session). Timed: one request of each of the method's
statistics, as its code makes them, over every protocol:

* FedShift's prior: the label histogram (C counts per client, once before training) with
  FedShift's declaration;
* CLIMB's per-round averages (Σ λ_i and Σ f_i of a dual round), with CLIMB's declarations;
* Ratio Loss's per-round total Σ |D_j| (its monitor's declared statistic);
* Dubhe's registration (the packed registry sum, with the label-count uploads that
  multi-time selection needs when H > 1) and one multi-time selection round (H tries, the
  agent's argmin), with :class:`secure_fl.selection.DubheSelector`, whose parties share only
  bytes over its own network (see ``_Dubhe``).

Paillier keys come from ``setup_cache`` (the key set-up run itself, messages between the
coordinator's and the participants' sessions, happens in ``setup``, untimed); every client's
obfuscators r^n are filled through its own session (``PaillierClientSession.fill_pool``)
before each timed call from a few reused values (the online phase, as with
``PaillierOptions.pool_size``; the r^n themselves are timed by bench_paillier.ClientUpload).
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from functools import partial
from typing import Any, ClassVar
from unittest import mock

import numpy as np

from protocols import CapacityError, LocalNetwork, Message, SecureSum, SumRequest
from protocols.paillier import PaillierClientSession
from protocols.primitives import paillier as raw
from secure_fl.stats import Learned, StatisticDeclaration, StatisticsPlan
from secure_fl.stats.coordinator import StatsCoordinator
from secure_fl.stats.participant import StatsParticipant

from . import _harness as h

PROTOCOLS = ("plain", "paillier", "masking", "secagg+", "ckks")
NUM_CLASSES = 10
SAMPLES = 60_000
"""Fashion-MNIST's training set, split across the clients."""
POOL = 4
"""Obfuscators per client and request refilled before each timed call (a sum needs one per plaintext)."""


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


# --- the statistics layer's parties ---------------------------------------------------------------

Inputs = Mapping[int, np.ndarray]


class StatsParties:
    """The server's coordinator and one participant per client over a :class:`LocalNetwork`.

    Each participant's vector of a statistic comes from :attr:`inputs` (its owner's data);
    the coordinator sees only what the protocol releases to the server.
    """

    def __init__(self, clients: int, protocol: str, declarations: Sequence[StatisticDeclaration]) -> None:
        self.plan = StatisticsPlan(clients=tuple(range(clients)), protocol=protocol)
        self.network = LocalNetwork()
        self.coordinator = StatsCoordinator(self.plan, self.network)
        self.declared = {d.name: d for d in declarations}
        self.inputs: dict[str, Inputs] = {}
        self.participants: dict[int, StatsParticipant] = {}
        for c in self.plan.clients:
            participant = StatsParticipant(c, plan=self.plan, declarations=self.declared.get,
                                           source=partial(self._source, c), on_learned=_learned)
            self.participants[c] = participant
            self.network.attach(c, partial(_deliver, participant))

    def _source(self, client: int, declaration: StatisticDeclaration, request: SumRequest) -> np.ndarray:
        return self.inputs[declaration.name][client]

    def fill_pools(self, per_client: int, cheap: list[Any]) -> None:
        """Each Paillier client session tops its obfuscator pool up to ``per_client`` (cheap,
        reused values: benchmarks only)."""
        cycle = itertools.cycle(cheap)
        with mock.patch.object(raw, "obfuscator", lambda key, r=None, **_: next(cycle)):
            for participant in self.participants.values():
                for session in participant.sessions.values():
                    if isinstance(session, PaillierClientSession) and session.keys is not None:
                        missing = per_client - len(session.keys.pool)
                        if missing > 0:
                            session.fill_pool(missing)


def _deliver(participant: StatsParticipant, inbox: Sequence[bytes]) -> list[Message]:
    return [reply for data in inbox for reply in participant.handle(data)]


def _learned(learned: Learned) -> None:
    """What a client learned: nothing to do with it here."""


# --- statistics requested through the coordinator -------------------------------------------------

class _Statistics:
    """One method's statistic requests, as its code makes them, over every protocol."""

    params: ClassVar[list[Any]] = [h.CLIENTS, h.pick(PROTOCOLS, ("paillier",))]
    param_names: ClassVar[list[str]] = ["clients", "protocol"]
    timeout = 1800.0
    rounds = 1
    repeat = (1, 5, 30.0)
    number = 1
    """One call per sample: ``setup`` (run before every sample) refills the Paillier pools."""
    warmup_time = 0.0

    def setup_cache(self) -> Any:
        return paillier_keys()

    def requests(self, clients: int) -> list[tuple[StatisticDeclaration, Inputs]]:
        """(declaration, each client's vector) of each request, in the method's order."""
        raise NotImplementedError

    def setup(self, cache: Any, clients: int, protocol: str) -> None:
        if protocol == "masking" and clients > 100:
            h.skip("the complete graph at 1000 clients (use secagg+)")
        self.batch = self.requests(clients)
        self.parties = StatsParties(clients, protocol, [declaration for declaration, _ in self.batch])
        coordinator = self.parties.coordinator
        for declaration, inputs in self.batch:
            self.parties.inputs[declaration.name] = inputs
            layout = coordinator.layouts(declaration, len(inputs))
            try:
                coordinator.session(layout.protocol).check(spec=layout.spec, reveal=declaration.reveal)
            except (CapacityError, ValueError) as error:  # e.g. CKKS: the sum would not round exactly
                h.skip(f"{protocol} cannot carry {declaration.name} for {len(inputs)} clients: {error}")
        with preset_keys(cache):
            coordinator.ensure_ready(protocol, round=0)  # the key set-up run, untimed
        session = coordinator.session(protocol)
        public = getattr(session, "public_key", None)
        self._cheap = [raw.obfuscator(public) for _ in range(8)] if public is not None else []
        self._refill()
        self._request_all()  # warm: layouts and the parties' caches, as in a run's later rounds
        self._refill()

    def _refill(self) -> None:
        if self._cheap:
            self.parties.fill_pools(POOL * len(self.batch), self._cheap)

    def _request_all(self) -> int:
        """Every request of the batch over all clients; the bytes they moved (key set-up excluded)."""
        cohort = self.parties.plan.clients
        releases = [self.parties.coordinator.request(declaration, cohort=cohort, round=0)
                    for declaration, _ in self.batch]
        for release in releases:
            if release.refusals or release.dropouts:
                raise RuntimeError(f"{release.name}: {release.refusals or release.dropouts}")
        return sum(release.bytes for release in releases)


def _repeatable(declaration: StatisticDeclaration) -> StatisticDeclaration:
    """A once-per-run declaration as a per-round one, so that asv may request it again: the same
    encoding, protocol, recipients and bytes (a run sums it once)."""
    again = dataclasses.replace(declaration, per_round=True)
    assert again.spec(2) == declaration.spec(2) and again.reveal == declaration.reveal
    return again


class FedShiftPrior(_Statistics):
    """FedShift's prior P(y): the clients' label counts (C integers each) summed once before
    training, learned by the server and the clients."""

    def requests(self, clients: int) -> list[tuple[StatisticDeclaration, Inputs]]:
        from secure_fl.algorithms.fedshift import label_histogram_declaration

        rng = np.random.default_rng(7)
        per_client = SAMPLES // clients
        counts = {pid: rng.multinomial(per_client, np.full(NUM_CLASSES, 1 / NUM_CLASSES))
                  for pid in range(clients)}
        return [(_repeatable(label_histogram_declaration(NUM_CLASSES, per_client)), counts)]

    def time_prior(self, *args: Any) -> None:
        self._request_all()

    def track_prior_bytes(self, *args: Any) -> int:
        """Bytes of the prior's sum (key set-up excluded)."""
        return self._request_all()

    track_prior_bytes.unit = "bytes"  # type: ignore[attr-defined]


class ClimbAverages(_Statistics):
    """CLIMB's averages at a dual round: (Σ f_i, Σ λ_i) in one sum over the round's clients
    (f̄ for the dual step, λ̄ for the update weights)."""

    def requests(self, clients: int) -> list[tuple[StatisticDeclaration, Inputs]]:
        from secure_fl.algorithms.climb import ClimbParams, dual_declaration

        params = ClimbParams()
        rng = np.random.default_rng(11)
        pairs = {pid: np.array([rng.uniform(0.0, 3.0), rng.uniform(0.0, params.lambda_max)]) for pid in range(clients)}
        return [(dual_declaration(params), pairs)]

    def time_dual_round(self, *args: Any) -> None:
        self._request_all()

    def track_dual_round_bytes(self, *args: Any) -> int:
        """Bytes of the one sum of a dual round."""
        return self._request_all()

    track_dual_round_bytes.unit = "bytes"  # type: ignore[attr-defined]


class RatioLossTotal(_Statistics):
    """Ratio Loss's monitor total: Σ_j |D_j| over the round's clients (one integer each),
    learned by the server alone, every round."""

    def requests(self, clients: int) -> list[tuple[StatisticDeclaration, Inputs]]:
        from secure_fl.algorithms.ratio_monitor import monitor_total_declaration

        per_client = SAMPLES // clients
        counts = {pid: np.array([per_client], dtype=np.int64) for pid in range(clients)}
        return [(monitor_total_declaration(), counts)]

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
    """Dubhe through :class:`secure_fl.selection.DubheSelector` (the selection study's embedded
    form): every client's registry and coins and the server, the sums through an embedded
    Paillier :class:`protocols.SecureSum` (``keyholder="all"``) and its argmin session, the
    parties sharing only bytes on one :class:`protocols.LocalNetwork` (the selector's
    transcript). Skipped, with the reason, where :mod:`secure_fl.selection` does not offer it."""

    timeout = 1800.0
    rounds = 1
    repeat = (1, 5, 60.0)
    number = 1
    """One call per sample: ``setup`` (run before every sample) refills the Paillier pools."""
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
        refill()

    @staticmethod
    def _make(cache: Any, clients: int, tries: int) -> tuple[Any, ...]:
        try:
            from secure_fl.selection import DubheParams, DubheSelector
            from secure_fl.selection.base import dubhe_population
        except ImportError as error:
            h.skip(f"secure_fl.selection is not importable here ({error}): Dubhe is not measured")
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
        found = getattr(selector.backend, "session", None)
        if not isinstance(found, SecureSum):
            h.skip("DubheSelector has no embedded Paillier session here: Dubhe is not measured")
        session: SecureSum = found

        def refill() -> None:
            """Each client tops its pool up through its own session (cheap reused values)."""
            with mock.patch.object(raw, "obfuscator", lambda key, r=None, **_: next(cycle)):
                for pid in session.clients:
                    client = session.client_session(pid)
                    if isinstance(client, PaillierClientSession) and client.keys is not None:
                        missing = POOL - len(client.keys.pool)
                        if missing > 0:
                            client.fill_pool(missing)

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
        return int(transcript.total_bytes() - before)

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
        return int(transcript.total_bytes() - before)

    track_selection_bytes.unit = "bytes"  # type: ignore[attr-defined]
