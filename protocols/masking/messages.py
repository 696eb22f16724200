"""Stages and payloads of a masking run, each parsed strictly (a :class:`~protocols.errors.WireError`
for anything that could not have been written by the matching ``to_bytes``).

Layouts (big-endian unless noted; the envelope adds its 34-byte header)::

    advertise_keys  c -> s   channel key 32B | mask key 32B | seed commitment 32B [| signature 64B]
    share_keys      s -> c   u32 count | (u32 id | advertisement) per neighbour, ascending
                             [| u32 count | ids of every client that advertised]  (active-server setting)
    share_keys      c -> s   u32 count | (u32 holder | sealed share pair) per neighbour, ascending
    upload          s -> c   u32 count | (u32 owner | sealed share pair) per neighbour that shared
    upload          c -> s   u32 count | owners whose sealed shares failed to open | u8 word bytes | u32 count |
                             words, little-endian
    consistency     s -> c   u32 count | survivors' ids                  (active-server setting only)
    consistency     c -> s   signature 64B over the survivors it was told  (active-server setting only)
    unmasking       s -> c   u32 count | survivors' ids | u32 count | lost ids
                             [| u32 count | (u32 signer | signature) ascending]  (active-server setting)
    unmasking       c -> s   u32 count | 33B shares | u32 count | 33B shares
    result          s -> c   a :class:`~protocols.messages.ReleasedSum`
"""

from __future__ import annotations

import struct
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from enum import IntEnum
from itertools import pairwise
from typing import Any

import numpy as np

from ..encoding import VectorSpec
from ..errors import WireError
from ..primitives import shamir
from ..primitives.channel import PUBLIC_KEY_BYTES
from ..primitives.prg import Words
from ..wire import PartyId, Reader, Writer
from .keys import COMMITMENT_BYTES, SEALED_SHARE_BYTES

SIGNATURE_BYTES = 64

__all__ = [
    "SIGNATURE_BYTES",
    "ConsistencyRequest",
    "KeyAdvert",
    "NeighbourKeys",
    "SealedShares",
    "Stage",
    "UnmaskRequest",
    "UnmaskResponse",
    "masked_from_bytes",
    "masked_to_bytes",
    "read_signature",
    "upload_from_bytes",
    "upload_to_bytes",
]


class Stage(IntEnum):
    """The stages of a masking run, as :class:`~protocols.network.DropoutPlan` names them."""

    ADVERTISE_KEYS = 1
    SHARE_KEYS = 2
    UPLOAD = 3
    CONSISTENCY = 4
    """Bonawitz's consistency round: only in the active-server setting."""
    UNMASKING = 5
    RESULT = 6


def _read_ids(reader: Reader, allowed: frozenset[PartyId], *, limit: int) -> tuple[PartyId, ...]:
    """A u32 count then strictly increasing party ids, all in ``allowed``."""
    count = reader.u32()
    if count > limit:
        raise WireError(f"a list of {count} parties is not possible here")
    ids: tuple[PartyId, ...] = struct.unpack(f">{count}I", reader.raw(4 * count))
    if any(b <= a for a, b in pairwise(ids)):
        raise WireError("party lists must be strictly increasing")
    if not set(ids) <= allowed:
        raise WireError("party list names parties outside this run")
    return ids


def _write_ids(writer: Writer, ids: Sequence[PartyId]) -> Writer:
    return writer.u32(len(ids)).raw(struct.pack(f">{len(ids)}I", *ids))


@dataclass(frozen=True)
class KeyAdvert:
    """Client -> server: the run's two fresh public keys (``c`` seals shares, ``s`` agrees masks)
    and a commitment to its self-mask seed ``b``; in the active-server setting, signed with the
    client's registered identity key (:func:`~protocols.masking.keys.advert_statement`)."""

    channel_key: bytes
    mask_key: bytes
    commitment: bytes
    signature: bytes = b""

    def _write(self, writer: Writer) -> Writer:
        writer.raw(self.channel_key).raw(self.mask_key).raw(self.commitment)
        return writer.raw(self.signature) if self.signature else writer

    def to_bytes(self) -> bytes:
        return self._write(Writer()).finish()

    @classmethod
    def read(cls, reader: Reader, *, signed: bool) -> KeyAdvert:
        return cls(reader.raw(PUBLIC_KEY_BYTES), reader.raw(PUBLIC_KEY_BYTES), reader.raw(COMMITMENT_BYTES),
                   reader.raw(SIGNATURE_BYTES) if signed else b"")

    @classmethod
    def from_bytes(cls, data: bytes, *, signed: bool = False) -> KeyAdvert:
        reader = Reader(data)
        advert = cls.read(reader, signed=signed)
        reader.end()
        return advert


