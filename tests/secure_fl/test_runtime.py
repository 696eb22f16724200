"""The embedded runtime: seeds, selection, rounds, secure update aggregation, checkpoints, devices."""

from __future__ import annotations

import dataclasses
import pickle
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from protocols import LocalNetwork, Visibility
from secure_fl.algorithms import FlatLayout
from secure_fl.config import ExperimentConfig, RunConfig, parse_config
from secure_fl.data import Dataset
from secure_fl.device import configure_threads, resolve_device
from secure_fl.models import build_model
from secure_fl.runtime import (
    SELECTION_STRATEGIES,
    RandomSelection,
    Seeds,
    SelectionContext,
    SelectionStrategy,
    Simulation,
    build_simulation,
    dump_state,
    load_state,
    make_selection,
    prepare_partition,
    register_selection,
    run_experiment,
    selection_class,
)
from secure_fl.runtime.messages import RUNTIME, Kind, RuntimeMessage
from secure_fl.stats.coordinator import StatsCoordinator
from secure_fl.store import DB_NAME, RoundRow, RunStore

from .helpers import make_plan

CPU = torch.device("cpu")


def synthetic(n: int = 600, classes: int = 4, seed: int = 0) -> Dataset:
    rng = np.random.default_rng(seed)
    y = rng.integers(0, classes, size=n).astype(np.int64)
    centres = rng.normal(size=(classes, 1, 4, 4)).astype(np.float32)
    x = (centres[y] + 0.7 * rng.normal(size=(n, 1, 4, 4))).astype(np.float32)
    cut = n * 4 // 5
    return Dataset(name="synthetic", x_train=x[:cut], y_train=y[:cut], x_test=x[cut:], y_test=y[cut:],
                   num_classes=classes)


def config(**secure: object) -> RunConfig:
    secure_lines = "\n".join(f"{k} = {v!r}".replace("'", '"') for k, v in secure.items())
    text = f"""
seed = 3
[data]
dataset = "digits"
num_clients = 6
partition = "dirichlet"
partition_params = {{ alpha = 1.0 }}
minority_classes = [1]
[model]
name = "mlp"
hidden = [8]
[train]
rounds = 4
clients_per_round = 3
batch_size = 16
lr = 0.05
[secure]
{secure_lines}
[secure.paillier]
key_bits = 1024
allow_weak_keys = true
"""
    return parse_config(text).runs[0]


def build(cfg: RunConfig, data: Dataset | None = None) -> Simulation:
    sim = build_simulation(cfg, device=CPU, dataset=data if data is not None else synthetic())
    sim.setup()
    return sim


def play(sim: Simulation, rounds: int) -> list[dict]:
    out = []
    for _ in range(rounds):
        sim.run_round()
        out.append(sim.evaluate())
    return out


# --- seeds ------------------------------------------------------------------------------------

def test_seeds_are_keyed_not_sequential() -> None:
    a, b = Seeds(7), Seeds(7)
    assert a.numpy("selection", 3).integers(1 << 30) == b.numpy("selection", 3).integers(1 << 30)
    assert a.integer("shuffle", 1, 2) != a.integer("shuffle", 2, 1)
    assert a.integer("shuffle", 1) != a.integer("selection", 1) != Seeds(8).integer("selection", 1)
    assert torch.equal(torch.randperm(50, generator=a.torch("shuffle", 0, 4)),
                       torch.randperm(50, generator=b.torch("shuffle", 0, 4)))
    with pytest.raises(ValueError):
        Seeds(-1)


