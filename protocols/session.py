"""Long-lived protocol state, split by party, and a client's protocol endpoint.

Each protocol has two session classes (named by its :class:`~protocols.descriptors.ProtocolDescriptor`):

* a :class:`ServerSession` — what the server keeps between sums (a public key, a public CKKS
  context; never a client's secret unless the options ask for the weaker server-held-key
  mode) — which opens one :class:`~protocols.base.ServerParty` per run;
* a :class:`ClientSession` per client — that client's own keys — which joins a run as a
  :class:`~protocols.base.Party` when the server's ``open`` message arrives.

Every run begins with stage 0, ``open``: the server sends each client it will talk to a
:class:`SumRequest` (what is summed, under which encoding, who contributes, the protocol's
public parameters). A client validates it and joins with its own input or without one. A
client that cannot or will not take part answers stage 255, ``refuse``, with the reason; the
server records it and goes on as with a dropout.

:class:`ClientEndpoint` is one client's protocol side of the network: it routes each envelope
to the party of its run, asks its owner for the input when a run opens, reports results, and
turns any :class:`~protocols.errors.ProtocolError` into a ``refuse``. It holds nothing but
that client's sessions and live parties.
"""

from __future__ import annotations

import math
import re
from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Final, Literal

import numpy as np
import numpy.typing as npt

from .base import Outgoing, Party, Reveal, ServerParty
from .encoding import FloatArray, VectorSpec
from .errors import EncodingError, ProtocolError, ReplayError, StageError, WireError
from .identity import Authenticator, Directory, Identity
from .messages import read_contributors, write_contributors
from .network import Message, RunContext
from .transcript import Exposure
from .wire import OPEN, REFUSE, SERVER, SHARED_STAGES, Envelope, PartyId, Reader, Writer

__all__ = [
    "OPEN", "REFUSE", "SHARED_STAGES", "ClientEndpoint", "ClientSession", "Contribute", "RunResult",
    "ServerSession", "SumRequest", "read_refusal", "refusal",
]

MAX_PARAMS: Final = 1 << 16
MAX_REASON: Final = 512
_STATISTIC = re.compile(r"^[a-z][a-z0-9_+\-]{0,63}$")
_KINDS: Final = ("sum", "setup", "store", "argmin")
RunKind = Literal["sum", "setup", "store", "argmin"]


