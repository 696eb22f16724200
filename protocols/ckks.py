"""CKKS secure sum (TenSEAL) with a client as key holder.

Roles, as for :mod:`protocols.paillier`: clients encrypt; the server only adds
ciphertexts, holding a *public context* (parameters and public key — no secret key,
no Galois or relinearisation keys, which a sum does not need); the key holder decrypts.
Key holder modes:

* ``agent`` (default): one client, picked with ``secrets``, generates the keys and
  decrypts the aggregate; it releases the sum through the server, so the server
  learns the sum (only for statistics the server may learn);
* ``all``: the agent shares the secret key with every client over sealed channels
  relayed by the server; the server relays the aggregate ciphertexts to the run's
  contributors, each of which decrypts it itself, so the server learns the sum only if asked.

There is no server-held key mode: CKKS here exists to keep inputs from the server. The key
set-up is a run of messages between the parties (:mod:`protocols.ckks_setup`); payloads and
their strict parsers are in :mod:`protocols.ckks_messages`.

**A sum**, one exchange per stage: ``open`` goes to the participants (and the agent in agent
mode); participants answer ``upload``. The server adds the ciphertexts and sends
``aggregate`` to the decryptors (the agent; or with a shared key the contributors, or only
the releaser when clients are not to learn the sum). The releaser answers ``result`` (the
rounded encoded sum), and in agent mode the server relays it to the other contributors when
clients are to learn it. Results and aggregates reach the run's participants only.

**Chunking.** A vector of length ``d`` becomes ``ceil(d / slots)`` ciphertexts, each
using all ``slots = N/2`` slots (the last one the remainder). An upload is the key
fingerprint, a count, and per ciphertext a 4-byte length and SEAL's serialisation of
the ciphertext — no context, no per-ciphertext wrapper — plus a 16-byte checksum.

**Exact sums.** Clients encrypt their *encoded* entries (the integers of
:func:`~protocols.encoding.encode`, in ``[0, entry_max]``) as CKKS reals. The key holder
decrypts ``sum + e`` with ``|e| <= eps(n, M)`` (see
:meth:`~protocols.primitives.ckks.CkksParameters.error_bound`; ``M = n * entry_max``) and
rounds to the nearest integer. A spec for which ``eps(summands, M) > 1/4`` is refused
(:class:`~protocols.errors.CapacityError`), so the rounding is exact and the decoded sum is
bit-for-bit the one ``plain``, ``paillier`` and ``masking`` produce: its error against the
real-valued sum is the encoding's ``n * 2**-(frac_bits+1)`` and CKKS adds nothing
(:meth:`CkksServerSession.tolerance`). A decryption error above ``eps`` means a corrupted
aggregate and is refused. Rounding also means what the key holder releases is a function of
the inputs alone: no decryption noise reaches the server, which could otherwise use it with
the aggregate ciphertext to attack the secret key (Li–Micciancio, IND-CPA-D).

**Integrity.** Every upload carries a key fingerprint (SHA-256 of the public context),
checked before anything is parsed; a ciphertext under another context is refused with
:class:`~protocols.errors.ForeignKeyError`. Ciphertext and result payloads end with a
checksum that catches corruption in transit; it is not authentication — a party that can
rewrite an upload can rewrite its checksum, and CKKS ciphertexts are malleable, so
authenticity is the transport's job.
"""

from __future__ import annotations

import dataclasses
import hmac
import secrets
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from .base import Outgoing, Party, Reveal, ServerParty, StageGate
from .ckks_messages import (
    KEYHOLDERS,
    MAX_CONTEXT,
    PROTOCOL,
    SetupParams,
    Stage,
    SumParams,
    aggregate_for,
    read_aggregate,
    read_result,
    read_upload,
    request_digest,
    write_aggregate,
    write_result,
    write_upload,
)
from .ckks_setup import CkksSetupClient, CkksSetupServer, ClientKeys
from .encoding import VectorSpec, decode_sum
from .errors import (
    AbortedError,
    CapacityError,
    CiphertextError,
    EncodingError,
    ForeignKeyError,
    PolicyError,
    StageError,
    WireError,
)
from .primitives import ckks as raw
from .session import ClientSession, ServerSession, SumRequest, as_encoded
from .transcript import Exposure
from .wire import SERVER, Envelope, PartyId, Reader, Writer

