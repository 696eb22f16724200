"""CKKS payloads: those of every SEAL-based sum (:mod:`protocols.seal_messages`), under the
protocol name ``ckks``; CKKS's own parameters are :class:`~protocols.primitives.ckks.CkksParameters`."""

from __future__ import annotations

from typing import Final

from .seal_messages import (
    CHECKSUM_BYTES,
    KEYHOLDERS,
    MAX_CONTEXT,
    SetupParams,
    Stage,
    SumParams,
    read_aggregate,
    read_context,
    read_result,
    read_upload,
    request_digest,
    write_aggregate,
    write_context,
    write_result,
    write_upload,
)

__all__ = [
    "CHECKSUM_BYTES", "KEYHOLDERS", "MAX_CONTEXT", "PROTOCOL", "SetupParams", "Stage", "SumParams", "read_aggregate",
    "read_context", "read_result", "read_upload", "request_digest", "write_aggregate", "write_context",
    "write_result", "write_upload",
]

PROTOCOL: Final = "ckks"
