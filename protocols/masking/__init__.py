"""Secure aggregation by pairwise masking: SecAgg (Bonawitz et al., CCS 2017) and
SecAgg+ (Bell et al., CCS 2020).

Each client ``u`` uploads ``y_u = x_u + PRG(b_u) + sum_{v > u} PRG(s_uv) - sum_{v < u} PRG(s_uv)``
modulo ``2**b`` (``b = spec.slot_bits``, so a sum of admissible inputs never wraps). The
pairwise masks cancel in the sum; the self mask ``PRG(b_u)`` and the pairwise masks with
clients lost before upload are removed by the server from Shamir shares that the
surviving clients reveal. Every run is fresh: fresh keys, fresh seeds, nothing kept
between runs on either side.

Stages (one message per party per stage; a :class:`~protocols.network.DropoutPlan` names them):

``open`` (shared by every protocol)
    server -> participants: the :class:`~protocols.session.SumRequest`, whose ``params`` are
    the run's :class:`GroupParameters`. Each client computes them itself from the public
    options and the participants and refuses (:class:`~protocols.errors.PolicyError`) a
    request that differs, or that says the server will not learn the sum.
``advertise_keys``
    client -> server: two fresh X25519 public keys, ``c`` (to seal shares for a peer)
    and ``s`` (to agree pairwise mask seeds). The server refuses malformed or repeated keys.
``share_keys``
    server -> client: the keys of the client's neighbours (everyone who advertised, for
    ``masking``; ``degree`` of them on a random Harary graph for ``secagg+``).
    client -> server: for each neighbour, Shamir shares of the self-mask seed ``b_u``
    and of the mask key ``s_u``, sealed (ChaCha20-Poly1305, AD = run, protocol, owner,
    holder) for that neighbour. The client keeps its own share of each.
``upload``
    server -> client: the sealed shares addressed to it, from the neighbours that
    shared (``U2``). client -> server: the masked input, masked with exactly those
    neighbours. Timed as the client's ``upload``.
``consistency`` (only with ``MaskingOptions(active_server=True)``)
    server -> survivor: the survivor set ``U3``. client -> server: its Ed25519 signature (key
    registered at set-up, :mod:`protocols.identity`) over the run, the advertised set and
    ``U3`` — Bonawitz et al.'s consistency round. In that setting adverts are signed too,
    the graph is derived from the run id and the advertised set (each client checks its
    neighbours), the unmasking request carries ``t`` signatures of the client's
    neighbourhood on the statement it signed, and ``2t`` exceeds the holders plus the
    corrupt ones allowed for.
``unmasking``
    server -> client: whose self-mask share (neighbours that uploaded, ``U3``, and the
    client itself) and whose key share (neighbours lost after sharing) to reveal.
    A client refuses (:class:`~protocols.errors.PolicyError`) a request naming one party
    in both lists, naming itself as lost, or naming fewer than ``t`` survivors.
    client -> server: the requested shares.
``result``
    server -> survivors: the released sum, when the clients are to learn it.

What the server sees: public keys, sealed shares it cannot open, masked inputs
(uniform modulo ``2**b`` on their own), self-mask seeds of survivors and mask keys of
the lost — never both for one client — and the sum.

Threshold ``t`` (shares needed to recover a secret, counted among the ``degree + 1``
holders — the neighbours and the owner): default ``ceil(2m/3)`` for ``masking`` with
``m`` participating clients; for ``secagg+`` the degree and threshold follow Bell et
al.'s bounds (see :func:`sparse_graph_parameters` and docs/protocols/masking.md). The
sum is exact when at least ``t`` holders of every needed secret survive each stage;
otherwise the run aborts with :class:`~protocols.errors.ThresholdError`, never a wrong sum.

By default, messages between the server and a client carry no authentication of their own
beyond the sealed shares (revealed shares are checked against their polynomial and the
owner's commitment): like every protocol here, masking then relies on the network (TLS in a
deployment) for the integrity of what crosses it; with envelope authentication
(:class:`protocols.identity.Authenticator`, ``make_sum(..., authenticate=True)``) every
message is signed by its sender. A malformed message gets one typed
:class:`~protocols.errors.ProtocolError` at its receiver and changes nothing there. A client
whose sealed shares fail to open at a neighbour, or whose upload is malformed, is dropped
with the reason (``ServerParty.excluded``); the round goes on while ``t`` survive.

Modules: :mod:`.parameters` (options, degree and threshold, Bell et al.'s bounds, the
Harary graph), :mod:`.keys` (keys and seeds), :mod:`.messages` (stages and payloads),
:mod:`.client` and :mod:`.server` (the state machines), :mod:`.sessions`.
"""

from __future__ import annotations

from .client import MaskingClient
from .keys import SEALED_SHARE_BYTES, SHARE_PLAINTEXT_BYTES, pair_seed, self_seed
from .messages import (
    KeyAdvert,
    NeighbourKeys,
    SealedShares,
    Stage,
    UnmaskRequest,
    UnmaskResponse,
    masked_from_bytes,
    masked_to_bytes,
    upload_from_bytes,
    upload_to_bytes,
)
from .parameters import (
    GroupParameters,
    MaskingOptions,
    complete_parameters,
    graph_seed,
    group_parameters,
    harary_graph,
    harary_neighbours,
    sparse_graph_parameters,
    sparse_parameters,
    word_dtype,
)
from .server import MaskingServer
from .sessions import (
    MASKING,
    SECAGG_PLUS,
    CompleteClientSession,
    CompleteServerSession,
    MaskingClientSession,
    MaskingServerSession,
    SparseClientSession,
    SparseServerSession,
)

__all__ = [
    "MASKING", "SEALED_SHARE_BYTES", "SECAGG_PLUS", "SHARE_PLAINTEXT_BYTES", "CompleteClientSession",
    "CompleteServerSession", "GroupParameters", "KeyAdvert", "MaskingClient", "MaskingClientSession",
    "MaskingOptions", "MaskingServer", "MaskingServerSession", "NeighbourKeys", "SealedShares",
    "SparseClientSession", "SparseServerSession", "Stage", "UnmaskRequest", "UnmaskResponse",
    "complete_parameters", "graph_seed", "group_parameters", "harary_graph", "harary_neighbours",
    "masked_from_bytes", "masked_to_bytes", "pair_seed", "self_seed", "sparse_graph_parameters", "sparse_parameters", "upload_from_bytes",
    "upload_to_bytes", "word_dtype",
]
