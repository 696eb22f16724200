"""Payloads of the SEAL-based sums (``ckks``, ``bfv``), each written by one function and read
back strictly by its mirror.

Every reader refuses short, long or out-of-range input with a
:class:`~protocols.errors.WireError` (or a more precise :class:`~protocols.errors.ProtocolError`)
before its caller changes any state. Payloads that carry ciphertexts or a released sum end
with a 16-byte checksum: it catches corruption in transit (a bit flip in a zstd-compressed
ciphertext still loads as a valid, wrong ciphertext half the time), it is not authentication —
authenticity is the transport's job.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import IntEnum
from typing import Final, Generic, TypeVar

import numpy as np
import numpy.typing as npt

from .encoding import VectorSpec
from .errors import PolicyError, WireError
from .identity import SIGNATURE_BYTES
from .messages import ReleasedSum, read_contributors, write_contributors
from .primitives import seal as raw
from .primitives import seal_tags as tags
from .primitives.channel import PUBLIC_KEY_BYTES
from .session import SumRequest
from .wire import PartyId, Reader, Writer

CHECKSUM_BYTES: Final = 16
MAX_CONTEXT: Final = 1 << 26
"""Bytes a public context or secret key may take (N = 32768 with 881-bit moduli needs ~15 MB)."""
MAX_SEALED: Final = MAX_CONTEXT + 64
MAX_PARAMS: Final = 64
"""Bytes of one serialised parameter set (ring, up to 16 prime sizes, scale or plaintext modulus)."""
KEYHOLDERS: Final = ("agent", "all")

P = TypeVar("P", bound=raw.SealParameters)


class Stage(IntEnum):
    """Set-up stages (1-5), then those of a sum (6-10) in the order they happen: a verified sum's
    attestation (7-8: the server's digest of its aggregate, each contributor's signed tags of its
    own upload) comes between the uploads and the aggregate (dropout plans silence a party from a
    stage *number* on)."""

    CONTEXT = 1
    ADVERTISE = 2
    CHANNEL_KEYS = 3
    SEALED_KEY = 4
    CONFIRM = 5
    UPLOAD = 6
    CHALLENGE = 7
    TAG = 8
    AGGREGATE = 9
    RESULT = 10


# --- checksums and ciphertext bundles -------------------------------------------------------

def _checksum(body: bytes | memoryview) -> bytes:
    digest = hashlib.sha256(b"secure-fl/seal-payload\x00")
    digest.update(body)
    return digest.digest()[:CHECKSUM_BYTES]


def verified(payload: bytes, start: int = 0) -> bytes:
    """The payload without its checksum, which must match (bytes from ``start`` on are covered)."""
    if len(payload) < start + CHECKSUM_BYTES:
        raise WireError("payload truncated: no checksum")
    view = memoryview(payload)
    if not hmac.compare_digest(_checksum(view[start:-CHECKSUM_BYTES]), payload[-CHECKSUM_BYTES:]):
        raise WireError("ciphertext payload failed its checksum (corrupted in transit)")
    return payload[:-CHECKSUM_BYTES]


def _write_ciphertexts(writer: Writer, context: raw.PublicKeys, streams: list[bytes]) -> bytes:
    """Fingerprint, count, SEAL streams, then the checksum over all that ``writer`` holds."""
    writer.raw(context.fingerprint).u32(len(streams))
    for stream in streams:
        writer.blob(stream)
    body = writer.finish()
    return body + _checksum(body)


def read_ciphertexts(reader: Reader, context: raw.PublicKeys, expected: int) -> list[bytes]:
    """Fingerprint, then count, then the SEAL streams (size-capped; framing is checked on load)."""
    raw.check_fingerprint(context.fingerprint, reader.raw(raw.FINGERPRINT_BYTES))
    count = reader.u32()
    if count != expected:
        raise WireError(f"expected {expected} ciphertexts, got {count}")
    return [reader.blob(max_len=context.layout.max_stream) for _ in range(count)]


def write_upload(context: raw.PublicKeys, streams: list[bytes]) -> bytes:
    return _write_ciphertexts(Writer(), context, streams)


def read_upload(payload: bytes, context: raw.PublicKeys, expected: int) -> list[bytes]:
    reader = Reader(verified(payload))
    streams = read_ciphertexts(reader, context, expected)
    reader.end()
    return streams


def write_aggregate(context: raw.PublicKeys, contributors: tuple[PartyId, ...], clients: Sequence[PartyId],
                    streams: list[bytes]) -> bytes:
    """The aggregate's body; :func:`aggregate_for` prefixes each receiver's release flag."""
    return _write_ciphertexts(write_contributors(Writer(), contributors, clients), context, streams)


def aggregate_for(body: bytes, *, release: bool) -> bytes:
    """The flag sits outside the checksum so one body serves every receiver (no rehash each)."""
    return bytes([release]) + body


def read_aggregate(payload: bytes, context: raw.PublicKeys, spec: VectorSpec, clients: Sequence[PartyId],
                   expected: int) -> tuple[bool, tuple[PartyId, ...], list[bytes]]:
    reader = Reader(verified(payload, start=1))
    release = reader.u8()
    if release not in (0, 1):
        raise WireError("bad release flag")
    contributors = read_contributors(reader, clients, spec.summands)
    streams = read_ciphertexts(reader, context, expected)
    reader.end()
    return bool(release), contributors, streams


def write_result(contributors: tuple[PartyId, ...], encoded_sum: npt.NDArray[np.uint64],
                 clients: Sequence[PartyId]) -> bytes:
    body = ReleasedSum(contributors, encoded_sum).to_bytes(parties=clients)
    return body + _checksum(body)


def read_result(payload: bytes, spec: VectorSpec, clients: Sequence[PartyId], *,
                signed: bool | None = None) -> ReleasedSum:
    """A released sum. ``signed``: the payload ends with the releaser's signature (verified sums),
    which is skipped, not checked; ``None``: either form (a transcript reader, which cannot know)."""
    if signed is None:
        try:
            return read_result(payload, spec, clients, signed=False)
        except WireError:
            signed = True
    if signed:
        payload, _ = split_signed(payload)
    return ReleasedSum.from_bytes(verified(payload), spec, parties=clients)


# --- verified aggregates: the challenge, the tags, the aggregate that carries them ---------------

MAX_ATTEMPTS: Final = 8
"""Challenges per sum: each one after the first follows contributors left out for a missing or
wrong tag (so there are never more than contributors); a sum still unattested after that many
aborts."""


def aggregate_digest(protocol: str, run_id: bytes, attempt: int, body: bytes) -> bytes:
    """What the tags' functionals are drawn from: the aggregate's body (contributors, key
    fingerprint, ciphertexts) as the decryptors receive it, bound to the run and the attempt."""
    digest = hashlib.sha256(b"secure-fl/seal-aggregate\x00" + protocol.encode() + b"\x00" + run_id
                            + attempt.to_bytes(4, "big"))
    digest.update(body)
    return digest.digest()


def write_challenge(attempt: int, contributors: tuple[PartyId, ...], clients: Sequence[PartyId],
                    digest: bytes) -> bytes:
    return write_contributors(Writer().u32(attempt), contributors, clients).raw(digest).finish()


def read_challenge(payload: bytes, clients: Sequence[PartyId], summands: int) -> tuple[int, tuple[PartyId, ...], bytes]:
    reader = Reader(payload)
    attempt = reader.u32()
    contributors = read_contributors(reader, clients, summands)
    digest = reader.raw(tags.DIGEST_BYTES)
    reader.end()
    if not 1 <= attempt <= MAX_ATTEMPTS:
        raise WireError(f"challenge attempt {attempt} outside 1..{MAX_ATTEMPTS}")
    return attempt, contributors, digest


def tag_statement(protocol: str, run_id: bytes, sender: PartyId, attempt: int, digest: bytes,
                  values: npt.NDArray[np.uint64]) -> bytes:
    """What a contributor signs: its tags of its own upload, for this run, attempt and aggregate."""
    return b"".join((b"secure-fl/seal-tag\x00", protocol.encode(), b"\x00", run_id, sender.to_bytes(4, "big"),
                     attempt.to_bytes(4, "big"), digest, values.astype(">u8").tobytes()))


def _write_tags(writer: Writer, values: npt.NDArray[np.uint64], signature: bytes) -> Writer:
    return writer.raw(values.astype(">u8").tobytes()).raw(signature)


def _read_tags(reader: Reader, primes: Sequence[int]) -> tuple[npt.NDArray[np.uint64], bytes]:
    count = tags.FUNCTIONALS * len(primes)
    values = np.frombuffer(reader.raw(8 * count), dtype=">u8").astype(np.uint64).reshape(tags.FUNCTIONALS,
                                                                                        len(primes))
    if np.any(values >= np.array(primes, dtype=np.uint64)):
        raise WireError("a tag is not reduced modulo its prime")
    return values, reader.raw(SIGNATURE_BYTES)


def write_tag(attempt: int, values: npt.NDArray[np.uint64], signature: bytes) -> bytes:
    return _write_tags(Writer().u32(attempt), values, signature).finish()


def read_tag(payload: bytes, primes: Sequence[int]) -> tuple[int, npt.NDArray[np.uint64], bytes]:
    reader = Reader(payload)
    attempt = reader.u32()
    values, signature = _read_tags(reader, primes)
    reader.end()
    return attempt, values, signature


def verified_aggregate_for(body: bytes, *, release: bool, attempt: int,
                           signed: list[tuple[npt.NDArray[np.uint64], bytes]]) -> bytes:
    """Flag, the aggregate's body (checksummed as :func:`write_aggregate` wrote it), the attempt,
    then each contributor's tags and signature in ascending contributor order."""
    writer = Writer().u8(int(release)).blob(body).u32(attempt)
    for values, signature in signed:
        _write_tags(writer, values, signature)
    return writer.finish()