def test_torch_global_scope_restores_the_callers_generator() -> None:
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    with Seeds(1).torch_global("init"):
        inside = torch.rand(3)
    with Seeds(1).torch_global("init"):
        assert torch.equal(torch.rand(3), inside)
    assert torch.equal(torch.rand(3), expected)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_torch_global_scope_on_cuda_seeds_as_manual_seed_and_restores() -> None:
    cuda = torch.device("cuda")
    seeds = Seeds(1)
    torch.manual_seed(seeds.integer("client", 3, 4))
    reference = (torch.rand(3), torch.rand(3, device=cuda))
    torch.manual_seed(123)
    expected = (torch.rand(3), torch.rand(3, device=cuda))
    torch.manual_seed(123)
    with seeds.torch_global("client", 3, 4, device=cuda):
        inside = (torch.rand(3), torch.rand(3, device=cuda))
    assert all(torch.equal(a, b) for a, b in zip(inside, reference))  # the streams torch.manual_seed gives
    assert all(torch.equal(a, b) for a, b in zip((torch.rand(3), torch.rand(3, device=cuda)), expected))


def test_flat_layout_round_trip_includes_float_buffers() -> None:
    model = build_model("lenet5", input_shape=(1, 28, 28), num_classes=10)
    model.add_module("bn", torch.nn.BatchNorm1d(3))
    layout = FlatLayout(model)
    assert "bn.running_mean" in layout.names and "bn.num_batches_tracked" in layout.other
    vector = torch.arange(layout.dimension, dtype=torch.float32)
    layout.load(vector)
    assert torch.equal(layout.flatten(), vector)
    assert sum(v.numel() for v in layout.parameter_views(vector)) == sum(p.numel() for p in model.parameters())
    with pytest.raises(ValueError, match="entries"):
        layout.views(vector[:-1])


# --- selection --------------------------------------------------------------------------------

def test_random_selection_and_registry() -> None:
    stats = StatsCoordinator(make_plan(10), LocalNetwork())
    ctx = SelectionContext(round=0, num_clients=10, clients_per_round=4, rng=np.random.default_rng(0), stats=stats)
    chosen = RandomSelection().select(ctx)
    assert len(chosen) == 4 == len(set(chosen)) and list(chosen) == sorted(chosen)
    everyone = dataclasses.replace(ctx, clients_per_round=10)
    assert RandomSelection().select(everyone) == tuple(range(10))
    assert selection_class("random") is RandomSelection and SELECTION_STRATEGIES["random"] is RandomSelection
    with pytest.raises(ValueError, match="unknown selection 'best'"):
        make_selection("best")
    with pytest.raises(ValueError, match="unknown parameter"):
        make_selection("random", {"k": 3})


def test_a_registered_strategy_is_found_by_name() -> None:
    @register_selection("first_k_test")
    @dataclasses.dataclass(frozen=True)
    class FirstK(SelectionStrategy):
        offset: int = 0

        def select(self, ctx: SelectionContext) -> tuple[int, ...]:
            return tuple(range(self.offset, self.offset + ctx.clients_per_round))

    try:
        strategy = make_selection("first_k_test", {"offset": 1})
        assert isinstance(strategy, FirstK) and strategy.offset == 1
        cfg = config()
        cfg = dataclasses.replace(cfg, selection=dataclasses.replace(cfg.selection, name="first_k_test",
                                                                     params={"offset": 2}))
        sim = build(cfg)
        assert sim.run_round().selected == (2, 3, 4)
    finally:
        del SELECTION_STRATEGIES["first_k_test"]


# --- rounds -----------------------------------------------------------------------------------

def test_same_config_and_seed_give_the_same_metrics() -> None:
    first, second = build(config()), build(config())
    assert play(first, 3) == play(second, 3)
    assert torch.equal(first.global_vector, second.global_vector)
    other = build(dataclasses.replace(config(), seed=4))
    play(other, 3)
    assert not torch.equal(other.global_vector, first.global_vector)


