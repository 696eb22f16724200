"""What every Paillier party shares: stage numbers, options, payload codecs, a client's keys.

Parties of :mod:`protocols.paillier` (sums), :mod:`protocols.paillier_setup` (key set-up) and
:mod:`protocols.argmin` (Dubhe's private argmin) all read and write these payloads, so the
codecs live here, each strict: a :class:`~protocols.wire.Reader` that must :meth:`end`, exact
widths, keys checked before any ciphertext is read.
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from enum import IntEnum
from functools import cache
from typing import Any, Final, Literal

import gmpy2
import numpy as np
import numpy.typing as npt

from .encoding import PackingLayout
from .errors import ForeignKeyError, WireError
from .primitives import paillier as raw
from .primitives import sodium
from .primitives.channel import PUBLIC_KEY_BYTES
from .session import SumRequest
from .wire import PartyId, Reader, Writer

PROTOCOL: Final = "paillier"
Keyholder = Literal["agent", "all", "server"]
KEYHOLDERS: Final[tuple[Keyholder, ...]] = ("agent", "all", "server")
DIGEST_BYTES: Final = 16
SEAL_PURPOSE: Final = b"paillier-sk"


class Stage(IntEnum):
    """Every stage under the ``paillier`` wire code: set-up 1–4 and 11, sums 5–7, argmin 8–10.

    One enum because the transcript names stages by the protocol's descriptor; the argmin's
    stages (:mod:`protocols.argmin`) keep their numbers 8–10.
    """

    PUBLIC_KEY = 1
    ADVERTISE = 2
    CHANNEL_KEYS = 3
    SEALED_KEY = 4
    UPLOAD = 5
    AGGREGATE = 6
    RESULT = 7
    TRY_UPLOAD = 8
    TRY_AGGREGATES = 9
    ARGMIN = 10
    KEY_READY = 11


@dataclass(frozen=True, kw_only=True)
class PaillierOptions:
    key_bits: int = raw.MIN_KEY_BITS
    keyholder: Keyholder = "agent"
    pool_size: int = 0
    """Obfuscators each client precomputes when its keys arrive (offline); 0 computes them online."""
    allow_weak_keys: bool = False
    """Tests only: accept keys shorter than 2048 bits."""
    min_contributors: int = 2
    """A key holder's own floor: it decrypts no argmin try summing fewer clients (:mod:`protocols.argmin`)."""

    def __post_init__(self) -> None:
        if self.keyholder not in KEYHOLDERS:
            raise ValueError(f"keyholder must be 'agent', 'all' or 'server', got {self.keyholder!r}")
        if self.pool_size < 0:
            raise ValueError("pool_size must be >= 0")
        if self.key_bits < raw.MIN_KEY_BITS and not self.allow_weak_keys:
            raise ValueError(f"key_bits below {raw.MIN_KEY_BITS} need allow_weak_keys=True (tests only)")
        if self.key_bits < raw.MIN_TEST_KEY_BITS:
            raise ValueError(f"key_bits must be >= {raw.MIN_TEST_KEY_BITS}")
        if self.min_contributors < 1:
            raise ValueError("min_contributors must be >= 1")


def options_of(options: Any) -> PaillierOptions:
    if options is None:
        return PaillierOptions()
    if not isinstance(options, PaillierOptions):
        raise TypeError(f"expected PaillierOptions, got {type(options).__name__}")
    return options


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


# --- set-up payloads ----------------------------------------------------------------------------

def write_setup_params(mode: Keyholder, agent: PartyId) -> bytes:
    """``SumRequest.params`` of a set-up run: the key holder mode and who generates the key."""
    return Writer().u8(KEYHOLDERS.index(mode)).u32(agent).finish()


def read_setup_params(data: bytes) -> tuple[Keyholder, PartyId]:
    reader = Reader(data)
    code, agent = reader.u8(), reader.u32()
    reader.end()
    if code >= len(KEYHOLDERS):
        raise WireError(f"unknown key holder mode {code}")
    return KEYHOLDERS[code], agent


def key_bytes(bits: int) -> int:
    return (bits + 7) // 8


@cache
def _small_primes() -> Any:
    return gmpy2.primorial(1 << 16)


def write_public_key(writer: Writer, owner: PartyId, key: raw.PublicKey) -> Writer:
    """The owner (agent, or the server in its weak mode), the key's fingerprint, then n."""
    return writer.u32(owner).raw(key.fingerprint).blob(key.to_bytes())


