"""One family of typed errors for the whole protocol layer.

Every failure a caller can provoke with bad input maps to a subclass of
:class:`ProtocolError`, so a driver can catch one type, drop the offending
message and keep the run usable. Messages never include secret material.
"""

from __future__ import annotations


class ProtocolError(Exception):
    """Base class: anything wrong with inputs, messages or protocol flow."""


class EncodingError(ProtocolError, ValueError):
    """A vector does not fit its declared :class:`~protocols.encoding.VectorSpec`."""


class BoundError(EncodingError):
    """An entry lies outside the declared bound (and clipping was not asked for)."""


class CapacityError(EncodingError):
    """A spec cannot be represented: slots would overflow the plaintext or modulus."""


class WireError(ProtocolError):
    """A message could not be parsed: truncated, wrong version, wrong lengths, bad fields."""


class StageError(ProtocolError):
    """A message arrived for a stage the receiver is not in, or from a party not expected."""


class ReplayError(StageError):
    """A party sent a second message for a stage it already answered."""


class ForeignKeyError(ProtocolError):
    """A ciphertext or context belongs to another key than the receiver's."""


class CiphertextError(ProtocolError):
    """A ciphertext is out of range, not invertible, or otherwise malformed."""


class AuthenticationError(ProtocolError):
    """An authenticated message (a sealed share or key) failed to verify."""


class PolicyError(ProtocolError):
    """A request would break the protocol's security policy (e.g. both shares of one client)."""


class AbortedError(ProtocolError):
    """The run cannot finish correctly (too few survivors, key holder lost); no sum is released."""


class ThresholdError(AbortedError):
    """Fewer parties than the threshold survived a stage."""


class ShareError(AbortedError):
    """Revealed secret shares do not determine the committed secret (too many of them are wrong)."""