@dataclass(frozen=True, kw_only=True)
class SumRequest:
    """Stage ``open``: everything a client needs to join one run, set by the server.

    ``kind`` is ``sum`` (add the participants' vectors), ``setup`` (a key set-up run, no
    spec), or one of a protocol's own run kinds (Paillier's ``store``: the server keeps each
    participant's ciphertexts; ``argmin``: the key holder picks the best of encrypted
    candidates — :mod:`protocols.argmin`). ``participants`` are asked for an input; every other client that receives the
    request takes part without one (a key holder, a receiver of the result). ``params`` are
    the protocol's own public parameters (e.g. a masking run's degree and threshold).
    """

    kind: RunKind
    statistic: str
    round: int
    spec: VectorSpec | None
    reveal: Reveal
    participants: tuple[PartyId, ...]
    params: bytes = b""
    session: str = ""
    """Which of a client's sessions of this protocol the run belongs to, when it keeps several
    (e.g. Dubhe's own Paillier keys beside the run's): ``""`` is the default one."""

    def __post_init__(self) -> None:
        if self.kind not in _KINDS:
            raise ValueError(f"kind must be one of {', '.join(_KINDS)}, got {self.kind!r}")
        if not _STATISTIC.match(self.statistic):
            raise ValueError(f"statistic names are lower-case snake_case (<= 64 chars), got {self.statistic!r}")
        if (self.spec is None) != (self.kind == "setup"):
            raise ValueError("a set-up run has no spec and every other run needs one")
        if self.spec is not None and len(self.participants) > self.spec.summands:
            raise ValueError(f"{len(self.participants)} participants exceed the spec's {self.spec.summands} summands")
        if not self.participants or list(self.participants) != sorted(set(self.participants)):
            raise ValueError("participants must be a non-empty ascending list of distinct ids")
        if len(self.params) > MAX_PARAMS:
            raise ValueError("protocol parameters too large")
        if self.session and not _STATISTIC.match(self.session):
            raise ValueError(f"session tags are lower-case snake_case (<= 64 chars), got {self.session!r}")

    def to_bytes(self, *, clients: Sequence[PartyId]) -> bytes:
        writer = Writer().u8(_KINDS.index(self.kind)).i64(self.round).blob(self.statistic.encode())
        spec = self.spec
        if spec is None:
            writer.u8(0)
        else:
            writer.u8(1).u32(spec.length).f64(float(spec.bound)).u32(spec.summands)
            writer.u8(spec.kind == "float").u8(spec.signed).u8(spec.frac_bits)
        writer.u8(int(self.reveal.server) | int(self.reveal.clients) << 1)
        write_contributors(writer, self.participants, clients)
        return writer.blob(self.params).blob(self.session.encode()).finish()

    @classmethod
    def from_bytes(cls, data: bytes, *, clients: Sequence[PartyId]) -> SumRequest:
        reader = Reader(data)
        kind_code = reader.u8()
        if kind_code >= len(_KINDS):
            raise WireError(f"unknown run kind {kind_code}")
        round_ = reader.i64()
        try:
            statistic = reader.blob(max_len=64).decode("ascii")
        except UnicodeDecodeError:
            raise WireError("statistic name is not ASCII") from None
        spec: VectorSpec | None = None
        has_spec = reader.u8()
        if has_spec not in (0, 1):
            raise WireError("bad spec flag")
        if has_spec:
            length, bound, summands = reader.u32(), reader.f64(), reader.u32()
            kind, signed, frac_bits = reader.u8(), reader.u8(), reader.u8()
            if kind not in (0, 1) or signed not in (0, 1) or not math.isfinite(bound):
                raise WireError("bad spec fields")
            try:
                spec = VectorSpec(length=length, bound=bound, summands=summands, kind="float" if kind else "int",
                                  signed=bool(signed), frac_bits=frac_bits)
            except EncodingError as error:
                raise WireError(f"impossible spec: {error}") from error
        flags = reader.u8()
        if flags not in (1, 2, 3):
            raise WireError("bad reveal flags")
        participants = read_contributors(reader, clients, len(clients))
        params = reader.blob(max_len=MAX_PARAMS)
        try:
            session = reader.blob(max_len=64).decode("ascii")
        except UnicodeDecodeError:
            raise WireError("session tag is not ASCII") from None
        reader.end()
        try:
            return cls(kind=_KINDS[kind_code], statistic=statistic, round=round_, spec=spec,
                       reveal=Reveal(server=bool(flags & 1), clients=bool(flags & 2)),
                       participants=participants, params=params, session=session)
        except ValueError as error:
            raise WireError(f"impossible request: {error}") from error


def refusal(reason: str) -> bytes:
    return reason.encode("utf-8", "replace")[:MAX_REASON]


def read_refusal(payload: bytes) -> str:
    if len(payload) > MAX_REASON:
        raise WireError("refusal reason too long")
    return payload.decode("utf-8", "replace")


class ServerSession(ABC):
    """The server's long-lived state for one protocol; opens one server party per run."""

    name: ClassVar[str]

    def __init__(self, *, clients: Sequence[PartyId], options: Any = None) -> None:
        ids = list(clients)
        if not ids:
            raise ValueError("a secure sum needs at least one client")
        if len(set(ids)) != len(ids) or any(not 0 <= c < SERVER for c in ids):
            raise ValueError("client ids must be distinct integers in [0, 2**32 - 1)")
        self.clients: tuple[PartyId, ...] = tuple(sorted(ids))
        self.options = options
        self.tag = ""
        """The :attr:`SumRequest.session` of this session's runs (set-up runs included)."""
        self.directory: Directory | None = None
        """The registered signing keys of the clients (set-up, :mod:`protocols.identity`): settings
        that defend against an active server (masking's ``active_server``) check signatures with it."""

    @property
    def ready(self) -> bool:
        """Whether sums can be opened (keyed protocols need their set-up run first)."""
        return True

    def setup(self, *, run_id: bytes, round: int = -1, statistic: str = "setup") -> ServerParty | None:
        """The key set-up run, or ``None`` when the protocol has no keys or they are set up."""
        return None

    def check(self, *, spec: VectorSpec, reveal: Reveal) -> None:
        """Refuse (``ValueError``) a sum this protocol cannot run as declared."""

    @abstractmethod
    def open(self, *, run_id: bytes, request: SumRequest) -> ServerParty:
        """The server party of one sum; its ``start`` sends ``open`` to the clients it needs."""

    def tolerance(self, spec: VectorSpec, contributors: int) -> float:
        """Largest absolute error of one entry of a decoded sum; approximate protocols add their own."""
        return spec.sum_error_bound(contributors)


