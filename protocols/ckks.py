"""CKKS secure sum (TenSEAL) with a client as key holder.

Roles, as for :mod:`protocols.paillier`: clients encrypt; the server only adds
ciphertexts, holding a *public context* (parameters and public key — no secret key,
no Galois or relinearisation keys, which a sum does not need); the key holder decrypts.
Key holder modes:

* ``agent`` (default): one client, picked with ``secrets``, generates the keys and
  decrypts the aggregate; it releases the sum through the server, so the server
  learns the sum (only for statistics the server may learn);
* ``all``: the agent shares the secret key with every client over sealed channels
  relayed by the server; the server relays the aggregate ciphertexts and every
  surviving client decrypts them itself, so the server learns the sum only if asked.

There is no server-held key mode: CKKS here exists to keep inputs from the server.

**Chunking.** A vector of length ``d`` becomes ``ceil(d / slots)`` ciphertexts, each
using all ``slots = N/2`` slots (the last one the remainder). An upload is the key
fingerprint, a count, and per ciphertext a 4-byte length and SEAL's serialisation of
the ciphertext — no context, no per-ciphertext wrapper — plus a 16-byte checksum.

**Exact sums.** Clients encrypt their *encoded* entries (the integers of
:func:`~protocols.encoding.encode`, in ``[0, entry_max]``) as CKKS reals. The key holder
decrypts ``sum + e`` with ``|e| <= eps(n, M)`` (see
:meth:`~protocols.primitives.ckks.CkksParameters.error_bound`; ``M = n * entry_max``) and
rounds to the nearest integer. Set-up refuses a spec for which ``eps(summands, M) > 1/4``
(:class:`~protocols.errors.CapacityError`), so the rounding is exact and the decoded sum is
bit-for-bit the one ``plain``, ``paillier`` and ``masking`` produce: its error against the
real-valued sum is the encoding's ``n * 2**-(frac_bits+1)`` and CKKS adds nothing
(:meth:`CkksSum.tolerance`). A decryption error above ``eps`` means a corrupted aggregate and
is refused. Rounding also means what the key holder releases is a function of the inputs
alone: no decryption noise reaches the server, which could otherwise use it with the
aggregate ciphertext to attack the secret key (Li–Micciancio, IND-CPA-D).

**Integrity.** Every upload carries a key fingerprint (SHA-256 of the public context),
checked before anything is parsed; a ciphertext under another context is refused with
:class:`~protocols.errors.ForeignKeyError`. The checksum catches corruption in transit
(half of random bit flips in a zstd-compressed ciphertext still load as a valid, wrong
ciphertext); it is not authentication — a party that can rewrite an upload can rewrite
its checksum, and CKKS ciphertexts are malleable, so authenticity is the transport's job.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from .base import (
    DropoutPlan,
    Outgoing,
    Party,
    Reveal,
    RunContext,
    SecureSum,
    ServerParty,
    StageGate,
    SumOutcome,
    Transport,
    stage_names,
)
from .encoding import VectorSpec, decode_sum
from .errors import (
    AbortedError,
    CapacityError,
    CiphertextError,
    EncodingError,
    ProtocolError,
    StageError,
    WireError,
)
from .messages import read_contributors, write_contributors
from .primitives import ckks as raw
from .primitives.channel import ChannelKey, open_sealed, seal
from .transcript import Exposure
from .wire import SERVER, Envelope, PartyId, Reader, Writer

PROTOCOL = "ckks"
Keyholder = Literal["agent", "all"]
CHECKSUM_BYTES = 16
ROUNDING_MARGIN = 0.25
"""Largest CKKS error (in encoded units) a spec may need; rounding is exact below 1/2."""


class Stage(IntEnum):
    CONTEXT = 1
    ADVERTISE = 2
    CHANNEL_KEYS = 3
    SEALED_KEY = 4
    UPLOAD = 5
    AGGREGATE = 6
    RESULT = 7


@dataclass(frozen=True, kw_only=True)
class CkksOptions:
    """CKKS parameters and who holds the key.

    The defaults (N = 8192, primes of 60, 40, 40 and 60 bits, scale 2**40) give 4096
    slots, 128-bit security, and a bound of 6.6e-7 per fresh encryption and slot on the
    CKKS error (a few 1e-9 measured). With the double-precision term ``N * M * 2**-51`` of
    the bound, sums round exactly while ``n * entry_max`` stays below about 2**34 and n
    below ~3.8e5. Larger N buys slots per ciphertext (and more noise), not precision.
    """

    poly_modulus_degree: int = 8192
    coeff_mod_bit_sizes: tuple[int, ...] = (60, 40, 40, 60)
    scale_bits: int = 40
    keyholder: Keyholder = "agent"
    parameters: raw.CkksParameters = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.keyholder not in ("agent", "all"):
            raise ValueError(f"keyholder must be 'agent' or 'all', got {self.keyholder!r}")
        bits = tuple(self.coeff_mod_bit_sizes)
        object.__setattr__(self, "coeff_mod_bit_sizes", bits)
        object.__setattr__(
            self, "parameters", raw.CkksParameters(self.poly_modulus_degree, bits, self.scale_bits)
        )


# --- payloads -----------------------------------------------------------------------------------

def _checksum(body: bytes | memoryview) -> bytes:
    digest = hashlib.sha256(b"secure-fl/ckks-payload\x00")
    digest.update(body)
    return digest.digest()[:CHECKSUM_BYTES]


def _write_ciphertexts(writer: Writer, context: raw.PublicContext, streams: list[bytes]) -> bytes:
    writer.raw(context.fingerprint).u32(len(streams))
    for stream in streams:
        writer.blob(stream)
    body = writer.finish()
    return body + _checksum(body)


def _read_ciphertexts(reader: Reader, context: raw.PublicContext, expected: int) -> list[bytes]:
    """Fingerprint, then count, then the SEAL streams (size-capped; framing is checked on load)."""
    raw.check_fingerprint(context.fingerprint, reader.raw(raw.FINGERPRINT_BYTES))
    count = reader.u32()
    if count != expected:
        raise WireError(f"expected {expected} ciphertexts, got {count}")
    return [reader.blob(max_len=context.layout.max_stream) for _ in range(count)]


def _verified(payload: bytes, start: int = 0) -> bytes:
    """The payload without its checksum, which must match (bytes from ``start`` on are covered)."""
    if len(payload) < start + CHECKSUM_BYTES:
        raise WireError("payload truncated: no checksum")
    view = memoryview(payload)
    if not hmac.compare_digest(_checksum(view[start:-CHECKSUM_BYTES]), payload[-CHECKSUM_BYTES:]):
        raise WireError("ciphertext payload failed its checksum (corrupted in transit)")
    return payload[:-CHECKSUM_BYTES]


# --- long-lived key material --------------------------------------------------------------------

class ClientKeys:
    """What one client keeps between sums: the public context, and the secret key if it decrypts."""

    def __init__(self, public: raw.PublicContext) -> None:
        self.public = public
        self.secret: raw.SecretContext | None = None


def check_capacity(params: raw.CkksParameters, spec: VectorSpec) -> None:
    """Refuse a spec whose sums CKKS cannot carry exactly (see the module docstring)."""
    magnitude = float(spec.summands * spec.entry_max)
    if magnitude > params.max_magnitude():
        raise CapacityError(
            f"sums up to {magnitude:.3g} do not fit the {params.data_bits}-bit data modulus at scale "
            f"2**{params.scale_bits}; lower the bound or precision, or the scale"
        )
    eps = params.error_bound(spec.summands, magnitude)
    if eps > ROUNDING_MARGIN:
        raise CapacityError(
            f"CKKS error bound {eps:.3g} for {spec.summands} summands of up to {spec.entry_max} exceeds "
            f"{ROUNDING_MARGIN}, so sums would not round exactly; lower frac_bits, the bound or the "
            "number of summands, or raise scale_bits"
        )


# --- parties of one sum -------------------------------------------------------------------------

class CkksClient(Party):
    def __init__(self, party_id: PartyId, *, run_id: bytes, spec: VectorSpec, keys: ClientKeys,
                 encoded: npt.NDArray[np.uint64] | None, clients: tuple[PartyId, ...], decrypts: bool) -> None:
        super().__init__(party_id)
        self.run_id, self.spec, self.keys = run_id, spec, keys
        self.encoded, self.clients, self.decrypts = encoded, clients, decrypts
        self.params = keys.public.params
        self.sizes = self.params.chunk_sizes(spec.length)
        self.decryption_error: float | None = None
        """Largest distance of a decrypted slot from its integer, i.e. the CKKS error actually met."""
        self.gate = StageGate(run_id, PROTOCOL, party_id)
        self.gate.open = {Stage.AGGREGATE, Stage.RESULT} if decrypts else {Stage.RESULT}

    def start(self) -> list[Outgoing]:
        if self.encoded is None:
            return []
        with self.timed("upload"):
            streams = self.keys.public.encrypt(self.encoded.astype(np.float64))
            payload = _write_ciphertexts(Writer(), self.keys.public, streams)
        env = Envelope(PROTOCOL, Stage.UPLOAD, self.run_id, self.party_id, SERVER, payload)
        return [Outgoing(env, Exposure.ciphertext(self.spec.length, self.party_id))]

    def receive(self, env: Envelope) -> list[Outgoing]:
        self.gate.check(env, allowed_senders=[SERVER])
        if env.stage == Stage.AGGREGATE:
            return self._decrypt_aggregate(env)
        reader = Reader(env.payload)
        contributors = read_contributors(reader, self.clients, self.spec.summands)
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

    def _decrypt_aggregate(self, env: Envelope) -> list[Outgoing]:
        reader = Reader(_verified(env.payload, start=1))  # the release flag is set per receiver
        release = reader.u8()
        if release not in (0, 1):
            raise WireError("bad release flag")
        contributors = read_contributors(reader, self.clients, self.spec.summands)
        streams = _read_ciphertexts(reader, self.keys.public, len(self.sizes))
        reader.end()
        secret = self.keys.secret
        assert secret is not None  # a decrypting client holds the key by construction
        with self.timed("finalize"):
            encoded_sum, error = self._round(secret.decrypt(streams, self.sizes), len(contributors))
            result = decode_sum(self.spec, encoded_sum, contributors=len(contributors))
        self.gate.record(env)
        self.gate.open = set()
        self.result, self.decryption_error = result, error
        if not release:
            return []
        payload = write_contributors(Writer(), contributors, self.clients).u64_array(encoded_sum).finish()
        out = Envelope(PROTOCOL, Stage.RESULT, self.run_id, self.party_id, SERVER, payload)
        return [Outgoing(out, Exposure.aggregate(len(contributors), self.spec.length))]

    def _round(self, values: npt.NDArray[np.float64], contributors: int) -> tuple[npt.NDArray[np.uint64], float]:
        """Nearest integers, after checking the decryption error is one honest sums can have."""
        top = contributors * self.spec.entry_max
        rounded = np.rint(values)
        error = float(np.max(np.abs(values - rounded)))
        if error > self.params.error_bound(contributors, float(top)):
            raise CiphertextError("the aggregate decrypts with more error than honest ciphertexts have")
        if rounded.min() < 0 or rounded.max() > top:
            raise CiphertextError(f"the aggregate decrypts outside [0, {top}]")
        return rounded.astype(np.uint64), error


class CkksServer(ServerParty):
    def __init__(self, *, run_id: bytes, spec: VectorSpec, context: raw.PublicContext,
                 clients: tuple[PartyId, ...], decryptors: tuple[PartyId, ...], reveal: Reveal) -> None:
        super().__init__()
        self.run_id, self.spec, self.context = run_id, spec, context
        self.clients, self.decryptors, self.reveal = clients, decryptors, reveal
        self.sizes = context.params.chunk_sizes(spec.length)
        self.releaser: PartyId | None = None
        self.gate = StageGate(run_id, PROTOCOL, SERVER)
        self.gate.open = {Stage.UPLOAD}
        self.aggregate: list[raw.CkksVector] | None = None
        self.stage = Stage.UPLOAD

    def receive(self, env: Envelope) -> list[Outgoing]:
        if env.stage == Stage.UPLOAD:
            self.gate.check(env, allowed_senders=self.clients)
            with self.timed("aggregate"):
                reader = Reader(_verified(env.payload))
                streams = _read_ciphertexts(reader, self.context, len(self.sizes))
                reader.end()
                vectors = [self.context.load(s, size) for s, size in zip(streams, self.sizes)]
                if self.aggregate is None:
                    self.aggregate = vectors
                else:
                    self.context.add_into(self.aggregate, vectors)
            self.gate.record(env)
            self.contributors = tuple(sorted(self.gate.senders(Stage.UPLOAD)))
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
        if self.stage != Stage.UPLOAD:
            raise AbortedError("the key holder did not release the sum (lost or refused)")
        if self.aggregate is None:
            raise AbortedError("no client uploaded")
        self.stage = Stage.AGGREGATE
        self.gate.open = set()
        # One decryptor releases the sum to the server when the server is to learn it: the
        # agent (lost agent = abort), or with a shared key the first surviving contributor.
        if len(self.decryptors) == 1 or self.reveal.server:
            self.releaser = self.decryptors[0] if len(self.decryptors) == 1 else self.contributors[0]
        streams = [self.context.dump(v) for v in self.aggregate]
        head = write_contributors(Writer(), self.contributors, self.clients).finish()
        body = _write_ciphertexts(Writer().raw(head), self.context, streams)
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

    def _broadcast_result(self, encoded_sum: npt.NDArray[np.uint64]) -> list[Outgoing]:
        payload = write_contributors(Writer(), self.contributors, self.clients).u64_array(encoded_sum).finish()
        exposure = Exposure.aggregate(len(self.contributors), self.spec.length)
        return [Outgoing(Envelope(PROTOCOL, Stage.RESULT, self.run_id, SERVER, pid, payload), exposure)
                for pid in self.clients if pid not in self.decryptors]


# --- the session --------------------------------------------------------------------------------

class CkksSum(SecureSum):
    """CKKS on TenSEAL: the server adds ciphertexts under a public context, a client-side key holder decrypts."""

    name = PROTOCOL
    stage_names = stage_names(Stage)

    def __init__(self, *, clients: tuple[PartyId, ...] | list[PartyId], transport: Transport | None = None,
                 options: CkksOptions = CkksOptions()) -> None:
        super().__init__(clients=clients, transport=transport)
        self.options = options
        self.params = options.parameters
        self.agent: PartyId | None = None
        self.fingerprint: bytes | None = None
        self.server_context: raw.PublicContext | None = None
        self._client_keys: dict[PartyId, ClientKeys] = {}
        self._loaded: dict[bytes, raw.PublicContext | raw.SecretContext] = {}
        self.last_decryption_error: float | None = None
        """CKKS error (encoded units) the decryptors of the latest sum met before rounding."""

    @property
    def ready(self) -> bool:
        return self.server_context is not None

    def setup(self, *, round: int = -1, statistic: str = "setup") -> None:
        """The agent makes the keys; the public context reaches the server and the clients
        through the transport, and with ``keyholder="all"`` the secret key reaches every client
        sealed. Each party loads (and so validates) the bytes it received."""
        public_bytes, secret_bytes = raw.generate(self.params)
        run_id = secrets.token_bytes(16)
        ctx = self.context(run_id=run_id, round=round, statistic=statistic)
        self.agent = secrets.choice(self.clients)
        agent_public = self._public(public_bytes)
        received = self._carry(ctx, Stage.CONTEXT, self.agent, SERVER, public_bytes, Exposure.public())
        server_context = raw.PublicContext(received, self.params)  # the server's own copy, never cached
        if server_context.fingerprint != agent_public.fingerprint:
            raise ProtocolError("public context altered in transit")
        keys: dict[PartyId, ClientKeys] = {}
        for pid in self.clients:
            if pid == self.agent:
                keys[pid] = ClientKeys(agent_public)
                keys[pid].secret = self._secret(secret_bytes, agent_public)
                continue
            delivered = self._carry(ctx, Stage.CONTEXT, SERVER, pid, received, Exposure.public())
            public = self._public(delivered)
            if public.fingerprint != agent_public.fingerprint:
                raise ProtocolError("public context altered in transit")
            keys[pid] = ClientKeys(public)
        self._client_keys = keys
        if self.options.keyholder == "all":
            self._share_secret_key(ctx, secret_bytes)
        self.server_context = server_context
        self.fingerprint = agent_public.fingerprint

    def _public(self, data: bytes) -> raw.PublicContext:
        """Load a public context; clients that received identical bytes share the loaded object."""
        key = b"public" + hashlib.sha256(data).digest()
        loaded = self._loaded.get(key)
        if not isinstance(loaded, raw.PublicContext):
            loaded = raw.PublicContext(data, self.params)
            self._loaded[key] = loaded
        return loaded

    def _secret(self, data: bytes, public: raw.PublicContext) -> raw.SecretContext:
        key = b"secret" + hashlib.sha256(public.fingerprint + data).digest()
        loaded = self._loaded.get(key)
        if not isinstance(loaded, raw.SecretContext):
            loaded = raw.SecretContext(data, public)
            self._loaded[key] = loaded
        return loaded

    def _share_secret_key(self, ctx: RunContext, secret_bytes: bytes) -> None:
        """Agent seals the secret key to each client; the server relays ciphertexts it cannot open."""
        assert self.agent is not None
        agent_channel = ChannelKey()
        channels = {pid: ChannelKey() for pid in self.clients if pid != self.agent}
        bundle = Writer().blob(agent_channel.public_bytes)
        for pid, channel in channels.items():
            self._carry(ctx, Stage.ADVERTISE, pid, SERVER, channel.public_bytes, Exposure.public())
            bundle.u32(pid).raw(channel.public_bytes)
        self._carry(ctx, Stage.CHANNEL_KEYS, SERVER, self.agent, bundle.finish(), Exposure.public())
        for pid, channel in channels.items():
            associated = ctx.run_id + self.agent.to_bytes(4, "big") + pid.to_bytes(4, "big")
            sealed = seal(agent_channel, channel.public_bytes, secret_bytes, associated=associated,
                          purpose=b"ckks-sk")
            relayed = self._carry(ctx, Stage.SEALED_KEY, self.agent, SERVER, sealed, Exposure.sealed(self.agent))
            delivered = self._carry(ctx, Stage.SEALED_KEY, SERVER, pid, relayed, Exposure.sealed(self.agent))
            opened = open_sealed(channel, agent_channel.public_bytes, delivered, associated=associated,
                                 purpose=b"ckks-sk")
            keys = self._client_keys[pid]
            keys.secret = self._secret(opened, keys.public)

    def _carry(self, ctx: RunContext, stage: Stage, sender: PartyId, receiver: PartyId,
               payload: bytes, exposure: Exposure) -> bytes:
        env = Envelope(PROTOCOL, stage, ctx.run_id, sender, receiver, payload)
        delivered = self.transport.carry(Outgoing(env, exposure), ctx)
        if delivered is None or delivered.stage != stage or delivered.receiver != receiver:
            raise AbortedError(f"key set-up message {stage.name.lower()} was lost or misrouted")
        return delivered.payload

    def client_keys(self, party: PartyId) -> ClientKeys:
        return self._client_keys[party]

    def error_bound(self, spec: VectorSpec, contributors: int) -> float:
        """``eps(n, M)`` in the spec's units: how far a decrypted sum can be from the exact
        encoded sum before rounding (rounding removes it; see :meth:`tolerance`)."""
        return self.params.error_bound(contributors, float(contributors * spec.entry_max)) / spec.scale

    def tolerance(self, spec: VectorSpec, contributors: int) -> float:
        """Encoding rounding only, ``n * 2**-(frac_bits+1)`` (0 for integers).

        CKKS's own error, at most :meth:`error_bound` (``eps <= 1/4`` encoded units, which
        :func:`check_capacity` enforces before a run), is removed by rounding the decrypted sum
        to the integer grid of the encoding, so the result equals the exact sum of the encoded
        inputs.
        """
        check_capacity(self.params, spec)
        return super().tolerance(spec, contributors)

    def _outcome(self, server: ServerParty, clients: Mapping[PartyId, Party], plan: DropoutPlan,
                 rejected: list[str], run_id: bytes, clipped: int, inputs: Mapping[PartyId, Any]) -> SumOutcome:
        errors = [p.decryption_error for p in clients.values()
                  if isinstance(p, CkksClient) and p.decryption_error is not None]
        self.last_decryption_error = max(errors) if errors else None
        return super()._outcome(server, clients, plan, rejected, run_id, clipped, inputs)

    def _build(self, *, run_id: bytes, spec: VectorSpec, encoded: Mapping[PartyId, npt.NDArray[np.uint64]],
               reveal: Reveal, round: int) -> tuple[ServerParty, dict[PartyId, Party]]:
        mode = self.options.keyholder
        if mode == "agent" and not reveal.server:
            raise ValueError("keyholder='agent' releases sums through the server; use keyholder='all' "
                             "for a sum the server must not learn")
        check_capacity(self.params, spec)
        if not self.ready:
            self.setup(round=round)
        assert self.server_context is not None and self.agent is not None
        decryptors = (self.agent,) if mode == "agent" else self.clients
        server = CkksServer(run_id=run_id, spec=spec, context=self.server_context, clients=self.clients,
                            decryptors=decryptors, reveal=reveal)
        clients: dict[PartyId, Party] = {
            pid: CkksClient(pid, run_id=run_id, spec=spec, keys=self._client_keys[pid],
                            encoded=encoded.get(pid), clients=self.clients, decrypts=pid in decryptors)
            for pid in self.clients
        }
        return server, clients
