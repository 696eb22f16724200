"""Shared machinery of the asv suite: parameters, inputs, and a stage-by-stage replay of
one secure-sum run, so that asv times exactly one stage of a protocol on fresh parties.

Parties are built the way a deployment builds them: the server party by the protocol's
:class:`~protocols.session.ServerSession` (``open``), each client's party by that client's own
:class:`~protocols.session.ClientSession` (``join``) when the server's ``open`` message reaches
it. They share nothing but serialised envelopes. :class:`Run` plays the network between them
one *event* at a time, in the order :func:`protocols.drive` and
:class:`protocols.LocalNetwork` deliver messages (one exchange: every client in id order gets
its messages and answers; then the server takes in the answers in client order; when nothing
is left to send, the server's ``advance``). An event is the server's ``start`` or
``advance``, a client's ``join`` (parsing the ``open`` it got and joining through its
session) and ``start`` (its answer to ``open``), or one party's ``receive`` of one message
(serialising it, parsing it back, recording it in the run's transcript and handing it to
the party). Once per benchmark process a calibration run finds the window of events of one
stage, from the stage labels the parties themselves record (``Party.timings``: ``upload``,
``aggregate``, ``finalize``):

* **client upload**: the first event in which a client records ``upload`` (its ``start``
  for plain, Paillier and CKKS — joining is a separate event, not timed; its answer to the
  server's ``upload`` message for masking, after the key stages);
* **server aggregation**: from the server's first receipt of an ``upload`` message to
  the last event in which it records ``aggregate`` (parsing every upload, adding or
  multiplying, Paillier's product on ``advance``);
* **finalisation**: the events that record ``finalize`` (the key holder's decryption
  for Paillier/CKKS, the server's unmasking for masking).

``setup`` then builds fresh parties and executes everything *before* the window; the
timed method executes the window. Two ways to reach the window:

* ``full`` replay re-runs every earlier event on fresh parties (always correct; what
  masking needs, since its keys are fresh per run);
* ``party`` replay re-runs only the earlier events of the one party acting in the
  window, feeding it the messages recorded in calibration (plain, Paillier and CKKS:
  their parties' state depends only on their session's long-lived keys and the messages
  they get, so 1000 clients' encryptions need not be redone before every timed aggregation).

All runs of one benchmark process share one ``run_id`` and one request (recorded messages,
request digests included, stay valid); that is a benchmark convenience, never done by the
protocols.

Keys and contexts are made once per process (or in ``setup_cache``) by the sessions' own
key set-up runs, never timed. Set ``SECURE_FL_BENCH_SMALL=1`` to narrow every parameter
grid to its smallest point (CI).
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, NoReturn

import numpy as np

from protocols import (
    LocalNetwork,
    Message,
    Reveal,
    RunContext,
    SecureSum,
    SumRequest,
    VectorSpec,
    encode,
)
from protocols.base import Outgoing, Party, ServerParty
from protocols.transcript import Transcript
from protocols.wire import OPEN, SERVER, Envelope

SMALL = os.environ.get("SECURE_FL_BENCH_SMALL", "").strip() not in ("", "0")


def pick(full: tuple[Any, ...], small: tuple[Any, ...]) -> tuple[Any, ...]:
    """The full parameter grid, or the CI one under ``SECURE_FL_BENCH_SMALL=1``."""
    return small if SMALL else full


CLIENTS = pick((10, 100, 1000), (10,))
LENGTHS = pick((10, 56, 10_000, 100_000, 1_000_000), (56,))
MAX_ENTRIES = 10**8
"""Largest clients x length a benchmark holds (encoded inputs and uploads must fit 24 GB)."""
REVEAL = Reveal(server=True, clients=False)
"""Every benchmarked sum is learned by the server only (what masking supports, and what a
model-update average needs); broadcasting it back would add n copies of the sum."""
ORDER = ("upload", "aggregate", "finalize")
SLOW_SETUP = 5.0
"""Seconds of replay before a timed window above which a benchmark takes fewer samples."""
DISTINCT_INPUTS = 4
"""Clients share a few distinct input vectors: same cost, a fraction of the memory."""


def skip(reason: str) -> NoReturn:
    """asv's way to skip one parameter combination: raise NotImplementedError in setup."""
    raise NotImplementedError(reason)


