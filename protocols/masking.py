"""Secure aggregation by pairwise masking: SecAgg (Bonawitz et al., CCS 2017) and
SecAgg+ (Bell et al., CCS 2020).

Each client ``u`` uploads ``y_u = x_u + PRG(b_u) + sum_{v > u} PRG(s_uv) - sum_{v < u} PRG(s_uv)``
modulo ``2**b`` (``b = spec.slot_bits``, so a sum of admissible inputs never wraps). The
pairwise masks cancel in the sum; the self mask ``PRG(b_u)`` and the pairwise masks with
clients lost before upload are removed by the server from Shamir shares that the
surviving clients reveal. Every :meth:`~protocols.base.SecureSum.sum` is a fresh run with
fresh keys.

Stages (one message per party per stage; a :class:`~protocols.base.DropoutPlan` names them):

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
(4 is reserved for Bonawitz's consistency check: it only defends against an actively
malicious server and needs a PKI for signatures; the server here is honest-but-curious.)
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
"""

from __future__ import annotations

import math
import secrets
import struct
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import IntEnum
from functools import lru_cache
from itertools import pairwise
from typing import Any, ClassVar, Final

import numpy as np
import numpy.typing as npt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey

from .base import Outgoing, Party, Reveal, SecureSum, ServerParty, StageGate, Transport, stage_names
from .encoding import VectorSpec, decode_sum
from .errors import (
    AbortedError,
    AuthenticationError,
    EncodingError,
    PolicyError,
    StageError,
    ThresholdError,
    WireError,
)
from .messages import ReleasedSum
from .primitives import shamir
from .primitives.channel import NONCE_BYTES, PUBLIC_KEY_BYTES, ChannelKey, hkdf, open_sealed, seal
from .primitives.prg import SEED_BYTES, MaskExpander, Words
from .transcript import Exposure
from .wire import PROTOCOL_CODES, SERVER, Envelope, PartyId, Reader, Writer

MASKING: Final = "masking"
SECAGG_PLUS: Final = "secagg+"

SHARE_PLAINTEXT_BYTES: Final = 2 * shamir.SHARE_BYTES
SEALED_SHARE_BYTES: Final = NONCE_BYTES + SHARE_PLAINTEXT_BYTES + 16
_SHARE_PURPOSE: Final = b"masking-shares"


class Stage(IntEnum):
    ADVERTISE_KEYS = 1
    SHARE_KEYS = 2
    UPLOAD = 3
    # 4: Bonawitz's consistency check, reserved (see the module docstring).
    UNMASKING = 5
    RESULT = 6


# --- options and parameters ---------------------------------------------------------------------

@dataclass(frozen=True, kw_only=True)
class MaskingOptions:
    """How many clients must survive, and (SecAgg+) how many neighbours each client masks with.

    ``threshold``
        Shares needed to recover one client's secret, among its ``degree + 1`` holders
        (its neighbours and itself). An ``int`` is absolute; a ``float`` in (0, 1] is a
        fraction of the holders, rounded up. ``None``: ``ceil(2m/3)`` holders for
        ``masking`` (``m`` participants), and for ``secagg+`` ``ceil(2(k+1)/3)`` clamped
        into the range Bell et al.'s bounds allow. Higher ``t`` means more colluding
        clients are needed to unmask anyone (and a lying server must fool more clients);
        lower ``t`` survives more dropouts. Never below 2 when a client has neighbours.
    ``degree`` (``secagg+`` only)
        Neighbours per client, rounded up to even (a Harary graph has ``k/2`` on each
        side of a random ring). ``None``: the smallest even ``k`` meeting Bell et al.'s
        security and correctness bounds for ``dropout_rate`` and ``corruption_rate``;
        the complete graph when none does. Client cost grows linearly with ``k``.
    ``dropout_rate``, ``corruption_rate`` (``secagg+`` with ``degree=None``)
        The assumed fractions of clients lost during a round and colluding with the
        server; they size ``k`` and ``t``. Must add up to at most 0.9.
    ``security_bits``, ``correctness_bits``
        ``sigma`` and ``eta`` of the bounds: the graph leaks a partial sum with
        probability below ``2**-sigma``, and a round fails for lack of shares with
        probability below ``2**-eta`` when the rates hold.
    """

    threshold: int | float | None = None
    degree: int | None = None
    dropout_rate: float = 0.1
    corruption_rate: float = 0.05
    security_bits: int = 40
    correctness_bits: int = 20

    def __post_init__(self) -> None:
        t = self.threshold
        if t is not None:
            if isinstance(t, bool) or not isinstance(t, (int, float)):
                raise ValueError(f"threshold must be an int, a float fraction or None, got {t!r}")
            if isinstance(t, int) and t < 1:
                raise ValueError(f"an absolute threshold must be >= 1, got {t}")
            if isinstance(t, float) and not 0.0 < t <= 1.0:
                raise ValueError(f"a fractional threshold must lie in (0, 1], got {t}")
        if self.degree is not None:
            if isinstance(self.degree, bool) or not isinstance(self.degree, int) or self.degree < 2:
                raise ValueError(f"degree must be an integer >= 2, got {self.degree!r}")
            holders = self.degree + (self.degree & 1) + 1  # the degree rounds up to even
            if isinstance(t, int) and t > holders:
                raise ValueError(f"threshold {t} exceeds the {holders} holders of each secret")
        for name in ("dropout_rate", "corruption_rate"):
            rate = getattr(self, name)
            if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not 0.0 <= rate < 1.0:
                raise ValueError(f"{name} must lie in [0, 1), got {rate!r}")
        if self.dropout_rate + self.corruption_rate > 0.9:
            raise ValueError("dropout_rate + corruption_rate must be at most 0.9")
        for name in ("security_bits", "correctness_bits"):
            bits = getattr(self, name)
            if isinstance(bits, bool) or not isinstance(bits, int) or not 1 <= bits <= 256:
                raise ValueError(f"{name} must be an integer in [1, 256], got {bits!r}")


