"""CKKS secure sum (TenSEAL) with a client as key holder, parameters derived from each sum.

The protocol — roles, key holders (``agent``, ``all``), key set-up as messages, stages, seeded
uploads, integrity — is :mod:`protocols.seal_sum`'s, shared with :mod:`protocols.bfv`; this
module supplies CKKS's options, its parameter derivation and how a key holder turns a decrypted
aggregate into the exact encoded sum.

**Parameters.** By default each sum gets the smallest parameters that carry it exactly
(:func:`~protocols.primitives.ckks.derive`): the smallest ring N keeping 128-bit security, a
modulus chain of one data prime (more beyond 60 bits) and one special prime, and the scale
that keeps the error bound within 1/4. Counts up to 2**16 from 100 clients run at N = 4096 with
a 49-bit data prime (46 bits when every client holds the key), model updates at the runtime's
2**-24 resolution with a 58-bit one; before, every sum ran at N = 8192 with primes of 60, 40,
40 and 60 bits (:data:`LEGACY`). Options can fix the ring, or the whole parameter set.

**Exact sums.** Clients encrypt their *encoded* entries (the integers of
:func:`~protocols.encoding.encode`, in ``[0, entry_max]``), two per complex slot. The key
holder decrypts ``sum + e`` with ``|e| <= eps(n, M)``
(:meth:`~protocols.primitives.ckks.CkksParameters.error_bound`, ``M = n * entry_max``) and
rounds to the nearest integer. Parameters keep ``eps <= 1/4``, and a spec no parameters carry
that way is refused (:class:`~protocols.errors.CapacityError`), so the rounding is exact and the
decoded sum is bit for bit the one ``plain``, ``paillier`` and ``masking`` produce: its error
against the real-valued sum is the encoding's ``n * 2**-(frac_bits+1)``, and CKKS adds nothing
(:meth:`CkksServerSession.tolerance`). A decryption error above ``eps`` means a corrupted or
foreign aggregate and is refused.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from typing import Final

import numpy as np

from .encoding import VectorSpec
from .errors import CiphertextError
from .primitives import ckks as raw
from .seal_messages import Stage
from .seal_sum import (
    ClientKeys,
    Decryption,
    Keyholder,
    SealClient,
    SealClientSession,
    SealOptions,
    SealServer,
    SealServerSession,
    SumScheme,
)

__all__ = [
    "LEGACY", "PROTOCOL", "ROUNDING_MARGIN", "CkksClient", "CkksClientSession", "CkksOptions", "CkksServer",
    "CkksServerSession", "ClientKeys", "Stage", "check_capacity",
]

PROTOCOL: Final = "ckks"
ROUNDING_MARGIN: Final = raw.ROUNDING_MARGIN
LEGACY: Final = raw.CkksParameters(8192, (60, 40, 40, 60), 40)
"""The one parameter set every CKKS sum used before parameters were derived from the sum
(``CkksOptions(poly_modulus_degree=8192, coeff_mod_bit_sizes=(60, 40, 40, 60), scale_bits=40)``)."""


@dataclass(frozen=True, kw_only=True)
class CkksOptions(SealOptions):
    """CKKS parameters and who holds the key.

    ``poly_modulus_degree``, ``coeff_mod_bit_sizes``, ``scale_bits``
        all ``None`` (default): each sum gets the smallest parameters that carry it exactly;
        ``poly_modulus_degree`` alone fixes the ring (N/2 complex slots, N entries per
        ciphertext) and derives the rest; all three fix one parameter set for every sum (the
        total modulus must stay within the 128-bit-security table; a sum it cannot carry
        exactly is refused).
    ``keyholder``
        ``agent`` or ``all`` (:mod:`protocols.seal_sum`).
    ``symmetric``
        a client that holds the secret key encrypts with it: seeded ciphertexts, half the bytes
        (and less noise, so smaller parameters when every client holds the key).
    ``verify_aggregate``
        a decryptor decrypts only an aggregate that every contributor attested (signed tags of
        its own upload, checked on ciphertexts before decrypting; :mod:`protocols.seal_sum`),
        so an active server cannot alter the aggregate and learn from a refusal. ``None``
        (default): on whenever the parties have registered signing keys
        (``make_sum(..., authenticate=True)``); ``True`` needs them.
    """

    poly_modulus_degree: int | None = None
    coeff_mod_bit_sizes: tuple[int, ...] | None = None
    scale_bits: int | None = None
    keyholder: Keyholder = "agent"
    symmetric: bool = True
    verify_aggregate: bool | None = None
    parameters: raw.CkksParameters | None = field(init=False, repr=False, compare=False, default=None)

    def __post_init__(self) -> None:
        self._fix_parameters("CKKS", "scale_bits", raw.CkksParameters)

    @property
    def fixed(self) -> raw.CkksParameters | None:
        return self.parameters

    def parameters_for(self, spec: VectorSpec) -> raw.CkksParameters:
        return _parameters_for(self, spec)

    def parse_parameters(self, data: bytes) -> raw.CkksParameters:
        return raw.CkksParameters.from_bytes(data)


@lru_cache(maxsize=256)
def _parameters_for(options: CkksOptions, spec: VectorSpec) -> raw.CkksParameters:
    symmetric = options.all_symmetric
    if options.parameters is not None:
        raw.check_capacity(options.parameters, spec.summands, spec.entry_max, symmetric=symmetric)
        return options.parameters
    return raw.derive(summands=spec.summands, entry_max=spec.entry_max, symmetric=symmetric,
                      ring=options.poly_modulus_degree)


def check_capacity(params: raw.CkksParameters, spec: VectorSpec, *, symmetric: bool = False) -> None:
    """Refuse a spec whose sums CKKS under ``params`` cannot carry exactly (``CapacityError``)."""
    raw.check_capacity(params, spec.summands, spec.entry_max, symmetric=symmetric)


def _decrypt_sum(secret: raw.SecretContext, streams: list[bytes], sizes: list[int], params: raw.CkksParameters,
                 spec: VectorSpec, contributors: int, all_symmetric: bool) -> Decryption:
    """Nearest integers, after checking the decryption error is one honest sums can have."""
    values = secret.decrypt(streams, sizes)
    top = contributors * spec.entry_max
    rounded = np.rint(values)
    error = float(np.max(np.abs(values - rounded)))
    if error > params.error_bound(contributors, float(top), symmetric=all_symmetric):
        raise CiphertextError("the aggregate decrypts with more error than honest ciphertexts have")
    if rounded.min() < 0 or rounded.max() > top:
        raise CiphertextError(f"the aggregate decrypts outside [0, {top}]")
    return Decryption(rounded.astype(np.uint64), error=error)


SCHEME: Final = SumScheme(protocol=PROTOCOL, public=raw.PublicContext, secret=raw.SecretContext,
                          decrypt_sum=_decrypt_sum)


class CkksClient(SealClient):
    """A client's side of one CKKS sum (``decryption_error``: the CKKS error it met, if it decrypted)."""


