"""The server's side of a run on a Flower engine: the same :class:`~secure_fl.runtime.server.ServerLoop`
as the embedded engine, over a :class:`~secure_fl.flower.network.FlowerNetwork`.

:class:`FlowerServer` has the surface the runner drives (:func:`secure_fl.runtime.execute_run`
with ``harness=``): set-up, rounds, evaluation, checkpoints. Unlike the embedded harness it
holds no client node — the nodes are other processes — so it reports only what the server
knows: no cohort training loss (stored as missing), no DP-SGD ε of the clients (each node's
own), no simulator telemetry scored against the clients' data. In their place each round
stores the network's cost under ``net.`` names: round trips, Flower wire bytes against the
transcript's bytes, seconds per stage, and the clients that dropped (``net.dropout.<id>``).

The server loads the dataset for its own test set and, like the embedded build, the training
samples no client holds (the held-out set Ratio Loss's monitor scores); it never reads a
client's partition for anything else.
"""

from __future__ import annotations

import copy
import json
import math
import secrets
from collections.abc import Callable
from typing import Any

import torch
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from protocols import SERVER, Directory, Identity
from secure_fl.algorithms import LocalTrainer, RunInfo, make_algorithm
from secure_fl.algorithms.base import check_round_metrics
from secure_fl.config import RunConfig
from secure_fl.data import Dataset
from secure_fl.losses import make_loss
from secure_fl.privacy import RUN, formal_guarantees
from secure_fl.runtime.build import (
    held_out,
    initial_model,
    local_training,
    prepare_partition,
    statistics_plan,
)
from secure_fl.runtime.messages import run_digest
from secure_fl.runtime.mitigation import mitigated_selection, run_privacy
from secure_fl.runtime.rng import Seeds
from secure_fl.runtime.server import Mailbox, ServerLoop
from secure_fl.runtime.simulation import RoundResult
from secure_fl.selection import make_selection
from secure_fl.snapshots import dump_state, load_state
from secure_fl.stats import StatisticsPlan
from secure_fl.stats.coordinator import StatsCoordinator
from secure_fl.stats.noise import DEFAULT_STATISTIC
from secure_fl.stats.updates import UpdateSum
from secure_fl.store import Checkpoint, RoundPrivacy, StoreError

from .network import FlowerNetwork, StageRecord

__all__ = ["NET_PREFIX", "FlowerServer", "round_network_metrics"]

NET_PREFIX = "net."


def round_network_metrics(stages: list[StageRecord], dropped: set[int]) -> dict[str, float | None]:
    """One round's network cost as ``net.*`` metrics (see the module docstring)."""
    out: dict[str, float | None] = {
        "net.round_trips": float(len(stages)),
        "net.wire_bytes": float(sum(s.wire_bytes for s in stages)),
        "net.transcript_bytes": float(sum(s.transcript_bytes for s in stages)),
        "net.seconds": sum(s.seconds for s in stages),
        "net.dropouts": float(len(dropped)),
    }
    for s in stages:
        for name, value in (("seconds", s.seconds), ("wire_bytes", float(s.wire_bytes))):
            key = f"net.stage.{s.stage}.{name}"
            out[key] = (out.get(key) or 0.0) + value
    for party in sorted(dropped):
        out[f"net.dropout.{party}"] = 1.0
    return out


