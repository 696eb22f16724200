"""Every party of a protocol in one process, talking only through a :class:`LocalNetwork`.

:class:`SecureSum` is the embedded way to run sums — the ``secure-fl sum`` command, the
benchmarks, Dubhe's selection study and the tests use it. It builds the protocol's
:class:`~protocols.session.ServerSession` and one :class:`~protocols.session.ClientSession`
and :class:`~protocols.session.ClientEndpoint` per client, attaches the endpoints to the
network, and drives each run from the server's side. Parties share nothing but bytes on the
network; the harness reads their results afterwards only to report (and cross-check) what each
learned, as the CLI and tests need.
"""

from __future__ import annotations

import secrets
import statistics
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np
import numpy.typing as npt

from .base import Party, Reveal, SumOutcome, Timings
from .descriptors import ProtocolDescriptor, descriptor
from .encoding import VectorSpec, encode
from .errors import AbortedError
from .identity import Authenticator, Directory, Identity, make_identities
from .network import DropoutPlan, LocalNetwork, Message, RunContext, drive
from .session import ClientEndpoint, ClientSession, ServerSession, SumRequest
from .transcript import Transcript
from .wire import SERVER, PartyId

__all__ = ["SecureSum", "make_sum"]


class SecureSum:
    """A protocol's server and clients in one process (see the module docstring).

    ``options`` is the protocol's frozen options object (or ``None``); :func:`make_sum` builds
    it from keywords.
    """

    def __init__(self, name: str, *, clients: Sequence[PartyId], network: LocalNetwork | None = None,
                 options: Any = None, identities: bool | None = None, authenticate: bool = False) -> None:
        self.descriptor: ProtocolDescriptor = descriptor(name)
        self.name = name
        self.server: ServerSession = self.descriptor.server_session(clients=clients, options=options)
        self.clients = self.server.clients
        self.options = options
        self.network = network if network is not None else LocalNetwork()
        self.sessions: dict[PartyId, ClientSession] = {
            pid: self.descriptor.client_session(pid, clients=self.clients, options=options) for pid in self.clients
        }
        if identities is None:  # settings against an active server need registered keys
            identities = authenticate or bool(getattr(options, "active_server", False))
        if authenticate and not identities:
            raise ValueError("authenticating senders needs registered identities")
        self.identities: dict[PartyId, Identity] = {}
        self.directory: Directory | None = None
        self.authenticator: Authenticator | None = None
        """The server's envelope authentication (``authenticate=True``): it signs what it sends
        and checks every reply against the directory; each client endpoint does the same."""
        if identities:
            self.identities, self.directory = make_identities(self.clients)
            self.server.directory = self.directory
            for pid, session in self.sessions.items():
                session.register(self.identities[pid], self.directory)
            if authenticate:
                self.authenticator = Authenticator(self.identities[SERVER], self.directory)
        self._inputs: dict[PartyId, npt.NDArray[Any]] = {}
        self._parties: dict[PartyId, Party] = {}
        self.endpoints: dict[PartyId, ClientEndpoint] = {}
        for pid in self.clients:
            endpoint = ClientEndpoint(
                pid, sessions={name: self.sessions[pid]}, contribute=self._input_of(pid), on_party=self._watch(pid),
                authenticator=None if self.authenticator is None else Authenticator(self.identities[pid],
                                                                                    self.authenticator.directory))
            self.endpoints[pid] = endpoint
            self.network.attach(pid, self._handler(endpoint))

    # --- the clients' side, as the harness plays it -------------------------------------------

    def _input_of(self, pid: PartyId) -> Any:
        def contribute(protocol: str, request: SumRequest) -> npt.NDArray[Any] | None:
            return self._inputs.get(pid)
        return contribute

    @contextmanager
    def inputs(self, values: Mapping[PartyId, npt.NDArray[Any]]) -> Iterator[None]:
        """While inside, each client answers a run's request for its input with ``values[client]``
        (as its owner would); the parties of those runs are collected anew (:meth:`parties`)."""
        self._inputs, self._parties = dict(values), {}
        try:
            yield
        finally:
            self._inputs = {}

    def _watch(self, pid: PartyId) -> Any:
        def seen(run_id: bytes, party: Party) -> None:
            self._parties[pid] = party
        return seen

    @staticmethod
    def _handler(endpoint: ClientEndpoint) -> Any:
        def handle(data: Sequence[bytes]) -> list[Message]:
            return [reply for item in data for reply in endpoint.handle(item)]
        return handle

    # --- the server's side --------------------------------------------------------------------

    @property
    def transcript(self) -> Transcript:
        return self.network.transcript

    @property
    def ready(self) -> bool:
        return self.server.ready

    def setup(self, *, round: int = -1, statistic: str = "setup") -> None:
        """Run the protocol's key set-up (a run of messages between the parties), if it has one."""
        run_id = secrets.token_bytes(16)
        party = self.server.setup(run_id=run_id, round=round, statistic=statistic)
        if party is None:
            return
        context = RunContext(self.name, run_id, round, statistic, self.descriptor.stages)
        drive(party, self.network, context, authenticator=self.authenticator)
        if not party.finished:
            raise AbortedError("the key set-up did not finish")

    def tolerance(self, spec: VectorSpec, contributors: int) -> float:
        return self.server.tolerance(spec, contributors)

    def client_session(self, party: PartyId) -> ClientSession:
        return self.sessions[party]

    def sum(
        self,
        inputs: Mapping[PartyId, npt.ArrayLike],
        *,
        spec: VectorSpec,
        statistic: str = "sum",
        round: int = 0,
        reveal: Reveal | None = None,
        dropouts: DropoutPlan | None = None,
        clip: bool = False,
    ) -> SumOutcome:
        """Securely add the clients' vectors; the result is what the declared recipients learned
        (``reveal`` defaults to the server and the clients)."""
        reveal = reveal if reveal is not None else Reveal()
        unknown = set(inputs) - set(self.clients)
        if unknown:
            raise ValueError(f"inputs from parties outside this protocol: {sorted(unknown)}")
        if not inputs:
            raise ValueError("no client holds an input")
        if len(inputs) > spec.summands:
            raise ValueError(f"{len(inputs)} inputs exceed the spec's {spec.summands} summands")
        self.server.check(spec=spec, reveal=reveal)
        if not self.server.ready:
            self.setup(round=round)
        clipped = 0
        values: dict[PartyId, npt.NDArray[Any]] = {}
        for pid, vector in inputs.items():
            if self.descriptor.encoded:
                encoded = encode(spec, np.asarray(vector).reshape(-1), clip=clip)
                values[pid], clipped = encoded.values, clipped + encoded.clipped
            else:
                values[pid] = np.asarray(vector, dtype=np.float64).reshape(-1)
        run_id = secrets.token_bytes(16)
        request = SumRequest(kind="sum", statistic=statistic, round=round, spec=spec, reveal=reveal,
                             participants=tuple(sorted(values)))
        server = self.server.open(run_id=run_id, request=request)
        context = RunContext(self.name, run_id, round, statistic, self.descriptor.stages)
        self.network.plan(self.name, dropouts, self.descriptor.stages)
        try:
            with self.inputs(values):
                rejected = drive(server, self.network, context, authenticator=self.authenticator)
        finally:
            self.network.plan(self.name, None, self.descriptor.stages)
        clients = dict(self._parties)
        holders = {pid: p.result for pid, p in {SERVER: server, **clients}.items() if p.result is not None}
        if not holders:
            raise AbortedError("the run finished but no party learned the sum")
        results = list(holders.values())
        if any(not np.array_equal(results[0], r) for r in results[1:]):
            raise AbortedError("parties learned different sums")
        uploads = [p.timings["upload"] for p in clients.values() if "upload" in p.timings]
        finalize = max((p.timings.get("finalize", 0.0) for p in (server, *clients.values())), default=0.0)
        contributors = server.contributors
        dropped = tuple(sorted(set(values) - set(contributors)))
        excluded = {pid: server.excluded.get(pid) or server.rejected_from.get(pid) or "no answer (dropped out)"
                    for pid in dropped}
        flagged = {pid: "; ".join(r for r in (server.rejected_from.get(pid), server.flagged.get(pid)) if r)
                   for pid in contributors if pid in server.flagged or pid in server.rejected_from}
        return SumOutcome(
            total=results[0], contributors=contributors,
            dropped=dropped, learned_by=frozenset(holders),
            clipped=clipped, run_id=run_id.hex(),
            timings=Timings(client_upload_median=statistics.median(uploads) if uploads else 0.0,
                            aggregate=server.timings.get("aggregate", 0.0), finalize=finalize),
            rejected=tuple(rejected) + tuple(server.rejections), excluded=excluded, flagged=flagged,
        )

    def parties(self) -> dict[PartyId, Party]:
        """Each client's latest party since the last :meth:`inputs` (the harness's view, for
        reports and tests)."""
        return dict(self._parties)


def make_sum(name: str, *, clients: Sequence[PartyId], network: LocalNetwork | None = None,
             identities: bool | None = None, authenticate: bool = False, **options: Any) -> SecureSum:
    """An embedded protocol session; keyword ``options`` fill that protocol's frozen options.
    ``identities`` registers a signing key per party (on by default where the options need them);
    ``authenticate`` signs and checks every envelope with them (:mod:`protocols.identity`)."""
    d = descriptor(name)
    return SecureSum(name, clients=clients, network=network, options=d.options(**options), identities=identities,
                     authenticate=authenticate)
