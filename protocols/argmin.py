"""Private argmin over encrypted tentative selections (Dubhe §5.3), as runs over a network.

The server holds tentative client sets but must not learn a class distribution; an agent
client holds the secret key but must not learn who is in which set. Three stages, carried
under the ``paillier`` wire code (stages 8–10 of :class:`protocols.paillier.Stage`), in two
kinds of run (parties: :mod:`protocols.argmin_parties`):

1. a ``store`` run — ``try_upload`` (client → server): Enc(c_k), client k's vector of label
   counts, packed like any Paillier sum. The server checks each ciphertext (range and unit)
   and keeps it, keyed by client and key fingerprint, until :meth:`ArgminCoordinator.forget`.
2. an ``argmin`` run — ``try_aggregates`` (server → agent, with the run's open): for every
   candidate g and every try h of g, the product of the stored ciphertexts of the try's
   members, re-randomised (times a fresh encryption of 0), Enc(Σ_{k∈S_{g,h}} c_k), with the
   *number* of members but not their identities: the agent cannot link an aggregate to the
   uploads in it, or two tries to each other, by their ciphertexts;
3. ``argmin`` (agent → server): one index g* = argmin_g score_g, where
   ``score_g = ‖mean_h p_{g,h} − p_u‖₁`` with ``p_{g,h}`` the decrypted sum of try h normalised
   to a distribution and ``p_u`` uniform (:func:`score_groups`). Ties go to the lowest index.

Client determination asks with H candidates of one try each, so g* is Dubhe's
h* = argmin_h ‖p_{o,h} − p_u‖₁; the parameter search asks with one candidate per threshold
setting holding its H tries, which is the paper's ‖E_h(p_{o,h}) − p_u‖₁.

What each party learns: the server, ciphertexts and the index g*; the agent, the sums of the
tries (aggregates of at least its own floor, :attr:`PaillierOptions.min_contributors` — it
refuses smaller ones) and their sizes. A stored ciphertext is reused for every try its client
is in, which is sound because Paillier sums do not depend on the obfuscator and the agent sees
only sums; a caller may instead upload afresh before every argmin.

:class:`ArgminCoordinator` is the server's side (stored ciphertexts, the public key, runs
driven over any :class:`~protocols.network.Network`); :class:`ArgminSession` wraps it with
the in-process clients of a :class:`~protocols.embedded.SecureSum` for tests and studies.
"""

from __future__ import annotations

import dataclasses
import secrets
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from .argmin_parties import MAX_TRIES, ArgminServer, StoreServer, argmin_index, score_groups
from .base import Reveal, ServerParty
from .descriptors import descriptor
from .embedded import SecureSum
from .encoding import PackingLayout, VectorSpec, encode
from .errors import AbortedError, ProtocolError, StageError
from .identity import Authenticator
from .network import DropoutPlan, Network, RunContext, drive
from .paillier import PROTOCOL, PaillierClientSession, PaillierServerSession, Stage
from .session import SumRequest
from .wire import PartyId

__all__ = [
    "MAX_TRIES", "ArgminCoordinator", "ArgminOutcome", "ArgminSession", "Stage", "UploadOutcome",
    "argmin_index", "score_groups",
]


@dataclass(frozen=True)
class UploadOutcome:
    """Which clients' ciphertexts the server now holds, from the ``store`` runs of one upload."""

    contributors: tuple[PartyId, ...]
    dropped: tuple[PartyId, ...]
    run_ids: tuple[str, ...]
    """One ``store`` run per ``max_try_size`` participants (a request names at most that many)."""
    server_seconds: float
    rejected: tuple[str, ...]
    client_upload_median: float | None = None
    """Only an in-process harness can time the clients (:class:`ArgminSession`)."""


