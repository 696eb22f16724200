"""Pairwise masking: SecAgg on the complete graph (``masking``) and SecAgg+ on a random
Harary graph (``secagg+``, degree and threshold from Bell et al.'s bounds).

Every run makes fresh keys, so stages are reached by replaying the whole run on fresh
parties (``full`` replay): the client upload is timed after the key stages, the
finalisation is the server's unmasking.
"""

from __future__ import annotations

from typing import Any, ClassVar

from protocols import SecureSum, make_sum

from . import _harness as h

PROTOCOLS = ("masking", "secagg+")


class _Masking(h._Protocol):
    protocol = "masking"
    replay = "full"
    params: ClassVar[list[Any]] = [h.CLIENTS, h.LENGTHS, PROTOCOLS]
    param_names: ClassVar[list[str]] = ["clients", "length", "protocol"]

    def session(self, cache: Any, clients: int, length: int, *extra: Any) -> SecureSum:
        return make_sum(extra[0], clients=list(range(clients)))

    def unsupported(self, label: str, clients: int, length: int, *extra: Any) -> str | None:
        protocol = extra[0]
        if protocol == "masking" and clients > 100:
            return "the complete graph at 1000 clients: ~1e6 sealed shares per run (use secagg+)"
        return super().unsupported(label, clients, length)


class ClientUpload(_Masking, h._ClientUpload):
    pass


class ServerAggregate(_Masking, h._ServerAggregate):
    pass


class Finalize(_Masking, h._Finalize):
    pass


class Round(_Masking, h._Round):
    pass
