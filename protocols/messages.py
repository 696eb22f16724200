"""Payloads several protocols share: a client's input vector and a released sum."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise

import numpy as np
import numpy.typing as npt

from .encoding import VectorSpec, check_encoded
from .errors import BoundError, WireError
from .wire import PartyId, Reader, Writer

_ID_LIST, _BITMAP = 0, 1


def write_contributors(writer: Writer, contributors: tuple[PartyId, ...], parties: Sequence[PartyId]) -> Writer:
    """Exactly whose inputs an aggregate holds, in the shorter of two forms.

    Tag 0: a u32 count then the ids (u32 each, ascending). Tag 1: a bitmap over
    ``sorted(parties)``, bit ``i`` of byte ``i // 8`` (most significant first) set when the
    i-th party contributed, the padding bits zero. Relaying an aggregate to each of N parties
    then costs N bits per message instead of 32 per contributor: O(N²/8) bytes in all, not
    O(4N²). The form is a function of the set (the bitmap on ties), so each set has one
    encoding and a reader refuses the other.
    """
    order = sorted(parties)
    if _list_is_shorter(len(contributors), len(order)):
        ids = np.asarray(sorted(contributors), dtype=">u4")
        return writer.u8(_ID_LIST).u32(len(contributors)).raw(ids.tobytes())
    bits = np.zeros(len(order), dtype=np.uint8)
    bits[np.searchsorted(order, contributors)] = 1  # the writer's contributors are its own parties
    return writer.u8(_BITMAP).raw(np.packbits(bits).tobytes())


def read_contributors(reader: Reader, parties: Sequence[PartyId], limit: int) -> tuple[PartyId, ...]:
    """Parse a contributor set (ascending); refuse impossible counts, unknown or repeated
    parties, and the form that is not the set's one encoding."""
    order = sorted(parties)
    tag = reader.u8()
    if tag == _ID_LIST:
        count = reader.u32()
        if not 1 <= count <= min(limit, len(order)):
            raise WireError(f"an aggregate of {count} contributors is not possible here")
        if not _list_is_shorter(count, len(order)):
            raise WireError("contributor list where the bitmap is the shorter encoding")
        contributors = tuple(np.frombuffer(reader.raw(4 * count), dtype=">u4").tolist())
        if any(a >= b for a, b in pairwise(contributors)):
            raise WireError("contributor list is not strictly ascending")
        if not set(contributors) <= set(order):
            raise WireError("contributor list names unknown parties")
        return contributors
    if tag != _BITMAP:
        raise WireError(f"unknown contributor encoding {tag}")
    packed = np.frombuffer(reader.raw(_bitmap_bytes(len(order))), dtype=np.uint8)
    bits = np.unpackbits(packed)
    if bits[len(order):].any():
        raise WireError("contributor bitmap sets padding bits")
    contributors = tuple(map(order.__getitem__, np.flatnonzero(bits[: len(order)]).tolist()))
    if not 1 <= len(contributors) <= limit:
        raise WireError(f"an aggregate of {len(contributors)} contributors is not possible here")
    if _list_is_shorter(len(contributors), len(order)):
        raise WireError("contributor bitmap where the list is the shorter encoding")
    return contributors


def _bitmap_bytes(parties: int) -> int:
    return (parties + 7) // 8


def _list_is_shorter(contributors: int, parties: int) -> bool:
    return 4 + 4 * contributors < _bitmap_bytes(parties)


@dataclass(frozen=True)
class EncodedUpload:
    """A client's encoded vector in the clear (the ``plain`` baseline)."""

    values: npt.NDArray[np.uint64]

    def to_bytes(self) -> bytes:
        return Writer().u64_array(self.values).finish()

    @classmethod
    def from_bytes(cls, data: bytes, spec: VectorSpec) -> EncodedUpload:
        reader = Reader(data)
        values = reader.u64_array(expected=spec.length)
        reader.end()
        try:
            check_encoded(spec, values)
        except BoundError as error:
            raise WireError(str(error)) from error
        return cls(values)


@dataclass(frozen=True)
class ReleasedSum:
    """An encoded sum and exactly whose inputs it contains."""

    contributors: tuple[PartyId, ...]
    encoded_sum: npt.NDArray[np.uint64]

    def to_bytes(self, *, parties: Sequence[PartyId]) -> bytes:
        return write_contributors(Writer(), self.contributors, parties).u64_array(self.encoded_sum).finish()

    @classmethod
    def from_bytes(cls, data: bytes, spec: VectorSpec, *, parties: Sequence[PartyId]) -> ReleasedSum:
        reader = Reader(data)
        contributors = read_contributors(reader, parties, spec.summands)
        count = len(contributors)
        encoded_sum = reader.u64_array(expected=spec.length)
        reader.end()
        if encoded_sum.size and int(encoded_sum.max()) > count * spec.entry_max:
            raise WireError("released sum exceeds what its contributors could add up to")
        return cls(contributors, encoded_sum)
