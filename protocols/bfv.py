"""BFV secure sum (TenSEAL's BFV: SEAL batching) with a client as key holder: exact integers.

The protocol — roles, key holders (``agent``, ``all``), key set-up as messages, stages, seeded
uploads, integrity — is :mod:`protocols.seal_sum`'s, shared with :mod:`protocols.ckks`; this
module supplies BFV's options, its parameter derivation and the key holder's checks.

**Parameters.** By default each sum gets the smallest parameters that carry it exactly
(:func:`~protocols.primitives.bfv.derive`): a plaintext modulus t, a prime that is 1 mod 2N,
above ``n * entry_max`` — every possible sum — so slot sums never wrap modulo t (the same
headroom rule as the encoding's ``slot_bits`` for Paillier and masking); the smallest ring N
keeping 128-bit security whose modulus holds the sum's worst-case noise; one data prime (more
beyond 60 bits) and one special prime. One ciphertext carries N entries. Counts up to 2**16
from 100 clients run at N = 4096, t = 16760833 and a 44-bit data prime (38 bits when every
client holds the key). Options can fix the ring or the whole parameter set.

**Exact sums.** Clients encrypt their encoded entries (``[0, entry_max]``, refused otherwise).
The key holder decrypts every slot modulo t exactly and checks, before releasing anything, that
each ciphertext's invariant noise budget is at least what an honest sum of that many
contributors has (:meth:`~protocols.primitives.bfv.BfvParameters.min_budget`) and that every
slot lies in ``[0, contributors * entry_max]``; otherwise the aggregate is corrupted or under
another key and is refused (:class:`~protocols.errors.CiphertextError`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from typing import Final

from .encoding import VectorSpec
from .errors import CiphertextError
from .primitives import bfv as raw
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
    "PROTOCOL", "BfvClient", "BfvClientSession", "BfvOptions", "BfvServer", "BfvServerSession", "ClientKeys",
    "Stage", "check_capacity",
]

PROTOCOL: Final = "bfv"


@dataclass(frozen=True, kw_only=True)
class BfvOptions(SealOptions):
    """BFV parameters and who holds the key.

    ``poly_modulus_degree``, ``coeff_mod_bit_sizes``, ``plain_modulus``
        all ``None`` (default): each sum gets the smallest parameters that carry it exactly;
        ``poly_modulus_degree`` alone fixes the ring (N entries per ciphertext) and derives the
        rest; all three fix one parameter set for every sum (a sum it cannot carry exactly is
        refused).
    ``keyholder``
        ``agent`` or ``all`` (:mod:`protocols.seal_sum`).
    ``symmetric``
        a client that holds the secret key encrypts with it: seeded ciphertexts, half the bytes.
    ``verify_aggregate``
        a decryptor decrypts only an aggregate that every contributor attested (signed tags of
        its own upload, checked on ciphertexts before decrypting; :mod:`protocols.seal_sum`),
        so an active server cannot alter the aggregate and learn from a refusal. ``None``
        (default): on whenever the parties have registered signing keys
        (``make_sum(..., authenticate=True)``); ``True`` needs them.
    """

    poly_modulus_degree: int | None = None
    coeff_mod_bit_sizes: tuple[int, ...] | None = None
    plain_modulus: int | None = None
    keyholder: Keyholder = "agent"
    symmetric: bool = True
    verify_aggregate: bool | None = None
    parameters: raw.BfvParameters | None = field(init=False, repr=False, compare=False, default=None)

    def __post_init__(self) -> None:
        self._fix_parameters("BFV", "plain_modulus", raw.BfvParameters)

    @property
    def fixed(self) -> raw.BfvParameters | None:
        return self.parameters

    def parameters_for(self, spec: VectorSpec) -> raw.BfvParameters:
        return _parameters_for(self, spec)

    def parse_parameters(self, data: bytes) -> raw.BfvParameters:
        return raw.BfvParameters.from_bytes(data)


@lru_cache(maxsize=256)
def _parameters_for(options: BfvOptions, spec: VectorSpec) -> raw.BfvParameters:
    symmetric = options.all_symmetric
    if options.parameters is not None:
        raw.check_capacity(options.parameters, spec.summands, spec.entry_max, symmetric=symmetric)
        return options.parameters
    return raw.derive(summands=spec.summands, entry_max=spec.entry_max, symmetric=symmetric,
                      ring=options.poly_modulus_degree)


def check_capacity(params: raw.BfvParameters, spec: VectorSpec, *, symmetric: bool = False) -> None:
    """Refuse a spec whose sums BFV under ``params`` cannot carry exactly (``CapacityError``)."""
    raw.check_capacity(params, spec.summands, spec.entry_max, symmetric=symmetric)


def _decrypt_sum(secret: raw.SecretContext, streams: list[bytes], sizes: list[int], params: raw.BfvParameters,
                 spec: VectorSpec, contributors: int, all_symmetric: bool) -> Decryption:
    """The slot sums, after checking the noise and range an honest aggregate of ``contributors`` has."""
    values, budgets = secret.decrypt(streams, sizes)
    least = min(budgets)
    if least < params.min_budget(contributors, symmetric=all_symmetric):
        raise CiphertextError("the aggregate decrypts with more noise than an honest sum has")
    top = contributors * spec.entry_max
    if values.size and int(values.max()) > top:
        raise CiphertextError(f"the aggregate decrypts outside [0, {top}]")
    return Decryption(values, budget=least)


SCHEME: Final = SumScheme(protocol=PROTOCOL, public=raw.PublicContext, secret=raw.SecretContext,
                          decrypt_sum=_decrypt_sum)


class BfvClient(SealClient):
    """A client's side of one BFV sum (``noise_budget``: the least budget it met, if it decrypted)."""


BfvServer = SealServer


class BfvServerSession(SealServerSession):
    """The server's long-lived BFV state: a public context and agent per parameter set."""

    name = PROTOCOL
    scheme = SCHEME
    options_class = BfvOptions


class BfvClientSession(SealClientSession):
    """One client's long-lived BFV state: the key sets it received or made, its own objects only."""

    name = PROTOCOL
    scheme = SCHEME
    options_class = BfvOptions
    client_party = BfvClient
