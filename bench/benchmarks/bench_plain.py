"""The insecure baseline: what the secure protocols are compared against."""

from __future__ import annotations

from typing import Any

from protocols import SecureSum, make_sum

from . import _harness as h


class _Plain(h._Protocol):
    protocol = "plain"
    replay = "party"

    def session(self, cache: Any, clients: int, length: int, *extra: Any) -> SecureSum:
        return make_sum("plain", clients=list(range(clients)))

    def unsupported(self, label: str, clients: int, length: int, *extra: Any) -> str | None:
        if label == "finalize":
            return "plain has no finalisation: the server reads the sum"
        return super().unsupported(label, clients, length)


class ClientUpload(_Plain, h._ClientUpload):
    pass


class ServerAggregate(_Plain, h._ServerAggregate):
    pass


class Round(_Plain, h._Round):
    pass