def read_verified_aggregate(payload: bytes, context: raw.PublicKeys, spec: VectorSpec, clients: Sequence[PartyId],
                            expected: int, primes: Sequence[int]
                            ) -> tuple[bool, tuple[PartyId, ...], list[bytes], bytes, int, list[tuple[npt.NDArray[np.uint64], bytes]]]:
    """``(release, contributors, streams, body, attempt, [(tags, signature)] per contributor)``."""
    reader = Reader(payload)
    release = reader.u8()
    body = reader.blob(max_len=len(payload))
    attempt = reader.u32()
    if release not in (0, 1):
        raise WireError("bad release flag")
    if not 1 <= attempt <= MAX_ATTEMPTS:
        raise WireError(f"aggregate attempt {attempt} outside 1..{MAX_ATTEMPTS}")
    _, contributors, streams = read_aggregate(bytes([release]) + body, context, spec, clients, expected)
    signed = [_read_tags(reader, primes) for _ in contributors]
    reader.end()
    return bool(release), contributors, streams, body, attempt, signed


def release_statement(protocol: str, run_id: bytes, releaser: PartyId, result: bytes) -> bytes:
    """What a releaser signs in a verified sum: its result payload, for this run; the server relays
    payload and signature unchanged, so the contributors check the key holder's own word."""
    return b"".join((b"secure-fl/seal-release\x00", protocol.encode(), b"\x00", run_id,
                     releaser.to_bytes(4, "big"), hashlib.sha256(result).digest()))