@dataclass(frozen=True)
class GroupParameters:
    """The shape of one run: ``participants`` clients, each masking with ``degree`` neighbours;
    each secret is shared among ``degree + 1`` holders, any ``threshold`` of which recover it."""

    participants: int
    degree: int
    threshold: int

    @property
    def complete(self) -> bool:
        return self.degree >= self.participants - 1


def _lchoose(n: int, k: int) -> float:
    if k < 0 or k > n:
        return -math.inf
    return math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)


def _hypergeometric(population: int, successes: int, draws: int) -> list[float]:
    """P[X = x] for x = 0..draws, X the successes among ``draws`` taken without replacement."""
    total = _lchoose(population, draws)
    return [math.exp(_lchoose(successes, x) + _lchoose(population - successes, draws - x) - total)
            for x in range(draws + 1)]


@lru_cache(maxsize=128)
def sparse_graph_parameters(
    n: int, *, dropout_rate: float, corruption_rate: float, security_bits: int = 40, correctness_bits: int = 20,
) -> tuple[int, int, int] | None:
    """Smallest even degree ``k`` and the admissible thresholds ``[t_low, t_high]`` for SecAgg+.

    Bell et al. (CCS 2020, sec. 3-4) with a random Harary graph, as made concrete in
    federated-compute's ``graph_parameter_finder``: with ``A = floor(gamma n)`` corrupt
    and ``D = floor(delta n)`` lost clients,

    1. the honest survivors stay connected except with probability below
       ``2**-(sigma+1)``: disconnecting a Harary graph needs ``k/2`` consecutive ring
       positions removed at two places, so ``P <= n (n-k-1) / 2 * C(A+D, k) / C(n, k)``;
    2. a client's ``k`` neighbours are a uniform ``k``-subset of the other ``n - 1``, so
       the corrupt neighbours ``~ Hyp(n-1, A, k)`` and the surviving ones
       ``~ Hyp(n-1, n-D-1, k)``. ``t_low - 1`` bounds the former except with probability
       ``2**-(sigma+1) / n`` (fewer than ``t`` colluders can never unmask a client),
       ``t_high`` bounds the latter from below except with probability ``2**-eta / n``
       (every needed secret keeps ``t`` holders).

    Returns ``None`` when no ``k < n - 1`` qualifies (small ``n`` or high rates): use the
    complete graph.
    """
    if n < 4:
        return None
    corrupt = math.ceil(corruption_rate * n - 1e-9)
    lost = math.ceil(dropout_rate * n - 1e-9)
    bad = corrupt + lost
    log_sec = -(security_bits + 1) * math.log(2)
    eps_security = 2.0 ** -(security_bits + 1) / n
    eps_correct = 2.0 ** -correctness_bits / n
    for k in range(2, n - 1, 2):
        if k <= bad:
            log_disconnect = (math.log(n) + math.log(n - k - 1) - math.log(2)
                              + _lchoose(bad, k) - _lchoose(n, k))
            if log_disconnect >= log_sec:
                continue
        corrupt_pmf = _hypergeometric(n - 1, corrupt, k)
        t_low_minus_1, tail = k, 0.0  # smallest x with P[corrupt neighbours > x] <= eps
        for x in range(k, -1, -1):
            if tail > eps_security:
                break
            t_low_minus_1 = x
            tail += corrupt_pmf[x]
        survive_pmf = _hypergeometric(n - 1, n - lost - 1, k)
        t_high, below = 0, 0.0  # largest x with P[surviving neighbours < x] <= eps
        for x in range(k + 1):
            if below > eps_correct:
                break
            t_high = x
            below += survive_pmf[x]
        t_low = max(t_low_minus_1 + 1, 2)
        if t_low <= t_high:
            return k, t_low, t_high
    return None


def _resolve_threshold(requested: int | float | None, holders: int, default: int) -> int:  # noqa: PYI041
    if requested is None:
        t = default
    elif isinstance(requested, float):
        t = max(math.ceil(requested * holders - 1e-9), 2 if holders >= 2 else 1)
    else:
        t = requested
        if holders >= 2 and t < 2:
            raise ValueError("a threshold of 1 lets any single holder unmask a client; use at least 2")
    if t > holders:
        raise ThresholdError(f"threshold {t} exceeds the {holders} holders of each secret in this run")
    return t


