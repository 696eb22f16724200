"""The masking protocols' sessions: SecAgg on the complete graph and SecAgg+ on a sparse one.

Neither side keeps anything between runs: every run draws fresh keys and seeds, so a session
holds only the public options. The server's session opens one :class:`MaskingServer` per
run; a client's session joins a run as a :class:`MaskingClient` when its ``open`` arrives,
after checking the request against what it computes itself.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, ClassVar, Final

import numpy.typing as npt

from ..base import Party, Reveal, ServerParty
from ..encoding import VectorSpec
from ..errors import PolicyError, StageError, ThresholdError, WireError
from ..session import ClientSession, ServerSession, SumRequest, as_encoded
from ..wire import PartyId
from .client import MaskingClient
from .parameters import GroupParameters, MaskingOptions, group_parameters, word_dtype
from .server import MaskingServer

__all__ = [
    "MASKING", "SECAGG_PLUS", "CompleteClientSession", "CompleteServerSession", "SparseClientSession",
    "SparseServerSession",
]

MASKING: Final = "masking"
SECAGG_PLUS: Final = "secagg+"


def _options(options: Any, *, sparse: bool) -> MaskingOptions:
    """The session's options (defaults for ``None``); ``degree`` only makes sense on a sparse graph."""
    if options is None:
        return MaskingOptions()
    if not isinstance(options, MaskingOptions):
        raise TypeError(f"masking takes MaskingOptions, got {type(options).__name__}")
    if options.degree is not None and not sparse:
        raise ValueError("degree applies to 'secagg+' only; 'masking' uses the complete graph")
    return options


class MaskingServerSession(ServerSession):
    """What the server keeps for masking: the public options, nothing secret."""

    sparse: ClassVar[bool]

    def __init__(self, *, clients: Sequence[PartyId], options: Any = None) -> None:
        super().__init__(clients=clients, options=options)
        self.options: MaskingOptions = _options(options, sparse=self.sparse)

    def parameters(self, participants: int) -> GroupParameters:
        """Degree and threshold of a run with ``participants`` clients holding inputs."""
        return group_parameters(participants, self.options, sparse=self.sparse)

    def check(self, *, spec: VectorSpec, reveal: Reveal) -> None:
        if not reveal.server:
            raise ValueError(f"{self.name!r} unmasks the sum at the server; use 'paillier' with "
                             "keyholder='all' or 'ckks' for a sum the server must not learn")

    def params(self, request: SumRequest) -> bytes:
        return self.parameters(len(request.participants)).to_bytes()

    def open(self, *, run_id: bytes, request: SumRequest) -> ServerParty:
        if request.kind != "sum" or request.spec is None:
            raise ValueError(f"{self.name!r} runs sums only, not {request.kind!r}")
        self.check(spec=request.spec, reveal=request.reveal)
        params = self.parameters(len(request.participants))
        if not request.params:
            request = dataclasses.replace(request, params=params.to_bytes())
        elif request.params != params.to_bytes():
            raise ValueError("the request's parameters are not this session's")
        return MaskingServer(protocol=self.name, run_id=run_id, request=request, params=params,
                             clients=self.clients, directory=self.directory)


class MaskingClientSession(ClientSession):
    """A masking client keeps nothing between runs; it checks each request before joining."""

    sparse: ClassVar[bool]

    def __init__(self, party: PartyId, *, clients: Sequence[PartyId], options: Any = None) -> None:
        super().__init__(party, clients=clients, options=options)
        self.options: MaskingOptions = _options(options, sparse=self.sparse)

    def parameters(self, participants: int) -> GroupParameters:
        """The run's shape, computed here from the public options: never the server's word."""
        try:
            return group_parameters(participants, self.options, sparse=self.sparse)
        except ThresholdError:
            raise
        except ValueError as error:
            raise PolicyError(f"no admissible parameters for {participants} participants: {error}") from None

    def join(self, *, run_id: bytes, request: SumRequest, values: npt.NDArray[Any] | None) -> Party:
        if request.kind != "sum" or request.spec is None:
            raise WireError(f"{self.name!r} has no {request.kind!r} runs")
        if self.party_id not in request.participants:
            raise StageError("a masking run opens only at the clients that hold an input")
        if not request.reveal.server:
            raise PolicyError("a masking run always reveals the sum to the server; the request says it must not")
        params = self.parameters(len(request.participants))
        if request.params != params.to_bytes():
            raise PolicyError("the server's run parameters differ from this client's: refusing to share")
        encoded = as_encoded(values, request.spec)
        if encoded is None:
            raise StageError("this client was asked for an input it does not have")
        words = encoded.astype(word_dtype(request.spec.slot_bits))  # a copy: masking overwrites it
        return MaskingClient(self.party_id, protocol=self.name, run_id=run_id, spec=request.spec,
                             reveal=request.reveal, words=words, params=params,
                             participants=request.participants, clients=self.clients, identity=self.identity,
                             directory=self.directory)


class CompleteServerSession(MaskingServerSession):
    """SecAgg (Bonawitz et al. 2017) on the complete graph: every client masks with every other.

    Client cost grows with ``n`` (``n + 1`` masks of the vector, ``O(n^2)`` share work);
    tolerates any dropouts that leave ``t`` survivors per stage.
    """

    name = MASKING
    sparse = False


class CompleteClientSession(MaskingClientSession):
    name = MASKING
    sparse = False


class SparseServerSession(MaskingServerSession):
    """SecAgg+ (Bell et al. 2020): each client masks with, and shares its secrets among,
    ``k = O(log n)`` neighbours on a random Harary graph the server samples per run.

    Client cost grows with ``k`` instead of ``n``; security and dropout tolerance hold
    with overwhelming probability under the rates in :class:`MaskingOptions`.
    """

    name = SECAGG_PLUS
    sparse = True


class SparseClientSession(MaskingClientSession):
    name = SECAGG_PLUS
    sparse = True

