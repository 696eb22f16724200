"""The parties of Dubhe's private argmin (:mod:`protocols.argmin`): ``store`` and ``argmin`` runs.

A ``store`` run: participants upload Enc(counts) (``try_upload``); the server checks each
ciphertext fully (range and unit: stored ciphertexts enter many products) and keeps them.
An ``argmin`` run: the server opens it at the agent together with ``try_aggregates`` (one
exchange); the agent decrypts the try sums, refuses any over fewer clients than its own floor,
scores them and answers ``argmin`` with one index.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from itertools import pairwise
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from .base import Outgoing, Party, ServerParty, StageGate
from .encoding import FloatArray, PackingLayout, decode_sum
from .errors import AbortedError, CiphertextError, EncodingError, ProtocolError, WireError
from .paillier_common import (
    PROTOCOL,
    ClientKeys,
    Stage,
    encrypted_upload,
    read_ciphertexts,
    read_digest,
    request_digest,
    write_ciphertexts,
)
from .primitives import paillier as raw
from .session import SumRequest
from .transcript import Exposure, Visibility
from .wire import SERVER, Envelope, PartyId, Reader, Writer

MAX_TRIES: Final = 1 << 16
"""Most tries one ``try_aggregates`` message may carry (all candidates together)."""

Tries = Sequence[Sequence[tuple[PartyId, ...]]]
"""``tries[g][h]``: the members of try h of candidate g."""


def score_groups(sums: Sequence[Sequence[npt.ArrayLike]]) -> FloatArray:
    """``‖mean_h p_{g,h} − p_u‖₁`` per candidate g; a try without samples makes its candidate +inf.

    ``sums[g][h]`` is the summed label counts of try h of candidate g. Shared by the agent and
    by in-the-clear simulations, so both decide identically.
    """
    scores = np.empty(len(sums), dtype=np.float64)
    for g, tries in enumerate(sums):
        if not tries:
            raise ValueError(f"candidate {g} has no tries")
        dists: list[FloatArray] = []
        for s in tries:
            vec = np.asarray(s, dtype=np.float64)
            total = float(vec.sum())
            if total <= 0:
                break
            dists.append(vec / total)
        if len(dists) < len(tries):
            scores[g] = np.inf
            continue
        mean = np.mean(np.stack(dists), axis=0)
        scores[g] = float(np.abs(mean - 1.0 / mean.size).sum())
    return scores


def argmin_index(scores: FloatArray) -> int:
    """The lowest index of the smallest score (0 when every score is +inf)."""
    if scores.size == 0:
        raise ValueError("no candidates")
    return int(np.argmin(scores))


# --- store runs ---------------------------------------------------------------------------------

class StoreClient(Party):
    """Uploads its encrypted counts once; nothing comes back."""

    def __init__(self, party_id: PartyId, *, run_id: bytes, request: SumRequest, layout: PackingLayout,
                 keys: ClientKeys, encoded: npt.NDArray[np.uint64] | None, clients: tuple[PartyId, ...]) -> None:
        super().__init__(party_id)
        assert request.spec is not None
        self.run_id, self.length, self.layout, self.keys, self.encoded = (
            run_id, request.spec.length, layout, keys, encoded)
        self.digest = request_digest(run_id, request, clients)
        self.gate = StageGate(run_id, PROTOCOL, party_id)

    def start(self) -> list[Outgoing]:
        self.done = True  # nothing comes back: the endpoint may forget the run at once
        if self.encoded is None:
            return []
        with self.timed("upload"):
            payload = encrypted_upload(self.keys, self.layout, self.encoded, self.digest)
        env = Envelope(PROTOCOL, Stage.TRY_UPLOAD, self.run_id, self.party_id, SERVER, payload)
        return [Outgoing(env, Exposure.ciphertext(self.length, self.party_id))]

    def receive(self, env: Envelope) -> list[Outgoing]:
        self.gate.check(env, allowed_senders=[SERVER])  # no stage is open: always refused
        return []


class StoreServer(ServerParty):
    """Collects the participants' ciphertexts; the caller keeps them (:attr:`uploads`)."""

    def __init__(self, *, run_id: bytes, request: SumRequest, clients: tuple[PartyId, ...],
                 public_key: raw.PublicKey, layout: PackingLayout) -> None:
        super().__init__(protocol=PROTOCOL, run_id=run_id, request=request, clients=clients,
                         audience=request.participants)
        self.public_key, self.layout, self.participants = public_key, layout, request.participants
        self.digest = request_digest(run_id, request, clients)
        self.gate = StageGate(run_id, PROTOCOL, SERVER)
        self.gate.open = {Stage.TRY_UPLOAD}
        self.uploads: dict[PartyId, list[Any]] = {}

    def receive(self, env: Envelope) -> list[Outgoing]:
        self.gate.check(env, allowed_senders=self.participants)
        reader = Reader(env.payload)
        read_digest(reader, self.digest)
        with self.timed("aggregate"):
            ciphertexts = read_ciphertexts(reader, self.public_key, self.layout.num_plaintexts)
        reader.end()
        self.gate.record(env)
        self.uploads[env.sender] = ciphertexts
        return []

    def advance(self) -> list[Outgoing]:
        self.contributors = tuple(sorted(self.uploads))
        self.gate.open = set()
        self.finished = True
        return []


