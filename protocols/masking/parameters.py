"""The shape of a masking run: options, degree and threshold, Bell et al.'s bounds, the graph.

Everything here is a function of public inputs (the options and the number of participants),
so the server and every client compute a run's :class:`GroupParameters` independently; a
client never takes the server's word for them.
"""

from __future__ import annotations

import hashlib
import hmac
import math
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np

from ..errors import ThresholdError
from ..wire import PartyId, Writer

__all__ = [
    "GroupParameters", "MaskingOptions", "active_threshold", "complete_parameters", "graph_seed", "group_parameters",
    "harary_graph", "harary_neighbours", "resolve_threshold", "sparse_graph_parameters", "sparse_parameters", "word_dtype",
]


@dataclass(frozen=True, kw_only=True)
class MaskingOptions:
    """How many clients must survive, and (SecAgg+) how many neighbours each client masks with.

    ``threshold``
        Shares needed to recover one client's secret, among its ``degree + 1`` holders
        (its neighbours and itself). An ``int`` is absolute; a ``float`` in (0, 1] is a
        fraction of the holders, rounded up. Always a strict majority (``2t > holders``;
        anything less is refused): below it a server that equivocates about dropouts collects
        both secrets of one client from disjoint groups of honest holders. ``None``: ``ceil(2m/3)`` holders for
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
    ``active_server``
        Defend against a server that deviates from the protocol (Bonawitz et al. 2017, §4;
        Bell et al. 2020): every client needs a registered Ed25519 signing key
        (:mod:`protocols.identity`); advertised keys are signed and checked by every
        neighbour; the graph is derived from the run id and the advertised set, and each
        client checks its neighbourhood against it; a consistency round (stage 4) has every
        survivor sign the survivor set it was told, and a client reveals shares only with
        ``t`` matching signatures of its neighbourhood; and ``t`` is a strict majority of each
        secret's holders beyond the corrupt ones (``2t > k + 1 + c``), so a server that tells
        different holders different stories never collects both secrets of one client.
        Costs one more round trip and ``deg`` signature checks per client per stage that
        relays keys or signatures; ``secagg+`` then needs a larger degree.
    """

    threshold: int | float | None = None
    degree: int | None = None
    dropout_rate: float = 0.1
    corruption_rate: float = 0.05
    security_bits: int = 40
    correctness_bits: int = 20
    active_server: bool = False

    def __post_init__(self) -> None:
        if type(self.active_server) is not bool:
            raise ValueError(f"active_server must be a bool, got {self.active_server!r}")
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
            if isinstance(t, int) and 2 * t <= holders:
                raise ValueError(_minority(t, holders))
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
    active: bool = False
    """The active-server setting (signed keys, the consistency round, a majority threshold)."""

    @property
    def complete(self) -> bool:
        return self.degree >= self.participants - 1

    def to_bytes(self) -> bytes:
        """The run's ``SumRequest.params``: what the server computed, which every client
        compares with its own computation (a mismatch means different options: refuse).
        The active-server setting appends one byte."""
        writer = Writer().u32(self.participants).u32(self.degree).u32(self.threshold)
        return (writer.u8(1) if self.active else writer).finish()


def _lchoose(n: int, k: int) -> float:
    if k < 0 or k > n:
        return -math.inf
    return math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)


def _hypergeometric(population: int, successes: int, draws: int) -> list[float]:
    """P[X = x] for x = 0..draws, X the successes among ``draws`` taken without replacement."""
    total = _lchoose(population, draws)
    return [math.exp(_lchoose(successes, x) + _lchoose(population - successes, draws - x) - total)
            for x in range(draws + 1)]


@lru_cache(maxsize=1024)
def corrupt_neighbours(n: int, k: int, corrupt: int, security_bits: int) -> int:
    """The most corrupt neighbours a client has among ``k`` drawn from the other ``n - 1``
    (``corrupt`` of them corrupt), except with probability ``2**-(sigma+1) / n``."""
    eps_security = 2.0 ** -(security_bits + 1) / n
    corrupt_pmf = _hypergeometric(n - 1, corrupt, k)
    bound, tail = k, 0.0  # smallest x with P[corrupt neighbours > x] <= eps
    for x in range(k, -1, -1):
        if tail > eps_security:
            break
        bound = x
        tail += corrupt_pmf[x]
    return bound


def active_threshold(holders: int, corrupt: int) -> int:
    """Smallest ``t`` with ``2t > holders + corrupt``: two groups of holders that each reach
    ``t`` must share more than the corrupt ones, so some honest holder would have to reveal
    both secrets of one client, which it never does."""
    return (holders + corrupt) // 2 + 1


