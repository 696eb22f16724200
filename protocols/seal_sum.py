"""The secure sum of the SEAL-based protocols, ``ckks`` and ``bfv``, with a client as key holder.

One implementation, two schemes (:mod:`protocols.ckks`, :mod:`protocols.bfv` supply a
:class:`SumScheme` and their options). Roles, as for :mod:`protocols.paillier`: clients encrypt;
the server only adds ciphertexts, holding *public contexts* (parameters and public key — no
secret key, no Galois or relinearisation keys, which a sum does not need); the key holder
decrypts. Key holder modes:

* ``agent`` (default): one client, picked with ``secrets``, generates the keys and decrypts
  the aggregate; it releases the sum through the server, so the server learns the sum (only
  for statistics the server may learn);
* ``all``: the agent shares the secret key with every client over sealed channels relayed by
  the server; the server relays the aggregate ciphertexts to the run's contributors, each of
  which decrypts it itself, so the server learns the sum only if asked.

There is no server-held key mode: these protocols exist to keep inputs from the server.

**Parameters from the spec, one key set per parameter set.** Every sum's parameters (ring,
modulus chain, CKKS scale or BFV plaintext modulus) are a public function of its
:class:`~protocols.encoding.VectorSpec` and the protocol options
(:meth:`SealOptions.parameters_for`): the smallest that carry the sum exactly at 128-bit
security, or fixed ones the options name. Server and clients derive them each on its own; a
sum's ``open`` carries them (so they are in the transcript), and a client refuses a run under
other parameters than it derives. Keys belong to one parameter set: :meth:`SealServerSession.check`
notes the parameter set of the sum about to open (``ready`` is whether it has keys), and
:meth:`SealServerSession.setup` runs its key set-up (:mod:`protocols.seal_setup`, messages
between the parties) when it has none yet — lazily, so a run sets up exactly the key sets its
statistics need.

**A sum**, one exchange per stage: ``open`` goes to the participants (and the agent in agent
mode); participants answer ``upload`` (verified sums: then ``challenge`` and ``tag``, below).
The server adds the ciphertexts and sends ``aggregate``
to the decryptors (the agent; or with a shared key the contributors, or only the releasers when
clients are not to learn the sum). The releasers (the agent; with a shared key the first
:data:`RELEASERS` contributors, when the server is to learn the sum: one failing costs nothing,
two that disagree abort) answer ``result`` (the encoded sum), and in
agent mode the server relays it to the other contributors when clients are to learn it.
Results and aggregates reach the run's participants only.

**Uploads.** A vector of length ``d`` becomes ``ceil(d / N)`` ciphertexts (CKKS packs two
entries per complex slot, BFV one per slot). A client that holds the secret key (every client
with ``keyholder="all"``; the agent) encrypts with it unless the options say
``symmetric=False``: a fresh symmetric-key ciphertext travels *seeded*, half the bytes of a
public-key one, and carries less noise. The server knows who holds the key, so it expects
exactly the seeded form from them and the full form from the others. An upload is the key
fingerprint, a count, and per ciphertext a 4-byte length and SEAL's serialisation, plus a
16-byte checksum (:mod:`protocols.seal_messages`).

**Exact sums.** Clients encrypt their *encoded* entries (the integers of
:func:`~protocols.encoding.encode`, in ``[0, entry_max]``). CKKS: the key holder decrypts
``sum + e`` with ``|e| <= eps`` (:meth:`~protocols.primitives.ckks.CkksParameters.error_bound`)
and rounds; parameters keep ``eps <= 1/4``, so the result is the exact encoded sum, and a
decryption farther from the integers than ``eps`` means a corrupted or foreign aggregate and is
refused. Rounding also means what the key holder releases is a function of the inputs alone
(no decryption noise reaches the server: IND-CPA-D, Li–Micciancio). BFV: the plaintext
modulus exceeds every possible sum, the data modulus its worst-case noise, and an aggregate
whose noise budget is below an honest one's is refused. Either way the decoded sum is bit for
bit the one ``plain``, ``paillier`` and ``masking`` produce.

**Integrity.** Every upload carries a key fingerprint (SHA-256 of the public context), checked
before anything is parsed; a ciphertext under another key set is refused with
:class:`~protocols.errors.ForeignKeyError`. Ciphertext and result payloads end with a checksum
that catches corruption in transit; it is not authentication — ciphertexts are malleable.

**Verified aggregates** (``verify_aggregate``; on by default when the parties have registered
signing keys, e.g. ``make_sum(..., authenticate=True)``). The server computes the aggregate,
so it can alter it (add an encryption of any delta, or pass one upload off as the sum), and a
key holder that refuses what decrypts out of bound tells it one bit about the plaintext.
Verified, the server cannot: after the uploads it sends each contributor ``challenge`` (a
digest of the aggregate as the decryptors will receive it); each contributor answers ``tag``,
:data:`~protocols.primitives.seal_tags.FUNCTIONALS` random linear functionals of its *own*
upload drawn from that digest (:mod:`protocols.primitives.seal_tags`), signed with its
registered Ed25519 key. The server checks the signatures and that the tags add up to the
aggregate's; a contributor that sends none or a wrong one is left out with the reason, the
rest re-added and challenged again (at most
:data:`~protocols.seal_messages.MAX_ATTEMPTS` times). The decryptors get the aggregate with
every contributor's signed tags and decrypt only if every signature verifies and the tags add
up to the aggregate's own — otherwise a :class:`TamperedAggregateError` naming the server,
decided on ciphertexts and signatures, before decrypting. A decryptor never receives one upload
(it could decrypt it); a tag is masked by the uniform half of its ciphertext. What remains:
a contributor's *own* ciphertext may hold an out-of-bound plaintext, and the decryptor's
refusal of such a sum still depends on the others' inputs (see ``docs/threat-model.md``).
"""

