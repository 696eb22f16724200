"""What one party of a run knows: the messages it received, read with the protocols' own parsers.

A :class:`PartyView` is built from the tapped messages (:mod:`secure_fl.audit.tap`) alone:

* the ``open`` of every run the party took part in gives the run's request (statistic, round,
  spec, participants, the protocol's public parameters);
* each message the party received is read as the protocol's
  :class:`~protocols.readers.MessageReader` says the receiver can — an upload in the clear, a
  released sum, or a ciphertext under a key the party itself holds — into a :class:`Read`.

The server's :class:`ServerView` adds what the server made itself: the messages it sent (the
``open`` requests, the global models and broadcast vectors of each round, the sums it released
to clients), its :class:`~secure_fl.stats.Release` of every request, the global model after
each round and the cohorts. A client's view is the messages addressed to it.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from protocols import SERVER, SumRequest, Visibility, descriptor
from protocols.wire import OPEN, party_name
from secure_fl.audit.tap import Tapped
from secure_fl.runtime.messages import Kind, RuntimeMessage, is_runtime
from secure_fl.stats import Release

__all__ = ["PartyView", "Read", "RunRequest", "ServerView"]

FloatArray = npt.NDArray[np.float64]
SessionOf = Callable[[str, str], Any]
"""The reading party's own session of (protocol, tag), for the keys it holds (``None``: none)."""


@dataclass(frozen=True)
class RunRequest:
    """One protocol run as its ``open`` describes it."""

    protocol: str
    run_id: str
    request: SumRequest
    index: int
    """Position of the ``open`` among the tapped messages."""


@dataclass(frozen=True, eq=False)
class Read:
    """A value a party read from one message: a client's input (``owner`` set) or a sum."""

    statistic: str
    round: int
    protocol: str
    run_id: str
    stage: str
    contributors: tuple[int, ...]
    values: FloatArray
    index: int
    receiver: int
    """Who read it (the message's receiver)."""

    @property
    def owner(self) -> int | None:
        """The client whose own input this is (``None`` for a sum)."""
        return self.contributors[0] if self.stage in descriptor(self.protocol).input_stages else None


@dataclass
class PartyView:
    """What one party received, and what it read of it."""

    party: int
    received: list[Tapped]
    runs: dict[str, RunRequest]
    reads: list[Read]

    def inputs(self, statistic: str) -> list[Read]:
        """Clients' own inputs of ``statistic`` this party read."""
        return [r for r in self.reads if r.statistic == statistic and r.owner is not None]

    def sums(self, statistic: str) -> list[Read]:
        return [r for r in self.reads if r.statistic == statistic and r.owner is None]


@dataclass
class ServerView(PartyView):
    """The server's view: what it received, what it sent and what it computed from them."""

    sent: list[Tapped] = field(default_factory=list)
    releases: list[Release] = field(default_factory=list)
    models: list[Any] = field(default_factory=list)
    """The global model before round 0 and after every round (flat tensors): the server made them."""
    cohorts: list[tuple[int, ...]] = field(default_factory=list)
    broadcasts: dict[tuple[int, int], dict[str, FloatArray]] = field(default_factory=dict)
    """(round, client) → the broadcast vectors the server sent that client with the round's model."""
    train_index: dict[tuple[int, int], int] = field(default_factory=dict)
    """(round, client) → position of the ``train`` message the server sent that client."""
    learned: dict[int, list[Read]] = field(default_factory=dict)
    """Client → the sums the server knows it learned: each release the server learned whose
    declaration names the clients as learners (its record says which), timed by its run's ``open``."""

    @property
    def rounds(self) -> int:
        return len(self.cohorts)

    def releases_of(self, statistic: str) -> list[Release]:
        return [r for r in self.releases if r.name == statistic]

    def reads_input(self, statistic: str, client: int, round: int) -> bool:
        return any(r.owner == client and r.round == round for r in self.inputs(statistic))


def _opens(messages: Sequence[tuple[int, Tapped]], clients: Sequence[int]) -> dict[str, RunRequest]:
    runs: dict[str, RunRequest] = {}
    for index, message in messages:
        env = message.envelope
        if env is None or env.stage != OPEN or env.run_id.hex() in runs:
            continue
        runs[env.run_id.hex()] = RunRequest(env.protocol, env.run_id.hex(),
                                            SumRequest.from_bytes(env.payload, clients=clients), index)
    return runs


