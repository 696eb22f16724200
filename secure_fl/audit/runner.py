"""One audit cell: run a method under a protocol on demo-sized data, then attack what each party got.

:func:`audit_cell` builds a run through the runtime (:func:`secure_fl.runtime.build_simulation`),
plays its rounds while a :class:`RunTap` records what the clients put into every sum and what
came out (the runtime computes the sums; the tap only watches), builds the
:class:`~secure_fl.audit.ledger.Ledger` from the run's transcript, and runs every applicable
attack on what the ledger says each party can read:

* a value the server reads in the clear (its ledger row is ``clear``) is attacked as that
  client's own value;
* a value the server only holds as part of a sum (``aggregate``) is attacked as that sum —
  the inference then describes the whole round, and every participant gets the round's guess;
* what the server cannot read (``ciphertext``, ``masked``) is not used at all.

The attacks know the public training recipe, the global models (the server made them) and a
small auxiliary set drawn from the test split (Ratio Loss's monitor assumes such data), never
a client's data; the truth is used only to score them.
"""

from __future__ import annotations

import time
import traceback
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from protocols import SERVER
from secure_fl.audit import attacks as A
from secure_fl.audit.ledger import Ledger, LedgerSummary, build_ledger
from secure_fl.audit.probe import OutputLayerProbe, auxiliary_set
from secure_fl.audit.settings import (
    DEFAULT_METHODS,
    DEFAULT_PROTOCOLS,
    LABEL_STATISTIC_HINTS,
    METHOD_LOSS,
    MODEL_UPDATE,
    SAMPLE_COUNT_STATISTICS,
    SELECTION_METHODS,
    TOTAL_SAMPLES,
    AuditSettings,
)

__all__ = [
    "DEFAULT_METHODS",
    "DEFAULT_PROTOCOLS",
    "AuditSettings",
    "CellResult",
    "RunTap",
    "audit_cell",
    "method_available",
    "run_config",
]

@dataclass
class CellResult:
    """The audit of one method × protocol cell."""

    method: str
    protocol: str
    status: str
    """``ok``, ``not available`` (the method is not in the registry yet) or ``failed``."""
    reason: str = ""
    summary: LedgerSummary | None = None
    attacks: list[A.AttackResult] = field(default_factory=list)
    seconds: float = 0.0
    party_bytes: dict[str, dict[str, int]] = field(default_factory=dict)
    exposures: list[dict[str, Any]] = field(default_factory=list)
    """The ledger per party, round, statistic and kind (:meth:`Ledger.exposures`)."""
    notes: list[str] = field(default_factory=list)
    dp: list[dict[str, Any]] = field(default_factory=list)

    @property
    def max_advantage(self) -> float | None:
        """Largest advantage of any attack by the server alone (honest-but-curious, no collusion)."""
        values = [a.advantage for a in self.attacks if a.advantage is not None and a.party == "server"]
        return max(values) if values else None

    @property
    def max_advantage_with_collusion(self) -> float | None:
        """Largest advantage of any attack, coalitions of the server with clients included."""
        values = [a.advantage for a in self.attacks if a.advantage is not None]
        return max(values) if values else None

    def as_json(self) -> dict[str, Any]:
        s = self.summary
        return {
            "method": self.method,
            "protocol": self.protocol,
            "status": self.status,
            "reason": self.reason,
            "server_plaintext_bytes_per_client": None if s is None else s.server_plaintext_bytes_per_client,
            "k_min": None if s is None else s.k_min,
            "k_min_effective": None if s is None else s.k_min_effective,
            "collusion_threshold": None if s is None else s.collusion_threshold,
            "protocol_collusion_threshold": None if s is None else s.protocol_collusion_threshold,
            "max_advantage": self.max_advantage,
            "max_advantage_with_collusion": self.max_advantage_with_collusion,
            "attacks": [a.as_dict() for a in self.attacks],
            "flags": [] if s is None else list(s.flags),
            "notes": list(self.notes),
            "ledger": None if s is None else s.as_dict(),
            "party_bytes": self.party_bytes,
            "dp": list(self.dp),
            "exposures": list(self.exposures),
            "seconds": round(self.seconds, 3),
        }


# --- configuration -------------------------------------------------------------------------------

def method_available(method: str) -> tuple[bool, str]:
    """Is ``method`` (a registry name, or ``dubhe``) runnable here? (False, why) if not."""
    from secure_fl.algorithms import ALGORITHMS

    base, selection = SELECTION_METHODS.get(method, (method, None))
    if base not in ALGORITHMS:
        return False, f"method {base!r} is not in the algorithm registry yet"
    if selection is not None:
        from secure_fl.runtime.selection import selection_class

        try:
            selection_class(selection)
        except ValueError:
            return False, f"selection {selection!r} is not in the selection registry yet"
    return True, ""


