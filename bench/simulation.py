"""Simulation overhead: one FedAvg round, clients vectorised and in a loop, vs one centralised epoch.

Fashion-MNIST's 60,000 training images split evenly (IID) across 100 clients; every client
takes part, E = 1, B = 32, MLP (128, 128), SGD(lr 0.01, momentum 0.9, weight decay 1e-4).
``ours`` is one round of the embedded engine, :class:`secure_fl.runtime.Simulation`, on its
default client path (``vectorised``: the nodes' training goes through the client pool and the
100 clients train together); ``loop`` is the same round with ``clients_path="loop"`` (one client
after another). A round is: the server loop and 100 client nodes, sharing only bytes over a
:class:`protocols.LocalNetwork` (selection; the global model sent to every node with the
``total_samples`` sum's ``open``; local training of all 100 clients; the ``total_samples`` sum
through the ``plain`` protocol; the scaled model updates summed through ``clear``; no evaluation).
``peer`` is one epoch of plain PyTorch training over the same 60,000 images with the same batch
size, model, optimiser and device (a fresh random order each epoch, batches gathered from one
tensor — the fastest centralised loop). The three are timed in this one process, in turn, after
a warm-up; the medians are reported.

Prints one JSON object: {"case": "simulation", "ours": s, "peer": s, "ratio": ours/peer,
"loop": s, "loop_ratio": loop/peer, "speedup": loop/ours, ...}. Target (issue 24): ratio <= 0.6
on the CPU.

    PYTHONPATH=. python bench/simulation.py [--device auto|cpu|cuda] [--repeats 3] [--threads auto|N]
        [--clients 100] [--no-loop] [--profile]

Every side runs with the same intra-op thread count (``auto``: half the cores, i.e. one on a
2-core machine, where small-batch MLP steps are latency-bound).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable

import numpy as np
import torch

from secure_fl.algorithms import FlatLayout, LocalTraining, make_algorithm
from secure_fl.data import Dataset, load_dataset
from secure_fl.device import DEVICE_CHOICES, configure_threads, resolve_device
from secure_fl.losses import make_loss
from secure_fl.models import build_model
from secure_fl.runtime import RandomSelection, Seeds, Simulation, client_data
from secure_fl.stats import StatisticsPlan, UpdateSettings

NUM_CLIENTS = 100
BATCH = 32
TRAINING = LocalTraining(epochs=1, batch_size=BATCH, lr=0.01, momentum=0.9, weight_decay=1e-4)


def make_simulation(dataset: Dataset, device: torch.device, *, rounds: int, path: str = "vectorised",
                    num_clients: int = NUM_CLIENTS) -> Simulation:
    """The embedded engine on an even IID split: FedAvg, every client in every round, the
    statistics through ``plain`` and the model updates through ``clear``."""
    rng = np.random.default_rng(0)
    shards = np.array_split(rng.permutation(dataset.y_train.size), num_clients)
    clients = client_data(dataset, shards, device=device)
    seeds = Seeds(0)
    with seeds.torch_global("init"):
        model = build_model("mlp", input_shape=dataset.input_shape, num_classes=dataset.num_classes)
    model.to(device)
    plan = StatisticsPlan(clients=tuple(range(num_clients)), protocol="plain",
                          updates=UpdateSettings(dimension=FlatLayout(model).dimension, protocol="clear"))
    sim = Simulation(
        clients=clients, x_test=torch.from_numpy(dataset.x_test[:1]).to(device),
        y_test=torch.from_numpy(dataset.y_test[:1]).to(device), num_classes=dataset.num_classes, model=model,
        method=make_algorithm("fedavg"), loss=make_loss("ce"), selection=RandomSelection(), training=TRAINING,
        clients_per_round=num_clients, plan=plan, seeds=seeds, device=device, rounds=rounds, clients_path=path,
    )
    sim.setup()  # the method's once-per-run set-up (none for FedAvg), untimed
    return sim


def centralised_epoch(model: torch.nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor,
                      generator: torch.Generator) -> None:
    loss_fn = torch.nn.CrossEntropyLoss()
    model.train()
    order = torch.randperm(x.shape[0], generator=generator).to(x.device)
    for begin in range(0, x.shape[0], BATCH):
        index = order[begin : begin + BATCH]
        loss = loss_fn(model(x[index]), y[index])
        opt.zero_grad()
        loss.backward()
        opt.step()


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="auto", choices=DEVICE_CHOICES)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--clients", type=int, default=NUM_CLIENTS, help="clients (all take part in every round)")
    parser.add_argument("--no-loop", action="store_true", help="time only the default (vectorised) path")
    parser.add_argument("--profile", action="store_true",
                        help="after timing, profile one more round of each path (cProfile, to stderr)")
    parser.add_argument("--threads", default="auto",
                        help="torch intra-op threads for both sides: auto (half the cores) or a number")
    args = parser.parse_args()
    configure_threads(args.threads if args.threads == "auto" else int(args.threads))
    device = resolve_device(args.device)
    dataset = load_dataset("fashion-mnist")

    paths = ["vectorised"] if args.no_loop else ["vectorised", "loop"]
    sims = {path: make_simulation(dataset, device, rounds=args.repeats + 2, path=path, num_clients=args.clients)
            for path in paths}
    model = build_model("mlp", input_shape=dataset.input_shape, num_classes=dataset.num_classes).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=TRAINING.lr, momentum=TRAINING.momentum,
                          weight_decay=TRAINING.weight_decay)
    x = torch.from_numpy(dataset.x_train).to(device)
    y = torch.from_numpy(dataset.y_train).to(device)
    generator = torch.Generator().manual_seed(0)

    times: dict[str, list[float]] = {"peer": [], **{path: [] for path in paths}}
    for repeat in range(args.repeats + 1):  # the first turn warms up
        for path, sim in sims.items():
            times[path].append(_timed(device, sim.run_round))
        times["peer"].append(_timed(device, lambda: centralised_epoch(model, opt, x, y, generator)))
    med = {name: statistics.median(values[1:]) for name, values in times.items()}
    out = {
        "case": "simulation", "ours": round(med["vectorised"], 4), "peer": round(med["peer"], 4),
        "ratio": round(med["vectorised"] / med["peer"], 4), "device": str(device),
        "threads": torch.get_num_threads(), "clients": args.clients, "images": int(dataset.y_train.size),
        "batch_size": BATCH, "ours_all": [round(v, 4) for v in times["vectorised"][1:]],
        "peer_all": [round(v, 4) for v in times["peer"][1:]],
    }
    if "loop" in med:
        out.update({"loop": round(med["loop"], 4), "loop_ratio": round(med["loop"] / med["peer"], 4),
                    "speedup": round(med["loop"] / med["vectorised"], 4),
                    "loop_all": [round(v, 4) for v in times["loop"][1:]]})
    if args.profile:
        for path, sim in sims.items():
            _profiled(path, device, sim.run_round)
    print(json.dumps(out))


def _profiled(name: str, device: torch.device, fn: Callable[[], object]) -> None:
    """Where one round's time goes (device work is waited for at the end, inside the profile)."""
    import cProfile
    import io
    import pstats
    import sys

    profile = cProfile.Profile()
    profile.enable()
    fn()
    _sync(device)
    profile.disable()
    text = io.StringIO()
    pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(25)
    pstats.Stats(profile, stream=text).sort_stats("cumulative").print_stats(45)
    print(f"--- profile: one {name} round on {device} ---\n{text.getvalue()}", file=sys.stderr)


def _timed(device: torch.device, fn: Callable[[], object]) -> float:
    _sync(device)
    start = time.perf_counter()
    fn()
    _sync(device)
    return time.perf_counter() - start


if __name__ == "__main__":
    main()
