"""Paillier key set-up as a run of messages between parties (a ``SumRequest`` of kind ``setup``).

No party hands another a Python object: the key pair is born at its holder and only bytes
leave it. ``params`` name the key holder mode and the agent (drawn by the server with
:mod:`secrets`). Exchanges, each one round trip (replies travel in the same exchange):

* ``agent``: open → the agent answers ``public_key``; the server checks it and relays it to
  every other client, which checks it and answers ``key_ready`` (2 exchanges).
* ``all`` (Dubhe): open → the agent answers ``public_key``, every other client ``advertise``
  (a fresh X25519 channel key); the server sends the agent ``channel_keys``; the agent seals
  (p, q) to each client, bound to run, agent and receiver, and answers one ``sealed_key``
  bundle; the server relays ``public_key`` and that client's ``sealed_key``; the client opens
  it, checks p·q = n and answers ``key_ready`` (3 exchanges). The server never sees p or q.
* ``server`` (the weak mode the audit flags): the server generates the key and sends
  ``public_key`` with the open; clients answer ``key_ready`` (1 exchange).

A client installs its keys into its session only when its part is complete, so a failed run
leaves the session as it was; the server does the same through ``on_done``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import pairwise
from secrets import compare_digest

from .base import Outgoing, Party, ServerParty, StageGate
from .errors import AbortedError, ForeignKeyError, WireError
from .paillier_common import (
    PROTOCOL,
    SEAL_PURPOSE,
    ClientKeys,
    Keyholder,
    PaillierOptions,
    Stage,
    check_channel_key,
    private_key,
    read_public_key,
    seal_associated,
    sealed_length,
    secret_width,
    write_public_key,
)
from .primitives import paillier as raw
from .primitives.channel import PUBLIC_KEY_BYTES, ChannelKey, open_sealed, seal
from .session import SumRequest
from .transcript import Exposure
from .wire import SERVER, Envelope, PartyId, Reader, Writer

Install = Callable[[ClientKeys, PartyId], None]
"""A client session's hook: keep these keys (from a completed set-up run led by this agent)."""


@dataclass(frozen=True)
class KeySetup:
    """What the server keeps from a set-up run: public material, and the key only in its weak mode."""

    mode: Keyholder
    public_key: raw.PublicKey
    agent: PartyId
    """The client that generated the key (:data:`~protocols.wire.SERVER` in the weak mode)."""
    holders: frozenset[PartyId]
    """Clients that hold the private key (confirmed by ``key_ready`` or, for the agent, by publishing)."""
    ready: frozenset[PartyId]
    """Clients that confirmed the public key."""
    private_key: raw.PrivateKey | None = None


def _key_ready(run_id: bytes, party: PartyId, key: raw.PublicKey) -> Outgoing:
    env = Envelope(PROTOCOL, Stage.KEY_READY, run_id, party, SERVER, key.fingerprint)
    return Outgoing(env, Exposure.public())


def _public_key_message(run_id: bytes, sender: PartyId, receiver: PartyId, owner: PartyId,
                        key: raw.PublicKey) -> Outgoing:
    payload = write_public_key(Writer(), owner, key).finish()
    return Outgoing(Envelope(PROTOCOL, Stage.PUBLIC_KEY, run_id, sender, receiver, payload), Exposure.public())


# --- the server ---------------------------------------------------------------------------------