def _protocol_options(protocol: str, settings: AuditSettings, keyholder: str) -> dict[str, dict[str, Any]]:
    if protocol == "paillier":
        return {"paillier": {"key_bits": settings.key_bits, "keyholder": keyholder,
                             "allow_weak_keys": settings.key_bits < 2048}}
    if protocol == "ckks":
        return {"ckks": {"keyholder": "all" if keyholder == "all" else "agent"}}
    if protocol in ("masking", "secagg+") and settings.masking_threshold is not None:
        return {protocol: {"threshold": settings.masking_threshold}}
    return {}


def _method_params(base: str, settings: AuditSettings) -> dict[str, Any]:
    return dict(settings.method_params.get(base, {}))


def run_config(method: str, protocol: str, settings: AuditSettings, *, keyholder: str | None = None) -> Any:
    """The :class:`~secure_fl.config.RunConfig` of one cell: every statistic and the model
    updates go through ``protocol``."""
    from secure_fl.config import RunConfig

    base, selection = SELECTION_METHODS.get(method, (method, "random"))
    selection_params = dict(settings.selection_params.get(method, {}))
    if selection == "dubhe":  # Dubhe's own Paillier session uses the audit's key size too
        selection_params.setdefault("key_bits", settings.key_bits)
        selection_params.setdefault("allow_weak_keys", settings.key_bits < 2048)
    raw: dict[str, Any] = {
        "name": f"audit-{method}-{protocol}",
        "seed": settings.seed,
        "data": {"dataset": settings.dataset, "num_clients": settings.num_clients,
                 "partition": settings.partition, "partition_params": dict(settings.partition_params)},
        "model": {"name": "mlp", "hidden": list(settings.hidden)},
        "train": {"rounds": settings.rounds, "clients_per_round": settings.clients_per_round,
                  "local_epochs": settings.local_epochs, "batch_size": settings.batch_size,
                  "lr": settings.lr, "momentum": settings.momentum, "weight_decay": 0.0,
                  "lr_decay": 1.0, "lr_decay_every": 1},
        "method": {"name": base, **_method_params(base, settings)},
        "loss": {"name": METHOD_LOSS.get(base, "ce")},
        "selection": {"name": selection, **selection_params},
        "secure": {"protocol": protocol, "update_protocol": protocol,
                   "update_frac_bits": settings.update_frac_bits, "update_clip": settings.update_clip,
                   **_protocol_options(protocol, settings, keyholder or settings.keyholder)},
    }
    if settings.train_samples is not None:
        raw["data"]["train_samples"] = settings.train_samples
    if settings.privacy:
        raw["privacy"] = dict(settings.privacy)
    return RunConfig.from_dict(raw)


# --- the tap -------------------------------------------------------------------------------------

@dataclass
class StatRecord:
    name: str
    round: int
    inputs: dict[int, np.ndarray]
    total: np.ndarray


@dataclass
class UpdateRecord:
    statistic: str
    round: int
    vectors: dict[int, torch.Tensor]
    total: torch.Tensor


class RunTap:
    """Watches a :class:`~secure_fl.runtime.Simulation`: inputs and results of every sum, the
    global model before each round and the selected clients. It wraps the run's statistics
    service and update sum on the instance (their modules are untouched) and changes nothing."""

    def __init__(self, sim: Any) -> None:
        self.sim = sim
        self.stats: list[StatRecord] = []
        self.updates: list[UpdateRecord] = []
        self.globals: list[torch.Tensor] = [sim.global_vector.detach().clone()]
        self.selected: list[tuple[int, ...]] = []
        stats_request = sim.stats.request
        update_sum = sim.updates.sum

        def request(declaration: Any, inputs: Mapping[int, Any], *, round: int, **kw: Any) -> Any:
            total = stats_request(declaration, inputs, round=round, **kw)
            self.stats.append(StatRecord(
                declaration.name, round,
                {int(c): np.asarray(v, dtype=np.float64).reshape(-1).copy() for c, v in inputs.items()},
                np.asarray(total, dtype=np.float64).copy(),
            ))
            return total

        def summed(vectors: Mapping[int, torch.Tensor], *, statistic: str, round: int) -> torch.Tensor:
            total: torch.Tensor = update_sum(vectors, statistic=statistic, round=round)
            self.updates.append(UpdateRecord(
                statistic, round, {int(c): v.detach().clone() for c, v in vectors.items()}, total.detach().clone(),
            ))
            return total

        sim.stats.request = request
        sim.updates.sum = summed

    def run(self, rounds: int) -> None:
        while self.sim.next_round < rounds:
            result = self.sim.run_round()
            self.selected.append(tuple(result.selected))
            self.globals.append(self.sim.global_vector.detach().clone())

    def stat(self, name: str, round: int | None = None) -> list[StatRecord]:
        return [s for s in self.stats if s.name == name and (round is None or s.round == round)]

    def update(self, round: int, statistic: str = MODEL_UPDATE) -> UpdateRecord | None:
        for u in self.updates:
            if u.round == round and u.statistic == statistic:
                return u
        return None


