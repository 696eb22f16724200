"""Raw Paillier on gmpy2 integers, with g = n + 1 and obfuscators precomputable offline.

Keys come from ``phe`` (primes from ``random.SystemRandom``); everything on the hot
path is done here on ``gmpy2.mpz`` because phe's ``EncryptedNumber`` re-derives
exponents and wraps every integer in Python objects.

Encryption of m is ``(1 + n*m) * r^n mod n^2``. The whole cost is ``r^n``, which does
not depend on m: a client fills an :class:`ObfuscatorPool` ahead of time and
encrypts online with one multiplication. A client that holds the key (``keyholder="all"``,
Dubhe) computes the same r^n through the factors, mod p^2 and q^2, in about half the time.
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass, field
from typing import Any

import gmpy2
from phe import paillier as phe_paillier

from ..errors import CiphertextError, ForeignKeyError, ProtocolError

MIN_TEST_KEY_BITS = 512
MIN_KEY_BITS = 2048
FINGERPRINT_BYTES = 16


@dataclass(frozen=True, eq=False)
class PublicKey:
    """The modulus n and what is derived from it; compared by fingerprint."""

    n: Any  # gmpy2.mpz
    n_square: Any = field(init=False)
    fingerprint: bytes = field(init=False)

    def __post_init__(self) -> None:
        n = gmpy2.mpz(self.n)
        if n < 3 or n % 2 == 0:
            raise ProtocolError("a Paillier modulus must be an odd integer > 2")
        object.__setattr__(self, "n", n)
        object.__setattr__(self, "n_square", n * n)
        object.__setattr__(self, "fingerprint", fingerprint_of(n))

    @property
    def bits(self) -> int:
        return int(gmpy2.bit_length(self.n))

    @property
    def plaintext_capacity_bits(self) -> int:
        """Packed plaintexts use at most this many bits, so they stay below n."""
        return self.bits - 1

    @property
    def ciphertext_bytes(self) -> int:
        return (int(gmpy2.bit_length(self.n_square)) + 7) // 8

    def to_bytes(self) -> bytes:
        return int(self.n).to_bytes((self.bits + 7) // 8, "big")

    @classmethod
    def from_bytes(cls, data: bytes) -> PublicKey:
        return cls(gmpy2.mpz(int.from_bytes(data, "big")))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, PublicKey) and self.fingerprint == other.fingerprint

    def __hash__(self) -> int:
        return hash(self.fingerprint)

    def __repr__(self) -> str:
        return f"PublicKey(bits={self.bits}, fingerprint={self.fingerprint.hex()})"


def fingerprint_of(n: Any) -> bytes:
    raw = int(n).to_bytes((int(gmpy2.bit_length(n)) + 7) // 8, "big")
    return hashlib.sha256(b"secure-fl/paillier-n" + raw).digest()[:FINGERPRINT_BYTES]


class PrivateKey:
    """The factors of n with phe's CRT decryption. Never serialised unless asked (:meth:`export_secret`)."""

    def __init__(self, public_key: PublicKey, p: int, q: int) -> None:
        p_, q_ = gmpy2.mpz(p), gmpy2.mpz(q)
        if p_ * q_ != public_key.n:
            raise ProtocolError("p * q does not match the public modulus")
        self.public_key = public_key
        self._phe = phe_paillier.PaillierPrivateKey(
            phe_paillier.PaillierPublicKey(int(public_key.n)), int(p), int(q)
        )
        p_square, q_square = p_ * p_, q_ * q_
        # Z*_{p^2} has order p(p-1): the exponent n reduces modulo it.
        self._crt = (p_square, q_square, public_key.n % (p_ * (p_ - 1)), public_key.n % (q_ * (q_ - 1)),
                     gmpy2.invert(q_square, p_square))

    def decrypt(self, ciphertext: Any) -> int:
        return int(self._phe.raw_decrypt(int(ciphertext)))

    def obfuscator(self, r: Any | None = None) -> Any:
        """The value :func:`obfuscator` computes, r^n mod n^2, through the factors.

        Two exponentiations mod p^2 and q^2 with exponents reduced mod p(p-1) and q(q-1),
        joined by the CRT: the same integer for the same r (a known-answer test checks it),
        so nothing about the ciphertexts' distribution changes.
        """
        if r is None:
            r = random_unit(self.public_key)
        elif gmpy2.gcd(r, self.public_key.n) != 1:
            raise ProtocolError("r must be a unit mod n")  # the reduced exponents assume it
        p_square, q_square, exp_p, exp_q, q_square_inv = self._crt
        r = gmpy2.mpz(r)
        mod_p = gmpy2.powmod(r % p_square, exp_p, p_square)
        mod_q = gmpy2.powmod(r % q_square, exp_q, q_square)
        return mod_q + q_square * gmpy2.f_mod((mod_p - mod_q) * q_square_inv, p_square)

    def export_secret(self) -> tuple[int, int]:
        """The primes, for sharing the key with other clients over an authenticated channel."""
        return int(self._phe.p), int(self._phe.q)

    def __repr__(self) -> str:
        return f"PrivateKey(<secret>, public={self.public_key!r})"


