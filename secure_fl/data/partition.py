"""Partitioners that split a labelled training set among simulated clients.

Each scheme follows the paper that defines it (see docs/data.md for the definitions and for
every choice the papers leave open). All of them

* draw randomness only from the ``rng`` they are given, so a seed fixes the result;
* return a :class:`Partition`: one int64 index array per client into ``labels``, no index in
  two clients, plus ``meta`` with the imbalance the partition actually achieved;
* raise :class:`PartitionParameterError` for out-of-range parameters and
  :class:`InfeasiblePartitionError` when the labels cannot meet valid ones.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from secure_fl.data.errors import InfeasiblePartitionError, PartitionParameterError
from secure_fl.data.imbalance import (
    cosine_similarity_to_global,
    emd,
    global_imbalance,
)

__all__ = [
    "PARTITIONERS",
    "Partition",
    "climb_partition",
    "dirichlet_partition",
    "dubhe_partition",
    "half_normal_class_sizes",
    "keep_minority",
    "ratio_loss_partition",
]


@dataclass(frozen=True, eq=False)
class Partition:
    """Per-client index arrays into the training set, and what the split achieved.

    ``meta`` always holds ``num_clients``, ``num_samples`` (assigned in total), ``coverage``
    (assigned / len(labels)), ``rho`` (max/min global class count of the assigned data),
    ``emd_avg`` and ``mean_cosine_similarity``; schemes add their own keys.
    """

    client_indices: tuple[np.ndarray, ...]
    meta: Mapping[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        arrays = tuple(np.asarray(ix, dtype=np.int64).reshape(-1) for ix in self.client_indices)
        for arr in arrays:
            arr.setflags(write=False)
        object.__setattr__(self, "client_indices", arrays)
        object.__setattr__(self, "meta", MappingProxyType(dict(self.meta)))

    @property
    def num_clients(self) -> int:
        return len(self.client_indices)

    @property
    def sizes(self) -> np.ndarray:
        """Number of samples per client."""
        return np.array([ix.size for ix in self.client_indices], dtype=np.int64)

    def all_indices(self) -> np.ndarray:
        """Every assigned index, concatenated in client order."""
        if not self.client_indices:
            return np.empty(0, dtype=np.int64)
        return np.concatenate(self.client_indices)

    def class_counts(self, labels: npt.ArrayLike, num_classes: int) -> np.ndarray:
        """(num_clients, num_classes) int64 matrix of per-client class counts."""
        y = np.asarray(labels)
        out = np.zeros((self.num_clients, num_classes), dtype=np.int64)
        for j, ix in enumerate(self.client_indices):
            out[j] = np.bincount(y[ix], minlength=num_classes)[:num_classes]
        return out


# --- validation helpers ---------------------------------------------------------------------


def _labels(labels: npt.ArrayLike) -> np.ndarray:
    y = np.asarray(labels)
    if y.ndim != 1 or y.size == 0:
        raise PartitionParameterError(f"labels must be a non-empty 1-D array, got shape {y.shape}")
    if not np.issubdtype(y.dtype, np.integer) and (
        not np.issubdtype(y.dtype, np.floating) or np.any(y != np.round(y))
    ):
        raise PartitionParameterError("labels must be integers")
    y = y.astype(np.int64)
    if y.min() < 0:
        raise PartitionParameterError("labels must be non-negative class ids")
    return y


def _rng(rng: Any) -> np.random.Generator:
    if not isinstance(rng, np.random.Generator):
        raise PartitionParameterError(
            f"rng must be a numpy.random.Generator (np.random.default_rng(seed)), got {type(rng)}"
        )
    return rng


def _num_clients(num_clients: Any, available: int) -> int:
    if isinstance(num_clients, bool) or not isinstance(num_clients, int | np.integer):
        raise PartitionParameterError(f"num_clients must be an int, got {num_clients!r}")
    if num_clients < 1:
        raise PartitionParameterError(f"num_clients must be >= 1, got {num_clients}")
    if num_clients > available:
        raise InfeasiblePartitionError(
            f"num_clients={num_clients} exceeds the {available} samples available"
        )
    return int(num_clients)


def _finite(name: str, value: Any, *, low: float, high: float = math.inf) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise PartitionParameterError(f"{name} must be a number, got {value!r}") from None
    if not (math.isfinite(v) and low <= v <= high):
        bounds = f"[{low}, {high}]" if math.isfinite(high) else f">= {low}"
        raise PartitionParameterError(f"{name} must be finite and {bounds}, got {value!r}")
    return v


def _minority(minority_classes: Sequence[int] | None, num_classes: int) -> tuple[int, ...]:
    classes = tuple(int(c) for c in (minority_classes or ()))
    if len(set(classes)) != len(classes):
        raise PartitionParameterError(f"minority_classes has duplicates: {classes}")
    bad = [c for c in classes if not 0 <= c < num_classes]
    if bad:
        raise PartitionParameterError(
            f"minority_classes {bad} outside the label range 0..{num_classes - 1}"
        )
    return classes


def _finish(
    labels: np.ndarray, parts: Sequence[np.ndarray], meta: Mapping[str, float]
) -> Partition:
    """Sort each client's indices, check the invariants, and record what was achieved."""
    clients = tuple(np.sort(np.asarray(p, dtype=np.int64)) for p in parts)
    assigned = np.concatenate(clients) if clients else np.empty(0, dtype=np.int64)
    if assigned.size != np.unique(assigned).size:  # an internal bug, never the caller's input
        raise AssertionError("a sample was assigned to two clients")
    empty = [j for j, c in enumerate(clients) if c.size == 0]
    if empty:
        raise InfeasiblePartitionError(
            f"{len(empty)} client(s) got no samples (first: {empty[0]}); use fewer clients"
        )
    num_classes = int(labels.max()) + 1
    partition = Partition(clients, {})
    counts = partition.class_counts(labels, num_classes)
    full = {
        "num_clients": float(len(clients)),
        "num_samples": float(assigned.size),
        "coverage": assigned.size / labels.size,
        "rho": global_imbalance(counts),
        "emd_avg": float(np.mean(emd(counts))),
        "mean_cosine_similarity": float(np.mean(cosine_similarity_to_global(counts))),
    }
    full.update({k: float(v) for k, v in meta.items()})
    return Partition(clients, full)