# --- the cell ------------------------------------------------------------------------------------

@dataclass
class _Context:
    """What every attack of one cell needs."""

    sim: Any
    tap: RunTap
    ledger: Ledger
    truth: dict[int, np.ndarray]
    prior: np.ndarray
    probe: OutputLayerProbe
    settings: AuditSettings
    method: str

    @property
    def rounds(self) -> int:
        return len(self.tap.selected)

    def participation(self) -> np.ndarray:
        matrix = np.zeros((self.rounds, len(self.truth)))
        for r, selected in enumerate(self.tap.selected):
            matrix[r, list(selected)] = 1.0
        return matrix

    def step(self, round: int) -> float:
        t = self.sim.training
        return float(t.lr_at(round) * t.epochs / t.batch_size)

    def server_learns(self, statistic: str, round: int) -> bool:
        return any(run.round == round and run.statistic == statistic and SERVER in run.learners
                   for run in self.ledger.runs)

    def server_reads(self, statistic: str, client: int, round: int) -> bool:
        return self.ledger.server_reads_individually(statistic, client, round)

    def round_total(self, round: int) -> float | None:
        """Σ|D_i| of the round if the server learns it (a weighted mean's denominator, the monitor's N)."""
        for name in SAMPLE_COUNT_STATISTICS:
            for rec in self.tap.stat(name, round):
                if self.server_learns(name, round):
                    return float(rec.total.reshape(-1)[0])
        return None

    def weights_by_size(self) -> bool:
        """Do clients scale their update by |D_i| / Σ|D_j| (FedAvg's weighted mean)?"""
        return any(self.tap.stat(TOTAL_SAMPLES))

    def client_size(self, client: int, round: int) -> float | None:
        for name in SAMPLE_COUNT_STATISTICS:
            for rec in self.tap.stat(name, round):
                if client in rec.inputs and self.server_reads(name, client, round):
                    return float(rec.inputs[client][0])
        return None

    def class_weight(self, round: int) -> np.ndarray | None:
        """Per-class loss weights the round's clients trained with, as the server knows them
        (Ratio Loss: α + β·Ra_p from the ℝ it broadcast)."""
        algorithm = self.sim.algorithm
        if getattr(algorithm, "name", "") != "ratio_loss":
            return None
        entry = next((h for h in getattr(algorithm, "history", []) if h.get("round") == round), None)
        if entry is None or not entry.get("mitigating") or not entry.get("ratios"):
            return None
        loss = self.sim.trainer.loss
        weights = loss.class_weights(torch.as_tensor(entry["ratios"], dtype=torch.float32))
        return np.asarray(weights.detach().cpu().numpy(), dtype=np.float64)


def _first_rounds(tap: RunTap) -> dict[int, int]:
    first: dict[int, int] = {}
    for r, selected in enumerate(tap.selected):
        for c in selected:
            first.setdefault(c, r)
    return first


def _is_label_statistic(ctx: _Context, rec: StatRecord) -> bool:
    if rec.name == MODEL_UPDATE or not rec.inputs:
        return False
    if any(h in rec.name for h in LABEL_STATISTIC_HINTS):
        return True
    for c, v in rec.inputs.items():
        t = ctx.truth[c].astype(np.float64)
        if v.shape != t.shape or not np.allclose(A.distribution(v), A.distribution(t), atol=1e-6):
            return False
    return True


def attack_direct_read(ctx: _Context) -> list[A.AttackResult]:
    """Label counts (or a statistic equal to them up to scale) the server reads in the clear."""
    inferred: dict[int, np.ndarray] = {}
    names: set[str] = set()
    for rec in ctx.tap.stats:
        if not _is_label_statistic(ctx, rec) or _noised(ctx, rec.name):
            continue
        for c, v in rec.inputs.items():
            if ctx.server_reads(rec.name, c, rec.round) and c not in inferred:
                inferred[c] = v
                names.add(rec.name)
    if not inferred:
        return []
    return [A.score("direct_read", "server", inferred, ctx.truth, ctx.prior, counts=True,
                    note=f"reads {', '.join(sorted(names))} in the clear")]