from __future__ import annotations

import dataclasses
import hmac
import secrets
from abc import abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import numpy as np
import numpy.typing as npt

from .base import Outgoing, Party, Reveal, ServerParty, StageGate
from .encoding import VectorSpec, decode_sum
from .errors import (
    AbortedError,
    AuthenticationError,
    CapacityError,
    EncodingError,
    ForeignKeyError,
    PolicyError,
    ReplayError,
    StageError,
    WireError,
)
from .identity import Directory, Identity
from .primitives import seal as raw
from .primitives import seal_tags as tags
from .seal_messages import (
    KEYHOLDERS,
    MAX_ATTEMPTS,
    MAX_CONTEXT,
    MAX_PARAMS,
    SetupParams,
    Stage,
    SumParams,
    aggregate_digest,
    aggregate_for,
    read_aggregate,
    read_challenge,
    read_result,
    read_tag,
    read_upload,
    read_verified_aggregate,
    release_statement,
    request_digest,
    split_signed,
    tag_statement,
    verified_aggregate_for,
    write_aggregate,
    write_challenge,
    write_result,
    write_tag,
    write_upload,
)
from .seal_setup import ClientKeys, Scheme, SetupClient, SetupServer
from .session import ClientSession, ServerSession, SumRequest, as_encoded
from .transcript import Exposure
from .wire import SERVER, Envelope, PartyId, Reader, Writer, party_name

__all__ = [
    "MAX_KEYSETS", "ClientKeys", "Decryption", "Keyholder", "SealClient", "SealClientSession", "SealOptions",
    "SealServer", "SealServerSession", "Stage", "SumScheme", "TamperedAggregateError",
]

Keyholder = Literal["agent", "all"]
MAX_KEYSETS = 32
"""Key sets a client keeps at once; a set-up for one more is refused (``PolicyError``)."""
RELEASERS = 2
"""With a shared key, contributors asked to release the sum to the server: one failing to
decrypt costs nothing, two releasing different sums abort (as :mod:`protocols.paillier_sum`)."""
_SNAPSHOT_VERSION = 2


class SealOptions:
    """What both schemes' frozen options provide (mixed into ``CkksOptions``, ``BfvOptions``)."""

    keyholder: Keyholder
    symmetric: bool
    poly_modulus_degree: int | None
    coeff_mod_bit_sizes: tuple[int, ...] | None
    verify_aggregate: bool | None

    def _check_common(self) -> None:
        if self.keyholder not in KEYHOLDERS:
            raise ValueError(f"keyholder must be 'agent' or 'all', got {self.keyholder!r}")
        if not isinstance(self.symmetric, bool):
            raise TypeError(f"symmetric must be true or false, got {self.symmetric!r}")
        if self.verify_aggregate is not None and not isinstance(self.verify_aggregate, bool):
            raise TypeError(f"verify_aggregate must be true, false or unset, got {self.verify_aggregate!r}")

    def verifies(self, directory: Directory | None) -> bool:
        """Whether sums run verified: as the options say, else (unset) whenever the parties have
        registered signing keys (``make_sum(..., authenticate=True)`` registers them)."""
        verify = directory is not None if self.verify_aggregate is None else self.verify_aggregate
        if verify and directory is None:
            raise ValueError("verify_aggregate needs registered signing keys (make_sum(..., authenticate=True) "
                             "or identities=True)")
        return verify

    def _fix_parameters(self, scheme: str, extra: str, make: Callable[[int, tuple[int, ...], Any], Any]) -> None:
        """Set ``parameters`` when the ring, the modulus chain and the scheme's ``extra`` field are
        all given (one fixed set); refuse a partial set or an unknown ring; else each sum derives its own."""
        self._check_common()
        bits = self.coeff_mod_bit_sizes
        if bits is not None:
            bits = tuple(bits)
            object.__setattr__(self, "coeff_mod_bit_sizes", bits)
        value = getattr(self, extra)
        if (bits is None) != (value is None) or (bits is not None and self.poly_modulus_degree is None):
            raise ValueError(f"fixed {scheme} parameters need poly_modulus_degree, coeff_mod_bit_sizes and {extra} "
                             "together; give none (or only poly_modulus_degree) to derive them from each sum")
        if bits is not None and self.poly_modulus_degree is not None:
            object.__setattr__(self, "parameters", make(self.poly_modulus_degree, bits, value))
        elif self.poly_modulus_degree is not None and self.poly_modulus_degree not in raw.RINGS:
            raise ValueError(f"poly_modulus_degree must be one of {list(raw.RINGS)}, got {self.poly_modulus_degree!r}")

    @property
    def all_symmetric(self) -> bool:
        """Every upload is a secret-key encryption (every client holds the key and uses it)."""
        return self.symmetric and self.keyholder == "all"

    @property
    def fixed(self) -> raw.SealParameters | None:
        """The one parameter set the options name, or ``None`` when each spec gets its own."""
        return None

    @abstractmethod
    def parameters_for(self, spec: VectorSpec) -> raw.SealParameters:
        """The public parameters of a sum of ``spec`` (``CapacityError`` when none carry it exactly)."""

    @abstractmethod
    def parse_parameters(self, data: bytes) -> raw.SealParameters:
        """Strictly parsed parameters (``WireError`` otherwise)."""

    def accept(self, parameters: raw.SealParameters) -> None:
        """Refuse keys for a parameter set these options never use."""
        if self.fixed is not None and parameters != self.fixed:
            raise ForeignKeyError(f"set-up asks for other parameters ({parameters}) than this client's ({self.fixed})")