def _by_class(labels: np.ndarray, pool: np.ndarray, num_classes: int) -> list[np.ndarray]:
    return [pool[labels[pool] == c] for c in range(num_classes)]


# --- Dirichlet (FedShift, after Wang et al. 2019 / Yurochkin et al. 2019) -------------------


def dirichlet_partition(
    labels: npt.ArrayLike,
    *,
    num_clients: int,
    alpha: float,
    rng: np.random.Generator,
    min_size: int = 1,
    balance: bool = False,
    max_tries: int = 100,
) -> Partition:
    """For each class c draw p_c ~ Dir_N(α) and give client i the share p_{c,i} of class c.

    Small α concentrates each class on few clients. Every sample is assigned. The whole draw
    is repeated until every client holds at least ``min_size`` samples (Wang et al.'s code
    uses 10; 1 keeps every client trainable) — at most ``max_tries`` times.

    ``balance=True`` adds the "## Balance" step of Wang et al.'s (FedMA) partition code, whose
    setting FedShift says it follows (docs/data.md: why it is off by default and in FedShift's
    tables, and what it changes): classes are dealt in label order, and a client that already
    holds N/n samples or more gets no share of later classes (its p_{c,i} is zeroed and the
    rest renormalised). Client sizes then stay near N/n, and the clients filled early see fewer
    classes. Should every client with a positive share be full, the class goes to one
    not-yet-full client drawn uniformly (the reference code would divide by 0).
    """
    y = _labels(labels)
    rng = _rng(rng)
    n = _num_clients(num_clients, y.size)
    a = _finite("alpha", alpha, low=0.0)
    if a <= 0.0:
        raise PartitionParameterError(f"alpha must be > 0 for a Dirichlet partition, got {alpha}")
    if isinstance(min_size, bool) or not isinstance(min_size, int) or min_size < 0:
        raise PartitionParameterError(f"min_size must be a non-negative int, got {min_size!r}")
    if min_size * n > y.size:
        raise InfeasiblePartitionError(
            f"min_size={min_size} for {n} clients needs {min_size * n} samples, have {y.size}"
        )
    if isinstance(max_tries, bool) or not isinstance(max_tries, int) or max_tries < 1:
        raise PartitionParameterError(f"max_tries must be a positive int, got {max_tries!r}")
    if not isinstance(balance, bool):
        raise PartitionParameterError(f"balance must be a bool, got {balance!r}")
    num_classes = int(y.max()) + 1
    full_at = y.size / n
    per_class = _by_class(y, np.arange(y.size), num_classes)
    for attempt in range(1, max_tries + 1):
        parts: list[list[np.ndarray]] = [[] for _ in range(n)]
        sizes = np.zeros(n, dtype=np.int64)  # samples each client holds so far (the balance step reads it)
        for idx in per_class:
            if idx.size == 0:
                continue
            idx = rng.permutation(idx)
            p = rng.dirichlet(np.full(n, a))
            if not np.all(np.isfinite(p)):  # α so small that the draw underflowed
                p = np.zeros(n)
                p[rng.integers(n)] = 1.0
            if balance:
                open_ = sizes < full_at
                p = np.where(open_, p, 0.0)
                if p.sum() > 0.0:
                    p = p / p.sum()
                else:
                    p = np.zeros(n)
                    p[rng.choice(np.flatnonzero(open_))] = 1.0
            cuts = np.floor(np.cumsum(p)[:-1] * idx.size).astype(np.int64)
            for i, chunk in enumerate(np.split(idx, np.clip(cuts, 0, idx.size))):
                parts[i].append(chunk)
                sizes[i] += chunk.size
        clients = [np.concatenate(p) for p in parts]
        if sizes.min() >= max(min_size, 1):
            return _finish(y, clients, {"alpha": a, "balance": float(balance), "tries": float(attempt)})
    raise InfeasiblePartitionError(
        f"no Dirichlet draw with alpha={a} gave all {n} clients >= {max(min_size, 1)} samples "
        f"in max_tries={max_tries} tries; raise alpha or lower num_clients/min_size"
    )