def attack_collusion_read(ctx: _Context) -> list[A.AttackResult]:
    """Label counts a client uploaded encrypted or masked, read by the smallest coalition that can.

    A ciphertext under a key some client holds (Paillier/CKKS ``agent`` or ``all``) opens for
    the server plus that one client; a masked input opens for the server plus ``t`` clients
    holding its Shamir shares. The attack is the decryption itself: it yields the plaintext,
    i.e. the client's label counts (taken from the sum's recorded input, or — for sums run
    outside the statistics service, such as Dubhe's own session — from the client's counts,
    which is what those ciphertexts encrypt)."""
    by_statistic: dict[str, dict[int, int]] = defaultdict(dict)  # statistic -> client -> coalition size
    thresholds = {run.run_id: run.threshold for run in ctx.ledger.runs}
    for row in ctx.ledger.rows:
        if row.party != "server" or row.kind not in ("ciphertext", "masked") or row.owner is None:
            continue
        if not any(h in row.statistic for h in LABEL_STATISTIC_HINTS) or _noised(ctx, row.statistic):
            continue
        client = int(row.owner.split("-")[1])
        t = thresholds.get(row.run_id)
        size = 1 if row.kind == "ciphertext" else (t if t is not None else ctx.settings.num_clients)
        known = by_statistic[row.statistic].get(client)
        by_statistic[row.statistic][client] = size if known is None else min(known, size)
    results = []
    for statistic, coalition in sorted(by_statistic.items()):
        recorded = {c: v for rec in ctx.tap.stat(statistic) for c, v in rec.inputs.items()}
        inferred = {c: recorded.get(c, ctx.truth[c]) for c in coalition}
        size = max(coalition.values())
        party = f"server+{size} client{'s' if size != 1 else ''}"
        results.append(A.score("collusion_read", party, inferred, ctx.truth, ctx.prior, counts=True,
                               note=f"{statistic}: each client's upload opens for the server with {size} "
                                    f"colluding client{'s' if size != 1 else ''}"))
    return results


def _update_estimate(ctx: _Context, round: int, client: int | None) -> np.ndarray | None:
    """Counts behind a client's update (client given) or the round's sum of updates, as the server reads them.

    Against FedShift the attacker knows the method: clients trained on logits shifted by
    ``ln(P_i/P)``, ``P`` being the prior the server learned. For one client's update it
    alternates between estimating the counts and recomputing the signatures under the shift
    those counts imply (five passes)."""
    rec = ctx.tap.update(round)
    if rec is None:
        return None
    start, end = ctx.tap.globals[round], ctx.tap.globals[round + 1]
    total = ctx.round_total(round) if ctx.weights_by_size() else None
    weight = ctx.class_weight(round)
    if client is None:
        signatures = ctx.probe.signatures([start, end], class_weight=weight)
        m = A.composition_from_update(ctx.probe.output_part(rec.total), signatures, step=ctx.step(round))
        # The sum of scaled updates is Σ_i (|D_i|/N) n_i: times N, a sum over the round's clients
        # (a uniform mean, Σ_i n_i / K, is a sum up to the public factor K).
        return m * total if total is not None else m
    vector = ctx.probe.output_part(rec.vectors[client])
    known = ctx.client_size(client, round)
    size = None if known is None else int(np.rint(known))
    shift_of = _shift_model(ctx)
    shift = None
    estimate = None
    for _ in range(5 if shift_of is not None else 1):
        signatures = ctx.probe.signatures([start, end], logit_shift=shift, class_weight=weight)
        estimate = A.label_counts_from_update(vector, signatures, step=ctx.step(round), num_samples=size,
                                              scaled_by_total=total)
        if shift_of is None:
            break
        shift = shift_of(estimate)
    return estimate


def _shift_model(ctx: _Context) -> Any:
    """FedShift: counts -> the logit shift the client trained with (None for other methods)."""
    algorithm = ctx.sim.algorithm
    prior = getattr(algorithm, "prior", None)
    if getattr(algorithm, "name", "") != "fedshift" or prior is None:
        return None
    from secure_fl.algorithms.fedshift import classifier_shift

    smoothing = float(getattr(algorithm.params, "smoothing", 1.0))

    def shift(counts: np.ndarray) -> torch.Tensor:
        c = np.clip(np.asarray(counts, dtype=np.float64), 0.0, None)
        return torch.as_tensor(classifier_shift(c, prior, smoothing), dtype=torch.float32)

    return shift


