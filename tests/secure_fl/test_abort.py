"""A round whose protocol run cannot finish is abandoned by message: the cohort drops it."""

from __future__ import annotations

import pytest
import torch

from protocols import AbortedError, Message
from secure_fl.config import RunConfig
from secure_fl.runtime import build_simulation


def _sim() -> object:
    config = RunConfig.from_dict({
        "name": "abort", "seed": 1,
        "data": {"dataset": "digits", "num_clients": 5, "partition": "dirichlet", "partition_params": {"alpha": 100.0}, "train_samples": 500},
        "model": {"name": "mlp", "hidden": [8]},
        "train": {"rounds": 2, "clients_per_round": 5, "batch_size": 32, "lr": 0.05},
        "method": {"name": "fedavg"},
        "secure": {"protocol": "plain", "update_protocol": "masking", "update_clip": 4.0, "update_frac_bits": 16},
    })
    return build_simulation(config, device=torch.device("cpu"))


def test_a_round_whose_update_sum_aborts_is_abandoned_by_every_cohort_member() -> None:
    sim = _sim()

    def no_unmasking(data: bytes, message: Message) -> bytes | None:
        envelope = message.envelope
        lost = envelope is not None and message.label.stage == "unmasking" and envelope.receiver != 0xFFFFFFFF
        return None if lost else data

    sim.network.interceptor = no_unmasking
    sim.setup()
    with pytest.raises(AbortedError):
        sim.run_round()
    aborts = [e for e in sim.transcript if e.stage == "abort"]
    assert sorted(e.receiver for e in aborts) == [0, 1, 2, 3, 4]
    assert all(node.update is None for node in sim.nodes.values())
