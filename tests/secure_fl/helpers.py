"""Small harnesses for the tests: parties wired over a LocalNetwork, sharing only bytes.

:class:`StatsNet` is the statistics layer alone: the server's :class:`StatsCoordinator` and one
:class:`StatsParticipant` per client. A test hands each client its vector of a statistic
(:meth:`StatsNet.request`); the coordinator sees only the :class:`Release`. Each client may
be given its own declarations or plan, to play a client that expects something else than the
server asks for.

:class:`MethodNet` is one method's server half and one :class:`ClientNode` per client (tiny
data, a tiny model), for testing a method's statistics without a whole simulation; a test may
put a hand-made local update into a node as if it had trained.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from functools import partial
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

from protocols import LocalNetwork, Message, PolicyError, SumRequest
from secure_fl.algorithms import (
    ClientData,
    LocalTrainer,
    LocalTraining,
    LocalUpdate,
    Method,
    RunInfo,
    ServerMethod,
    ServerRound,
    ServerSetup,
)
from secure_fl.losses import make_loss
from secure_fl.runtime.node import ClientNode
from secure_fl.runtime.rng import Seeds
from secure_fl.stats import (
    Learned,
    Release,
    StatisticDeclaration,
    StatisticsPlan,
    StatisticsPrivacy,
    UpdateSettings,
)
from secure_fl.stats.coordinator import StatsCoordinator
from secure_fl.stats.participant import StatsParticipant
from secure_fl.stats.updates import UpdateSum

__all__ = ["WEAK", "MethodNet", "StatsNet", "make_plan", "tiny_client"]

WEAK: dict[str, dict[str, Any]] = {"paillier": {"key_bits": 1024, "allow_weak_keys": True}}
"""Paillier test keys: 1024 bits (tests only)."""

Value = Any
"""A client's vector of a statistic, or a function of what it learned this round giving it."""


def make_plan(clients: int | Sequence[int], protocol: str = "plain", *, overrides: Mapping[str, str] | None = None,
              options: Mapping[str, Mapping[str, Any]] | None = None, privacy: StatisticsPrivacy | None = None,
              updates: UpdateSettings | None = None) -> StatisticsPlan:
    ids = tuple(range(clients)) if isinstance(clients, int) else tuple(clients)
    return StatisticsPlan(clients=ids, protocol=protocol, overrides=dict(overrides or {}),
                          options={**WEAK, **(options or {})}, privacy=privacy, updates=updates)


def _deliver(handle: Callable[[bytes], list[Message]], inbox: Sequence[bytes]) -> list[Message]:
    return [reply for data in inbox for reply in handle(data)]


class StatsNet:
    """A coordinator and one participant per client over a :class:`LocalNetwork`."""

    def __init__(
        self,
        plan: StatisticsPlan,
        declarations: Iterable[StatisticDeclaration] = (),
        *,
        client_declarations: Mapping[int, Iterable[StatisticDeclaration]] | None = None,
        client_plans: Mapping[int, StatisticsPlan] | None = None,
    ) -> None:
        self.plan = plan
        self.network = LocalNetwork()
        self.coordinator = StatsCoordinator(plan, self.network)
        shared = list(declarations)
        if plan.updates is not None:
            shared += [plan.updates.declaration(name) for name in ("model_update", "control_update")]
        own = client_declarations or {}
        self.declared: dict[int, dict[str, StatisticDeclaration]] = {
            c: {d.name: d for d in own.get(c, shared)} for c in plan.clients
        }
        self.inputs: dict[str, dict[int, Value]] = {}
        self.learned: dict[int, list[Learned]] = {c: [] for c in plan.clients}
        self.participants: dict[int, StatsParticipant] = {}
        for c in plan.clients:
            participant = StatsParticipant(
                c, plan=(client_plans or {}).get(c, plan), declarations=self.declared[c].get,
                source=partial(self._source, c), on_learned=self.learned[c].append,
                noise_seed=None if plan.privacy is None else partial(plan.privacy.client_noise_seed, client=c),
            )
            self.participants[c] = participant
            self.network.attach(c, partial(_deliver, participant.handle))
        self.updates = UpdateSum(self.coordinator, plan.updates) if plan.updates is not None else None

    @property
    def transcript(self) -> Any:
        return self.network.transcript

    def _source(self, client: int, declaration: StatisticDeclaration, request: SumRequest) -> npt.ArrayLike:
        values = self.inputs.get(declaration.name, {})
        if client not in values:
            raise PolicyError(f"client {client} holds no input of {declaration.name!r}")
        value = values[client]
        if callable(value):
            value = value(self.learned_in(client, request.round))
        if isinstance(value, torch.Tensor):
            value = value.detach().double().numpy()
        return np.asarray(value, dtype=np.float64)

    def learned_in(self, client: int, round: int) -> dict[str, Learned]:
        """What ``client`` learned in ``round``, by statistic."""
        return {item.name: item for item in self.learned[client] if item.round == round}

    def request(self, declaration: StatisticDeclaration, inputs: Mapping[int, Value], *, round: int = 0,
                cohort: Sequence[int] | None = None, protocol: str | None = None) -> Release:
        """Hand the clients their vectors, then let the server request the statistic from the cohort
        (by default the clients given an input)."""
        self.inputs[declaration.name] = dict(inputs)
        members = sorted(inputs) if cohort is None else list(cohort)
        return self.coordinator.request(declaration, cohort=members, round=round, protocol=protocol)

    def update_sum(self, statistic: str, inputs: Mapping[int, Value], *, round: int = 0,
                   cohort: Sequence[int] | None = None) -> tuple[torch.Tensor, Release]:
        assert self.updates is not None, "the plan has no update settings"
        self.inputs[statistic] = dict(inputs)
        return self.updates.sum(statistic, cohort=sorted(inputs) if cohort is None else list(cohort), round=round)