def spec_for(clients: int, length: int) -> VectorSpec:
    """The suite's input: a model-update-like vector of floats in [-1, 1] at 2**-16 resolution."""
    return VectorSpec(length=length, bound=1.0, summands=clients, kind="float", signed=True, frac_bits=16)


def raw_inputs(clients: int, length: int, spec: VectorSpec | None = None) -> dict[int, np.ndarray]:
    """Experiment data only (numpy's generator never touches keys or masks): uniform in [-1, 1],
    or anywhere in ``spec``'s range when given (integers for an integer spec)."""
    rng = np.random.default_rng(20_240_601)
    count = min(clients, DISTINCT_INPUTS)
    if spec is None or (spec.kind == "float" and spec.signed and spec.bound == 1.0):
        distinct = [rng.uniform(-1.0, 1.0, length) for _ in range(count)]
    else:
        low = -spec.bound if spec.signed else 0.0
        distinct = [rng.integers(int(low), int(spec.bound) + 1, length) if spec.kind == "int"
                    else rng.uniform(low, spec.bound, length) for _ in range(count)]
    return {pid: distinct[pid % len(distinct)] for pid in range(clients)}


def encoded_inputs(spec: VectorSpec, clients: int) -> dict[int, np.ndarray]:
    distinct: dict[int, np.ndarray] = {}
    for i, vector in raw_inputs(min(clients, DISTINCT_INPUTS), spec.length, spec).items():
        distinct[i] = encode(spec, vector).values
    return {pid: distinct[pid % len(distinct)] for pid in range(clients)}


# --- driving one run one event at a time ------------------------------------------------------

MAX_EXCHANGES = 64
"""As :func:`protocols.drive`: a run that needs more exchanges than this is broken."""


@dataclass(frozen=True)
class Event:
    party: int
    kind: str  # "start" | "join" | "receive" | "advance"
    stage: str = ""
    message: Outgoing | None = None
    """What a ``join`` or ``receive`` delivers (as its sender produced it)."""

    @property
    def signature(self) -> tuple[int, str, str]:
        return (self.party, self.kind, self.stage)


