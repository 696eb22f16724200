"""The attacks of one cell, each on exactly what the attacking party holds.

Every attack reads a :class:`~secure_fl.audit.context.CellContext`: the server's view (what it
received and computed), the method model (the method's own client half, run on hypothesised
clients) and, for coalitions, the colluding clients' views. None branches on a method's or a
protocol's name: which statistics carry label counts or sample counts, how clients weighted
and trained, come from the method's client half; what a party can read comes from the
messages and the protocols' readers.

* what the server reads in the clear (a :class:`~secure_fl.audit.views.Read` of an input) is
  attacked as that client's own value;
* what it learns only as a sum (a release) is attacked as that sum — the inference then
  describes the whole round, and every participant gets the round's guess;
* what it cannot read (ciphertexts, masked inputs) is attacked only by a coalition large enough
  to open it (the ledger's threshold of the run), whose reading is the plaintext itself.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt

from secure_fl.audit import attacks as A
from secure_fl.audit.context import CellContext

__all__ = ["ATTACKS"]

FloatArray = npt.NDArray[np.float64]


def _coalition(size: int) -> str:
    return f"server+{size} client{'s' if size != 1 else ''}"


def attack_direct_read(ctx: CellContext) -> list[A.AttackResult]:
    """Label counts the server reads in the clear: a statistic whose contribution gives them."""
    inferred: dict[int, FloatArray] = {}
    names: set[str] = set()
    for name in ctx.count_statistics:
        cmap = ctx.count_map(name)
        assert cmap is not None
        for read in ctx.view.inputs(name):
            if read.owner is not None and read.owner not in inferred:
                inferred[read.owner] = cmap.counts(read.values)
                names.add(name)
    if not inferred:
        return []
    noisy = [n for n in sorted(names) if ctx.noised(n)]
    return [A.score("direct_read", "server", inferred, ctx.truth, ctx.prior, counts=True,
                    note=f"reads {', '.join(sorted(names))} in the clear"
                         + (f" ({', '.join(noisy)} with distributed-DP noise)" if noisy else ""))]


def attack_collusion_read(ctx: CellContext) -> list[A.AttackResult]:
    """Label counts a client uploaded encrypted or masked, read by the smallest coalition that can.

    A ciphertext under a key some client holds opens for the server plus that one client; a
    masked input for the server plus ``t`` holders of its Shamir shares (the run's threshold, from
    its ``open``). The attack is the decryption or unmasking itself, exact for an exact protocol:
    it yields the plaintext, i.e. the client's counts. Statistics noised with distributed DP are
    left out (the plaintext is then a noisy count)."""
    thresholds = {run.run_id: run.threshold for run in ctx.ledger.runs}
    results = []
    for name in ctx.count_statistics:
        if ctx.noised(name):
            continue
        read = {r.owner for r in ctx.view.inputs(name)}
        coalition: dict[int, int] = {}
        for row in ctx.ledger.rows:
            if row.party != "server" or row.statistic != name or row.kind not in ("ciphertext", "masked") \
                    or row.owner is None:
                continue
            client = int(row.owner.split("-")[1])
            t = thresholds.get(row.run_id)
            if client in read or t is None:
                continue
            coalition[client] = min(coalition.get(client, t), t)
        if not coalition:
            continue
        size = max(coalition.values())
        results.append(A.exact_result(
            "collusion_read", _coalition(size), sorted(coalition), ctx.truth, ctx.prior,
            note=f"{name}: each client's upload opens for the server with {size} colluding "
                 f"client{'s' if size != 1 else ''} (the plaintext is the client's counts)"))
    return results


def attack_update_inference(ctx: CellContext) -> list[A.AttackResult]:
    """Label counts from the model update of a client's first round (RLU/iLRG-style least squares)."""
    inferred: dict[int, FloatArray] = {}
    individual = aggregate = 0
    for c, r in ctx.first_rounds.items():
        estimate = ctx.client_update_counts(c, r)
        if estimate is not None:
            individual += 1
        else:
            summed = ctx.sum_update_counts(r)
            estimate = summed[0] if summed is not None else None
            aggregate += summed is not None
        inferred[c] = estimate if estimate is not None else ctx.prior
    if individual:
        note = f"{individual} clients' own updates read in the clear"
    elif aggregate:
        note = "only the round's sum of updates is readable: every participant gets the round's composition"
    else:
        note = "no update readable: the trivial guess"
    counts = individual > 0 and aggregate == 0 and len(ctx.read_sizes()) == len(inferred)
    return [A.score("update_label_counts", "server", inferred, ctx.truth, ctx.prior, counts=counts, rounds=1,
                    note=note)]