def complete_parameters(participants: int, options: MaskingOptions) -> GroupParameters:
    m = participants
    default = max((2 * m + 2) // 3, 2 if m >= 2 else 1)
    return GroupParameters(m, m - 1, _resolve_threshold(options.threshold, m, default))


def sparse_parameters(participants: int, options: MaskingOptions) -> GroupParameters:
    m = participants
    bounds: tuple[int, int] | None = None
    if options.degree is not None:
        k = options.degree + (options.degree & 1)
    else:
        found = sparse_graph_parameters(
            m, dropout_rate=options.dropout_rate, corruption_rate=options.corruption_rate,
            security_bits=options.security_bits, correctness_bits=options.correctness_bits,
        )
        if found is None:
            return complete_parameters(m, options)
        k, low, high = found
        bounds = (low, high)
    k = min(k, m - 1)
    holders = k + 1
    default = max((2 * holders + 2) // 3, 2 if holders >= 2 else 1)
    if bounds is not None:
        default = min(max(default, bounds[0]), bounds[1])
    return GroupParameters(m, k, _resolve_threshold(options.threshold, holders, default))


def harary_graph(members: Sequence[PartyId], degree: int) -> dict[PartyId, tuple[PartyId, ...]]:
    """A random k-regular Harary graph: members on a ring in a uniformly random order
    (Fisher-Yates with :mod:`secrets`), each linked to the ``degree // 2`` nearest on
    either side. Degree ``>= len(members) - 1`` gives the complete graph."""
    order = list(members)
    m = len(order)
    half = degree // 2
    if degree >= m - 1 or 2 * half >= m - 1:
        return {u: tuple(v for v in sorted(order) if v != u) for u in order}
    for i in range(m - 1, 0, -1):
        j = secrets.randbelow(i + 1)
        order[i], order[j] = order[j], order[i]
    graph: dict[PartyId, tuple[PartyId, ...]] = {}
    for pos, u in enumerate(order):
        graph[u] = tuple(sorted(order[(pos + off) % m] for off in range(-half, half + 1) if off))
    return graph


def word_dtype(slot_bits: int) -> np.dtype[Any]:
    """Masks are added in uint32 words when ``b <= 32``, else in uint64 words."""
    return np.dtype(np.uint32) if slot_bits <= 32 else np.dtype(np.uint64)


# --- key material -------------------------------------------------------------------------------

def _raw_public(key: X25519PrivateKey) -> bytes:
    return key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def _raw_private(key: X25519PrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.Raw, serialization.PrivateFormat.Raw,
                             serialization.NoEncryption())


def _load_public(data: bytes) -> X25519PublicKey:
    if len(data) != PUBLIC_KEY_BYTES:
        raise WireError(f"an X25519 public key is {PUBLIC_KEY_BYTES} bytes, got {len(data)}")
    return X25519PublicKey.from_public_bytes(data)


def _check_public(data: bytes) -> None:
    """Refuse keys that cannot agree a secret (low-order points) before anyone relies on them."""
    try:
        X25519PrivateKey.generate().exchange(_load_public(data))
    except ValueError:
        raise WireError("not a usable X25519 public key") from None


def _agree(private: X25519PrivateKey, public: X25519PublicKey) -> bytes:
    try:
        return private.exchange(public)
    except ValueError:
        raise WireError("key agreement with a peer's key failed") from None


def _u32(value: int) -> bytes:
    return value.to_bytes(4, "big")


def pair_seed(shared: bytes, *, protocol: str, run_id: bytes, u: PartyId, v: PartyId) -> bytes:
    """The PRG seed of the pairwise mask of ``u`` and ``v`` (symmetric in u, v)."""
    low, high = min(u, v), max(u, v)
    info = b"secure-fl/masking/pair/" + protocol.encode() + run_id + _u32(low) + _u32(high)
    return hkdf(shared, info=info, length=SEED_BYTES)


def self_seed(seed: bytes, *, protocol: str, run_id: bytes, owner: PartyId) -> bytes:
    """The PRG seed of ``owner``'s self mask, from its shared 32-byte secret ``b``."""
    info = b"secure-fl/masking/self/" + protocol.encode() + run_id + _u32(owner)
    return hkdf(seed, info=info, length=SEED_BYTES)


def _share_associated(protocol: str, run_id: bytes, owner: PartyId, holder: PartyId) -> bytes:
    return run_id + bytes([PROTOCOL_CODES[protocol]]) + _u32(owner) + _u32(holder)


# --- payloads -----------------------------------------------------------------------------------

def _read_ids(reader: Reader, allowed: frozenset[PartyId], *, limit: int) -> tuple[PartyId, ...]:
    """A u32 count then strictly increasing party ids, all in ``allowed``."""
    count = reader.u32()
    if count > limit:
        raise WireError(f"a list of {count} parties is not possible here")
    ids = tuple(reader.u32() for _ in range(count))
    if any(b <= a for a, b in pairwise(ids)):
        raise WireError("party lists must be strictly increasing")
    if not set(ids) <= allowed:
        raise WireError("party list names parties outside this run")
    return ids


def _write_ids(writer: Writer, ids: Sequence[PartyId]) -> Writer:
    writer.u32(len(ids))
    for pid in ids:
        writer.u32(pid)
    return writer


@dataclass(frozen=True)
class KeyAdvert:
    channel_key: bytes
    mask_key: bytes

    def to_bytes(self) -> bytes:
        return Writer().raw(self.channel_key).raw(self.mask_key).finish()

    @classmethod
    def from_bytes(cls, data: bytes) -> KeyAdvert:
        reader = Reader(data)
        advert = cls(reader.raw(PUBLIC_KEY_BYTES), reader.raw(PUBLIC_KEY_BYTES))
        reader.end()
        return advert


@dataclass(frozen=True)
class NeighbourKeys:
    """Server -> client: ``(id, channel key, mask key)`` of each neighbour, by increasing id."""

    entries: tuple[tuple[PartyId, bytes, bytes], ...]

    def to_bytes(self) -> bytes:
        writer = Writer().u32(len(self.entries))
        for pid, c_pk, s_pk in self.entries:
            writer.u32(pid).raw(c_pk).raw(s_pk)
        return writer.finish()

    @classmethod
    def from_bytes(cls, data: bytes, *, parties: frozenset[PartyId]) -> NeighbourKeys:
        reader = Reader(data)
        count = reader.u32()
        if count >= len(parties):
            raise WireError(f"{count} neighbours is not possible among {len(parties)} participants")
        entries = tuple((reader.u32(), reader.raw(PUBLIC_KEY_BYTES), reader.raw(PUBLIC_KEY_BYTES))
                        for _ in range(count))
        reader.end()
        ids = [e[0] for e in entries]
        if any(b <= a for a, b in pairwise(ids)) or not set(ids) <= parties:
            raise WireError("neighbour list is unsorted, repeated or names outsiders")
        return cls(entries)


@dataclass(frozen=True)
class SealedShares:
    """Sealed share pairs keyed by the other party: the recipient (client -> server) or the
    owner (server -> client), by increasing id."""

    entries: tuple[tuple[PartyId, bytes], ...]

    def to_bytes(self) -> bytes:
        writer = Writer().u32(len(self.entries))
        for pid, sealed in self.entries:
            writer.u32(pid).raw(sealed)
        return writer.finish()

    @classmethod
    def from_bytes(cls, data: bytes, *, parties: frozenset[PartyId]) -> SealedShares:
        reader = Reader(data)
        count = reader.u32()
        if count >= len(parties):
            raise WireError(f"{count} sealed shares is not possible among {len(parties)} participants")
        entries = tuple((reader.u32(), reader.raw(SEALED_SHARE_BYTES)) for _ in range(count))
        reader.end()
        ids = [e[0] for e in entries]
        if any(b <= a for a, b in pairwise(ids)) or not set(ids) <= parties:
            raise WireError("sealed shares are unsorted, repeated or name outsiders")
        return cls(entries)


@dataclass(frozen=True)
class UnmaskRequest:
    """Whose self-mask share (``survivors``) and whose mask-key share (``dropped``) to reveal."""

    survivors: tuple[PartyId, ...]
    dropped: tuple[PartyId, ...]

    def to_bytes(self) -> bytes:
        return _write_ids(_write_ids(Writer(), self.survivors), self.dropped).finish()

    @classmethod
    def from_bytes(cls, data: bytes, *, parties: frozenset[PartyId]) -> UnmaskRequest:
        reader = Reader(data)
        survivors = _read_ids(reader, parties, limit=len(parties))
        dropped = _read_ids(reader, parties, limit=len(parties))
        reader.end()
        return cls(survivors, dropped)


@dataclass(frozen=True)
class UnmaskResponse:
    """The revealed share values, in the order of the request's two lists."""

    self_mask_shares: tuple[int, ...]
    key_shares: tuple[int, ...]

    def to_bytes(self) -> bytes:
        writer = Writer().u32(len(self.self_mask_shares))
        for y in self.self_mask_shares:
            writer.raw(shamir.share_to_bytes(y))
        writer.u32(len(self.key_shares))
        for y in self.key_shares:
            writer.raw(shamir.share_to_bytes(y))
        return writer.finish()

    @classmethod
    def from_bytes(cls, data: bytes, request: UnmaskRequest) -> UnmaskResponse:
        reader = Reader(data)
        lists = []
        for expected in (len(request.survivors), len(request.dropped)):
            if reader.u32() != expected:
                raise WireError("the response does not answer the request")
            lists.append(tuple(shamir.share_from_bytes(reader.raw(shamir.SHARE_BYTES)) for _ in range(expected)))
        reader.end()
        return cls(lists[0], lists[1])


_MASKED_HEADER = struct.Struct(">BI")


def masked_to_bytes(words: Words) -> bytes:
    """``u8 word bytes | u32 count | little-endian words``: one copy of the vector."""
    if sys.byteorder != "little":  # pragma: no cover - big-endian hosts only
        words = words.byteswap()
    return b"".join((_MASKED_HEADER.pack(words.dtype.itemsize, words.shape[0]), words.data))


def masked_from_bytes(data: bytes, *, spec: VectorSpec, dtype: np.dtype[Any]) -> Words:
    if len(data) < _MASKED_HEADER.size:
        raise WireError("masked input truncated")
    width, count = _MASKED_HEADER.unpack_from(data)
    if width != dtype.itemsize or count != spec.length:
        raise WireError(f"expected {spec.length} words of {dtype.itemsize} bytes, got {count} of {width}")
    if len(data) != _MASKED_HEADER.size + width * count:
        raise WireError("masked input has the wrong length")
    words: Words = np.frombuffer(data, dtype=dtype.newbyteorder("<"), count=count, offset=_MASKED_HEADER.size)
    if spec.slot_bits < 8 * width and words.size and int(words.max()) >> spec.slot_bits:
        raise WireError(f"a masked entry is not reduced modulo 2**{spec.slot_bits}")
    return words


# --- parties ------------------------------------------------------------------------------------

class MaskingClient(Party):
    """One client of one run. Holds its input as mask words, its keys, and the shares it keeps."""

    def __init__(self, party_id: PartyId, *, protocol: str, run_id: bytes, spec: VectorSpec,
                 words: Words | None, params: GroupParameters, participants: tuple[PartyId, ...],
                 clients: tuple[PartyId, ...]) -> None:
        super().__init__(party_id)
        self.protocol, self.run_id, self.spec, self.params = protocol, run_id, spec, params
        self.clients = clients
        self.participants = frozenset(participants)
        self.dtype = word_dtype(spec.slot_bits)
        self._words = words
        self.gate = StageGate(run_id, protocol, party_id)
        self._channel: ChannelKey | None = None
        self._mask_key: X25519PrivateKey | None = None
        self._neighbours: dict[PartyId, tuple[bytes, X25519PublicKey]] = {}
        self._seed: bytes | None = None
        self._own_shares: tuple[int, int] | None = None
        self._held: dict[PartyId, tuple[int, int]] = {}

    @property
    def x(self) -> int:
        return self.party_id + 1

    def start(self) -> list[Outgoing]:
        if self._words is None:
            return []
        self._channel = ChannelKey()
        self._mask_key = X25519PrivateKey.generate()
        advert = KeyAdvert(self._channel.public_bytes, _raw_public(self._mask_key))
        self.gate.open = {Stage.SHARE_KEYS}
        return [self._send(Stage.ADVERTISE_KEYS, advert.to_bytes(), Exposure.public())]

    def receive(self, env: Envelope) -> list[Outgoing]:
        self.gate.check(env, allowed_senders=[SERVER])
        if env.stage == Stage.SHARE_KEYS:
            return self._share_keys(env)
        if env.stage == Stage.UPLOAD:
            return self._upload(env)
        if env.stage == Stage.UNMASKING:
            return self._unmask(env)
        return self._result(env)

    def _send(self, stage: Stage, payload: bytes, exposure: Exposure) -> Outgoing:
        return Outgoing(Envelope(self.protocol, stage, self.run_id, self.party_id, SERVER, payload), exposure)

    # share_keys: split b and s_sk among the neighbours and seal one pair of shares for each.
    def _share_keys(self, env: Envelope) -> list[Outgoing]:
        assert self._channel is not None and self._mask_key is not None
        keys = NeighbourKeys.from_bytes(env.payload, parties=self.participants)
        own = {self._channel.public_bytes, _raw_public(self._mask_key)}
        ids = [pid for pid, _, _ in keys.entries]
        if self.party_id in ids:
            raise WireError("a client is not its own neighbour")
        if len(ids) > self.params.degree:
            raise PolicyError(f"{len(ids)} neighbours exceed the run's degree {self.params.degree}")
        if len(ids) + 1 < self.params.threshold:
            raise PolicyError(f"sharing among {len(ids) + 1} holders is below the threshold {self.params.threshold}")
        published = [k for _, c_pk, s_pk in keys.entries for k in (c_pk, s_pk)]
        if len(set(published)) != len(published) or own & set(published):
            raise WireError("neighbour keys repeat")
        neighbours = {pid: (c_pk, _load_public(s_pk)) for pid, c_pk, s_pk in keys.entries}
        with self.timed("share_keys"):
            seed = secrets.token_bytes(shamir.SECRET_BYTES)
            holders = sorted([*ids, self.party_id])
            xs = [pid + 1 for pid in holders]
            seed_shares = dict(zip(holders, shamir.split(seed, xs, self.params.threshold)))
            key_shares = dict(zip(holders, shamir.split(_raw_private(self._mask_key), xs, self.params.threshold)))
            sealed = []
            for pid in ids:
                plaintext = shamir.share_to_bytes(seed_shares[pid]) + shamir.share_to_bytes(key_shares[pid])
                associated = _share_associated(self.protocol, self.run_id, self.party_id, pid)
                try:
                    box = seal(self._channel, neighbours[pid][0], plaintext, associated=associated,
                               purpose=_SHARE_PURPOSE)
                except ValueError:
                    raise WireError(f"neighbour {pid}'s channel key is unusable") from None
                sealed.append((pid, box))
        self.gate.record(env)
        self._neighbours = neighbours
        self._seed = seed
        self._own_shares = (seed_shares[self.party_id], key_shares[self.party_id])
        self.gate.open = {Stage.UPLOAD}
        return [self._send(Stage.SHARE_KEYS, SealedShares(tuple(sealed)).to_bytes(),
                           Exposure.sealed(self.party_id))]

    # upload: open the shares held for others, then mask with exactly the neighbours that shared.
    def _upload(self, env: Envelope) -> list[Outgoing]:
        assert self._channel is not None and self._mask_key is not None and self._seed is not None
        relayed = SealedShares.from_bytes(env.payload, parties=self.participants)
        held: dict[PartyId, tuple[int, int]] = {}
        for owner, box in relayed.entries:
            if owner not in self._neighbours:
                raise StageError(f"party {owner} is not a neighbour of this client")
            associated = _share_associated(self.protocol, self.run_id, owner, self.party_id)
            try:
                plaintext = open_sealed(self._channel, self._neighbours[owner][0], box,
                                        associated=associated, purpose=_SHARE_PURPOSE)
            except ValueError:
                raise AuthenticationError("sealed message failed to open") from None
            if len(plaintext) != SHARE_PLAINTEXT_BYTES:
                raise WireError("a share pair has the wrong length")
            held[owner] = (shamir.share_from_bytes(plaintext[: shamir.SHARE_BYTES]),
                           shamir.share_from_bytes(plaintext[shamir.SHARE_BYTES :]))
        if len(held) + 1 < self.params.threshold:
            raise PolicyError(f"only {len(held)} neighbours shared keys; the threshold is {self.params.threshold}")
        assert self._words is not None
        with self.timed("upload"):
            add = [self_seed(self._seed, protocol=self.protocol, run_id=self.run_id, owner=self.party_id)]
            subtract: list[bytes] = []
            for owner in held:
                shared = _agree(self._mask_key, self._neighbours[owner][1])
                seed = pair_seed(shared, protocol=self.protocol, run_id=self.run_id, u=self.party_id, v=owner)
                (add if self.party_id < owner else subtract).append(seed)
            words = self._words  # consumed: the masked vector is written over the input
            MaskExpander(self.spec.length, self.dtype).accumulate(words, add=add, subtract=subtract)
            if self.spec.slot_bits < 8 * self.dtype.itemsize:
                np.bitwise_and(words, self.dtype.type((1 << self.spec.slot_bits) - 1), out=words)
            payload = masked_to_bytes(words)
        self.gate.record(env)
        self._words = None
        self._held = held
        self.gate.open = {Stage.UNMASKING}
        return [self._send(Stage.UPLOAD, payload, Exposure.masked(self.spec.length, self.party_id))]

    # unmasking: reveal one share per party, never both of one party.
    def _unmask(self, env: Envelope) -> list[Outgoing]:
        assert self._own_shares is not None
        request = UnmaskRequest.from_bytes(env.payload, parties=self.participants)
        self.check_request(request)
        b_shares = tuple(self._own_shares[0] if pid == self.party_id else self._held[pid][0]
                         for pid in request.survivors)
        s_shares = tuple(self._held[pid][1] for pid in request.dropped)
        self.gate.record(env)
        # Nothing secret is needed any more: forget it.
        self._seed, self._own_shares, self._held, self._mask_key = None, None, {}, None
        self.gate.open = {Stage.RESULT}
        return [self._send(Stage.UNMASKING, UnmaskResponse(b_shares, s_shares).to_bytes(), Exposure.public())]

    def check_request(self, request: UnmaskRequest) -> None:
        """Refuse any request that could unmask an individual input."""
        both = set(request.survivors) & set(request.dropped)
        if both:
            raise PolicyError(f"asked for both the self-mask and the key share of parties {sorted(both)}")
        if self.party_id in request.dropped:
            raise PolicyError("asked for this client's own mask key although it uploaded")
        if self.party_id not in request.survivors:
            raise PolicyError("the request treats this client as lost although it uploaded")
        if len(request.survivors) < self.params.threshold:
            raise PolicyError(f"only {len(request.survivors)} survivors named; the threshold is "
                              f"{self.params.threshold}")
        unknown = (set(request.survivors) | set(request.dropped)) - set(self._held) - {self.party_id}
        if unknown:
            raise StageError(f"this client holds no shares of parties {sorted(unknown)}")

    def _result(self, env: Envelope) -> list[Outgoing]:
        released = ReleasedSum.from_bytes(env.payload, self.spec, parties=self.clients)
        if self.party_id not in released.contributors:
            raise WireError("the released sum leaves out this client although it uploaded")
        try:
            result = decode_sum(self.spec, released.encoded_sum, contributors=len(released.contributors))
        except EncodingError as error:
            raise WireError(f"released sum is impossible: {error}") from error
        self.gate.record(env)
        self.gate.open = set()
        self.result = result
        return []


class MaskingServer(ServerParty):
    """The aggregator: relays keys and sealed shares, adds masked inputs, unmasks the sum."""

    def __init__(self, *, protocol: str, run_id: bytes, spec: VectorSpec, params: GroupParameters,
                 participants: tuple[PartyId, ...], clients: tuple[PartyId, ...], reveal: Reveal) -> None:
        super().__init__()
        self.protocol, self.run_id, self.spec, self.params = protocol, run_id, spec, params
        self.participants, self.clients, self.reveal = participants, clients, reveal
        self.party_set = frozenset(participants)
        self.dtype = word_dtype(spec.slot_bits)
        self.gate = StageGate(run_id, protocol, SERVER)
        self.gate.open = {Stage.ADVERTISE_KEYS}
        self.stage = Stage.ADVERTISE_KEYS
        self.keys: dict[PartyId, KeyAdvert] = {}
        self._seen_keys: set[bytes] = set()
        self.graph: dict[PartyId, tuple[PartyId, ...]] = {}
        self.bundles: dict[PartyId, dict[PartyId, bytes]] = {}
        self.shared: tuple[PartyId, ...] = ()
        self.total: Words = np.zeros(spec.length, dtype=self.dtype)
        self.requests: dict[PartyId, UnmaskRequest] = {}
        self.responses: dict[PartyId, UnmaskResponse] = {}

    @property
    def threshold(self) -> int:
        return self.params.threshold

    def _send(self, stage: Stage, receiver: PartyId, payload: bytes, exposure: Exposure) -> Outgoing:
        return Outgoing(Envelope(self.protocol, stage, self.run_id, SERVER, receiver, payload), exposure)

    def receive(self, env: Envelope) -> list[Outgoing]:
        if env.stage == Stage.ADVERTISE_KEYS:
            self.gate.check(env, allowed_senders=self.participants)
            advert = KeyAdvert.from_bytes(env.payload)
            _check_public(advert.channel_key)
            _check_public(advert.mask_key)
            if advert.channel_key == advert.mask_key or {advert.channel_key, advert.mask_key} & self._seen_keys:
                raise WireError("a public key was advertised twice")
            self.gate.record(env)
            self.keys[env.sender] = advert
            self._seen_keys |= {advert.channel_key, advert.mask_key}
        elif env.stage == Stage.SHARE_KEYS:
            self.gate.check(env, allowed_senders=tuple(self.graph))
            bundle = SealedShares.from_bytes(env.payload, parties=self.party_set)
            if tuple(pid for pid, _ in bundle.entries) != self.graph[env.sender]:
                raise StageError("shares must go to exactly the sender's neighbours")
            self.gate.record(env)
            self.bundles[env.sender] = dict(bundle.entries)
        elif env.stage == Stage.UPLOAD:
            self.gate.check(env, allowed_senders=self.shared)
            words = masked_from_bytes(env.payload, spec=self.spec, dtype=self.dtype)
            self.gate.record(env)
            with self.timed("aggregate"):
                np.add(self.total, words, out=self.total)
        else:
            self.gate.check(env, allowed_senders=tuple(self.requests))
            response = UnmaskResponse.from_bytes(env.payload, self.requests[env.sender])
            self.gate.record(env)
            self.responses[env.sender] = response
        return []

    def advance(self) -> list[Outgoing]:
        if self.stage == Stage.ADVERTISE_KEYS:
            return self._after_advertise()
        if self.stage == Stage.SHARE_KEYS:
            return self._after_share_keys()
        if self.stage == Stage.UPLOAD:
            return self._after_upload()
        if self.stage == Stage.UNMASKING:
            return self._after_unmasking()
        raise AbortedError("the run is already over")

    def _need(self, count: int, what: str) -> None:
        if count < self.threshold:
            raise ThresholdError(f"{what}: {count} < threshold {self.threshold}")

    def _after_advertise(self) -> list[Outgoing]:
        advertised = sorted(self.keys)
        self._need(len(advertised), "clients that advertised keys")
        self.graph = harary_graph(advertised, self.params.degree)
        out = []
        for pid in advertised:
            entries = tuple((v, self.keys[v].channel_key, self.keys[v].mask_key) for v in self.graph[pid])
            out.append(self._send(Stage.SHARE_KEYS, pid, NeighbourKeys(entries).to_bytes(), Exposure.public()))
        self.stage = Stage.SHARE_KEYS
        self.gate.open = {Stage.SHARE_KEYS}
        return out

    def _after_share_keys(self) -> list[Outgoing]:
        shared = set(self.bundles)
        self._need(len(shared), "clients that shared their keys")
        for pid in shared:
            self._need(1 + sum(v in shared for v in self.graph[pid]), f"holders of client {pid}'s shares")
        self.shared = tuple(sorted(shared))
        out = []
        for pid in self.shared:
            entries = tuple((owner, self.bundles[owner][pid]) for owner in self.graph[pid] if owner in shared)
            out.append(self._send(Stage.UPLOAD, pid, SealedShares(entries).to_bytes(), Exposure.sealed()))
        self.bundles = {}
        self.stage = Stage.UPLOAD
        self.gate.open = {Stage.UPLOAD}
        return out

    def _after_upload(self) -> list[Outgoing]:
        uploaded = self.gate.senders(Stage.UPLOAD)
        lost = set(self.shared) - uploaded
        self._need(len(uploaded), "clients that uploaded")
        for pid in uploaded:
            self._need(1 + sum(v in uploaded for v in self.graph[pid]), f"surviving holders of client {pid}'s seed")
        for pid in lost:
            holders = sum(v in uploaded for v in self.graph[pid])
            if holders:
                self._need(holders, f"surviving holders of lost client {pid}'s key")
        if not self._connected(uploaded):
            raise AbortedError("the surviving clients' masking graph fell apart: unmasking would "
                               "reveal partial sums")
        self.contributors = tuple(sorted(uploaded))
        out = []
        for pid in self.contributors:
            survivors = tuple(sorted([pid, *(v for v in self.graph[pid] if v in uploaded)]))
            dropped = tuple(v for v in self.graph[pid] if v in lost)
            self.requests[pid] = UnmaskRequest(survivors, dropped)
            out.append(self._send(Stage.UNMASKING, pid, self.requests[pid].to_bytes(), Exposure.public()))
        self.stage = Stage.UNMASKING
        self.gate.open = {Stage.UNMASKING}
        return out

    def _connected(self, nodes: set[PartyId]) -> bool:
        if not nodes:
            return False
        start = min(nodes)
        seen, frontier = {start}, [start]
        while frontier:
            u = frontier.pop()
            for v in self.graph[u]:
                if v in nodes and v not in seen:
                    seen.add(v)
                    frontier.append(v)
        return seen == nodes

    def _revealed(self) -> tuple[dict[PartyId, list[shamir.Point]], dict[PartyId, list[shamir.Point]]]:
        """Revealed shares by owner: self-mask seeds, mask keys (one pass over the responses)."""
        seeds: dict[PartyId, list[shamir.Point]] = {}
        keys: dict[PartyId, list[shamir.Point]] = {}
        for holder, response in self.responses.items():
            request = self.requests[holder]
            for owner, y in zip(request.survivors, response.self_mask_shares):
                seeds.setdefault(owner, []).append((holder + 1, y))
            for owner, y in zip(request.dropped, response.key_shares):
                keys.setdefault(owner, []).append((holder + 1, y))
        return seeds, keys

    def _recover(self, owner: PartyId, points: list[shamir.Point], what: str) -> bytes:
        self._need(len(points), f"revealed shares of client {owner}'s {what}")
        try:
            return shamir.combine(points, self.threshold)
        except WireError as error:
            raise AbortedError(f"client {owner}'s {what} could not be recovered: {error}") from error

    def _after_unmasking(self) -> list[Outgoing]:
        self.gate.open = set()
        uploaded = set(self.contributors)
        lost = sorted(v for v in self.shared if v not in uploaded)
        with self.timed("finalize"):
            seeds, keys = self._revealed()
            add: list[bytes] = []
            subtract = [self_seed(self._recover(pid, seeds.get(pid, []), "seed"), protocol=self.protocol,
                                  run_id=self.run_id, owner=pid)
                        for pid in self.contributors]
            for pid in lost:
                survivors = [v for v in self.graph[pid] if v in uploaded]
                if not survivors:
                    continue
                key = X25519PrivateKey.from_private_bytes(self._recover(pid, keys.get(pid, []), "key"))
                if _raw_public(key) != self.keys[pid].mask_key:
                    raise AbortedError(f"client {pid}'s recovered mask key does not match its advertised key")
                for v in survivors:
                    seed = pair_seed(_agree(key, _load_public(self.keys[v].mask_key)), protocol=self.protocol,
                                     run_id=self.run_id, u=pid, v=v)
                    # v added PRG(s) when v < pid and subtracted it otherwise: undo that.
                    (subtract if v < pid else add).append(seed)
            total = self.total
            MaskExpander(self.spec.length, self.dtype).accumulate(total, add=add, subtract=subtract)
            if self.spec.slot_bits < 8 * self.dtype.itemsize:
                np.bitwise_and(total, self.dtype.type((1 << self.spec.slot_bits) - 1), out=total)
            encoded = total.astype(np.uint64)
            try:
                self.result = decode_sum(self.spec, encoded, contributors=len(self.contributors))
            except EncodingError as error:
                raise AbortedError(f"the unmasked sum is impossible, refusing to release it: {error}") from error
        self.finished = True
        self.stage = Stage.RESULT
        if not self.reveal.clients:
            return []
        payload = ReleasedSum(self.contributors, encoded).to_bytes(parties=self.clients)
        exposure = Exposure.aggregate(len(self.contributors), self.spec.length)
        return [self._send(Stage.RESULT, pid, payload, exposure) for pid in self.contributors]


# --- the sessions -------------------------------------------------------------------------------

class MaskingSum(SecureSum):
    """SecAgg (Bonawitz et al. 2017) on the complete graph: every client masks with every other.

    Client cost grows with ``n`` (``n + 1`` masks of the vector, ``O(n^2)`` share work);
    tolerates any dropouts that leave ``t`` survivors per stage.
    """

    name: ClassVar[str] = MASKING
    stage_names = stage_names(Stage)
    sparse: ClassVar[bool] = False

    def __init__(self, *, clients: Sequence[PartyId], transport: Transport | None = None,
                 options: MaskingOptions = MaskingOptions()) -> None:
        super().__init__(clients=clients, transport=transport)
        if options.degree is not None and not self.sparse:
            raise ValueError("degree applies to 'secagg+' only; 'masking' uses the complete graph")
        self.options = options

    def parameters(self, participants: int) -> GroupParameters:
        """Degree and threshold of a run with ``participants`` clients holding inputs."""
        if participants < 1:
            raise ValueError("a run needs at least one participant")
        if self.sparse:
            return sparse_parameters(participants, self.options)
        return complete_parameters(participants, self.options)

    def _build(self, *, run_id: bytes, spec: VectorSpec, encoded: Mapping[PartyId, npt.NDArray[np.uint64]],
               reveal: Reveal, round: int) -> tuple[ServerParty, dict[PartyId, Party]]:
        if not reveal.server:
            raise ValueError(f"{self.name!r} unmasks the sum at the server; use 'paillier' with "
                             "keyholder='all' or 'ckks' for a sum the server must not learn")
        if not encoded:
            raise AbortedError("no client holds an input")
        participants = tuple(sorted(encoded))
        params = self.parameters(len(participants))
        dtype = word_dtype(spec.slot_bits)
        server = MaskingServer(protocol=self.name, run_id=run_id, spec=spec, params=params,
                               participants=participants, clients=self.clients, reveal=reveal)
        clients: dict[PartyId, Party] = {}
        for pid in self.clients:
            values = encoded.get(pid)
            clients[pid] = MaskingClient(
                pid, protocol=self.name, run_id=run_id, spec=spec, params=params,
                words=None if values is None else values.astype(dtype),
                participants=participants, clients=self.clients,
            )
        return server, clients


class SecAggPlusSum(MaskingSum):
    """SecAgg+ (Bell et al. 2020): each client masks with, and shares its secrets among,
    ``k = O(log n)`` neighbours on a random Harary graph the server samples per run.

    Client cost grows with ``k`` instead of ``n``; security and dropout tolerance hold
    with overwhelming probability under the rates in :class:`MaskingOptions`.
    """

    name: ClassVar[str] = SECAGG_PLUS
    sparse: ClassVar[bool] = True
