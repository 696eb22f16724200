"""What the receiver of a protocol message can read of it, with the keys it holds.

The transcript says *what kind* of value a message carries for its receiver (its
:class:`~protocols.transcript.Exposure`); a :class:`MessageReader` turns the bytes themselves
into that value where the receiver can: a client's input uploaded in the clear, a released sum,
or — for a party that holds the secret key (the server under Paillier ``keyholder="server"``, a
client key holder) — a ciphertext it can decrypt. Each protocol's descriptor names its reader
(:attr:`~protocols.descriptors.ProtocolDescriptor.reader`), so a reader of transcripts (the
leakage audit) never needs to know protocols by name. Every parse is the protocol's own strict
one; a reader never changes a party's state.

``read`` returns ``None`` for what the receiver cannot read, and raises
:class:`~protocols.errors.ProtocolError` for bytes that do not parse.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .encoding import FloatArray, VectorSpec, decode_sum
from .errors import WireError
from .messages import EncodedUpload, ReleasedSum, read_contributors
from .session import SumRequest
from .wire import Envelope, PartyId, Reader

__all__ = [
    "CkksReader", "ClearReader", "MaskingReader", "MessageReader", "PaillierReader", "PlainReader", "Reading",
    "SparseMaskingReader",
]


@dataclass(frozen=True, eq=False)
class Reading:
    """A value read from one message: an input (one contributor, its sender) or a sum."""

    values: FloatArray
    contributors: tuple[PartyId, ...]


def _spec(request: SumRequest) -> VectorSpec:
    if request.spec is None:
        raise WireError("a run without a spec carries no values")
    return request.spec


def _released(released: ReleasedSum, spec: VectorSpec) -> Reading:
    return Reading(decode_sum(spec, released.encoded_sum, contributors=len(released.contributors)),
                   released.contributors)


class MessageReader:
    """A protocol whose messages their receiver reads nothing of (the default)."""

    def read(self, stage: str, envelope: Envelope, request: SumRequest, *, clients: Sequence[PartyId],
             session: Any = None) -> Reading | None:
        """What the receiver of ``envelope`` (stage ``stage`` of a run opened by ``request``) reads
        of it; ``session`` is the receiver's own session of the protocol (its keys), if any."""
        return None

    def threshold(self, request: SumRequest) -> int | None:
        """Fewest clients who, with the server, read one client's input to this run; ``None``
        when that depends on who holds the run's key (one key holder; none if the server does)."""
        return None

    def threshold_for(self, participants: int, options: Any) -> int | None:
        """:meth:`threshold` from the protocol's public options, for a run of ``participants``
        whose ``open`` is not at hand (a transcript without the bytes)."""
        return None


class PlainReader(MessageReader):
    """``plain``: encoded uploads and released sums, both in the clear."""

    def read(self, stage: str, envelope: Envelope, request: SumRequest, *, clients: Sequence[PartyId],
             session: Any = None) -> Reading | None:
        spec = _spec(request)
        if stage == "upload":
            upload = EncodedUpload.from_bytes(envelope.payload, spec)
            return Reading(decode_sum(spec, upload.values, contributors=1), (envelope.sender,))
        if stage == "result":
            return _released(ReleasedSum.from_bytes(envelope.payload, spec, parties=clients), spec)
        return None

    def threshold(self, request: SumRequest) -> int | None:
        return 0

    def threshold_for(self, participants: int, options: Any) -> int | None:
        return 0


class ClearReader(MessageReader):
    """``clear``: raw float32 uploads and sums."""

    def read(self, stage: str, envelope: Envelope, request: SumRequest, *, clients: Sequence[PartyId],
             session: Any = None) -> Reading | None:
        from .clear import _read_floats

        spec = _spec(request)
        reader = Reader(envelope.payload)
        if stage == "upload":
            values = _read_floats(reader, spec.length)
            reader.end()
            return Reading(values.astype(np.float64), (envelope.sender,))
        if stage == "result":
            contributors = read_contributors(reader, clients, spec.summands)
            values = _read_floats(reader, spec.length)
            reader.end()
            return Reading(values.astype(np.float64), contributors)
        return None

    def threshold(self, request: SumRequest) -> int | None:
        return 0

    def threshold_for(self, participants: int, options: Any) -> int | None:
        return 0