def test_round_bytes_cover_broadcast_updates_and_statistics() -> None:
    sim = build(config())
    result = sim.run_round()
    d = sim.dimension
    per_stat = sim.stats.bytes_by_statistic(0)
    train = len(RuntimeMessage(kind=Kind.TRAIN, round=0, digest=bytes(16),
                               vector=np.zeros(d, dtype=np.float32)).to_bytes())
    assert train - 4 * d < 64  # the model in float32 and a small header
    assert per_stat["model_broadcast"] == train * 3
    uploads = [e for e in sim.transcript.select(statistic="model_update", round=0) if e.stage == "upload"]
    assert len(uploads) == 3 and all(4 * d < e.bytes < 4 * d + 64 for e in uploads)
    assert per_stat["model_update"] == sum(e.bytes for e in sim.transcript.select(statistic="model_update", round=0))
    assert per_stat["total_samples"] > 0
    assert len(result.selected) == 3 and result.clipped == 0 and result.train_loss > 0
    metrics = sim.evaluate()
    assert set(metrics) >= {"accuracy", "per_class_accuracy", "minority_accuracy", "auc", "test_loss"}
    assert metrics["minority_accuracy"] is not None and len(metrics["per_class_accuracy"]) == 4


@pytest.mark.parametrize("protocol", ["plain", "paillier"])
def test_secure_update_aggregation_tracks_the_clear_run(protocol: str) -> None:
    clear = build(config())
    secure = build(config(protocol="paillier", update_protocol=protocol, update_frac_bits=24))
    play(clear, 2)
    play(secure, 2)
    assert float((clear.global_vector - secure.global_vector).abs().max()) < 1e-4
    stats = secure.stats.bytes_by_statistic()
    assert stats["model_update"] > 4 * secure.dimension * 3  # encoded or encrypted is never smaller here
    protocols = {r.protocol for r in secure.stats.records if r.name == "model_update"}
    assert protocols == {protocol}


def test_clipping_of_updates_is_counted() -> None:
    # a bound on the fixed-point grid (2**-13); off-grid bounds hit a core bug, see test_stats
    sim = build(config(update_protocol="plain", update_clip=2.0**-13))
    result = sim.run_round()
    (update,) = [r for r in sim.stats.records if r.name == "model_update"]
    assert update.contributors == result.selected  # nobody refused: clipping is declared for updates
    assert result.clipped > 0 and sim.server.updates.clipped_total == result.clipped == update.clipped
    # the server learned the total count from the sum; each node knows only its own
    assert sum(sim.nodes[c].participant.clipped for c in result.selected) == result.clipped


def test_checkpoint_and_restore_continue_exactly() -> None:
    cfg = dataclasses.replace(config(), method=dataclasses.replace(config().method, name="scaffold"))
    straight = build(cfg)
    expected = play(straight, 4)
    first = build(cfg)
    selected = {c for _ in range(2) for c in first.run_round().selected}
    first.evaluate()
    checkpoint = first.checkpoint()
    # a snapshot of every node that took part (the others hold nothing yet)
    assert checkpoint.round == 1 and set(checkpoint.clients) == selected
    assert not first.checkpoint().clients  # nothing changed since: nothing to save again
    resumed = build_simulation(cfg, device=CPU, dataset=synthetic())
    resumed.prepare_resume(checkpoint)
    resumed.setup()
    resumed.restore(checkpoint)
    assert resumed.next_round == 2
    assert play(resumed, 2) == expected[2:]
    assert torch.equal(resumed.global_vector, straight.global_vector)


def test_prepare_partition_uses_minority_rho_and_subset() -> None:
    text = """
[data]
dataset = "digits"
num_clients = 4
partition = "dirichlet"
partition_params = { alpha = 100.0 }
minority_classes = [0]
minority_rho = 5
train_samples = 400
[train]
rounds = 1
clients_per_round = 4
"""
    cfg = parse_config(text).runs[0]
    data = synthetic(n=1000)
    pool, indices = prepare_partition(cfg, data)
    assert len(np.concatenate(indices)) == pool.size and pool.size < 400
    counts = np.bincount(data.y_train[pool], minlength=4)
    assert counts[0] * 3 < counts[1:].min()
    again_pool, again = prepare_partition(cfg, data)
    assert np.array_equal(pool, again_pool) and all(np.array_equal(a, b) for a, b in zip(indices, again))


class Opaque:
    """Not plain data: a checkpoint holding it must not load."""


