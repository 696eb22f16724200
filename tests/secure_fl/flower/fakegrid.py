"""An in-process Flower grid for tests: the real ClientApp on a fake clock, with fault injection.

Each node is a :class:`flwr.app.Context` (its node config and the state the ClientApp keeps);
every message goes through ``secure_fl.flower.apps.client_app`` exactly as a SuperNode would
hand it over, so every exchange restores the node from its state. Faults are keyed by party,
round and stage (the exchange's stage name): ``drop`` (the node never gets the message: dead),
``lost`` (it handles it, the reply vanishes), ``error`` (Flower's error reply for a dead node,
code 5), ``garbage``, ``replay`` (its previous reply again), ``foreign`` (a reply of another
server), ``impostor`` (the reply claims another node), ``delay`` (the reply shows up ``delay``
seconds later on the fake clock), ``stray`` (an extra reply to no message: ignored). Stage
``hello`` puts a fault on the hello. With ``state_root`` node *i* keeps its state between rounds
in ``state_root/client-<i>`` (its ``state-path``), as a deployed node does.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from flwr.app import ConfigRecord, Context, Error, Message, RecordDict

from secure_fl.flower.apps import client_app
from secure_fl.flower.wire import EXCHANGE, KEY, read_request


@dataclass
class FakeClock:
    now: float = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


@dataclass(frozen=True)
class Fault:
    party: int
    kind: str
    round: int | None = None
    stage: str | None = None
    delay: float = 0.0

    def matches(self, party: int, round_: int, stage: str) -> bool:
        return party == self.party and self.round in (None, round_) and self.stage in (None, stage)


@dataclass
class FakeGrid:
    parties: int
    clock: FakeClock = field(default_factory=FakeClock)
    faults: list[Fault] = field(default_factory=list)
    first_node: int = 1000
    contexts: dict[int, Context] = field(default_factory=dict)
    _ready: list[tuple[float, Message]] = field(default_factory=list)
    _previous: dict[int, RecordDict] = field(default_factory=dict)
    handled: int = 0
    _sent: set[str] = field(default_factory=set)
    state_root: Path | None = None

    def __post_init__(self) -> None:
        from flwr.supercore.task_identity import TaskIdentity

        if TaskIdentity._run_id is None:  # what a ServerApp process has set before it makes messages
            TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 1, 1
        for pid in range(self.parties):
            node = self.first_node + 7 * pid
            config: dict[str, int | str] = {"partition-id": pid, "num-partitions": self.parties}
            if self.state_root is not None:
                config["state-path"] = str(self.state_root / f"client-{pid}")
            self.contexts[node] = Context(run_id=1, node_id=node, state=RecordDict(), run_config={},
                                          node_config=config)

    def party(self, node: int) -> int:
        return int(self.contexts[node].node_config["partition-id"])  # type: ignore[call-overload]

    def get_node_ids(self) -> Iterable[int]:
        return list(self.contexts)

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        ids = []
        for message in messages:
            message.metadata.__dict__["_message_id"] = uuid.uuid4().hex
            ids.append(message.metadata.message_id)
            self._sent.add(message.metadata.message_id)
            self._deliver(message)
        return ids

    def _fault(self, message: Message) -> Fault | None:
        party = self.party(message.metadata.dst_node_id)
        if message.metadata.message_type != EXCHANGE:  # the hello: faults with stage "hello"
            return next((f for f in self.faults if f.stage == "hello" and f.party == party), None)
        request = read_request(message.content)
        return next((f for f in self.faults if f.matches(party, request.round, request.stage)), None)

    def _deliver(self, message: Message) -> None:
        node = message.metadata.dst_node_id
        fault = self._fault(message)
        kind = fault.kind if fault is not None else None
        if kind == "drop":
            return
        if kind == "error":
            self._ready.append((self.clock.now, Message(Error(code=5, reason="node gone"), reply_to=message)))
            return
        try:
            reply = client_app(message, self.contexts[node])
        except Exception as error:  # noqa: BLE001 -- what a SuperNode turns into an error reply
            reply = Message(Error(code=2, reason=f"{type(error).__name__}: {error}"), reply_to=message)
        self.handled += 1
        if kind == "lost":
            return
        if kind == "garbage":
            reply = Message(RecordDict({KEY: ConfigRecord({"outbox": os.urandom(64)})}), reply_to=message)
        elif kind == "replay" and node in self._previous:
            reply = Message(self._previous[node], reply_to=message)
        elif kind == "foreign":
            record = reply.content.config_records[KEY]
            record["nonce"] = os.urandom(16)
        elif kind == "impostor":
            reply.metadata.__dict__["_src_node_id"] = next(n for n in self.contexts if n != node)
        elif kind == "stray":
            stray = Message(reply.content, reply_to=message)
            stray.metadata.__dict__["_reply_to_message_id"] = uuid.uuid4().hex
            self._ready.append((self.clock.now, stray))
        if reply.has_content():
            self._previous[node] = reply.content
        reply.metadata.__dict__["_message_id"] = uuid.uuid4().hex
        delay = fault.delay if fault is not None and kind == "delay" else 0.0
        self._ready.append((self.clock.now + delay, reply))

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        wanted = set(message_ids)
        out, keep = [], []
        for at, reply in self._ready:
            stray = reply.metadata.reply_to_message_id not in self._sent
            if at <= self.clock.now and (reply.metadata.reply_to_message_id in wanted or stray):
                out.append(reply)
            else:
                keep.append((at, reply))
        self._ready = keep
        return out
