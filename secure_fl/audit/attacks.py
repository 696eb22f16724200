"""Inference attacks on what a party received, and how to score them.

Every attack here is a pure function of what the attacking party actually holds (a
client's update in the clear, a round aggregate, the global models, participation sets,
visible loss values) plus public knowledge (the training recipe, a small auxiliary data
set, the global label distribution ``P(y)``, which FedShift publishes anyway). None of
them reads a client's data.

Scoring (:func:`score`) compares an inferred ``P_i(y)`` with the truth:

* ``l1_error`` — mean over target clients of ``‖P̂_i − P_i‖₁`` (0 … 2);
* ``trivial_l1_error`` — the same for the trivial guess ``P̂_i = P(y)``;
* ``advantage`` — ``1 − l1_error / trivial_l1_error``: 1 is exact inference, ≤ 0 is no
  better than guessing the global distribution;
* ``exact_count_accuracy`` — fraction of (client, class) counts inferred exactly, when an
  attack infers counts;
* ``top1_accuracy`` — fraction of clients whose dominant class is inferred (vs
  ``trivial_top1_accuracy``, always guessing the global majority class);
* ``recoverable_fraction`` — multi-round attacks: fraction of clients individually
  recoverable from the rounds seen.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
from scipy.optimize import nnls

__all__ = [
    "AttackResult",
    "climb_loss_inference",
    "composition_from_update",
    "direct_read",
    "disaggregate",
    "distribution",
    "dubhe_frequency_inference",
    "exact_result",
    "integer_counts",
    "label_counts_from_update",
    "nonnegative_solve",
    "ratio_monitor_composition",
    "score",
    "trivial_result",
]

FloatArray = npt.NDArray[np.float64]


# --- scoring ------------------------------------------------------------------------------------

def distribution(counts: npt.ArrayLike) -> FloatArray:
    """Rows normalised to sum to 1 (a zero row becomes uniform)."""
    c = np.clip(np.asarray(counts, dtype=np.float64), 0.0, None)
    if c.ndim == 1:
        s = c.sum()
        out1: FloatArray = c / s if s > 0 else np.full_like(c, 1.0 / c.size)
        return out1
    s = c.sum(axis=1, keepdims=True)
    out: FloatArray = np.divide(c, s, out=np.full_like(c, 1.0 / c.shape[1]), where=s > 0)
    return out


def integer_counts(estimate: npt.ArrayLike, total: int) -> npt.NDArray[np.int64]:
    """Largest-remainder rounding of non-negative ``estimate`` to integers summing to ``total``."""
    e = np.clip(np.asarray(estimate, dtype=np.float64), 0.0, None)
    if total <= 0:
        return np.zeros(e.shape, dtype=np.int64)
    s = e.sum()
    scaled = e * (total / s) if s > 0 else np.full(e.shape, total / e.size)
    base = np.floor(scaled).astype(np.int64)
    short = int(total - base.sum())
    if short > 0:
        order = np.argsort(-(scaled - base), kind="stable")
        base[order[:short]] += 1
    result: npt.NDArray[np.int64] = base
    return result


@dataclass(frozen=True)
class AttackResult:
    """One attack by one party on one run, scored against the truth."""

    name: str
    party: str
    targets: int
    """Clients the attack was scored on (0: not applicable)."""
    l1_error: float | None = None
    trivial_l1_error: float | None = None
    advantage: float | None = None
    exact_count_accuracy: float | None = None
    top1_accuracy: float | None = None
    trivial_top1_accuracy: float | None = None
    recoverable_fraction: float | None = None
    rounds: int | None = None
    note: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in asdict(self).items()}


def score(
    name: str,
    party: str,
    inferred: Mapping[int, npt.ArrayLike],
    truth: Mapping[int, npt.ArrayLike],
    prior: npt.ArrayLike,
    *,
    counts: bool = False,
    recoverable_fraction: float | None = None,
    rounds: int | None = None,
    note: str = "",
) -> AttackResult:
    """Score inferred distributions (or counts, when ``counts``) for the clients in ``inferred``.

    ``truth`` maps client id to its true class counts; ``prior`` is the global ``P(y)``.
    """
    targets = sorted(c for c in inferred if c in truth)
    if not targets:
        return AttackResult(name, party, 0, recoverable_fraction=recoverable_fraction, rounds=rounds,
                            note=note or "nothing the party holds applies")
    p = distribution(prior)
    true_counts = np.stack([np.asarray(truth[c], dtype=np.float64) for c in targets])
    true_p = distribution(true_counts)
    est = np.stack([np.asarray(inferred[c], dtype=np.float64) for c in targets])
    est_p = distribution(est)
    l1 = float(np.abs(est_p - true_p).sum(axis=1).mean())
    trivial = float(np.abs(p[None, :] - true_p).sum(axis=1).mean())
    advantage = 1.0 - l1 / trivial if trivial > 1e-12 else (1.0 if l1 < 1e-12 else 0.0)
    exact = None
    if counts:
        rounded = np.stack([integer_counts(e, round(float(e.sum()))) for e in est])
        exact = float((rounded == np.rint(true_counts).astype(np.int64)).mean())
    top1 = float((est_p.argmax(axis=1) == true_p.argmax(axis=1)).mean())
    trivial_top1 = float((true_p.argmax(axis=1) == int(p.argmax())).mean())
    return AttackResult(
        name=name, party=party, targets=len(targets), l1_error=l1, trivial_l1_error=trivial,
        advantage=advantage, exact_count_accuracy=exact, top1_accuracy=top1,
        trivial_top1_accuracy=trivial_top1, recoverable_fraction=recoverable_fraction, rounds=rounds,
        note=note,
    )


def exact_result(name: str, party: str, clients: Sequence[int], truth: Mapping[int, npt.ArrayLike],
                 prior: npt.ArrayLike, *, note: str, rounds: int | None = None) -> AttackResult:
    """The score of reading each of ``clients``' label counts exactly: an attack whose reading *is*
    the decryption or unmasking of an exact protocol, which yields the plaintext itself."""
    return score(name, party, {c: truth[c] for c in clients if c in truth}, truth, prior, counts=True,
                 rounds=rounds, note=note)


def trivial_result(name: str, party: str, truth: Mapping[int, npt.ArrayLike], prior: npt.ArrayLike,
                   *, note: str, rounds: int | None = None) -> AttackResult:
    """The score of the fallback guess ``P(y)`` for every client (advantage 0)."""
    p = np.asarray(prior, dtype=np.float64)
    return score(name, party, {c: p for c in truth}, truth, p, rounds=rounds, note=note)


# --- direct read --------------------------------------------------------------------------------

def direct_read(values: Mapping[int, npt.ArrayLike]) -> dict[int, FloatArray]:
    """A party that holds a client's label counts in the clear reads them: the identity."""
    return {c: np.asarray(v, dtype=np.float64) for c, v in values.items()}