CkksServer = SealServer


class CkksServerSession(SealServerSession):
    """The server's long-lived CKKS state: a public context and agent per parameter set."""

    name = PROTOCOL
    scheme = SCHEME
    options_class = CkksOptions

    def error_bound(self, spec: VectorSpec, contributors: int) -> float:
        """``eps(n, M)`` in the spec's units: how far a decrypted sum can be from the exact
        encoded sum before rounding (rounding removes it; see :meth:`tolerance`)."""
        params = self.parameters(spec)
        assert isinstance(params, raw.CkksParameters)
        bound = params.error_bound(contributors, float(contributors * spec.entry_max),
                                   symmetric=self.options.all_symmetric)
        return bound / spec.scale

    def tolerance(self, spec: VectorSpec, contributors: int) -> float:
        """Encoding rounding only, ``n * 2**-(frac_bits+1)`` (0 for integers).

        CKKS's own error, at most :meth:`error_bound` (``eps <= 1/4`` encoded units, which the
        parameters guarantee), is removed by rounding the decrypted sum to the integer grid of
        the encoding, so the result equals the exact sum of the encoded inputs.
        """
        return super().tolerance(spec, contributors)


class CkksClientSession(SealClientSession):
    """One client's long-lived CKKS state: the key sets it received or made, its own objects only."""

    name = PROTOCOL
    scheme = SCHEME
    options_class = CkksOptions
    client_party = CkksClient

