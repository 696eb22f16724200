"""One audit cell: run a method under a protocol on demo-sized data, then attack what each party got.

:func:`audit_cell` builds a run through the runtime (:func:`secure_fl.runtime.build_simulation`),
puts a :class:`~secure_fl.audit.tap.NetworkTap` on its network (the parties get the same bytes;
nothing of the simulation is replaced) and plays its rounds. Then:

* the :class:`~secure_fl.audit.ledger.Ledger` is built from the tapped messages;
* the server's view (:mod:`secure_fl.audit.views`) is what it received, read with the protocols'
  own parsers, plus what it computed — its releases, the global models, the cohorts;
* the method model (:mod:`secure_fl.audit.knowledge`) is the method's own client half, built by
  the attacker from the public method and fed the releases the clients learned;
* every attack (:mod:`secure_fl.audit.inference`) runs on exactly that.

The truth (every client's label counts, read from the simulated nodes' data) only scores.
"""

from __future__ import annotations

import time
import traceback
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from protocols import descriptor
from secure_fl.audit import attacks as A
from secure_fl.audit.context import CellContext
from secure_fl.audit.inference import ATTACKS
from secure_fl.audit.knowledge import MethodModel
from secure_fl.audit.ledger import Ledger, LedgerSummary, build_ledger
from secure_fl.audit.probe import OutputLayerProbe, auxiliary_set
from secure_fl.audit.settings import (
    DEFAULT_METHODS,
    DEFAULT_PROTOCOLS,
    METHOD_LOSS,
    SELECTION_METHODS,
    AuditSettings,
)
from secure_fl.audit.tap import NetworkTap, Tapped
from secure_fl.audit.views import PartyView, ServerView, client_view, server_view

__all__ = [
    "DEFAULT_METHODS",
    "DEFAULT_PROTOCOLS",
    "AuditSettings",
    "CellResult",
    "audit_cell",
    "load_dataset_for",
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
    mitigation: str = "none"
    epsilon: float | None = None
    """The run's composed ε per client (the accountant's ``run`` entry); ``None``: no formal bound (∞)."""
    epsilon_delta: float | None = None
    """The δ of :attr:`epsilon`: the sum of the noised statistics' δ (each charges its own failures)."""
    tail_accuracy: float | None = None
    """Mean test accuracy of the global model over the run's last ``tail_rounds`` rounds."""
    accuracy_delta: float | None = None
    """``tail_accuracy`` minus that of the same method × protocol without mitigation (set by the report)."""
    selection_cost: dict[str, Any] = field(default_factory=dict)
    """What the mitigation cost the selection: refusals, fallback rounds, distinct participant sets."""
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
            "mitigation": self.mitigation,
            "status": self.status,
            "reason": self.reason,
            "epsilon": self.epsilon,
            "epsilon_delta": self.epsilon_delta,
            "utility": {"tail_accuracy": self.tail_accuracy, "delta": self.accuracy_delta},
            "selection_cost": dict(self.selection_cost),
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
    """Is ``method`` (a registry name, or a selection on top of one) runnable here? (False, why) if not."""
    from secure_fl.algorithms import ALGORITHMS

    base, selection = SELECTION_METHODS.get(method, (method, None))
    if base not in ALGORITHMS:
        return False, f"method {base!r} is not in the algorithm registry yet"
    if selection is not None:
        from secure_fl.runtime.selection import selection_class

        try:
            selection_class(selection)
        except (ValueError, ImportError) as error:
            return False, f"selection {selection!r} is not available yet ({type(error).__name__}: {error})"
    return True, ""


def protocol_options(protocol: str, settings: AuditSettings, *, clients_only: bool = False
                     ) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """``{protocol: options}`` of a cell, and notes on settings the protocol does not accept
    (e.g. ``keyholder="server"`` where the protocol has no server-held key: its default then)."""
    d = descriptor(protocol)
    options = settings.options_for(protocol, clients_only=clients_only)
    explicit = {**settings.protocol_options.get(protocol, {}),
                **(settings.clients_only_options.get(protocol, {}) if clients_only else {})}
    notes: list[str] = []
    for name in sorted(set(options) - set(explicit)):
        try:
            d.options(**{name: options[name]})
        except ValueError as error:
            notes.append(f"{protocol}: {name}={options[name]!r} not accepted ({error}); the protocol's default")
            del options[name]
    return ({protocol: options} if options else {}), notes


def run_config(method: str, protocol: str, settings: AuditSettings, *, clients_only: bool = False,
               mitigation: str = "none") -> Any:
    """The :class:`~secure_fl.config.RunConfig` of one cell: every statistic and the model
    updates go through ``protocol`` (with the options for statistics only clients may learn
    when ``clients_only``)."""
    from secure_fl.config import RunConfig

    base, selection = SELECTION_METHODS.get(method, (method, "random"))
    selection_params = dict(settings.selection_params.get(method, {}))
    options, _ = protocol_options(protocol, settings, clients_only=clients_only)
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
        "method": {"name": base, **dict(settings.method_params.get(base, {}))},
        "loss": {"name": METHOD_LOSS.get(base, "ce")},
        "selection": {"name": selection, **selection_params},
        "secure": {"protocol": protocol, "update_protocol": protocol,
                   "update_frac_bits": settings.update_frac_bits, "update_clip": settings.update_clip, **options},
    }
    if settings.train_samples is not None:
        raw["data"]["train_samples"] = settings.train_samples
    if settings.privacy:
        raw["privacy"] = dict(settings.privacy)
    if mitigation != "none":
        raw["mitigation"] = settings.mitigation_table(mitigation)
        raw["name"] = f"{raw['name']}-{mitigation}"
    return RunConfig.from_dict(raw)


