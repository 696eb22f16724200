"""The network between parties: party-addressed exchanges of serialised messages, one stage at a time.

Every protocol here is a star: clients talk only to the server (the aggregator), which relays
whatever one client seals for another. So one interface carries everything —
:meth:`Network.exchange` sends each client the messages the server has for it and returns each
client's replies; a client that does not answer (dropped, timed out, crashed) is listed in
:attr:`Replies.lost`. The network, not the parties, writes the transcript: one entry per message
that crossed it, with the bytes that crossed and what the receiver can read of them (the
:class:`Label` its sender attached). The audit and the byte counts read exactly that.

:class:`LocalNetwork` is the embedded implementation: client handlers are called in-process with
the bytes addressed to them, with optional dropout plans and an interceptor for fault
injection. Other engines (Flower) implement the same interface.

:func:`drive` plays the server's side of one protocol run over a network: send, collect replies,
feed them to the server party, and at each stage's end call :meth:`ServerParty.advance` (the
stage deadline: go on with whoever answered).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING

from .errors import AbortedError, ProtocolError, StageError, WireError
from .transcript import Exposure, Transcript, TranscriptEntry
from .wire import SERVER, Envelope, PartyId

if TYPE_CHECKING:
    from .identity import Authenticator

__all__ = [
    "DropoutPlan", "Handler", "Interceptor", "Label", "LocalNetwork", "Message", "Network", "Replies",
    "RunContext", "drive",
]


@dataclass(frozen=True)
class Label:
    """What the transcript records of a message besides sender, receiver and size."""

    protocol: str
    run_id: str
    stage: str
    stage_index: int
    statistic: str
    round: int
    exposure: Exposure


@dataclass(frozen=True)
class Message:
    """Serialised bytes on their way, with the sender's label for the transcript."""

    data: bytes
    label: Label

    @cached_property
    def envelope(self) -> Envelope | None:
        """The protocol envelope these bytes hold (``None`` if they are not one)."""
        try:
            return Envelope.from_bytes(self.data)
        except WireError:
            return None

    @property
    def exposure(self) -> Exposure:
        return self.label.exposure


@dataclass
class Replies:
    """What came back from one exchange: each client's messages, and who did not answer."""

    messages: dict[PartyId, list[Message]] = field(default_factory=dict)
    lost: set[PartyId] = field(default_factory=set)


@dataclass(frozen=True)
class RunContext:
    """One protocol run as the transcript names it."""

    protocol: str
    run_id: bytes
    round: int
    statistic: str
    stage_names: Mapping[int, str]

    def label(self, stage: int, exposure: Exposure) -> Label:
        return Label(protocol=self.protocol, run_id=self.run_id.hex(), stage=self.stage_names.get(stage, str(stage)),
                     stage_index=stage, statistic=self.statistic, round=self.round, exposure=exposure)


class Network(ABC):
    """Carries messages between the server and the clients, and records each in the transcript."""

    transcript: Transcript

    @abstractmethod
    def exchange(self, outbox: Mapping[PartyId, Sequence[Message]]) -> Replies:
        """Deliver each client its messages (in order); return what each client sent back."""

    def record(self, message: Message, *, sender: PartyId, receiver: PartyId) -> None:
        label = message.label
        exposure = label.exposure
        self.transcript.append(TranscriptEntry(
            round=label.round, protocol=label.protocol, run_id=label.run_id, stage=label.stage,
            sender=sender, receiver=receiver, statistic=label.statistic, bytes=len(message.data),
            visibility=exposure.visibility, k=exposure.k, dimension=exposure.dimension, owner=exposure.owner,
        ))


Handler = Callable[[Sequence[bytes]], list[Message]]
"""A client's side of the network: the bytes addressed to it in, its replies out."""

Interceptor = Callable[[bytes, Message], "bytes | None"]
"""Sees each serialised message before delivery; returns bytes to deliver or None to drop (tests, fault injection)."""


@dataclass(frozen=True)
class DropoutPlan:
    """Clients that go silent from a named stage of a protocol on: they neither send nor receive from then."""

    at_stage: Mapping[PartyId, str] = field(default_factory=dict)

    def silenced(self, party: PartyId, label: Label, stage_order: Mapping[str, int]) -> bool:
        name = self.at_stage.get(party)
        if name is None:
            return False
        if name not in stage_order:
            raise ValueError(f"unknown stage {name!r}; stages are {sorted(stage_order)}")
        return label.stage_index >= stage_order[name]


