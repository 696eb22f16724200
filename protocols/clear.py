"""Raw float32 vectors added by the server: the insecure baseline for model updates.

No encoding, no quantisation, no protection — the server reads every input. It exists so that
a run's model updates cross the same network, parties and transcript whether or not they are
protected: ``update_protocol = "clear"`` costs ``4 · d`` bytes per client and adds the vectors
in float32, in ascending client order (so a run is bit-for-bit reproducible).
"""

from __future__ import annotations

from enum import IntEnum
from typing import Any

import numpy as np
import numpy.typing as npt

from .base import Outgoing, Party, Reveal, ServerParty, StageGate
from .errors import AbortedError, EncodingError, WireError
from .messages import read_contributors, write_contributors
from .session import ClientSession, ServerSession, SumRequest
from .transcript import Exposure
from .wire import SERVER, Envelope, PartyId, Reader, Writer

PROTOCOL = "clear"

Floats = npt.NDArray[np.float32]


class Stage(IntEnum):
    UPLOAD = 1
    RESULT = 2


def _write_floats(writer: Writer, values: Floats) -> Writer:
    little = values.astype("<f4", copy=False)
    return writer.u32(int(little.shape[0])).raw(little.tobytes())


def _read_floats(reader: Reader, length: int) -> Floats:
    count = reader.u32()
    if count != length:
        raise WireError(f"expected {length} floats, got {count}")
    values = np.frombuffer(reader.view(4 * count), dtype="<f4").astype(np.float32)
    if not np.all(np.isfinite(values)):
        raise WireError("non-finite float on the wire")
    return values


def _floats(values: npt.NDArray[Any] | None, length: int) -> Floats | None:
    if values is None:
        return None
    out = np.asarray(values, dtype=np.float32).reshape(-1)
    if out.shape != (length,):
        raise EncodingError(f"expected a vector of length {length}, got shape {out.shape}")
    if not np.all(np.isfinite(out)):
        raise EncodingError("vector holds NaN or infinity")
    return out


class ClearClient(Party):
    def __init__(self, party_id: PartyId, *, run_id: bytes, length: int, values: Floats | None,
                 clients: tuple[PartyId, ...], summands: int, reveal: Reveal) -> None:
        super().__init__(party_id)
        self.run_id, self.length, self.values, self.clients, self.summands = run_id, length, values, clients, summands
        self.gate = StageGate(run_id, PROTOCOL, party_id)
        self.gate.open = {Stage.RESULT} if reveal.clients else set()

    def start(self) -> list[Outgoing]:
        if self.values is None:
            return []
        with self.timed("upload"):
            payload = _write_floats(Writer(), self.values).finish()
        self.values = None
        self.done = not self.gate.open  # nothing comes back: the endpoint may forget the run (and its input)
        env = Envelope(PROTOCOL, Stage.UPLOAD, self.run_id, self.party_id, SERVER, payload)
        return [Outgoing(env, Exposure.clear(self.party_id, self.length))]

    def receive(self, env: Envelope) -> list[Outgoing]:
        self.gate.check(env, allowed_senders=[SERVER])
        reader = Reader(env.payload)
        contributors = read_contributors(reader, self.clients, self.summands)
        total = _read_floats(reader, self.length)
        reader.end()
        self.gate.record(env)
        self.gate.open = set()
        self.result, self.contributors = total.astype(np.float64), contributors
        return []


class ClearServer(ServerParty):
    def __init__(self, *, run_id: bytes, request: SumRequest, clients: tuple[PartyId, ...]) -> None:
        super().__init__(protocol=PROTOCOL, run_id=run_id, request=request, clients=clients,
                         audience=request.participants)
        assert request.spec is not None
        self.length, self.reveal = request.spec.length, request.reveal
        self.participants = request.participants
        self.gate = StageGate(run_id, PROTOCOL, SERVER)
        self.gate.open = {Stage.UPLOAD}
        self.uploads: dict[PartyId, Floats] = {}

    def receive(self, env: Envelope) -> list[Outgoing]:
        self.gate.check(env, allowed_senders=self.participants)
        reader = Reader(env.payload)
        values = _read_floats(reader, self.length)
        reader.end()
        self.gate.record(env)
        self.uploads[env.sender] = values
        return []

    def advance(self) -> list[Outgoing]:
        if not self.uploads:
            raise AbortedError("no client uploaded")
        self.gate.open = set()
        self.contributors = tuple(sorted(self.uploads))
        with self.timed("aggregate"):
            total = self.uploads[self.contributors[0]].copy()
            for pid in self.contributors[1:]:
                total += self.uploads[pid]
        self.result = total.astype(np.float64)
        self.finished = True
        if not self.reveal.clients:
            return []
        payload = _write_floats(write_contributors(Writer(), self.contributors, self.clients), total).finish()
        exposure = Exposure.aggregate(len(self.contributors), self.length)
        return [Outgoing(Envelope(PROTOCOL, Stage.RESULT, self.run_id, SERVER, pid, payload), exposure)
                for pid in self.contributors]


class ClearServerSession(ServerSession):
    """Not secure, not even encoded: raw float32 inputs, summed by the server."""

    name = PROTOCOL

    def open(self, *, run_id: bytes, request: SumRequest) -> ServerParty:
        return ClearServer(run_id=run_id, request=request, clients=self.clients)


class ClearClientSession(ClientSession):
    name = PROTOCOL

    def join(self, *, run_id: bytes, request: SumRequest, values: npt.NDArray[Any] | None) -> Party:
        if request.kind != "sum" or request.spec is None:
            raise WireError("the clear protocol has no set-up runs")
        spec = request.spec
        return ClearClient(self.party_id, run_id=run_id, length=spec.length, values=_floats(values, spec.length),
                           clients=self.clients, summands=spec.summands, reveal=request.reveal)


