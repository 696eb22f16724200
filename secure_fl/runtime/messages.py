"""The runtime's own messages between the server loop and client nodes, as bytes.

Protocol runs carry their own envelopes (:mod:`protocols.wire`, magic ``SFL``); everything else
the server tells a node goes in a runtime message (magic ``SFR``)::

    magic "SFR" | version u8 | kind u8 | round i64 | run digest 16B | payload

``broadcast``
    one named vector for the round's training (SCAFFOLD's control variate, Ratio Loss's ℝ), or
    a selection's announcement to every client (Dubhe's K and σ), which the node hands to its
    selection half;
``train``
    the global model (float32): the node trains on it with this round's broadcasts;
``abort``
    the round is abandoned: the node drops what it holds for it;
``bulletin``
    the public record of earlier releases of one statistic (round and contributors of each),
    for the span guard's clients (issue 25): sent before a run the node is asked to join;
``reuse``
    a constant statistic (:attr:`~secure_fl.stats.StatisticDeclaration.constant`) is not summed
    this round: the receiver is pointed at its earlier release (the round and contributors it
    learned then), which it takes as this round's value — nothing new is released;
``refuse`` (node → server)
    a node declines a message, with the reason.

The run digest names the run (a hash of its public config): a node refuses messages of another
run, and a ``train`` for a round it already trained (a replay).
"""

from __future__ import annotations

import hashlib
import json
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from enum import IntEnum
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from protocols import Exposure, Label, Message, WireError
from protocols.wire import Reader, Writer

__all__ = [
    "DIGEST_BYTES", "MAGIC", "RUNTIME", "Kind", "RuntimeMessage", "is_runtime", "run_digest",
]

MAGIC: Final = b"SFR"
VERSION: Final = 1
DIGEST_BYTES: Final = 16
RUNTIME: Final = "runtime"
"""The transcript's protocol name for runtime messages."""
MAX_NAME: Final = 64
MAX_RELEASES: Final = 1 << 16
"""Releases one bulletin may carry (a run of 65,536 rounds per statistic)."""
MAX_MEMBERS: Final = 1 << 20
_HEADER = struct.Struct(">3sBBq16s")


class Kind(IntEnum):
    BROADCAST = 1
    TRAIN = 2
    ABORT = 3
    BULLETIN = 4
    REUSE = 5
    REFUSE = 255


_NAMED: Final = (Kind.BROADCAST, Kind.BULLETIN, Kind.REUSE)
_RELEASES: Final = (Kind.BULLETIN, Kind.REUSE)


def run_digest(public_config: Mapping[str, Any]) -> bytes:
    """16 bytes naming a run: SHA-256 of its public config, canonical JSON."""
    text = json.dumps(public_config, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(b"secure-fl/run\x00" + text.encode()).digest()[:DIGEST_BYTES]


def is_runtime(data: bytes) -> bool:
    return data[:3] == MAGIC


@dataclass(frozen=True, eq=False)
class RuntimeMessage:
    """One runtime message; ``name`` and ``vector`` as the kind needs them."""

    kind: Kind
    round: int
    digest: bytes
    name: str = ""
    vector: npt.NDArray[np.float32] | None = None
    reason: str = ""
    releases: tuple[tuple[int, tuple[int, ...]], ...] = ()
    """``bulletin``: (round, ascending contributor ids) of each release announced; ``reuse``: the
    one release the receiver is pointed at."""

    def to_bytes(self) -> bytes:
        if len(self.digest) != DIGEST_BYTES:
            raise WireError("a run digest is 16 bytes")
        if self.kind == Kind.REUSE and len(self.releases) != 1:
            raise WireError(f"a reuse points at one release, not {len(self.releases)}")
        writer = Writer().raw(_HEADER.pack(MAGIC, VERSION, int(self.kind), self.round, self.digest))
        if self.kind in _NAMED:
            writer.blob(self.name.encode())
        if self.kind in _RELEASES:
            writer.u32(len(self.releases))
            for round_, members in self.releases:
                writer.i64(round_).u32(len(members)).raw(np.asarray(members, dtype=">u4").tobytes())
        if self.kind in (Kind.BROADCAST, Kind.TRAIN):
            assert self.vector is not None
            values = np.ascontiguousarray(self.vector, dtype="<f4")
            writer.u32(int(values.shape[0])).raw(values.tobytes())
        if self.kind == Kind.REFUSE:
            writer.blob(self.reason.encode("utf-8", "replace")[:512].decode("utf-8", "ignore").encode("utf-8"))
        return writer.finish()

    @classmethod
    def from_bytes(cls, data: bytes, *, dimension: int | None = None) -> RuntimeMessage:
        """Strict parse; ``dimension`` checks a model vector's length."""
        if len(data) < _HEADER.size:
            raise WireError("runtime message truncated")
        magic, version, code, round_, digest = _HEADER.unpack_from(data)
        if magic != MAGIC:
            raise WireError("not a runtime message (bad magic)")
        if version != VERSION:
            raise WireError(f"unsupported runtime message version {version}")
        try:
            kind = Kind(code)
        except ValueError:
            raise WireError(f"unknown runtime message kind {code}") from None
        reader = Reader(memoryview(data)[_HEADER.size:])
        name, vector, reason = "", None, ""
        releases: list[tuple[int, tuple[int, ...]]] = []
        if kind in _NAMED:
            try:
                name = reader.blob(max_len=MAX_NAME).decode("ascii")
            except UnicodeDecodeError:
                raise WireError(f"{kind.name.lower()} name is not ASCII") from None
        if kind in _RELEASES:
            count = reader.u32()
            most = 1 if kind == Kind.REUSE else MAX_RELEASES
            if not 0 < count <= most:
                raise WireError(f"a {kind.name.lower()} holds 1 to {most} releases, this one {count}")
            for _ in range(count):
                round_of, size = reader.i64(), reader.u32()
                if not 0 < size <= MAX_MEMBERS:
                    raise WireError(f"a release has 1 to {MAX_MEMBERS} contributors, this one {size}")
                members = np.frombuffer(reader.raw(4 * size), dtype=">u4").astype(np.int64)
                if size > 1 and not np.all(np.diff(members) > 0):
                    raise WireError("a release's contributors must be ascending and distinct")
                releases.append((round_of, tuple(int(c) for c in members)))
        if kind in (Kind.BROADCAST, Kind.TRAIN):
            count = reader.u32()
            if kind == Kind.TRAIN and dimension is not None and count != dimension:
                raise WireError(f"the model has {dimension} entries, the message {count}")
            vector = np.frombuffer(reader.view(4 * count), dtype="<f4").astype(np.float32)  # its own copy
            if not np.all(np.isfinite(vector)):
                raise WireError("non-finite value in a broadcast vector")
        if kind == Kind.REFUSE:
            try:
                reason = reader.blob(max_len=512).decode("utf-8")
            except UnicodeDecodeError:
                raise WireError("a refusal's reason is not UTF-8") from None
        reader.end()
        return cls(kind=kind, round=round_, digest=bytes(digest), name=name, vector=vector, reason=reason,
                   releases=tuple(releases))

    def message(self, *, statistic: str) -> Message:
        """This message with its transcript label (public: the model and broadcasts are public)."""
        dimension = 0 if self.vector is None else int(self.vector.shape[0])
        stage = self.kind.name.lower()
        label = Label(protocol=RUNTIME, run_id="", stage=stage, stage_index=int(self.kind), statistic=statistic,
                      round=self.round, exposure=Exposure(Exposure.public().visibility, 0, dimension))
        return Message(self.to_bytes(), label)