class Run:
    """One sum on fresh parties built through ``session``'s server and client sessions, driven
    one event at a time (see the module docstring; no dropouts, errors propagate).

    ``encoded`` holds the participants' inputs as each client's owner hands them to its
    session's ``join``; the server never sees them.
    """

    def __init__(self, session: SecureSum, spec: VectorSpec, encoded: Mapping[int, np.ndarray], *,
                 run_id: bytes, reveal: Reveal = REVEAL, statistic: str = "bench") -> None:
        self.session = session
        self.encoded = encoded
        request = SumRequest(kind="sum", statistic=statistic, round=0, spec=spec, reveal=reveal,
                             participants=tuple(sorted(encoded)))
        session.server.check(spec=spec, reveal=reveal)
        self.server: ServerParty = session.server.open(run_id=run_id, request=request)
        self.parties: dict[int, Party] = {SERVER: self.server}
        """The server's party, and each client's once it joined."""
        self.network = LocalNetwork()
        """Only its transcript and :meth:`~protocols.Network.record`: the events carry the bytes."""
        self.context = RunContext(session.name, run_id, 0, statistic, session.descriptor.stages)
        self.sent: list[Outgoing] = []
        """What the last executed event sent."""
        self._events = self._drive()
        self.next_event: Event | None = next(self._events, None)
        self.count = 0

    @property
    def transcript(self) -> Transcript:
        return self.network.transcript

    # --- what an event does -----------------------------------------------------------------

    def _carry(self, message: Outgoing) -> Envelope:
        """Serialise, record (bytes on the wire, what the receiver can read), parse back."""
        env = message.envelope
        data = env.to_bytes()
        self.network.record(Message(data, self.context.label(env.stage, message.exposure)),
                            sender=env.sender, receiver=env.receiver)
        return Envelope.from_bytes(data)

    def _join(self, message: Outgoing) -> None:
        """A client parses the ``open`` it got and joins through its own session."""
        env = self._carry(message)
        pid = env.receiver
        client = self.session.client_session(pid)
        request = SumRequest.from_bytes(env.payload, clients=client.clients)
        values = self.encoded.get(pid) if pid in request.participants else None
        self.parties[pid] = client.join(run_id=env.run_id, request=request, values=values)

    def _receive(self, pid: int, message: Outgoing) -> list[Outgoing]:
        return self.parties[pid].receive(self._carry(message))

    def _out(self, outgoing: list[Outgoing]) -> list[Outgoing]:
        self.sent = outgoing
        return outgoing

    def _drive(self) -> Iterator[Event]:
        """Yields each event just before executing it; resuming executes it."""
        names = self.context.stage_names

        def stage(message: Outgoing) -> str:
            return names.get(message.envelope.stage, str(message.envelope.stage))

        yield Event(SERVER, "start")
        pending = self._out(self.server.start())
        for _ in range(MAX_EXCHANGES):
            if not pending:
                if self.server.finished:
                    return
                yield Event(SERVER, "advance")
                pending = self._out(self.server.advance())
                if not pending and not self.server.finished:
                    raise RuntimeError("the run stalled: no party has anything left to send")
                continue
            outbox: dict[int, list[Outgoing]] = {}
            for message in pending:
                outbox.setdefault(message.envelope.receiver, []).append(message)
            replies: dict[int, list[Outgoing]] = {}
            for pid in sorted(outbox):
                for message in outbox[pid]:
                    if message.envelope.stage == OPEN:
                        yield Event(pid, "join", stage(message), message)
                        self._join(message)
                        yield Event(pid, "start", stage(message))
                        out = self._out(self.parties[pid].start())
                    else:
                        yield Event(pid, "receive", stage(message), message)
                        out = self._out(self._receive(pid, message))
                    replies.setdefault(pid, []).extend(out)
            pending = []
            for pid in sorted(replies):
                for message in replies[pid]:
                    yield Event(SERVER, "receive", stage(message), message)
                    pending.extend(self._out(self._receive(SERVER, message)))
        raise RuntimeError(f"the run did not finish within {MAX_EXCHANGES} exchanges")

    # --- stepping -----------------------------------------------------------------------------

    def step(self) -> tuple[Event, dict[str, float]]:
        """Execute the next event; returns it and the seconds it added to each of its party's
        stage labels (``Party.timings``)."""
        event = self.next_event
        if event is None:
            raise RuntimeError("the run is already over")
        party = self.parties.get(event.party)
        before = dict(party.timings) if party is not None else {}
        self.sent = []
        self.next_event = next(self._events, None)
        self.count += 1
        party = self.parties.get(event.party)
        after = party.timings if party is not None else {}
        changed = {k: v - before.get(k, 0.0) for k, v in after.items() if v != before.get(k)}
        return event, changed

    def finish(self) -> None:
        while self.next_event is not None:
            self.step()

    def replay(self, event: Event) -> None:
        """Execute a recorded event on this run's party (``party`` replay)."""
        if event.kind == "join":
            assert event.message is not None
            self._join(event.message)
        elif event.kind == "start":
            self.parties[event.party].start()
        elif event.kind == "advance":
            self.server.advance()
        else:
            assert event.message is not None
            self._receive(event.party, event.message)


@dataclass(frozen=True)
class Window:
    start: int
    stop: int
    events: tuple[Event, ...]
    """Every event up to ``stop``, with the messages they delivered."""

    @property
    def parties(self) -> set[int]:
        return {e.party for e in self.events[self.start : self.stop]}