def split_signed(payload: bytes) -> tuple[bytes, bytes]:
    """A signed result: the result payload, then the releaser's 64-byte signature."""
    if len(payload) <= SIGNATURE_BYTES:
        raise WireError("a signed result is too short to hold a signature")
    return payload[:-SIGNATURE_BYTES], payload[-SIGNATURE_BYTES:]


# --- run parameters (SumRequest.params) ---------------------------------------------------

@dataclass(frozen=True)
class SetupParams(Generic[P]):
    """A set-up run's public parameters: who generates the keys, the key-holder mode, and the
    parameter set the keys are for (a client refuses a set-up for another mode, or for a
    parameter set it would never use)."""

    agent: PartyId
    keyholder: str
    parameters: P

    def to_bytes(self) -> bytes:
        return (Writer().u32(self.agent).u8(KEYHOLDERS.index(self.keyholder))
                .blob(self.parameters.to_bytes()).finish())

    @classmethod
    def from_bytes(cls, data: bytes, *, clients: Sequence[PartyId], keyholder: str,
                   parse: Callable[[bytes], P], accept: Callable[[P], None]) -> SetupParams[P]:
        """Parse, and check against what this client agreed to: its clients and mode, and
        (``accept`` raises otherwise) a parameter set it takes."""
        reader = Reader(data)
        agent, mode = reader.u32(), reader.u8()
        parameters = parse(reader.blob(max_len=MAX_PARAMS))
        reader.end()
        if agent not in clients:
            raise WireError(f"set-up names agent {agent}, not a client of this protocol")
        if mode >= len(KEYHOLDERS):
            raise WireError(f"unknown key-holder mode {mode}")
        if KEYHOLDERS[mode] != keyholder:
            raise PolicyError(f"set-up asks for keyholder={KEYHOLDERS[mode]!r}, this client agreed to {keyholder!r}")
        accept(parameters)
        return cls(agent, keyholder, parameters)


@dataclass(frozen=True)
class SumParams:
    """A sum run's public parameters: the parameter set (chosen from the spec, which every
    client re-derives), the key set it runs under (a client holding another refuses), and a
    digest of the rest of the request. The ``open`` message has no other integrity check, and a
    spec altered in transit would make a decryptor decode the right encoded sum into a wrong
    result."""

    parameters: bytes
    fingerprint: bytes
    agent: PartyId
    request_digest: bytes
    verified: bool = False
    """The decryptors get a verified aggregate (:mod:`protocols.seal_sum`, ``verify_aggregate``);
    a client refuses a run that is not what its own options ask."""

    def to_bytes(self) -> bytes:
        return (Writer().blob(self.parameters).raw(self.fingerprint).u32(self.agent)
                .raw(self.request_digest).u8(int(self.verified)).finish())

    @classmethod
    def from_bytes(cls, data: bytes) -> SumParams:
        reader = Reader(data)
        parameters = reader.blob(max_len=MAX_PARAMS)
        fingerprint, agent = reader.raw(raw.FINGERPRINT_BYTES), reader.u32()
        digest = reader.raw(CHECKSUM_BYTES)
        verified = reader.u8()
        reader.end()
        if verified not in (0, 1):
            raise WireError("bad verified flag")
        return cls(parameters, fingerprint, agent, digest, bool(verified))