def load_dataset_for(settings: AuditSettings) -> Any:
    """The dataset every cell shares (loaded once)."""
    from secure_fl.runtime import load_run_dataset

    return load_run_dataset(run_config("fedavg", "plain", settings))


# --- the cell ------------------------------------------------------------------------------------

def audit_cell(method: str, protocol: str, settings: AuditSettings, *, dataset: Any = None,
               mitigation: str = "none") -> CellResult:
    """Run and audit one cell; a method that is not registered yet is reported, not raised."""
    ok, why = method_available(method)
    if not ok:
        return CellResult(method, protocol, "not available", why, mitigation=mitigation)
    start = time.perf_counter()
    threads = torch.get_num_threads()
    torch.set_num_threads(max(settings.torch_threads, 1))  # tiny models: one thread is fastest
    notes: list[str] = []
    try:
        return _audit_cell(method, protocol, settings, dataset=dataset, start=start, notes=notes,
                           mitigation=mitigation)
    except Exception as error:  # noqa: BLE001 -- a failing cell is reported, the matrix goes on
        return CellResult(method, protocol, "failed", f"{type(error).__name__}: {error}", mitigation=mitigation,
                          seconds=time.perf_counter() - start, notes=notes + [traceback.format_exc(limit=4)])
    finally:
        torch.set_num_threads(threads)


@dataclass
class _Run:
    """A finished run as the audit holds it: the simulation, what crossed its network, what
    the server computed."""

    sim: Any
    messages: list[Tapped]
    releases: list[Any]
    models: list[torch.Tensor]
    cohorts: list[tuple[int, ...]]
    accuracy: list[float] = field(default_factory=list)
    """Test accuracy of the global model after each of the last rounds (the server's own test set)."""
    refusals: int = 0


def _build(method: str, protocol: str, settings: AuditSettings, *, dataset: Any, clients_only: bool,
           mitigation: str = "none") -> Any:
    from secure_fl.runtime import build_simulation

    config = run_config(method, protocol, settings, clients_only=clients_only, mitigation=mitigation)
    return build_simulation(config, device=torch.device("cpu"), dataset=dataset)