class ClientSession(ABC):
    """One client's long-lived state for one protocol (its own keys only)."""

    name: ClassVar[str]

    def __init__(self, party: PartyId, *, clients: Sequence[PartyId], options: Any = None) -> None:
        self.party_id = party
        self.clients: tuple[PartyId, ...] = tuple(sorted(clients))
        self.options = options
        self.identity: Identity | None = None
        """This client's registered signing key, when the deployment registered one."""
        self.directory: Directory | None = None
        """Every party's registered signing key (the same directory at every party)."""

    def register(self, identity: Identity, directory: Directory) -> None:
        """Give this client its signing key and the directory of everyone's (set-up)."""
        if directory.get(identity.party) != identity.public_bytes or identity.party != self.party_id:
            raise ValueError("the identity is not this client's registered one")
        self.identity, self.directory = identity, directory

    @abstractmethod
    def join(self, *, run_id: bytes, request: SumRequest, values: npt.NDArray[Any] | None) -> Party:
        """This client's party of a run; ``values`` is its input (encoded for encoded
        protocols), ``None`` when it takes part without one."""

    def to_bytes(self) -> bytes:
        """This client's session state (its own secrets included): stays on its machine."""
        return b""

    def load_bytes(self, data: bytes) -> None:
        """Restore :meth:`to_bytes`."""
        if data:
            raise WireError(f"protocol {self.name!r} keeps no client state")


@dataclass(frozen=True)
class RunResult:
    """What one client learned from one run."""

    protocol: str
    run_id: bytes
    request: SumRequest
    total: FloatArray
    contributors: tuple[PartyId, ...]


Contribute = Callable[[str, SumRequest], "npt.NDArray[Any] | None"]
"""Asked when a run that takes inputs (``sum``, ``store``) opens at a participant: this client's input (``None``: it joins without one). Raising a
:class:`~protocols.errors.ProtocolError` refuses the run with that reason."""


