"""Empirical check of the distributed noisy sum: a statistical lower bound on its ε.

The mechanism — every client noising its count histogram, the secure sum adding them up —
runs ``trials`` times on a dataset D and ``trials`` times on a neighbour D' (record level:
one record added to client 0's class 0; client level: client 0's histogram going from
empty to full), through the real protocol code (plain by default, any registered protocol
on request) with the real sampler and the real widened encoding. A distinguisher then
thresholds the released sum projected on the direction that changed (the coordinate, or
the sum of all coordinates): for a set S = {stat ≥ τ} or {stat ≤ τ},

    ε ≥ log((P[M(D') ∈ S] − δ) / P[M(D) ∈ S])   (and with D, D' swapped),

with each probability replaced by its one-sided Clopper–Pearson bound at 1 − α/2 (so the
pair holds with confidence ≥ 1 − α): Jagielski, Ullman & Oprea 2020's method. S and the
ordering are chosen on the first half of the trials and the bound is computed on the
second half, so the reported number is a valid (1 − α)-confidence lower bound rather than
a maximum over many tests. A correct mechanism must give a lower bound below its claimed
ε; an under-noised one (``noise_scale`` < 1) is caught when the trials suffice.

For speed, ``batch`` independent trials share one protocol run: each client submits
``batch`` noisy copies of its histogram as one vector of ``classes × batch`` entries (fresh
noise for every copy); the sum is entry-wise, so each copy is an independent trial.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass
from typing import Any, Literal

import numpy as np
from scipy.stats import beta

from protocols import VectorSpec, make_sum

from .accounting import Sensitivity
from .distributed import DistributedDP, NoisySum
from .sources import random_source

__all__ = ["CheckResult", "clopper_pearson", "empirical_check", "empirical_epsilon"]


@dataclass(frozen=True)
class CheckResult:
    """What ``secure-fl dp-check`` reports (the first four keys are the documented JSON)."""

    claimed_epsilon: float
    empirical_epsilon_lower_bound: float
    sigma_per_client: float
    """Measured standard deviation of one client's noise entries."""
    sigma_analytic: float
    """The calibrated per-client σ (what the accountant assumes)."""
    sigma_total: float
    """Measured standard deviation of the released sum's noise."""
    sigma_total_analytic: float
    delta: float
    level: str
    mechanism: str
    protocol: str
    clients: int
    classes: int
    trials: int
    confidence: float
    test: str
    p_upper: float
    """Clopper–Pearson upper bound of P(S) under the dataset the test does not point to."""
    p_lower: float
    """Clopper–Pearson lower bound of P(S) under the dataset it points to."""
    slot_bits: int
    clipped: int
    secure_mode: bool
    noise_scale: float
    seconds: float

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def clopper_pearson(successes: Any, trials: Any, alpha: float) -> tuple[Any, Any]:
    """One-sided (lower, upper) Clopper–Pearson bounds, each at confidence 1 − alpha (vectorised)."""
    k = np.asarray(successes, dtype=np.float64)
    n = np.asarray(trials, dtype=np.float64)
    if np.any(n < 1) or np.any(k < 0) or np.any(k > n):
        raise ValueError("need 0 <= successes <= trials and trials >= 1")
    with np.errstate(all="ignore"):
        lower = np.where(k == 0, 0.0, beta.ppf(alpha, np.maximum(k, 1), n - k + 1))
        upper = np.where(k == n, 1.0, beta.ppf(1 - alpha, k + 1, np.maximum(n - k, 1)))
    if lower.ndim == 0:
        return float(lower), float(upper)
    return lower, upper