# --- label counts from an output-layer update (RLU / iLRG style) --------------------------------

def _nnls(design: FloatArray, target: FloatArray) -> FloatArray:
    """Non-negative least squares, column-scaled for conditioning."""
    norms = np.linalg.norm(design, axis=0)
    norms[norms == 0] = 1.0
    solution, _ = nnls(design / norms, target, maxiter=50 * design.shape[1])
    return np.asarray(solution / norms, dtype=np.float64)


def nonnegative_solve(design: npt.ArrayLike, target: npt.ArrayLike) -> FloatArray:
    """``x ≥ 0`` with ``design @ x ≈ target`` (least squares)."""
    return _nnls(np.asarray(design, dtype=np.float64), np.asarray(target, dtype=np.float64).reshape(-1))


def composition_from_update(update: npt.ArrayLike, signatures: npt.ArrayLike, *, step: float) -> FloatArray:
    """Class counts ``m ≥ 0`` with ``update ≈ −step · signatures @ m`` (least squares).

    ``signatures`` is (P, C): column ``k`` is the mean gradient of the loss with respect to
    the output layer's P parameters for a sample of class ``k`` (from auxiliary data, at
    the models the update was trained between); ``step`` is the local step per sample
    (``lr · epochs / batch_size`` for plain SGD). One epoch of SGD moves the output layer
    by about ``−step · Σ_k n_k · g_k`` — the proportionality behind iLRG, RLU and Ratio
    Loss's monitor — so ``m`` estimates the counts ``n_k`` behind ``update``. For a sum of
    client updates it estimates the summed counts.
    """
    g = np.asarray(signatures, dtype=np.float64)
    u = np.asarray(update, dtype=np.float64).reshape(-1)
    if g.ndim != 2 or g.shape[0] != u.size:
        raise ValueError(f"signatures must be ({u.size}, C), got {g.shape}")
    if not step > 0:
        raise ValueError(f"step must be positive, got {step}")
    return _nnls(g, -u / step)


