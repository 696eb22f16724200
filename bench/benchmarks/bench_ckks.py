"""CKKS on TenSEAL, a client agent holding the key, under the parameters every sum used before
they were derived (``legacy``: N = 8192, coefficient primes 60, 40, 40, 60, scale 2**40) and under
the parameters derived from the sum (``derived``: the smallest ring and modulus chain that carry
it exactly). A vector of length d travels as ceil(d / N) ciphertexts (two entries per complex
slot). Contexts are made once per benchmark process by the session's key set-up run for the
benchmark's parameter set (in setup, never timed)."""

from __future__ import annotations

from typing import Any, ClassVar

from protocols import SecureSum, make_sum
from protocols.ckks import LEGACY

from . import _harness as h

PARAMETERS = h.pick(("legacy", "derived"), ("derived",))  # CI: bench_compact smokes the legacy set
BUDGET = 3000 * 8192
"""Largest clients x ciphertexts x N held at once (~1 GB of uploads at N = 8192)."""
LEGACY_OPTIONS: dict[str, Any] = {"poly_modulus_degree": LEGACY.poly_modulus_degree,
                                  "coeff_mod_bit_sizes": LEGACY.coeff_mod_bit_sizes, "scale_bits": LEGACY.scale_bits}


def ciphertexts(length: int, ring: int) -> int:
    return -(-length // ring)


class _Ckks(h._Protocol):
    protocol = "ckks"
    replay = "party"
    params: ClassVar[list[Any]] = [h.CLIENTS, h.LENGTHS, PARAMETERS]
    param_names: ClassVar[list[str]] = ["clients", "length", "parameters"]

    def session(self, cache: Any, clients: int, length: int, *extra: Any) -> SecureSum:
        options = LEGACY_OPTIONS if extra[0] == "legacy" else {}
        session = make_sum("ckks", clients=list(range(clients)), **options)
        session.server.check(spec=self.spec(clients, length, *extra), reveal=h.REVEAL)
        session.setup()  # the key set-up run (context and keys) for the sum's parameter set, untimed
        return session

    def ring(self, clients: int, length: int, parameters: str) -> int:
        if parameters == "legacy":
            return LEGACY.poly_modulus_degree
        from protocols.ckks import CkksOptions

        return CkksOptions().parameters_for(self.spec(clients, length)).poly_modulus_degree

    def unsupported(self, label: str, clients: int, length: int, *extra: Any) -> str | None:
        ring = self.ring(clients, length, extra[0])
        per_client = ciphertexts(length, ring)
        if label == "upload":
            return None if per_client <= 300 else f"{per_client} ciphertexts per client"
        # every other stage needs a whole run first: all clients' uploads are held at once
        if clients * per_client * ring > BUDGET:
            return f"{clients} x {per_client} ciphertexts at N = {ring}"
        return super().unsupported(label, clients, length)


class ClientUpload(_Ckks, h._ClientUpload):
    pass


class ServerAggregate(_Ckks, h._ServerAggregate):
    pass


class Finalize(_Ckks, h._Finalize):
    pass


class Round(_Ckks, h._Round):
    def track_context_bytes(self, cache: Any, *args: Any) -> int:
        """Bytes of distributing the public context (once per run of many sums)."""
        return self.session(cache, *args).transcript.total_bytes()

    track_context_bytes.unit = "bytes"  # type: ignore[attr-defined]