@dataclass(frozen=True)
class ArgminOutcome:
    """The index the agent released and what it took."""

    index: int
    agent: PartyId
    try_sizes: tuple[tuple[int, ...], ...]
    """Clients summed in each try of each candidate (members without a stored ciphertext are left out)."""
    missing: tuple[PartyId, ...]
    run_id: str
    server_seconds: float
    agent_seconds: float | None = None
    """Only an in-process harness can time the agent (:class:`ArgminSession`)."""


class ArgminCoordinator:
    """The server's side of the private argmin: stored ciphertexts and the runs that use them.

    Holds only server state — the Paillier server session (public key, who holds the private
    key) and the clients' ciphertexts — and drives ``store`` and ``argmin`` runs over
    ``network``. ``length`` is the number of classes, ``bound`` the public upper bound on one
    client's count of one class, ``max_try_size`` the largest try (it sizes the packing
    headroom); ``min_contributors`` is the smallest try this server asks for (each agent also
    applies its own floor).
    """

    def __init__(self, paillier: PaillierServerSession, network: Network, *, length: int, bound: int,
                 max_try_size: int, min_contributors: int = 2, authenticator: Authenticator | None = None) -> None:
        if paillier.opts.keyholder == "server":
            raise ValueError("the argmin needs a client-side key holder; keyholder='server' would let "
                             "the server read every distribution")
        if not 1 <= min_contributors <= max_try_size:
            raise ValueError("min_contributors must lie in [1, max_try_size]")
        self.paillier, self.network, self.authenticator = paillier, network, authenticator
        self.spec = VectorSpec(length=length, bound=bound, summands=max_try_size)
        self.min_contributors = min_contributors
        self._store: dict[tuple[PartyId, bytes], list[Any]] = {}

    @property
    def stored(self) -> frozenset[PartyId]:
        """Clients whose encrypted counts the server holds under the current key."""
        key = self.paillier.public_key
        if key is None:
            return frozenset()
        return frozenset(pid for pid, fingerprint in self._store if fingerprint == key.fingerprint)

    def ciphertexts(self, party: PartyId) -> tuple[Any, ...]:
        """The stored ciphertexts of ``party`` under the current key."""
        key = self.paillier.public_key
        found = None if key is None else self._store.get((party, key.fingerprint))
        if found is None:
            raise KeyError(f"no ciphertexts of client {party} under the current key")
        return tuple(found)

    def layout(self) -> PackingLayout:
        return self.paillier.layout(self.spec)

    def forget(self, clients: Sequence[PartyId] | None = None) -> None:
        """Drop stored ciphertexts (all, or those of ``clients``): their distributions changed."""
        drop = set(self.paillier.clients if clients is None else clients)
        self._store = {k: v for k, v in self._store.items() if k[0] not in drop}

    def _drive(self, party: ServerParty, run_id: bytes, *, statistic: str, round: int) -> list[str]:
        context = RunContext(PROTOCOL, run_id, round, statistic, descriptor(PROTOCOL).stages)
        return drive(party, self.network, context, authenticator=self.authenticator)

    def ensure_keys(self, *, round: int, statistic: str = "setup") -> None:
        """Run the Paillier key set-up over the network if it has not run yet."""
        run_id = secrets.token_bytes(16)
        party = self.paillier.setup(run_id=run_id, round=round, statistic=statistic)
        if party is not None:
            self._drive(party, run_id, statistic=statistic, round=round)

    def upload(self, participants: Sequence[PartyId], *, round: int, statistic: str = "try_counts") -> UploadOutcome:
        """Open ``store`` runs at ``participants``; each uploads its own encrypted counts."""
        uploaders = tuple(sorted(set(participants)))
        unknown = set(uploaders) - set(self.paillier.clients)
        if unknown:
            raise ValueError(f"inputs from parties outside this protocol: {sorted(unknown)}")
        if not uploaders:
            raise ValueError("nothing to upload")
        self.ensure_keys(round=round)
        key = self.paillier.public_key
        assert key is not None
        layout, size = self.layout(), self.spec.summands
        contributors: list[PartyId] = []
        run_ids: list[str] = []
        rejected: list[str] = []
        seconds = 0.0
        for start in range(0, len(uploaders), size):
            run_id = secrets.token_bytes(16)
            request = SumRequest(kind="store", statistic=statistic, round=round, spec=self.spec,
                                 reveal=Reveal(server=True, clients=False),
                                 participants=uploaders[start : start + size], session=self.paillier.tag)
            server = StoreServer(run_id=run_id, request=request, clients=self.paillier.clients, public_key=key,
                                 layout=layout)
            rejected += self._drive(server, run_id, statistic=statistic, round=round)
            for pid, ciphertexts in server.uploads.items():
                self._store[(pid, key.fingerprint)] = ciphertexts
            contributors += server.contributors
            run_ids.append(run_id.hex())
            seconds += server.timings.get("aggregate", 0.0)
        return UploadOutcome(contributors=tuple(contributors),
                             dropped=tuple(sorted(set(uploaders) - set(contributors))), run_ids=tuple(run_ids),
                             server_seconds=seconds, rejected=tuple(rejected))

    def _tries(self, candidates: Sequence[Sequence[Sequence[PartyId]]]) -> tuple[list[list[tuple[PartyId, ...]]],
                                                                                  set[PartyId]]:
        stored = self.stored
        missing: set[PartyId] = set()
        tries: list[list[tuple[PartyId, ...]]] = []
        for g, group in enumerate(candidates):
            if not group:
                raise ValueError(f"candidate {g} has no tries")
            kept_group: list[tuple[PartyId, ...]] = []
            for given in group:
                members = sorted({int(pid) for pid in given})
                kept = tuple(pid for pid in members if pid in stored)
                missing.update(set(members) - set(kept))
                if not self.min_contributors <= len(kept) <= self.spec.summands:
                    raise AbortedError(
                        f"a try of candidate {g} holds {len(kept)} clients with stored ciphertexts; "
                        f"the agent decrypts only tries of {self.min_contributors}..{self.spec.summands}"
                    )
                kept_group.append(kept)
            tries.append(kept_group)
        if sum(len(group) for group in tries) > MAX_TRIES:
            raise ValueError(f"more than {MAX_TRIES} tries in one request")
        return tries, missing

    def _agent(self, agent: PartyId | None) -> PartyId:
        holders = self.paillier.holders
        if agent is None:
            chosen = self.paillier.agent if self.paillier.opts.keyholder == "agent" else None
            agent = chosen if chosen is not None else secrets.choice(sorted(holders))
        if agent not in self.paillier.clients:
            raise ValueError(f"agent {agent} is not a client of this session")
        if agent not in holders:
            raise ValueError(f"client {agent} holds no secret key and cannot act as the agent")
        return agent

    def argmin(self, candidates: Sequence[Sequence[Sequence[PartyId]]], *, round: int,
               statistic: str = "try_argmin", agent: PartyId | None = None) -> ArgminOutcome:
        """The index of the best candidate; ``candidates[g][h]`` are the members of try h of g.

        Members without a stored ciphertext are left out of their try's sum (and listed in
        :attr:`ArgminOutcome.missing`); a try left with fewer than ``min_contributors``
        members raises :class:`~protocols.errors.AbortedError` before anything is sent.
        The agent is the key holder under ``keyholder="agent"``, else drawn with :mod:`secrets`
        among the clients that confirmed the key, unless given.
        """
        key = self.paillier.public_key
        if key is None or not self.stored:
            raise StageError("no stored ciphertexts under the current key: upload first")
        if not candidates:
            raise ValueError("no candidates")
        tries, missing = self._tries(candidates)
        agent = self._agent(agent)
        run_id = secrets.token_bytes(16)
        request = SumRequest(kind="argmin", statistic=statistic, round=round, spec=self.spec,
                             reveal=Reveal(server=True, clients=False), participants=(agent,),
                             session=self.paillier.tag)
        store = {pid: ciphertexts for (pid, fingerprint), ciphertexts in self._store.items()
                 if fingerprint == key.fingerprint}
        server = ArgminServer(run_id=run_id, request=request, clients=self.paillier.clients, public_key=key,
                              layout=self.layout(), tries=tries, store=store)
        rejected = self._drive(server, run_id, statistic=statistic, round=round)
        if server.index is None:
            raise AbortedError("the run finished without an index: " + "; ".join(rejected))
        if rejected:
            raise ProtocolError("messages were rejected during the argmin: " + "; ".join(rejected))
        return ArgminOutcome(index=server.index, agent=agent,
                             try_sizes=tuple(tuple(len(m) for m in group) for group in tries),
                             missing=tuple(sorted(missing)), run_id=run_id.hex(),
                             server_seconds=server.timings.get("aggregate", 0.0))


