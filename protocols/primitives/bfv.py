"""BFV parameters, their derivation from what is summed, and BFV key sets on TenSEAL.

Hazardous layer, the exact sibling of :mod:`protocols.primitives.ckks`:

* :class:`BfvParameters`: ring degree N, modulus chain and plaintext modulus t (a prime that is
  1 mod 2N, so one ciphertext batches N integers), validated against the 128-bit-security table;
* :func:`derive`: the smallest ring and modulus chain for a sum of ``n`` integers of at most
  ``entry_max``: t above the largest possible sum (so the sum never wraps modulo t), and a
  data modulus q above the sum's worst-case noise;
* :class:`PublicContext` / :class:`SecretContext` as for CKKS (seeded symmetric-key
  ciphertexts for clients holding the key).

**Noise, worst case.** Decryption returns the slot sums modulo t exactly when the infinity
norm of the aggregate's noise stays below ``q / (2t)``. A fresh ciphertext's noise (SEAL's
error coefficients are at most ``B = 21``, the secret is ternary, and the plaintext enters as
``round(q m / t)``, off by at most 1/2 per coefficient) is at most

* secret key: ``nu = B + 1/2`` (one error polynomial, at the data level);
* public key: ``nu = (2N + 1) B / p + (N + 1)/2 + 1/2`` (SEAL encrypts at the key level,
  ``e u + e0 + e1 s``, then divides by the special prime p and rounds: ``r0 + r1 s``),

and a sum of ``n`` has at most ``n * nu``. These bounds are deterministic, not
high-probability ones. SEAL's *invariant noise budget* of a ciphertext is ``bits(q) -
bits(||t (c0 + c1 s) mod q||) - 1``, so an honest sum of ``n`` has at least
:meth:`BfvParameters.min_budget` bits; parameters are chosen with that at least 1 (which
implies correct decryption), and a key holder refuses an aggregate with less — a ciphertext
under another key, or corrupted, decrypts with noise near ``q/2`` in some coefficient and a
budget of 0.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from typing import Any, ClassVar, Final

import numpy as np
import numpy.typing as npt
import tenseal as ts
from tenseal import sealapi

from ..errors import CapacityError, CiphertextError, EncodingError, WireError
from .seal import (
    MAX_COEFF_BITS_128,
    MAX_PRIME_BITS,
    MIN_PRIME_BITS,
    NOISE_MAX,
    RINGS,
    Codec,
    PublicKeys,
    SealParameters,
    SecretKeys,
    TenSealVector,
    batching_prime,
    check_ring,
    coeff_primes,
    generate,
    split_bits,
    wrap,
)

__all__ = ["BfvParameters", "PublicContext", "SecretContext", "check_capacity", "derive", "generate", "noise"]

UIntArray = npt.NDArray[np.uint64]
_MR_BASES: Final = (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37)


def is_prime(value: int) -> bool:
    """Deterministic Miller–Rabin (exact for every value below 3.3e24, so for any 64-bit modulus)."""
    if value < 2:
        return False
    for p in _MR_BASES:
        if value % p == 0:
            return value == p
    d, r = value - 1, 0
    while d % 2 == 0:
        d, r = d // 2, r + 1
    for a in _MR_BASES:
        x = pow(a, d, value)
        if x in (1, value - 1):
            continue
        for _ in range(r - 1):
            x = x * x % value
            if x == value - 1:
                break
        else:
            return False
    return True


def noise(n: int, special_bits: int, *, symmetric: bool) -> float:
    """``nu``: largest coefficient of one fresh ciphertext's noise (module docstring)."""
    if symmetric:
        return NOISE_MAX + 0.5
    return (2 * n + 1) * NOISE_MAX / 2.0 ** (special_bits - 1) + (n + 1) / 2 + 0.5