@dataclass(frozen=True)
class Decryption:
    """A key holder's decrypted aggregate: the exact encoded sum, and what it measured."""

    encoded_sum: npt.NDArray[np.uint64]
    error: float | None = None
    """CKKS: largest distance of a decrypted entry from its integer (the error actually met)."""
    budget: int | None = None
    """BFV: smallest invariant noise budget (bits) of the aggregate's ciphertexts."""


@dataclass(frozen=True)
class SumScheme(Scheme):
    """A scheme's sum: how a key holder turns a decrypted aggregate into the exact encoded sum."""

    decrypt_sum: Callable[[Any, list[bytes], list[int], Any, VectorSpec, int, bool], Decryption]
    """``(secret, streams, sizes, parameters, spec, contributors, all_symmetric)``: refuses
    (``CiphertextError``) what an honest aggregate of ``contributors`` cannot decrypt to."""


class TamperedAggregateError(AuthenticationError):
    """A verified aggregate does not match what its contributors attested: decided on
    ciphertexts and signatures only, before anything is decrypted; ``culprit`` is the party the
    evidence names (the server, which computed and relayed it)."""

    def __init__(self, culprit: PartyId, message: str) -> None:
        super().__init__(f"{party_name(culprit)}: {message}")
        self.culprit = culprit


def _primes(params: raw.SealParameters) -> tuple[int, ...]:
    """The data primes fresh ciphertexts and sums live under (the special prime left out)."""
    return raw.coeff_primes(params.poly_modulus_degree, params.coeff_mod_bit_sizes)[:-1]


def _words(context: raw.PublicKeys, streams: list[bytes]) -> list[npt.NDArray[np.uint64]]:
    """Coefficient words of full (checked or self-made) ciphertext streams."""
    params = context.params
    return [tags.coefficients(s, context.layout, degree=params.poly_modulus_degree,
                              primes=len(params.coeff_mod_bit_sizes) - 1) for s in streams]


def _upload_words(context: raw.PublicKeys, streams: list[bytes], sizes: list[int],
                  seeded: bool) -> list[npt.NDArray[np.uint64]]:
    """An upload's words as the server adds them (a seeded one expanded by loading it)."""
    if seeded:
        streams = [context.dump(context.load(s, size, seeded=True)) for s, size in zip(streams, sizes, strict=True)]
    return _words(context, streams)


def _sum_tags(values: list[npt.NDArray[np.uint64]], primes: tuple[int, ...]) -> npt.NDArray[np.uint64]:
    total = np.zeros((tags.FUNCTIONALS, len(primes)), dtype=object)
    for v in values:
        total = total + v.astype(object)
    reduced: npt.NDArray[np.uint64] = (total % np.array(primes, dtype=object)).astype(np.uint64)
    return reduced


def _decoded(spec: VectorSpec, encoded_sum: npt.NDArray[np.uint64], contributors: int) -> npt.NDArray[np.float64]:
    try:
        return decode_sum(spec, encoded_sum, contributors=contributors)
    except CapacityError:
        raise  # a possible sum float64 cannot hold exactly: refused as such, never rounded
    except EncodingError as error:
        raise WireError(f"released sum is impossible: {error}") from error


# --- parties of one sum -------------------------------------------------------------------------