__all__ = [
    "PROTOCOL", "ROUNDING_MARGIN", "CkksClient", "CkksClientSession", "CkksOptions", "CkksServer",
    "CkksServerSession", "ClientKeys", "Stage", "check_capacity",
]

Keyholder = Literal["agent", "all"]
ROUNDING_MARGIN = 0.25
"""Largest CKKS error (in encoded units) a spec may need; rounding is exact below 1/2."""
_SNAPSHOT_VERSION = 1


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
        if self.keyholder not in KEYHOLDERS:
            raise ValueError(f"keyholder must be 'agent' or 'all', got {self.keyholder!r}")
        bits = tuple(self.coeff_mod_bit_sizes)
        object.__setattr__(self, "coeff_mod_bit_sizes", bits)
        object.__setattr__(
            self, "parameters", raw.CkksParameters(self.poly_modulus_degree, bits, self.scale_bits)
        )


def _options(options: Any) -> CkksOptions:
    if options is None:
        return CkksOptions()
    if not isinstance(options, CkksOptions):
        raise TypeError(f"CKKS takes CkksOptions, got {type(options).__name__}")
    return options


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


def _decoded(spec: VectorSpec, encoded_sum: npt.NDArray[np.uint64], contributors: int) -> npt.NDArray[np.float64]:
    try:
        return decode_sum(spec, encoded_sum, contributors=contributors)
    except EncodingError as error:
        raise WireError(f"released sum is impossible: {error}") from error


# --- parties of one sum -------------------------------------------------------------------------