def request_digest(protocol: str, request: SumRequest, clients: Sequence[PartyId]) -> bytes:
    """Digest of a request's canonical bytes without its params (parsing is strict, so an
    accepted request re-serialises to the bytes that were sent)."""
    body = dataclasses.replace(request, params=b"").to_bytes(clients=clients)
    return hashlib.sha256(b"secure-fl/seal-request\x00" + protocol.encode() + b"\x00" + body).digest()[:CHECKSUM_BYTES]


# --- set-up payloads ------------------------------------------------------------------------

def write_context(public: bytes) -> bytes:
    """The agent's fingerprint of its public context, then the context (a relay can check both)."""
    return Writer().raw(raw.fingerprint_of(public)).blob(public).finish()


def read_context(payload: bytes) -> bytes:
    """The context bytes, once their fingerprint matches (they still need loading to be valid)."""
    reader = Reader(payload)
    fingerprint = reader.raw(raw.FINGERPRINT_BYTES)
    public = reader.blob(max_len=MAX_CONTEXT)
    reader.end()
    if not hmac.compare_digest(raw.fingerprint_of(public), fingerprint):
        raise WireError("public context does not match its fingerprint (altered in transit)")
    return public


def read_channel_key(payload: bytes) -> bytes:
    if len(payload) != PUBLIC_KEY_BYTES:
        raise WireError(f"a channel key is {PUBLIC_KEY_BYTES} bytes, got {len(payload)}")
    return payload


def write_channel_keys(keys: dict[PartyId, bytes]) -> bytes:
    writer = Writer().u32(len(keys))
    for pid in sorted(keys):
        writer.u32(pid).raw(keys[pid])
    return writer.finish()


def _read_count(reader: Reader, receivers: tuple[PartyId, ...]) -> None:
    count = reader.u32()
    if count != len(receivers):
        raise WireError(f"expected entries for {len(receivers)} clients, got {count}")


def read_channel_keys(payload: bytes, receivers: tuple[PartyId, ...]) -> dict[PartyId, bytes]:
    """Exactly one key per receiver, in ascending order."""
    reader = Reader(payload)
    _read_count(reader, receivers)
    keys: dict[PartyId, bytes] = {}
    for pid in receivers:
        if reader.u32() != pid:
            raise WireError("channel keys are not exactly the other clients', in order")
        keys[pid] = reader.raw(PUBLIC_KEY_BYTES)
    reader.end()
    return keys


def write_sealed_keys(agent_channel: bytes, sealed: dict[PartyId, bytes]) -> bytes:
    writer = Writer().raw(agent_channel).u32(len(sealed))
    for pid in sorted(sealed):
        writer.u32(pid).blob(sealed[pid])
    return writer.finish()


def read_sealed_keys(payload: bytes, receivers: tuple[PartyId, ...]) -> tuple[bytes, dict[PartyId, bytes]]:
    """The agent's channel key and one sealed secret key per receiver, in ascending order."""
    reader = Reader(payload)
    agent_channel = reader.raw(PUBLIC_KEY_BYTES)
    _read_count(reader, receivers)
    sealed: dict[PartyId, bytes] = {}
    for pid in receivers:
        if reader.u32() != pid:
            raise WireError("sealed keys are not exactly the other clients', in order")
        sealed[pid] = reader.blob(max_len=MAX_SEALED)
    reader.end()
    return agent_channel, sealed


def write_relayed_key(agent_channel: bytes, sealed: bytes) -> bytes:
    return Writer().raw(agent_channel).blob(sealed).finish()


def read_relayed_key(payload: bytes) -> tuple[bytes, bytes]:
    reader = Reader(payload)
    agent_channel, sealed = reader.raw(PUBLIC_KEY_BYTES), reader.blob(max_len=MAX_SEALED)
    reader.end()
    return agent_channel, sealed


def key_associated_data(protocol: str, run_id: bytes, agent: PartyId, receiver: PartyId) -> bytes:
    """Binds a sealed secret key to its protocol, run, agent and receiver (a moved one fails to open)."""
    return (b"secure-fl/seal-sk\x00" + protocol.encode() + b"\x00" + run_id + agent.to_bytes(4, "big")
            + receiver.to_bytes(4, "big"))


def read_confirm(payload: bytes) -> bytes:
    if len(payload) != raw.FINGERPRINT_BYTES:
        raise WireError(f"a confirmation is a {raw.FINGERPRINT_BYTES}-byte fingerprint, got {len(payload)} bytes")
    return payload