def _run(sim: Any, rounds: int, *, tail: int = 0) -> _Run:
    """Play the run with a tap on its network; the server's releases, models and cohorts as it
    made them, and the accuracy of the last ``tail`` global models."""
    tap = NetworkTap.on(sim.network)
    sim.setup()
    models = [sim.global_vector.detach().clone()]
    releases: list[Any] = []
    cohorts: list[tuple[int, ...]] = []
    accuracy: list[float] = []
    refusals = 0
    while sim.next_round < rounds:
        result = sim.run_round()
        cohorts.append(tuple(result.selected))
        releases.extend(result.releases)
        refusals += len(result.refusals) + sum(len(r.dropouts) for r in result.releases)
        models.append(sim.global_vector.detach().clone())
        if result.round >= rounds - tail:
            value = sim.evaluate().get("accuracy")
            accuracy.append(float("nan") if value is None else float(value))
    return _Run(sim, tap.messages, releases, models, cohorts, accuracy, refusals)


def _method_model(sim: Any) -> MethodModel:
    """The attacker's copy of the method's client half (public method, run info, model and loss)."""
    server = sim.server
    return MethodModel.of(sim.method, sim.selection, sim.info, model=server.model.model, loss=server.model.loss,
                          input_shape=tuple(server.x_test.shape[1:]), device=torch.device("cpu"))


def needs_clients_only(model: MethodModel, protocol: str, plan: Any, own_sessions: bool) -> bool:
    """Does a statistic only clients may learn go through ``protocol``, whose sums the server does
    not learn by construction (so clients must hold its key)? From the declarations and the
    descriptor; a selection with sessions of its own sums its statistics there."""
    if descriptor(protocol).server_learns_sum:
        return False
    declarations = model.half.declarations() if own_sessions else model.declarations
    return any(not d.reveal.server and plan.protocol_for(d) == protocol for d in declarations.values())


def _audit_cell(method: str, protocol: str, settings: AuditSettings, *, dataset: Any, start: float,
                notes: list[str], mitigation: str = "none") -> CellResult:
    notes.extend(protocol_options(protocol, settings)[1])
    sim = _build(method, protocol, settings, dataset=dataset, clients_only=False, mitigation=mitigation)
    model = _method_model(sim)
    if needs_clients_only(model, protocol, sim.plan, bool(sim.selection.sessions())):
        options = settings.clients_only_options.get(protocol, {})
        notes.append(f"a statistic only clients may learn goes through {protocol}: options {dict(options)}")
        sim = _build(method, protocol, settings, dataset=dataset, clients_only=True, mitigation=mitigation)
        model = _method_model(sim)
    run = _run(sim, settings.rounds, tail=min(settings.tail_rounds, settings.rounds))
    clients = tuple(range(settings.num_clients))
    ledger = build_ledger(run.messages, clients=clients)
    lengths = {name: d.length for name, d in model.declarations.items()}
    stats = sim.stats

    def session(protocol: str, tag: str) -> Any:
        return stats.session(protocol, tag)  # the server's own keys, where it holds any

    view = server_view(run.messages, clients=clients, lengths=lengths, session=session, releases=run.releases,
                       models=run.models, cohorts=run.cohorts)
    ctx = _context(run, view, ledger, model, settings)
    results: list[A.AttackResult] = []
    for attack in ATTACKS:
        try:
            results.extend(attack(ctx))
        except Exception as error:  # noqa: BLE001 -- one failing attack must not hide the others
            notes.append(f"{attack.__name__} failed: {type(error).__name__}: {error}")
    static = {n for n in model.declarations if model.count_map(n) is not None}
    dp = _dp_guarantees(sim)
    epsilon, epsilon_delta = _run_epsilon(sim)
    tail = [a for a in run.accuracy if np.isfinite(a)]
    cost: dict[str, Any] = {"refusals": run.refusals, "distinct_sets": len(set(run.cohorts)),
                            "fallbacks": int(getattr(sim.selection, "fallbacks", 0))}
    return CellResult(method, protocol, "ok", summary=ledger.summary(static=static), attacks=results,
                      dp=dp, seconds=time.perf_counter() - start, mitigation=mitigation, epsilon=epsilon,
                      epsilon_delta=epsilon_delta,
                      tail_accuracy=float(np.mean(tail)) if tail else None, selection_cost=cost,
                      party_bytes=_party_bytes(ledger), exposures=ledger.exposures(), notes=notes)