@dataclass(frozen=True)
class NeighbourKeys:
    """Server -> client: each neighbour's advertisement, by increasing id; in the active-server
    setting (``signed``) the adverts carry their signatures and ``advertised`` lists every client
    that advertised (the graph is derived from it, and every client checks its neighbours)."""

    entries: tuple[tuple[PartyId, KeyAdvert], ...]
    advertised: tuple[PartyId, ...] = ()

    def to_bytes(self) -> bytes:
        writer = Writer().u32(len(self.entries))
        for pid, advert in self.entries:
            advert._write(writer.u32(pid))
        signed = bool(self.entries) and bool(self.entries[0][1].signature)
        return (_write_ids(writer, self.advertised) if signed or self.advertised else writer).finish()

    @classmethod
    def from_bytes(cls, data: bytes, *, parties: frozenset[PartyId], signed: bool = False) -> NeighbourKeys:
        reader = Reader(data)
        count = reader.u32()
        if count >= len(parties):
            raise WireError(f"{count} neighbours is not possible among {len(parties)} participants")
        # Fixed-size records, sliced out of one bounds-checked block (a client parses ``deg`` of them).
        size = 4 + 2 * PUBLIC_KEY_BYTES + COMMITMENT_BYTES + (SIGNATURE_BYTES if signed else 0)
        block = reader.raw(count * size)
        k1, k2, k3 = 4 + PUBLIC_KEY_BYTES, 4 + 2 * PUBLIC_KEY_BYTES, 4 + 2 * PUBLIC_KEY_BYTES + COMMITMENT_BYTES
        entries = tuple(
            (int.from_bytes(block[o : o + 4], "big"),
             KeyAdvert(block[o + 4 : o + k1], block[o + k1 : o + k2], block[o + k2 : o + k3],
                       block[o + k3 : o + size] if signed else b""))
            for o in range(0, count * size, size))
        advertised = _read_ids(reader, parties, limit=len(parties)) if signed else ()
        reader.end()
        ids = [e[0] for e in entries]
        if any(b <= a for a, b in pairwise(ids)) or not set(ids) <= parties:
            raise WireError("neighbour list is unsorted, repeated or names outsiders")
        if signed and not set(ids) < set(advertised):
            raise WireError("neighbours that did not advertise")
        return cls(entries, advertised)


@dataclass(frozen=True)
class ConsistencyRequest:
    """Server -> survivor (active-server setting): the clients whose uploads the server kept."""

    survivors: tuple[PartyId, ...]

    def to_bytes(self) -> bytes:
        return _write_ids(Writer(), self.survivors).finish()

    @classmethod
    def from_bytes(cls, data: bytes, *, parties: frozenset[PartyId]) -> ConsistencyRequest:
        reader = Reader(data)
        survivors = _read_ids(reader, parties, limit=len(parties))
        reader.end()
        return cls(survivors)


def read_signature(data: bytes) -> bytes:
    """A client's consistency signature (its whole reply at stage 4)."""
    reader = Reader(data)
    signature = reader.raw(SIGNATURE_BYTES)
    reader.end()
    return signature


@dataclass(frozen=True)
class SealedShares:
    """Sealed share pairs keyed by the other party: the recipient (client -> server) or the
    owner (server -> client), by increasing id."""

    entries: tuple[tuple[PartyId, bytes], ...]

    def to_bytes(self) -> bytes:
        return b"".join([_U32.pack(len(self.entries)), *(_U32.pack(pid) + sealed for pid, sealed in self.entries)])

    @classmethod
    def from_bytes(cls, data: bytes, *, parties: frozenset[PartyId]) -> SealedShares:
        reader = Reader(data)
        count = reader.u32()
        if count >= len(parties):
            raise WireError(f"{count} sealed shares is not possible among {len(parties)} participants")
        size = 4 + SEALED_SHARE_BYTES
        block = reader.raw(count * size)
        entries = tuple((int.from_bytes(block[o : o + 4], "big"), block[o + 4 : o + size])
                        for o in range(0, count * size, size))
        reader.end()
        ids = [e[0] for e in entries]
        if any(b <= a for a, b in pairwise(ids)) or not set(ids) <= parties:
            raise WireError("sealed shares are unsorted, repeated or name outsiders")
        return cls(entries)


