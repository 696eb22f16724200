"""Round time against cohort size: the client pool (``vectorised``) and the per-client ``loop``.

One FedAvg round of the embedded engine (:class:`secure_fl.runtime.Simulation`): every client
takes part, each holding ``SAMPLES_PER_CLIENT`` Fashion-MNIST images (the training set reused
in order when the cohort needs more), E = 1, B = 32, MLP (128, 128), SGD with momentum; the
statistics through ``plain`` and the updates through ``clear``, no evaluation — the round is
local training plus the engine's messages. Parameters: clients (10, 100, 1000) × client path.
``SECURE_FL_BENCH_SMALL=1``: 10 clients of 32 images (a smoke of the code path).
The CPU target of issue 24 (100 clients × 600 images, against one centralised epoch) is
bench/peers.py's ``simulation`` case.
"""

from __future__ import annotations

import numpy as np
import torch

from secure_fl.algorithms import FlatLayout, LocalTraining, make_algorithm
from secure_fl.data import load_dataset
from secure_fl.losses import make_loss
from secure_fl.models import build_model
from secure_fl.runtime import RandomSelection, Seeds, Simulation, client_data
from secure_fl.stats import StatisticsPlan, UpdateSettings

from . import _harness as h

SAMPLES_PER_CLIENT = 32 if h.SMALL else 120
TRAINING = LocalTraining(epochs=1, batch_size=32, lr=0.01, momentum=0.9, weight_decay=1e-4)


def make_round(clients: int, path: str) -> Simulation:
    dataset = load_dataset("fashion-mnist")
    total = dataset.y_train.size
    shards = [np.arange(c * SAMPLES_PER_CLIENT, (c + 1) * SAMPLES_PER_CLIENT) % total for c in range(clients)]
    cpu = torch.device("cpu")
    seeds = Seeds(0)
    with seeds.torch_global("init"):
        model = build_model("mlp", input_shape=dataset.input_shape, num_classes=dataset.num_classes)
    plan = StatisticsPlan(clients=tuple(range(clients)), protocol="plain",
                          updates=UpdateSettings(dimension=FlatLayout(model).dimension, protocol="clear"))
    sim = Simulation(
        clients=client_data(dataset, shards, device=cpu), x_test=torch.from_numpy(dataset.x_test[:1]),
        y_test=torch.from_numpy(dataset.y_test[:1]), num_classes=dataset.num_classes, model=model,
        method=make_algorithm("fedavg"), loss=make_loss("ce"), selection=RandomSelection(), training=TRAINING,
        clients_per_round=clients, plan=plan, seeds=seeds, device=cpu, rounds=1000, clients_path=path,
    )
    sim.setup()
    return sim


class PoolRound:
    """Seconds of one FedAvg round, every client taking part."""

    params = (h.pick((10, 100, 1000), (10,)), ("vectorised", "loop"))
    param_names = ("clients", "path")
    timeout = 600.0
    number = 1
    repeat = (1, 3, 60.0)

    def setup(self, clients: int, path: str) -> None:
        self.sim = make_round(clients, path)
        self.sim.run_round()  # warm-up

    def time_round(self, clients: int, path: str) -> None:
        self.sim.run_round()