@dataclass(frozen=True)
class BfvParameters(SealParameters):
    """BFV encryption parameters; validated so that TenSEAL never sees a nonsensical set."""

    poly_modulus_degree: int
    coeff_mod_bit_sizes: tuple[int, ...]
    plain_modulus: int
    scheme: ClassVar[str] = "bfv"

    def __post_init__(self) -> None:
        object.__setattr__(self, "coeff_mod_bit_sizes", tuple(self.coeff_mod_bit_sizes))
        check_ring(self.poly_modulus_degree, self.coeff_mod_bit_sizes)
        t = self.plain_modulus
        if not isinstance(t, int) or isinstance(t, bool) or not 2 < t < 2**MAX_PRIME_BITS:
            raise ValueError(f"plain_modulus must be an integer below 2**{MAX_PRIME_BITS}, got {t!r}")
        if t % (2 * self.poly_modulus_degree) != 1 or not is_prime(t):
            raise ValueError(f"plain_modulus {t} must be a prime that is 1 mod 2N = {2 * self.poly_modulus_degree} "
                             "(for batching)")
        if t.bit_length() >= self.data_bits:
            raise ValueError(f"plain_modulus of {t.bit_length()} bits leaves no room in a {self.data_bits}-bit "
                             "data modulus")

    def __str__(self) -> str:
        return (f"BFV N={self.poly_modulus_degree}, moduli {list(self.coeff_mod_bit_sizes)} bits, "
                f"t={self.plain_modulus}")

    @property
    def values_per_ciphertext(self) -> int:
        return self.poly_modulus_degree

    @property
    def data_modulus_bits(self) -> int:
        """``bits(q)`` as SEAL counts it: the bit length of the product of the data primes."""
        q = 1
        for prime in coeff_primes(self.poly_modulus_degree, self.coeff_mod_bit_sizes)[:-1]:
            q *= prime
        return q.bit_length()

    def fresh_noise(self, *, symmetric: bool = False) -> float:
        return noise(self.poly_modulus_degree, self.special_bits, symmetric=symmetric)

    def min_budget(self, summands: int, *, symmetric: bool = False) -> int:
        """Fewest bits of invariant noise budget an honest sum of ``summands`` fresh ciphertexts has."""
        worst = math.floor(self.plain_modulus * summands * self.fresh_noise(symmetric=symmetric))
        return self.data_modulus_bits - worst.bit_length() - 1

    def context(self) -> Any:
        return ts.context(ts.SCHEME_TYPE.BFV, poly_modulus_degree=self.poly_modulus_degree,
                          plain_modulus=self.plain_modulus, coeff_mod_bit_sizes=list(self.coeff_mod_bit_sizes),
                          n_threads=1)

    def codec(self, seal: Any) -> BfvCodec:
        return BfvCodec(self, seal)

    def matches(self, parms: Any) -> bool:
        return bool(parms.scheme() == ts.SCHEME_TYPE.BFV.value
                    and int(parms.plain_modulus().value()) == self.plain_modulus)

    def to_bytes(self) -> bytes:
        bits = self.coeff_mod_bit_sizes
        return struct.pack(f">IB{len(bits)}BQ", self.poly_modulus_degree, len(bits), *bits, self.plain_modulus)

    @classmethod
    def from_bytes(cls, data: bytes) -> BfvParameters:
        """Strict: exactly one parameter set, valid at 128-bit security (``WireError`` otherwise)."""
        if len(data) < 5 or len(data) != 13 + data[4]:
            raise WireError("BFV parameters have the wrong length")
        degree, count = struct.unpack_from(">IB", data)
        bits = tuple(data[5 : 5 + count])
        (plain,) = struct.unpack_from(">Q", data, 5 + count)
        try:
            return cls(degree, bits, plain)
        except ValueError as error:
            raise WireError(f"impossible BFV parameters: {error}") from None


def check_capacity(params: BfvParameters, summands: int, entry_max: int, *, symmetric: bool = False) -> None:
    """Refuse a sum that could wrap modulo t or whose noise could spoil decryption."""
    top = summands * entry_max
    if top >= params.plain_modulus:
        raise CapacityError(f"sums up to {top} do not fit below the plaintext modulus {params.plain_modulus}")
    if params.min_budget(summands, symmetric=symmetric) < 1:
        raise CapacityError(
            f"a sum of {summands} BFV ciphertexts could exceed the noise {params} decrypts correctly; "
            "use a larger coefficient modulus or fewer summands"
        )