# --- CLIMB: minority classes and the α-iid mix ---------------------------------------------


def keep_minority(
    labels: npt.ArrayLike,
    *,
    minority_classes: Sequence[int],
    rho: float,
    rng: np.random.Generator,
) -> np.ndarray:
    """Indices kept after retaining round(n_c/ρ) (at least 1) random samples of each minority class.

    CLIMB (paper 003, §4 "Data Imbalance"): the other classes are kept whole. Returns the kept
    indices, sorted.
    """
    y = _labels(labels)
    rng = _rng(rng)
    r = _finite("rho", rho, low=1.0)
    minority = _minority(minority_classes, int(y.max()) + 1)
    keep = np.ones(y.size, dtype=bool)
    for c in minority:
        idx = np.flatnonzero(y == c)
        if idx.size == 0:
            continue
        n_keep = max(1, round(idx.size / r))
        keep[rng.permutation(idx)[n_keep:]] = False
    return np.flatnonzero(keep).astype(np.int64)


def _dhondt(sizes: np.ndarray, seats: int) -> np.ndarray:
    """Seats per class by highest averages, one seat each first: minimises the largest shard."""
    alloc = (sizes > 0).astype(np.int64)
    for _ in range(seats - int(alloc.sum())):
        alloc[np.argmax(np.where(sizes > 0, sizes / np.maximum(alloc, 1), -1.0))] += 1
    return alloc


def climb_partition(
    labels: npt.ArrayLike,
    *,
    num_clients: int,
    alpha: float,
    rng: np.random.Generator,
    minority_classes: Sequence[int] = (),
    rho: float = 1.0,
    shards: Literal["by_class", "contiguous"] = "by_class",
) -> Partition:
    """CLIMB's α-mix: a fraction α of the data dealt iid, the rest sorted by label in shards.

    The data (after :func:`keep_minority` when ``minority_classes`` are given) are shuffled;
    the first round(α·n) go to the clients in equal iid chunks; the remainder is sorted by
    label and cut into one shard per client. ``shards="by_class"`` cuts at class boundaries
    (classes get shard counts by highest averages), so α = 0 gives single-class clients
    whenever num_clients ≥ number of classes; ``"contiguous"`` cuts the sorted sequence into
    equal runs, as the CLIMB authors' code does (shards may straddle two classes).
    """
    y = _labels(labels)
    rng = _rng(rng)
    a = _finite("alpha", alpha, low=0.0, high=1.0)
    if shards not in ("by_class", "contiguous"):
        raise PartitionParameterError(f"shards must be 'by_class' or 'contiguous', got {shards!r}")
    num_classes = int(y.max()) + 1
    minority = _minority(minority_classes, num_classes)
    pool = (
        keep_minority(y, minority_classes=minority, rho=rho, rng=rng)
        if minority
        else np.arange(y.size, dtype=np.int64)
    )
    r = _finite("rho", rho, low=1.0)
    n = _num_clients(num_clients, pool.size)
    pool = rng.permutation(pool)
    n_iid = round(a * pool.size)
    iid_chunks = np.array_split(pool[:n_iid], n)
    rest = pool[n_iid:]
    rest = rest[np.argsort(y[rest], kind="stable")]
    present = np.unique(y[rest]) if rest.size else np.empty(0, dtype=np.int64)
    if shards == "contiguous" or present.size > n or rest.size == 0:
        shard_list = np.array_split(rest, n)
    else:
        sizes = np.bincount(y[rest], minlength=num_classes)
        seats = _dhondt(sizes, n)
        shard_list = []
        for c in range(num_classes):
            if seats[c]:
                shard_list.extend(np.array_split(rest[y[rest] == c], seats[c]))
    clients = [np.concatenate([i, s]) for i, s in zip(iid_chunks, shard_list, strict=True)]
    meta: dict[str, float] = {"alpha": a, "rho_target": r, "num_minority": float(len(minority))}
    return _finish(y, clients, meta)