class CkksClient(Party):
    """A client's side of one sum: upload, and decrypt the aggregate when it holds the key."""

    def __init__(self, party_id: PartyId, *, run_id: bytes, spec: VectorSpec, keys: ClientKeys,
                 encoded: npt.NDArray[np.uint64] | None, clients: tuple[PartyId, ...]) -> None:
        super().__init__(party_id)
        self.run_id, self.spec, self.keys = run_id, spec, keys
        self.encoded, self.clients = encoded, clients
        self.params = keys.public.params
        self.sizes = self.params.chunk_sizes(spec.length)
        self.decryption_error: float | None = None
        """Largest distance of a decrypted slot from its integer, i.e. the CKKS error actually met."""
        self.gate = StageGate(run_id, PROTOCOL, party_id)
        # A key holder learns the sum by decrypting, never from a released one it cannot check.
        self.gate.open = {Stage.AGGREGATE} if keys.secret is not None else {Stage.RESULT}

    def start(self) -> list[Outgoing]:
        if self.encoded is None:
            return []
        with self.timed("upload"):
            payload = write_upload(self.keys.public, self.keys.public.encrypt(self.encoded.astype(np.float64)))
        env = Envelope(PROTOCOL, Stage.UPLOAD, self.run_id, self.party_id, SERVER, payload)
        return [Outgoing(env, Exposure.ciphertext(self.spec.length, self.party_id))]

    def receive(self, env: Envelope) -> list[Outgoing]:
        self.gate.check(env, allowed_senders=[SERVER])
        if env.stage == Stage.AGGREGATE:
            return self._decrypt_aggregate(env)
        released = read_result(env.payload, self.spec, self.clients)
        result = _decoded(self.spec, released.encoded_sum, len(released.contributors))
        self.gate.record(env)
        self.gate.open = set()
        self.result, self.contributors = result, released.contributors
        return []

    def _decrypt_aggregate(self, env: Envelope) -> list[Outgoing]:
        release, contributors, streams = read_aggregate(env.payload, self.keys.public, self.spec, self.clients,
                                                        len(self.sizes))
        secret = self.keys.secret
        assert secret is not None  # AGGREGATE opens only at a client holding the key
        with self.timed("finalize"):
            encoded_sum, error = self._round(secret.decrypt(streams, self.sizes), len(contributors))
            result = _decoded(self.spec, encoded_sum, len(contributors))
        self.gate.record(env)
        self.gate.open = set()
        self.result, self.contributors, self.decryption_error = result, contributors, error
        if not release:
            return []
        out = Envelope(PROTOCOL, Stage.RESULT, self.run_id, self.party_id, SERVER,
                       write_result(contributors, encoded_sum, self.clients))
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
    """The server's side of one sum: add ciphertexts, hand the aggregate to the decryptors,
    and (agent mode) relay the released sum to the contributors."""

    def __init__(self, *, run_id: bytes, request: SumRequest, clients: tuple[PartyId, ...],
                 context: raw.PublicContext, agent: PartyId, shared: bool) -> None:
        audience = request.participants if shared else (*request.participants, agent)
        super().__init__(protocol=PROTOCOL, run_id=run_id, request=request, clients=clients, audience=audience)
        assert request.spec is not None
        self.spec, self.reveal, self.participants = request.spec, request.reveal, request.participants
        self.context, self.agent, self.shared = context, agent, shared
        self.sizes = context.params.chunk_sizes(self.spec.length)
        self.releaser: PartyId | None = None
        self.decryptors: tuple[PartyId, ...] = ()
        self.gate = StageGate(run_id, PROTOCOL, SERVER)
        self.gate.open = {Stage.UPLOAD}
        self.aggregate: list[raw.CkksVector] | None = None
        self.stage = Stage.UPLOAD

    def receive(self, env: Envelope) -> list[Outgoing]:
        if env.stage == Stage.UPLOAD:
            self.gate.check(env, allowed_senders=self.participants)
            with self.timed("aggregate"):
                streams = read_upload(env.payload, self.context, len(self.sizes))
                vectors = [self.context.load(s, size) for s, size in zip(streams, self.sizes, strict=True)]
                if self.aggregate is None:
                    self.aggregate = vectors
                else:
                    self.context.add_into(self.aggregate, vectors)
            self.gate.record(env)
            self.contributors = tuple(sorted(self.gate.senders(Stage.UPLOAD)))
            return []
        self.gate.check(env, allowed_senders=[] if self.releaser is None else [self.releaser])
        released = read_result(env.payload, self.spec, self.clients)
        if released.contributors != self.contributors:
            raise StageError("the key holder released a sum over other contributors than were aggregated")
        result = _decoded(self.spec, released.encoded_sum, len(released.contributors))
        self.gate.record(env)
        self.gate.open = set()
        self.result = result
        self.finished = True
        waiting = [pid for pid in self.contributors if pid not in self.decryptors] if self.reveal.clients else []
        payload = write_result(self.contributors, released.encoded_sum, self.clients)
        exposure = Exposure.aggregate(len(self.contributors), self.spec.length)
        return [Outgoing(Envelope(PROTOCOL, Stage.RESULT, self.run_id, SERVER, pid, payload), exposure)
                for pid in waiting]

    def advance(self) -> list[Outgoing]:
        if self.stage != Stage.UPLOAD:
            raise AbortedError("the key holder did not release the sum (lost or refused)")
        if self.aggregate is None:
            raise AbortedError("no client uploaded")
        self.stage = Stage.AGGREGATE
        self.gate.open = set()
        # The agent decrypts and releases (a lost agent aborts the run). With a shared key the
        # contributors decrypt, or only the releaser when the clients are not to learn the sum;
        # the first contributor releases it when the server is to learn it.
        if not self.shared:
            self.decryptors, self.releaser = (self.agent,), self.agent
        else:
            first = self.contributors[0]
            self.decryptors = self.contributors if self.reveal.clients else (first,)
            self.releaser = first if self.reveal.server else None
        body = write_aggregate(self.context, self.contributors, self.clients,
                               [self.context.dump(v) for v in self.aggregate])
        exposure = Exposure.aggregate(len(self.contributors), self.spec.length)
        out = [Outgoing(Envelope(PROTOCOL, Stage.AGGREGATE, self.run_id, SERVER, pid,
                                 aggregate_for(body, release=pid == self.releaser)), exposure)
               for pid in self.decryptors]
        if self.releaser is not None:
            self.gate.open = {Stage.RESULT}
        else:
            self.finished = True
        return out