def attack_update_inference(ctx: _Context) -> list[A.AttackResult]:
    """Label counts from the model update of a client's first round (RLU/iLRG-style least squares)."""
    if not ctx.tap.updates:
        return []
    inferred: dict[int, np.ndarray] = {}
    individual = aggregate = 0
    counts_known = True
    for c, r in _first_rounds(ctx.tap).items():
        if ctx.server_reads(MODEL_UPDATE, c, r):
            est = _update_estimate(ctx, r, c)
            individual += 1
            counts_known &= ctx.round_total(r) is not None
        elif ctx.server_learns(MODEL_UPDATE, r):
            est = _update_estimate(ctx, r, None)
            aggregate += 1
            counts_known = False
        else:
            est = ctx.prior.astype(np.float64)
            counts_known = False
        if est is not None:
            inferred[c] = est
    if individual:
        note = f"{individual} clients' own updates read in the clear"
    elif aggregate:
        note = "only the round's sum of updates is readable: every participant gets the round's composition"
    else:
        note = "no update readable: the trivial guess"
    return [A.score("update_label_counts", "server", inferred, ctx.truth, ctx.prior,
                    counts=counts_known and individual > 0 and aggregate == 0, rounds=1, note=note)]


def _monitor_estimate(ctx: _Context, round: int) -> np.ndarray:
    """The round's composition by Ratio Loss's monitor: the method's own estimate when it runs
    one (what its server computed), else the same estimator on this run's global models."""
    history = getattr(ctx.sim.algorithm, "history", None)
    if getattr(ctx.sim.algorithm, "name", "") == "ratio_loss" and history:
        entry = next((h for h in history if h.get("round") == round), None)
        if entry is not None:
            return np.asarray(entry["estimate"], dtype=np.float64)
    start, end = ctx.tap.globals[round], ctx.tap.globals[round + 1]
    selected = ctx.tap.selected[round]
    total = ctx.round_total(round)
    if total is None:  # the monitor needs Σ|D_j|; without it assume the mean client size is public
        total = float(np.mean([ctx.truth[c].sum() for c in ctx.truth])) * len(selected)
    lr = ctx.sim.training.lr_at(round) * ctx.sim.training.epochs
    updates = ctx.probe.class_updates(start, lr=lr, batch_size=ctx.sim.training.batch_size)
    weight = ctx.class_weight(round)
    if weight is not None:
        updates = updates * weight[:, None, None]
    delta = ctx.probe.weight_part(end - start)
    return A.ratio_monitor_composition(updates, delta, aux_counts=ctx.probe.aux_counts,
                                       total_samples=total, clients=len(selected),
                                       calibrate=ctx.weights_by_size())


def attack_ratio_monitor(ctx: _Context) -> list[A.AttackResult]:
    """Ratio Loss's monitor (Eq. 6–7) on the public global models: each round's composition,
    taken as the guess for every participant of the round (single round)."""
    inferred = {c: _monitor_estimate(ctx, r) for c, r in _first_rounds(ctx.tap).items()}
    k = ctx.settings.clients_per_round
    note = ("the monitor reads only global models: no protocol hides it; "
            f"a round mixes {k} client{'s' if k != 1 else ''}")
    return [A.score("ratio_loss_monitor", "server", inferred, ctx.truth, ctx.prior, rounds=1, note=note)]


def _label_sums_per_round(ctx: _Context) -> tuple[str, list[tuple[int, tuple[int, ...], np.ndarray]]]:
    """(source, [(round, contributors, sum of label counts)]) the server can form each round.

    Exact sums when a label statistic is summed per round and the server learns it; otherwise
    estimates from the round's sum of model updates (|D_i|-weighted counts)."""
    exact: list[tuple[int, tuple[int, ...], np.ndarray]] = []
    for rec in ctx.tap.stats:
        if _is_label_statistic(ctx, rec) and ctx.server_learns(rec.name, rec.round):
            exact.append((rec.round, tuple(sorted(rec.inputs)), rec.total))
    if len({e[1] for e in exact}) > 1:
        return "exact label sums", exact
    estimated = []
    for r, selected in enumerate(ctx.tap.selected):
        if ctx.server_learns(MODEL_UPDATE, r):
            est = _update_estimate(ctx, r, None)
            if est is not None:
                estimated.append((r, tuple(selected), est))
    return "update sums", estimated


