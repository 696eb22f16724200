"""CKKS parameters, their derivation from what is summed, and CKKS key sets on TenSEAL.

Hazardous layer: no protocol logic here, only what a CKKS secure sum needs —

* :class:`CkksParameters`: ring degree N, modulus chain and scale, validated against the
  128-bit-security table (:data:`~protocols.primitives.seal.MAX_COEFF_BITS_128`), with the
  error bound of a sum (:meth:`CkksParameters.error_bound`);
* :func:`derive`: the smallest ring and modulus chain for a sum of ``n`` integers of at most
  ``entry_max`` that decrypts within 1/4 of the exact sum (so rounding makes it exact);
* :func:`generate` makes a key pair and serialises its two halves separately: the *public
  context* (parameters + public key, **no** secret key, **no** Galois or relinearisation keys —
  a sum needs none of them) and the secret key alone;
* :class:`PublicContext` encrypts with the public key, loads ciphertexts from the wire and adds
  them; :class:`SecretContext` encrypts with the secret key (seeded ciphertexts, half the bytes)
  and decrypts. Framing checks and serialisation are :mod:`protocols.primitives.seal`'s.

**Two reals per slot.** CKKS has N/2 complex slots; a chunk of up to N entries is encoded as
``x[0] + i x[1], x[2] + i x[3], ...``, so a ciphertext carries N values, not N/2 — half the bytes
per value of encoding reals alone, at the same error (the bound below holds for the complex
slot, so for both its parts).

**Error bound.** Decrypting a sum of ``n`` fresh encryptions whose exact sum has magnitude at
most ``M`` per entry gives every entry within ::

    eps(n, M) = n * nu / Delta  +  N * M * 2**-50

of the exact sum, ``Delta = 2**scale_bits``, with the per-encryption noise ``nu`` (in units
of the scaled plaintext; high-probability bounds on the canonical embedding, as in
Cheon–Kim–Kim–Song 2017, sigma = 3.2, secret Hamming weight h <= N):

* public key (SEAL encrypts at the key level, then divides by the special prime p and rounds):
  ``nu = B_clean / p + B_rs + N/2`` with ``B_clean = 8 sqrt(2) sigma N + 6 sigma sqrt(N) +
  16 sigma sqrt(h N)`` (Lemma 1) and the rounding term ``B_rs = sqrt(N/3) (3 + 8 sqrt(h))``
  (Lemma 2);
* secret key (SEAL encrypts at the data level: the noise is one error polynomial):
  ``nu = 6 sigma sqrt(N) + N/2``.

``N/2`` bounds the encoder's rounding of coefficients to integers, and the last term the
double-precision error of SEAL's encoding and decoding FFTs (two reals per slot included).
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

from ..errors import CapacityError, CiphertextError, WireError
from .seal import (
    FINGERPRINT_BYTES,
    MAX_COEFF_BITS_128,
    MAX_PRIME_BITS,
    MIN_PRIME_BITS,
    NOISE_SIGMA,
    RINGS,
    Codec,
    PublicKeys,
    SealParameters,
    SecretKeys,
    StreamLayout,
    TenSealVector,
    check_fingerprint,
    check_ring,
    check_stream,
    coeff_primes,
    fingerprint_of,
    generate,
    split_bits,
    wrap,
)

__all__ = [
    "FINGERPRINT_BYTES", "MAX_COEFF_BITS_128", "NOISE_SIGMA", "ROUNDING_MARGIN", "CkksParameters", "CkksVector",
    "PublicContext", "SecretContext", "StreamLayout", "check_capacity", "check_fingerprint", "check_stream",
    "derive", "fingerprint_of", "generate", "noise",
]

FloatArray = npt.NDArray[np.float64]
CkksVector = TenSealVector
ROUNDING_MARGIN: Final = 0.25
"""Largest CKKS error (in encoded units) a sum may have; rounding is exact below 1/2."""
_FFT_BITS: Final = 50


@dataclass(frozen=True)
class CkksParameters(SealParameters):
    """CKKS encryption parameters; validated so that TenSEAL never sees a nonsensical set."""

    poly_modulus_degree: int
    coeff_mod_bit_sizes: tuple[int, ...]
    scale_bits: int
    scheme: ClassVar[str] = "ckks"

    def __post_init__(self) -> None:
        object.__setattr__(self, "coeff_mod_bit_sizes", tuple(self.coeff_mod_bit_sizes))
        check_ring(self.poly_modulus_degree, self.coeff_mod_bit_sizes)
        if not isinstance(self.scale_bits, int) or isinstance(self.scale_bits, bool) or not 1 <= self.scale_bits <= 60:
            raise ValueError(f"scale_bits must be an integer in [1, 60], got {self.scale_bits!r}")
        if self.scale_bits >= self.data_bits - 1:
            raise ValueError(f"scale 2**{self.scale_bits} leaves no room below the {self.data_bits}-bit data modulus")

    def __str__(self) -> str:
        return (f"CKKS N={self.poly_modulus_degree}, moduli {list(self.coeff_mod_bit_sizes)} bits, "
                f"scale 2**{self.scale_bits}")

    @property
    def slots(self) -> int:
        """Complex slots per ciphertext (each carries two entries of a vector)."""
        return self.poly_modulus_degree // 2

    @property
    def values_per_ciphertext(self) -> int:
        return self.poly_modulus_degree

    @property
    def scale(self) -> float:
        return float(2**self.scale_bits)

    def fresh_noise(self, *, symmetric: bool = False) -> float:
        """Per-entry error of one fresh encryption, in entry units (``nu / Delta``, module docstring)."""
        return noise(self.poly_modulus_degree, self.special_bits, symmetric=symmetric) / self.scale

    def error_bound(self, summands: int, magnitude: float, *, symmetric: bool = False) -> float:
        """``eps(n, M)``: largest error of one decrypted entry of a sum of ``summands`` fresh
        encryptions (all secret-key ones when ``symmetric``) whose exact sum has absolute value
        at most ``magnitude``."""
        fft = self.poly_modulus_degree * magnitude * 2.0**-_FFT_BITS
        return summands * self.fresh_noise(symmetric=symmetric) + fft

    def probe_error(self) -> float:
        return self.error_bound(1, 1.0)

    def max_magnitude(self) -> float:
        """Largest entry the data modulus holds with a bit to spare (``|x| * Delta < q/4``)."""
        return 2.0 ** (self.data_bits - self.scale_bits - 2)

    def context(self) -> Any:
        ctx = ts.context(ts.SCHEME_TYPE.CKKS, poly_modulus_degree=self.poly_modulus_degree,
                         coeff_mod_bit_sizes=list(self.coeff_mod_bit_sizes), n_threads=1)
        ctx.global_scale = self.scale
        return ctx

    def codec(self, seal: Any) -> CkksCodec:
        return CkksCodec(self, seal)

    def matches(self, parms: Any) -> bool:
        return bool(parms.scheme() == ts.SCHEME_TYPE.CKKS.value)

    def to_bytes(self) -> bytes:
        bits = self.coeff_mod_bit_sizes
        return struct.pack(f">IB{len(bits)}BB", self.poly_modulus_degree, len(bits), *bits, self.scale_bits)

    @classmethod
    def from_bytes(cls, data: bytes) -> CkksParameters:
        """Strict: exactly one parameter set, valid at 128-bit security (``WireError`` otherwise)."""
        if len(data) < 6 or len(data) != 6 + data[4]:
            raise WireError("CKKS parameters have the wrong length")
        degree, count = struct.unpack_from(">IB", data)
        bits = tuple(data[5 : 5 + count])
        try:
            return cls(degree, bits, data[5 + count])
        except ValueError as error:
            raise WireError(f"impossible CKKS parameters: {error}") from None


def check_capacity(params: CkksParameters, summands: int, entry_max: int, *, symmetric: bool = False) -> None:
    """Refuse a sum of ``summands`` entries of at most ``entry_max`` that CKKS under ``params``
    cannot carry exactly (its error bound must stay within :data:`ROUNDING_MARGIN`)."""
    magnitude = float(summands * entry_max)
    if magnitude > params.max_magnitude():
        raise CapacityError(
            f"sums up to {magnitude:.6g} do not fit the {params.data_bits}-bit data modulus at scale "
            f"2**{params.scale_bits}; lower the bound or precision, or the scale"
        )
    eps = params.error_bound(summands, magnitude, symmetric=symmetric)
    if eps > ROUNDING_MARGIN:
        raise CapacityError(
            f"CKKS error bound {eps:.3g} for {summands} summands of up to {entry_max} exceeds "
            f"{ROUNDING_MARGIN}, so sums would not round exactly; lower frac_bits, the bound or the "
            "number of summands, or raise scale_bits"
        )


def derive(*, summands: int, entry_max: int, symmetric: bool, ring: int | None = None) -> CkksParameters:
    """The smallest ring, then the smallest modulus chain, that sums ``summands`` integers in
    ``[0, entry_max]`` exactly at 128-bit security (:class:`CapacityError` naming why not).

    For each N from the smallest: the scale is the least power of two keeping
    :meth:`CkksParameters.error_bound` within 1/4, the data modulus the least that holds the
    largest sum at that scale (:meth:`~CkksParameters.max_magnitude`) — one prime up to 60 bits,
    more beyond — and the special prime as large as the security table leaves room for (up to
    60 bits; it divides the public-key encryption noise). Spare bits of a data prime that must be
    at least 20 bits raise the scale. ``symmetric``: every summand is encrypted with the secret
    key (every contributor holds it). ``ring`` fixes N.
    """
    if summands < 1 or entry_max < 1:
        raise CapacityError("a sum needs at least one summand and a positive bound")
    magnitude = summands * entry_max
    magnitude_bits = (magnitude - 1).bit_length()  # ceil(log2 M): M <= 2**magnitude_bits
    reasons: list[str] = []
    for n in RINGS if ring is None else (ring,):
        budget = MAX_COEFF_BITS_128.get(n)
        if budget is None:
            raise CapacityError(f"ring degree N = {n} is not one of {list(RINGS)}")
        room = ROUNDING_MARGIN - n * magnitude * 2.0**-_FFT_BITS
        if room <= 0:
            reasons.append(f"N={n}: double-precision decoding alone errs by more than {ROUNDING_MARGIN}")
            continue
        special = MAX_PRIME_BITS
        found: CkksParameters | None = None
        for _ in range(4):  # the special prime's size moves the public-key noise a little: settle it
            nu = noise(n, special, symmetric=symmetric)
            scale_bits = max(1, math.ceil(math.log2(summands * nu / room)))
            data_bits = max(MIN_PRIME_BITS, scale_bits + 2 + magnitude_bits)
            scale_bits = data_bits - 2 - magnitude_bits  # spend spare bits of the data prime on precision
            fits = min(MAX_PRIME_BITS, budget - data_bits)
            if fits < MIN_PRIME_BITS or scale_bits > 60:
                break
            if fits < special:
                special = fits
                continue
            try:
                params = CkksParameters(n, (*split_bits(data_bits), special), scale_bits)
                coeff_primes(n, params.coeff_mod_bit_sizes)
                check_capacity(params, summands, entry_max, symmetric=symmetric)
            except (ValueError, CapacityError):
                break
            found = params
            break
        if found is not None:
            return found
        reasons.append(f"N={n}: a {MAX_COEFF_BITS_128[n]}-bit modulus cannot hold the sum at the needed scale")
    raise CapacityError(
        f"CKKS cannot sum {summands} entries of up to {entry_max} exactly at 128-bit security "
        f"({'; '.join(reasons[-2:])}); lower the bound, the precision or the number of summands, "
        "or use bfv, paillier or masking"
    )


def noise(n: int, special_bits: int, *, symmetric: bool) -> float:
    """``nu``: one fresh encryption's error bound in units of the scaled plaintext (module docstring)."""
    s, fn = NOISE_SIGMA, float(n)
    h = fn  # Hamming weight of the ternary secret; SEAL samples it uniformly, so h <= N
    encoding = fn / 2
    if symmetric:
        return 6 * s * math.sqrt(fn) + encoding
    b_clean = 8 * math.sqrt(2) * s * fn + 6 * s * math.sqrt(fn) + 16 * s * math.sqrt(h * fn)
    b_rs = math.sqrt(fn / 3) * (3 + 8 * math.sqrt(h))
    return b_clean / 2.0 ** (special_bits - 1) + b_rs + encoding