def calibrate(session: SecureSum, spec: VectorSpec, encoded: Mapping[int, np.ndarray], *, run_id: bytes,
              label: str, prepare: Callable[[], None] = lambda: None) -> Window:
    """Drive one run and find the window of events of stage ``label``."""
    if label not in ORDER:
        raise ValueError(f"label must be one of {ORDER}")
    later = set(ORDER[ORDER.index(label) + 1 :])
    prepare()
    run = Run(session, spec, encoded, run_id=run_id)
    events: list[Event] = []
    first = last = None
    upload_receipt = None
    while run.next_event is not None:
        event, changed = run.step()
        events.append(event)
        index = len(events) - 1
        if (upload_receipt is None and event.party == SERVER and event.kind == "receive"
                and event.stage == "upload"):
            upload_receipt = index
        if label in changed and (label != "upload" or event.party != SERVER) and (
                label != "aggregate" or event.party == SERVER):
            first = index if first is None else first
            last = index
            if label == "upload":
                break  # one client's upload
        elif first is not None and set(changed) & later:
            break
    if first is None or last is None:
        raise NotImplementedError(f"protocol {session.name!r} records no {label!r} stage")
    if label == "aggregate" and upload_receipt is not None and upload_receipt < first:
        first = upload_receipt
    return Window(first, last + 1, tuple(events[: last + 1]))


def bytes_of(transcript: Transcript, clients: Sequence[int]) -> tuple[int, int]:
    """(median bytes one client sends in the run, all bytes of the run)."""
    sent = {pid: 0 for pid in clients}
    for entry in transcript:
        if entry.sender in sent:
            sent[entry.sender] += entry.bytes
    per_client = int(statistics.median(sent.values())) if sent else 0
    return per_client, transcript.total_bytes()


# --- asv base classes (underscored: asv does not collect them, only their subclasses) -----------

class _Protocol:
    """What a protocol's benchmarks define: the registry name, extra parameters, sessions."""

    protocol: str = ""
    replay = "full"
    params: ClassVar[Any] = [CLIENTS, LENGTHS]
    param_names: ClassVar[list[str]] = ["clients", "length"]
    timeout = 1800.0
    rounds = 1
    repeat = (1, 5, 30.0)
    warmup_time = 0.0

    def setup_cache(self) -> Any:
        """Long-lived key material shared by every parameter combination (pickled by asv).

        Never None: asv drops a None cache from the arguments, which would shift them."""
        return {}

    # Hooks a protocol overrides ------------------------------------------------------------
    def unsupported(self, label: str, clients: int, length: int, *extra: Any) -> str | None:
        if clients * length > MAX_ENTRIES:
            return f"{clients} x {length} entries exceed the suite's memory budget"
        return None

    def session(self, cache: Any, clients: int, length: int, *extra: Any) -> SecureSum:
        raise NotImplementedError

    def spec(self, clients: int, length: int, *extra: Any) -> VectorSpec:
        """What the benchmark sums (the suite's model-update-like input unless a module says otherwise)."""
        return spec_for(clients, length)

    def prepare(self, session: SecureSum, spec: VectorSpec, timed: int | None, *extra: Any) -> None:
        """Called before every fresh run executes anything (e.g. Paillier pools); ``timed`` is
        the party acting in the timed window, when only one does."""


_CALIBRATIONS: dict[tuple[Any, ...], tuple[SecureSum, VectorSpec, dict[int, np.ndarray], Window | None]] = {}
"""One benchmark combination's session, spec, inputs and window (``None`` for whole rounds)."""
_RUN_ID = bytes(range(16))


def _calibrated(bench: _Protocol, label: str, cache: Any, clients: int, length: int,
                *extra: Any) -> tuple[SecureSum, VectorSpec, dict[int, np.ndarray], Window]:
    key = (type(bench).__module__, bench.protocol, label, clients, length, *extra)
    found = _CALIBRATIONS.get(key)
    if found is None:
        _CALIBRATIONS.clear()  # one combination per process; free the previous one
        session = bench.session(cache, clients, length, *extra)
        spec = bench.spec(clients, length, *extra)
        encoded = encoded_inputs(spec, clients)
        found = _CALIBRATIONS[key] = (session, spec, encoded, calibrate(
            session, spec, encoded, run_id=_RUN_ID, label=label,
            prepare=lambda: bench.prepare(session, spec, None, *extra)))
    window = found[3]
    assert window is not None
    return found[0], found[1], found[2], window