def attack_disaggregation(ctx: _Context) -> list[A.AttackResult]:
    """Multi-round: least squares over the participation matrix of per-round label sums."""
    first = _first_rounds(ctx.tap)
    participants = sorted(first)
    if not participants:
        return []
    individually = [c for c in participants
                    if any(ctx.server_reads(MODEL_UPDATE, c, r) for r, s in enumerate(ctx.tap.selected) if c in s)]
    if individually and len(individually) == len(participants):
        # Clear updates: average each client's per-round estimates.
        inferred: dict[int, np.ndarray] = {}
        for c in participants:
            ests = [A.distribution(_update_estimate(ctx, r, c))  # type: ignore[arg-type]
                    for r, s in enumerate(ctx.tap.selected) if c in s]
            inferred[c] = np.mean(ests, axis=0)
        return [A.score("disaggregation", "server", inferred, ctx.truth, ctx.prior,
                        recoverable_fraction=len(participants) / len(ctx.truth), rounds=ctx.rounds,
                        note="updates read individually: per-client estimates averaged over rounds")]
    source, sums = _label_sums_per_round(ctx)
    if not sums:
        return []
    weighted = source == "update sums" and ctx.weights_by_size()
    if source == "update sums" and not weighted:
        # A uniform mean Σ_i n_i / K: times the public K, a plain sum of counts.
        sums = [(r, contributors, s * len(contributors)) for r, contributors, s in sums]
    index = {c: j for j, c in enumerate(sorted(ctx.truth))}
    matrix = np.zeros((len(sums), len(index)))
    for i, (_, contributors, _) in enumerate(sums):
        matrix[i, [index[c] for c in contributors]] = 1.0
    values = np.stack([s for _, _, s in sums])
    # Each client's row sums to |D_i| (|D_i|^2 for |D_i|-weighted sums) where the server knows it.
    sizes = _sizes(ctx)
    totals = np.full(len(index), np.nan)
    for c, n in (sizes.exact() if sizes is not None else {}).items():
        totals[index[c]] = n * n if weighted else n
    x, recoverable = A.disaggregate(matrix, values, row_totals=totals)
    seen = [c for c in sorted(ctx.truth) if matrix[:, index[c]].any()]
    inferred = {c: x[index[c]] for c in seen}
    fraction = float(np.mean([recoverable[index[c]] for c in ctx.truth]))
    return [A.score("disaggregation", "server", inferred, ctx.truth, ctx.prior,
                    recoverable_fraction=fraction, rounds=len(sums),
                    note=f"{round(fraction * len(ctx.truth))}/{len(ctx.truth)} clients recoverable "
                         f"from {len(sums)} {source} over varying participant sets")]


@dataclass
class _Sizes:
    """What the server knows of each |D_i|: read in the clear, or isolated from round sums."""

    estimate: dict[int, float]
    direct: set[int]
    differenced: set[int]
    rounds: int
    statistic: str

    def exact(self) -> dict[int, float]:
        return {c: v for c, v in self.estimate.items() if c in self.direct or c in self.differenced}


def _sizes(ctx: _Context) -> _Sizes | None:
    name = next((n for n in SAMPLE_COUNT_STATISTICS if ctx.tap.stat(n)), None)
    if name is None:
        return None
    recs = [r for r in ctx.tap.stat(name) if ctx.server_learns(name, r.round)]
    clients = sorted(ctx.truth)
    index = {c: j for j, c in enumerate(clients)}
    direct = {c: float(rec.inputs[c][0]) for rec in ctx.tap.stat(name) for c in rec.inputs
              if ctx.server_reads(name, c, rec.round)}
    if not recs and not direct:
        return None
    matrix = np.zeros((len(recs), len(clients)))
    for i, rec in enumerate(recs):
        matrix[i, [index[c] for c in rec.inputs]] = 1.0
    estimate = dict(direct)
    differenced: set[int] = set()
    if recs:
        sums = np.array([[rec.total.reshape(-1)[0]] for rec in recs])
        x, recoverable = A.disaggregate(matrix, sums)
        for c in clients:
            if c not in direct and matrix[:, index[c]].any():
                estimate[c] = float(x[index[c], 0])
                if recoverable[index[c]]:
                    differenced.add(c)
    return _Sizes(estimate, set(direct), differenced, max(len(recs), 1), name)


def attack_sample_counts(ctx: _Context) -> list[A.AttackResult]:
    """|D_i| read in the clear, or recovered from the round sums of the sample-count statistic."""
    sizes = _sizes(ctx)
    if sizes is None:
        return []
    clients = sorted(ctx.truth)
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
        note=f"|D_i| of {known}/{len(clients)} clients: " + ", ".join(parts)
             + (" (the sums carry distributed-DP noise)" if _noised(ctx, sizes.statistic) else ""),
    )]