# --- Ratio Loss: random class subsets, equal per-class counts, global Γ --------------------


def _maxent_sizes(incidence: np.ndarray, target: np.ndarray) -> np.ndarray | None:
    """Per-client per-class counts q ≥ 1 with incidenceᵀ q = target, as even as possible.

    Every holder of a class gets at least one sample of it, so q = 1 + r with
    incidenceᵀ r = target − holders. Among those r we take the maximum-entropy one over the
    (client, class) *cells*: minimise Σ_j k_j (r_j ln r_j − r_j), whose solution is
    r_j = exp(mean of λ_c over client j's classes) — a client's count is the geometric mean of
    its classes' levels, so it does not grow with the number of classes it holds. Found by
    damped Newton on the convex dual Σ_j k_j exp(a_j·λ / k_j) − t·λ. Returns None when no such
    q exists (a class has more holders than its target, or the dual runs off to infinity).
    """
    a = incidence.astype(np.float64)
    k = a.sum(axis=1)
    b = a / k[:, None]
    residual = target.astype(np.float64) - a.sum(axis=0)
    if np.any(residual < 0):
        return None
    t = np.maximum(residual, 1e-6)  # keep the solution interior; rounding absorbs the rest
    lam = np.zeros(a.shape[1])

    def levels(v: np.ndarray) -> np.ndarray:
        out: np.ndarray = np.exp(np.clip(b @ v, -700, 700))
        return out

    def dual(v: np.ndarray) -> float:
        return float((k * levels(v)).sum() - t @ v)

    for _ in range(300):
        r = levels(lam)
        grad = a.T @ r - t
        if np.max(np.abs(grad) / np.maximum(t, 1.0)) < 1e-10:
            return 1.0 + r
        hess = a.T @ (a * (r / k)[:, None]) + 1e-12 * np.eye(a.shape[1])
        try:
            step = np.linalg.solve(hess, grad)
        except np.linalg.LinAlgError:
            return None
        f0, s = dual(lam), 1.0
        while dual(lam - s * step) > f0 - 1e-4 * s * (grad @ step) and s > 1e-12:
            s *= 0.5
        lam = lam - s * step
        if np.max(np.abs(lam)) > 1e4:
            return None
    r = levels(lam)
    return 1.0 + r if np.max(np.abs(a.T @ r - t) / np.maximum(t, 1.0)) < 1e-6 else None


def _integer_sizes(
    incidence: np.ndarray, q: np.ndarray, target: np.ndarray, available: np.ndarray
) -> np.ndarray | None:
    """Round q (≥ 1) to integers keeping per-class totals ≤ available and close to target."""
    qi = np.maximum(np.floor(q).astype(np.int64), 1)
    totals = incidence.T.astype(np.int64) @ qi
    if np.any(totals > available):
        return None
    # Largest fractional parts first: +1 while none of the client's classes passes its target.
    for j in np.argsort(-(q - np.floor(q)), kind="stable"):
        cls = incidence[j]
        if np.all(totals[cls] + 1 <= target[cls]):
            qi[j] += 1
            totals[cls] += 1
    # Single-class clients absorb what is left, exactly.
    k = incidence.sum(axis=1)
    for c in range(incidence.shape[1]):
        solo = np.flatnonzero((k == 1) & incidence[:, c])
        delta = int(target[c] - totals[c])
        if solo.size == 0 or delta == 0:
            continue
        share, extra = divmod(abs(delta), solo.size)
        adjust = np.full(solo.size, share, dtype=np.int64)
        adjust[:extra] += 1
        new = qi[solo] + np.sign(delta) * adjust
        if np.all(new >= 1):
            qi[solo] = new
            totals[c] += delta
    return qi if np.all(totals <= available) else None


