"""The rows and figures of the exposure ledger (:mod:`secure_fl.audit.ledger` builds them)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from protocols.wire import party_name

__all__ = [
    "AGGREGATE", "CIPHERTEXT", "CLEAR", "KINDS", "MASKED", "OWN", "PUBLIC", "SEALED", "ExposureRow", "KeyHolders",
    "LedgerSummary", "RunInfo", "StatisticSummary", "party_label",
]

# Kinds of rows, from most to least revealing to the party that holds them.
OWN, CLEAR, AGGREGATE, CIPHERTEXT, MASKED, SEALED, PUBLIC = (
    "own", "clear", "aggregate", "ciphertext", "masked", "sealed", "public",
)
KINDS = (OWN, CLEAR, AGGREGATE, CIPHERTEXT, MASKED, SEALED, PUBLIC)


def party_label(party: int | None) -> str | None:
    return None if party is None else party_name(party)


@dataclass(frozen=True)
class ExposureRow:
    """One value one party holds: what kind, of whom, how large.

    ``readable`` is True when the party can read the value alone (its own value, another
    client's value in the clear — including a ciphertext under a key the party holds — or
    an aggregate); ``k`` is the number of clients mixed into it (1 for a single client's
    value, 0 for public material); ``k_effective`` discounts the party's own contribution
    to an aggregate it helped form (a contributor to a sum of 2 learns the other input).
    """

    party: str
    role: str
    round: int
    protocol: str
    statistic: str
    stage: str
    kind: str
    k: int
    k_effective: int
    dimension: int
    bytes: int
    owner: str | None
    readable: bool
    run_id: str
    note: str = ""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class KeyHolders:
    """Who can decrypt a protocol's ciphertexts in this run (HE protocols only)."""

    protocol: str
    mode: str
    """``server``, ``agent``, ``all`` or ``unknown``."""
    holders: frozenset[int]
    agent: int | None = None


@dataclass(frozen=True)
class RunInfo:
    """One protocol run (one secure sum, or one round of clear uploads of a statistic)."""

    protocol: str
    statistic: str
    round: int
    run_id: str
    contributors: tuple[int, ...]
    learners: tuple[int, ...]
    """Parties that can read the sum (party ids; :data:`protocols.SERVER` for the server)."""
    threshold: int | None = None
    """Masking runs: Shamir shares needed to recover one client's secrets."""

    @property
    def k(self) -> int:
        return len(self.contributors)


@dataclass(frozen=True)
class StatisticSummary:
    """One statistic over the whole run."""

    statistic: str
    protocols: tuple[str, ...]
    rounds: int
    dimension: int
    k_min: int | None
    server_reads_individual: bool
    server_learns_sum: bool
    collusion_threshold: int | None
    participants: int
    recoverable: tuple[int, ...]
    """Clients whose value the server could isolate by differencing round sums, if constant."""

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["protocols"] = list(self.protocols)
        data["recoverable"] = list(self.recoverable)
        return data


@dataclass(frozen=True)
class LedgerSummary:
    """The per-run figures of the audit matrix."""

    clients: tuple[int, ...]
    server_plaintext_bytes_per_client: float
    """Mean over clients of the bytes of that client's individual values the server can read."""
    server_plaintext_bytes_by_client: dict[int, int]
    k_min: int | None
    """Smallest number of clients in any value a party other than its owner can read."""
    k_min_effective: int | None
    """Same, not counting the reading party's own contribution."""
    collusion_threshold: int | None
    """Fewest clients who (with the server, or alone) can read one honest client's value:
    the smaller of the protocols' own thresholds and ``k - 1`` for the smallest readable sum."""
    protocol_collusion_threshold: int | None
    """The protocols' own threshold only (0 plain, 1 client key holder, t masking)."""
    key_holders: dict[str, KeyHolders]
    statistics: dict[str, StatisticSummary]
    flags: tuple[str, ...]

    def as_dict(self) -> dict[str, Any]:
        return {
            "clients": list(self.clients),
            "server_plaintext_bytes_per_client": self.server_plaintext_bytes_per_client,
            "server_plaintext_bytes_by_client": {str(c): b for c, b in self.server_plaintext_bytes_by_client.items()},
            "k_min": self.k_min,
            "k_min_effective": self.k_min_effective,
            "collusion_threshold": self.collusion_threshold,
            "protocol_collusion_threshold": self.protocol_collusion_threshold,
            "key_holders": {
                name: {"mode": kh.mode, "holders": sorted(party_label(h) or "" for h in kh.holders),
                       "agent": party_label(kh.agent)}
                for name, kh in self.key_holders.items()
            },
            "statistics": {name: s.as_dict() for name, s in self.statistics.items()},
            "flags": list(self.flags),
        }