class SetupServer(ServerParty):
    """Relays public material between the agent and the other clients; keeps what it checked."""

    def __init__(self, *, run_id: bytes, request: SumRequest, clients: Sequence[PartyId],
                 options: PaillierOptions, agent: PartyId, on_done: Callable[[KeySetup], None],
                 server_key: tuple[raw.PublicKey, raw.PrivateKey] | None = None) -> None:
        super().__init__(protocol=PROTOCOL, run_id=run_id, request=request, clients=clients, audience=clients)
        self.mode, self.bits, self.agent, self.on_done = options.keyholder, options.key_bits, agent, on_done
        if (self.mode == "server") != (server_key is not None) or (self.mode == "server") != (agent == SERVER):
            raise ValueError("only keyholder='server' has the server generate the key, and then it is the agent")
        self.others = tuple(c for c in self.clients if c != agent)
        self.gate = StageGate(run_id, PROTOCOL, SERVER)
        self.public_key: raw.PublicKey | None = server_key[0] if server_key else None
        self._server_private = server_key[1] if server_key else None
        self.channel_keys: dict[PartyId, bytes] = {}
        self.asked: tuple[PartyId, ...] = ()
        """Clients whose channel keys went to the agent (it must seal to exactly these)."""
        self.sealed: dict[PartyId, bytes] = {}
        self.agent_channel = b""
        self.expect_ready: tuple[PartyId, ...] = ()
        self.ready: set[PartyId] = set()
        self.phase = "collect"

    def start(self) -> list[Outgoing]:
        out = super().start()
        if self.mode == "server":
            assert self.public_key is not None
            out += [_public_key_message(self.run_id, SERVER, pid, SERVER, self.public_key) for pid in self.clients]
            self.gate.open, self.expect_ready, self.phase = {Stage.KEY_READY}, self.clients, "confirm"
        else:
            self.gate.open = {Stage.PUBLIC_KEY, Stage.ADVERTISE} if self.mode == "all" else {Stage.PUBLIC_KEY}
        return out

    def receive(self, env: Envelope) -> list[Outgoing]:
        reader = Reader(env.payload)
        if env.stage == Stage.PUBLIC_KEY:
            self.gate.check(env, allowed_senders=[self.agent])
            owner, key = read_public_key(reader, bits=self.bits)
            reader.end()
            if owner != self.agent:
                raise ForeignKeyError(f"the agent sent a key owned by party {owner}")
            self.gate.record(env)
            self.public_key = key
        elif env.stage == Stage.ADVERTISE:
            self.gate.check(env, allowed_senders=self.others)
            channel = check_channel_key(env.payload)
            if channel in self.channel_keys.values():
                raise WireError("another client advertised this channel key")
            self.gate.record(env)
            self.channel_keys[env.sender] = channel
        elif env.stage == Stage.SEALED_KEY:
            self.gate.check(env, allowed_senders=[self.agent])
            agent_channel, sealed = self._read_bundle(reader)
            self.gate.record(env)
            self.agent_channel, self.sealed = agent_channel, sealed
        else:
            self.gate.check(env, allowed_senders=self.expect_ready)
            known = self.public_key
            assert known is not None  # key_ready opens only once the key is known
            if not compare_digest(reader.raw(raw.FINGERPRINT_BYTES), known.fingerprint):
                raise ForeignKeyError("the client confirmed another key")
            reader.end()
            self.gate.record(env)
            self.ready.add(env.sender)
        return []

    def _read_bundle(self, reader: Reader) -> tuple[bytes, dict[PartyId, bytes]]:
        agent_channel = check_channel_key(reader.raw(PUBLIC_KEY_BYTES))
        count = reader.u32()
        if count != len(self.asked):
            raise WireError(f"the agent sealed {count} keys, {len(self.asked)} were asked for")
        size = sealed_length(self.bits)
        entries = [(reader.u32(), reader.raw(size)) for _ in range(count)]
        reader.end()
        if tuple(pid for pid, _ in entries) != self.asked:
            raise WireError("sealed keys for other clients than were asked for")
        return agent_channel, dict(entries)

    def advance(self) -> list[Outgoing]:
        out: list[Outgoing] = []
        if self.phase == "collect":
            key = self.public_key
            if key is None:
                raise AbortedError("the agent did not publish a key (lost or refused): key set-up aborted")
            if self.mode == "agent":
                out = [_public_key_message(self.run_id, SERVER, pid, self.agent, key) for pid in self.others]
                self.gate.open, self.expect_ready, self.phase = {Stage.KEY_READY}, self.others, "confirm"
            else:
                self.asked = tuple(sorted(self.channel_keys))
                body = Writer().u32(len(self.asked))
                for pid in self.asked:
                    body.u32(pid).raw(self.channel_keys[pid])
                env = Envelope(PROTOCOL, Stage.CHANNEL_KEYS, self.run_id, SERVER, self.agent, body.finish())
                out = [Outgoing(env, Exposure.public())]
                self.gate.open, self.phase = {Stage.SEALED_KEY}, "channels"
        elif self.phase == "channels":
            key = self.public_key
            if not self.agent_channel or key is None:
                raise AbortedError("the agent did not seal the key to the clients (lost or refused)")
            for pid, sealed in self.sealed.items():
                env = Envelope(PROTOCOL, Stage.SEALED_KEY, self.run_id, SERVER, pid, self.agent_channel + sealed)
                out += [_public_key_message(self.run_id, SERVER, pid, self.agent, key),
                        Outgoing(env, Exposure.sealed(self.agent))]
            self.gate.open, self.expect_ready, self.phase = {Stage.KEY_READY}, tuple(self.sealed), "confirm"
        else:
            self._finish()
            return []
        return out or self.advance()

    def _finish(self) -> None:
        key = self.public_key
        assert key is not None
        holders: set[PartyId] = set()
        if self.mode == "agent":
            holders = {self.agent}
        elif self.mode == "all":
            holders = {self.agent, *self.ready}
        ready = self.ready | ({self.agent} if self.mode != "server" else set())
        self.gate.open = set()
        self.finished = True
        self.on_done(KeySetup(mode=self.mode, public_key=key, agent=self.agent, holders=frozenset(holders),
                              ready=frozenset(ready), private_key=self._server_private))
        self._server_private = None


# --- the clients --------------------------------------------------------------------------------