def ratio_loss_partition(
    labels: npt.ArrayLike,
    *,
    num_clients: int,
    global_ratio: float,
    rng: np.random.Generator,
    classes_per_client: int | tuple[int, int] | None = None,
    minority_classes: Sequence[int] = (0,),
    tolerance: float = 0.05,
    max_tries: int = 100,
) -> Partition:
    """Ratio Loss's clients (paper 002, experiments) under a global imbalance Γ.

    Each client draws its number of classes uniformly from ``classes_per_client`` (default
    1..C), then that many distinct classes uniformly, and holds the *same* number q_j ≥ 1 of
    samples of each of its classes. Globally every majority class totals T and every minority
    class T/Γ, T as large as the data allow. The counts solve Σ_{j∋c} q_j = t_c; we take the
    maximum-entropy solution over (client, class) cells (q_j − 1 is the geometric mean of its
    classes' levels), then round. A class stops being drawable once it has
    min(t_c, 2·t_c/q̄) holders, q̄ the mean per-class count, which binds only for minority
    classes and keeps their holders from being cut to one sample per class. Draws are
    repeated (at most ``max_tries``) until the achieved Γ is within ``tolerance`` (relative)
    of ``global_ratio``. Samples beyond the targets stay unassigned (``meta["coverage"]``).
    """
    y = _labels(labels)
    rng = _rng(rng)
    g = _finite("global_ratio", global_ratio, low=1.0)
    tol = _finite("tolerance", tolerance, low=0.0)
    num_classes = int(y.max()) + 1
    n = _num_clients(num_clients, y.size)
    available = np.bincount(y, minlength=num_classes)
    if np.any(available == 0):
        raise InfeasiblePartitionError(
            f"classes {np.flatnonzero(available == 0).tolist()} have no samples; "
            "Γ is undefined when a class is empty"
        )
    lo, hi = _classes_range(classes_per_client, num_classes)
    if isinstance(max_tries, bool) or not isinstance(max_tries, int) or max_tries < 1:
        raise PartitionParameterError(f"max_tries must be a positive int, got {max_tries!r}")
    minority = _minority(minority_classes, num_classes)
    if g > 1.0 and not minority:
        raise PartitionParameterError("global_ratio > 1 needs at least one minority class")
    if len(minority) == num_classes and g > 1.0:
        raise PartitionParameterError(
            "minority_classes cannot be every class when global_ratio > 1"
        )
    is_min = np.zeros(num_classes, dtype=bool)
    if g > 1.0:  # with Γ = 1 every class is a majority class
        is_min[list(minority)] = True
    # Global targets: majority T, minority T/Γ, as large as the data allow.
    t_min = math.floor(min(available[~is_min].min() / g, available[is_min].min(initial=10**18)))
    t_maj = min(round(g * t_min), int(available[~is_min].min()))
    target = np.where(is_min, t_min, t_maj).astype(np.int64)
    if t_min < 1:
        raise InfeasiblePartitionError(f"global_ratio={g} leaves minority classes empty")
    if int(target.sum()) < n:
        raise InfeasiblePartitionError(
            f"num_clients={n} exceeds the {int(target.sum())} samples that global_ratio={g} keeps"
        )
    # At most twice the holders a class's target serves at the mean per-class count, so
    # minority holders keep a useful share instead of one sample each.
    mean_count = target.sum() / (n * (lo + hi) / 2.0)
    capacity = np.minimum(target, np.ceil(2.0 * target / mean_count)).astype(np.int64)
    best: tuple[float, np.ndarray, np.ndarray] | None = None
    for _ in range(max_tries):
        incidence = _draw_class_sets(n, lo, hi, capacity=capacity, rng=rng)
        if not (np.all(incidence.any(axis=0)) and np.all(incidence.any(axis=1))):
            continue
        q = _maxent_sizes(incidence, target)
        if q is None:
            continue
        qi = _integer_sizes(incidence, q, target, available)
        if qi is None:
            continue
        totals = incidence.T.astype(np.int64) @ qi
        err = abs(totals.max() / totals.min() / g - 1.0)
        if best is None or err < best[0]:
            best = (err, incidence, qi)
        if err <= tol:
            break
    if best is None or best[0] > tol:
        hint = (
            " (no draw admitted equal per-class counts of at least one sample meeting the"
            " class totals; a solution needs clients well beyond the number of classes and"
            " at most as many holders per class as its target count)"
            if best is None
            else f" (best relative error {best[0]:.3f})"
        )
        raise InfeasiblePartitionError(
            f"could not reach global_ratio={g} within tolerance={tol} for {n} clients in "
            f"{max_tries} draws{hint}; change num_clients, classes_per_client or global_ratio, "
            "or raise tolerance"
        )
    _, incidence, qi = best
    parts: list[list[np.ndarray]] = [[] for _ in range(n)]
    for c in range(num_classes):
        idx = rng.permutation(np.flatnonzero(y == c))
        holders = np.flatnonzero(incidence[:, c])
        bounds = np.concatenate([[0], np.cumsum(qi[holders])])
        for j, start, stop in zip(holders, bounds[:-1], bounds[1:], strict=True):
            parts[j].append(idx[start:stop])
    clients = [np.concatenate(p) for p in parts]
    totals = incidence.T.astype(np.int64) @ qi
    meta = {
        "global_ratio": float(totals.max() / totals.min()),
        "global_ratio_target": g,
        "mean_classes_per_client": float(incidence.sum(axis=1).mean()),
        "num_minority": float(is_min.sum()),
    }
    return _finish(y, clients, meta)