def label_counts_from_update(
    update: npt.ArrayLike,
    signatures: npt.ArrayLike,
    *,
    step: float,
    num_samples: int | None = None,
    scaled_by_total: float | None = None,
) -> FloatArray:
    """A client's label counts from its output-layer update.

    ``num_samples``: the client's |D_i| when the party knows it (the counts are then scaled
    to sum to it). ``scaled_by_total``: the client sent ``(|D_i| / N) · update`` for a
    weighted mean with the known round total ``N`` (FedAvg); the least-squares solution is
    then ``|D_i| / N`` times the counts, so ``|D_i| ≈ sqrt(N · Σ m)`` when ``num_samples``
    is unknown.
    """
    m = composition_from_update(update, signatures, step=step)
    if scaled_by_total is not None:
        total = float(scaled_by_total)
        n = float(num_samples) if num_samples is not None else math.sqrt(max(total * m.sum(), 0.0))
        m = m * (total / n) if n > 0 else m
    if num_samples is not None and m.sum() > 0:
        m = m * (num_samples / m.sum())
    return m


# --- Ratio Loss's monitor (Wang et al., AAAI'21, Eq. 6-7) ---------------------------------------

def ratio_monitor_composition(
    class_updates: npt.ArrayLike,
    global_delta: npt.ArrayLike,
    *,
    aux_counts: npt.ArrayLike,
    total_samples: float,
    clients: int,
    threshold: float = 1.25,
    estimator: str = "paper",
    calibrate: bool = False,
) -> FloatArray:
    """The monitor's estimate of a round's class counts ``N̂_p`` (Eq. 6–7).

    ``class_updates`` is (C, C, s): ``[q, p, i]`` is the update of weight ``W_(p,i)`` (output
    node ``p``, hidden unit ``i``) from training the round's start model on the auxiliary
    samples of class ``q`` alone (``aux_counts[q]`` of them) with the clients' step;
    ``global_delta`` is (C, s), the change of the output weights over the round;
    ``total_samples`` is ``Σ_j |D_j|`` over the round's ``clients``. This is the method's own
    estimator (:func:`secure_fl.algorithms.ratio_monitor.estimate_composition`) applied to
    another run's global models; ``calibrate`` fits the step so that the estimate sums to
    ``total_samples`` (for runs whose aggregation is not Eq. 4's unweighted mean).
    """
    from secure_fl.algorithms.ratio_monitor import estimate_composition

    delta = np.asarray(global_delta, dtype=np.float64)
    return np.asarray(estimate_composition(
        np.zeros_like(delta), delta, class_updates, total_samples, aux_counts=aux_counts, clients=clients,
        threshold=threshold, estimator=estimator, calibrate=calibrate,  # type: ignore[arg-type]
    ), dtype=np.float64)


# --- multi-round disaggregation -----------------------------------------------------------------

