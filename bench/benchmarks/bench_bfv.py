"""BFV on TenSEAL (exact integer sums), parameters derived from the sum: a client agent holding
the key (``agent``: clients other than the agent encrypt with the public key), or every client
holding it (``all``: every upload is a seeded secret-key ciphertext, half the bytes). A vector of
length d travels as ceil(d / N) ciphertexts. Contexts are made once per benchmark process by the
session's key set-up run (in setup, never timed)."""

from __future__ import annotations

from typing import Any, ClassVar

from protocols import SecureSum, make_sum
from protocols.bfv import BfvOptions

from . import _harness as h

KEYHOLDERS = h.pick(("agent", "all"), ("agent",))  # CI: bench_compact smokes bfv-all
BUDGET = 3000 * 8192
"""Largest clients x ciphertexts x N held at once (as for CKKS)."""


class _Bfv(h._Protocol):
    protocol = "bfv"
    replay = "party"
    params: ClassVar[list[Any]] = [h.CLIENTS, h.LENGTHS, KEYHOLDERS]
    param_names: ClassVar[list[str]] = ["clients", "length", "keyholder"]

    def session(self, cache: Any, clients: int, length: int, *extra: Any) -> SecureSum:
        session = make_sum("bfv", clients=list(range(clients)), keyholder=extra[0])
        session.server.check(spec=self.spec(clients, length, *extra), reveal=h.REVEAL)
        session.setup()  # the key set-up run for the sum's parameter set, untimed
        return session

    def unsupported(self, label: str, clients: int, length: int, *extra: Any) -> str | None:
        ring = BfvOptions(keyholder=extra[0]).parameters_for(self.spec(clients, length)).poly_modulus_degree
        per_client = -(-length // ring)
        if label == "upload":
            return None if per_client <= 300 else f"{per_client} ciphertexts per client"
        if clients * per_client * ring > BUDGET:
            return f"{clients} x {per_client} ciphertexts at N = {ring}"
        return super().unsupported(label, clients, length)


class ClientUpload(_Bfv, h._ClientUpload):
    pass


class ServerAggregate(_Bfv, h._ServerAggregate):
    pass


class Finalize(_Bfv, h._Finalize):
    pass


class Round(_Bfv, h._Round):
    def track_context_bytes(self, cache: Any, *args: Any) -> int:
        """Bytes of distributing the public context (once per run of many sums)."""
        return self.session(cache, *args).transcript.total_bytes()

    track_context_bytes.unit = "bytes"  # type: ignore[attr-defined]