def _draw_class_sets(
    n: int, lo: int, hi: int, *, capacity: np.ndarray, rng: np.random.Generator
) -> np.ndarray:
    """(n, C) incidence: client j draws k_j ~ U{lo..hi}, then k_j distinct classes uniformly.

    A class stops being drawable once it has ``capacity[c]`` holders; later clients then draw
    among the remaining classes.
    """
    num_classes = capacity.size
    k = rng.integers(lo, hi + 1, size=n)
    incidence = np.zeros((n, num_classes), dtype=bool)
    holders = np.zeros(num_classes, dtype=np.int64)
    for j in range(n):
        open_classes = np.flatnonzero(holders < capacity)
        if open_classes.size == 0:
            break  # the caller rejects a draw that leaves a client without classes
        chosen = rng.choice(open_classes, size=min(int(k[j]), open_classes.size), replace=False)
        incidence[j, chosen] = True
        holders[chosen] += 1
    return incidence


def _classes_range(
    classes_per_client: int | tuple[int, int] | None, num_classes: int
) -> tuple[int, int]:
    if classes_per_client is None:
        lo, hi = 1, num_classes
    elif isinstance(classes_per_client, int | np.integer) and not isinstance(
        classes_per_client, bool
    ):
        lo = hi = int(classes_per_client)
    else:
        try:
            lo, hi = (int(v) for v in classes_per_client)  # type: ignore[union-attr]
        except (TypeError, ValueError):
            raise PartitionParameterError(
                f"classes_per_client must be an int or a (lo, hi) pair, got {classes_per_client!r}"
            ) from None
    if not 1 <= lo <= hi <= num_classes:
        raise PartitionParameterError(
            f"classes_per_client must satisfy 1 <= lo <= hi <= {num_classes}, got ({lo}, {hi})"
        )
    return lo, hi


# --- Dubhe: half-normal global skew ρ and a target EMD_avg ---------------------------------


def half_normal_class_sizes(available: npt.ArrayLike, *, rho: float) -> np.ndarray:
    """Class sizes n_c ∝ exp(−c²/2σ²) with n_0/n_{C−1} = ρ, as large as ``available`` allows.

    σ² = (C−1)²/(2 ln ρ), so n_c = n_0 · ρ^{−(c/(C−1))²}: class 0 is the most frequent and
    class C−1 the least (Dubhe's Fig. 10 has classes 8 and 9 as the minority).
    """
    avail = np.asarray(available, dtype=np.int64)
    r = _finite("rho", rho, low=1.0)
    c = avail.size
    if c < 2:
        raise PartitionParameterError("a half-normal skew needs at least two classes")
    profile = r ** (-((np.arange(c) / (c - 1)) ** 2))
    n0 = math.floor(float(np.min(avail / profile)) + 1e-9)
    sizes = np.minimum(np.round(n0 * profile).astype(np.int64), avail)
    if sizes.min() < 1:
        raise InfeasiblePartitionError(f"rho={r} leaves the rarest class empty with this data")
    return sizes