class SealClient(Party):
    """A client's side of one sum: upload, attest its upload when the sum is verified, and
    decrypt the aggregate when it holds the key."""

    def __init__(self, party_id: PartyId, *, scheme: SumScheme, run_id: bytes, spec: VectorSpec,
                 params: raw.SealParameters, keys: ClientKeys, encoded: npt.NDArray[np.uint64] | None,
                 clients: tuple[PartyId, ...], symmetric: bool, all_symmetric: bool,
                 identity: Identity | None = None, directory: Directory | None = None) -> None:
        super().__init__(party_id)
        self.scheme, self.run_id, self.spec, self.params, self.keys = scheme, run_id, spec, params, keys
        self.encoded, self.clients = encoded, clients
        self.symmetric, self.all_symmetric = symmetric, all_symmetric
        self.sizes = params.chunk_sizes(spec.length)
        self.decryption_error: float | None = None
        """CKKS: largest distance of a decrypted entry from its integer, i.e. the error actually met."""
        self.noise_budget: int | None = None
        """BFV: the smallest invariant noise budget (bits) among the aggregate's ciphertexts."""
        self.identity, self.directory = identity, directory
        self.verified = directory is not None
        """Verified sum: this client attests its upload and, as a decryptor, decrypts only an
        aggregate its contributors' signed tags confirm (``identity`` and ``directory`` given)."""
        self.attempt = 0
        self._uploaded: list[bytes] | None = None
        self._words: list[npt.NDArray[np.uint64]] | None = None
        self.gate = StageGate(run_id, scheme.protocol, party_id)
        # A key holder learns the sum by decrypting, never from a released one it cannot check.
        self.gate.open = {Stage.AGGREGATE} if keys.secret is not None else {Stage.RESULT}

    def start(self) -> list[Outgoing]:
        if self.encoded is None:
            return []
        secret = self.keys.secret
        with self.timed("upload"):
            streams = (secret.encrypt(self.encoded) if self.symmetric and secret is not None
                       else self.keys.public.encrypt(self.encoded))
            payload = write_upload(self.keys.public, streams)
        if self.verified:
            self._uploaded = streams
        env = Envelope(self.scheme.protocol, Stage.UPLOAD, self.run_id, self.party_id, SERVER, payload)
        return [Outgoing(env, Exposure.ciphertext(self.spec.length, self.party_id))]

    def receive(self, env: Envelope) -> list[Outgoing]:
        if env.stage == Stage.CHALLENGE and self.result is None and self._uploaded is not None:
            return self._attest(env)
        self.gate.check(env, allowed_senders=[SERVER])
        if env.stage == Stage.AGGREGATE:
            return self._decrypt_aggregate(env)
        payload = env.payload
        if self.verified:
            assert self.directory is not None
            payload, signature = split_signed(payload)
            statement = release_statement(self.scheme.protocol, self.run_id, self.keys.agent, payload)
            try:
                self.directory.verify(self.keys.agent, statement, signature, what="release")
            except AuthenticationError as error:
                raise TamperedAggregateError(SERVER, f"relayed a result the key holder did not release ({error})") \
                    from None
        released = read_result(payload, self.spec, self.clients, signed=False)
        result = _decoded(self.spec, released.encoded_sum, len(released.contributors))
        self.gate.record(env)
        self.gate.open = set()
        self.result, self.contributors = result, released.contributors
        return []

    def _attest(self, env: Envelope) -> list[Outgoing]:
        """Sign tags of this client's own upload for the aggregate the server announced."""
        if (env.protocol, env.run_id, env.receiver, env.sender) != (self.scheme.protocol, self.run_id,
                                                                    self.party_id, SERVER):
            raise StageError("a challenge for another run, party or from another sender")
        attempt, contributors, digest = read_challenge(env.payload, self.clients, self.spec.summands)
        if attempt <= self.attempt:
            raise ReplayError(f"challenge attempt {attempt} after attempt {self.attempt}")
        if self.party_id not in contributors:
            raise StageError("a challenge to a client the aggregate leaves out")
        assert self._uploaded is not None and self.identity is not None
        with self.timed("attest"):
            if self._words is None:
                seeded = self.symmetric and self.keys.secret is not None
                self._words = _upload_words(self.keys.public, self._uploaded, self.sizes, seeded)
            values = tags.tag(self._words, _primes(self.params), digest)
            statement = tag_statement(self.scheme.protocol, self.run_id, self.party_id, attempt, digest, values)
            payload = write_tag(attempt, values, self.identity.sign(statement))
        self.attempt = attempt
        out = Envelope(self.scheme.protocol, Stage.TAG, self.run_id, self.party_id, SERVER, payload)
        return [Outgoing(out, Exposure.ciphertext(0, self.party_id))]

    def _check_attested(self, body: bytes, streams: list[bytes], contributors: tuple[PartyId, ...], attempt: int,
                        signed: list[tuple[npt.NDArray[np.uint64], bytes]]) -> None:
        """The aggregate is the sum of the uploads its contributors attested, or a
        :class:`TamperedAggregateError` naming the server: signatures and ciphertexts only."""
        assert self.directory is not None
        if self._uploaded is not None and self.party_id in contributors and attempt != self.attempt:
            raise TamperedAggregateError(SERVER, f"the aggregate is of attempt {attempt}, this client attested "
                                                 f"attempt {self.attempt}")
        digest = aggregate_digest(self.scheme.protocol, self.run_id, attempt, body)
        for pid, (values, signature) in zip(contributors, signed, strict=True):
            statement = tag_statement(self.scheme.protocol, self.run_id, pid, attempt, digest, values)
            try:
                self.directory.verify(pid, statement, signature, what="tag")
            except AuthenticationError as error:
                raise TamperedAggregateError(SERVER, f"relayed an aggregate {party_name(pid)} did not attest "
                                                     f"({error})") from None
        primes = _primes(self.params)
        expected = tags.tag(_words(self.keys.public, streams), primes, digest)
        if not np.array_equal(expected, _sum_tags([v for v, _ in signed], primes)):
            raise TamperedAggregateError(SERVER, "the aggregate is not the sum of the uploads its "
                                                 "contributors attested")

    def _decrypt_aggregate(self, env: Envelope) -> list[Outgoing]:
        if self.verified:
            release, contributors, streams, body, attempt, signed = read_verified_aggregate(
                env.payload, self.keys.public, self.spec, self.clients, len(self.sizes), _primes(self.params))
            with self.timed("verify"):
                self._check_attested(body, streams, contributors, attempt, signed)
        else:
            release, contributors, streams = read_aggregate(env.payload, self.keys.public, self.spec, self.clients,
                                                            len(self.sizes))
        secret = self.keys.secret
        assert secret is not None  # AGGREGATE opens only at a client holding the key
        with self.timed("finalize"):
            decryption = self.scheme.decrypt_sum(secret, streams, self.sizes, self.params, self.spec,
                                                 len(contributors), self.all_symmetric)
            result = _decoded(self.spec, decryption.encoded_sum, len(contributors))
        self.gate.record(env)
        self.gate.open = set()
        self.result, self.contributors = result, contributors
        self.decryption_error, self.noise_budget = decryption.error, decryption.budget
        if not release:
            return []
        payload = write_result(contributors, decryption.encoded_sum, self.clients)
        if self.verified:
            assert self.identity is not None
            payload += self.identity.sign(release_statement(self.scheme.protocol, self.run_id, self.party_id,
                                                            payload))
        out = Envelope(self.scheme.protocol, Stage.RESULT, self.run_id, self.party_id, SERVER, payload)
        return [Outgoing(out, Exposure.aggregate(len(contributors), self.spec.length))]