def _monitor_estimate(ctx: CellContext, round: int) -> FloatArray | None:
    """Ratio Loss's monitor (Eq. 6–7) on the round's global models, for any method: the server
    holds both models and Σ|D_j|; class weights the clients trained with come from the half."""
    total = ctx.round_total(round)
    if total is None:
        return None
    t = ctx.model.info.training
    updates = ctx.probe.class_updates(ctx.start(round), lr=t.lr_at(round) * t.epochs, batch_size=t.batch_size)
    weight = ctx.class_weight(round)
    if weight is not None:
        updates = updates * weight[:, None, None]
    weights = ctx.update_model(round)
    delta = ctx.probe.weight_part(ctx.end(round) - ctx.start(round))
    return A.ratio_monitor_composition(updates, delta, aux_counts=ctx.probe.aux_counts, total_samples=total,
                                       clients=len(ctx.view.cohorts[round]),
                                       calibrate=weights is None or weights.weighted)


def attack_ratio_monitor(ctx: CellContext) -> list[A.AttackResult]:
    """The monitor's estimate of each round's composition, as the guess for every participant."""
    inferred: dict[int, FloatArray] = {}
    for c, r in ctx.first_rounds.items():
        estimate = _monitor_estimate(ctx, r)
        inferred[c] = estimate if estimate is not None else ctx.prior
    k = ctx.settings.clients_per_round
    return [A.score("ratio_loss_monitor", "server", inferred, ctx.truth, ctx.prior, rounds=1,
                    note="the monitor reads only the global models and Σ|D_j|: no protocol hides it; "
                         f"a round mixes {k} client{'s' if k != 1 else ''}")]


def _label_sums(ctx: CellContext) -> tuple[str, list[tuple[tuple[int, ...], FloatArray]], bool]:
    """(source, [(contributors, sum of label counts)], size-weighted) the server can form.

    Exact sums where a counts statistic is summed over varying sets; else the estimates from
    each round's update sum."""
    exact = []
    for name in ctx.count_statistics:
        cmap = ctx.count_map(name)
        assert cmap is not None
        for release in ctx.view.releases_of(name):
            if release.value is not None:
                exact.append((release.contributors,
                              cmap.counts(release.value, contributors=len(release.contributors))))
    if len({contributors for contributors, _ in exact}) > 1:
        return "exact label sums", exact, False
    estimated, weighted = [], False
    for r, cohort in enumerate(ctx.view.cohorts):
        summed = ctx.sum_update_counts(r)
        update_sum = ctx.update_sum(r)
        if summed is not None:
            estimated.append((update_sum.contributors if update_sum is not None else cohort, summed[0]))
            weighted = summed[1]
    return "update sums", estimated, weighted