def _log_ratio(hits_lo: Any, n_lo: int, hits_hi: Any, n_hi: int, delta: float, alpha: float) -> np.ndarray:
    """log((P_lo − δ) / P_hi): P_lo a CP lower bound of hits_lo/n_lo, P_hi a CP upper bound of hits_hi/n_hi."""
    lower, _ = clopper_pearson(hits_lo, n_lo, alpha)
    _, upper = clopper_pearson(hits_hi, n_hi, alpha)
    lower, upper = np.atleast_1d(lower), np.atleast_1d(upper)
    out = np.full(lower.shape, -np.inf)
    ok = (lower - delta > 0) & (upper > 0)
    out[ok] = np.log((lower[ok] - delta) / upper[ok])
    return out


def _hits(stat: np.ndarray, kind: str, taus: np.ndarray) -> np.ndarray:
    ordered = np.sort(stat)
    if kind == ">=":
        return stat.size - np.searchsorted(ordered, taus, side="left")
    return np.searchsorted(ordered, taus, side="right")


def empirical_epsilon(d: np.ndarray, d_prime: np.ndarray, *, delta: float, alpha: float = 0.05
                      ) -> tuple[float, str, float, float]:
    """(ε lower bound, chosen test, P(S) upper bound, P(S) lower bound) from statistics under D and D'.

    The test S and which dataset it points to are chosen on the first half of each sample;
    the Clopper–Pearson bound (each side at 1 − α/2) is computed on the second half.
    """
    d, d_prime = np.asarray(d, dtype=np.float64), np.asarray(d_prime, dtype=np.float64)
    half_d, half_n = d.size // 2, d_prime.size // 2
    if min(half_d, half_n) < 10:
        raise ValueError("need at least 20 trials on each side")
    a = alpha / 2
    sel_d, sel_n = d[:half_d], d_prime[:half_n]
    taus = np.unique(np.concatenate([sel_d, sel_n]))
    best: tuple[float, str, float, bool] = (-math.inf, ">=", 0.0, False)
    for kind in (">=", "<="):
        hd, hn = _hits(sel_d, kind, taus), _hits(sel_n, kind, taus)
        for swapped in (False, True):
            # not swapped: S is likelier under D' — bound P_D'(S) below, P_D(S) above
            values = (_log_ratio(hd, half_d, hn, half_n, delta, a) if swapped
                      else _log_ratio(hn, half_n, hd, half_d, delta, a))
            i = int(np.argmax(values))
            if values[i] > best[0]:
                best = (float(values[i]), kind, float(taus[i]), swapped)
    if not math.isfinite(best[0]):
        return 0.0, "none", 1.0, 0.0
    _, kind, tau, swapped = best
    ed, en = d[half_d:], d_prime[half_n:]
    eval_d = int(_hits(ed, kind, np.array([tau]))[0])
    eval_n = int(_hits(en, kind, np.array([tau]))[0])
    if swapped:
        hits_lo, n_lo, hits_hi, n_hi = eval_d, ed.size, eval_n, en.size
    else:
        hits_lo, n_lo, hits_hi, n_hi = eval_n, en.size, eval_d, ed.size
    eps = float(_log_ratio(hits_lo, n_lo, hits_hi, n_hi, delta, a)[0])
    p_lo = float(clopper_pearson(hits_lo, n_lo, a)[0])
    p_hi = float(clopper_pearson(hits_hi, n_hi, a)[1])
    test = f"stat {kind} {tau:g} => {'D' if swapped else 'D-prime'}"
    return max(0.0, eps), test, p_hi, p_lo