# --- sessions -----------------------------------------------------------------------------------

class CkksServerSession(ServerSession):
    """The server's long-lived CKKS state: its own copy of the public context and the agent's id."""

    name = PROTOCOL

    def __init__(self, *, clients: Any, options: Any = None) -> None:
        super().__init__(clients=clients, options=_options(options))
        self.options: CkksOptions
        self.agent: PartyId | None = None
        self.context: raw.PublicContext | None = None

    @property
    def ready(self) -> bool:
        return self.context is not None

    @property
    def fingerprint(self) -> bytes | None:
        return None if self.context is None else self.context.fingerprint

    def setup(self, *, run_id: bytes, round: int = -1, statistic: str = "setup") -> ServerParty | None:
        """A set-up run with a fresh agent picked with ``secrets``; ``None`` once keys are set up."""
        if self.ready:
            return None
        params = SetupParams(secrets.choice(self.clients), self.options.keyholder, self.options.parameters)
        request = SumRequest(kind="setup", statistic=statistic, round=round, spec=None, reveal=Reveal(),
                             participants=self.clients, params=params.to_bytes(), session=self.tag)
        return CkksSetupServer(run_id=run_id, request=request, clients=self.clients, params=params,
                               on_done=self._install)

    def _install(self, context: raw.PublicContext, agent: PartyId) -> None:
        self.context, self.agent = context, agent

    def check(self, *, spec: VectorSpec, reveal: Reveal) -> None:
        if self.options.keyholder == "agent" and not reveal.server:
            raise ValueError("keyholder='agent' releases sums through the server; use keyholder='all' "
                             "for a sum the server must not learn")
        check_capacity(self.options.parameters, spec)

    def params(self, request: SumRequest) -> bytes:
        assert self.context is not None and self.agent is not None
        return SumParams(self.context.fingerprint, self.agent, request_digest(request, self.clients)).to_bytes()

    def open(self, *, run_id: bytes, request: SumRequest) -> ServerParty:
        if request.kind != "sum" or request.spec is None:
            raise ValueError("CKKS runs sums (its set-up comes from setup())")
        self.check(spec=request.spec, reveal=request.reveal)
        if self.context is None or self.agent is None:
            raise AbortedError("CKKS keys are not set up: run the set-up first")
        request = dataclasses.replace(request, session=self.tag)
        request = dataclasses.replace(request, params=self.params(request))
        return CkksServer(run_id=run_id, request=request, clients=self.clients, context=self.context,
                          agent=self.agent, shared=self.options.keyholder == "all")

    def error_bound(self, spec: VectorSpec, contributors: int) -> float:
        """``eps(n, M)`` in the spec's units: how far a decrypted sum can be from the exact
        encoded sum before rounding (rounding removes it; see :meth:`tolerance`)."""
        return self.options.parameters.error_bound(contributors, float(contributors * spec.entry_max)) / spec.scale

    def tolerance(self, spec: VectorSpec, contributors: int) -> float:
        """Encoding rounding only, ``n * 2**-(frac_bits+1)`` (0 for integers).

        CKKS's own error, at most :meth:`error_bound` (``eps <= 1/4`` encoded units, which
        :func:`check_capacity` enforces before a run), is removed by rounding the decrypted sum
        to the integer grid of the encoding, so the result equals the exact sum of the encoded
        inputs.
        """
        check_capacity(self.options.parameters, spec)
        return super().tolerance(spec, contributors)