@dataclass(frozen=True)
class UnmaskRequest:
    """Whose self-mask share (``survivors``) and whose mask-key share (``dropped``) to reveal;
    in the active-server setting with the consistency signatures of the receiver's
    neighbourhood, ``(signer, signature)`` by increasing signer."""

    survivors: tuple[PartyId, ...]
    dropped: tuple[PartyId, ...]
    signatures: tuple[tuple[PartyId, bytes], ...] = ()

    def to_bytes(self) -> bytes:
        writer = _write_ids(_write_ids(Writer(), self.survivors), self.dropped)
        if self.signatures:
            writer.u32(len(self.signatures))
            for signer, signature in self.signatures:
                writer.u32(signer).raw(signature)
        return writer.finish()

    @classmethod
    def from_bytes(cls, data: bytes, *, parties: frozenset[PartyId], signed: bool = False) -> UnmaskRequest:
        reader = Reader(data)
        survivors = _read_ids(reader, parties, limit=len(parties))
        dropped = _read_ids(reader, parties, limit=len(parties))
        signatures: tuple[tuple[PartyId, bytes], ...] = ()
        if signed:
            count = reader.u32()
            if count > len(parties):
                raise WireError(f"{count} signatures among {len(parties)} participants")
            size = 4 + SIGNATURE_BYTES
            block = reader.raw(count * size)
            signatures = tuple((int.from_bytes(block[o : o + 4], "big"), block[o + 4 : o + size])
                               for o in range(0, count * size, size))
            signers = [signer for signer, _ in signatures]
            if any(b <= a for a, b in pairwise(signers)) or not set(signers) <= parties:
                raise WireError("signers are unsorted, repeated or outsiders")
        reader.end()
        return cls(survivors, dropped, signatures)


@dataclass(frozen=True)
class UnmaskResponse:
    """The revealed share values, in the order of the request's two lists."""

    self_mask_shares: tuple[int, ...]
    key_shares: tuple[int, ...]

    def to_bytes(self) -> bytes:
        return b"".join([_U32.pack(len(self.self_mask_shares)), *map(shamir.share_to_bytes, self.self_mask_shares),
                         _U32.pack(len(self.key_shares)), *map(shamir.share_to_bytes, self.key_shares)])

    @classmethod
    def from_bytes(cls, data: bytes, request: UnmaskRequest) -> UnmaskResponse:
        reader = Reader(data)
        lists = []
        size = shamir.SHARE_BYTES
        for expected in (len(request.survivors), len(request.dropped)):
            if reader.u32() != expected:
                raise WireError("the response does not answer the request")
            block = reader.raw(expected * size)  # fixed-size shares, sliced out of one checked block
            lists.append(tuple(shamir.share_from_bytes(block[o : o + size]) for o in range(0, len(block), size)))
        reader.end()
        return cls(lists[0], lists[1])


_MASKED_HEADER = struct.Struct(">BI")
_U32 = struct.Struct(">I")


def masked_to_bytes(words: Words) -> bytes:
    """``u8 word bytes | u32 count | little-endian words``: one copy of the vector."""
    if sys.byteorder != "little":  # pragma: no cover - big-endian hosts only
        words = words.byteswap()
    return b"".join((_MASKED_HEADER.pack(words.dtype.itemsize, words.shape[0]), words.data))


def masked_from_bytes(data: bytes | memoryview, *, spec: VectorSpec, dtype: np.dtype[Any]) -> Words:
    if len(data) < _MASKED_HEADER.size:
        raise WireError("masked input truncated")
    width, count = _MASKED_HEADER.unpack_from(data)
    if width != dtype.itemsize or count != spec.length:
        raise WireError(f"expected {spec.length} words of {dtype.itemsize} bytes, got {count} of {width}")
    if len(data) != _MASKED_HEADER.size + width * count:
        raise WireError("masked input has the wrong length")
    words: Words = np.frombuffer(data, dtype=dtype.newbyteorder("<"), count=count, offset=_MASKED_HEADER.size)
    if spec.slot_bits < 8 * width and words.size and int(words.max()) >> spec.slot_bits:
        raise WireError(f"a masked entry is not reduced modulo 2**{spec.slot_bits}")
    return words


def upload_to_bytes(words: Words, complaints: Sequence[PartyId] = ()) -> bytes:
    """The masked upload: the owners whose sealed shares failed to open here (each then leaves
    the sum as a dropout), then the masked vector."""
    head = _write_ids(Writer(), sorted(complaints)).finish()
    if sys.byteorder != "little":  # pragma: no cover - big-endian hosts only
        words = words.byteswap()
    return b"".join((head, _MASKED_HEADER.pack(words.dtype.itemsize, words.shape[0]), words.data))  # one copy


def upload_from_bytes(data: bytes, *, spec: VectorSpec, dtype: np.dtype[Any],
                      owners: frozenset[PartyId]) -> tuple[tuple[PartyId, ...], Words]:
    """``(complaints, masked words)``; complaints may only name owners whose shares were relayed to the sender."""
    reader = Reader(data[:4])
    count = reader.u32()
    if count > len(owners):
        raise WireError(f"{count} complaints about {len(owners)} relayed share pairs")
    head = 4 + 4 * count
    if len(data) < head:
        raise WireError("masked upload truncated")
    complaints = _read_ids(Reader(data[:head]), owners, limit=len(owners))
    return complaints, masked_from_bytes(memoryview(data)[head:], spec=spec, dtype=dtype)  # no copy
