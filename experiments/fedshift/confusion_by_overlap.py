"""Where FedShift's errors move relative to FedAvg's: by how often two classes share a client.

FedShift's local loss ℓ(f + s_i, y) barely depends on the logit of a class client i lacks
(its shift is ≈ ln(1/(|D_i|·P(y)))), so no client contrasts two classes that never share a
client. This script measures whether FedShift's extra confusions fall on such pairs. For each
seed of CONFIG with finished FedAvg and FedShift runs in the workspace, it loads both final
models, computes their test confusion matrices and the co-location of every class pair,

    overlap(a, b) = Σ_i min(n_{i,a}/n_a, n_{i,b}/n_b)   (0: never on one client, 1: spread alike),

and prints the change in error (FedShift − FedAvg, points of overall accuracy) on the pairs with
overlap < --threshold and on the rest, plus the Spearman correlation of overlap and change.

    python experiments/fedshift/confusion_by_overlap.py experiments/fedshift/table1_fmnist.toml
    python experiments/fedshift/confusion_by_overlap.py experiments/fedshift/balance/table1_fmnist.toml
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

import numpy as np
import torch
from scipy.stats import spearmanr

from secure_fl.config import RunConfig
from secure_fl.report import RunRecord, load_runs
from secure_fl.runtime import Simulation, build_simulation, load_state
from secure_fl.runtime.build import load_run_dataset, prepare_partition
from secure_fl.store import RunStore


def confusion(store: RunStore, run: RunRecord, sim: Simulation) -> np.ndarray:
    """Row-normalised test confusion matrix of the run's final global model, evaluated on ``sim``."""
    checkpoint = store.checkpoint(run.id)
    if checkpoint is None:
        raise SystemExit(f"run {run.id} has no stored checkpoint (stripped store?)")
    sim.layout.load(load_state(checkpoint.model)["global"].to(torch.float32))
    with torch.no_grad():
        pred = torch.cat([sim.model(sim.x_test[i:i + 4096]).argmax(1) for i in range(0, sim.x_test.shape[0], 4096)])
    classes = sim.num_classes
    matrix = np.zeros((classes, classes))
    np.add.at(matrix, (sim.y_test.numpy(), pred.numpy()), 1.0)
    normalised: np.ndarray = matrix / matrix.sum(axis=1, keepdims=True)
    return normalised


def overlap(counts: np.ndarray) -> np.ndarray:
    """overlap[a, b] = Σ_i min(share of class a on client i, share of class b on client i)."""
    share = counts / np.maximum(counts.sum(axis=0, keepdims=True), 1.0)
    pairs: np.ndarray = np.minimum(share[:, :, None], share[:, None, :]).sum(axis=0)
    return pairs


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config")
    parser.add_argument("--workspace", default="runs/fedshift")
    parser.add_argument("--threshold", type=float, default=0.1, help="'rarely co-located' below this overlap")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    with RunStore.open_workspace(args.workspace) as store:
        runs = load_runs(args.config, store=store, allow_missing=True)  # matched by resolved config
        for seed in sorted({run.seed for run in runs}):
            by_method = {run.method: run for run in runs if run.seed == seed}
            if not {"fedavg", "fedshift"} <= set(by_method):
                print(f"seed {seed}: FedAvg or FedShift not finished, skipped")
                continue
            # the two runs share data, partition and architecture: one simulation scores both
            config = RunConfig.from_dict(by_method["fedavg"].config)
            dataset = load_run_dataset(config)
            _, parts = prepare_partition(config, dataset)
            counts = np.array([np.bincount(dataset.y_train[ix], minlength=dataset.num_classes) for ix in parts], float)
            co = overlap(counts)
            sim = build_simulation(config, device=torch.device("cpu"), dataset=dataset)
            delta = confusion(store, by_method["fedshift"], sim) - confusion(store, by_method["fedavg"], sim)
            off = ~np.eye(dataset.num_classes, dtype=bool)
            rare = off & (co < args.threshold)
            scale = 100.0 / dataset.num_classes  # a confusion rate of one class → points of accuracy (balanced test set)
            print(f"seed {seed}: {rare.sum()}/{off.sum()} pairs with overlap < {args.threshold}; "
                  f"error change there {scale * delta[rare].sum():+.2f} points, elsewhere "
                  f"{scale * delta[off & ~rare].sum():+.2f}; Spearman(overlap, change) "
                  f"{spearmanr(co[off], delta[off]).statistic:+.2f}")


if __name__ == "__main__":
    main()