class LocalNetwork(Network):
    """The embedded network: handlers called in-process with real bytes, a transcript, and
    optional dropout plans (:meth:`plan`) and an interceptor for fault injection."""

    def __init__(self, transcript: Transcript | None = None, *, interceptor: Interceptor | None = None) -> None:
        self.transcript = transcript if transcript is not None else Transcript()
        self.interceptor = interceptor
        self.handlers: dict[PartyId, Handler] = {}
        self._plans: dict[str, tuple[DropoutPlan, dict[str, int]]] = {}
        self.before_handlers: Callable[[Mapping[PartyId, list[bytes]]], None] | None = None
        """Called with every party's delivered inbox of an exchange before any handler runs (the
        same list objects the handlers then get): an embedded engine lets its client nodes start
        on the exchange together (secure_fl's client pool). ``None``: each party in turn."""

    def attach(self, party: PartyId, handler: Handler) -> None:
        if not 0 <= party < SERVER:
            raise ValueError(f"client ids lie in [0, 2**32 - 1), got {party}")
        self.handlers[party] = handler

    def plan(self, protocol: str, plan: DropoutPlan | None, stage_names: Mapping[int, str]) -> None:
        """Silence clients from a stage of ``protocol`` on (``None`` lifts the plan)."""
        if plan is None or not plan.at_stage:
            self._plans.pop(protocol, None)
            return
        order = {name: stage for stage, name in stage_names.items()}
        for name in plan.at_stage.values():
            if name not in order:
                raise ValueError(f"unknown stage {name!r}; stages are {sorted(order)}")
        self._plans[protocol] = (plan, order)

    def _silenced(self, party: PartyId, message: Message) -> bool:
        planned = self._plans.get(message.label.protocol)
        return planned is not None and planned[0].silenced(party, message.label, planned[1])

    def _carry(self, message: Message, *, sender: PartyId, receiver: PartyId) -> bytes | None:
        """What crosses the wire (after the interceptor), recorded as it crossed; None if lost."""
        data = message.data if self.interceptor is None else self.interceptor(message.data, message)
        if data is not None:
            self.record(message if data is message.data else Message(data, message.label),
                        sender=sender, receiver=receiver)
        return data

    def exchange(self, outbox: Mapping[PartyId, Sequence[Message]]) -> Replies:
        replies = Replies()
        inboxes: dict[PartyId, list[bytes]] = {}
        for party in sorted(outbox):
            if party not in self.handlers:
                raise StageError(f"no client {party} on this network")
            delivered: list[bytes] = []
            for message in outbox[party]:
                if self._silenced(party, message):
                    continue
                data = self._carry(message, sender=SERVER, receiver=party)
                if data is not None:
                    delivered.append(data)
            if not delivered:
                replies.lost.add(party)
            elif self.before_handlers is None:
                self._answer(party, delivered, replies)
            else:
                inboxes[party] = delivered
        if self.before_handlers is not None:
            self.before_handlers(inboxes)
            for party, delivered in inboxes.items():
                self._answer(party, delivered, replies)
        return replies

    def _answer(self, party: PartyId, delivered: list[bytes], replies: Replies) -> None:
        back: list[Message] = []
        for message in self.handlers[party](delivered):
            if self._silenced(party, message):
                continue
            data = self._carry(message, sender=party, receiver=SERVER)
            if data is not None:
                back.append(message if data is message.data else Message(data, message.label))
        replies.messages[party] = back


def _to_messages(outgoing: Sequence[object], context: RunContext,
                 authenticator: Authenticator | None = None) -> dict[PartyId, list[Message]]:
    from .base import Outgoing

    outbox: dict[PartyId, list[Message]] = {}
    for item in outgoing:
        assert isinstance(item, Outgoing)
        env = item.envelope
        if env.sender != SERVER:
            raise StageError("the server sent a message in another party's name")
        if authenticator is not None:
            env = authenticator.seal(env)
        message = Message(env.to_bytes(), context.label(env.stage, item.exposure))
        outbox.setdefault(env.receiver, []).append(message)
    return outbox


def drive(server: object, network: Network, context: RunContext, *, max_exchanges: int = 64,
          authenticator: Authenticator | None = None) -> list[str]:
    """Play the server's side of one run until it finishes; returns why messages were rejected.

    Each exchange delivers what the server has for the clients and feeds their replies back
    (a reply that fails validation is rejected and changes nothing; a client's ``refuse`` is
    recorded with its reason). When nothing is left to send, the stage's deadline has passed:
    :meth:`ServerParty.advance` goes on with whoever answered, or aborts.

    With an ``authenticator`` (:mod:`protocols.identity`), every message the server sends is
    signed and every reply must carry its sender's registered signature: a tampered, forged
    or re-addressed reply is one :class:`~protocols.errors.AuthenticationError` naming the
    sender, and changes nothing.
    """
    from .base import ServerParty
    from .session import REFUSE, read_refusal

    assert isinstance(server, ServerParty)
    rejected: list[str] = []
    pending = list(server.start())
    if authenticator is not None and authenticator.identity.party != SERVER:
        raise ValueError("the server's authenticator must sign as the server")
    for _ in range(max_exchanges):
        if not pending:
            if server.finished:
                return rejected
            pending = list(server.advance())
            if not pending:
                if server.finished:
                    return rejected
                raise AbortedError("the protocol stalled: no party has anything left to send")
            continue
        replies = network.exchange(_to_messages(pending, context, authenticator))
        pending = []
        for party in sorted(replies.messages):
            for message in replies.messages[party]:
                try:
                    env = Envelope.from_bytes(message.data)
                    if authenticator is not None:
                        authenticator.check(env)
                    elif env.signature:
                        raise WireError(f"client {party} sent a signed message to a server that authenticates nothing")
                    if env.sender != party or env.receiver != SERVER:
                        raise StageError(f"client {party} sent a message as {env.sender} to {env.receiver}")
                    if env.stage == REFUSE:
                        if env.run_id != server.run_id or env.protocol != server.protocol:
                            raise StageError(f"client {party} refused another run")
                        reason = read_refusal(env.payload)
                        rejected.append(f"client {party} refused: {reason}")
                        server.rejected_from[party] = f"refused: {reason}"
                        server.refused(party, reason)
                        continue
                    pending.extend(server.receive(env))
                except AbortedError:
                    raise
                except ProtocolError as error:
                    rejected.append(f"{type(error).__name__}: {error}")
                    server.rejected_from[party] = f"{type(error).__name__}: {error}"
    raise AbortedError(f"the protocol did not finish within {max_exchanges} exchanges")