def generate_keypair(bits: int = MIN_KEY_BITS, *, allow_weak: bool = False) -> tuple[PublicKey, PrivateKey]:
    """A fresh key pair; below 2048 bits only when a test says ``allow_weak``."""
    if bits < MIN_KEY_BITS and not (allow_weak and bits >= MIN_TEST_KEY_BITS):
        raise ProtocolError(
            f"Paillier keys below {MIN_KEY_BITS} bits are for tests only (got {bits})"
        )
    phe_public, phe_private = phe_paillier.generate_paillier_keypair(n_length=bits)
    public = PublicKey(gmpy2.mpz(phe_public.n))
    return public, PrivateKey(public, phe_private.p, phe_private.q)


def random_unit(public_key: PublicKey) -> Any:
    """r uniform in Z_n^* from the OS's CSPRNG."""
    n = public_key.n
    while True:
        r = gmpy2.mpz(secrets.randbelow(int(n) - 1) + 1)
        if gmpy2.gcd(r, n) == 1:
            return r


def obfuscator(public_key: PublicKey, r: Any | None = None, *, private_key: PrivateKey | None = None) -> Any:
    """r^n mod n^2: the expensive, message-independent half of an encryption (through the
    factors when the caller holds ``private_key``)."""
    if private_key is not None:
        if private_key.public_key != public_key:
            raise ForeignKeyError("the private key belongs to another public key")
        return private_key.obfuscator(r)
    if r is None:
        r = random_unit(public_key)
    return gmpy2.powmod(gmpy2.mpz(r), public_key.n, public_key.n_square)


def encrypt_with(public_key: PublicKey, plaintext: int, obfuscator_value: Any) -> Any:
    """Encrypt with a given r^n: one multiplication mod n^2."""
    if not 0 <= plaintext < public_key.n:
        raise ProtocolError("Paillier plaintext out of range [0, n)")
    n, n2 = public_key.n, public_key.n_square
    return gmpy2.f_mod((1 + n * gmpy2.mpz(plaintext)) * obfuscator_value, n2)


def rerandomise(public_key: PublicKey, ciphertext: Any, obfuscator_value: Any | None = None) -> Any:
    """``ciphertext`` times a fresh encryption of 0 (``r^n``): the same plaintext under a new,
    uniformly random obfuscator, so the result cannot be linked to the ciphertexts it was
    computed from (an aggregate to its contributions)."""
    value = obfuscator_value if obfuscator_value is not None else obfuscator(public_key)
    return gmpy2.f_mod(gmpy2.mpz(ciphertext) * value, public_key.n_square)


def add(public_key: PublicKey, left: Any, right: Any) -> Any:
    return gmpy2.f_mod(left * right, public_key.n_square)


def check_range(public_key: PublicKey, value: Any) -> Any:
    """Cheap check on receipt: 0 < c < n^2. Invertibility is checked on the product (see :func:`product`)."""
    c = gmpy2.mpz(value)
    if not 0 < c < public_key.n_square:
        raise CiphertextError("ciphertext out of range (0, n^2)")
    return c


def check_ciphertext(public_key: PublicKey, value: Any) -> Any:
    """A ciphertext must be a unit mod n^2: in range and coprime to n."""
    c = check_range(public_key, value)
    if gmpy2.gcd(c, public_key.n) != 1:
        raise CiphertextError("ciphertext is not invertible mod n^2")
    return c


def product(public_key: PublicKey, ciphertexts: list[Any]) -> Any:
    """Homomorphic sum of range-checked ciphertexts, with one unit check for all of them.

    gcd(a*b, n) = 1 exactly when both gcd(a, n) = 1 and gcd(b, n) = 1, so checking the
    product once replaces a gcd per ciphertext (which costs more than the multiplication).
    """
    if not ciphertexts:
        raise CiphertextError("nothing to add")
    n2 = public_key.n_square
    acc = ciphertexts[0]
    for c in ciphertexts[1:]:
        acc = gmpy2.f_mod(acc * c, n2)
    if gmpy2.gcd(acc, public_key.n) != 1:
        raise CiphertextError("a ciphertext in the product is not invertible mod n^2")
    return acc


def check_key(expected: PublicKey, fingerprint: bytes) -> None:
    if not secrets.compare_digest(expected.fingerprint, fingerprint):
        raise ForeignKeyError("ciphertexts were made under another Paillier key")


class ObfuscatorPool:
    """r^n values a client computes offline and spends online, one per ciphertext.

    Each value is used once (reuse would let anyone divide two ciphertexts and
    learn the difference of plaintexts); when the pool is empty we compute on demand.
    A pool given the ``private_key`` computes through the factors.
    """

    def __init__(self, public_key: PublicKey) -> None:
        self.public_key = public_key
        self.private_key: PrivateKey | None = None
        self._values: list[Any] = []
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._values)

    def fill(self, count: int) -> None:
        self._values.extend(obfuscator(self.public_key, private_key=self.private_key) for _ in range(count))

    def take(self) -> Any:
        if self._values:
            self.hits += 1
            return self._values.pop()
        self.misses += 1
        return obfuscator(self.public_key, private_key=self.private_key)