def attack_climb_losses(ctx: _Context) -> list[A.AttackResult]:
    """CLIMB: a client's loss values under the global models against per-class aux losses."""
    loss_stats = [rec for rec in ctx.tap.stats if "loss" in rec.name and rec.total.size == 1]
    if not loss_stats:
        return []
    per_client: dict[int, list[tuple[int, float]]] = defaultdict(list)
    aggregates: list[tuple[int, tuple[int, ...], float]] = []
    for rec in loss_stats:
        for c, v in rec.inputs.items():
            if ctx.server_reads(rec.name, c, rec.round):
                per_client[c].append((rec.round, float(v[0])))
        if ctx.server_learns(rec.name, rec.round):
            aggregates.append((rec.round, tuple(sorted(rec.inputs)), float(rec.total[0])))
    class_losses = {}

    def losses_at(r: int) -> np.ndarray:
        if r not in class_losses:
            r_model = min(max(r, 0), len(ctx.tap.globals) - 1)
            class_losses[r] = ctx.probe.class_losses(ctx.tap.globals[r_model])
        return class_losses[r]

    inferred: dict[int, np.ndarray] = {}
    if per_client:
        for c, values in per_client.items():
            f = np.array([v for _, v in values])
            lc = np.stack([losses_at(r) for r, _ in values])
            inferred[c] = A.climb_loss_inference(f, lc, prior=ctx.prior)
        note = f"loss values of {len(per_client)} clients read in the clear over {ctx.rounds} rounds"
    elif aggregates:
        for r, contributors, total in aggregates:
            est = A.climb_loss_inference(np.array([total / len(contributors)]), losses_at(r)[None, :],
                                         prior=ctx.prior)
            for c in contributors:
                inferred.setdefault(c, est)
        note = "only round sums of losses readable: each participant gets its first round's estimate"
    else:
        return []
    return [A.score("climb_losses", "server", inferred, ctx.truth, ctx.prior, rounds=ctx.rounds, note=note)]


def attack_dubhe_participation(ctx: _Context) -> list[A.AttackResult]:
    """Dubhe: participation frequencies (public to the server) against the registry sum R_A.

    R_A is decrypted by the clients only, so the server alone cannot name a client's category
    (it falls back to P(y)); every client knows R_A, so a server colluding with any one client
    (the cell's collusion threshold of 1) runs the attack in full."""
    strategy = ctx.sim.selection
    if getattr(strategy, "name", "") != "dubhe":
        return []
    selector = getattr(strategy, "selector", strategy)
    codebook = getattr(selector, "codebook", None)
    overall = getattr(selector, "overall", None)
    if codebook is None or overall is None:
        return [A.trivial_result("dubhe_participation", "server", ctx.truth, ctx.prior, rounds=ctx.rounds,
                                 note="the selection exposes no registry codebook; trivial guess")]
    categories = codebook.categories() if callable(codebook.categories) else codebook.categories
    sigma = dict(getattr(selector, "sigma", None) or {})
    participation = ctx.participation()
    server_reads_sum = any(
        SERVER in run.learners for run in ctx.ledger.runs if "registry" in run.statistic)
    results = []
    parties = [("server", overall if server_reads_sum else None)]
    if not server_reads_sum:
        parties.append(("server+1 client", overall))
    for party, registry_sum in parties:
        inferred, _ = A.dubhe_frequency_inference(
            participation, clients_per_round=ctx.settings.clients_per_round, registry_sum=registry_sum,
            categories=categories, prior=ctx.prior, thresholds=sigma,
        )
        note = (f"participation frequency over {ctx.rounds} rounds matched to R_A" if registry_sum is not None
                else "R_A is decrypted by the clients only: frequencies alone do not name categories")
        results.append(A.score("dubhe_participation", party, inferred, ctx.truth, ctx.prior, rounds=ctx.rounds,
                               note=note))
    return results


ATTACKS = (
    attack_direct_read,
    attack_collusion_read,
    attack_update_inference,
    attack_ratio_monitor,
    attack_disaggregation,
    attack_sample_counts,
    attack_climb_losses,
    attack_dubhe_participation,
)


def _dp_guarantees(sim: Any) -> list[dict[str, Any]]:
    """The formal (ε, δ) the run spent, per noised statistic, for the model (DP-SGD) and overall."""
    if not getattr(sim, "dp_enabled", False) or not hasattr(sim, "privacy_report"):
        return []
    return [{"scope": scope, "epsilon": p.epsilon, "delta": p.delta, "epsilon_mean": p.epsilon_mean,
             "releases": p.releases} for scope, p in sim.privacy_report().items()]


def _noised(ctx: _Context, statistic: str) -> bool:
    """Is ``statistic`` released with distributed DP? Its inputs as recorded are then not what
    a reader of an individual upload sees (the noise is added client-side), so reads of it are
    not scored."""
    return statistic in getattr(ctx.sim.stats, "noisy", {})


