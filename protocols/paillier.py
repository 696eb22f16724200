"""Packed Paillier secure sum with a client as key holder.

Roles: clients encrypt packed plaintexts; the server only multiplies ciphertexts
and never holds the secret key (unless ``keyholder="server"``, a weaker mode the
audit flags); the key holder decrypts. Key holder modes:

* ``agent`` (default): one client, picked with ``secrets``, generates the key pair
  and decrypts aggregates; it releases the decoded sum through the server, so the
  server learns the sum (only use it for statistics the server may learn);
* ``all``: the agent shares the secret key with every client over sealed channels
  relayed by the server (Dubhe's scheme); the server relays the aggregate ciphertext
  and every client decrypts it itself, so the server learns the sum only if asked;
* ``server``: the server generates and holds the key — a client's ciphertext is then
  readable by the server, i.e. no protection; kept for comparison.

Many entries share one plaintext (see :class:`~protocols.encoding.PackingLayout`),
and each client can precompute its obfuscators r^n offline (:attr:`PaillierOptions.pool_size`).
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from enum import IntEnum
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from .base import (
    Outgoing,
    Party,
    Reveal,
    RunContext,
    SecureSum,
    ServerParty,
    StageGate,
    Transport,
    stage_names,
)
from .encoding import PackingLayout, VectorSpec, decode_sum
from .errors import (
    AbortedError,
    CiphertextError,
    EncodingError,
    ForeignKeyError,
    ProtocolError,
    StageError,
    WireError,
)
from .messages import read_contributors, write_contributors
from .primitives import paillier as raw
from .primitives.channel import ChannelKey, open_sealed, seal
from .transcript import Exposure
from .wire import SERVER, Envelope, PartyId, Reader, Writer

PROTOCOL = "paillier"
Keyholder = Literal["agent", "all", "server"]


class Stage(IntEnum):
    """Stages of a packed sum; 8–10 belong to :mod:`protocols.argmin`, which shares the wire code."""

    PUBLIC_KEY = 1
    ADVERTISE = 2
    CHANNEL_KEYS = 3
    SEALED_KEY = 4
    UPLOAD = 5
    AGGREGATE = 6
    RESULT = 7


@dataclass(frozen=True, kw_only=True)
class PaillierOptions:
    key_bits: int = raw.MIN_KEY_BITS
    keyholder: Keyholder = "agent"
    pool_size: int = 0
    """Obfuscators each client precomputes at set-up (offline); 0 computes them online."""
    allow_weak_keys: bool = False
    """Tests only: accept keys shorter than 2048 bits."""

    def __post_init__(self) -> None:
        if self.keyholder not in ("agent", "all", "server"):
            raise ValueError(f"keyholder must be 'agent', 'all' or 'server', got {self.keyholder!r}")
        if self.pool_size < 0:
            raise ValueError("pool_size must be >= 0")
        if self.key_bits < raw.MIN_KEY_BITS and not self.allow_weak_keys:
            raise ValueError(f"key_bits below {raw.MIN_KEY_BITS} need allow_weak_keys=True (tests only)")


# --- payloads -----------------------------------------------------------------------------------

def _write_ciphertexts(writer: Writer, key: raw.PublicKey, ciphertexts: list[Any]) -> Writer:
    writer.raw(key.fingerprint).u32(len(ciphertexts))
    width = key.ciphertext_bytes
    for c in ciphertexts:
        writer.uint(int(c), width)
    return writer


def _read_ciphertexts(reader: Reader, key: raw.PublicKey, expected: int, *, unit_check: bool = True) -> list[Any]:
    """Parse and check ciphertexts; the server defers the unit check to the product (one gcd)."""
    raw.check_key(key, reader.raw(raw.FINGERPRINT_BYTES))
    count = reader.u32()
    if count != expected:
        raise WireError(f"expected {expected} ciphertexts, got {count}")
    width = key.ciphertext_bytes
    check = raw.check_ciphertext if unit_check else raw.check_range
    return [check(key, reader.uint(width)) for _ in range(count)]


# --- long-lived key material --------------------------------------------------------------------

class ClientKeys:
    """What one client keeps between sums: the public key, its obfuscator pool, maybe the secret key."""

    def __init__(self, public_key: raw.PublicKey) -> None:
        self.public_key = public_key
        self.pool = raw.ObfuscatorPool(public_key)
        self._private_key: raw.PrivateKey | None = None

    @property
    def private_key(self) -> raw.PrivateKey | None:
        return self._private_key

    @private_key.setter
    def private_key(self, key: raw.PrivateKey | None) -> None:
        """A client that holds the key also makes its obfuscators with it (twice as fast)."""
        if key is not None and key.public_key != self.public_key:
            raise ForeignKeyError("the private key belongs to another public key")
        self._private_key = self.pool.private_key = key


# --- parties of one sum -------------------------------------------------------------------------

class PaillierClient(Party):
    def __init__(self, party_id: PartyId, *, run_id: bytes, spec: VectorSpec, layout: PackingLayout,
                 keys: ClientKeys, encoded: npt.NDArray[np.uint64] | None, clients: tuple[PartyId, ...],
                 decrypts: bool, server_holds_key: bool = False) -> None:
        super().__init__(party_id)
        self.run_id, self.spec, self.layout, self.keys = run_id, spec, layout, keys
        self.encoded, self.clients = encoded, clients
        self.decrypts = decrypts
        self.server_holds_key = server_holds_key
        self.gate = StageGate(run_id, PROTOCOL, party_id)
        self.gate.open = {Stage.AGGREGATE, Stage.RESULT} if decrypts else {Stage.RESULT}

    def start(self) -> list[Outgoing]:
        if self.encoded is None:
            return []
        key = self.keys.public_key
        with self.timed("upload"):
            plaintexts = self.layout.pack(self.encoded)
            ciphertexts = [raw.encrypt_with(key, m, self.keys.pool.take()) for m in plaintexts]
            payload = _write_ciphertexts(Writer(), key, ciphertexts).finish()
        env = Envelope(PROTOCOL, Stage.UPLOAD, self.run_id, self.party_id, SERVER, payload)
        # Under keyholder="server" the server decrypts what it receives: the transcript says so.
        exposure = (Exposure.clear(self.party_id, self.spec.length) if self.server_holds_key
                    else Exposure.ciphertext(self.spec.length, self.party_id))
        return [Outgoing(env, exposure)]

    def receive(self, env: Envelope) -> list[Outgoing]:
        self.gate.check(env, allowed_senders=[SERVER])
        reader = Reader(env.payload)
        release = reader.u8() if env.stage == Stage.AGGREGATE else 0
        if release not in (0, 1):
            raise WireError("bad release flag")
        contributors = read_contributors(reader, self.clients, self.spec.summands)
        if env.stage == Stage.AGGREGATE:
            ciphertexts = _read_ciphertexts(reader, self.keys.public_key, self.layout.num_plaintexts)
            reader.end()
            assert self.keys.private_key is not None  # a decrypting client holds the key by construction
            with self.timed("finalize"):
                encoded_sum = self._decrypt(ciphertexts)
                self.result = decode_sum(self.spec, encoded_sum, contributors=len(contributors))
            self.gate.record(env)
            self.gate.open = set()
            if not release:
                return []
            payload = write_contributors(Writer(), contributors, self.clients).u64_array(encoded_sum).finish()
            out = Envelope(PROTOCOL, Stage.RESULT, self.run_id, self.party_id, SERVER, payload)
            return [Outgoing(out, Exposure.aggregate(len(contributors), self.spec.length))]
        encoded_sum = reader.u64_array(expected=self.spec.length)
        reader.end()
        try:
            result = decode_sum(self.spec, encoded_sum, contributors=len(contributors))
        except EncodingError as error:
            raise WireError(f"released sum is impossible: {error}") from error
        self.gate.record(env)
        self.gate.open = set()
        self.result = result
        return []

    def _decrypt(self, ciphertexts: list[Any]) -> npt.NDArray[np.uint64]:
        assert self.keys.private_key is not None
        plaintexts = [self.keys.private_key.decrypt(c) for c in ciphertexts]
        try:
            return self.layout.unpack(plaintexts)
        except EncodingError as error:
            raise CiphertextError("aggregate does not decrypt to a valid packed sum") from error


class PaillierServer(ServerParty):
    def __init__(self, *, run_id: bytes, spec: VectorSpec, layout: PackingLayout, public_key: raw.PublicKey,
                 clients: tuple[PartyId, ...], decryptors: tuple[PartyId, ...], reveal: Reveal,
                 private_key: raw.PrivateKey | None) -> None:
        super().__init__()
        self.run_id, self.spec, self.layout, self.public_key = run_id, spec, layout, public_key
        self.clients, self.decryptors = clients, decryptors
        self.releaser: PartyId | None = None
        self.reveal, self.private_key = reveal, private_key
        self.gate = StageGate(run_id, PROTOCOL, SERVER)
        self.gate.open = {Stage.UPLOAD}
        self.uploads: dict[PartyId, list[Any]] = {}
        self.aggregate: list[Any] | None = None
        self.stage = Stage.UPLOAD

    def receive(self, env: Envelope) -> list[Outgoing]:
        if env.stage == Stage.UPLOAD:
            self.gate.check(env, allowed_senders=self.clients)
            reader = Reader(env.payload)
            with self.timed("aggregate"):
                ciphertexts = _read_ciphertexts(reader, self.public_key, self.layout.num_plaintexts,
                                                unit_check=False)
            reader.end()
            self.gate.record(env)
            self.uploads[env.sender] = ciphertexts
            return []
        self.gate.check(env, allowed_senders=[] if self.releaser is None else [self.releaser])
        reader = Reader(env.payload)
        contributors = read_contributors(reader, self.clients, self.spec.summands)
        encoded_sum = reader.u64_array(expected=self.spec.length)
        reader.end()
        if contributors != self.contributors:
            raise StageError("the key holder released a sum over other contributors than were aggregated")
        try:
            result = decode_sum(self.spec, encoded_sum, contributors=len(contributors))
        except EncodingError as error:
            raise WireError(f"released sum is impossible: {error}") from error
        self.gate.record(env)
        self.gate.open = set()
        self.result = result
        self.finished = True
        clients_still_waiting = self.reveal.clients and len(self.decryptors) < len(self.clients)
        return self._broadcast_result(encoded_sum) if clients_still_waiting else []

    def advance(self) -> list[Outgoing]:
        if self.stage == Stage.UPLOAD:
            with self.timed("aggregate"):
                self.aggregate = self._aggregate()
            self.stage = Stage.AGGREGATE
            self.gate.open = set()
            if self.private_key is not None:  # keyholder == "server"
                with self.timed("finalize"):
                    encoded_sum = self.layout.unpack([self.private_key.decrypt(c) for c in self.aggregate])
                    self.result = decode_sum(self.spec, encoded_sum, contributors=len(self.contributors))
                self.finished = True
                return self._broadcast_result(encoded_sum) if self.reveal.clients else []
            # One decryptor releases the sum to the server when the server is to learn it: the
            # agent (lost agent = abort), or with a shared key the first surviving contributor.
            if len(self.decryptors) == 1 or self.reveal.server:
                self.releaser = self.decryptors[0] if len(self.decryptors) == 1 else self.contributors[0]
            body = _write_ciphertexts(
                write_contributors(Writer(), self.contributors, self.clients), self.public_key, self.aggregate
            ).finish()
            exposure = Exposure.aggregate(len(self.contributors), self.spec.length)
            out = [
                Outgoing(Envelope(PROTOCOL, Stage.AGGREGATE, self.run_id, SERVER, pid,
                                  bytes([pid == self.releaser]) + body), exposure)
                for pid in self.decryptors
            ]
            if self.releaser is not None:
                self.gate.open = {Stage.RESULT}
            else:
                self.finished = True
            return out
        raise AbortedError("the key holder did not release the sum (lost or refused)")

    def _aggregate(self) -> list[Any]:
        """Multiply the uploads slot-wise; if the product is not a unit, drop the uploads that are not."""
        if not self.uploads:
            raise AbortedError("no client uploaded")
        columns = list(zip(*self.uploads.values()))
        try:
            aggregate = [raw.product(self.public_key, list(column)) for column in columns]
        except CiphertextError:
            for pid, ciphertexts in list(self.uploads.items()):
                try:
                    for c in ciphertexts:
                        raw.check_ciphertext(self.public_key, c)
                except CiphertextError as error:
                    self.rejections.append(f"CiphertextError: upload of client {pid}: {error}")
                    del self.uploads[pid]
            return self._aggregate()
        self.contributors = tuple(sorted(self.uploads))
        return aggregate

    def _broadcast_result(self, encoded_sum: npt.NDArray[np.uint64]) -> list[Outgoing]:
        payload = write_contributors(Writer(), self.contributors, self.clients).u64_array(encoded_sum).finish()
        exposure = Exposure.aggregate(len(self.contributors), self.spec.length)
        return [Outgoing(Envelope(PROTOCOL, Stage.RESULT, self.run_id, SERVER, pid, payload), exposure)
                for pid in self.clients if pid not in self.decryptors]


# --- the session --------------------------------------------------------------------------------

class PaillierSum(SecureSum):
    """Packed Paillier: the server multiplies ciphertexts, a client-side key holder decrypts."""

    name = PROTOCOL
    stage_names = stage_names(Stage)

    def __init__(self, *, clients: tuple[PartyId, ...] | list[PartyId], transport: Transport | None = None,
                 options: PaillierOptions = PaillierOptions()) -> None:
        super().__init__(clients=clients, transport=transport)
        self.options = options
        self.agent: PartyId | None = None
        self.public_key: raw.PublicKey | None = None
        self._client_keys: dict[PartyId, ClientKeys] = {}
        self._server_private: raw.PrivateKey | None = None

    @property
    def ready(self) -> bool:
        return self.public_key is not None

    def setup(self, *, round: int = -1, statistic: str = "setup") -> None:
        """Generate and distribute keys once; every message goes through the transport."""
        opts = self.options
        public, private = raw.generate_keypair(opts.key_bits, allow_weak=opts.allow_weak_keys)
        run_id = secrets.token_bytes(16)
        ctx = self.context(run_id=run_id, round=round, statistic=statistic)
        key_bytes = public.to_bytes()
        if opts.keyholder == "server":
            self._server_private = private
            holder = SERVER
        else:
            self.agent = secrets.choice(self.clients)
            holder = self.agent
            self._carry(ctx, Stage.PUBLIC_KEY, holder, SERVER, key_bytes, Exposure.public())
        for pid in self.clients:
            if pid != holder:
                received = self._carry(ctx, Stage.PUBLIC_KEY, SERVER, pid, key_bytes, Exposure.public())
                if raw.PublicKey.from_bytes(received) != public:
                    raise ProtocolError("public key altered in transit")
            keys = ClientKeys(public)
            if pid == holder:
                keys.private_key = private
            self._client_keys[pid] = keys
        if opts.keyholder == "all":
            self._share_secret_key(ctx, private)
        for keys in self._client_keys.values():
            keys.pool.fill(opts.pool_size)
        self.public_key = public

    def _share_secret_key(self, ctx: RunContext, private: raw.PrivateKey) -> None:
        """Agent seals (p, q) to each client; the server relays ciphertexts it cannot open."""
        assert self.agent is not None
        agent_channel = ChannelKey()
        channels = {pid: ChannelKey() for pid in self.clients if pid != self.agent}
        bundle = Writer().blob(agent_channel.public_bytes)
        for pid, channel in channels.items():
            self._carry(ctx, Stage.ADVERTISE, pid, SERVER, channel.public_bytes, Exposure.public())
            bundle.u32(pid).raw(channel.public_bytes)
        self._carry(ctx, Stage.CHANNEL_KEYS, SERVER, self.agent, bundle.finish(), Exposure.public())
        p, q = private.export_secret()
        width = (self.options.key_bits // 2 + 7) // 8 + 1
        secret = Writer().uint(p, width).uint(q, width).finish()
        for pid, channel in channels.items():
            associated = ctx.run_id + self.agent.to_bytes(4, "big") + pid.to_bytes(4, "big")
            sealed = seal(agent_channel, channel.public_bytes, secret, associated=associated, purpose=b"paillier-sk")
            relayed = self._carry(ctx, Stage.SEALED_KEY, self.agent, SERVER, sealed, Exposure.sealed(self.agent))
            delivered = self._carry(ctx, Stage.SEALED_KEY, SERVER, pid, relayed, Exposure.sealed(self.agent))
            opened = open_sealed(channel, agent_channel.public_bytes, delivered, associated=associated,
                                 purpose=b"paillier-sk")
            reader = Reader(opened)
            got_p, got_q = reader.uint(width), reader.uint(width)
            reader.end()
            self._client_keys[pid].private_key = raw.PrivateKey(self._client_keys[pid].public_key, got_p, got_q)

    def _carry(self, ctx: RunContext, stage: Stage, sender: PartyId, receiver: PartyId,
               payload: bytes, exposure: Exposure) -> bytes:
        env = Envelope(PROTOCOL, stage, ctx.run_id, sender, receiver, payload)
        delivered = self.transport.carry(Outgoing(env, exposure), ctx)
        if delivered is None or delivered.stage != stage or delivered.receiver != receiver:
            raise AbortedError(f"key set-up message {stage.name.lower()} was lost or misrouted")
        return delivered.payload

    def client_keys(self, party: PartyId) -> ClientKeys:
        return self._client_keys[party]

    def layout_for(self, spec: VectorSpec) -> PackingLayout:
        if self.public_key is None:
            raise StageError("call setup() before summing")
        return PackingLayout.for_spec(spec, capacity_bits=self.public_key.plaintext_capacity_bits)

    def _build(self, *, run_id: bytes, spec: VectorSpec, encoded: Mapping[PartyId, npt.NDArray[np.uint64]],
               reveal: Reveal, round: int) -> tuple[ServerParty, dict[PartyId, Party]]:
        if not self.ready:
            self.setup(round=round)
        assert self.public_key is not None
        mode = self.options.keyholder
        if mode == "agent" and not reveal.server:
            raise ValueError("keyholder='agent' releases sums through the server; use keyholder='all' "
                             "for a sum the server must not learn")
        layout = self.layout_for(spec)
        decryptors: tuple[PartyId, ...]
        if mode == "agent":
            assert self.agent is not None
            decryptors = (self.agent,)
        elif mode == "all":
            decryptors = self.clients
        else:
            decryptors = ()
        server = PaillierServer(run_id=run_id, spec=spec, layout=layout, public_key=self.public_key,
                                clients=self.clients, decryptors=decryptors, reveal=reveal,
                                private_key=self._server_private)
        clients: dict[PartyId, Party] = {
            pid: PaillierClient(pid, run_id=run_id, spec=spec, layout=layout, keys=self._client_keys[pid],
                                encoded=encoded.get(pid), clients=self.clients, decrypts=pid in decryptors,
                                server_holds_key=mode == "server")
            for pid in self.clients
        }
        return server, clients
