"""The audit's tap on a :class:`~protocols.LocalNetwork`: every message that crossed it, as bytes.

The tap is the network's own interceptor (the hook :class:`~protocols.LocalNetwork` offers for
fault injection): it sees the exact bytes of each message and the label its sender attached,
and passes them on unchanged. The network then records the message in its transcript with the
sender and the receiver — one entry right after each interceptor call that delivers — so the
tap pairs its *i*-th message with the *i*-th transcript entry written after it was installed,
checking that both describe the same message. Nothing else of the run is touched: the parties
get the same bytes as without the tap.

A party's view is then a filter of :attr:`NetworkTap.messages`: what it received (and, for the
server, what it sent — it made those messages itself).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from functools import cached_property

from protocols import SERVER, Label, LocalNetwork, Message, TranscriptEntry, WireError
from protocols.network import Interceptor
from protocols.wire import Envelope

__all__ = ["NetworkTap", "Tapped"]


@dataclass(frozen=True, eq=False)
class Tapped:
    """One message as it crossed the network: who sent it to whom, its label and its bytes."""

    sender: int
    receiver: int
    label: Label
    data: bytes
    entry: TranscriptEntry
    """The transcript's record of the message (what its receiver can read, by the sender's label)."""

    @cached_property
    def envelope(self) -> Envelope | None:
        """The protocol envelope these bytes hold (``None`` for runtime messages)."""
        try:
            return Envelope.from_bytes(self.data)
        except WireError:
            return None

    @property
    def to_server(self) -> bool:
        return self.receiver == SERVER


class NetworkTap:
    """Records every message a :class:`~protocols.LocalNetwork` carries (see the module docstring).

    :meth:`install` puts the tap in front of the network's existing interceptor (if any): that
    one still decides what crosses; the tap records what it let through.
    """

    def __init__(self) -> None:
        self._carried: list[tuple[bytes, Label]] = []
        self._network: LocalNetwork | None = None
        self._start = 0
        self._inner: Interceptor | None = None

    @classmethod
    def on(cls, network: LocalNetwork) -> NetworkTap:
        """A tap installed on ``network``."""
        tap = cls()
        tap.install(network)
        return tap

    def install(self, network: LocalNetwork) -> None:
        if self._network is not None:
            raise RuntimeError("this tap is installed already")
        self._network, self._start, self._inner = network, len(network.transcript), network.interceptor
        network.interceptor = self._intercept

    def _intercept(self, data: bytes, message: Message) -> bytes | None:
        delivered = data if self._inner is None else self._inner(data, message)
        if delivered is not None:
            self._carried.append((delivered, message.label))
        return delivered

    @property
    def messages(self) -> list[Tapped]:
        """Every message carried since :meth:`install`, in order, with sender and receiver."""
        if self._network is None:
            return []
        entries = self._network.transcript.entries[self._start:]
        if len(entries) != len(self._carried):
            raise RuntimeError(f"the transcript holds {len(entries)} entries for {len(self._carried)} tapped "
                               "messages: something else writes to this network's transcript")
        out = []
        for (data, label), entry in zip(self._carried, entries):
            if (entry.bytes, entry.stage, entry.round, entry.run_id, entry.statistic) != (
                    len(data), label.stage, label.round, label.run_id, label.statistic):
                raise RuntimeError("a transcript entry does not describe the tapped message it follows")
            out.append(Tapped(entry.sender, entry.receiver, label, data, entry))
        return out

    def __iter__(self) -> Iterator[Tapped]:
        return iter(self.messages)

    def received_by(self, party: int) -> list[Tapped]:
        """What ``party`` received (:data:`~protocols.SERVER` for the server)."""
        return [m for m in self.messages if m.receiver == party]

    def sent_by(self, party: int) -> list[Tapped]:
        return [m for m in self.messages if m.sender == party]