def _static_statistics(tap: RunTap) -> set[str]:
    """Statistics whose every client sent the same value in every round it took part."""
    values: dict[str, dict[int, np.ndarray]] = defaultdict(dict)
    changing: set[str] = set()
    for rec in tap.stats:
        for c, v in rec.inputs.items():
            seen = values[rec.name].get(c)
            if seen is None:
                values[rec.name][c] = v
            elif seen.shape != v.shape or not np.array_equal(seen, v):
                changing.add(rec.name)
    for update in tap.updates:
        changing.add(update.statistic)
    return set(values) - changing


def _party_bytes(ledger: Ledger) -> dict[str, dict[str, int]]:
    """Bytes each party received, by kind; HE key-holding agents are marked."""
    agents = {row.party for row in ledger.rows if row.role == "agent"}
    table: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for row in ledger.rows:
        if row.bytes:
            name = f"{row.party} (agent)" if row.party in agents else row.party
            table[name][row.kind] += row.bytes
    return {p: dict(v) for p, v in table.items()}


def audit_cell(method: str, protocol: str, settings: AuditSettings, *, dataset: Any = None) -> CellResult:
    """Run and audit one cell; a method that is not registered yet is reported, not raised."""
    ok, why = method_available(method)
    if not ok:
        return CellResult(method, protocol, "not available", why)
    start = time.perf_counter()
    threads = torch.get_num_threads()
    torch.set_num_threads(max(settings.torch_threads, 1))  # tiny models: one thread is fastest
    try:
        return _audit_cell(method, protocol, settings, dataset=dataset, start=start)
    finally:
        torch.set_num_threads(threads)


def _audit_cell(method: str, protocol: str, settings: AuditSettings, *, dataset: Any, start: float) -> CellResult:
    notes: list[str] = []
    try:
        try:
            sim, tap = _run(method, protocol, settings, dataset=dataset, keyholder=None)
        except ValueError as error:
            if "keyholder" not in str(error) or protocol not in ("paillier", "ckks"):
                raise
            notes.append(f"keyholder='all': {error}")
            sim, tap = _run(method, protocol, settings, dataset=dataset, keyholder="all")
        ledger = build_ledger(sim.stats.transcript, clients=range(settings.num_clients),
                              protocol_options=_protocol_options(
                                  protocol, settings, "all" if notes else settings.keyholder))
        truth = {c: np.asarray(d.class_counts, dtype=np.float64) for c, d in sim.clients.items()}
        prior = np.sum(list(truth.values()), axis=0)
        aux_x, aux_y = auxiliary_set(sim.x_test, sim.y_test, per_class=settings.aux_per_class,
                                     num_classes=sim.num_classes, rng=np.random.default_rng(settings.seed))
        probe = OutputLayerProbe(sim.model, sim.layout, aux_x=aux_x, aux_y=aux_y, num_classes=sim.num_classes)
        ctx = _Context(sim=sim, tap=tap, ledger=ledger, truth=truth, prior=prior, probe=probe,
                       settings=settings, method=method)
        results: list[A.AttackResult] = []
        for attack in ATTACKS:
            try:
                results.extend(attack(ctx))
            except Exception as error:  # noqa: BLE001 -- one failing attack must not hide the others
                notes.append(f"{attack.__name__} failed: {type(error).__name__}: {error}")
        return CellResult(method, protocol, "ok", summary=ledger.summary(static=_static_statistics(tap)),
                          attacks=results, dp=_dp_guarantees(sim),
                          seconds=time.perf_counter() - start, party_bytes=_party_bytes(ledger),
                          exposures=ledger.exposures(), notes=notes)
    except Exception as error:  # noqa: BLE001 -- a failing cell is reported, the matrix goes on
        return CellResult(method, protocol, "failed", f"{type(error).__name__}: {error}",
                          seconds=time.perf_counter() - start,
                          notes=notes + [traceback.format_exc(limit=4)])


def _run(method: str, protocol: str, settings: AuditSettings, *, dataset: Any, keyholder: str | None
         ) -> tuple[Any, RunTap]:
    from secure_fl.runtime import build_simulation

    config = run_config(method, protocol, settings, keyholder=keyholder)
    sim = build_simulation(config, device=torch.device("cpu"), dataset=dataset)
    tap = RunTap(sim)
    sim.setup()
    tap.run(settings.rounds)
    return sim, tap


def load_dataset_for(settings: AuditSettings) -> Any:
    """The dataset every cell shares (loaded once)."""
    from secure_fl.runtime import load_run_dataset

    return load_run_dataset(run_config("fedavg", "plain", settings))