def attack_disaggregation(ctx: CellContext) -> list[A.AttackResult]:
    """Multi-round: each client's updates read over rounds, or least squares over the
    participation matrix of per-round label sums (constrained by the |D_i| the server knows)."""
    participants = sorted(ctx.first_rounds)
    if not participants:
        return []
    own = {c: [e for r, cohort in enumerate(ctx.view.cohorts) if c in cohort
               if (e := ctx.client_update_counts(c, r)) is not None] for c in participants}
    if all(own.values()):
        inferred = {c: np.mean([A.distribution(e) for e in estimates], axis=0) for c, estimates in own.items()}
        return [A.score("disaggregation", "server", inferred, ctx.truth, ctx.prior,
                        recoverable_fraction=len(participants) / len(ctx.truth), rounds=ctx.rounds,
                        note="updates read individually: per-client estimates averaged over rounds")]
    source, sums, weighted = _label_sums(ctx)
    if not sums:
        return []
    index = {c: j for j, c in enumerate(ctx.clients)}
    matrix = np.zeros((len(sums), len(index)))
    for i, (contributors, _) in enumerate(sums):
        matrix[i, [index[c] for c in contributors]] = 1.0
    values = np.stack([s for _, s in sums])
    sizes = _sizes(ctx)
    totals = np.full(len(index), np.nan)
    for c, n in (sizes.exact() if sizes is not None else {}).items():
        totals[index[c]] = n * n if weighted else n
    x, recoverable = A.disaggregate(matrix, values, row_totals=totals)
    inferred = {c: x[index[c]] for c in ctx.clients if matrix[:, index[c]].any()}
    fraction = float(np.mean([recoverable[index[c]] for c in ctx.clients]))
    return [A.score("disaggregation", "server", inferred, ctx.truth, ctx.prior, recoverable_fraction=fraction,
                    rounds=len(sums),
                    note=f"{round(fraction * len(ctx.truth))}/{len(ctx.truth)} clients recoverable from "
                         f"{len(sums)} {source} over varying participant sets")]


class _Sizes:
    """What the server knows of each |D_i|: read in the clear, or isolated from round sums."""

    def __init__(self, estimate: dict[int, float], direct: set[int], differenced: set[int], rounds: int,
                 statistic: str) -> None:
        self.estimate, self.direct, self.differenced = estimate, direct, differenced
        self.rounds, self.statistic = rounds, statistic

    def exact(self) -> dict[int, float]:
        return {c: v for c, v in self.estimate.items() if c in self.direct or c in self.differenced}


def _sizes(ctx: CellContext) -> _Sizes | None:
    name = next((n for n in ctx.size_statistics if ctx.view.releases_of(n) or ctx.view.inputs(n)), None)
    if name is None:
        return None
    cmap = ctx.count_map(name)
    assert cmap is not None
    direct = {c: n for c, n in ctx.read_sizes().items()}
    # a repeat of a constant statistic (reused_from) is the same equation again: not another release
    releases = [r for r in ctx.view.releases_of(name) if r.value is not None and r.reused_from is None]
    if not releases and not direct:
        return None
    index = {c: j for j, c in enumerate(ctx.clients)}
    matrix = np.zeros((len(releases), len(index)))
    for i, release in enumerate(releases):
        matrix[i, [index[c] for c in release.contributors]] = 1.0
    estimate, differenced = dict(direct), set()
    if releases:
        sums = np.array([[cmap.size(r.value, contributors=len(r.contributors))] for r in releases if r.value is not None])
        x, recoverable = A.disaggregate(matrix, sums)
        for c in ctx.clients:
            if c not in direct and matrix[:, index[c]].any():
                estimate[c] = float(x[index[c], 0])
                if recoverable[index[c]]:
                    differenced.add(c)
    return _Sizes(estimate, set(direct), differenced, max(len(releases), 1), name)


