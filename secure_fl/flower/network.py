"""The run's network over a Flower :class:`~flwr.serverapp.Grid`: one exchange = one round trip.

:class:`FlowerNetwork` implements :class:`protocols.Network`. Each exchange sends one Flower
message per party (everything the server has for it in that exchange, :mod:`.wire`), then
pulls replies until every party answered or the stage timeout (``[runtime] stage_timeout``)
passed. Replies are matched by ``reply_to_message_id`` — never by source node, since an error
reply for a dead node comes from the SuperLink — and the source node is then checked.

A party is a dropout of the exchange (listed in :attr:`Replies.lost`; the protocols' recovery
then runs) when

* its reply did not come within the stage timeout, or Flower answered with an error reply (a
  killed or unreachable SuperNode, a ClientApp that raised): the party is *gone* and later
  exchanges skip it — no more waiting on a node that is not there;
* its reply is unreadable, replays an earlier exchange, belongs to another server or run, or
  comes from another node: a typed :class:`~protocols.ProtocolError` for that party, recorded in
  :attr:`dropouts` with its reason; the party may answer again in the next exchange.

The transcript is written as on the embedded :class:`~protocols.LocalNetwork` — for each party
in order, what was sent to it, then what it sent back — so the same run gives the same
transcript on both. Besides it the network measures, per exchange, the bytes of the Flower
messages that carried it (:class:`StageRecord`) and the wall time.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from flwr.app import Message as FlowerMessage

from protocols import Message, Network, ProtocolError, Replies, StageError, Transcript
from protocols.wire import SERVER, PartyId
from secure_fl.runtime.messages import RUNTIME

from .wire import (
    EXCHANGE,
    HELLO,
    NONCE_BYTES,
    REGISTER,
    read_hello_reply,
    read_register_reply,
    read_reply,
    write_hello,
    write_register,
    write_request,
)

__all__ = ["Dropout", "FlowerError", "FlowerNetwork", "GridLike", "StageRecord", "wire_bytes"]

log = logging.getLogger("secure_fl.flower")

EventSink = Callable[[dict[str, Any]], None]
"""Hears ``{"round", "stage", "event": "sent" | "received", "time", ...}`` around each exchange."""


class FlowerError(RuntimeError):
    """The federation cannot run: nodes missing, duplicated, or not of this run."""


class GridLike(Protocol):
    """What the network uses of a Flower ``Grid`` (a test may pass a fake)."""

    def get_node_ids(self) -> Iterable[int]: ...

    def push_messages(self, messages: Iterable[FlowerMessage]) -> Iterable[str]: ...

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[FlowerMessage]: ...


@dataclass(frozen=True)
class Dropout:
    """A party counted out of an exchange, and why."""

    round: int
    stage: str
    party: PartyId
    reason: str
    gone: bool
    """Whether later exchanges skip the party (timeout or error reply)."""


@dataclass(frozen=True)
class StageRecord:
    """One exchange: its round and stage, wall time, bytes of the Flower messages both ways and the
    transcript's bytes of the messages they carried."""

    round: int
    stage: str
    seconds: float
    wire_bytes: int
    transcript_bytes: int
    parties: int
    lost: tuple[PartyId, ...] = ()


def wire_bytes(message: FlowerMessage) -> int:
    """Bytes of a Flower message as its object store ships it: the message and its records."""
    total, todo = 0, [message]
    while todo:
        obj: Any = todo.pop()
        total += len(obj.deflate())
        todo.extend((obj.children or {}).values())
    return total


def _check(stop: threading.Event | None) -> None:
    if stop is not None and stop.is_set():
        raise FlowerError("the engine stopped (interrupted)")


def _describe(outbox: Mapping[PartyId, Sequence[Message]]) -> tuple[int, str]:
    """The round and stage name of an exchange: ``train`` when it carries the round's model, else
    the first protocol message's stage."""
    labels = [m.label for messages in outbox.values() for m in messages]
    if not labels:
        return -1, "empty"
    if any(lb.protocol == RUNTIME and lb.stage == "train" for lb in labels):
        return labels[0].round, "train"
    protocol = next((lb for lb in labels if lb.protocol != RUNTIME), labels[0])
    return protocol.round, protocol.stage


