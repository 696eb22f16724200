"""Key set-up of the SEAL-based sums (``ckks``, ``bfv``) as a run of messages (``SumRequest(kind="setup")``).

One set-up makes one *key set*: a key pair for one parameter set (sums whose parameters differ
need a key set each; the sessions run one set-up per parameter set, when a sum first needs it).
The server names the agent and the parameter set in the request's parameters. Stages, each one
exchange:

1. ``open`` → every client. The agent generates the keys and answers ``context`` (its
   fingerprint and the public context: parameters and public key, no secret, Galois or
   relinearisation keys). With ``keyholder="all"`` every other client answers ``advertise``
   in the same exchange: a fresh X25519 channel key for this run.
2. The server loads (so validates) its own copy of the context and relays the bytes to every
   other client. With ``keyholder="all"`` it also sends the agent ``channel_keys``; the agent
   seals the secret key (with the fingerprint) to each client, the associated data naming
   protocol, run, agent and receiver, and answers ``sealed_key``.
3. ``keyholder="all"``: the server relays each client its sealed key, which the client opens
   and checks against the public context it loaded.

Every client but the agent ends with ``confirm`` (the fingerprint of the keys it installed);
the set-up finishes only when all of them confirmed, so no client is left without keys. Each
party loads its own objects from the bytes it received: none reads another's.

The channel keys are not authenticated to identities: against a server that replaces them
(an active attacker, outside this threat model) the shared key is only as safe as the relay.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from .base import Outgoing, Party, ServerParty, StageGate
from .errors import AbortedError, ForeignKeyError, WireError
from .primitives import seal as raw
from .primitives.channel import ChannelKey, open_sealed, seal
from .seal_messages import (
    SetupParams,
    Stage,
    key_associated_data,
    read_channel_key,
    read_channel_keys,
    read_confirm,
    read_context,
    read_relayed_key,
    read_sealed_keys,
    write_channel_keys,
    write_context,
    write_relayed_key,
    write_sealed_keys,
)
from .session import SumRequest
from .transcript import Exposure
from .wire import SERVER, Envelope, PartyId


@dataclass(frozen=True)
class Scheme:
    """What the generic parties need of a SEAL scheme: its protocol name, and how to load a
    public context and a secret key of a parameter set."""

    protocol: str
    public: Callable[[bytes, Any], raw.PublicKeys]
    secret: Callable[[bytes, Any], raw.SecretKeys]


@dataclass(frozen=True)
class ClientKeys:
    """One key set as a client keeps it between sums: the agent's id, the public context, and
    the secret key (object and bytes, for the client's snapshot) when this client decrypts."""

    agent: PartyId
    public: raw.PublicKeys
    secret: raw.SecretKeys | None = None
    secret_bytes: bytes | None = None

    @property
    def parameters(self) -> raw.SealParameters:
        return self.public.params

    def __repr__(self) -> str:
        return f"ClientKeys(agent={self.agent}, public={self.public!r}, secret={'held' if self.secret else None})"


class SetupClient(Party):
    """One client's side of the set-up; ``install`` hands its keys to its own session."""

    def __init__(self, party_id: PartyId, *, scheme: Scheme, run_id: bytes, params: SetupParams[Any],
                 clients: tuple[PartyId, ...], install: Callable[[ClientKeys], None]) -> None:
        super().__init__(party_id)
        self.scheme, self.run_id, self.params, self.install = scheme, run_id, params, install
        self.agent = params.agent
        self.shared = params.keyholder == "all"
        self.others = tuple(pid for pid in clients if pid != params.agent)
        self.channel = ChannelKey() if self.shared and party_id != self.agent else None
        self.public: raw.PublicKeys | None = None
        self.keys: ClientKeys | None = None
        self.gate = StageGate(run_id, scheme.protocol, party_id)
        self._purpose = scheme.protocol.encode() + b"-sk"

    def _send(self, stage: Stage, payload: bytes, exposure: Exposure) -> Outgoing:
        return Outgoing(Envelope(self.scheme.protocol, stage, self.run_id, self.party_id, SERVER, payload), exposure)

    def start(self) -> list[Outgoing]:
        if self.party_id != self.agent:
            self.gate.open = {Stage.CONTEXT}
            if self.channel is None:
                return []
            return [self._send(Stage.ADVERTISE, self.channel.public_bytes, Exposure.public())]
        with self.timed("keygen"):
            public_bytes, secret_bytes = raw.generate(self.params.parameters)
            public = self.scheme.public(public_bytes, self.params.parameters)
            keys = ClientKeys(self.agent, public, self.scheme.secret(secret_bytes, public), secret_bytes)
        self.keys = keys
        self.install(keys)
        self.gate.open = {Stage.CHANNEL_KEYS} if self.shared and self.others else set()
        self.done = not self.gate.open
        return [self._send(Stage.CONTEXT, write_context(public_bytes), Exposure.public())]

    def receive(self, env: Envelope) -> list[Outgoing]:
        self.gate.check(env, allowed_senders=[SERVER])
        if env.stage == Stage.CONTEXT:
            return self._context(env)
        if env.stage == Stage.CHANNEL_KEYS:
            return self._seal(env)
        return self._open_key(env)

    def _context(self, env: Envelope) -> list[Outgoing]:
        with self.timed("load"):
            public = self.scheme.public(read_context(env.payload), self.params.parameters)
        self.gate.record(env)
        if self.shared:
            self.public = public
            self.gate.open = {Stage.SEALED_KEY}
            return []
        return self._done(ClientKeys(self.agent, public))

    def _seal(self, env: Envelope) -> list[Outgoing]:
        """The agent seals its secret key (and the fingerprint it belongs to) to each client."""
        assert self.keys is not None and self.keys.secret_bytes is not None  # the agent made them in start()
        channels = read_channel_keys(env.payload, self.others)
        plaintext = self.keys.public.fingerprint + self.keys.secret_bytes
        mine = ChannelKey()
        sealed: dict[PartyId, bytes] = {}
        with self.timed("seal"):
            for pid, key in channels.items():
                try:
                    sealed[pid] = seal(mine, key, plaintext, associated=key_associated_data(self.scheme.protocol, self.run_id, self.agent, pid),
                                       purpose=self._purpose)
                except ValueError:  # a low-order point: X25519 refuses the all-zero shared secret
                    raise WireError(f"client {pid}'s channel key is not a usable X25519 key") from None
        self.gate.record(env)
        self.gate.open = set()
        self.done = True
        return [self._send(Stage.SEALED_KEY, write_sealed_keys(mine.public_bytes, sealed), Exposure.sealed(self.agent))]

    def _open_key(self, env: Envelope) -> list[Outgoing]:
        assert self.channel is not None and self.public is not None  # only SEALED_KEY is left open here
        agent_channel, sealed = read_relayed_key(env.payload)
        plaintext = open_sealed(self.channel, agent_channel, sealed, purpose=self._purpose,
                                associated=key_associated_data(self.scheme.protocol, self.run_id, self.agent, self.party_id))
        fingerprint, secret_bytes = plaintext[:raw.FINGERPRINT_BYTES], plaintext[raw.FINGERPRINT_BYTES:]
        if fingerprint != self.public.fingerprint:
            raise ForeignKeyError("the sealed secret key belongs to another public context than the one relayed")
        with self.timed("load"):
            secret = self.scheme.secret(secret_bytes, self.public)
        self.gate.record(env)
        return self._done(ClientKeys(self.agent, self.public, secret, secret_bytes))

    def _done(self, keys: ClientKeys) -> list[Outgoing]:
        self.keys = keys
        self.install(keys)
        self.gate.open = set()
        self.done = True
        return [self._send(Stage.CONFIRM, keys.public.fingerprint, Exposure.public())]


class SetupServer(ServerParty):
    """The server's side: validate and relay; ``on_done`` hands its own public context to its session."""

    def __init__(self, *, scheme: Scheme, run_id: bytes, request: SumRequest, clients: Sequence[PartyId],
                 params: SetupParams[Any], on_done: Callable[[raw.PublicKeys, PartyId], None]) -> None:
        super().__init__(protocol=scheme.protocol, run_id=run_id, request=request, clients=clients, audience=clients)
        self.scheme, self.params, self.on_done = scheme, params, on_done
        self.agent = params.agent
        self.shared = params.keyholder == "all"
        self.others = tuple(pid for pid in self.clients if pid != self.agent)
        self.gate = StageGate(run_id, scheme.protocol, SERVER)
        self.gate.open = {Stage.CONTEXT, Stage.ADVERTISE} if self.shared else {Stage.CONTEXT}
        self.stage = Stage.CONTEXT
        self.context: raw.PublicKeys | None = None
        self.channels: dict[PartyId, bytes] = {}
        self.sealed: tuple[bytes, dict[PartyId, bytes]] | None = None

    def receive(self, env: Envelope) -> list[Outgoing]:
        from_agent = env.stage in (Stage.CONTEXT, Stage.SEALED_KEY)
        self.gate.check(env, allowed_senders=[self.agent] if from_agent else self.others)
        if env.stage == Stage.CONTEXT:
            with self.timed("load"):
                self.context = self.scheme.public(read_context(env.payload), self.params.parameters)
        elif env.stage == Stage.ADVERTISE:
            self.channels[env.sender] = read_channel_key(env.payload)
        elif env.stage == Stage.SEALED_KEY:
            self.sealed = read_sealed_keys(env.payload, self.others)
        else:
            assert self.context is not None  # CONFIRM opens only once the context is in
            if read_confirm(env.payload) != self.context.fingerprint:
                raise ForeignKeyError(f"client {env.sender} installed other keys than the agent's")
        self.gate.record(env)
        return []

    def _to(self, pid: PartyId, stage: Stage, payload: bytes, exposure: Exposure) -> Outgoing:
        return Outgoing(Envelope(self.protocol, stage, self.run_id, SERVER, pid, payload), exposure)

    def advance(self) -> list[Outgoing]:
        if self.stage == Stage.CONTEXT:
            return self._relay_context()
        if self.stage == Stage.SEALED_KEY:
            return self._relay_keys()
        missing = sorted(set(self.others) - self.gate.senders(Stage.CONFIRM))
        if missing:
            raise AbortedError(f"clients {missing} did not confirm the keys (lost or refused)")
        return self._finish()

    def _relay_context(self) -> list[Outgoing]:
        if self.context is None:
            raise AbortedError("the agent sent no valid public context (lost or refused)")
        if not self.others:
            return self._finish()
        payload = write_context(self.context.data)
        out = [self._to(pid, Stage.CONTEXT, payload, Exposure.public()) for pid in self.others]
        if not self.shared:
            self.stage, self.gate.open = Stage.CONFIRM, {Stage.CONFIRM}
            return out
        missing = sorted(set(self.others) - set(self.channels))
        if missing:
            raise AbortedError(f"clients {missing} sent no channel key (lost or refused)")
        out.append(self._to(self.agent, Stage.CHANNEL_KEYS, write_channel_keys(self.channels), Exposure.public()))
        self.stage, self.gate.open = Stage.SEALED_KEY, {Stage.SEALED_KEY}
        return out

    def _relay_keys(self) -> list[Outgoing]:
        if self.sealed is None:
            raise AbortedError("the agent sealed no secret keys (lost or refused)")
        agent_channel, sealed = self.sealed
        self.stage, self.gate.open = Stage.CONFIRM, {Stage.CONFIRM}
        return [self._to(pid, Stage.SEALED_KEY, write_relayed_key(agent_channel, sealed[pid]),
                         Exposure.sealed(self.agent)) for pid in self.others]

    def _finish(self) -> list[Outgoing]:
        assert self.context is not None
        self.gate.open = set()
        self.finished = True
        self.on_done(self.context, self.agent)
        return []