def tiny_client(client_id: int, samples: int, *, num_classes: int = 2, features: int = 3,
                counts: npt.ArrayLike | None = None, seed: int | None = None) -> ClientData:
    """A client with ``samples`` random samples (or, with ``counts``, labels following them)."""
    g = torch.Generator().manual_seed(client_id if seed is None else seed)
    if counts is not None:
        labels = np.repeat(np.arange(len(np.asarray(counts))), np.asarray(counts, dtype=np.int64))
        y = torch.from_numpy(labels.astype(np.int64))
    else:
        y = torch.randint(0, num_classes, (samples,), generator=g)
    x = torch.randn(int(y.shape[0]), features, generator=g)
    class_counts = np.bincount(y.numpy(), minlength=num_classes).astype(np.int64)
    return ClientData(client_id=client_id, x=x, y=y, class_counts=class_counts)


class MethodNet:
    """A method's server half and one :class:`ClientNode` per client over a :class:`LocalNetwork`.

    Nothing is trained unless a test asks; :meth:`trained` puts a hand-made local update into a
    node as if its local training of that round had produced it (the node keeps it to itself).
    """

    def __init__(self, method: Method, clients: Mapping[int, ClientData], *, num_classes: int,
                 protocol: str = "plain", update_protocol: str = "clear", overrides: Mapping[str, str] | None = None,
                 options: Mapping[str, Mapping[str, Any]] | None = None, frac_bits: int = 24,
                 update_clip: float = 1.0, rounds: int = 10, features: int = 3) -> None:
        torch.manual_seed(0)
        model = torch.nn.Linear(features, num_classes)
        training = LocalTraining(epochs=1, batch_size=4, lr=0.1)
        self.trainer = LocalTrainer(model, training=training, loss=make_loss("ce"))
        dimension = self.trainer.layout.dimension
        updates = UpdateSettings(dimension=dimension, protocol=update_protocol, clip=update_clip, frac_bits=frac_bits)
        self.plan = make_plan(sorted(clients), protocol, overrides=overrides, options=options, updates=updates)
        self.info = RunInfo(num_clients=len(clients), num_classes=num_classes, dimension=dimension, rounds=rounds,
                            training=training, updates=updates)
        self.network = LocalNetwork()
        self.stats = StatsCoordinator(self.plan, self.network)
        self.updates = UpdateSum(self.stats, updates)
        self.server: ServerMethod = method.server(self.info)
        self.nodes: dict[int, ClientNode] = {}
        for cid, data in sorted(clients.items()):
            node = ClientNode(data=data, method=method.client(self.info), plan=self.plan, info=self.info,
                              trainer=self.trainer, seeds=Seeds(0), digest=bytes(16))
            self.nodes[cid] = node
            self.network.attach(cid, node.handle)

    @property
    def clients(self) -> tuple[int, ...]:
        return tuple(sorted(self.nodes))

    @property
    def transcript(self) -> Any:
        return self.network.transcript

    def setup(self) -> None:
        self.server.setup(ServerSetup(info=self.info, stats=self.stats, clients=self.clients,
                                      device=torch.device("cpu")))

    def trained(self, cid: int, round: int, delta: torch.Tensor, *, extras: Mapping[str, torch.Tensor] | None = None,
                loss: float = 0.0) -> None:
        """Client ``cid`` trained in ``round`` and got ``delta`` (a test's stand-in for local SGD)."""
        node = self.nodes[cid]
        node.update = LocalUpdate(delta=delta.to(torch.float32), num_samples=node.data.num_samples, steps=1, loss=loss,
                                  extras=dict(extras or {}))
        node.trained_round = round

    def round(self, r: int, cohort: Sequence[int], global_vector: torch.Tensor | None = None) -> ServerRound:
        vector = global_vector if global_vector is not None else torch.zeros(self.info.dimension)
        return ServerRound(round=r, global_vector=vector, cohort=tuple(cohort), info=self.info, stats=self.stats,
                           updates=self.updates)