def derive(*, summands: int, entry_max: int, symmetric: bool, ring: int | None = None) -> BfvParameters:
    """The smallest ring, then the smallest modulus chain, that sums ``summands`` integers in
    ``[0, entry_max]`` exactly at 128-bit security (:class:`CapacityError` naming why not).

    t is SEAL's batching prime of ``bits(n * entry_max) + 1`` bits (so above every possible sum;
    one bit more than the least, so that statistics whose sums share a bit length share a key
    set), or of more bits when no prime of that size is 1 mod 2N. The data modulus is the least
    number of bits giving an honest sum a noise budget of at least one bit, the special prime as
    large as the security table leaves room for (up to 60 bits).
    """
    if summands < 1 or entry_max < 1:
        raise CapacityError("a sum needs at least one summand and a positive bound")
    top = summands * entry_max
    reasons: list[str] = []
    for n in RINGS if ring is None else (ring,):
        budget = MAX_COEFF_BITS_128.get(n)
        if budget is None:
            raise CapacityError(f"ring degree N = {n} is not one of {list(RINGS)}")
        plain = _plain_modulus(n, top)
        if plain is None:
            reasons.append(f"N={n}: no plaintext prime above {top}")
            continue
        special = MAX_PRIME_BITS
        found: BfvParameters | None = None
        for _ in range(6):
            worst = math.floor(plain * summands * noise(n, special, symmetric=symmetric))
            data_bits = max(MIN_PRIME_BITS, worst.bit_length() + 2, plain.bit_length() + 1)
            fits = min(MAX_PRIME_BITS, budget - data_bits)
            if fits < MIN_PRIME_BITS:
                break
            if fits < special:
                special = fits
                continue
            try:
                params = BfvParameters(n, (*split_bits(data_bits), special), plain)
                primes = coeff_primes(n, params.coeff_mod_bit_sizes)
                if plain in primes or params.min_budget(summands, symmetric=symmetric) < 1:
                    special = min(special, budget - data_bits - 1)  # a bit more data modulus, same ring
                    continue
                check_capacity(params, summands, entry_max, symmetric=symmetric)
            except (ValueError, CapacityError):
                break
            found = params
            break
        if found is not None:
            return found
        reasons.append(f"N={n}: a {budget}-bit modulus cannot carry the noise of the sum")
    raise CapacityError(
        f"BFV cannot sum {summands} entries of up to {entry_max} exactly at 128-bit security "
        f"({'; '.join(reasons[-2:])}); lower the bound or the number of summands, or use paillier or masking"
    )


def _plain_modulus(n: int, top: int) -> int | None:
    """SEAL's batching prime with one bit more than the largest sum (more when none has that size)."""
    for bits in range(max(top.bit_length() + 1, (2 * n).bit_length() + 1), MAX_PRIME_BITS + 1):
        try:
            prime = batching_prime(n, bits)
        except CapacityError:
            continue
        if prime > top:
            return prime
    return None


class BfvCodec(Codec):
    """One entry per slot (SEAL's batching: N slots modulo t)."""

    def __init__(self, params: BfvParameters, seal: Any) -> None:
        self.params = params
        self._encoder = sealapi.BatchEncoder(seal)

    def encode(self, chunk: npt.NDArray[Any]) -> Any:
        values = np.asarray(chunk)
        if values.dtype.kind == "f":
            if not np.all(np.isfinite(values)) or np.any(values != np.round(values)):
                raise EncodingError("BFV encrypts integers")
            values = values.astype(np.int64)
        if values.dtype.kind not in "iu":
            raise EncodingError(f"BFV encrypts integers, got dtype {values.dtype}")
        if values.size and (int(values.min()) < 0 or int(values.max()) >= self.params.plain_modulus):
            raise CapacityError(f"values must lie in [0, {self.params.plain_modulus})")
        plain = sealapi.Plaintext()
        self._encoder.encode(values.astype(np.uint64).tolist(), plain)
        return plain

    def decode(self, plain: Any, size: int) -> npt.NDArray[Any]:
        return np.asarray(self._encoder.decode_uint64(plain), dtype=np.uint64)[:size].copy()

    def vector(self, ctx: Any, stream: bytes, size: int) -> TenSealVector:
        return ts.bfv_vector_from(ctx, wrap(stream, size))

    def fresh(self, ct: Any, vector: TenSealVector, size: int) -> bool:
        return not bool(ct.is_ntt_form()) and float(ct.scale) == 1.0 and int(vector.size()) == size


class PublicContext(PublicKeys):
    """A BFV public context: parameters and public key."""

    params: BfvParameters

    def __init__(self, data: bytes, params: BfvParameters) -> None:
        if not isinstance(params, BfvParameters):
            raise TypeError("a BFV context needs BfvParameters")
        super().__init__(data, params)


class SecretContext(SecretKeys):
    """A BFV secret key bound to its public context."""

    public: PublicContext

    def decrypt(self, streams: list[bytes], sizes: list[int]) -> tuple[UIntArray, list[int]]:
        """The slot values (in ``[0, t)``) of serialised ciphertexts, concatenated, and each
        ciphertext's invariant noise budget."""
        values, budgets = self.open(streams, sizes)
        if values.dtype != np.uint64 or (values.size and int(values.max()) >= self.public.params.plain_modulus):
            raise CiphertextError("decryption produced values outside [0, t)")
        return values.astype(np.uint64), budgets
