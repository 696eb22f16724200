"""The parties of one packed Paillier sum (a ``SumRequest`` of kind ``sum``).

Participants upload Enc(packed input) (``upload``); the server multiplies the ciphertexts and
sends the product (``aggregate``) to the contributors that hold the key — the agent, which
need not be a participant, under ``keyholder="agent"``; every contributing key holder under
``"all"`` — or decrypts it itself under ``"server"``. When the server is to learn the sum,
one key holder releases it (``result``), and the server relays it to the contributors that
could not decrypt. Every upload, aggregate and result carries the digest of the request its
sender parsed, so parties that disagree about the run refuse each other's messages.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from .base import Outgoing, Party, ServerParty, StageGate
from .encoding import PackingLayout, VectorSpec, decode_sum
from .errors import AbortedError, CiphertextError, EncodingError, PolicyError, StageError, WireError
from .messages import ReleasedSum, read_contributors, write_contributors
from .paillier_common import (
    DIGEST_BYTES,
    PROTOCOL,
    ClientKeys,
    Keyholder,
    Stage,
    encrypted_upload,
    read_ciphertexts,
    read_digest,
    request_digest,
    write_ciphertexts,
)
from .primitives import paillier as raw
from .session import SumRequest
from .transcript import Exposure
from .wire import SERVER, Envelope, PartyId, Reader, Writer


def _released(digest: bytes, contributors: tuple[PartyId, ...], encoded_sum: npt.NDArray[np.uint64],
              clients: Sequence[PartyId]) -> bytes:
    return digest + ReleasedSum(contributors, encoded_sum).to_bytes(parties=clients)


def _read_released(payload: bytes, digest: bytes, spec: VectorSpec, clients: Sequence[PartyId]) -> ReleasedSum:
    if len(payload) < DIGEST_BYTES:
        raise WireError("released sum truncated")
    read_digest(Reader(payload[:DIGEST_BYTES]), digest)
    return ReleasedSum.from_bytes(payload[DIGEST_BYTES:], spec, parties=clients)


def _decode(spec: VectorSpec, encoded_sum: npt.NDArray[np.uint64], contributors: int) -> npt.NDArray[np.float64]:
    try:
        return decode_sum(spec, encoded_sum, contributors=contributors)
    except EncodingError as error:
        raise WireError(f"released sum is impossible: {error}") from error


RELEASERS = 2
"""Key holders asked to release a sum to the server under ``keyholder="all"``."""


class PaillierClient(Party):
    """A participant (uploads) or the agent (decrypts); it decrypts exactly when its session holds the key."""

    def __init__(self, party_id: PartyId, *, run_id: bytes, request: SumRequest, layout: PackingLayout,
                 keys: ClientKeys, encoded: npt.NDArray[np.uint64] | None, clients: tuple[PartyId, ...],
                 server_holds_key: bool = False, agent: bool = False) -> None:
        super().__init__(party_id)
        assert request.spec is not None
        self.run_id, self.request, self.spec, self.layout, self.keys = run_id, request, request.spec, layout, keys
        self.encoded, self.clients, self.server_holds_key = encoded, clients, server_holds_key
        self.agent = agent
        """The key holder of ``keyholder="agent"``: it decrypts every sum, its own input in it or not."""
        self.digest = request_digest(run_id, request, clients)
        self.gate = StageGate(run_id, PROTOCOL, party_id)
        self.gate.open = {Stage.AGGREGATE} if keys.private_key is not None else (
            {Stage.RESULT} if request.reveal.clients else set())

    def start(self) -> list[Outgoing]:
        self.done = not self.gate.open  # nothing comes back: the endpoint may forget the run at once
        if self.encoded is None:
            return []
        with self.timed("upload"):
            payload = encrypted_upload(self.keys, self.layout, self.encoded, self.digest)
        env = Envelope(PROTOCOL, Stage.UPLOAD, self.run_id, self.party_id, SERVER, payload)
        # Under keyholder="server" the server decrypts what it receives: the transcript says so.
        exposure = (Exposure.clear(self.party_id, self.spec.length) if self.server_holds_key
                    else Exposure.ciphertext(self.spec.length, self.party_id))
        return [Outgoing(env, exposure)]

    def _check_contributors(self, contributors: tuple[PartyId, ...]) -> None:
        if not set(contributors) <= set(self.request.participants):
            raise WireError("a sum over parties that were not asked to contribute")
        if self.encoded is not None and not self.agent and self.party_id not in contributors:
            raise WireError("a sum sent to an uploader that leaves its input out")

    def receive(self, env: Envelope) -> list[Outgoing]:
        self.gate.check(env, allowed_senders=[SERVER])
        if env.stage == Stage.RESULT:
            released = _read_released(env.payload, self.digest, self.spec, self.clients)
            self._check_contributors(released.contributors)
            result = _decode(self.spec, released.encoded_sum, len(released.contributors))
            self.gate.record(env)
            self.gate.open = set()
            self.result, self.contributors = result, released.contributors
            return []
        reader = Reader(env.payload)
        read_digest(reader, self.digest)
        release = reader.u8()
        if release not in (0, 1):
            raise WireError("bad release flag")
        if release and not self.request.reveal.server:
            raise PolicyError("the server asked for the release of a sum declared for the clients only")
        contributors = read_contributors(reader, self.clients, self.spec.summands)
        self._check_contributors(contributors)
        ciphertexts = read_ciphertexts(reader, self.keys.public_key, self.layout.num_plaintexts)
        reader.end()
        with self.timed("finalize"):
            encoded_sum = self._decrypt(ciphertexts)
            try:
                result = decode_sum(self.spec, encoded_sum, contributors=len(contributors))
            except EncodingError as error:
                raise CiphertextError("aggregate does not decrypt to a valid sum") from error
        self.gate.record(env)
        self.gate.open = set()
        self.result, self.contributors = result, contributors
        if not release:
            return []
        payload = _released(self.digest, contributors, encoded_sum, self.clients)
        out = Envelope(PROTOCOL, Stage.RESULT, self.run_id, self.party_id, SERVER, payload)
        return [Outgoing(out, Exposure.aggregate(len(contributors), self.spec.length))]

    def _decrypt(self, ciphertexts: list[Any]) -> npt.NDArray[np.uint64]:
        private = self.keys.private_key
        assert private is not None
        try:
            return self.layout.unpack([private.decrypt(c) for c in ciphertexts])
        except EncodingError as error:
            raise CiphertextError("aggregate does not decrypt to a valid packed sum") from error


class PaillierServer(ServerParty):
    """Multiplies uploads; sends the product to the key holders among the contributors (or decrypts
    it under ``keyholder="server"``); relays a released sum to the contributors that need it."""

    def __init__(self, *, run_id: bytes, request: SumRequest, clients: tuple[PartyId, ...], mode: Keyholder,
                 public_key: raw.PublicKey, agent: PartyId, holders: frozenset[PartyId],
                 private_key: raw.PrivateKey | None = None) -> None:
        audience = sorted(set(request.participants) | ({agent} if mode == "agent" else set()))
        super().__init__(protocol=PROTOCOL, run_id=run_id, request=request, clients=clients, audience=audience)
        assert request.spec is not None
        if (mode == "server") != (private_key is not None):
            raise ValueError("the server holds the private key exactly under keyholder='server'")
        self.spec, self.reveal, self.participants = request.spec, request.reveal, request.participants
        self.mode, self.public_key, self.agent, self.holders = mode, public_key, agent, holders
        self._private_key = private_key
        self.layout = PackingLayout.for_spec(self.spec, capacity_bits=public_key.plaintext_capacity_bits)
        self.digest = request_digest(run_id, request, clients)
        self.gate = StageGate(run_id, PROTOCOL, SERVER)
        self.uploads: dict[PartyId, list[Any]] = {}
        self.decryptors: tuple[PartyId, ...] = ()
        self.releasers: tuple[PartyId, ...] = ()
        """Key holders asked to release the sum to the server: up to :data:`RELEASERS` under
        ``keyholder="all"``, so one that fails to decrypt or drops out costs nothing; their
        releases must agree exactly."""
        self.stage = Stage.UPLOAD
        self._late_open: list[Outgoing] = []

    def start(self) -> list[Outgoing]:
        """Open at the participants; an agent that does not contribute gets its open with the aggregate."""
        opens = super().start()
        self._late_open = [o for o in opens if o.envelope.receiver not in self.participants]
        self.gate.open = {Stage.UPLOAD}
        return [o for o in opens if o.envelope.receiver in self.participants]

    def receive(self, env: Envelope) -> list[Outgoing]:
        if env.stage == Stage.UPLOAD:
            self.gate.check(env, allowed_senders=self.participants)
            reader = Reader(env.payload)
            read_digest(reader, self.digest)
            with self.timed("aggregate"):
                ciphertexts = read_ciphertexts(reader, self.public_key, self.layout.num_plaintexts,
                                               unit_check=False)
            reader.end()
            self.gate.record(env)
            self.uploads[env.sender] = ciphertexts
            return []
        self.gate.check(env, allowed_senders=self.releasers)
        released = _read_released(env.payload, self.digest, self.spec, self.clients)
        if released.contributors != self.contributors:
            raise StageError("the key holder released a sum over other contributors than were aggregated")
        result = _decode(self.spec, released.encoded_sum, len(released.contributors))
        self.gate.record(env)
        if not self.accept_release(env.sender, released.encoded_sum, result):
            return []
        return self._relay(released.encoded_sum)

    def advance(self) -> list[Outgoing]:
        if self.stage != Stage.UPLOAD:
            reasons = "; ".join(f"client {pid}: {self.rejected_from.get(pid, 'no answer')}" for pid in self.releasers)
            raise AbortedError(f"no key holder released the sum ({reasons})")
        self.stage = Stage.AGGREGATE
        self.gate.open = set()
        with self.timed("aggregate"):
            aggregate = self._aggregate()
        if self._private_key is not None:
            return self._decrypt(aggregate)
        if self.mode == "agent":
            self.decryptors = (self.agent,)
        else:
            self.decryptors = tuple(c for c in self.contributors if c in self.holders)
            if not self.decryptors:
                raise AbortedError("no contributor holds the key")
        if self.reveal.server:
            self.releasers = self.decryptors[:RELEASERS]
            self.gate.open = {Stage.RESULT}
        else:
            self.finished = True
        body = write_ciphertexts(write_contributors(Writer(), self.contributors, self.clients),
                                 self.public_key, aggregate).finish()
        exposure = Exposure.aggregate(len(self.contributors), self.spec.length)
        out = [o for o in self._late_open if o.envelope.receiver in self.decryptors]
        for pid in self.decryptors:
            payload = self.digest + bytes([pid in self.releasers]) + body
            out.append(Outgoing(Envelope(PROTOCOL, Stage.AGGREGATE, self.run_id, SERVER, pid, payload), exposure))
        return out

    def _decrypt(self, aggregate: list[Any]) -> list[Outgoing]:
        private = self._private_key
        assert private is not None
        with self.timed("finalize"):
            try:
                encoded_sum = self.layout.unpack([private.decrypt(c) for c in aggregate])
                self.result = decode_sum(self.spec, encoded_sum, contributors=len(self.contributors))
            except EncodingError as error:
                raise AbortedError(f"the aggregate does not decrypt to a valid sum: {error}") from error
        self.finished = True
        return self._relay(encoded_sum)

    def _aggregate(self) -> list[Any]:
        """Multiply the uploads slot-wise; if the product is not a unit, drop the uploads that are not."""
        if not self.uploads:
            raise AbortedError("no client uploaded")
        columns = list(zip(*self.uploads.values(), strict=True))
        try:
            aggregate = [raw.product(self.public_key, list(column)) for column in columns]
        except CiphertextError:
            for pid, ciphertexts in list(self.uploads.items()):
                try:
                    for c in ciphertexts:
                        raw.check_ciphertext(self.public_key, c)
                except CiphertextError as error:
                    self.rejections.append(f"CiphertextError: upload of client {pid}: {error}")
                    del self.uploads[pid]
            return self._aggregate()
        self.contributors = tuple(sorted(self.uploads))
        return aggregate

    def _relay(self, encoded_sum: npt.NDArray[np.uint64]) -> list[Outgoing]:
        """The sum to the contributors that did not decrypt it themselves (if clients may learn it)."""
        if not self.reveal.clients:
            return []
        payload = _released(self.digest, self.contributors, encoded_sum, self.clients)
        exposure = Exposure.aggregate(len(self.contributors), self.spec.length)
        return [Outgoing(Envelope(PROTOCOL, Stage.RESULT, self.run_id, SERVER, pid, payload), exposure)
                for pid in self.contributors if pid not in self.decryptors]