@lru_cache(maxsize=128)
def sparse_graph_parameters(
    n: int, *, dropout_rate: float, corruption_rate: float, security_bits: int = 40, correctness_bits: int = 20,
    active: bool = False,
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

    ``t_low`` is always at least a strict majority of the ``k + 1`` holders (``2t > k + 1``,
    the issue-22 rule: with a smaller ``t`` a server that equivocates about dropouts reads an
    input, shown at ``n = 12``), so the search may pick a larger ``k`` than the bounds alone.
    With ``active`` (an active server), ``t_low`` is raised to
    :func:`active_threshold` ``(k + 1, t_low - 1)`` — a strict majority of the holders beyond the
    ``t_low - 1`` corrupt neighbours the bound allows — and the search goes on to larger ``k``
    until that still meets ``t_high``.

    Returns ``None`` when no ``k < n - 1`` qualifies (small ``n`` or high rates): use the
    complete graph.
    """
    if n < 4:
        return None
    corrupt = math.ceil(corruption_rate * n - 1e-9)
    lost = math.ceil(dropout_rate * n - 1e-9)
    bad = corrupt + lost
    log_sec = -(security_bits + 1) * math.log(2)
    eps_correct = 2.0 ** -correctness_bits / n
    for k in range(2, n - 1, 2):
        if k <= bad:
            log_disconnect = (math.log(n) + math.log(n - k - 1) - math.log(2)
                              + _lchoose(bad, k) - _lchoose(n, k))
            if log_disconnect >= log_sec:
                continue
        t_low_minus_1 = corrupt_neighbours(n, k, corrupt, security_bits)
        survive_pmf = _hypergeometric(n - 1, n - lost - 1, k)
        t_high, below = 0, 0.0  # largest x with P[surviving neighbours < x] <= eps
        for x in range(k + 1):
            if below > eps_correct:
                break
            t_high = x
            below += survive_pmf[x]
        # Always a strict majority of each secret's holders (2t > k + 1): a server that tells
        # different holders different stories about who dropped cannot then collect both
        # secrets of one client from honest holders. Active: a majority beyond the corrupt too.
        t_low = max(t_low_minus_1 + 1, 2, active_threshold(k + 1, 0))
        if active:
            t_low = max(t_low, active_threshold(k + 1, t_low_minus_1))
        if t_low <= t_high:
            return k, t_low, t_high
    return None


def resolve_threshold(requested: int | float | None, holders: int, default: int) -> int:  # noqa: PYI041
    """The threshold among ``holders`` (see :class:`MaskingOptions`); a ``ValueError`` for a
    threshold of 1 where one holder could then unmask a client alone, a
    :class:`~protocols.errors.ThresholdError` for one no run of this size can reach."""
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
    if holders >= 2 and 2 * t <= holders:
        raise ValueError(_minority(t, holders))
    return t


def _minority(t: int, holders: int) -> str:
    return (f"threshold {t} is not a strict majority of the {holders} holders of each secret: a server that "
            f"tells different holders different stories about who dropped could collect both secrets of one "
            f"client and read its input; use at least {active_threshold(holders, 0)}")


def _check_active(t: int, holders: int, corrupt: int, options: MaskingOptions) -> None:
    if options.active_server and holders >= 2 and t < active_threshold(holders, corrupt):
        raise ValueError(f"against an active server the threshold must exceed (holders + corrupt) / 2 = "
                         f"({holders} + {corrupt}) / 2; {t} does not")


def complete_parameters(participants: int, options: MaskingOptions) -> GroupParameters:
    """SecAgg: every participant holds a share of every other's secrets; ``t = ceil(2m/3)`` by
    default (with ``active_server``, at least a strict majority beyond the assumed corrupt clients)."""
    m = participants
    corrupt = math.ceil(options.corruption_rate * m - 1e-9)
    default = max((2 * m + 2) // 3, 2 if m >= 2 else 1)
    if options.active_server and m >= 2:
        default = min(m, max(default, active_threshold(m, corrupt)))
    t = resolve_threshold(options.threshold, m, default)
    _check_active(t, m, corrupt, options)
    return GroupParameters(m, m - 1, t, options.active_server)


def sparse_parameters(participants: int, options: MaskingOptions) -> GroupParameters:
    """SecAgg+: the options' degree, or the smallest one Bell et al.'s bounds accept (the
    complete graph when none does), with the default threshold clamped into their range."""
    m = participants
    bounds: tuple[int, int] | None = None
    if options.degree is not None:
        k = options.degree + (options.degree & 1)
    else:
        found = sparse_graph_parameters(
            m, dropout_rate=options.dropout_rate, corruption_rate=options.corruption_rate,
            security_bits=options.security_bits, correctness_bits=options.correctness_bits,
            active=options.active_server,
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
    # Corrupt holders the active check allows for: at most this many of a client's k neighbours
    # are corrupt except with probability 2**-(sigma+1)/n (Bell et al.'s bound for t_low).
    corrupt = corrupt_neighbours(m, k, math.ceil(options.corruption_rate * m - 1e-9), options.security_bits)
    if options.active_server and holders >= 2:
        default = min(holders, max(default, active_threshold(holders, corrupt)))
    t = resolve_threshold(options.threshold, holders, default)
    _check_active(t, holders, corrupt, options)
    return GroupParameters(m, k, t, options.active_server)


def group_parameters(participants: int, options: MaskingOptions, *, sparse: bool) -> GroupParameters:
    """Degree and threshold of a run with ``participants`` clients holding inputs."""
    if participants < 1:
        raise ValueError("a run needs at least one participant")
    return sparse_parameters(participants, options) if sparse else complete_parameters(participants, options)


class _SeededBelow:
    """Uniform integers below a bound from HMAC-SHA256 in counter mode (rejection sampling)."""

    def __init__(self, seed: bytes) -> None:
        self._seed, self._counter, self._pool = seed, 0, b""

    def __call__(self, bound: int) -> int:
        width = (bound.bit_length() + 7) // 8 + 8  # 64 spare bits: rejection is rare
        limit = (1 << (8 * width)) // bound * bound
        while True:
            while len(self._pool) < width:
                self._pool += hmac.new(self._seed, self._counter.to_bytes(8, "big"), hashlib.sha256).digest()
                self._counter += 1
            value, self._pool = int.from_bytes(self._pool[:width], "big"), self._pool[width:]
            if value < limit:
                return value % bound


def graph_seed(protocol: str, run_id: bytes, members: Sequence[PartyId]) -> bytes:
    """The seed of an active-server run's graph: every client recomputes it from the run id and
    the advertised set it was told, so the server cannot hand out inconsistent neighbourhoods."""
    digest = hashlib.sha256(b"secure-fl/masking/graph/" + protocol.encode() + run_id)
    for pid in sorted(members):
        digest.update(pid.to_bytes(4, "big"))
    return digest.digest()


def harary_graph(members: Sequence[PartyId], degree: int, *,
                 seed: bytes | None = None) -> dict[PartyId, tuple[PartyId, ...]]:
    """A random k-regular Harary graph: members on a ring in a uniformly random order
    (Fisher-Yates with :mod:`secrets`, or, given ``seed``, with a generator every client can
    rerun), each linked to the ``degree // 2`` nearest on either side. Degree
    ``>= len(members) - 1`` gives the complete graph."""
    m = len(members)
    half = degree // 2
    if _complete(m, degree):
        ordered = sorted(members)
        return {u: tuple(v for v in ordered if v != u) for u in (ordered if seed is not None else members)}
    order = _ring(members, seed)
    graph: dict[PartyId, tuple[PartyId, ...]] = {}
    for pos, u in enumerate(order):
        graph[u] = _row(order, pos, half)
    return graph


def harary_neighbours(members: Sequence[PartyId], degree: int, party: PartyId, *, seed: bytes) -> tuple[PartyId, ...]:
    """``harary_graph(members, degree, seed=seed)[party]`` without the other rows: what one
    client of an active-server run checks its neighbourhood against. ``KeyError`` when
    ``party`` is not a member."""
    m = len(members)
    half = degree // 2
    if _complete(m, degree):
        if party not in members:
            raise KeyError(party)
        return tuple(v for v in sorted(members) if v != party)
    order = _ring(members, seed)
    try:
        pos = order.index(party)
    except ValueError:
        raise KeyError(party) from None
    return _row(order, pos, half)


def _row(order: Sequence[PartyId], pos: int, half: int) -> tuple[PartyId, ...]:
    """The neighbours of ``order[pos]`` on the ring: ``half`` on either side, ascending."""
    m = len(order)
    return tuple(sorted(order[(pos + off) % m] for off in range(-half, half + 1) if off))


def _complete(m: int, degree: int) -> bool:
    half = degree // 2
    return degree >= m - 1 or 2 * half >= m - 1


def _ring(members: Sequence[PartyId], seed: bytes | None) -> list[PartyId]:
    """The members in ring order: a Fisher-Yates shuffle (of the sorted ids when seeded)."""
    order = sorted(members) if seed is not None else list(members)
    below = _SeededBelow(seed) if seed is not None else secrets.randbelow
    for i in range(len(order) - 1, 0, -1):
        j = below(i + 1)
        order[i], order[j] = order[j], order[i]
    return order


def word_dtype(slot_bits: int) -> np.dtype[Any]:
    """Masks are added in uint32 words when ``b <= 32``, else in uint64 words."""
    return np.dtype(np.uint32) if slot_bits <= 32 else np.dtype(np.uint64)