class ClientEndpoint:
    """One client's protocol side of the network: its sessions, its live parties, nothing else.

    :meth:`handle` takes the bytes of one protocol envelope addressed to this client and
    returns the replies. ``sessions`` maps a protocol name, or ``(protocol, tag)`` for a
    session other than the default one (:attr:`SumRequest.session`), to the client session. ``contribute`` is asked for the input of each sum that opens;
    ``on_result`` hears every result this client learns; ``on_party`` (optional) sees each
    party it creates (the embedded harness reads their timings).
    """

    MAX_LIVE = 32
    """Parties kept at once; the oldest run is forgotten beyond that (its late messages are refused)."""

    def __init__(
        self,
        party: PartyId,
        *,
        sessions: Mapping[str | tuple[str, str], ClientSession],
        contribute: Contribute,
        on_result: Callable[[RunResult], None] | None = None,
        on_party: Callable[[bytes, Party], None] | None = None,
        authenticator: Authenticator | None = None,
    ) -> None:
        if authenticator is not None and authenticator.identity.party != party:
            raise ValueError("the authenticator signs for another party")
        self.authenticator = authenticator
        """Optional envelope authentication: every message this client sends is signed, and every
        message it receives must carry the server's registered signature (else one
        :class:`~protocols.errors.AuthenticationError`, answered with a refusal)."""
        self.party_id = party
        self.sessions: dict[tuple[str, str], ClientSession] = {
            (key, "") if isinstance(key, str) else key: session for key, session in sessions.items()
        }
        self._protocols = {protocol for protocol, _ in self.sessions}
        self.contribute = contribute
        self.on_result = on_result
        self.on_party = on_party
        self._live: OrderedDict[bytes, tuple[Party, SumRequest, RunContext]] = OrderedDict()
        self._seen: set[bytes] = set()
        self.errors: list[str] = []
        """Messages that could not even be answered (not an envelope, no such protocol)."""

    def handle(self, data: bytes) -> list[Message]:
        try:
            env = Envelope.from_bytes(data)
        except WireError as error:
            self.errors.append(f"WireError: {error}")
            return []
        if env.protocol not in self._protocols or env.receiver != self.party_id:
            self.errors.append(f"StageError: message for {env.protocol!r} to party {env.receiver}")
            return []
        from .descriptors import descriptor

        live = self._live.get(env.run_id)
        context = (live[2] if live is not None
                   else RunContext(env.protocol, env.run_id, 0, "unknown", descriptor(env.protocol).stages))
        try:
            if self.authenticator is not None:
                self.authenticator.check(env)
            elif env.signature:
                raise WireError("a signed message to a client that authenticates nothing")
            if env.sender != SERVER:
                raise StageError("clients accept messages from the server only")
            if env.stage == OPEN:
                request = SumRequest.from_bytes(env.payload, clients=self._clients(env.protocol))
                context = RunContext(env.protocol, env.run_id, request.round, request.statistic,
                                     descriptor(env.protocol).stages)
                return self._open(env, request, context)
            if live is None:
                raise StageError("no live run with this id here")
            party, request, context = live
            out = party.receive(env)
            self._finish(env.run_id, party, request, context)
            return self._messages(out, context)
        except ProtocolError as error:
            reason = refusal(f"{type(error).__name__}: {error}")
            out_env = self._seal(Envelope(env.protocol, REFUSE, env.run_id, self.party_id, SERVER, reason))
            return [Message(out_env.to_bytes(), context.label(REFUSE, Exposure.public()))]

    def _seal(self, env: Envelope) -> Envelope:
        return env if self.authenticator is None else self.authenticator.seal(env)

    def _clients(self, protocol: str) -> tuple[PartyId, ...]:
        return next(s.clients for (p, _), s in self.sessions.items() if p == protocol)

    def _open(self, env: Envelope, request: SumRequest, context: RunContext) -> list[Message]:
        if env.run_id in self._seen:
            raise ReplayError("this run was opened here before")
        session = self.sessions.get((env.protocol, request.session))
        if session is None:
            raise StageError(f"no {env.protocol!r} session {request.session!r} at this client")
        values = None
        if request.kind in ("sum", "store") and self.party_id in request.participants:
            values = self.contribute(env.protocol, request)
        party = session.join(run_id=env.run_id, request=request, values=values)
        self._seen.add(env.run_id)
        self._live[env.run_id] = (party, request, context)
        while len(self._live) > self.MAX_LIVE:
            self._live.popitem(last=False)
        if self.on_party is not None:
            self.on_party(env.run_id, party)
        out = party.start()
        self._finish(env.run_id, party, request, context)
        return self._messages(out, context)

    def _finish(self, run_id: bytes, party: Party, request: SumRequest, context: RunContext) -> None:
        if run_id not in self._live or (party.result is None and not party.done):
            return
        del self._live[run_id]
        if party.result is not None and self.on_result is not None:
            self.on_result(RunResult(protocol=context.protocol, run_id=run_id, request=request,
                                     total=party.result, contributors=party.contributors))

    def _messages(self, outgoing: Sequence[Outgoing], context: RunContext) -> list[Message]:
        out = []
        for item in outgoing:
            env = item.envelope
            if env.sender != self.party_id or env.receiver != SERVER:
                raise StageError("a client party tried to send in another party's name or to a client")
            out.append(Message(self._seal(env).to_bytes(), context.label(env.stage, item.exposure)))
        return out

    def forget(self) -> None:
        """Drop every live run (the node restarted, or the round was aborted)."""
        self._live.clear()


def as_encoded(values: npt.NDArray[Any] | None, spec: VectorSpec) -> npt.NDArray[np.uint64] | None:
    """A join's input as encoded entries of ``spec`` (refused when it could not come from ``encode``)."""
    if values is None:
        return None
    from .encoding import check_encoded

    if values.dtype != np.uint64:
        raise EncodingError(f"expected encoded entries (uint64), got {values.dtype}")
    check_encoded(spec, values)
    return values