def _context(run: _Run, view: ServerView, ledger: Ledger, model: MethodModel, settings: AuditSettings
             ) -> CellContext:
    sim, server = run.sim, run.sim.server
    truth = {c: np.asarray(v, dtype=np.float64) for c, v in sim.class_counts.items()}  # scoring only
    prior = np.sum(list(truth.values()), axis=0)
    aux_x, aux_y = auxiliary_set(server.x_test, server.y_test, per_class=settings.aux_per_class,
                                 num_classes=sim.num_classes, rng=np.random.default_rng(settings.seed))
    # The attacker's copy of the public model serves the probe too (each use loads its own weights).
    probe = OutputLayerProbe(model.trainer.model, model.trainer.layout, aux_x=aux_x, aux_y=aux_y,
                             num_classes=sim.num_classes)
    lengths = {name: d.length for name, d in model.declarations.items()}
    views: dict[int, PartyView] = {}

    def view_of(client: int) -> PartyView:
        if client not in views:
            sessions = sim.nodes[client].participant.sessions  # the colluding client's own keys

            def session(protocol: str, tag: str) -> Any:
                return sessions.get((protocol, tag) if tag else protocol)

            views[client] = client_view(client, run.messages, clients=tuple(range(settings.num_clients)),
                                        lengths=lengths, session=session)
        return views[client]

    return CellContext(view=view, ledger=ledger, model=model, probe=probe, settings=settings, truth=truth,
                       prior=prior, client_view=view_of)


def _dp_guarantees(sim: Any) -> list[dict[str, Any]]:
    """The formal (ε, δ) the run spent, per noised statistic, for the model (DP-SGD) and overall."""
    if not sim.dp_enabled:
        return []
    return [{"scope": scope, "epsilon": p.epsilon, "delta": p.delta, "epsilon_mean": p.epsilon_mean,
             "releases": p.releases} for scope, p in sim.privacy_report().items()]


def _run_epsilon(sim: Any) -> tuple[float | None, float | None]:
    """One ε per client for the whole run: every release of every noised statistic composed by the
    accountant (RDP, with the worst client's DP-SGD where it trains with it), at δ = the sum of the
    statistics' δ — each statistic's calibration charges up to its own δ for sampler and tail
    failures, so composing three at one statistic's δ would be vacuous. ``(None, None)``: no DP."""
    from secure_fl.privacy.ledger import RUN, formal_guarantees

    ledger = sim.stats.ledger
    if not sim.dp_enabled or ledger is None or not ledger.releases:
        return None, None
    delta = float(sim.run_delta())
    states = sim.dp_sgd_states()
    worst = None
    if states and sim.dp_sgd_config is not None:
        cid = max(sorted(states), key=lambda c: states[c].epsilon(sim.dp_sgd_config.delta))
        worst = {cid: states[cid]}
    run = formal_guarantees(ledger, delta=delta, model=worst).get(RUN)
    if run is None or not np.isfinite(run.epsilon):
        return None, delta
    return float(run.epsilon), delta


def _party_bytes(ledger: Ledger) -> dict[str, dict[str, int]]:
    """Bytes each party received, by kind; HE key-holding agents are marked."""
    agents = {row.party for row in ledger.rows if row.role == "agent"}
    table: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for row in ledger.rows:
        if row.bytes:
            name = f"{row.party} (agent)" if row.party in agents else row.party
            table[name][row.kind] += row.bytes
    return {p: dict(v) for p, v in table.items()}