class _Stage(_Protocol):
    label = ""

    def setup(self, cache: Any, clients: int, length: int, *extra: Any) -> None:
        reason = self.unsupported(self.label, clients, length, *extra)
        if reason:
            skip(reason)
        started = time.perf_counter()
        session, spec, encoded, window = _calibrated(self, self.label, cache, clients, length, *extra)
        calibrated = time.perf_counter()
        self.window = window
        parties = window.parties
        party = next(iter(parties)) if self.replay == "party" and len(parties) == 1 else None
        self.prepare(session, spec, next(iter(parties)) if len(parties) == 1 else None, *extra)
        run = Run(session, spec, encoded, run_id=_RUN_ID)
        self._window: list[Event] | None
        if party is not None:
            for event in window.events[: window.start]:
                if event.party == party:
                    run.replay(event)
            self._window = [e for e in window.events[window.start : window.stop]]
        else:
            while run.count < window.start:
                run.step()
            expected = window.events[window.start].signature
            if run.next_event is None or run.next_event.signature != expected:
                raise RuntimeError(f"replay diverged: expected {expected}, got {run.next_event}")
            self._window = None
        self.run = run
        if time.perf_counter() - calibrated > SLOW_SETUP or calibrated - started > 10 * SLOW_SETUP:
            self.repeat = (1, 3, 10.0)  # asv re-runs setup before every sample: keep heavy ones few

    def _execute(self) -> None:
        if self._window is not None:
            for event in self._window:
                self.run.replay(event)
        else:
            for _ in range(self.window.stop - self.window.start):
                self.run.step()


class _ClientUpload(_Stage):
    """Time for one client to produce its upload (encode excluded: done by the session)."""

    label = "upload"

    def time_client_upload(self, *args: Any) -> None:
        self._execute()


class _ServerAggregate(_Stage):
    """Time for the server to take in every client's upload and combine them."""

    label = "aggregate"

    def time_server_aggregate(self, *args: Any) -> None:
        self._execute()


class _Finalize(_Stage):
    """Time to turn the aggregate into the decoded sum (decryption or unmasking)."""

    label = "finalize"

    def time_finalize(self, *args: Any) -> None:
        self._execute()


class _Round(_Protocol):
    """A whole secure sum through the session API, peak memory, and the bytes it moves."""

    def setup(self, cache: Any, clients: int, length: int, *extra: Any) -> None:
        reason = self.unsupported("round", clients, length, *extra)
        if reason:
            skip(reason)
        key = (type(self).__module__, self.protocol, "round", clients, length, *extra)
        found = _CALIBRATIONS.get(key)
        if found is None:
            _CALIBRATIONS.clear()
            session = self.session(cache, clients, length, *extra)
            spec = self.spec(clients, length, *extra)
            found = _CALIBRATIONS[key] = (session, spec, raw_inputs(clients, length, spec), None)
        self.session_, self.sum_spec, self.inputs, _ = found
        self.length = length
        self.extra = extra
        self._before_sum()

    def _before_sum(self) -> None:
        self.session_.transcript.entries.clear()
        self.prepare(self.session_, self.sum_spec, None, *self.extra)

    def time_round(self, *args: Any) -> None:
        self.session_.sum(self.inputs, spec=self.sum_spec, reveal=REVEAL, statistic="bench")

    def peakmem_round(self, *args: Any) -> None:
        self.session_.sum(self.inputs, spec=self.sum_spec, reveal=REVEAL, statistic="bench")

    def _bytes(self) -> tuple[int, int]:
        outcome = self.session_.sum(self.inputs, spec=self.sum_spec, reveal=REVEAL, statistic="bench")
        entries = self.session_.transcript.select(run_id=outcome.run_id)
        transcript = Transcript(list(entries))
        return bytes_of(transcript, self.session_.clients)

    def track_bytes_per_client(self, *args: Any) -> int:
        """Median bytes one client sends in one sum (all stages, serialised envelopes)."""
        return self._bytes()[0]

    track_bytes_per_client.unit = "bytes"  # type: ignore[attr-defined]

    def track_bytes_total(self, *args: Any) -> int:
        """Bytes of every message of one sum, both directions (key set-up excluded)."""
        return self._bytes()[1]

    track_bytes_total.unit = "bytes"  # type: ignore[attr-defined]

    def track_bytes_per_value(self, *args: Any) -> float:
        """:meth:`track_bytes_per_client` per entry of the summed vector."""
        return self._bytes()[0] / self.length

    track_bytes_per_value.unit = "bytes"  # type: ignore[attr-defined]