def attack_sample_counts(ctx: CellContext) -> list[A.AttackResult]:
    """|D_i| read in the clear, or recovered from the round sums of a size statistic."""
    sizes = _sizes(ctx)
    if sizes is None:
        return []
    clients = ctx.clients
    exact = float(np.mean([abs(sizes.estimate.get(c, -1) - ctx.truth[c].sum()) < 0.5 for c in clients]))
    parts = []
    if sizes.direct:
        parts.append(f"{len(sizes.direct)} read in the clear")
    if sizes.differenced or not sizes.direct:
        parts.append(f"{len(sizes.differenced)} by differencing round sums")
    known = len(sizes.direct) + len(sizes.differenced)
    return [A.AttackResult(
        name="sample_counts", party="server", targets=len(sizes.estimate), exact_count_accuracy=exact,
        recoverable_fraction=known / len(clients), rounds=sizes.rounds,
        note=f"|D_i| of {known}/{len(clients)} clients from {sizes.statistic}: " + ", ".join(parts)
             + (" (the sums carry distributed-DP noise)" if ctx.noised(sizes.statistic) else ""),
    )]


def attack_sample_means(ctx: CellContext) -> list[A.AttackResult]:
    """A per-round statistic a client computes from its samples (CLIMB's loss f_i), against the
    same statistic computed by the method's client half on the attacker's samples of each class:
    ``f_i ≈ Σ_k P_i(k) f_k`` (simplex least squares, ridge towards P(y))."""
    results = []
    for name in sorted(ctx.model.declarations):
        if name in ctx.model.update_statistics or ctx.count_map(name) is not None:
            continue
        reads = ctx.view.inputs(name)
        releases = [r for r in ctx.view.releases_of(name) if r.value is not None]
        rounds = sorted({r.round for r in reads} | {r.round for r in releases})
        profiles = {r: p for r in rounds if (p := _profile(ctx, name, r)) is not None}
        if not profiles:
            continue
        per_client: dict[int, list[tuple[int, float]]] = defaultdict(list)
        for read in reads:
            if read.owner is not None and read.round in profiles:
                per_client[read.owner].append((read.round, float(read.values[0])))
        inferred: dict[int, FloatArray] = {}
        if per_client:
            for c, values in per_client.items():
                inferred[c] = A.climb_loss_inference(np.array([v for _, v in values]),
                                                     np.stack([profiles[r] for r, _ in values]), prior=ctx.prior)
            note = f"{name} of {len(per_client)} clients read in the clear over {len(profiles)} rounds"
        else:
            for release in releases:
                means = release.means()
                if release.round not in profiles or means is None:
                    continue
                estimate = A.climb_loss_inference(means[:1], profiles[release.round][None, :], prior=ctx.prior)
                for c in release.contributors:
                    inferred.setdefault(c, estimate)
            note = f"only round sums of {name} readable: each participant gets its first round's estimate"
        if inferred:
            results.append(A.score("sample_means", "server", inferred, ctx.truth, ctx.prior, rounds=len(profiles),
                                   note=note))
    return results


def _profile(ctx: CellContext, name: str, round: int) -> FloatArray | None:
    """(C,) ``name`` as the method's client half sends it for the attacker's samples of each
    class in ``round``; ``None`` when it does not vary with the class (nothing to infer)."""
    client = ctx.view.cohorts[round][0]
    profile = ctx.model.class_profile(
        name, round=round, start=ctx.start(round), aux_x=ctx.probe.aux_x, aux_y=ctx.probe.aux_y,
        learned=ctx.trained_with(client, round), broadcast=ctx.broadcast(client, round),
        cohort_size=ctx.cohort_size(name, round))
    if profile is None or profile.shape[1] < 1:
        return None
    column = profile[:, 0]
    return column if float(np.ptp(column)) > 1e-9 else None