@dataclass
class _Exchange:
    seq: int
    round: int
    stage: str
    sent: dict[PartyId, Sequence[Message]] = field(default_factory=dict)
    pending: dict[str, PartyId] = field(default_factory=dict)
    replies: Replies = field(default_factory=Replies)
    wire: int = 0


class FlowerNetwork(Network):
    """The run's network over a Flower grid (see the module docstring)."""

    def __init__(self, grid: GridLike, nodes: Mapping[PartyId, int], *, nonce: bytes, stage_timeout: float,
                 transcript: Transcript | None = None, on_event: EventSink | None = None,
                 poll_interval: float = 0.05, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep, stop: threading.Event | None = None) -> None:
        if len(nonce) != NONCE_BYTES:
            raise ValueError("the network's nonce is 16 bytes")
        self.grid = grid
        self.nodes = dict(nodes)
        self.nonce = nonce
        self.stage_timeout = stage_timeout
        self.transcript = transcript if transcript is not None else Transcript()
        self.on_event = on_event
        self.poll_interval = poll_interval
        self.clock, self.sleep = clock, sleep
        self.stop = stop
        """Set by whoever runs the engine when it stops (Ctrl-C): the next poll raises, no waiting out a timeout."""
        self.gone: set[PartyId] = set()
        self.dropouts: list[Dropout] = []
        self.stages: list[StageRecord] = []
        self.rejected: list[str] = []
        """Replies that matched no message of the exchange (late, unknown): dropped, never fatal."""
        self.keys: dict[PartyId, bytes] = {}
        """The public signing keys the nodes sent in their hello replies (``authenticate``)."""
        self._seq = 0

    # --- set-up: which node is which party --------------------------------------------------------

    @classmethod
    def connect(cls, grid: GridLike, *, config: str, parties: int, stage_timeout: float,
                wait: float | None = None, poll_interval: float = 0.05, run_id: str = "", resume: int = -1,
                **options: Any) -> FlowerNetwork:
        """Wait for ``parties`` nodes, send each the run's public config and learn its party id (its
        ``partition-id``); each of the two waits lasts at most ``wait`` seconds (default the stage
        timeout): a node's first message may start its process or actor and import the stack.

        ``run_id`` names the run (nodes key their stored state by it); ``resume`` >= 0 asks every
        node to restore its stored state of that round. A node that cannot (its state is missing,
        foreign or tampered) says why: it is a dropout of the run from round ``resume + 1`` on,
        never a node that silently starts afresh."""
        clock: Callable[[], float] = options.get("clock", time.monotonic)
        sleep: Callable[[float], None] = options.get("sleep", time.sleep)
        stop: threading.Event | None = options.get("stop")
        wait = stage_timeout if wait is None else wait
        deadline = clock() + wait
        nodes = sorted(set(grid.get_node_ids()))
        while len(nodes) < parties and clock() < deadline:
            _check(stop)
            sleep(poll_interval)
            nodes = sorted(set(grid.get_node_ids()))
        if len(nodes) < parties:
            raise FlowerError(f"{len(nodes)} of {parties} nodes connected within {wait:g} s")
        nonce = secrets.token_bytes(NONCE_BYTES)
        messages = {node: FlowerMessage(write_hello(nonce=nonce, config=config, run_id=run_id, resume=resume),
                                        dst_node_id=node, message_type=HELLO) for node in nodes}
        ids = set(grid.push_messages(list(messages.values())))
        pending = {m.metadata.message_id: node for node, m in messages.items() if m.metadata.message_id in ids}
        found: dict[PartyId, int] = {}
        refused: dict[PartyId, str] = {}
        keys: dict[PartyId, bytes] = {}
        deadline = clock() + wait
        while pending:
            for reply in grid.pull_messages(list(pending)):
                node = pending.pop(reply.metadata.reply_to_message_id, None)
                if node is None or reply.metadata.src_node_id != node:
                    continue
                if reply.has_error():
                    log.warning("node %d did not join: %s", node, reply.error.reason)
                    continue
                try:
                    hello = read_hello_reply(reply.content, nonce=nonce)
                    party, count = hello.party, hello.parties
                except ProtocolError as error:
                    log.warning("node %d answered the hello with %s: %s", node, type(error).__name__, error)
                    continue
                if count != parties or not 0 <= party < parties:
                    raise FlowerError(f"node {node} is partition {party} of {count}; this run has {parties} clients")
                if party in found:
                    raise FlowerError(f"nodes {found[party]} and {node} both claim partition {party}")
                found[party] = node
                if hello.error:
                    refused[party] = hello.error
                elif hello.key:
                    keys[party] = hello.key
            if not pending or len(found) == parties or clock() >= deadline:  # extra nodes need not answer
                break
            _check(stop)
            sleep(poll_interval)
        missing = sorted(set(range(parties)) - set(found))
        if missing:
            raise FlowerError(f"no node answered for partition(s) {missing[:10]}{' ...' if len(missing) > 10 else ''}"
                              f" within {wait:g} s")
        network = cls(grid, found, nonce=nonce, stage_timeout=stage_timeout, poll_interval=poll_interval, **options)
        network.keys = keys
        for party, reason in sorted(refused.items()):
            network.exclude(party, reason, round=resume + 1, stage="hello")
        return network

    def exclude(self, party: PartyId, reason: str, *, round: int, stage: str) -> None:
        """Count ``party`` out of the rest of the run (it cannot take part: ``reason``)."""
        self.gone.add(party)
        self.dropouts.append(Dropout(round=round, stage=stage, party=party, reason=reason, gone=True))
        log.warning("client %d cannot take part: %s", party, reason)

    # --- registration: every party's signing key (``authenticate``) -----------------------------------

    def register(self, keys: Mapping[PartyId, bytes], *, round: int) -> None:
        """Send every party that is not gone the directory of public keys ``keys`` (one round trip);
        a party that does not confirm within the stage timeout is excluded, with the reason."""
        start = self.clock()
        messages = {party: FlowerMessage(write_register(nonce=self.nonce, keys=keys), dst_node_id=node,
                                         message_type=REGISTER)
                    for party, node in sorted(self.nodes.items()) if party not in self.gone}
        pushed = set(self.grid.push_messages(list(messages.values()))) if messages else set()
        pending = {m.metadata.message_id: party for party, m in messages.items() if m.metadata.message_id in pushed}
        wire = sum(wire_bytes(m) for m in messages.values())
        failed = {party: "the SuperLink refused the message" for party, m in messages.items()
                  if m.metadata.message_id not in pushed}

        def take(reply: FlowerMessage) -> None:
            nonlocal wire
            party = pending.pop(reply.metadata.reply_to_message_id, None)
            if party is None:
                self.rejected.append(f"a reply from node {reply.metadata.src_node_id} to no registration")
                return
            try:
                if reply.has_error():
                    raise StageError(f"Flower error reply {reply.error.code}: {reply.error.reason}")
                wire += wire_bytes(reply)
                if reply.metadata.src_node_id != self.nodes[party]:
                    raise StageError(f"the reply came from node {reply.metadata.src_node_id}")
                if read_register_reply(reply.content, nonce=self.nonce) != len(keys):
                    raise StageError("it registered another directory")
            except ProtocolError as error:
                failed[party] = f"{type(error).__name__}: {error}"

        self._poll(pending, start + self.stage_timeout, take)
        for party in pending.values():
            failed[party] = f"no reply within the stage timeout ({self.stage_timeout:g} s)"
        for party, reason in sorted(failed.items()):
            self.exclude(party, f"registration: {reason}", round=round, stage="register")
        self.stages.append(StageRecord(round=round, stage="register", seconds=self.clock() - start, wire_bytes=wire,
                                       transcript_bytes=0, parties=len(messages), lost=tuple(sorted(failed))))

    # --- exchanges -------------------------------------------------------------------------------------

    def _event(self, ex: _Exchange, event: str, **extra: Any) -> None:
        if self.on_event is not None:
            self.on_event({"round": ex.round, "stage": ex.stage, "event": event, "time": time.time(), **extra})

    def _drop(self, ex: _Exchange, party: PartyId, reason: str, *, gone: bool) -> None:
        ex.replies.lost.add(party)
        ex.replies.messages.pop(party, None)
        if gone:
            self.gone.add(party)
        self.dropouts.append(Dropout(round=ex.round, stage=ex.stage, party=party, reason=reason, gone=gone))
        log.warning("round %d, %s: client %d dropped: %s", ex.round, ex.stage, party, reason)

    def exchange(self, outbox: Mapping[PartyId, Sequence[Message]]) -> Replies:
        start = self.clock()
        self._seq += 1
        round_, stage = _describe(outbox)
        ex = _Exchange(seq=self._seq, round=round_, stage=stage)
        messages: list[tuple[PartyId, FlowerMessage]] = []
        for party in sorted(outbox):
            if party not in self.nodes:
                raise StageError(f"no client {party} on this network")
            if party in self.gone or not outbox[party]:
                ex.replies.lost.add(party)
                continue
            content = write_request(nonce=self.nonce, seq=ex.seq, round=round_, stage=stage,
                                    inbox=[m.data for m in outbox[party]])
            messages.append((party, FlowerMessage(content, dst_node_id=self.nodes[party], message_type=EXCHANGE,
                                                  group_id=str(round_))))
        self._event(ex, "sent", parties=len(messages))
        pushed = set(self.grid.push_messages([m for _, m in messages])) if messages else set()
        for party, message in messages:
            if message.metadata.message_id in pushed:
                ex.pending[message.metadata.message_id] = party
                ex.sent[party] = outbox[party]
                ex.wire += wire_bytes(message)
            else:
                self._drop(ex, party, "the SuperLink refused the message", gone=False)
        self._poll(ex.pending, start + self.stage_timeout, lambda reply: self._take(ex, reply))
        for party in sorted(ex.pending.values()):
            self._drop(ex, party, f"no reply within the stage timeout ({self.stage_timeout:g} s)", gone=True)
        self._record(ex, start)
        self._event(ex, "received", lost=sorted(ex.replies.lost))
        return ex.replies

    def _poll(self, pending: Mapping[str, PartyId], deadline: float, take: Callable[[FlowerMessage], None]) -> None:
        """Pull the replies to the messages ``pending`` names (``take`` pops each it consumes)
        until none is left or ``deadline`` passes (never waits forever: Flower's own wait would)."""
        while pending:
            for reply in self.grid.pull_messages(list(pending)):
                take(reply)
            if not pending or self.clock() >= deadline:
                break
            _check(self.stop)
            self.sleep(self.poll_interval)

    def _take(self, ex: _Exchange, reply: FlowerMessage) -> None:
        party = ex.pending.pop(reply.metadata.reply_to_message_id, None)
        if party is None:
            self.rejected.append(f"a reply from node {reply.metadata.src_node_id} to no message of exchange {ex.seq}")
            return
        if reply.has_error():
            self._drop(ex, party, f"Flower error reply {reply.error.code}: {reply.error.reason}", gone=True)
            return
        ex.wire += wire_bytes(reply)
        try:
            if reply.metadata.src_node_id != self.nodes[party]:
                raise StageError(f"the reply came from node {reply.metadata.src_node_id}, "
                                 f"not client {party}'s node {self.nodes[party]}")
            ex.replies.messages[party] = read_reply(reply.content, nonce=self.nonce, seq=ex.seq)
        except ProtocolError as error:
            self._drop(ex, party, f"{type(error).__name__}: {error}", gone=False)

    def _record(self, ex: _Exchange, start: float) -> None:
        carried = 0
        for party in sorted(ex.sent):
            for message in ex.sent[party]:
                self.record(message, sender=SERVER, receiver=party)
                carried += len(message.data)
            for message in ex.replies.messages.get(party, []):
                self.record(message, sender=party, receiver=SERVER)
                carried += len(message.data)
        self.stages.append(StageRecord(
            round=ex.round, stage=ex.stage, seconds=self.clock() - start, wire_bytes=ex.wire,
            transcript_bytes=carried, parties=len(ex.sent), lost=tuple(sorted(ex.replies.lost))))
