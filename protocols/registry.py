"""Secure-sum protocols by name, from their descriptors (:mod:`protocols.descriptors`)."""

from __future__ import annotations

from typing import Final

from .descriptors import DESCRIPTORS, ProtocolDescriptor, descriptor
from .embedded import SecureSum, make_sum

__all__ = ["DESCRIPTORS", "PROTOCOLS", "ProtocolDescriptor", "SecureSum", "descriptor", "make_sum"]

PROTOCOLS: Final = tuple(name for name, d in DESCRIPTORS.items() if d.encoded)
"""Protocols that sum encoded vectors: every statistic may use them (``clear`` is for model updates)."""