def disaggregate(
    participation: npt.ArrayLike,
    sums: npt.ArrayLike,
    *,
    nonnegative: bool = True,
    row_totals: npt.ArrayLike | None = None,
    total_weight: float = 10.0,
) -> tuple[FloatArray, npt.NDArray[np.bool_]]:
    """Each client's value from round sums over varying participant sets.

    ``participation`` is (R, N) with 1 where client ``j`` is in the sum of row ``r``;
    ``sums`` is (R, D). Solves ``participation @ X ≈ sums`` by least squares (non-negative
    when ``nonnegative``). ``row_totals`` (N, NaN where unknown) are known sums of each
    client's row — e.g. its sample count, which the party may have recovered exactly from
    another statistic — added as equations weighted by ``total_weight``; they make the solve
    robust to noisy sums. Returns ``X`` (N, D) and which clients are individually
    recoverable (their unit vector lies in the row space, so their row of ``X`` is exact when
    the sums are exact and the value is the same every round).
    """
    from secure_fl.audit.ledger import recoverable_clients

    a = np.asarray(participation, dtype=np.float64)
    s = np.asarray(sums, dtype=np.float64)
    if s.ndim == 1:
        s = s[:, None]
    if a.ndim != 2 or a.shape[0] != s.shape[0]:
        raise ValueError(f"participation {a.shape} and sums {s.shape} disagree")
    n, d = a.shape[1], s.shape[1]
    recoverable = recoverable_clients(a)
    totals = None if row_totals is None else np.asarray(row_totals, dtype=np.float64).reshape(-1)
    if totals is not None and totals.shape != (n,):
        raise ValueError(f"row_totals must hold {n} entries, got {totals.shape}")
    if totals is not None and nonnegative and np.isfinite(totals).any():
        # One non-negative least squares over all N·D unknowns: the round equations per column,
        # plus Σ_d X[i, d] = total_i for every client with a known total.
        known = np.flatnonzero(np.isfinite(totals))
        design = np.zeros((a.shape[0] * d + known.size, n * d))
        target = np.zeros(a.shape[0] * d + known.size)
        for col in range(d):
            design[col * a.shape[0]:(col + 1) * a.shape[0], col::d] = a
            target[col * a.shape[0]:(col + 1) * a.shape[0]] = s[:, col]
        for row, i in enumerate(known, start=a.shape[0] * d):
            design[row, i * d:(i + 1) * d] = total_weight
            target[row] = total_weight * totals[i]
        solution, _ = nnls(design, target, maxiter=50 * n * d)
        return np.asarray(solution, dtype=np.float64).reshape(n, d), recoverable
    x: FloatArray = np.asarray(np.linalg.lstsq(a, s, rcond=None)[0], dtype=np.float64)
    if nonnegative:
        refined = np.stack([_nnls(a, s[:, col]) for col in range(d)], axis=1) if a.size else x
        # Keep the exact least-squares rows for recoverable clients (NNLS may trade them off
        # against unrecoverable ones when the sums are noisy); use NNLS for the rest.
        x = np.asarray(np.where(recoverable[:, None], np.clip(x, 0.0, None), refined), dtype=np.float64)
    return x, recoverable


# --- Dubhe: participation frequency -> dominant classes -----------------------------------------