# --- argmin runs --------------------------------------------------------------------------------

def _write_shape(writer: Writer, tries: Tries) -> Writer:
    writer.u32(len(tries))
    for group in tries:
        writer.u32(len(group))
        for members in group:
            writer.u32(len(members))
    return writer


def _read_shape(reader: Reader, *, floor: int, summands: int) -> list[list[int]]:
    num_groups = reader.u32()
    if not 1 <= num_groups <= MAX_TRIES:
        raise WireError(f"{num_groups} candidates is not a valid request")
    shape: list[list[int]] = []
    total = 0
    for _ in range(num_groups):
        tries = reader.u32()
        total += tries
        if tries < 1 or total > MAX_TRIES:
            raise WireError(f"each candidate needs at least one try, and at most {MAX_TRIES} tries in all")
        sizes = [reader.u32() for _ in range(tries)]
        if any(not floor <= k <= summands for k in sizes):
            raise WireError(f"a try must aggregate between {floor} and {summands} clients")
        shape.append(sizes)
    return shape


class ArgminAgent(Party):
    """Decrypts the try sums, scores them, and releases only the winning index."""

    def __init__(self, party_id: PartyId, *, run_id: bytes, request: SumRequest, layout: PackingLayout,
                 keys: ClientKeys, clients: tuple[PartyId, ...], min_contributors: int) -> None:
        super().__init__(party_id)
        assert request.spec is not None and keys.private_key is not None
        self.run_id, self.spec, self.layout, self.keys = run_id, request.spec, layout, keys
        self.min_contributors = max(1, min_contributors)
        self.digest = request_digest(run_id, request, clients)
        self.gate = StageGate(run_id, PROTOCOL, party_id)
        self.gate.open = {Stage.TRY_AGGREGATES}
        self.index: int | None = None

    def receive(self, env: Envelope) -> list[Outgoing]:
        self.gate.check(env, allowed_senders=[SERVER])
        reader = Reader(env.payload)
        read_digest(reader, self.digest)
        shape = _read_shape(reader, floor=self.min_contributors, summands=self.spec.summands)
        total = sum(len(sizes) for sizes in shape)
        ciphertexts = read_ciphertexts(reader, self.keys.public_key, total * self.layout.num_plaintexts)
        reader.end()
        with self.timed("decide"):
            sums = self._decrypt(shape, ciphertexts)
            index = argmin_index(score_groups(sums))
        self.gate.record(env)
        self.gate.open = set()
        self.index = index
        self.result = np.array([float(index)])  # what this party learned and released: the index
        smallest = min(min(sizes) for sizes in shape)
        payload = Writer().raw(self.digest).u32(index).finish()
        out = Envelope(PROTOCOL, Stage.ARGMIN, self.run_id, self.party_id, SERVER, payload)
        return [Outgoing(out, Exposure(Visibility.AGGREGATE, smallest, 1))]

    def _decrypt(self, shape: list[list[int]], ciphertexts: list[Any]) -> list[list[FloatArray]]:
        private = self.keys.private_key
        assert private is not None
        per_try = self.layout.num_plaintexts
        sums: list[list[FloatArray]] = []
        position = 0
        for sizes in shape:
            group: list[FloatArray] = []
            for k in sizes:
                chunk = ciphertexts[position : position + per_try]
                position += per_try
                try:
                    encoded = self.layout.unpack([private.decrypt(c) for c in chunk])
                    group.append(decode_sum(self.spec, encoded, contributors=k))
                except EncodingError as error:
                    raise CiphertextError("a try aggregate does not decrypt to a valid sum") from error
            sums.append(group)
        return sums


