"""The embedded engine: the server loop and every client node in one process, over a LocalNetwork.

:class:`Simulation` builds one :class:`~secure_fl.runtime.node.ClientNode` per client and the
:class:`~secure_fl.runtime.server.ServerLoop`, attaches the nodes to a
:class:`~protocols.LocalNetwork` and plays rounds. The parties share nothing but bytes on that
network; the engine itself is the simulator's harness — it may look at every party (to
checkpoint the nodes' snapshots, which in a deployment each node keeps on its own machine, and
to report telemetry no party sends: the clients' training loss, their DP-SGD ε, the method's
:meth:`~secure_fl.algorithms.Method.simulator_telemetry`), and says so where it does.

Clients train together (``clients="vectorised"``, the default) through a
:class:`~secure_fl.runtime.pool.ClientPool` shared by the nodes — client-side compute like their
shared trainer — where the model, loss and privacy settings allow it; otherwise, and with
``clients="loop"``, one after another (the fall-back is logged once, with its reason). Before any
node answers an exchange, the engine lets every node take the exchange's runtime messages
(:meth:`~secure_fl.runtime.node.ClientNode.begin`), so a round's whole cohort is pending in the pool
when the first node needs its update. The client path changes nothing a run computes beyond float
rounding.

Every random draw comes from :class:`~secure_fl.runtime.rng.Seeds` keyed by round and client,
so the same config and seed give the same metrics, resumed or not. :meth:`Simulation.checkpoint`
/ :meth:`Simulation.restore` serialise everything a resumed run needs: the server's state and
each node's snapshot.
"""

from __future__ import annotations

import copy
import json
import logging
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import nn

from protocols import SERVER, Directory, Identity, LocalNetwork, Transcript
from secure_fl.algorithms import ClientData, HeldOut, LocalTrainer, LocalTraining, Method, RunInfo
from secure_fl.algorithms.base import SIMULATOR_TELEMETRY_PREFIX, check_round_metrics
from secure_fl.losses import Loss
from secure_fl.privacy import MODEL, RUN, formal_guarantees
from secure_fl.runtime.node import ClientNode
from secure_fl.runtime.pool import ClientPool
from secure_fl.runtime.rng import Seeds
from secure_fl.runtime.server import Mailbox, ServerLoop
from secure_fl.selection.strategy import SelectionStrategy
from secure_fl.snapshots import dump_state, load_state
from secure_fl.stats import Release, StatisticsPlan
from secure_fl.stats.coordinator import StatsCoordinator
from secure_fl.stats.updates import UpdateSum
from secure_fl.store import Checkpoint, RoundPrivacy

if TYPE_CHECKING:
    from secure_fl.privacy.dpsgd import DPSGDConfig

__all__ = ["CLIENT_PATHS", "RoundResult", "Simulation", "dump_state", "load_state"]

log = logging.getLogger("secure_fl.run")

CLIENT_PATHS = ("vectorised", "loop")


@dataclass(frozen=True)
class RoundResult:
    """What one round did (metrics come from :meth:`Simulation.evaluate`)."""

    round: int
    selected: tuple[int, ...]
    train_loss: float
    """Sample-weighted mean of the cohort's local losses: simulator telemetry (no party sends it)."""
    clipped: int
    seconds: float
    metrics: dict[str, float | None] = field(default_factory=dict)
    privacy: dict[str, RoundPrivacy] = field(default_factory=dict)
    refusals: tuple[str, ...] = ()
    telemetry: dict[str, float | None] = field(default_factory=dict)
    """Simulator telemetry of the method (:meth:`~secure_fl.algorithms.Method.simulator_telemetry`,
    scored against every client's data), names prefixed ``sim.``: stored beside ``metrics``."""
    releases: tuple[Release, ...] = ()
    """The statistic releases since the previous round (round 0's include the set-up's)."""