def test_dump_and_load_state_are_plain_data_only() -> None:
    state = {"control": torch.ones(3), "step": 4, "nested": [torch.zeros(1), "x"]}
    loaded = load_state(dump_state(state))
    assert loaded["step"] == 4 and torch.equal(loaded["control"], torch.ones(3)) and loaded["nested"][1] == "x"

    with pytest.raises(pickle.UnpicklingError):
        load_state(dump_state({"x": Opaque()}))


def test_devices_and_threads() -> None:
    assert resolve_device("cpu") == CPU
    assert resolve_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="no usable CUDA"):
            resolve_device("cuda")
    with pytest.raises(ValueError, match="unknown device"):
        resolve_device("tpu")
    before = torch.get_num_threads()
    try:
        assert configure_threads(1) == 1 == torch.get_num_threads()
        assert configure_threads("auto") >= 1
        with pytest.raises(ValueError):
            configure_threads(0)
    finally:
        torch.set_num_threads(before)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_round_matches_cpu_round_closely() -> None:
    cfg = config()
    cpu = build(cfg)
    gpu = build_simulation(cfg, device=torch.device("cuda"), dataset=synthetic())
    gpu.setup()
    play(cpu, 2)
    play(gpu, 2)
    assert float((cpu.global_vector - gpu.global_vector.cpu()).abs().max()) < 1e-3


# --- resume through the store -------------------------------------------------------------------

RESUME = """
name = "resume-{method}"
seed = 11
[data]
dataset = "digits"
num_clients = 4
partition = "dirichlet"
partition_params = {{ alpha = 0.5 }}
minority_classes = [2]
[model]
name = "mlp"
hidden = [16]
[train]
rounds = 4
clients_per_round = 3
batch_size = 32
lr = 0.1
[method]
{method_lines}
[secure]
{secure_lines}
[secure.paillier]
key_bits = 1024
allow_weak_keys = true
"""

RESUMED_METHODS = {
    # FedAvg: total_samples and the updates (clear)
    "fedavg": ('name = "fedavg"', 'protocol = "plain"'),
    # FedShift: its once-per-run prior through Paillier (keys and the release checkpointed, never redone)
    "fedshift": ('name = "fedshift"', 'protocol = "plain"\n[secure.statistics]\nlabel_histogram = "paillier"'),
    # CLIMB: every statistic (f̄, λ̄, total_samples) through masking; its λ_i live in the nodes' snapshots
    "climb": ('name = "climb"\nprimal_steps = 1\ndual_lr = 8.0', 'protocol = "masking"'),
}


def resume_experiment(method: str) -> ExperimentConfig:
    """``METHOD`` (3 of 4 clients a round) or ``METHOD/all`` (every client every round: the total
    is summed in round 0 only, later rounds repeat it, the restored nodes included)."""
    name, _, cohort = method.partition("/")
    method_lines, secure_lines = RESUMED_METHODS[name]
    text = RESUME.format(method=name, method_lines=method_lines, secure_lines=secure_lines)
    return parse_config(text.replace("clients_per_round = 3", "clients_per_round = 4") if cohort == "all" else text)


class Interrupt(Exception):
    pass


class StopAfter:
    """An observer that kills the run once round ``round`` has run, before it is stored."""

    def __init__(self, round: int) -> None:
        self.round = round

    def run_started(self, run: Any, *, position: int, total: int, start_round: int) -> None: ...

    def client_finished(self, run: Any, round: int, done: int, total: int) -> None:
        if round == self.round:
            raise Interrupt(f"interrupted in round {round}")

    def round_finished(self, run: Any, row: Any) -> None: ...

    def run_finished(self, run: Any, summary: Any) -> None: ...


def comparable(row: RoundRow) -> RoundRow:
    return dataclasses.replace(row, seconds=0.0)