class CkksClientSession(ClientSession):
    """One client's long-lived CKKS state: the keys it received or made, its own objects only."""

    name = PROTOCOL

    def __init__(self, party: PartyId, *, clients: Any, options: Any = None) -> None:
        super().__init__(party, clients=clients, options=_options(options))
        self.options: CkksOptions
        self.keys: ClientKeys | None = None

    def _install(self, keys: ClientKeys) -> None:
        self.keys = keys

    def join(self, *, run_id: bytes, request: SumRequest, values: npt.NDArray[Any] | None) -> Party:
        if request.kind == "setup":
            params = SetupParams.from_bytes(request.params, clients=self.clients, keyholder=self.options.keyholder,
                                            parameters=self.options.parameters)
            return CkksSetupClient(self.party_id, run_id=run_id, params=params, clients=self.clients,
                                   install=self._install)
        if request.kind != "sum" or request.spec is None:
            raise WireError(f"CKKS has no {request.kind!r} runs")
        run = SumParams.from_bytes(request.params)
        keys = self.keys
        if keys is None:
            raise StageError("no CKKS keys here: the set-up did not reach this client")
        if run.fingerprint != keys.public.fingerprint:
            raise ForeignKeyError("the run is under other CKKS keys than this client holds")
        if run.agent != keys.agent:
            raise StageError(f"the run names agent {run.agent}, this client's keys came from {keys.agent}")
        if not hmac.compare_digest(run.request_digest, request_digest(request, self.clients)):
            raise WireError("the run's request does not match its digest (altered in transit)")
        check_capacity(self.options.parameters, request.spec)
        return CkksClient(self.party_id, run_id=run_id, spec=request.spec, keys=keys,
                          encoded=as_encoded(values, request.spec), clients=self.clients)

    def to_bytes(self) -> bytes:
        """Version, then (when keys are set up) the agent, the public context and the secret key if held."""
        writer = Writer().u8(_SNAPSHOT_VERSION)
        keys = self.keys
        if keys is None:
            return writer.u8(0).finish()
        writer.u8(1).u32(keys.agent).blob(keys.public.data)
        if keys.secret_bytes is None:
            return writer.u8(0).finish()
        return writer.u8(1).blob(keys.secret_bytes).finish()

    def load_bytes(self, data: bytes) -> None:
        """Restore :meth:`to_bytes`, reloading (so revalidating) every key; nothing changes on error."""
        reader = Reader(data)
        if reader.u8() != _SNAPSHOT_VERSION:
            raise WireError("unknown CKKS client snapshot version")
        has_keys = reader.u8()
        if has_keys == 0:
            reader.end()
            self.keys = None
            return
        if has_keys != 1:
            raise WireError("bad key flag in a CKKS client snapshot")
        agent, public_bytes = reader.u32(), reader.blob(max_len=MAX_CONTEXT)
        has_secret = reader.u8()
        if has_secret not in (0, 1):
            raise WireError("bad secret-key flag in a CKKS client snapshot")
        secret_bytes = reader.blob(max_len=MAX_CONTEXT) if has_secret else None
        reader.end()
        if agent not in self.clients:
            raise WireError(f"snapshot names agent {agent}, not a client of this protocol")
        decrypts = self.options.keyholder == "all" or agent == self.party_id
        if decrypts != (secret_bytes is not None):
            raise PolicyError("snapshot's secret key does not match this client's role "
                              f"(keyholder={self.options.keyholder!r}, agent {agent})")
        public = raw.PublicContext(public_bytes, self.options.parameters)
        secret = None if secret_bytes is None else raw.SecretContext(secret_bytes, public)
        self.keys = ClientKeys(agent, public, secret, secret_bytes)