class Simulation:
    """A federated run in one process, one round at a time (see the module docstring)."""

    def __init__(
        self,
        *,
        clients: Mapping[int, ClientData],
        x_test: torch.Tensor,
        y_test: torch.Tensor,
        num_classes: int,
        model: nn.Module,
        method: Method,
        loss: Loss,
        selection: SelectionStrategy,
        training: LocalTraining,
        clients_per_round: int,
        plan: StatisticsPlan,
        seeds: Seeds,
        device: torch.device,
        rounds: int,
        digest: bytes = bytes(16),
        minority_classes: Sequence[int] = (),
        eval_batch_size: int = 1024,
        dp_sgd: DPSGDConfig | None = None,
        privacy_delta: float | None = None,
        holdout: HeldOut | None = None,
        network: LocalNetwork | None = None,
        clients_path: str = "vectorised",
        pool_memory: int | None = None,
        authenticate: bool = False,
    ) -> None:
        ids = sorted(clients)
        if ids != list(range(len(ids))):
            raise ValueError("client ids must be 0 .. N-1")
        if plan.updates is None:
            raise ValueError("the statistics plan needs update settings")
        self.num_clients = len(ids)
        self.num_classes = num_classes
        self.method = method
        self.training = training
        self.seeds = seeds
        self.device = device
        self.plan = plan
        trainer = LocalTrainer(model, training=training, loss=loss)
        if plan.updates.dimension != trainer.layout.dimension:
            raise ValueError(f"update sum sized {plan.updates.dimension}, model has {trainer.layout.dimension} entries")
        self.info = RunInfo(num_clients=self.num_clients, num_classes=num_classes,
                            dimension=trainer.layout.dimension, rounds=rounds, training=training,
                            updates=plan.updates)
        self.network = network if network is not None else LocalNetwork()
        self.dp_sgd_config = dp_sgd
        if dp_sgd is not None:
            from secure_fl.privacy.dpsgd import DPSGD

            DPSGD.validate(model)
            if not dp_sgd.secure_mode:
                from secure_fl.privacy import InsecureRandomWarning

                warnings.warn("DP-SGD with secure_mode = false: batches and noise come from seeded, "
                              "non-cryptographic generators (tests and experiments only)",
                              InsecureRandomWarning, stacklevel=2)
        self.privacy_delta = privacy_delta if privacy_delta is not None else (
            dp_sgd.delta if dp_sgd is not None else 1e-5)
        if clients_path not in CLIENT_PATHS:
            raise ValueError(f"clients_path must be one of {CLIENT_PATHS}, got {clients_path!r}")
        self.pool = self._pool(trainer, clients_path, dp_sgd=dp_sgd is not None, memory=pool_memory)
        noise_seed = plan.privacy.client_noise_seed if plan.privacy is not None else None
        extra = selection.sessions()
        self.nodes: dict[int, ClientNode] = {}
        for cid in ids:
            node = ClientNode(
                data=clients[cid], method=method.client(self.info), plan=plan, info=self.info, trainer=trainer,
                seeds=seeds, digest=digest, selection=selection.client(num_classes=num_classes), dp_sgd=dp_sgd,
                extra_sessions=extra, noise_seed=noise_seed, pool=self.pool, authenticate=authenticate)
            self.nodes[cid] = node
            self.network.attach(cid, node.handle)
        if self.pool is not None:
            self.network.before_handlers = self._begin
        mailbox = Mailbox(self.network)
        stats = StatsCoordinator(plan, mailbox)
        for (protocol, tag), options in extra.items():
            stats.add_session(protocol, tag, options)
        if authenticate:
            self._register(stats)
        server_model = copy.deepcopy(model)
        self.server = ServerLoop(
            info=self.info, method=method.server(self.info), selection=selection, stats=stats,
            updates=UpdateSum(stats, plan.updates, device=device), mailbox=mailbox,
            model=LocalTrainer(server_model, training=training, loss=loss), x_test=x_test, y_test=y_test,
            seeds=seeds, device=device, digest=digest, clients_per_round=clients_per_round,
            minority_classes=minority_classes, eval_batch_size=eval_batch_size, holdout=holdout,
        )
        self._released = 0
        self.on_client: Callable[[int, int, int], None] | None = None
        """Progress hook (round, clients done, clients selected), called as the cohort's updates arrive."""

    def _register(self, stats: StatsCoordinator) -> None:
        """Harness, playing a deployment's registration step (a PKI): each party made its own
        signing key; the public halves go into one registry every party gets before the run."""
        server = Identity(SERVER)
        keys = {cid: node.identity.public_bytes for cid, node in self.nodes.items() if node.identity is not None}
        directory = Directory({**keys, SERVER: server.public_bytes})
        for node in self.nodes.values():
            node.register(directory)
        stats.register(server, directory)

    @staticmethod
    def _pool(trainer: LocalTrainer, path: str, *, dp_sgd: bool, memory: int | None) -> ClientPool | None:
        """The nodes' shared pool, or ``None`` (the loop) — said once when ``vectorised`` cannot apply."""
        if path == "loop":
            return None
        reason = "DP-SGD clips per-sample gradients client by client" if dp_sgd else None
        if reason is None:
            try:
                return ClientPool(trainer, memory_budget=memory)
            except ValueError as error:
                reason = str(error)
        log.warning("clients = 'vectorised' does not apply (%s): clients train one after another", reason)
        return None

    def _begin(self, inboxes: Mapping[int, list[bytes]]) -> None:
        """Harness: every node takes the runtime messages at the head of its inbox before any node
        answers (so the pool sees the round's whole cohort); then the network hands out the inboxes."""
        for party, inbox in inboxes.items():
            node = self.nodes.get(party)
            if node is not None:
                node.begin(inbox)

    # --- what the runner and reports read ----------------------------------------------------

    @property
    def stats(self) -> StatsCoordinator:
        return self.server.stats

    @property
    def selection(self) -> SelectionStrategy:
        return self.server.selection

    @property
    def transcript(self) -> Transcript:
        return self.network.transcript

    @property
    def next_round(self) -> int:
        return self.server.next_round

    @property
    def global_vector(self) -> torch.Tensor:
        return self.server.global_vector

    @property
    def dimension(self) -> int:
        return self.info.dimension

    @property
    def class_counts(self) -> dict[int, np.ndarray]:
        """Every client's label counts, read from the nodes: the harness's knowledge, no party's."""
        return {cid: np.asarray(node.data.class_counts, dtype=np.int64) for cid, node in self.nodes.items()}

    @property
    def dp_enabled(self) -> bool:
        return self.dp_sgd_config is not None or self.stats.ledger is not None

    # --- rounds --------------------------------------------------------------------------------

    def setup(self) -> None:
        """The server's once-per-run set-up (again after a restore: once-per-run releases are
        answered from the checkpoint, not summed again)."""
        self.server.setup()

    def run_round(self) -> RoundResult:
        outcome = self.server.run_round()
        for cid in outcome.selected:  # a node that answered nothing after training still settles
            self.nodes[cid].settle()
        releases = tuple(self.stats.records[self._released:])
        self._released = len(self.stats.records)
        # Simulator telemetry: the cohort's training losses, read from the nodes (no party sends them).
        trained = [self.nodes[c].telemetry for c in outcome.selected if self.nodes[c].telemetry.round == outcome.round]
        samples = sum(t.num_samples for t in trained)
        train_loss = sum(t.loss * t.num_samples for t in trained) / max(samples, 1)
        if self.on_client is not None:
            self.on_client(outcome.round, len(trained), len(outcome.selected))
        # Simulator telemetry: the method scores its server half against every client's data.
        scored = self.method.simulator_telemetry(self.server.method, round=outcome.round, cohort=outcome.selected,
                                                 class_counts=self.class_counts)
        telemetry = {SIMULATOR_TELEMETRY_PREFIX + name: value for name, value in check_round_metrics(
            scored, source=f"simulator telemetry of method {self.method.name!r}").items()}
        return RoundResult(round=outcome.round, selected=outcome.selected, train_loss=train_loss,
                           clipped=outcome.clipped, seconds=outcome.seconds, metrics=outcome.metrics,
                           privacy=self.privacy_report() if self.dp_enabled else {}, refusals=outcome.refusals,
                           telemetry=telemetry, releases=releases)

    def evaluate(self) -> dict[str, Any]:
        return self.server.evaluate()

    # --- privacy (the harness's report) ----------------------------------------------------

    def dp_sgd_states(self) -> dict[int, Any]:
        """Each client's DP-SGD accountant, for clients that have trained (read from the nodes)."""
        return {cid: node.dp_state() for cid, node in self.nodes.items() if node.dp_state().steps}

    def privacy_report(self) -> dict[str, RoundPrivacy]:
        """Privacy spent so far: ``"model"`` (DP-SGD: largest and mean client ε — simulator
        telemetry from the nodes' accountants), one entry per noised statistic (the server's
        ledger) and ``"run"`` (everything composed at :meth:`run_delta`)."""
        out: dict[str, RoundPrivacy] = {}
        states = self.dp_sgd_states()
        worst: int | None = None
        cfg = self.dp_sgd_config
        if cfg is not None:
            eps = {cid: state.epsilon(cfg.delta) for cid, state in states.items()}
            if eps:
                worst = max(sorted(eps), key=lambda c: eps[c])
                out[MODEL] = RoundPrivacy(epsilon=eps[worst], delta=cfg.delta,
                                          epsilon_mean=sum(eps.values()) / len(eps), releases=states[worst].steps)
            else:
                out[MODEL] = RoundPrivacy(epsilon=0.0, delta=cfg.delta, epsilon_mean=0.0, releases=0)
        ledger = self.stats.ledger
        if ledger is not None:
            for name in ledger.statistics():
                noisy = self.stats.noisy.get(name)
                delta = noisy.config.delta if noisy is not None else self.privacy_delta
                g = ledger.guarantee(delta, statistic=name)
                out[name] = RoundPrivacy(epsilon=g.epsilon, delta=g.delta, releases=g.releases)
            model = {worst: states[worst]} if worst is not None else None
            total = formal_guarantees(ledger, delta=self.run_delta(), model=model).get(RUN)
            if total is not None:
                out[RUN] = RoundPrivacy(epsilon=total.epsilon, delta=total.delta, releases=total.releases)
        return out

    def run_delta(self) -> float:
        """The δ of the run's one ε (:meth:`StatsCoordinator.run_delta`; :attr:`privacy_delta`
        when no statistic is noised)."""
        return self.stats.run_delta(fallback=self.privacy_delta)

    def privacy_guarantees(self, delta: float | None = None) -> dict[str, Any]:
        """The audit's view: ``formal_guarantees`` of the ledger and the DP-SGD states so far."""
        states = self.dp_sgd_states()
        return formal_guarantees(self.stats.ledger, delta=delta or self.privacy_delta, model=states or None)

    # --- checkpoints ---------------------------------------------------------------------------

    def checkpoint(self) -> Checkpoint:
        """Everything a resumed run needs after the last finished round: the server's state and
        the snapshot of every node whose state changed since the last checkpoint."""
        if self.next_round == 0:
            raise RuntimeError("no round finished yet")
        state = self.server.state()
        return Checkpoint(
            round=self.next_round - 1,
            model=dump_state({"global": state["global"], "other": state["other"]}),
            algorithm=dump_state(state["method"]),
            selection=dump_state(state["selection"]),
            clients={cid: node.snapshot() for cid, node in sorted(self.nodes.items()) if node.dirty},
            privacy=json.dumps(state["stats"], sort_keys=True).encode(),
        )

    def prepare_resume(self, checkpoint: Checkpoint) -> None:
        """Before :meth:`setup` on a resume: the server's statistics state (ledger, once-per-run
        releases) and the nodes' snapshots, so that set-up is answered, not redone."""
        if checkpoint.privacy:
            self.stats.load_state(json.loads(checkpoint.privacy.decode()))
        for cid, blob in checkpoint.clients.items():
            self.nodes[cid].restore(blob)

    def restore(self, checkpoint: Checkpoint) -> None:
        """Continue after ``checkpoint.round`` (call :meth:`prepare_resume` and :meth:`setup` first)."""
        model = load_state(checkpoint.model, device=self.device)
        self.server.restore_model(model["global"], model["other"], checkpoint.round)
        self.server.method.load_state_dict(load_state(checkpoint.algorithm, device=self.device))
        self.server.selection.load_state_dict(load_state(checkpoint.selection, device=self.device))