def attack_participation(ctx: CellContext) -> list[A.AttackResult]:
    """Participation frequencies against the registry sum R_A (Dubhe, ICPP'21, Eq. 6).

    Runs where the selection has a client half with a statistic only clients learn (the registry;
    of several, the one the colluder learned last — the registration the rounds select by). The
    server alone knows the cohorts but not R_A, so it cannot name categories (trivial guess); with
    any one client it reads R_A from that client's view (decrypted with the client's own key),
    maps each frequency to the registry slot of that size (K / (f·‖R_A‖₀)), and each slot to the
    label distributions the selection's own client half registers there — probed on hypothesised
    clients after hearing the σ the server announced to the colluder."""
    registries = {n for n, d in ctx.model.selection_declarations.items() if not d.reveal.server}
    if not registries:
        return []
    participation = np.zeros((ctx.rounds, len(ctx.clients)))
    for r, cohort in enumerate(ctx.view.cohorts):
        participation[r, list(cohort)] = 1.0
    results = [A.trivial_result("participation", "server", ctx.truth, ctx.prior, rounds=ctx.rounds,
                                note=f"{', '.join(sorted(registries))}: learned by the clients only; frequencies "
                                     "alone do not name categories")]
    colluder = ctx.clients[0]
    sums = [r for r in ctx.client_view(colluder).reads if r.statistic in registries and r.owner is None]
    if not sums:
        return results
    registry = sums[-1]
    categories = _slot_distributions(ctx, registry.statistic, registry.round, colluder, len(registry.values))
    chosen = _chosen_slots(participation, registry.values, ctx.settings.clients_per_round)
    guesses = {c: categories.get(chosen[j], ctx.prior) for j, c in enumerate(ctx.clients)}
    results.append(A.score("participation", _coalition(1), guesses, ctx.truth, ctx.prior, rounds=ctx.rounds,
                           note=f"frequencies over {ctx.rounds} rounds matched to {registry.statistic} read by "
                                f"client {colluder}; {len(categories)} slots placed by the selection's half"))
    return results


def _chosen_slots(participation: FloatArray, registry_sum: FloatArray, k: int) -> dict[int, int]:
    """Eq. 6 inverted: the slot whose size is closest to K / (frequency · ‖R_A‖₀)."""
    nonzero = np.flatnonzero(registry_sum > 0)
    freq = participation.mean(axis=0)
    out = {}
    for j, f in enumerate(freq):
        size = k / (f * max(len(nonzero), 1)) if f > 0 else float(registry_sum[nonzero].max(initial=1.0))
        out[j] = int(nonzero[np.argmin(np.abs(registry_sum[nonzero] - size))]) if len(nonzero) else 0
    return out


def _slot_distributions(ctx: CellContext, registry: str, round: int, colluder: int, slots: int
                        ) -> dict[int, FloatArray]:
    """Mean label distribution of hypothesised clients per registry slot, as the selection's
    client half (having heard the announcements the colluder heard) registers them."""
    heard = [(name, r, vector) for (r, client), vectors in sorted(ctx.view.broadcasts.items())
             if client == colluder and r <= round for name, vector in vectors.items()]
    half = ctx.model.selection_half(heard=heard)
    c = len(ctx.prior)
    rng = np.random.default_rng(ctx.settings.seed)
    hypotheses = [np.eye(c)[k] * 40 + 1 for k in range(c)] + [rng.dirichlet(np.full(c, 0.5)) * 50 for _ in range(200)]
    found: dict[int, list[FloatArray]] = defaultdict(list)
    for counts in hypotheses:
        vector = _placed(ctx, registry, np.rint(counts), round, half)
        if vector is not None and vector.size == slots and vector.any():
            found[int(np.argmax(vector))].append(A.distribution(np.rint(counts)))
    return {slot: np.mean(rows, axis=0) for slot, rows in found.items()}


def _placed(ctx: CellContext, registry: str, counts: FloatArray, round: int, half: Any) -> FloatArray | None:
    try:
        return ctx.model.contribution(registry, counts, round=round, selection=half)
    except Exception:  # noqa: BLE001 -- the half cannot place this hypothesis
        return None


ATTACKS: tuple[Callable[[CellContext], list[A.AttackResult]], ...] = (
    attack_direct_read,
    attack_collusion_read,
    attack_update_inference,
    attack_ratio_monitor,
    attack_disaggregation,
    attack_sample_counts,
    attack_sample_means,
    attack_participation,
)