class SetupAgent(Party):
    """Generates the key pair; publishes the public key; under ``all`` seals (p, q) to each client."""

    def __init__(self, party_id: PartyId, *, run_id: bytes, options: PaillierOptions,
                 clients: Sequence[PartyId], install: Install) -> None:
        super().__init__(party_id)
        self.run_id, self.options, self.clients, self.install = run_id, options, tuple(clients), install
        self.gate = StageGate(run_id, PROTOCOL, party_id)
        self._keys: ClientKeys | None = None
        self._channel: ChannelKey | None = None

    def start(self) -> list[Outgoing]:
        with self.timed("keygen"):
            public, private = raw.generate_keypair(self.options.key_bits, allow_weak=self.options.allow_weak_keys)
        keys = ClientKeys(public)
        keys.private_key = private
        out = [_public_key_message(self.run_id, self.party_id, SERVER, self.party_id, public)]
        if self.options.keyholder == "agent":
            self.install(keys, self.party_id)
            self.done = True
            return out
        self._keys, self._channel = keys, ChannelKey()
        self.gate.open = {Stage.CHANNEL_KEYS}
        return out

    def receive(self, env: Envelope) -> list[Outgoing]:
        self.gate.check(env, allowed_senders=[SERVER])
        keys, channel = self._keys, self._channel
        assert keys is not None and channel is not None and keys.private_key is not None
        reader = Reader(env.payload)
        count = reader.u32()
        if count >= len(self.clients):
            raise WireError(f"{count} channel keys for {len(self.clients) - 1} other clients")
        peers = [(reader.u32(), check_channel_key(reader.raw(PUBLIC_KEY_BYTES))) for _ in range(count)]
        reader.end()
        ids = [pid for pid, _ in peers]
        if any(a >= b for a, b in pairwise(ids)) or not set(ids) <= set(self.clients) - {self.party_id}:
            raise WireError("channel keys must name other clients of the protocol, ascending")
        bits = self.options.key_bits
        p, q = keys.private_key.export_secret()
        secret = Writer().uint(p, secret_width(bits)).uint(q, secret_width(bits)).finish()
        bundle = Writer().raw(channel.public_bytes).u32(count)
        with self.timed("seal"):
            for pid, peer in peers:
                sealed = seal(channel, peer, secret, associated=seal_associated(self.run_id, self.party_id, pid),
                              purpose=SEAL_PURPOSE)
                bundle.u32(pid).raw(sealed)
        self.gate.record(env)
        self.gate.open = set()
        self.install(keys, self.party_id)
        self._keys = self._channel = None
        self.done = True
        out = Envelope(PROTOCOL, Stage.SEALED_KEY, self.run_id, self.party_id, SERVER, bundle.finish())
        return [Outgoing(out, Exposure.sealed(self.party_id))]


class SetupMember(Party):
    """Any other client: checks the public key (under ``all`` also opens its sealed private key),
    keeps them, and confirms with the key's fingerprint."""

    def __init__(self, party_id: PartyId, *, run_id: bytes, options: PaillierOptions, agent: PartyId,
                 install: Install) -> None:
        super().__init__(party_id)
        self.run_id, self.options, self.agent, self.install = run_id, options, agent, install
        self.gate = StageGate(run_id, PROTOCOL, party_id)
        self.gate.open = {Stage.PUBLIC_KEY}
        self._channel = ChannelKey() if options.keyholder == "all" else None
        self._public: raw.PublicKey | None = None

    def start(self) -> list[Outgoing]:
        if self._channel is None:
            return []
        env = Envelope(PROTOCOL, Stage.ADVERTISE, self.run_id, self.party_id, SERVER, self._channel.public_bytes)
        return [Outgoing(env, Exposure.public())]

    def receive(self, env: Envelope) -> list[Outgoing]:
        self.gate.check(env, allowed_senders=[SERVER])
        reader = Reader(env.payload)
        if env.stage == Stage.PUBLIC_KEY:
            owner, key = read_public_key(reader, bits=self.options.key_bits)
            reader.end()
            if owner != self.agent:
                raise ForeignKeyError(f"a key owned by party {owner}, this run's key holder is {self.agent}")
            self.gate.record(env)
            if self._channel is not None:
                self._public = key
                self.gate.open = {Stage.SEALED_KEY}
                return []
            self.gate.open = set()
            self.install(ClientKeys(key), self.agent)
            self.done = True
            return [_key_ready(self.run_id, self.party_id, key)]
        keys = self._open(reader)
        self.gate.record(env)
        self.gate.open = set()
        self.install(keys, self.agent)
        self._channel = self._public = None
        self.done = True
        return [_key_ready(self.run_id, self.party_id, keys.public_key)]

    def _open(self, reader: Reader) -> ClientKeys:
        key, channel = self._public, self._channel
        assert key is not None and channel is not None  # sealed_key opens after public_key, under "all"
        agent_channel = check_channel_key(reader.raw(PUBLIC_KEY_BYTES))
        sealed = reader.raw(sealed_length(self.options.key_bits))
        reader.end()
        opened = open_sealed(channel, agent_channel, sealed, purpose=SEAL_PURPOSE,
                             associated=seal_associated(self.run_id, self.agent, self.party_id))
        secret = Reader(opened)
        width = secret_width(self.options.key_bits)
        p, q = secret.uint(width), secret.uint(width)
        secret.end()
        keys = ClientKeys(key)
        keys.private_key = private_key(key, p, q)
        return keys