class CkksCodec(Codec):
    """Two entries per complex slot: ``x[2k] + i x[2k+1]``."""

    def __init__(self, params: CkksParameters, seal: Any) -> None:
        self.params = params
        self._encoder = sealapi.CKKSEncoder(seal)
        self._scale = params.scale

    def encode(self, chunk: npt.NDArray[Any]) -> Any:
        values = np.asarray(chunk, dtype=np.float64)
        if not np.all(np.isfinite(values)) or float(np.max(np.abs(values))) > self.params.max_magnitude():
            raise CapacityError(f"values must be finite and at most {self.params.max_magnitude()} in magnitude")
        if values.size % 2:
            values = np.append(values, 0.0)
        plain = sealapi.Plaintext()
        self._encoder.encode(np.ascontiguousarray(values).view(np.complex128).tolist(), self._scale, plain)
        return plain

    def decode(self, plain: Any, size: int) -> npt.NDArray[Any]:
        slots = np.asarray(self._encoder.decode_complex(plain), dtype=np.complex128)
        return slots.view(np.float64)[:size].copy()

    def vector(self, ctx: Any, stream: bytes, size: int) -> TenSealVector:
        return ts.ckks_vector_from(ctx, wrap(stream, (size + 1) // 2, self._scale))

    def fresh(self, ct: Any, vector: TenSealVector, size: int) -> bool:
        return (bool(ct.is_ntt_form()) and float(ct.scale) == self._scale
                and int(vector.size()) == (size + 1) // 2)


class PublicContext(PublicKeys):
    """A CKKS public context: parameters and public key (see :class:`~protocols.primitives.seal.PublicKeys`)."""

    params: CkksParameters

    def __init__(self, data: bytes, params: CkksParameters) -> None:
        if not isinstance(params, CkksParameters):
            raise TypeError("a CKKS context needs CkksParameters")
        super().__init__(data, params)


class SecretContext(SecretKeys):
    """A CKKS secret key bound to its public context."""

    public: PublicContext

    def decrypt(self, streams: list[bytes], sizes: list[int]) -> FloatArray:
        """The entries of serialised (full) ciphertexts, concatenated."""
        values, _ = self.open(streams, sizes)
        values = values.astype(np.float64)
        if not np.all(np.isfinite(values)):
            raise CiphertextError("decryption produced non-finite values")
        return values