class SealServer(ServerParty):
    """The server's side of one sum: add ciphertexts, (verified sums) collect each contributor's
    signed tags of its upload, hand the aggregate to the decryptors, and (agent mode) relay the
    released sum to the contributors."""

    def __init__(self, *, scheme: SumScheme, run_id: bytes, request: SumRequest, clients: tuple[PartyId, ...],
                 context: raw.PublicKeys, agent: PartyId, shared: bool, symmetric: bool,
                 directory: Directory | None = None) -> None:
        audience = request.participants if shared else (*request.participants, agent)
        super().__init__(protocol=scheme.protocol, run_id=run_id, request=request, clients=clients,
                         audience=audience)
        assert request.spec is not None
        self.spec, self.reveal, self.participants = request.spec, request.reveal, request.participants
        self.context, self.agent, self.shared, self.symmetric = context, agent, shared, symmetric
        self.sizes = context.params.chunk_sizes(self.spec.length)
        self.releasers: tuple[PartyId, ...] = ()
        self.decryptors: tuple[PartyId, ...] = ()
        self.gate = StageGate(run_id, scheme.protocol, SERVER)
        self.gate.open = {Stage.UPLOAD}
        self.aggregate: list[raw.TenSealVector] | None = None
        self.stage = Stage.UPLOAD
        self.directory = directory
        """Verified sum (``directory`` given): the server keeps each upload until its sender
        attested it, and sends the decryptors the signed tags beside the aggregate."""
        self.uploads: dict[PartyId, list[bytes]] = {}
        self.attempt = 0
        self._body = b""
        self._streams: list[bytes] = []
        self._digest = b""
        self._tags: dict[PartyId, tuple[npt.NDArray[np.uint64], bytes]] = {}
        self._tag_gate = StageGate(run_id, scheme.protocol, SERVER)

    @property
    def verified(self) -> bool:
        return self.directory is not None

    def seeded(self, sender: PartyId) -> bool:
        """Whether ``sender``'s upload is a seeded (secret-key) encryption: it holds the key."""
        return self.symmetric and (self.shared or sender == self.agent)

    def _load(self, sender: PartyId, streams: list[bytes]) -> list[raw.TenSealVector]:
        seeded = self.seeded(sender)
        return [self.context.load(s, size, seeded=seeded) for s, size in zip(streams, self.sizes, strict=True)]

    def receive(self, env: Envelope) -> list[Outgoing]:
        if env.stage == Stage.UPLOAD:
            self.gate.check(env, allowed_senders=self.participants)
            with self.timed("aggregate"):
                streams = read_upload(env.payload, self.context, len(self.sizes))
                vectors = self._load(env.sender, streams)
                if self.aggregate is None:
                    self.aggregate = vectors
                else:
                    self.context.add_into(self.aggregate, vectors)
            self.gate.record(env)
            if self.verified:
                self.uploads[env.sender] = streams
            self.contributors = tuple(sorted(self.gate.senders(Stage.UPLOAD)))
            return []
        if env.stage == Stage.TAG:
            return self._receive_tag(env)
        self.gate.check(env, allowed_senders=self.releasers)
        body = env.payload
        if self.directory is not None:
            body, signature = split_signed(body)
            statement = release_statement(self.protocol, self.run_id, env.sender, body)
            self.directory.verify(env.sender, statement, signature, what="release")
        released = read_result(body, self.spec, self.clients, signed=False)
        if released.contributors != self.contributors:
            raise StageError("the key holder released a sum over other contributors than were aggregated")
        result = _decoded(self.spec, released.encoded_sum, len(released.contributors))
        self.gate.record(env)
        if not self.accept_release(env.sender, released.encoded_sum, result):
            return []
        waiting = [pid for pid in self.contributors if pid not in self.decryptors] if self.reveal.clients else []
        payload = env.payload  # relayed unchanged: verified, it carries the releaser's signature
        exposure = Exposure.aggregate(len(self.contributors), self.spec.length)
        return [Outgoing(Envelope(self.protocol, Stage.RESULT, self.run_id, SERVER, pid, payload), exposure)
                for pid in waiting]

    def _receive_tag(self, env: Envelope) -> list[Outgoing]:
        self._tag_gate.check(env, allowed_senders=self.contributors)
        attempt, values, signature = read_tag(env.payload, _primes(self.context.params))
        if attempt != self.attempt:
            raise StageError(f"{party_name(env.sender)} attested attempt {attempt}, the challenge is {self.attempt}")
        assert self.directory is not None
        statement = tag_statement(self.protocol, self.run_id, env.sender, attempt, self._digest, values)
        self.directory.verify(env.sender, statement, signature, what="tag")
        self._tag_gate.record(env)
        self._tags[env.sender] = (values, signature)
        return []

    def advance(self) -> list[Outgoing]:
        if self.stage == Stage.UPLOAD:
            if self.aggregate is None:
                raise AbortedError("no client uploaded")
            return self._challenge() if self.verified else self._send_aggregate()
        if self.stage == Stage.CHALLENGE:
            return self._conclude_challenge()
        reasons = "; ".join(f"client {pid}: {self.rejected_from.get(pid, 'no answer')}" for pid in self.releasers)
        raise AbortedError(f"no key holder released the sum ({reasons})")

    def _dump(self) -> bytes:
        assert self.aggregate is not None
        self._streams = [self.context.dump(v) for v in self.aggregate]
        return write_aggregate(self.context, self.contributors, self.clients, self._streams)

    def _challenge(self) -> list[Outgoing]:
        """Announce the aggregate's digest; each contributor answers with signed tags of its upload."""
        self.attempt += 1
        if self.attempt > MAX_ATTEMPTS:
            raise AbortedError(f"no aggregate its contributors all attest after {MAX_ATTEMPTS} challenges")
        self.stage = Stage.CHALLENGE
        self.gate.open = set()
        self._body = self._dump()
        self._digest = aggregate_digest(self.protocol, self.run_id, self.attempt, self._body)
        self._tags = {}
        self._tag_gate = StageGate(self.run_id, self.protocol, SERVER)
        self._tag_gate.open = {Stage.TAG}
        payload = write_challenge(self.attempt, self.contributors, self.clients, self._digest)
        return [Outgoing(Envelope(self.protocol, Stage.CHALLENGE, self.run_id, SERVER, pid, payload),
                         Exposure.public()) for pid in self.contributors]

    def _conclude_challenge(self) -> list[Outgoing]:
        """Every contributor attested the aggregate: send it on. Otherwise leave out those that
        did not answer or whose tags do not match their upload, re-add the rest and challenge again."""
        primes = _primes(self.context.params)
        self._tag_gate.open = set()
        missing = [pid for pid in self.contributors if pid not in self._tags]
        wrong: list[PartyId] = []
        if not missing:
            with self.timed("verify"):
                expected = tags.tag(_words(self.context, self._streams), primes, self._digest)
                if np.array_equal(expected, _sum_tags([v for v, _ in self._tags.values()], primes)):
                    return self._send_aggregate()
                wrong = [pid for pid in self.contributors
                         if not np.array_equal(self._tags[pid][0], tags.tag(
                             _upload_words(self.context, self.uploads[pid], self.sizes, self.seeded(pid)),
                             primes, self._digest))]
            if not wrong:
                raise AbortedError("the aggregate does not match its contributors' tags, though each tag matches "
                                   "its upload")
        for pid in missing:
            self.excluded[pid] = self.rejected_from.get(pid) or "no tag: it did not attest its upload"
        for pid in wrong:
            self.excluded[pid] = "its tag does not match its upload"
        left = [pid for pid in self.contributors if pid not in missing and pid not in wrong]
        if not left:
            raise AbortedError("no contributor attested its upload")
        aggregate = self._load(left[0], self.uploads[left[0]])
        for pid in left[1:]:
            self.context.add_into(aggregate, self._load(pid, self.uploads[pid]))
        self.aggregate, self.contributors = aggregate, tuple(left)
        for pid in missing + wrong:
            self.uploads.pop(pid, None)
        return self._challenge()

    def _send_aggregate(self) -> list[Outgoing]:
        self.stage = Stage.AGGREGATE
        self.gate.open = set()
        # The agent decrypts and releases (a lost agent aborts the run). With a shared key the
        # contributors decrypt, or only the releasers when the clients are not to learn the sum;
        # the first RELEASERS contributors release it when the server is to learn it.
        if not self.shared:
            self.decryptors, self.releasers = (self.agent,), (self.agent,)
        else:
            first = self.contributors[:RELEASERS]
            self.decryptors = self.contributors if self.reveal.clients else first
            self.releasers = first if self.reveal.server else ()
        exposure = Exposure.aggregate(len(self.contributors), self.spec.length)
        if self.verified:
            signed = [self._tags[pid] for pid in self.contributors]
            self.uploads.clear()
            out = [Outgoing(Envelope(self.protocol, Stage.AGGREGATE, self.run_id, SERVER, pid,
                                     verified_aggregate_for(self._body, release=pid in self.releasers,
                                                            attempt=self.attempt, signed=signed)), exposure)
                   for pid in self.decryptors]
        else:
            body = self._dump()
            out = [Outgoing(Envelope(self.protocol, Stage.AGGREGATE, self.run_id, SERVER, pid,
                                     aggregate_for(body, release=pid in self.releasers)), exposure)
                   for pid in self.decryptors]
        if self.releasers:
            self.gate.open = {Stage.RESULT}
        else:
            self.finished = True
        return out