def _spread(total: np.ndarray, order: np.ndarray) -> np.ndarray:
    """Deal each class's ``total`` evenly over clients; remainders rotate through ``order``."""
    n = order.size
    out = np.tile(total // n, (n, 1))
    pointer = 0
    for c, r in enumerate(total % n):
        chosen = order[(pointer + np.arange(r)) % n]
        out[chosen, c] += 1
        pointer += int(r)
    return out


def _dubhe_counts(
    sizes: np.ndarray, dominant: np.ndarray, holders: np.ndarray, order: np.ndarray, w: float
) -> np.ndarray:
    """Counts when a fraction w of each class goes to the clients it dominates, the rest evenly."""
    dom_total = np.where(holders > 0, np.round(w * sizes).astype(np.int64), 0)
    counts = _spread(sizes - dom_total, order)
    for c in np.flatnonzero(holders):
        members = np.flatnonzero(dominant == c)
        share, extra = divmod(int(dom_total[c]), members.size)
        counts[members, c] += share
        counts[members[:extra], c] += 1
    return counts


DubheProfile = Literal["dirichlet", "mixture"]
"""How a Dubhe client's labels are drawn (the paper names only the two extremes, §6.1.1)."""


def _dirichlet_counts(sizes: np.ndarray, uniforms: np.ndarray, beta: float) -> np.ndarray:
    """Counts when client k's label mix is q_k ~ Dir(β·C·p_g) and class c is split ∝ q_{k,c}.

    The Gamma variates behind q_k come from fixed ``uniforms`` by the inverse CDF, so one set of
    draws serves every β of the bisection and EMD_avg moves smoothly with β (fresh draws per β
    would make the bisection chase noise). Each class is rounded by largest remainder, so class
    totals — hence ρ — are exact.
    """
    from scipy.special import gammainccinv, gammaln

    num_classes = uniforms.shape[1]
    shape = np.broadcast_to(beta * num_classes * sizes / sizes.sum(), uniforms.shape)
    with np.errstate(divide="ignore", under="ignore"):
        log_x = np.log(gammainccinv(shape, 1.0 - uniforms))
    # Tiny shapes underflow: there log x ≈ (log u + ln Γ(a+1)) / a, the small-a quantile.
    tiny = ~np.isfinite(log_x)
    log_x[tiny] = ((np.log(uniforms) + gammaln(shape + 1.0)) / shape)[tiny]
    # In logs throughout: at small β a class nobody dominates has q_{k,c} below float range
    # for every k, and its split must still follow the (relative) q_{k,c}.
    log_q = log_x - _logsumexp(log_x, axis=1)
    share = np.exp(log_q - _logsumexp(log_q, axis=0))
    exact = share * sizes
    counts: npt.NDArray[np.int64] = np.floor(exact).astype(np.int64)
    for c in range(num_classes):
        short = int(sizes[c] - counts[:, c].sum())
        counts[np.argsort(-(exact[:, c] - counts[:, c]), kind="stable")[:short], c] += 1
    return counts


def _logsumexp(a: np.ndarray, *, axis: int) -> np.ndarray:
    top = a.max(axis=axis, keepdims=True)
    return np.asarray(top + np.log(np.exp(a - top).sum(axis=axis, keepdims=True)))


def _feed_empty(counts: np.ndarray) -> np.ndarray:
    """Move one sample of the largest class to each empty client, from that class's largest holder."""
    out = counts.copy()
    for j in np.flatnonzero(out.sum(axis=1) == 0):
        c = int(np.argmax(out.sum(axis=0)))
        donor = int(np.argmax(out[:, c]))
        out[donor, c] -= 1
        out[j, c] += 1
    return out


def dubhe_partition(
    labels: npt.ArrayLike,
    *,
    num_clients: int,
    rho: float,
    emd_avg: float,
    rng: np.random.Generator,
    tolerance: float = 0.02,
    profile: DubheProfile = "dirichlet",
) -> Partition:
    """Dubhe's synthetic sets (paper 004, §6.1.1): half-normal global skew ρ and a target EMD_avg.

    1. Subsample the labels to half-normal class sizes with imbalance ratio ρ
       (:func:`half_normal_class_sizes`); this fixes the global distribution p_g.
    2. Spread the classes over clients with one heterogeneity knob, bisected until the achieved
       EMD_avg is within ``tolerance`` of ``emd_avg``:

       * ``profile="dirichlet"`` (default): client k's label mix is q_k ~ Dir(β·C·p_g) and each
         class is split among clients ∝ q_{k,c}. β → ∞ gives every client p_g, β → 0 one class
         per client; in between a client holds one, two or a few dominant classes.
       * ``profile="mixture"``: each client gets one dominant class (clients per class ∝ p_g)
         and a fraction w of every class goes to the clients it dominates, the rest evenly:
         client k ≈ (1−w)·p_g + w·e_{d_k}. Every client is a single-class client plus noise.

    The paper names only the two extremes ("the same distribution as the global one" and "only
    one category of data"); why the default is the Dirichlet profile is in docs/data.md. A
    target below the rounding floor returns the most even split; a target above the
    one-class-per-client end + tolerance raises :class:`InfeasiblePartitionError`.
    """
    y = _labels(labels)
    rng = _rng(rng)
    r = _finite("rho", rho, low=1.0)
    target = _finite("emd_avg", emd_avg, low=0.0, high=2.0)
    tol = _finite("tolerance", tolerance, low=0.0)
    if profile not in ("dirichlet", "mixture"):
        raise PartitionParameterError(f"profile must be 'dirichlet' or 'mixture', got {profile!r}")
    num_classes = int(y.max()) + 1
    available = np.bincount(y, minlength=num_classes)
    if np.any(available == 0):
        raise InfeasiblePartitionError(
            f"classes {np.flatnonzero(available == 0).tolist()} have no samples"
        )
    sizes = half_normal_class_sizes(available, rho=r)
    n = _num_clients(num_clients, int(sizes.sum()))
    # Which samples survive the skew: a random subset of each class.
    chosen = [rng.permutation(np.flatnonzero(y == c))[: sizes[c]] for c in range(num_classes)]

    achieved: Callable[[float], np.ndarray]
    if profile == "mixture":
        quota = sizes / sizes.sum() * n
        holders = np.floor(quota).astype(np.int64)
        for c in np.argsort(-(quota - holders), kind="stable")[: n - int(holders.sum())]:
            holders[c] += 1
        dominant = rng.permutation(np.repeat(np.arange(num_classes), holders))
        order = rng.permutation(n)
        knob, even, one_class = "mix_weight", 0.0, 1.0

        def achieved(w: float) -> np.ndarray:
            return _dubhe_counts(sizes, dominant, holders, order, w)
    else:
        uniforms = rng.random((n, num_classes))
        uniforms[uniforms == 0.0] = np.finfo(np.float64).tiny
        knob, even, one_class = "concentration", 1e6, 1e-6

        def achieved(beta: float) -> np.ndarray:
            return _feed_empty(_dirichlet_counts(sizes, uniforms, beta))

    def emd_of(value: float) -> tuple[float, np.ndarray]:
        counts = achieved(value)
        return float(np.nanmean(emd(counts))), counts

    low_emd, counts = emd_of(even)
    high_emd, high_counts = emd_of(one_class)
    if target > high_emd + tol:
        raise InfeasiblePartitionError(
            f"emd_avg={target} is outside the reachable range [{low_emd:.3f}, {high_emd:.3f}] "
            f"for rho={r} and {n} clients on these labels (tolerance {tol})"
        )
    # Below the rounding floor the most even split is the answer: Dubhe's "EMD_avg = 0".
    best = (0.0 if target <= low_emd else abs(low_emd - target), even, counts)
    if abs(high_emd - target) < best[0]:
        best = (abs(high_emd - target), one_class, high_counts)
    lo, hi = even, one_class          # EMD grows from lo to hi
    for _ in range(60):
        if best[0] <= tol / 4:
            break
        mid = 0.5 * (lo + hi) if profile == "mixture" else math.sqrt(lo * hi)
        value, counts = emd_of(mid)
        if abs(value - target) < best[0]:
            best = (abs(value - target), mid, counts)
        if value < target:
            lo = mid
        else:
            hi = mid
    err, setting, counts = best
    if err > tol:
        raise InfeasiblePartitionError(
            f"bisection reached EMD_avg within {err:.4f} of emd_avg={target}, above tolerance {tol}"
        )
    # Materialise: deal each class's chosen samples to clients in the counted amounts.
    parts: list[list[np.ndarray]] = [[] for _ in range(n)]
    for c in range(num_classes):
        bounds = np.concatenate([[0], np.cumsum(counts[:, c])])
        for j in np.flatnonzero(counts[:, c]):
            parts[j].append(chosen[c][bounds[j] : bounds[j + 1]])
    clients = [np.concatenate(p) if p else np.empty(0, dtype=np.int64) for p in parts]
    meta = {"rho_target": r, "emd_avg_target": target, knob: setting}
    return _finish(y, clients, meta)


# --- registry -------------------------------------------------------------------------------

Partitioner = Callable[..., Partition]

PARTITIONERS: dict[str, Partitioner] = {
    "dirichlet": dirichlet_partition,
    "climb": climb_partition,
    "ratio": ratio_loss_partition,
    "dubhe": dubhe_partition,
}