def read_public_key(reader: Reader, *, bits: int) -> tuple[PartyId, raw.PublicKey]:
    """Parse and vet a modulus: exact width and bit length, odd, composite, no square, no small
    factor, and a fingerprint that matches (corruption in transit). Nobody can check more
    without the factors; a sealed key's receiver checks p·q = n."""
    owner = reader.u32()
    fingerprint = reader.raw(raw.FINGERPRINT_BYTES)
    data = reader.blob(max_len=key_bytes(bits))
    if len(data) != key_bytes(bits):
        raise WireError(f"a {bits}-bit modulus takes {key_bytes(bits)} bytes, got {len(data)}")
    n = gmpy2.mpz(int.from_bytes(data, "big"))
    if gmpy2.bit_length(n) != bits:
        raise WireError(f"the modulus is not a {bits}-bit number")
    if gmpy2.is_even(n) or gmpy2.is_square(n) or gmpy2.is_prime(n) or gmpy2.gcd(n, _small_primes()) != 1:
        raise WireError("the modulus cannot be a product of two large primes")
    key = raw.PublicKey(n)
    if not secrets.compare_digest(key.fingerprint, fingerprint):
        raise WireError("the key does not match its fingerprint")
    return owner, key


def check_channel_key(data: bytes) -> bytes:
    """An X25519 public key that yields a non-zero shared secret (no low-order point)."""
    if len(data) != PUBLIC_KEY_BYTES:
        raise WireError(f"a channel key is {PUBLIC_KEY_BYTES} bytes, got {len(data)}")
    if sodium.low_order(data):
        raise WireError("the channel key is a low-order point")
    return bytes(data)


def private_key(public: raw.PublicKey, p: int, q: int) -> raw.PrivateKey:
    """The private key from received primes, refused (:class:`ForeignKeyError`) unless they are
    two primes whose product is the public modulus."""
    if p < 2 or q < 2 or p * q != public.n or not (gmpy2.is_prime(p) and gmpy2.is_prime(q)):
        raise ForeignKeyError("the received primes do not factor the public key")
    try:
        return raw.PrivateKey(public, p, q)
    except (ArithmeticError, ValueError) as error:
        raise ForeignKeyError("the received primes do not make a private key") from error


def secret_width(bits: int) -> int:
    """Bytes of each prime in a sealed secret key (a prime of a ``bits``-bit n, plus one byte)."""
    return (bits // 2 + 7) // 8 + 1


def sealed_length(bits: int) -> int:
    """Nonce, the two primes, the tag."""
    return 12 + 2 * secret_width(bits) + 16


def seal_associated(run_id: bytes, agent: PartyId, receiver: PartyId) -> bytes:
    """Binds a sealed key to its run, its sender and its receiver: it opens nowhere else."""
    return run_id + agent.to_bytes(4, "big") + receiver.to_bytes(4, "big")


# --- run payloads -------------------------------------------------------------------------------

def request_digest(run_id: bytes, request: SumRequest, clients: Sequence[PartyId]) -> bytes:
    """What a party believes the run is; uploads and aggregates carry it, so a client that
    parsed another request (a corrupted ``open``) cannot add a differently encoded input."""
    body = request.to_bytes(clients=clients)
    return hashlib.sha256(b"secure-fl/paillier/request" + run_id + body).digest()[:DIGEST_BYTES]


def read_digest(reader: Reader, expected: bytes) -> None:
    if not secrets.compare_digest(reader.raw(DIGEST_BYTES), expected):
        raise WireError("the message belongs to another request than this party's")


def write_ciphertexts(writer: Writer, key: raw.PublicKey, ciphertexts: Sequence[Any]) -> Writer:
    writer.raw(key.fingerprint).u32(len(ciphertexts))
    width = key.ciphertext_bytes
    for c in ciphertexts:
        writer.uint(int(c), width)
    return writer


def encrypted_upload(keys: ClientKeys, layout: PackingLayout, encoded: npt.NDArray[np.uint64], digest: bytes) -> bytes:
    """A client's upload of its encoded vector: the request digest, then one ciphertext per packed
    plaintext, each obfuscated with the next r^n from the client's own pool."""
    key = keys.public_key
    plaintexts = layout.pack(encoded)
    ciphertexts = [raw.encrypt_with(key, m, keys.pool.take()) for m in plaintexts]
    return write_ciphertexts(Writer().raw(digest), key, ciphertexts).finish()


def read_ciphertexts(reader: Reader, key: raw.PublicKey, expected: int, *, unit_check: bool = True) -> list[Any]:
    """Parse and check ciphertexts; the server may defer the unit check to the product (one gcd)."""
    raw.check_key(key, reader.raw(raw.FINGERPRINT_BYTES))
    count = reader.u32()
    if count != expected:
        raise WireError(f"expected {expected} ciphertexts, got {count}")
    width = key.ciphertext_bytes
    check = raw.check_ciphertext if unit_check else raw.check_range
    return [check(key, reader.uint(width)) for _ in range(count)]