class ArgminServer(ServerParty):
    """Multiplies the stored ciphertexts of each try and asks the agent for the best candidate."""

    def __init__(self, *, run_id: bytes, request: SumRequest, clients: tuple[PartyId, ...],
                 public_key: raw.PublicKey, layout: PackingLayout, tries: Tries,
                 store: Mapping[PartyId, Sequence[Any]]) -> None:
        super().__init__(protocol=PROTOCOL, run_id=run_id, request=request, clients=clients,
                         audience=request.participants)
        assert request.spec is not None and len(request.participants) == 1
        for group in tries:
            for members in group:
                if not members or any(a >= b for a, b in pairwise(members)) or not set(members) <= set(store):
                    raise ValueError("each try names stored clients, ascending")
        self.agent = request.participants[0]
        self.spec, self.public_key, self.layout, self.tries, self.store = (
            request.spec, public_key, layout, tries, store)
        self.digest = request_digest(run_id, request, clients)
        self.gate = StageGate(run_id, PROTOCOL, SERVER)
        self.index: int | None = None
        self.refused_reasons: list[str] = []
        """Why the agent's answer was refused, or why it refused (for the abort's message)."""

    def start(self) -> list[Outgoing]:
        """The open and the try aggregates travel together: one exchange with the agent."""
        opens = super().start()
        body = _write_shape(Writer().raw(self.digest), self.tries)
        aggregates: list[Any] = []
        with self.timed("aggregate"):
            for group in self.tries:
                for members in group:
                    columns = zip(*(self.store[pid] for pid in members), strict=True)
                    # Re-randomised: each aggregate is a fresh-looking ciphertext of the try's sum,
                    # unlinkable to the stored uploads it multiplies (or to other tries' products).
                    aggregates.extend(raw.rerandomise(self.public_key, raw.product(self.public_key, list(column)))
                                      for column in columns)
            payload = write_ciphertexts(body, self.public_key, aggregates).finish()
        self.gate.open = {Stage.ARGMIN}
        smallest = min(len(members) for group in self.tries for members in group)
        total = sum(len(group) for group in self.tries)
        env = Envelope(PROTOCOL, Stage.TRY_AGGREGATES, self.run_id, SERVER, self.agent, payload)
        return [*opens, Outgoing(env, Exposure(Visibility.AGGREGATE, smallest, self.spec.length * total))]

    def receive(self, env: Envelope) -> list[Outgoing]:
        try:
            index = self._read_index(env)
        except ProtocolError as error:
            self.refused_reasons.append(f"{type(error).__name__}: {error}")
            raise
        self.gate.record(env)
        self.gate.open = set()
        self.index = index
        self.result = np.array([float(index)])
        self.finished = True
        return []

    def refused(self, party: PartyId, reason: str) -> None:
        self.refused_reasons.append(f"client {party} refused: {reason}")

    def _read_index(self, env: Envelope) -> int:
        self.gate.check(env, allowed_senders=[self.agent])
        reader = Reader(env.payload)
        read_digest(reader, self.digest)
        index = reader.u32()
        reader.end()
        if index >= len(self.tries):
            raise WireError(f"index {index} names no candidate (there are {len(self.tries)})")
        return index

    def advance(self) -> list[Outgoing]:
        why = f" ({'; '.join(self.refused_reasons)})" if self.refused_reasons else " (lost or refused)"
        raise AbortedError("the agent did not release an index" + why)