def dubhe_frequency_inference(
    participation: npt.ArrayLike,
    *,
    clients_per_round: int,
    registry_sum: npt.ArrayLike | None,
    categories: Sequence[Sequence[int]],
    prior: npt.ArrayLike,
    thresholds: Mapping[int, float] | None = None,
) -> tuple[dict[int, FloatArray], dict[int, int]]:
    """Dominant classes from how often each client takes part (Dubhe, ICPP'21, Eq. 6).

    A client of category ``u`` volunteers with probability ``K / (R_A(u) · ‖R_A‖₀)``, so its
    participation frequency ``f`` reveals the size ``R_A(u) ≈ K / (f ‖R_A‖₀)`` of its
    category; with the registry sum ``R_A`` at hand the attacker picks the category whose
    size is closest (ties: the first). ``categories[j]`` is the tuple of dominant classes of
    registry slot ``j`` (all classes for "none dominates"). Without ``R_A`` the party cannot
    name categories and falls back to ``prior``.

    Returns the inferred ``P̂_i(y)`` per client (dominant classes raised to their threshold
    share ``thresholds[len(u)]``, default ``1/len(u)·0.5+prior``) and the inferred category index.
    """
    a = np.asarray(participation, dtype=np.float64)
    p = distribution(prior)
    n = a.shape[1]
    if registry_sum is None or a.shape[0] == 0:
        return {j: p.copy() for j in range(n)}, {}
    r = np.asarray(registry_sum, dtype=np.float64)
    nonzero = np.flatnonzero(r > 0)
    support = max(len(nonzero), 1)
    freq = a.mean(axis=0)
    inferred: dict[int, FloatArray] = {}
    chosen: dict[int, int] = {}
    for j in range(n):
        if freq[j] <= 0:
            size = float(r[nonzero].max()) if len(nonzero) else 1.0
        else:
            size = clients_per_round / (freq[j] * support)
        slot = int(nonzero[np.argmin(np.abs(r[nonzero] - size))]) if len(nonzero) else 0
        chosen[j] = slot
        dominant = tuple(categories[slot])
        inferred[j] = _category_distribution(dominant, p, thresholds)
    return inferred, chosen


def _category_distribution(dominant: tuple[int, ...], prior: FloatArray,
                           thresholds: Mapping[int, float] | None) -> FloatArray:
    c = prior.size
    if len(dominant) >= c or not dominant:
        return prior.copy()
    share = (thresholds or {}).get(len(dominant))
    if share is None:
        share = 0.5 / len(dominant)
    out = prior.copy()
    rest = [k for k in range(c) if k not in dominant]
    mass = max(min(share * len(dominant), 1.0), float(prior[list(dominant)].sum()))
    out[list(dominant)] = mass / len(dominant)
    other = prior[rest].sum()
    out[rest] = (1.0 - mass) * (prior[rest] / other if other > 0 else 1.0 / len(rest))
    return out


# --- CLIMB: loss values -> label distribution ---------------------------------------------------

def climb_loss_inference(
    losses: npt.ArrayLike,
    class_losses: npt.ArrayLike,
    *,
    prior: npt.ArrayLike,
    ridge: float = 1e-3,
) -> FloatArray:
    """A client's ``P_i(y)`` from its loss values under successive global models.

    ``losses`` (T,) are the client's reported losses ``f_i`` in T rounds; ``class_losses``
    (T, C) the per-class mean loss of the same global models on auxiliary data, which the
    server computes itself. Since ``f_i ≈ Σ_k P_i(k) ℓ_k``, the attacker solves the
    simplex-constrained least squares ``min ‖L p − f‖² + ridge ‖p − P(y)‖²`` (the ridge pulls
    towards the global distribution when the rounds do not pin ``p`` down). With one round
    this is one equation in C unknowns — expect a small advantage; it grows with T as the
    per-class losses change between rounds.
    """
    f = np.asarray(losses, dtype=np.float64).reshape(-1)
    lc = np.asarray(class_losses, dtype=np.float64)
    prior_p = distribution(prior)
    if lc.shape != (f.size, prior_p.size):
        raise ValueError(f"class_losses must be ({f.size}, {prior_p.size}), got {lc.shape}")
    scale = max(float(np.abs(lc).max()), 1e-12)
    rows = [lc / scale, math.sqrt(ridge) * np.eye(prior_p.size),
            1e3 * np.ones((1, prior_p.size))]
    target = np.concatenate([f / scale, math.sqrt(ridge) * prior_p, [1e3]])
    solution, _ = nnls(np.vstack(rows), target, maxiter=100 * prior_p.size)
    return distribution(solution)
