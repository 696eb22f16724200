"""Every message a protocol sends, as the receiver sees it.

Communication cost and the leakage audit both read this log, so neither is
estimated: ``bytes`` is the length of the serialised envelope, and
``visibility`` says what the receiver can read of it.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any

from .wire import PartyId, party_name


class Visibility(StrEnum):
    CLEAR = "clear"
    """One party's own value in the clear (k = 1)."""
    AGGREGATE = "aggregate"
    """A sum over k clients, readable by the receiver."""
    CIPHERTEXT = "ciphertext"
    """Encrypted under a key the receiver does not hold."""
    MASKED = "masked"
    """Hidden by one-time masks the receiver cannot remove alone."""
    SEALED = "sealed"
    """Authenticated-encrypted for another party (a share or key in transit)."""
    PUBLIC = "public"
    """Public material: keys, parameters, control messages."""


@dataclass(frozen=True)
class Exposure:
    """What the receiver of a message can read: kind, how many clients are mixed in, size."""

    visibility: Visibility
    k: int = 1
    dimension: int = 0
    owner: PartyId | None = None

    @classmethod
    def clear(cls, owner: PartyId, dimension: int) -> Exposure:
        return cls(Visibility.CLEAR, 1, dimension, owner)

    @classmethod
    def aggregate(cls, k: int, dimension: int) -> Exposure:
        return cls(Visibility.AGGREGATE, k, dimension)

    @classmethod
    def ciphertext(cls, dimension: int, owner: PartyId | None = None) -> Exposure:
        return cls(Visibility.CIPHERTEXT, 1, dimension, owner)

    @classmethod
    def masked(cls, dimension: int, owner: PartyId | None = None) -> Exposure:
        return cls(Visibility.MASKED, 1, dimension, owner)

    @classmethod
    def sealed(cls, owner: PartyId | None = None) -> Exposure:
        return cls(Visibility.SEALED, 1, 0, owner)

    @classmethod
    def public(cls) -> Exposure:
        return cls(Visibility.PUBLIC, 0, 0)


@dataclass(frozen=True, slots=True)
class TranscriptEntry:
    round: int
    protocol: str
    run_id: str
    stage: str
    sender: PartyId
    receiver: PartyId
    statistic: str
    bytes: int
    visibility: Visibility
    k: int
    dimension: int
    owner: PartyId | None

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["visibility"] = self.visibility.value
        data["sender_name"] = party_name(self.sender)
        data["receiver_name"] = party_name(self.receiver)
        return data


@dataclass
class Transcript:
    """An append-only log of entries with the totals people ask for."""

    entries: list[TranscriptEntry] = field(default_factory=list)
    _rounds: dict[int, dict[tuple[str, str], int]] = field(default_factory=dict, init=False, repr=False,
                                                           compare=False)
    """Bytes per round by (statistic, stage), kept as entries arrive: a long run asks for each
    round's totals without scanning every entry of the run so far (which made round time grow)."""

    def __post_init__(self) -> None:
        for entry in self.entries:
            self._count(entry)

    def _count(self, entry: TranscriptEntry) -> None:
        totals = self._rounds.setdefault(entry.round, {})
        key = (entry.statistic, entry.stage)
        totals[key] = totals.get(key, 0) + entry.bytes

    def append(self, entry: TranscriptEntry) -> None:
        self.entries.append(entry)
        self._count(entry)

    def round_bytes(self, round: int) -> dict[tuple[str, str], int]:
        """One round's bytes by (statistic, stage) — only entries added through this class count."""
        return dict(self._rounds.get(round, {}))

    def __iter__(self) -> Iterator[TranscriptEntry]:
        return iter(self.entries)

    def __len__(self) -> int:
        return len(self.entries)

    def select(
        self, *, statistic: str | None = None, round: int | None = None, run_id: str | None = None
    ) -> list[TranscriptEntry]:
        return [
            e for e in self.entries
            if (statistic is None or e.statistic == statistic)
            and (round is None or e.round == round)
            and (run_id is None or e.run_id == run_id)
        ]

    def total_bytes(self, entries: Iterable[TranscriptEntry] | None = None) -> int:
        return sum(e.bytes for e in (self.entries if entries is None else entries))

    def bytes_by_statistic(self) -> dict[str, int]:
        totals: dict[str, int] = defaultdict(int)
        for e in self.entries:
            totals[e.statistic] += e.bytes
        return dict(totals)

    def bytes_sent_by(self, party: PartyId, entries: Iterable[TranscriptEntry] | None = None) -> int:
        return sum(e.bytes for e in (self.entries if entries is None else entries) if e.sender == party)

    def to_json(self) -> str:
        return json.dumps([e.as_dict() for e in self.entries])

    def extend(self, other: Transcript) -> None:
        for entry in other.entries:
            self.append(entry)
