"""The insecure baseline: clients send encoded vectors in the clear.

Same interface, wire format and transcript as the secure protocols, so that cost comparisons
and the leakage audit have a reference point. The server releases the sum to the run's
participants when the clients are to learn it.
"""

from __future__ import annotations

from enum import IntEnum
from typing import Any

import numpy as np
import numpy.typing as npt

from .base import Outgoing, Party, Reveal, ServerParty, StageGate
from .encoding import VectorSpec, decode_sum
from .errors import AbortedError, EncodingError, WireError
from .messages import EncodedUpload, ReleasedSum
from .session import ClientSession, ServerSession, SumRequest, as_encoded
from .transcript import Exposure
from .wire import SERVER, Envelope, PartyId

PROTOCOL = "plain"


class Stage(IntEnum):
    UPLOAD = 1
    RESULT = 2


class PlainClient(Party):
    def __init__(self, party_id: PartyId, *, run_id: bytes, spec: VectorSpec,
                 encoded: npt.NDArray[np.uint64] | None, clients: tuple[PartyId, ...], reveal: Reveal) -> None:
        super().__init__(party_id)
        self.run_id, self.spec, self.encoded, self.clients = run_id, spec, encoded, clients
        self.gate = StageGate(run_id, PROTOCOL, party_id)
        self.gate.open = {Stage.RESULT} if reveal.clients else set()

    def start(self) -> list[Outgoing]:
        if self.encoded is None:
            return []
        with self.timed("upload"):
            payload = EncodedUpload(self.encoded).to_bytes()
        self.encoded = None
        self.done = not self.gate.open  # nothing comes back: the endpoint may forget the run (and its input)
        env = Envelope(PROTOCOL, Stage.UPLOAD, self.run_id, self.party_id, SERVER, payload)
        return [Outgoing(env, Exposure.clear(self.party_id, self.spec.length))]

    def receive(self, env: Envelope) -> list[Outgoing]:
        self.gate.check(env, allowed_senders=[SERVER])
        released = ReleasedSum.from_bytes(env.payload, self.spec, parties=self.clients)
        try:
            result = decode_sum(self.spec, released.encoded_sum, contributors=len(released.contributors))
        except EncodingError as error:
            raise WireError(f"released sum is impossible: {error}") from error
        self.gate.record(env)
        self.gate.open = set()
        self.result, self.contributors = result, released.contributors
        return []


class PlainServer(ServerParty):
    def __init__(self, *, run_id: bytes, request: SumRequest, clients: tuple[PartyId, ...]) -> None:
        super().__init__(protocol=PROTOCOL, run_id=run_id, request=request, clients=clients,
                         audience=request.participants)
        assert request.spec is not None
        self.spec, self.reveal = request.spec, request.reveal
        self.participants = request.participants
        self.gate = StageGate(run_id, PROTOCOL, SERVER)
        self.gate.open = {Stage.UPLOAD}
        self.uploads: dict[PartyId, npt.NDArray[np.uint64]] = {}

    def receive(self, env: Envelope) -> list[Outgoing]:
        self.gate.check(env, allowed_senders=self.participants)
        upload = EncodedUpload.from_bytes(env.payload, self.spec)
        self.gate.record(env)
        self.uploads[env.sender] = upload.values
        return []

    def advance(self) -> list[Outgoing]:
        if not self.uploads:
            raise AbortedError("no client uploaded")
        self.gate.open = set()
        with self.timed("aggregate"):
            total = np.zeros(self.spec.length, dtype=np.uint64)
            for values in self.uploads.values():
                total += values
        self.contributors = tuple(sorted(self.uploads))
        self.result = decode_sum(self.spec, total, contributors=len(self.contributors))
        self.finished = True
        if not self.reveal.clients:
            return []
        payload = ReleasedSum(self.contributors, total).to_bytes(parties=self.clients)
        exposure = Exposure.aggregate(len(self.contributors), self.spec.length)
        return [
            Outgoing(Envelope(PROTOCOL, Stage.RESULT, self.run_id, SERVER, pid, payload), exposure)
            for pid in self.contributors
        ]


class PlainServerSession(ServerSession):
    """Not secure: the server reads every input. The reference for cost and leakage."""

    name = PROTOCOL

    def open(self, *, run_id: bytes, request: SumRequest) -> ServerParty:
        return PlainServer(run_id=run_id, request=request, clients=self.clients)


class PlainClientSession(ClientSession):
    name = PROTOCOL

    def join(self, *, run_id: bytes, request: SumRequest, values: npt.NDArray[Any] | None) -> Party:
        if request.kind != "sum" or request.spec is None:
            raise WireError("the plain protocol has no set-up runs")
        return PlainClient(self.party_id, run_id=run_id, spec=request.spec,
                           encoded=as_encoded(values, request.spec), clients=self.clients, reveal=request.reveal)
