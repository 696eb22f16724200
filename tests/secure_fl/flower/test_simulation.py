"""The flower-simulation engine (Flower's Ray runtime) against the embedded engine, end to end.

FedShift with its prior through Paillier (test-size keys) and every model update through
masking, on digits with 4 clients for 2 rounds: the same tail metrics as the embedded engine
(to 1e-4), written to the same store, and Ray's processes gone afterwards.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
import torch

from secure_fl.cli.run import engine_fields
from secure_fl.config import parse_config
from secure_fl.flower.simulation import simulation_executor
from secure_fl.runtime import run_experiment
from secure_fl.store import RunStore

pytestmark = pytest.mark.slow

CONFIG = """
name = "flower-simulation"
seed = 0
tail_rounds = 2
[data]
dataset = "digits"
num_clients = 4
partition = "dirichlet"
partition_params = { alpha = 0.5 }
[model]
name = "mlp"
hidden = [16]
[train]
rounds = 2
clients_per_round = 4
batch_size = 32
lr = 0.05
[method]
name = "fedshift"
[secure]
protocol = "plain"
update_protocol = "masking"
[secure.statistics]
label_histogram = "paillier"
[secure.paillier]
key_bits = 1024
allow_weak_keys = true
"""


def _descendants(pid: int) -> set[int]:
    """Live descendant processes of ``pid`` (from /proc)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            fields = stat[stat.rindex(")") + 2:].split()
            if fields[0] != "Z":
                children.setdefault(int(fields[1]), []).append(int(entry))
    out, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.add(child)
            todo.append(child)
    return out


def test_flower_simulation_gives_the_embedded_metrics(tmp_path: Path) -> None:
    import ray

    before = _descendants(os.getpid())
    cpu = torch.device("cpu")
    with RunStore(tmp_path / "runs.sqlite") as store:
        [embedded] = run_experiment(parse_config(CONFIG), store, device=cpu)
        try:
            [flower] = run_experiment(parse_config(CONFIG, assignments=[("runtime.engine", "flower-simulation")]),
                                      store, device=cpu, executor=simulation_executor())
        finally:
            ray.shutdown()
        assert flower.status == "done" and flower.id != embedded.id
        for key in ("accuracy", "auc"):
            assert flower.tail[key] == pytest.approx(embedded.tail[key], abs=1e-4)
        assert flower.final["per_class_accuracy"] == pytest.approx(embedded.final["per_class_accuracy"], abs=1e-4)
        assert flower.bytes_by_stage == embedded.bytes_by_stage  # the same messages crossed
        assert engine_fields(store, flower) == {"engine": "flower-simulation",
                                                "dropouts": {"count": 0, "parties": [], "by_round": {}}}
        assert engine_fields(store, embedded)["engine"] == "embedded"
        trips = [row.metrics["net.round_trips"] for row in flower.history]
        # round 1 repeats round 0's total (a reuse message rides with train and the masked update's
        # open): masking's four stages and nothing else
        assert trips[1] == 4
        assert all(row.metrics["net.wire_bytes"] > row.metrics["net.transcript_bytes"] for row in flower.history)
    deadline = time.monotonic() + 30
    while _descendants(os.getpid()) - before and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not _descendants(os.getpid()) - before, "Ray left processes behind"