# --- sessions -----------------------------------------------------------------------------------

class SealServerSession(ServerSession):
    """The server's long-lived state: per parameter set, its own copy of the public context and
    that key set's agent; and the parameter set of the sum checked last."""

    scheme: ClassVar[SumScheme]
    options_class: ClassVar[type[Any]]

    def __init__(self, *, clients: Any, options: Any = None) -> None:
        super().__init__(clients=clients, options=self._options(options))
        self.options: SealOptions
        self.keysets: dict[raw.SealParameters, tuple[raw.PublicKeys, PartyId]] = {}
        self._pending: raw.SealParameters | None = self.options.fixed
        """The parameter set of the sum checked last (the one set-up and ``ready`` are about)."""
        self._latest: raw.SealParameters | None = None

    @classmethod
    def _options(cls, options: Any) -> Any:
        return _coerce(cls.name, cls.options_class, options)

    @property
    def ready(self) -> bool:
        """The sum checked last (or the fixed parameter set) has its keys."""
        return self._pending is None or self._pending in self.keysets

    @property
    def agent(self) -> PartyId | None:
        """The agent of the latest key set (``keyset(params)`` for a given one)."""
        return None if self._latest is None else self.keysets[self._latest][1]

    @property
    def context(self) -> raw.PublicKeys | None:
        """The public context of the latest key set."""
        return None if self._latest is None else self.keysets[self._latest][0]

    @property
    def fingerprint(self) -> bytes | None:
        context = self.context
        return None if context is None else context.fingerprint

    def keyset(self, params: raw.SealParameters) -> tuple[raw.PublicKeys, PartyId] | None:
        return self.keysets.get(params)

    def setup(self, *, run_id: bytes, round: int = -1, statistic: str = "setup") -> ServerParty | None:
        """The set-up run of the parameter set of the sum checked last, when it has no keys yet
        (its agent picked with ``secrets``); ``None`` otherwise."""
        missing = self._pending
        if missing is None or missing in self.keysets:
            return None
        params: SetupParams[Any] = SetupParams(secrets.choice(self.clients), self.options.keyholder, missing)
        request = SumRequest(kind="setup", statistic=statistic, round=round, spec=None, reveal=Reveal(),
                             participants=self.clients, params=params.to_bytes(), session=self.tag)
        return SetupServer(scheme=self.scheme, run_id=run_id, request=request, clients=self.clients,
                           params=params, on_done=self._install)

    def _install(self, context: raw.PublicKeys, agent: PartyId) -> None:
        self.keysets[context.params] = (context, agent)
        self._latest = context.params

    def parameters(self, spec: VectorSpec) -> raw.SealParameters:
        """The public parameters of a sum of ``spec`` (what every client derives too)."""
        return self.options.parameters_for(spec)

    def public_parameters(self, spec: VectorSpec) -> dict[str, Any]:
        """The chosen parameters of a sum of ``spec``, as plain data (reports, ``sum --json``), and
        whether its aggregate is verified (``verify_aggregate`` resolved)."""
        params = self.parameters(spec)
        out = {name: list(value) if isinstance(value, tuple) else value for name, value in vars(params).items()}
        out["ciphertexts"] = params.chunks(spec.length)
        try:
            out["verified"] = self.options.verifies(self.directory)
        except ValueError:  # verify_aggregate=True without registered keys: open() refuses the sum
            out["verified"] = False
        return out

    def check(self, *, spec: VectorSpec, reveal: Reveal) -> None:
        if self.options.keyholder == "agent" and not reveal.server:
            raise ValueError("keyholder='agent' releases sums through the server; use keyholder='all' "
                             "for a sum the server must not learn")
        self._pending = self.parameters(spec)

    def open(self, *, run_id: bytes, request: SumRequest) -> ServerParty:
        if request.kind != "sum" or request.spec is None:
            raise ValueError(f"{self.name.upper()} runs sums (its set-up comes from setup())")
        self.check(spec=request.spec, reveal=request.reveal)
        params = self.parameters(request.spec)
        keyset = self.keysets.get(params)
        if keyset is None:
            raise AbortedError(f"no {self.name.upper()} keys for {params}: run the set-up first")
        context, agent = keyset
        verified = self.options.verifies(self.directory)
        request = dataclasses.replace(request, session=self.tag)
        run = SumParams(params.to_bytes(), context.fingerprint, agent, request_digest(self.name, request, self.clients),
                        verified)
        request = dataclasses.replace(request, params=run.to_bytes())
        return SealServer(scheme=self.scheme, run_id=run_id, request=request, clients=self.clients, context=context,
                          agent=agent, shared=self.options.keyholder == "all", symmetric=self.options.symmetric,
                          directory=self.directory if verified else None)

    def tolerance(self, spec: VectorSpec, contributors: int) -> float:
        """Encoding rounding only, ``n * 2**-(frac_bits+1)`` (0 for integers): the decrypted sum is
        the exact encoded sum (raises ``CapacityError`` for a spec no parameters carry exactly)."""
        self.parameters(spec)
        return super().tolerance(spec, contributors)