class FlowerServer:
    """The runner's harness for a Flower engine (see the module docstring)."""

    def __init__(self, config: RunConfig, *, network: FlowerNetwork, device: torch.device, dataset: Dataset,
                 resumed: int = -1) -> None:
        self.config = config
        self.resumed = resumed
        """The round whose state the nodes were told to restore at the hello (-1: a fresh start)."""
        self.network = network
        self.device = device
        _, indices = prepare_partition(config, dataset)
        model = initial_model(config, dataset, device=device)
        training = local_training(config)
        trainer = LocalTrainer(copy.deepcopy(model), training=training,
                               loss=make_loss(config.loss.name, config.loss.params))
        selection = make_selection(config.selection.name, config.selection.params)
        privacy = config.privacy
        noised = run_privacy(config)
        self.plan: StatisticsPlan = statistics_plan(config, selection, dimension=trainer.layout.dimension,
                                                    privacy=noised)
        selection = mitigated_selection(selection, self.plan.policy)
        assert self.plan.updates is not None
        self.method = make_algorithm(config.method.name, config.method.params)
        self.info = RunInfo(num_clients=config.data.num_clients, num_classes=dataset.num_classes,
                            dimension=trainer.layout.dimension, rounds=config.train.rounds, training=training,
                            updates=self.plan.updates)
        mailbox = Mailbox(network)
        stats = StatsCoordinator(self.plan, mailbox)
        for (protocol, tag), options in selection.sessions().items():
            stats.add_session(protocol, tag, options)
        if config.secure.authenticate:
            self._register(stats)
        self.privacy_delta = privacy.reporting_delta if privacy.enabled else (
            noised.statistics[DEFAULT_STATISTIC].delta if noised is not None else 1e-5)
        self.server = ServerLoop(
            info=self.info, method=self.method.server(self.info), selection=selection, stats=stats,
            updates=UpdateSum(stats, self.plan.updates, device=device), mailbox=mailbox, model=trainer,
            x_test=torch.from_numpy(dataset.x_test).to(device), y_test=torch.from_numpy(dataset.y_test).to(device),
            seeds=Seeds(config.seed), device=device, digest=run_digest(config.to_dict()),
            clients_per_round=config.train.clients_per_round, minority_classes=config.data.minority_classes,
            eval_batch_size=config.train.eval_batch_size, holdout=held_out(dataset, indices),
        )
        self._released = 0
        self._stages = 0
        self._dropouts = 0
        self.on_client: Callable[[int, int, int], None] | None = None

    def _register(self, stats: StatsCoordinator) -> None:
        """The registration step over Flower messages (``authenticate``): each node made its own
        signing key and sent the public half in its hello reply; the server makes its own, registers
        the directory of all of them with its coordinator and sends it to every node (one round
        trip). The server distributes the keys: an active server could substitute them unless they
        are pinned out of band (docs/threat-model.md)."""
        first = self.resumed + 1
        keys: dict[int, bytes] = {}
        for party in range(self.config.data.num_clients):
            key = self.network.keys.get(party)
            if party in self.network.gone:
                continue
            try:
                if key is None:
                    raise ValueError("it sent no signing key")
                Directory({party: key})
            except ValueError as error:
                self.network.exclude(party, f"registration: {error}", round=first, stage="hello")
                continue
            keys[party] = key
        server = Identity(SERVER, Ed25519PrivateKey.from_private_bytes(secrets.token_bytes(32)))
        directory = Directory({**keys, SERVER: server.public_bytes})
        stats.register(server, directory)
        self.network.register(dict(directory.items()), round=first)

    # --- what the runner reads -----------------------------------------------------------------

    @property
    def stats(self) -> StatsCoordinator:
        return self.server.stats

    @property
    def transcript(self) -> Any:
        return self.network.transcript

    @property
    def next_round(self) -> int:
        return self.server.next_round

    # --- rounds ----------------------------------------------------------------------------------

    def setup(self) -> None:
        self.server.setup()

    def run_round(self) -> RoundResult:
        outcome = self.server.run_round()
        releases = tuple(self.stats.records[self._released:])
        self._released = len(self.stats.records)
        stages = self.network.stages[self._stages:]
        self._stages = len(self.network.stages)
        dropouts = self.network.dropouts[self._dropouts:]
        self._dropouts = len(self.network.dropouts)
        if self.on_client is not None:
            self.on_client(outcome.round, len(outcome.selected), len(outcome.selected))
        telemetry = check_round_metrics(round_network_metrics(stages, {d.party for d in dropouts}),
                                        source="the Flower network")
        return RoundResult(round=outcome.round, selected=outcome.selected, train_loss=math.nan,
                           clipped=outcome.clipped, seconds=outcome.seconds, metrics=outcome.metrics,
                           privacy=self.privacy_report() if self.stats.ledger is not None else {},
                           refusals=outcome.refusals, telemetry=telemetry, releases=releases)

    def evaluate(self) -> dict[str, Any]:
        return self.server.evaluate()

    def privacy_report(self) -> dict[str, RoundPrivacy]:
        """The noised statistics' privacy (the server's ledger); the clients' DP-SGD ε stays on the nodes."""
        out: dict[str, RoundPrivacy] = {}
        ledger = self.stats.ledger
        if ledger is None:
            return out
        for name in ledger.statistics():
            noisy = self.stats.noisy.get(name)
            delta = noisy.config.delta if noisy is not None else self.privacy_delta
            g = ledger.guarantee(delta, statistic=name)
            out[name] = RoundPrivacy(epsilon=g.epsilon, delta=g.delta, releases=g.releases)
        total = formal_guarantees(ledger, delta=self.stats.run_delta(fallback=self.privacy_delta)).get(RUN)
        if total is not None:
            out[RUN] = RoundPrivacy(epsilon=total.epsilon, delta=total.delta, releases=total.releases)
        return out

    # --- checkpoints -----------------------------------------------------------------------------

    def checkpoint(self) -> Checkpoint:
        """The server's state after the last finished round (the nodes keep their own)."""
        state = self.server.state()
        return Checkpoint(
            round=self.next_round - 1,
            model=dump_state({"global": state["global"], "other": state["other"]}),
            algorithm=dump_state(state["method"]), selection=dump_state(state["selection"]), clients={},
            privacy=json.dumps(state["stats"], sort_keys=True).encode(),
        )

    def prepare_resume(self, checkpoint: Checkpoint) -> None:
        """Before :meth:`setup` on a resume: the server's statistics state (ledger, once-per-run
        releases). The nodes restored their own state of the same round at the hello: a node that
        could not is a dropout (its reason in :attr:`FlowerNetwork.dropouts`)."""
        if checkpoint.round != self.resumed:
            raise StoreError(f"the nodes were asked to restore round {self.resumed}, the checkpoint is of round "
                             f"{checkpoint.round}")
        if checkpoint.clients:
            raise StoreError("this checkpoint holds client state: it is not a Flower run's (its nodes keep theirs)")
        if checkpoint.privacy:
            self.stats.load_state(json.loads(checkpoint.privacy.decode()))

    def restore(self, checkpoint: Checkpoint) -> None:
        """Continue after ``checkpoint.round`` (after :meth:`prepare_resume` and :meth:`setup`)."""
        model = load_state(checkpoint.model, device=self.device)
        self.server.restore_model(model["global"], model["other"], checkpoint.round)
        self.server.method.load_state_dict(load_state(checkpoint.algorithm, device=self.device))
        self.server.selection.load_state_dict(load_state(checkpoint.selection, device=self.device))
