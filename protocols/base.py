"""The shape every secure-sum protocol shares: parties as state machines over envelopes.

A party never does I/O. It consumes an :class:`~protocols.wire.Envelope` and returns the
:class:`Outgoing` messages it wants sent; it validates a message completely before changing
any state, so a rejected message (one typed :class:`~protocols.errors.ProtocolError`) leaves
the party as it was. A party holds only its own secrets and what it parsed from messages
addressed to it. The server party of a run opens it (stage ``open``, a
:class:`~protocols.session.SumRequest` to every client it needs) and has
:meth:`ServerParty.advance`, called when the current stage's deadline passes: it proceeds with
whoever answered, which is how dropouts enter. :func:`protocols.network.drive` plays the
server's side over a :class:`~protocols.network.Network`.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from enum import IntEnum
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from .encoding import FloatArray
from .errors import AbortedError, ReplayError, StageError
from .transcript import Exposure
from .wire import OPEN, SERVER, SHARED_STAGES, Envelope, PartyId

if TYPE_CHECKING:
    from .session import SumRequest


@dataclass(frozen=True)
class Outgoing:
    """A message a party wants sent, with what its receiver will be able to read of it."""

    envelope: Envelope
    exposure: Exposure


@dataclass(frozen=True, kw_only=True)
class Reveal:
    """Who learns a sum: the server, the clients, or both (a statistic's declaration decides)."""

    server: bool = True
    clients: bool = True

    def __post_init__(self) -> None:
        if not (self.server or self.clients):
            raise ValueError("a sum nobody learns is pointless: reveal to the server, the clients or both")


class StageGate:
    """Which stages a party accepts now, and who already answered each (replays refused)."""

    def __init__(self, run_id: bytes, protocol: str, party_id: PartyId) -> None:
        self.run_id = run_id
        self.protocol = protocol
        self.party_id = party_id
        self.open: set[int] = set()
        self._seen: set[tuple[int, PartyId]] = set()

    def check(self, env: Envelope, *, allowed_senders: Sequence[PartyId] | None = None) -> None:
        """Raise without recording anything; call :meth:`record` once the payload parsed."""
        if env.protocol != self.protocol:
            raise StageError(f"message for protocol {env.protocol!r}, this run is {self.protocol!r}")
        if env.run_id != self.run_id:
            raise StageError("message belongs to another protocol run")
        if env.receiver != self.party_id:
            raise StageError("message addressed to another party")
        if env.stage not in self.open:
            raise StageError(f"stage {env.stage} is not open at this party")
        if allowed_senders is not None and env.sender not in allowed_senders:
            raise StageError(f"party {env.sender} may not send stage {env.stage} here")
        if (env.stage, env.sender) in self._seen:
            raise ReplayError(f"party {env.sender} already sent stage {env.stage}")

    def record(self, env: Envelope) -> None:
        self._seen.add((env.stage, env.sender))

    def senders(self, stage: int) -> set[PartyId]:
        return {sender for s, sender in self._seen if s == stage}


class Party(ABC):
    """One protocol participant: a pure state machine over envelopes."""

    def __init__(self, party_id: PartyId) -> None:
        self.party_id = party_id
        self.timings: dict[str, float] = {}
        self.result: FloatArray | None = None
        self.contributors: tuple[PartyId, ...] = ()
        """Whose inputs :attr:`result` holds (set with it)."""
        self.done = False
        """The party's part of the run is over (set by parties that end without a result, e.g. a
        key set-up), so its endpoint can forget it and the secrets it held for the run."""

    @contextmanager
    def timed(self, label: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.timings[label] = self.timings.get(label, 0.0) + time.perf_counter() - start

    def start(self) -> list[Outgoing]:
        return []

    @abstractmethod
    def receive(self, env: Envelope) -> list[Outgoing]:
        """Validate completely, then update state; raise a ProtocolError and change nothing on bad input."""


class ServerParty(Party):
    """The aggregator's side of one run. :meth:`start` opens the run at its ``audience``."""

    def __init__(self, *, protocol: str, run_id: bytes, request: SumRequest, clients: Sequence[PartyId],
                 audience: Sequence[PartyId]) -> None:
        super().__init__(SERVER)
        self.protocol, self.run_id, self.request = protocol, run_id, request
        self.clients: tuple[PartyId, ...] = tuple(clients)
        self.audience: tuple[PartyId, ...] = tuple(sorted(set(audience)))
        unknown = set(self.audience) - set(self.clients)
        if unknown:
            raise ValueError(f"a run cannot open at parties outside the protocol: {sorted(unknown)}")
        self.finished = False
        self.rejections: list[str] = []
        """Inputs the server dropped after accepting them (e.g. found invalid when combined)."""
        self.excluded: dict[PartyId, str] = {}
        """Participants the server left out of the run on evidence against them, with the reason."""
        self.rejected_from: dict[PartyId, str] = {}
        """The last message the driver rejected (or the refusal it received) from each client."""
        self.flagged: dict[PartyId, str] = {}
        """Contributors the server caught sending something wrong that it could leave out while
        keeping their input (e.g. a wrong Shamir share at unmasking), with the evidence."""
        self.release_from: PartyId | None = None
        """The key holder whose release of the sum was accepted first (HE protocols)."""
        self._released: npt.NDArray[np.uint64] | None = None

    def accept_release(self, sender: PartyId, encoded_sum: npt.NDArray[np.uint64], result: FloatArray) -> bool:
        """Key holders asked to release one aggregate must agree: the first release sets the
        result (True); a later one equal to it changes nothing (False); a different one withdraws
        the result and aborts (:class:`AbortedError`: one of them lies)."""
        if self._released is not None:
            if not np.array_equal(self._released, encoded_sum):
                self.result, self.finished = None, False
                raise AbortedError(f"key holders {self.release_from} and {sender} released different sums "
                                   "of the same aggregate: one of them lies")
            return False
        self._released, self.release_from = encoded_sum, sender
        self.result, self.finished = result, True
        return True

    def start(self) -> list[Outgoing]:
        payload = self.request.to_bytes(clients=self.clients)
        return [Outgoing(Envelope(self.protocol, OPEN, self.run_id, SERVER, pid, payload), Exposure.public())
                for pid in self.audience]

    def refused(self, party: PartyId, reason: str) -> None:
        """A client declined this run (a ``refuse`` reply): by default, as if it had dropped out."""

    @abstractmethod
    def advance(self) -> list[Outgoing]:
        """The current stage's deadline passed: go on with whoever answered, or abort."""


@dataclass(frozen=True)
class Timings:
    client_upload_median: float
    aggregate: float
    finalize: float


@dataclass(frozen=True)
class SumOutcome:
    """The decoded sum and how it came about."""

    total: FloatArray
    contributors: tuple[PartyId, ...]
    dropped: tuple[PartyId, ...]
    learned_by: frozenset[PartyId]
    clipped: int
    run_id: str
    timings: Timings
    rejected: tuple[str, ...]
    excluded: Mapping[PartyId, str] = field(default_factory=dict)
    """Each participant left out of the sum (``dropped``), with why: the evidence the server
    had against it, the last message of it that was rejected, its refusal, or no answer."""
    flagged: Mapping[PartyId, str] = field(default_factory=dict)
    """Each contributor (its input is in ``total``) one of whose messages was left out, with why:
    a wrong share, a message that failed to verify, a replay in its name."""


def stage_names(stages: type[IntEnum]) -> dict[int, str]:
    """Stage number → name of a protocol, with the shared ``open`` and ``refuse``."""
    return {**SHARED_STAGES, **{int(s): s.name.lower() for s in stages}}