@pytest.mark.parametrize("method", [*sorted(RESUMED_METHODS), "fedavg/all", "climb/all"])
def test_interrupted_and_resumed_run_ends_as_an_uninterrupted_one(method: str, tmp_path: Path) -> None:
    experiment = resume_experiment(method)
    with RunStore(tmp_path / "straight" / DB_NAME) as store:
        (straight,) = run_experiment(experiment, store, device=CPU)
        want = store.rounds(straight.id)
    with RunStore(tmp_path / "resumed" / DB_NAME) as store:
        with pytest.raises(Interrupt):
            run_experiment(experiment, store, device=CPU, observer=StopAfter(2))
        (run,) = store.list_runs()
        assert run.status == "failed" and run.rounds_done == 2
        checkpoint = store.checkpoint(run.id)
        assert checkpoint is not None and checkpoint.round == 1 and checkpoint.clients
        (resumed,) = run_experiment(experiment, store, device=CPU, resume=run.id)
        got = store.rounds(resumed.id)
    assert [r.round for r in got] == [0, 1, 2, 3]
    assert [comparable(r) for r in got] == [comparable(r) for r in want]
    assert resumed.final == straight.final and resumed.tail == straight.tail
    if method == "fedshift":  # keys and prior once, in round 0; the resumed set-up was answered, not redone
        assert {"setup", "label_histogram"} <= set(got[0].bytes)
        assert not [r for r in got[1:] if {"setup", "label_histogram"} & set(r.bytes)]
    if method.startswith("climb"):  # the dual variables moved after the resume, carried on by the restored nodes
        assert all(r.metrics.get("lambda_mean") for r in got[2:]) and "climb_dual" in got[3].bytes
    if method.endswith("/all"):  # one release of the total, in round 0; later rounds carry only the pointers
        assert [[x.statistic for x in r.releases].count("total_samples") for r in got] == [1, 0, 0, 0]
        assert all(0 < r.bytes["total_samples"] < got[0].bytes["total_samples"] for r in got[1:])
        total = resumed.statistics["total_samples"]  # the pointers' bytes count, the release once
        assert total["releases"] == 1 and total["bytes"] == sum(r.bytes["total_samples"] for r in got)


# --- what a round's transcript holds -----------------------------------------------------------

def test_transcript_holds_the_runtime_messages_and_the_opens(tmp_path: Path) -> None:
    cfg = dataclasses.replace(config(), method=dataclasses.replace(config().method, name="scaffold"))
    cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, rounds=2))
    sim = build_simulation(cfg, device=CPU)
    sim.setup()
    results = [sim.run_round() for _ in range(2)]
    transcript = sim.transcript
    d = sim.dimension
    for result in results:
        runtime = [e for e in transcript.select(round=result.round) if e.protocol == RUNTIME]
        trains = [e for e in runtime if e.stage == "train"]
        broadcasts = [e for e in runtime if e.stage == "broadcast"]
        # the global model and SCAFFOLD's c go to each member of the cohort, and to nobody else
        assert sorted(e.receiver for e in trains) == sorted(e.receiver for e in broadcasts) == list(result.selected)
        assert {e.statistic for e in trains} == {"model_broadcast"}
        assert {e.statistic for e in broadcasts} == {"control_broadcast"}
        assert all(e.dimension == d and e.visibility is Visibility.PUBLIC for e in runtime)
        assert not [e for e in runtime if e.stage == "refuse"]
        # every statistic of the round opened with a public `open` to each member of its cohort
        for name in ("total_samples", "model_update", "control_update"):
            opens = [e for e in transcript.select(statistic=name, round=result.round) if e.stage == "open"]
            assert sorted(e.receiver for e in opens) == list(result.selected), name
            assert all(e.visibility is Visibility.PUBLIC for e in opens)
    # the stored rows count every message of the round, the runtime messages and the opens included
    with RunStore(tmp_path / DB_NAME) as store:
        (summary,) = run_experiment(ExperimentConfig(name=cfg.name, source="test", runs=(cfg,)), store,
                                    device=CPU)
        rows = store.rounds(summary.id)
    for row, result in zip(rows, results):
        expected = Counter[str]()
        for e in transcript.select(round=result.round):
            expected[e.statistic] += e.bytes
        assert row.bytes == dict(expected)
        assert row.bytes["model_broadcast"] == sum(e.bytes for e in transcript.select(round=row.round)
                                                   if e.stage == "train")
        assert row.bytes_total == sum(e.bytes for e in transcript.select(round=row.round))