class MaskingReader(MessageReader):
    """``masking`` / ``secagg+``: masked uploads read as nothing; the released sum in the clear;
    the Shamir threshold from the run's public parameters (the ``open``'s ``params``)."""

    def read(self, stage: str, envelope: Envelope, request: SumRequest, *, clients: Sequence[PartyId],
             session: Any = None) -> Reading | None:
        if stage == "result":
            spec = _spec(request)
            return _released(ReleasedSum.from_bytes(envelope.payload, spec, parties=clients), spec)
        return None

    def threshold(self, request: SumRequest) -> int | None:
        if len(request.participants) <= 1:
            return 0
        reader = Reader(request.params)
        participants, _degree, threshold = reader.u32(), reader.u32(), reader.u32()
        if len(request.params) == 13 and reader.u8() != 1:  # the active-server flag
            raise WireError("bad masking parameter flag")
        reader.end()
        if participants != len(request.participants) or threshold < 1:
            raise WireError("masking parameters that do not fit the run")
        return int(threshold)

    def threshold_for(self, participants: int, options: Any) -> int | None:
        if participants <= 1:
            return 0
        from .masking import MaskingOptions, complete_parameters

        return int(complete_parameters(participants, options or MaskingOptions()).threshold)


class SparseMaskingReader(MaskingReader):
    """``secagg+``: as masking; without the ``open``, the degree and threshold from Bell et al.'s rules."""

    def threshold_for(self, participants: int, options: Any) -> int | None:
        if participants <= 1:
            return 0
        from .masking import MaskingOptions, sparse_parameters

        return int(sparse_parameters(participants, options or MaskingOptions()).threshold)


class PaillierReader(MessageReader):
    """``paillier``: a party holding the private key (in ``session.keys``) decrypts uploads
    (the server under ``keyholder="server"``) and aggregates (a client key holder); released
    sums are in the clear."""

    def read(self, stage: str, envelope: Envelope, request: SumRequest, *, clients: Sequence[PartyId],
             session: Any = None) -> Reading | None:
        from .paillier_common import DIGEST_BYTES, read_ciphertexts

        spec = _spec(request)
        if stage == "result":
            return _released(ReleasedSum.from_bytes(envelope.payload[DIGEST_BYTES:], spec, parties=clients), spec)
        keys: Any = getattr(session, "keys", None)
        private = getattr(keys, "private_key", None)
        if keys is None or private is None or stage not in ("upload", "aggregate"):
            return None
        from .encoding import PackingLayout

        layout = PackingLayout.for_spec(spec, capacity_bits=keys.public_key.plaintext_capacity_bits)
        reader = Reader(envelope.payload)
        reader.raw(DIGEST_BYTES)
        contributors: tuple[PartyId, ...] = (envelope.sender,)
        if stage == "aggregate":
            reader.u8()
            contributors = read_contributors(reader, clients, spec.summands)
        ciphertexts = read_ciphertexts(reader, keys.public_key, layout.num_plaintexts)
        reader.end()
        encoded = layout.unpack([private.decrypt(c) for c in ciphertexts])
        return Reading(decode_sum(spec, encoded, contributors=len(contributors)), contributors)


class CkksReader(MessageReader):
    """``ckks``: ciphertexts read as nothing here; released sums (checksummed) in the clear."""

    def read(self, stage: str, envelope: Envelope, request: SumRequest, *, clients: Sequence[PartyId],
             session: Any = None) -> Reading | None:
        if stage != "result":
            return None
        from .ckks_messages import read_result

        spec = _spec(request)
        return _released(read_result(envelope.payload, spec, clients), spec)
