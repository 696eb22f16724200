"""Bytes on the wire: one envelope format for every protocol, parsed strictly.

Envelope layout (big-endian)::

    magic "SFL" | version u8 | protocol u8 | stage u8 | run_id 16B
    | sender u32 | receiver u32 | payload_len u32 | payload [| signature 64B]

Version 1 carries no signature; version 2 ends with the sender's Ed25519 signature (see
:class:`protocols.identity.Authenticator`, which makes and checks it; a receiver configured to
authenticate refuses version 1).

Payloads are written with :class:`Writer` and read with :class:`Reader`, which
raises :class:`~protocols.errors.WireError` on any short read, oversize field
or trailing byte, so every parser is strict by construction.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from typing import Final

import numpy as np
import numpy.typing as npt

from .descriptors import CODES, NAMES
from .errors import WireError

MAGIC: Final = b"SFL"
VERSION: Final = 1
VERSION_SIGNED: Final = 2
SIGNATURE_BYTES: Final = 64
RUN_ID_BYTES: Final = 16
SERVER: Final = 0xFFFFFFFF
"""Party id of the aggregator; clients are 0 .. n-1."""
MAX_PAYLOAD: Final = 1 << 31
OPEN: Final = 0
"""Stage 0 of every protocol: the server opens a run at a client (a :class:`~protocols.session.SumRequest`)."""
REFUSE: Final = 255
"""Stage 255 of every protocol: a client declines a run or a message, with its reason."""
SHARED_STAGES: Final = {OPEN: "open", REFUSE: "refuse"}

_HEADER = struct.Struct(">3sBBB16sIII")

PROTOCOL_CODES: Final = CODES
PROTOCOL_NAMES: Final = NAMES

PartyId = int


def party_name(party: PartyId) -> str:
    return "server" if party == SERVER else f"client-{party}"


@dataclass(frozen=True)
class Envelope:
    """A routed message: who, to whom, which run and stage, and opaque payload bytes."""

    protocol: str
    stage: int
    run_id: bytes
    sender: PartyId
    receiver: PartyId
    payload: bytes
    signature: bytes = b""
    """The sender's signature (version 2 on the wire), empty when unsigned."""

    def header_bytes(self) -> bytes:
        """The version-1 header: what a signature covers besides the payload."""
        if self.protocol not in PROTOCOL_CODES:
            raise WireError(f"unknown protocol {self.protocol!r}")
        if len(self.run_id) != RUN_ID_BYTES:
            raise WireError("run id must be 16 bytes")
        if len(self.payload) >= MAX_PAYLOAD:
            raise WireError("payload too large")
        return _HEADER.pack(MAGIC, VERSION, PROTOCOL_CODES[self.protocol], self.stage, self.run_id,
                            self.sender, self.receiver, len(self.payload))

    def unsigned(self) -> Envelope:
        return self if not self.signature else Envelope(self.protocol, self.stage, self.run_id, self.sender,
                                                        self.receiver, self.payload)

    def with_signature(self, signature: bytes) -> Envelope:
        if len(signature) != SIGNATURE_BYTES:
            raise WireError(f"a signature is {SIGNATURE_BYTES} bytes")
        return Envelope(self.protocol, self.stage, self.run_id, self.sender, self.receiver, self.payload, signature)

    def to_bytes(self) -> bytes:
        header = self.header_bytes()
        if not self.signature:
            return header + self.payload
        if len(self.signature) != SIGNATURE_BYTES:
            raise WireError(f"a signature is {SIGNATURE_BYTES} bytes")
        return b"".join((header[:3], bytes([VERSION_SIGNED]), header[4:], self.payload, self.signature))

    @classmethod
    def from_bytes(cls, data: bytes) -> Envelope:
        if len(data) < _HEADER.size:
            raise WireError(f"message truncated: {len(data)} bytes, header needs {_HEADER.size}")
        magic, version, code, stage, run_id, sender, receiver, length = _HEADER.unpack_from(data)
        if magic != MAGIC:
            raise WireError("not a secure-fl message (bad magic)")
        if version not in (VERSION, VERSION_SIGNED):
            raise WireError(f"unsupported wire version {version}, expected {VERSION} or {VERSION_SIGNED}")
        if code not in PROTOCOL_NAMES:
            raise WireError(f"unknown protocol code {code}")
        trailer = SIGNATURE_BYTES if version == VERSION_SIGNED else 0
        if len(data) != _HEADER.size + length + trailer:
            raise WireError(
                f"payload length field says {length} bytes, message carries {len(data) - _HEADER.size - trailer}"
            )
        end = _HEADER.size + length
        return cls(PROTOCOL_NAMES[code], stage, bytes(run_id), sender, receiver, bytes(data[_HEADER.size:end]),
                   bytes(data[end:]))