class ArgminSession:
    """:class:`ArgminCoordinator` with the in-process clients of an embedded Paillier
    :class:`~protocols.embedded.SecureSum`: the harness hands each client its counts and sets
    each client's own argmin floor to ``min_contributors``, standing in for their configuration.
    Same transcript as the sums (one network)."""

    def __init__(self, paillier: SecureSum, *, length: int, bound: int, max_try_size: int,
                 min_contributors: int = 2) -> None:
        server = paillier.server
        if not isinstance(server, PaillierServerSession):
            raise TypeError(f"the argmin runs on a paillier session, not {paillier.name!r}")
        self.paillier = paillier
        self.server = ArgminCoordinator(server, paillier.network, length=length, bound=bound,
                                        max_try_size=max_try_size, min_contributors=min_contributors,
                                        authenticator=paillier.authenticator)
        self.spec = self.server.spec
        self.min_contributors = min_contributors
        for session in paillier.sessions.values():
            assert isinstance(session, PaillierClientSession)
            session.min_contributors = min_contributors

    @property
    def stored(self) -> frozenset[PartyId]:
        return self.server.stored

    def layout(self) -> PackingLayout:
        return self.server.layout()

    def forget(self, clients: Sequence[PartyId] | None = None) -> None:
        self.server.forget(clients)

    def _planned(self, dropouts: DropoutPlan | None) -> None:
        self.paillier.network.plan(PROTOCOL, dropouts, descriptor(PROTOCOL).stages)

    def upload(self, inputs: Mapping[PartyId, npt.ArrayLike], *, round: int, statistic: str = "try_counts",
               dropouts: DropoutPlan | None = None) -> UploadOutcome:
        """Each client in ``inputs`` encrypts its counts to the server, which keeps them."""
        unknown = set(inputs) - set(self.paillier.clients)
        if unknown:
            raise ValueError(f"inputs from parties outside this protocol: {sorted(unknown)}")
        encoded = {pid: encode(self.spec, np.asarray(vec)).values for pid, vec in inputs.items()}
        if not self.paillier.ready:
            self.paillier.setup(round=round)
        self._planned(dropouts)
        try:
            with self.paillier.inputs(encoded):
                outcome = self.server.upload(sorted(encoded), round=round, statistic=statistic)
        finally:
            self._planned(None)
        parties = self.paillier.parties()
        times = [parties[pid].timings["upload"] for pid in outcome.contributors
                 if pid in parties and "upload" in parties[pid].timings]
        return dataclasses.replace(outcome, client_upload_median=statistics.median(times) if times else 0.0)

    def argmin(self, candidates: Sequence[Sequence[Sequence[PartyId]]], *, round: int,
               statistic: str = "try_argmin", agent: PartyId | None = None,
               dropouts: DropoutPlan | None = None) -> ArgminOutcome:
        """:meth:`ArgminCoordinator.argmin`, with the agent's time read from its party."""
        self._planned(dropouts)
        try:
            outcome = self.server.argmin(candidates, round=round, statistic=statistic, agent=agent)
        finally:
            self._planned(None)
        party = self.paillier.parties().get(outcome.agent)
        seconds = party.timings.get("decide", 0.0) if party is not None else None
        return dataclasses.replace(outcome, agent_seconds=seconds)
