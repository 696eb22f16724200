"""Encoding of real or integer vectors into non-negative integers that can be summed.

Kept apart from encryption (as in python-paillier's ``phe/encoding.py``) so that
every protocol — plain, Paillier, masking, CKKS — shares one set of invariants.

Invariants of a :class:`VectorSpec` (checked in ``__post_init__``):

* each entry ``x`` lies in ``[0, bound]`` (unsigned) or ``[-bound, bound]`` (signed);
  integers must be integral, floats are rounded to the nearest multiple of
  ``2**-frac_bits``;
* an encoded entry is an integer in ``[0, entry_max]`` with
  ``entry_max = m`` (unsigned) or ``2m`` (signed), where ``m = round(bound * scale)``;
  signed values are shifted by ``+m`` (offset encoding, so that packed slots
  never borrow from each other);
* a sum of at most ``summands`` encoded entries lies in ``[0, summands * entry_max]``,
  which is strictly below ``2**slot_bits`` with
  ``slot_bits = bits(entry_max) + ceil(log2(summands))`` — the headroom bits.
  So neither a packed Paillier slot nor a mod-``2**slot_bits`` masked sum can wrap;
* decoding a sum of ``k`` contributions removes ``k * m`` (signed) and divides by the scale.
  The error of a decoded float sum of ``k`` entries is at most ``k * 2**-(frac_bits+1)``
  (each entry rounds to nearest); integer sums are exact.

A value outside the bound raises :class:`~protocols.errors.BoundError`, or, when the
caller asks for ``clip=True``, is clipped to the bound and counted.

Exactness: integers are checked and encoded as integers end to end, never through float64
(whose 53-bit mantissa would round 2**53 + 1 and clip it silently): integer arrays are
compared with the bound in their own dtype, unsigned values above ``2**63 - 1`` and Python
integers beyond 64 bits are refused, a bound must be exactly representable, and
:func:`decode_sum` refuses (:class:`~protocols.errors.CapacityError`) a sum whose float64
result would not be exact; :func:`decode_sum_exact` returns any sum as int64.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from .errors import BoundError, CapacityError, EncodingError

MAX_SLOT_BITS = 63
"""Encoded sums live in uint64 arrays; one bit is kept free so int64 views never overflow."""

Kind = Literal["int", "float"]
UIntArray = npt.NDArray[np.uint64]
FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True, kw_only=True)
class VectorSpec:
    """What a secure sum adds up: enough to size every modulus and slot before any input is seen."""

    length: int
    bound: float
    summands: int
    kind: Kind = "int"
    signed: bool = False
    frac_bits: int = 16

    def __post_init__(self) -> None:
        if not isinstance(self.length, int) or isinstance(self.length, bool) or self.length < 1:
            raise EncodingError(f"length must be a positive integer, got {self.length!r}")
        if not isinstance(self.summands, int) or isinstance(self.summands, bool) or self.summands < 1:
            raise EncodingError(f"summands must be a positive integer, got {self.summands!r}")
        if self.kind not in ("int", "float"):
            raise EncodingError(f"kind must be 'int' or 'float', got {self.kind!r}")
        if isinstance(self.bound, bool) or not isinstance(self.bound, (int, float, np.integer, np.floating)):
            raise EncodingError(f"bound must be a number, got {self.bound!r}")
        if isinstance(self.bound, (int, np.integer)) and int(float(self.bound)) != int(self.bound):
            raise EncodingError(f"bound {int(self.bound)} is not exactly representable as a float64 (it is sent "
                                "as one): use a bound with at most 53 significant bits, e.g. a power of two")
        if not math.isfinite(self.bound) or self.bound <= 0:
            raise EncodingError(f"bound must be a finite positive number, got {self.bound!r}")
        if self.kind == "int" and float(self.bound) != int(self.bound):
            raise EncodingError(f"an integer spec needs an integral bound, got {self.bound!r}")
        if not isinstance(self.frac_bits, int) or not 0 <= self.frac_bits <= 52:
            raise EncodingError(f"frac_bits must be an integer in [0, 52], got {self.frac_bits!r}")
        if self.magnitude < 1:
            raise EncodingError(
                f"bound {self.bound} is below the resolution 2**-{self.frac_bits}; raise frac_bits"
            )
        if self.slot_bits > MAX_SLOT_BITS:
            raise CapacityError(
                f"{self.summands} summands of entries up to {self.entry_max} need "
                f"{self.slot_bits} bits per slot, more than {MAX_SLOT_BITS}; lower the bound, "
                "the precision or the number of summands"
            )

    @property
    def scale(self) -> int:
        return 1 if self.kind == "int" else 1 << self.frac_bits

    @property
    def magnitude(self) -> int:
        """Largest encoded magnitude m = round(bound * scale) (exact: the bound is an exact
        float64 and the scale a power of two)."""
        if self.kind == "int":
            return int(self.bound)
        return round(float(self.bound) * self.scale)

    @property
    def entry_max(self) -> int:
        return 2 * self.magnitude if self.signed else self.magnitude

    @property
    def value_bits(self) -> int:
        return self.entry_max.bit_length()

    @property
    def headroom_bits(self) -> int:
        return (self.summands - 1).bit_length()  # ceil(log2(summands)); 0 for one summand

    @property
    def slot_bits(self) -> int:
        return self.value_bits + self.headroom_bits

    @property
    def modulus(self) -> int:
        """Every admissible sum is below this power of two (masking works mod it)."""
        return 1 << self.slot_bits

    @property
    def resolution(self) -> float:
        return 1.0 / self.scale

    def sum_error_bound(self, summands: int | None = None) -> float:
        """Worst absolute error of one decoded entry of a sum of ``summands`` vectors."""
        n = self.summands if summands is None else summands
        return 0.0 if self.kind == "int" else n * 0.5 / self.scale

    def with_summands(self, summands: int) -> VectorSpec:
        return VectorSpec(
            length=self.length, bound=self.bound, summands=summands, kind=self.kind,
            signed=self.signed, frac_bits=self.frac_bits,
        )


@dataclass(frozen=True)
class EncodedVector:
    """Encoded entries in ``[0, spec.entry_max]`` plus how many were clipped to get there."""

    values: UIntArray
    clipped: int


def _encode_integers(spec: VectorSpec, arr: npt.NDArray[Any], *, clip: bool) -> EncodedVector:
    """Integer inputs, compared and shifted as integers (no float64 on the way)."""
    m = spec.magnitude  # < 2**63: slot_bits <= 63
    low = -m if spec.signed else 0
    if arr.dtype == np.uint64:
        outside = arr > np.uint64(m)
        values = np.minimum(arr, np.uint64(m)).astype(np.int64)
    else:
        wide = arr.astype(np.int64)
        outside = (wide < low) | (wide > m)
        values = np.clip(wide, low, m)
    clipped = int(np.count_nonzero(outside))
    if clipped and not clip:
        index = int(np.flatnonzero(outside)[0])
        raise BoundError(f"entry {index} = {int(arr[index])} is outside [{low}, {m}] ({clipped} entries out of "
                         "bound); pass clip=True to clip and count them")
    encoded = (values + m if spec.signed else values).astype(np.uint64)
    return EncodedVector(values=encoded, clipped=clipped)


def encode(spec: VectorSpec, vector: npt.ArrayLike, *, clip: bool = False) -> EncodedVector:
    """Map a vector into ``[0, entry_max]``; out-of-bound entries raise unless ``clip``."""
    arr = np.asarray(vector)
    if arr.ndim != 1 or arr.shape[0] != spec.length:
        raise EncodingError(f"expected a vector of length {spec.length}, got shape {arr.shape}")
    if arr.dtype == object and all(isinstance(v, int) and not isinstance(v, bool) for v in arr.tolist()):
        if any(not -(1 << 63) <= v < (1 << 64) for v in arr.tolist()):
            raise BoundError("an integer beyond 64 bits cannot be encoded exactly (no spec bound is that large)")
        arr = np.array(arr.tolist(), dtype=np.uint64 if min(arr.tolist(), default=0) >= 0 else np.int64)
    if arr.dtype == np.bool_ or not (
        np.issubdtype(arr.dtype, np.integer) or np.issubdtype(arr.dtype, np.floating)
    ):
        raise EncodingError(f"expected numbers, got dtype {arr.dtype}")
    if spec.kind == "int" and np.issubdtype(arr.dtype, np.integer):
        return _encode_integers(spec, arr, clip=clip)
    values = arr.astype(np.float64)
    if not np.all(np.isfinite(values)):
        raise EncodingError("vector holds NaN or infinity")
    if spec.kind == "int" and np.issubdtype(arr.dtype, np.floating) and np.any(values != np.round(values)):
        raise EncodingError("an integer spec got non-integral values")
    low = -spec.bound if spec.signed else 0.0
    high = spec.bound
    outside = (values < low) | (values > high)
    clipped = int(np.count_nonzero(outside))
    if clipped:
        if not clip:
            index = int(np.flatnonzero(outside)[0])
            raise BoundError(
                f"entry {index} = {values[index]!r} is outside [{low}, {high}] "
                f"({clipped} entries out of bound); pass clip=True to clip and count them"
            )
        values = np.clip(values, low, high)
    scaled = np.rint(values * spec.scale).astype(np.int64)
    if spec.signed:
        scaled = scaled + spec.magnitude
    encoded = np.clip(scaled, 0, spec.entry_max).astype(np.uint64)
    return EncodedVector(values=encoded, clipped=clipped)


def check_encoded(spec: VectorSpec, values: UIntArray) -> None:
    """Refuse an encoded vector that a protocol received but that could not come from ``encode``."""
    if values.shape != (spec.length,):
        raise EncodingError(f"expected {spec.length} encoded entries, got shape {values.shape}")
    if values.size and int(values.max()) > spec.entry_max:
        raise BoundError(f"encoded entry exceeds {spec.entry_max}")


def decode_sum(spec: VectorSpec, encoded_sum: UIntArray, *, contributors: int) -> FloatArray:
    """Undo the offset and scale of a sum of ``contributors`` encoded vectors; a
    :class:`~protocols.errors.CapacityError` when float64 cannot hold the result exactly."""
    total = decode_sum_exact(spec, encoded_sum, contributors=contributors)
    out = total.astype(np.float64)
    big = np.abs(total) > (1 << 53)
    if np.any(big) and np.any(out[big].astype(np.int64) != total[big]):
        index = int(np.flatnonzero(big & (out.astype(np.int64) != total))[0])
        unit = f" x 2**-{spec.frac_bits}" if spec.kind == "float" else ""
        raise CapacityError(f"sum entry {index} = {int(total[index])}{unit} is not exactly representable as a float64; "
                            "read it with decode_sum_exact, or lower the bound or the number of summands")
    return out / spec.scale


def decode_sum_exact(spec: VectorSpec, encoded_sum: UIntArray, *, contributors: int) -> npt.NDArray[np.int64]:
    """The sum as exact integers (in units of the spec's resolution ``2**-frac_bits`` for floats):
    what :func:`decode_sum` returns as float64 only when float64 holds it exactly."""
    if not 1 <= contributors <= spec.summands:
        raise EncodingError(
            f"a sum of {contributors} vectors does not fit a spec for at most {spec.summands}"
        )
    if encoded_sum.shape != (spec.length,):
        raise EncodingError(f"expected a sum of length {spec.length}, got shape {encoded_sum.shape}")
    top = contributors * spec.entry_max
    if encoded_sum.size and int(encoded_sum.max()) > top:
        raise BoundError(f"sum entry exceeds {top}: the sum was corrupted or overflowed")
    total = encoded_sum.astype(np.int64)  # top < 2**63
    if spec.signed:
        total = total - contributors * spec.magnitude
    return total


@dataclass(frozen=True)
class PackingLayout:
    """Many slots per big-integer plaintext, least significant slot first.

    Slots are ``slot_bytes`` wide — ``slot_bits`` rounded up to whole bytes, the extra
    bits being extra headroom — so packing is a byte reshuffle rather than a
    Python loop over shifts. A plaintext holds at most ``capacity_bits`` bits, which
    the caller picks strictly below its plaintext modulus (e.g. ``n.bit_length() - 1``).
    """

    length: int
    slot_bytes: int
    slots_per_plaintext: int

    @classmethod
    def for_spec(cls, spec: VectorSpec, *, capacity_bits: int) -> PackingLayout:
        slot_bytes = (spec.slot_bits + 7) // 8
        slots = capacity_bits // (8 * slot_bytes)
        if slots < 1:
            raise CapacityError(
                f"a {spec.slot_bits}-bit slot does not fit a {capacity_bits}-bit plaintext"
            )
        return cls(length=spec.length, slot_bytes=slot_bytes, slots_per_plaintext=slots)

    @property
    def num_plaintexts(self) -> int:
        return -(-self.length // self.slots_per_plaintext)

    def pack(self, values: UIntArray) -> list[int]:
        if values.shape != (self.length,):
            raise EncodingError(f"expected {self.length} values to pack, got shape {values.shape}")
        w, s = self.slot_bytes, self.slots_per_plaintext
        if values.size and int(values.max()) >> (8 * w):
            raise CapacityError(f"a value does not fit a {8 * w}-bit slot")
        padded = np.zeros(self.num_plaintexts * s, dtype=">u8")
        padded[: self.length] = values
        # Big-endian bytes per slot, slots reversed within a plaintext: slot 0 is least significant.
        as_bytes = padded.view(np.uint8).reshape(self.num_plaintexts, s, 8)[:, ::-1, 8 - w :]
        return [int.from_bytes(row.tobytes(), "big") for row in as_bytes]

    def unpack(self, plaintexts: list[int]) -> UIntArray:
        if len(plaintexts) != self.num_plaintexts:
            raise EncodingError(
                f"expected {self.num_plaintexts} plaintexts, got {len(plaintexts)}"
            )
        w, s = self.slot_bytes, self.slots_per_plaintext
        out = np.zeros((self.num_plaintexts, s, 8), dtype=np.uint8)
        for i, plaintext in enumerate(plaintexts):
            if plaintext < 0 or plaintext.bit_length() > 8 * w * s:
                raise CapacityError("a plaintext overflowed its slots")
            raw = np.frombuffer(int(plaintext).to_bytes(w * s, "big"), dtype=np.uint8)
            out[i, :, 8 - w :] = raw.reshape(s, w)[::-1]
        flat = out.reshape(-1, 8).view(">u8").reshape(-1)
        if np.any(flat[self.length :]):
            raise CapacityError("a carry reached the padding slots: the sum overflowed")
        return flat[: self.length].astype(np.uint64)