class Writer:
    """Accumulates length-checked fields; the mirror of :class:`Reader`."""

    def __init__(self) -> None:
        self._parts: list[bytes] = []

    def u8(self, value: int) -> Writer:
        self._parts.append(struct.pack(">B", value))
        return self

    def u32(self, value: int) -> Writer:
        self._parts.append(struct.pack(">I", value))
        return self

    def u64(self, value: int) -> Writer:
        self._parts.append(struct.pack(">Q", value))
        return self

    def i64(self, value: int) -> Writer:
        self._parts.append(struct.pack(">q", value))
        return self

    def f64(self, value: float) -> Writer:
        self._parts.append(struct.pack(">d", value))
        return self

    def raw(self, data: bytes) -> Writer:
        self._parts.append(bytes(data))
        return self

    def blob(self, data: bytes) -> Writer:
        """A u32 length then the bytes."""
        self.u32(len(data))
        self._parts.append(bytes(data))
        return self

    def uint(self, value: int, width: int) -> Writer:
        """A non-negative integer in exactly ``width`` bytes."""
        if value < 0 or value.bit_length() > 8 * width:
            raise WireError(f"integer does not fit {width} bytes")
        self._parts.append(int(value).to_bytes(width, "big"))
        return self

    def u64_array(self, values: npt.NDArray[np.uint64]) -> Writer:
        self.u32(int(values.shape[0]))
        self._parts.append(values.astype(">u8").tobytes())
        return self

    def f64_array(self, values: npt.NDArray[np.float64]) -> Writer:
        self.u32(int(values.shape[0]))
        self._parts.append(values.astype(">f8").tobytes())
        return self

    def finish(self) -> bytes:
        return b"".join(self._parts)


class Reader:
    """Strict cursor over a payload: every read is bounds-checked; :meth:`end` refuses leftovers."""

    def __init__(self, data: bytes | memoryview) -> None:
        self._data = memoryview(data)
        self._pos = 0

    def _take(self, count: int) -> memoryview:
        if count < 0 or self._pos + count > len(self._data):
            raise WireError(
                f"payload truncated: wanted {count} bytes at offset {self._pos}, have {len(self._data) - self._pos}"
            )
        chunk = self._data[self._pos : self._pos + count]
        self._pos += count
        return chunk

    def u8(self) -> int:
        return int(self._take(1)[0])

    def u32(self) -> int:
        return int(struct.unpack(">I", self._take(4))[0])

    def u64(self) -> int:
        return int(struct.unpack(">Q", self._take(8))[0])

    def i64(self) -> int:
        return int(struct.unpack(">q", self._take(8))[0])

    def f64(self) -> float:
        """A finite double (NaN and infinities are refused)."""
        value = float(struct.unpack(">d", self._take(8))[0])
        if not math.isfinite(value):
            raise WireError("non-finite float on the wire")
        return value

    def raw(self, count: int) -> bytes:
        return bytes(self._take(count))

    def view(self, count: int) -> memoryview:
        """The next ``count`` bytes without a copy (for ``np.frombuffer`` of a long vector)."""
        return self._take(count)

    def blob(self, *, max_len: int = MAX_PAYLOAD) -> bytes:
        length = self.u32()
        if length > max_len:
            raise WireError(f"field of {length} bytes exceeds the limit {max_len}")
        return bytes(self._take(length))

    def uint(self, width: int) -> int:
        return int.from_bytes(self._take(width), "big")

    def u64_array(self, *, expected: int | None = None) -> npt.NDArray[np.uint64]:
        count = self.u32()
        if expected is not None and count != expected:
            raise WireError(f"expected {expected} entries, got {count}")
        return np.frombuffer(self._take(8 * count), dtype=">u8").astype(np.uint64)

    def f64_array(self, *, expected: int | None = None) -> npt.NDArray[np.float64]:
        count = self.u32()
        if expected is not None and count != expected:
            raise WireError(f"expected {expected} entries, got {count}")
        values = np.frombuffer(self._take(8 * count), dtype=">f8").astype(np.float64)
        if not np.all(np.isfinite(values)):
            raise WireError("non-finite float on the wire")
        return values

    def end(self) -> None:
        if self._pos != len(self._data):
            raise WireError(f"{len(self._data) - self._pos} unexpected trailing bytes")
