"""The insecure baseline: clients send encoded vectors in the clear.

Same interface, wire format and transcript as the secure protocols, so that
cost comparisons and the leakage audit have a reference point.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import IntEnum

import numpy as np
import numpy.typing as npt

from .base import Outgoing, Party, Reveal, SecureSum, ServerParty, StageGate, stage_names
from .encoding import VectorSpec, decode_sum
from .errors import AbortedError
from .messages import EncodedUpload, ReleasedSum
from .transcript import Exposure
from .wire import SERVER, Envelope, PartyId

PROTOCOL = "plain"


class Stage(IntEnum):
    UPLOAD = 1
    RESULT = 2


class PlainClient(Party):
    def __init__(self, party_id: PartyId, *, run_id: bytes, spec: VectorSpec,
                 encoded: npt.NDArray[np.uint64] | None, clients: tuple[PartyId, ...]) -> None:
        super().__init__(party_id)
        self.run_id, self.spec, self.encoded, self.clients = run_id, spec, encoded, clients
        self.gate = StageGate(run_id, PROTOCOL, party_id)
        self.gate.open = {Stage.RESULT}

    def start(self) -> list[Outgoing]:
        if self.encoded is None:
            return []
        with self.timed("upload"):
            payload = EncodedUpload(self.encoded).to_bytes()
        env = Envelope(PROTOCOL, Stage.UPLOAD, self.run_id, self.party_id, SERVER, payload)
        return [Outgoing(env, Exposure.clear(self.party_id, self.spec.length))]

    def receive(self, env: Envelope) -> list[Outgoing]:
        self.gate.check(env, allowed_senders=[SERVER])
        released = ReleasedSum.from_bytes(env.payload, self.spec, parties=self.clients)
        self.gate.record(env)
        self.gate.open = set()
        self.result = decode_sum(self.spec, released.encoded_sum, contributors=len(released.contributors))
        return []


class PlainServer(ServerParty):
    def __init__(self, *, run_id: bytes, spec: VectorSpec, clients: tuple[PartyId, ...], reveal: Reveal) -> None:
        super().__init__()
        self.run_id, self.spec, self.clients, self.reveal = run_id, spec, clients, reveal
        self.gate = StageGate(run_id, PROTOCOL, SERVER)
        self.gate.open = {Stage.UPLOAD}
        self.uploads: dict[PartyId, npt.NDArray[np.uint64]] = {}

    def receive(self, env: Envelope) -> list[Outgoing]:
        self.gate.check(env, allowed_senders=self.clients)
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
            for pid in self.clients
        ]


class PlainSum(SecureSum):
    """Not secure: the server reads every input. The reference for cost and leakage."""

    name = PROTOCOL
    stage_names = stage_names(Stage)

    def _build(self, *, run_id: bytes, spec: VectorSpec, encoded: Mapping[PartyId, npt.NDArray[np.uint64]],
               reveal: Reveal, round: int) -> tuple[ServerParty, dict[PartyId, Party]]:
        server = PlainServer(run_id=run_id, spec=spec, clients=self.clients, reveal=reveal)
        clients: dict[PartyId, Party] = {
            pid: PlainClient(pid, run_id=run_id, spec=spec, encoded=encoded.get(pid), clients=self.clients)
            for pid in self.clients
        }
        return server, clients