class SealClientSession(ClientSession):
    """One client's long-lived state: the key sets it received or made, its own objects only."""

    scheme: ClassVar[SumScheme]
    options_class: ClassVar[type[Any]]
    client_party: ClassVar[type[SealClient]] = SealClient

    def __init__(self, party: PartyId, *, clients: Any, options: Any = None) -> None:
        super().__init__(party, clients=clients, options=_coerce(self.name, self.options_class, options))
        self.options: SealOptions
        self.keysets: dict[raw.SealParameters, ClientKeys] = {}

    @property
    def keys(self) -> ClientKeys | None:
        """The latest key set installed (``keysets`` holds them all, by parameter set)."""
        return next(reversed(self.keysets.values()), None)

    def _install(self, keys: ClientKeys) -> None:
        self.keysets.pop(keys.parameters, None)
        self.keysets[keys.parameters] = keys

    def join(self, *, run_id: bytes, request: SumRequest, values: npt.NDArray[Any] | None) -> Party:
        if request.kind == "setup":
            params: SetupParams[Any] = SetupParams.from_bytes(
                request.params, clients=self.clients, keyholder=self.options.keyholder,
                parse=self.options.parse_parameters, accept=self.options.accept)
            if params.parameters not in self.keysets and len(self.keysets) >= MAX_KEYSETS:
                raise PolicyError(f"this client keeps at most {MAX_KEYSETS} key sets")
            return SetupClient(self.party_id, scheme=self.scheme, run_id=run_id, params=params, clients=self.clients,
                               install=self._install)
        if request.kind != "sum" or request.spec is None:
            raise WireError(f"{self.name.upper()} has no {request.kind!r} runs")
        run = SumParams.from_bytes(request.params)
        params_of_run = self.options.parse_parameters(run.parameters)
        derived = self.options.parameters_for(request.spec)
        if params_of_run != derived:
            raise ForeignKeyError(f"the run asks for {params_of_run}; this client derives {derived} for its spec")
        keys = self.keysets.get(derived)
        if keys is None:
            raise StageError(f"no keys for {derived} here: the set-up did not reach this client")
        if run.fingerprint != keys.public.fingerprint:
            raise ForeignKeyError("the run is under other keys than this client holds for its parameters")
        if run.agent != keys.agent:
            raise StageError(f"the run names agent {run.agent}, this client's keys came from {keys.agent}")
        if not hmac.compare_digest(run.request_digest, request_digest(self.name, request, self.clients)):
            raise WireError("the run's request does not match its digest (altered in transit)")
        try:
            verified = self.options.verifies(self.directory)
        except ValueError as error:
            raise PolicyError(str(error)) from None
        if run.verified != verified:
            raise PolicyError(f"the run's aggregate is {'' if run.verified else 'not '}verified; this client's "
                              f"options say {'verify' if verified else 'do not verify'} (verify_aggregate)")
        return self.client_party(
            self.party_id, scheme=self.scheme, run_id=run_id, spec=request.spec, params=derived, keys=keys,
            encoded=as_encoded(values, request.spec), clients=self.clients, symmetric=self.options.symmetric,
            all_symmetric=self.options.all_symmetric, identity=self.identity if verified else None,
            directory=self.directory if verified else None)

    def to_bytes(self) -> bytes:
        """Version, then per key set (oldest first): its parameters, the agent, the public context
        and the secret key if held."""
        writer = Writer().u8(_SNAPSHOT_VERSION).u32(len(self.keysets))
        for params, keys in self.keysets.items():
            writer.blob(params.to_bytes()).u32(keys.agent).blob(keys.public.data)
            if keys.secret_bytes is None:
                writer.u8(0)
            else:
                writer.u8(1).blob(keys.secret_bytes)
        return writer.finish()

    def load_bytes(self, data: bytes) -> None:
        """Restore :meth:`to_bytes`, reloading (so revalidating) every key; nothing changes on error."""
        reader = Reader(data)
        if reader.u8() != _SNAPSHOT_VERSION:
            raise WireError(f"unknown {self.name.upper()} client snapshot version")
        count = reader.u32()
        if count > MAX_KEYSETS:
            raise WireError(f"a snapshot of {count} key sets (at most {MAX_KEYSETS})")
        entries = []
        for _ in range(count):
            params = self.options.parse_parameters(reader.blob(max_len=MAX_PARAMS))
            agent, public_bytes = reader.u32(), reader.blob(max_len=MAX_CONTEXT)
            has_secret = reader.u8()
            if has_secret not in (0, 1):
                raise WireError(f"bad secret-key flag in a {self.name.upper()} client snapshot")
            entries.append((params, agent, public_bytes, reader.blob(max_len=MAX_CONTEXT) if has_secret else None))
        reader.end()
        keysets: dict[raw.SealParameters, ClientKeys] = {}
        for params, agent, public_bytes, secret_bytes in entries:
            if params in keysets:
                raise WireError("a snapshot names one parameter set twice")
            if agent not in self.clients:
                raise WireError(f"snapshot names agent {agent}, not a client of this protocol")
            self.options.accept(params)
            decrypts = self.options.keyholder == "all" or agent == self.party_id
            if decrypts != (secret_bytes is not None):
                raise PolicyError("snapshot's secret key does not match this client's role "
                                  f"(keyholder={self.options.keyholder!r}, agent {agent})")
            public = self.scheme.public(public_bytes, params)
            secret = None if secret_bytes is None else self.scheme.secret(secret_bytes, public)
            keysets[params] = ClientKeys(agent, public, secret, secret_bytes)
        self.keysets = keysets


def _coerce(name: str, options_class: type[Any], options: Any) -> Any:
    if options is None:
        return options_class()
    if not isinstance(options, options_class):
        raise TypeError(f"{name.upper()} takes {options_class.__name__}, got {type(options).__name__}")
    return options