def empirical_check(
    *,
    epsilon: float,
    delta: float,
    classes: int,
    clients: int,
    level: Literal["record", "client"] = "record",
    trials: int = 20_000,
    mechanism: str = "auto",
    protocol: str = "plain",
    protocol_options: dict[str, Any] | None = None,
    count_bound: int = 64,
    batch: int = 1000,
    alpha: float = 0.05,
    secure_mode: bool = True,
    seed: int | None = None,
    noise_scale: float = 1.0,
) -> CheckResult:
    """Run the noisy histogram sum ``trials`` times on D and on D' and bound ε from below.

    ``noise_scale`` multiplies every client's σ *after* calibration — below 1 it breaks the
    mechanism on purpose, to check that the check can catch a violation.
    """
    from secure_fl.stats import StatisticDeclaration

    if classes < 1 or clients < 1 or trials < 20 or batch < 1 or count_bound < 1:
        raise ValueError("classes, clients, batch and count_bound must be >= 1 and trials >= 20")
    if noise_scale <= 0:
        raise ValueError("noise_scale must be > 0")
    start = time.perf_counter()
    declaration = StatisticDeclaration(
        name="label_histogram", length=classes, bound=count_bound, kind="int",
        learners=frozenset({"server"}), description="dp-check: per-client label counts",
    )
    config = DistributedDP(epsilon=epsilon, delta=delta, level=level, mechanism=mechanism,
                           secure_mode=secure_mode, seed=seed)
    noisy = NoisySum(declaration, config, clients=clients,
                     record=Sensitivity.unit_count() if level == "record" else None)
    sigma = noisy.sigma * noise_scale
    rng = noisy.rng
    # Inputs: random histograms below the bound, so one more record stays inside it.
    data = random_source(secure_mode=False, seed=seed) if not secure_mode else rng
    base = (data.below(count_bound, clients * classes).reshape(clients, classes)).astype(np.int64)
    neighbour = base.copy()
    if level == "record":
        neighbour[0, 0] += 1
        direction = np.zeros(classes)
        direction[0] = 1.0
    else:
        base[0, :] = 0
        neighbour[0, :] = count_bound
        direction = np.ones(classes)
    top = int(noisy.noisy_bound)

    session = make_sum(protocol, clients=list(range(clients)), **(protocol_options or {}))
    stats: dict[str, list[np.ndarray]] = {"D": [], "D'": []}
    noise_sq = agg_sq = 0.0
    noise_count = agg_count = clipped = 0
    run = 0
    base_sum = base.sum(axis=0)
    for side, hist in (("D", base), ("D'", neighbour)):
        true_sum = hist.sum(axis=0)
        done = 0
        while done < trials:
            b = min(batch, trials - done)
            spec = VectorSpec(length=classes * b, bound=noisy.noisy_bound, summands=clients, kind="int", signed=True)
            inputs = {}
            for cid in range(clients):
                noise = noisy.mechanism.sample(sigma, classes * b, rng)
                noise_sq += float(np.dot(noise, noise))
                noise_count += noise.size
                vec = np.tile(hist[cid], b) + noise
                clipped += int(np.count_nonzero(np.abs(vec) > top))
                inputs[cid] = np.clip(vec, -top, top)
            outcome = session.sum(inputs, spec=spec, statistic="dp_check", round=run,
                                  reveal=declaration.reveal)
            run += 1
            released = np.asarray(outcome.total).reshape(b, classes)
            agg_sq += float(np.sum((released - true_sum) ** 2))
            agg_count += released.size
            # The distinguisher sees only the release; centring on D's sum is a fixed shift.
            stats[side].append((released - base_sum) @ direction)
            done += b
    d, d_prime = np.concatenate(stats["D"]), np.concatenate(stats["D'"])
    eps_lb, test, p_hi, p_lo = empirical_epsilon(d, d_prime, delta=delta, alpha=alpha)
    return CheckResult(
        claimed_epsilon=epsilon,
        empirical_epsilon_lower_bound=eps_lb,
        sigma_per_client=math.sqrt(noise_sq / noise_count),
        sigma_analytic=noisy.sigma,
        sigma_total=math.sqrt(agg_sq / agg_count),
        sigma_total_analytic=noisy.sigma_total,
        delta=delta, level=level, mechanism=noisy.mechanism.name, protocol=protocol, clients=clients,
        classes=classes, trials=trials, confidence=1 - alpha, test=test, p_upper=p_hi,
        p_lower=p_lo, slot_bits=noisy.spec(clients).slot_bits, clipped=clipped,
        secure_mode=secure_mode, noise_scale=noise_scale, seconds=time.perf_counter() - start,
    )
