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
import json
from collections.abc import Sequence

import numpy as np
import torch
from scipy.stats import spearmanr

from secure_fl.config import RunConfig, load_config
from secure_fl.data import Dataset
from secure_fl.runtime import build_simulation
from secure_fl.runtime.build import load_run_dataset, prepare_partition
from secure_fl.runtime.simulation import load_state
from secure_fl.store import RunRow, RunStore


def _finished(store: RunStore, config: RunConfig) -> RunRow | None:
    key = json.dumps(config.to_dict(), sort_keys=True)
    for row in store.list_runs():
        if row.status == "done" and json.dumps(RunConfig.from_dict(row.config).to_dict(), sort_keys=True) == key:
            return row
    return None


def confusion(store: RunStore, row: RunRow, config: RunConfig, dataset: Dataset) -> np.ndarray:
    """Row-normalised test confusion matrix of the run's final global model."""
    checkpoint = store.checkpoint(row.id)
    if checkpoint is None:
        raise SystemExit(f"run {row.id} has no stored checkpoint (stripped store?)")
    sim = build_simulation(config, device=torch.device("cpu"), dataset=dataset)
    sim.layout.load(load_state(checkpoint.model)["global"].to(torch.float32))
    with torch.no_grad():
        pred = torch.cat([sim.model(sim.x_test[i:i + 4096]).argmax(1) for i in range(0, sim.x_test.shape[0], 4096)])
    classes = dataset.num_classes
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
    experiment = load_config(args.config)
    with RunStore.open_workspace(args.workspace) as store:
        for seed in sorted({run.seed for run in experiment.runs}):
            runs = {run.method.name: run for run in experiment.runs if run.seed == seed}
            fedavg, fedshift = (_finished(store, runs[name]) if name in runs else None for name in ("fedavg", "fedshift"))
            if fedavg is None or fedshift is None:
                print(f"seed {seed}: FedAvg or FedShift not finished, skipped")
                continue
            dataset = load_run_dataset(runs["fedavg"])
            _, parts = prepare_partition(runs["fedavg"], dataset)
            counts = np.array([np.bincount(dataset.y_train[ix], minlength=dataset.num_classes) for ix in parts], float)
            co = overlap(counts)
            delta = (confusion(store, fedshift, runs["fedshift"], dataset)
                     - confusion(store, fedavg, runs["fedavg"], dataset))
            off = ~np.eye(dataset.num_classes, dtype=bool)
            rare = off & (co < args.threshold)
            scale = 100.0 / dataset.num_classes  # a confusion rate of one class → points of accuracy (balanced test set)
            print(f"seed {seed}: {rare.sum()}/{off.sum()} pairs with overlap < {args.threshold}; "
                  f"error change there {scale * delta[rare].sum():+.2f} points, elsewhere "
                  f"{scale * delta[off & ~rare].sum():+.2f}; Spearman(overlap, change) "
                  f"{spearmanr(co[off], delta[off]).statistic:+.2f}")


if __name__ == "__main__":
    main()