def _reads(messages: Sequence[tuple[int, Tapped]], runs: Mapping[str, RunRequest], clients: Sequence[int],
           session: SessionOf | None, lengths: Mapping[str, int]) -> list[Read]:
    out: list[Read] = []
    for index, message in messages:
        env = message.envelope
        if env is None or env.stage == OPEN:
            continue
        run = runs.get(env.run_id.hex())
        if run is None or run.request.spec is None:
            continue
        d = descriptor(env.protocol)
        stage = d.stages.get(env.stage, str(env.stage))
        # Keys only where the sender says the receiver reads the message (an upload under the
        # server's own key, an aggregate a key holder decrypts): nothing else needs them.
        readable = message.entry.visibility in (Visibility.CLEAR, Visibility.AGGREGATE)
        keys = session(env.protocol, run.request.session) if session is not None and readable else None
        reading = d.message_reader().read(stage, env, run.request, clients=clients, session=keys)
        if reading is None:
            continue
        values = np.asarray(reading.values, dtype=np.float64)
        length = lengths.get(run.request.statistic)
        out.append(Read(
            statistic=run.request.statistic, round=run.request.round, protocol=env.protocol, run_id=run.run_id,
            stage=stage, contributors=tuple(reading.contributors),
            values=values[:length] if length is not None else values, index=index, receiver=message.receiver,
        ))
    return out


def _learned(view: ServerView, clients: Sequence[int], lengths: Mapping[str, int], end: int,
             repeats: Mapping[tuple[str, int, int], int]) -> None:
    """Fill :attr:`ServerView.learned`: the n-th release of (statistic, round) is the n-th sum
    run the server opened for it; a repeat (``reused_from``) is learned at its ``reuse`` message."""
    runs: dict[tuple[str, int], list[RunRequest]] = defaultdict(list)
    for opened in sorted(view.runs.values(), key=lambda r: r.index):
        if opened.request.kind == "sum":
            runs[(opened.request.statistic, opened.request.round)].append(opened)
    taken: dict[tuple[str, int], int] = defaultdict(int)
    names = {party_name(c): c for c in clients}
    for release in view.releases:
        key = (release.name, release.round)
        run = None
        if release.reused_from is None:
            position, taken[key] = taken[key], taken[key] + 1
            run = runs[key][position] if position < len(runs[key]) else None
        if release.value is None:
            continue
        length = lengths.get(release.name)
        values = np.asarray(release.value, dtype=np.float64)
        for learner in release.learned_by:
            client = names.get(learner)
            if client is None:
                continue
            index = end if run is None else run.index
            if release.reused_from is not None:
                index = repeats.get((release.name, release.round, client), end)
            view.learned.setdefault(client, []).append(Read(
                statistic=release.name, round=release.round, protocol=release.protocol,
                run_id="" if run is None else run.run_id, stage="release" if release.reused_from is None else "reuse",
                contributors=release.contributors, values=values[:length] if length is not None else values,
                index=index, receiver=client))


def client_view(party: int, messages: Sequence[Tapped], *, clients: Sequence[int], lengths: Mapping[str, int],
                session: SessionOf | None = None) -> PartyView:
    """A client's view: the messages addressed to it, read with its own keys (``session``: its
    sessions, which a client brings to a coalition) or without any."""
    mine = [(i, m) for i, m in enumerate(messages) if m.receiver == party]
    runs = _opens(mine, clients)
    return PartyView(party, [m for _, m in mine], runs, _reads(mine, runs, clients, session, lengths))


def server_view(messages: Sequence[Tapped], *, clients: Sequence[int], lengths: Mapping[str, int],
                session: SessionOf, releases: Sequence[Release], models: Sequence[Any],
                cohorts: Sequence[tuple[int, ...]]) -> ServerView:
    """The server's view of a run (see the module docstring); ``session`` gives the server's own
    sessions (its keys, used where it holds one)."""
    received = [(i, m) for i, m in enumerate(messages) if m.receiver == SERVER]
    sent = [(i, m) for i, m in enumerate(messages) if m.sender == SERVER]
    runs = _opens(sent, clients)
    view = ServerView(SERVER, [m for _, m in received], runs, _reads(received, runs, clients, session, lengths),
                      sent=[m for _, m in sent], releases=list(releases), models=list(models), cohorts=list(cohorts))
    repeats: dict[tuple[str, int, int], int] = {}
    for index, message in sent:
        if not is_runtime(message.data):
            continue
        runtime = RuntimeMessage.from_bytes(message.data)
        key = (runtime.round, message.receiver)
        if runtime.kind == Kind.BROADCAST and runtime.vector is not None:
            view.broadcasts.setdefault(key, {})[runtime.name] = runtime.vector.astype(np.float64)
        elif runtime.kind == Kind.TRAIN:
            view.train_index[key] = index
        elif runtime.kind == Kind.REUSE:
            repeats[(runtime.name, runtime.round, message.receiver)] = index
    _learned(view, clients, lengths, len(messages), repeats)
    return view
