"""Fault injection for the embedded network: one misbehaving party, named by kind.

Used by ``secure-fl sum --tamper KIND:PARTY``, the tamper and fuzz tests. Each kind is what an
attacker on that party's side (or, for ``equivocate``, the server) could do to one run:

``upload``
    flips a bit in the party's input message (its masked vector or ciphertexts) on its way
    to the server.
``share``
    (masking) changes one of the Shamir shares the party reveals at unmasking. The party
    itself is the attacker here: given its identity (:meth:`TamperingNetwork.sign_as`), the
    wrong share is signed with the party's own key, so only the share check can catch it.
``replay``
    sends the party's input message a second time.
``forge``
    replaces the party's input message by another client's, relabelled as the party's.
``equivocate``
    (masking) the server tells part of the party's share holders that it dropped and the rest
    that it survived, to collect both of its secrets (:class:`EquivocatingServer`).

The outcome of a tampered run is exact over the honest survivors, or one typed
:class:`~protocols.errors.ProtocolError`; without authentication (and, for ``equivocate``,
without the active-server setting) some kinds go through undetected, which is what the
threat model's table records.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal

from .base import Outgoing
from .errors import ProtocolError
from .identity import Authenticator, Identity
from .masking import MaskingServer
from .network import LocalNetwork, Message, Replies
from .transcript import Transcript
from .wire import SERVER, Envelope, PartyId

__all__ = ["KINDS", "EquivocatingServer", "Tamper", "TamperingNetwork", "applies", "equivocate"]

Kind = Literal["share", "upload", "replay", "forge", "equivocate"]
KINDS: Final[tuple[Kind, ...]] = ("share", "upload", "replay", "forge", "equivocate")
_MASKING_ONLY: Final = frozenset({"share", "equivocate"})


@dataclass(frozen=True)
class Tamper:
    """One fault: its kind and the party it concerns."""

    kind: Kind
    party: PartyId

    @classmethod
    def parse(cls, text: str) -> Tamper:
        """``KIND:PARTY``, e.g. ``upload:3``; a ``ValueError`` for anything else."""
        kind, sep, party = text.partition(":")
        if not sep or kind not in KINDS or not party.isdigit():
            raise ValueError(f"--tamper takes KIND:PARTY with KIND one of {', '.join(KINDS)}, got {text!r}")
        return cls(kind, int(party))

    def __str__(self) -> str:
        return f"{self.kind}:{self.party}"


def applies(tamper: Tamper, family: str) -> bool:
    """Whether the kind means anything for a protocol of this family (shares and equivocation
    about dropouts exist only in masking)."""
    return tamper.kind not in _MASKING_ONLY or family == "masking"


def _flip(data: bytes, position: int) -> bytes:
    out = bytearray(data)
    out[position] ^= 0x01
    return bytes(out)


class TamperingNetwork(LocalNetwork):
    """A :class:`LocalNetwork` that applies one :class:`Tamper` to the messages of runs of
    ``protocol`` whose stage is one of ``input_stages`` (the party's input) or, for ``share``,
    masking's unmasking response."""

    def __init__(self, tamper: Tamper, *, input_stages: Sequence[str] = ("upload",),
                 transcript: Transcript | None = None) -> None:
        super().__init__(transcript)
        self.tamper = tamper
        self.input_stages = frozenset(input_stages)
        self.applied = 0
        """How many messages were tampered with."""
        self._signer: Identity | None = None

    def sign_as(self, identity: Identity) -> None:
        """Sign the party's altered messages with its own key (a malicious party, not the wire)."""
        if identity.party != self.tamper.party:
            raise ValueError("the tampering network signs only as the tampering party")
        self._signer = identity

    def _is_input(self, message: Message) -> bool:
        return message.label.stage in self.input_stages

    def exchange(self, outbox: Mapping[PartyId, Sequence[Message]]) -> Replies:
        replies = super().exchange(outbox)
        kind, party = self.tamper.kind, self.tamper.party
        mine = replies.messages.get(party, [])
        if kind == "upload":
            replies.messages[party] = [self._flip_input(m) for m in mine]
        elif kind == "share":
            replies.messages[party] = [self._bad_share(m) for m in mine]
        elif kind == "replay":
            extra = [m for m in mine if self._is_input(m)]
            self.applied += len(extra)
            replies.messages[party] = [*mine, *extra]
        elif kind == "forge":
            donor = next((m for pid, ms in sorted(replies.messages.items()) if pid != party
                          for m in ms if self._is_input(m)), None)
            if donor is not None and any(self._is_input(m) for m in mine):
                replies.messages[party] = [self._relabel(donor, party) if self._is_input(m) else m for m in mine]
        return replies

    def _flip_input(self, message: Message) -> Message:
        env = message.envelope
        if env is None or not self._is_input(message) or not env.payload:
            return message
        self.applied += 1
        flipped = Envelope(env.protocol, env.stage, env.run_id, env.sender, env.receiver,
                           _flip(env.payload, len(env.payload) - 1), env.signature)
        return Message(flipped.to_bytes(), message.label)

    def _bad_share(self, message: Message) -> Message:
        env = message.envelope
        if env is None or message.label.stage != "unmasking" or env.receiver != SERVER or len(env.payload) < 37:
            return message
        # UnmaskResponse: u32 count | 33-byte shares ...: add 1 to the first share (its last byte).
        payload = bytearray(env.payload)
        value = int.from_bytes(payload[4:37], "big")
        from .primitives.shamir import PRIME

        payload[4:37] = ((value + 1) % PRIME).to_bytes(33, "big")
        self.applied += 1
        bad = Envelope(env.protocol, env.stage, env.run_id, env.sender, env.receiver, bytes(payload), env.signature)
        if self._signer is not None and env.signature:
            unsigned = bad.unsigned()
            bad = unsigned.with_signature(self._signer.sign(Authenticator.statement(unsigned)))
        return Message(bad.to_bytes(), message.label)

    def _relabel(self, donor: Message, party: PartyId) -> Message:
        env = donor.envelope
        assert env is not None
        self.applied += 1
        forged = Envelope(env.protocol, env.stage, env.run_id, party, env.receiver, env.payload, env.signature)
        return Message(forged.to_bytes(), donor.label)


class EquivocatingServer(MaskingServer):
    """A masking server that equivocates about ``target``: it tells the first ``t`` of the
    target's neighbours that the target dropped (so they reveal shares of its mask key) and
    everyone else that it survived (so the target and the other holders reveal shares of its
    seed). With ``t`` shares of both it could unmask the target's input: :attr:`stolen` says
    whether it held them (the active-server setting keeps it from ever doing so).
    """

    target: PartyId = 0
    stolen: bool = False
    shares: tuple[int, int] = (0, 0)

    def view(self, pid: PartyId) -> tuple[PartyId, ...]:
        liars = set(self.graph[self.target][: self.threshold])
        if pid in liars:
            return tuple(v for v in self.contributors if v != self.target)
        return self.contributors

    def _after_unmasking(self) -> list[Outgoing]:
        seeds, keys = self._revealed()
        self.shares = (len(seeds.get(self.target, [])), len(keys.get(self.target, [])))
        self.stolen = min(self.shares) >= self.threshold
        return super()._after_unmasking()


def equivocate(session: Any, target: PartyId) -> list[EquivocatingServer]:
    """Make ``session`` (a masking :class:`~protocols.embedded.SecureSum`) open every run with a
    server that equivocates about ``target``; returns the list its server parties go into."""
    server_session = session.server
    opened: list[EquivocatingServer] = []
    original = server_session.open

    def open_(*, run_id: bytes, request: Any) -> Any:
        party = original(run_id=run_id, request=request)
        if not isinstance(party, MaskingServer):
            raise ProtocolError("only a masking server can equivocate about dropouts")
        party.__class__ = EquivocatingServer
        assert isinstance(party, EquivocatingServer)
        party.target = target
        opened.append(party)
        return party

    server_session.open = open_
    return opened
