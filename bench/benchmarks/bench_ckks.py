"""CKKS on TenSEAL (coefficient primes 60, 40, 40, 60; scale 2**40), a client agent holding
the key. ``ring`` is the polynomial modulus degree N: N/2 slots per ciphertext, a vector
of length d travels as ceil(d / (N/2)) ciphertexts. Contexts are made once per benchmark
process by the session's key set-up run (in setup, never timed)."""

from __future__ import annotations

from typing import Any, ClassVar

from protocols import SecureSum, make_sum

from . import _harness as h

RINGS = h.pick((8192, 16384), (8192,))
BUDGET = 3000 * 8192
"""Largest clients x ciphertexts x N held at once (~1 GB of uploads at N = 8192)."""


def ciphertexts(length: int, ring: int) -> int:
    return -(-length // (ring // 2))


class _Ckks(h._Protocol):
    protocol = "ckks"
    replay = "party"
    params: ClassVar[list[Any]] = [h.CLIENTS, h.LENGTHS, RINGS]
    param_names: ClassVar[list[str]] = ["clients", "length", "ring"]

    def session(self, cache: Any, clients: int, length: int, *extra: Any) -> SecureSum:
        session = make_sum("ckks", clients=list(range(clients)), poly_modulus_degree=extra[0])
        session.setup()  # the key set-up run (context and keys), untimed
        return session

    def unsupported(self, label: str, clients: int, length: int, *extra: Any) -> str | None:
        ring = extra[0]
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
