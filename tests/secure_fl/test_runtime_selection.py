"""The runtime's ``fixed`` selection: round 0's random draw, every round, across a resume."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from secure_fl.config import RunConfig, load_config, parse_config
from secure_fl.runtime import (
    SELECTION_STRATEGIES,
    RandomSelection,
    Seeds,
    SelectionContext,
    Simulation,
    build_simulation,
    dump_state,
    load_state,
    make_selection,
)
from secure_fl.runtime.selection import FixedSelection
from secure_fl.stats import GlobalStatistics

from .test_runtime import synthetic

CPU = torch.device("cpu")
TABLE2 = Path(__file__).resolve().parents[2] / "experiments" / "ratio_loss" / "table2"


def context(seed: int, round: int, *, num_clients: int = 100, per_round: int = 20) -> SelectionContext:
    """The context the simulation builds: the generator keyed by (seed, "selection", round)."""
    return SelectionContext(round=round, num_clients=num_clients, clients_per_round=per_round,
                            rng=Seeds(seed).numpy("selection", round), stats=GlobalStatistics(clients=range(num_clients)))


def test_fixed_is_registered_and_takes_no_parameters() -> None:
    assert SELECTION_STRATEGIES["fixed"] is FixedSelection
    assert isinstance(make_selection("fixed"), FixedSelection)
    with pytest.raises(ValueError, match="unknown parameter"):
        make_selection("fixed", {"clients": [1, 2]})


def test_same_clients_every_round_equal_to_randoms_first_draw() -> None:
    strategy = FixedSelection()
    first = RandomSelection().select(context(5, 0))
    chosen = [strategy.select(context(5, r)) for r in range(6)]
    assert all(c == first for c in chosen) and strategy.clients == first
    assert len(first) == 20 == len(set(first)) and list(first) == sorted(first)
    # random itself moves on: round 1's draw differs from round 0's
    assert RandomSelection().select(context(5, 1)) != first


def test_deterministic_per_seed() -> None:
    draws = {seed: FixedSelection().select(context(seed, 0)) for seed in range(4)}
    assert all(FixedSelection().select(context(seed, 0)) == draws[seed] for seed in range(4))
    assert len(set(draws.values())) == 4


def test_every_client_when_clients_per_round_equals_num_clients() -> None:
    assert FixedSelection().select(context(0, 0, num_clients=7, per_round=7)) == tuple(range(7))


def test_bad_parameters_are_named() -> None:
    with pytest.raises(ValueError, match="clients_per_round <= num_clients.*clients_per_round=30, num_clients=10"):
        FixedSelection().select(context(0, 0, num_clients=10, per_round=30))
    with pytest.raises(ValueError, match="clients_per_round=0"):
        FixedSelection().select(context(0, 0, num_clients=10, per_round=0))
    strategy = FixedSelection()
    strategy.select(context(0, 0, num_clients=10, per_round=4))
    with pytest.raises(ValueError, match="drew 4 of 10 clients.*asks for 5 of 10"):
        strategy.select(context(0, 1, num_clients=10, per_round=5))
    with pytest.raises(RuntimeError, match="no clients at round 3"):
        FixedSelection().select(context(0, 3))


def test_state_round_trip_and_bad_state() -> None:
    strategy = FixedSelection()
    assert strategy.state_dict() == {}
    chosen = strategy.select(context(2, 0))
    restored = FixedSelection()
    restored.load_state_dict(load_state(dump_state(strategy.state_dict())))
    assert restored.select(context(2, 7)) == chosen
    for bad in ({"clients": [3, 1], "num_clients": 10}, {"clients": [1, 10], "num_clients": 10},
                {"clients": [], "num_clients": 10}, {"clients": [1]}, {"clients": [1], "num_clients": 10, "x": 1}):
        with pytest.raises(ValueError, match="selection 'fixed'"):
            FixedSelection().load_state_dict(bad)


# --- in the runtime ---------------------------------------------------------------------------

def config(selection: str) -> RunConfig:
    return parse_config(f"""
seed = 3
selection = "{selection}"
[data]
dataset = "digits"
num_clients = 8
partition = "dirichlet"
partition_params = {{ alpha = 1.0 }}
[model]
name = "mlp"
hidden = [8]
[train]
rounds = 5
clients_per_round = 3
batch_size = 16
lr = 0.05
""").runs[0]


def build(cfg: RunConfig) -> Simulation:
    sim = build_simulation(cfg, device=CPU, dataset=synthetic())
    sim.setup()
    return sim


def test_a_fixed_run_keeps_round_zeros_clients_and_resumes_with_them() -> None:
    random_run = build(config("random"))
    random_rounds = [random_run.run_round().selected for _ in range(3)]
    straight = build(config("fixed"))
    selected, metrics = [], []
    for _ in range(4):
        selected.append(straight.run_round().selected)
        metrics.append(straight.evaluate())
    assert selected == [random_rounds[0]] * 4 and len(set(random_rounds)) > 1

    first = build(config("fixed"))
    first.run_round()
    first.run_round()
    checkpoint = first.checkpoint()
    resumed = build(config("fixed"))
    resumed.restore(checkpoint)
    tail = []
    for _ in range(2):
        tail.append(resumed.run_round().selected)
        assert resumed.evaluate() == metrics[len(tail) + 1]
    assert tail == [random_rounds[0]] * 2
    assert torch.equal(resumed.global_vector, straight.global_vector)


def test_a_resume_from_a_checkpoint_without_the_draw_is_refused() -> None:
    first = build(config("fixed"))
    first.run_round()
    checkpoint = dataclasses.replace(first.checkpoint(), selection=dump_state({}))
    resumed = build(config("fixed"))
    resumed.restore(checkpoint)
    with pytest.raises(RuntimeError, match="no clients at round 1"):
        resumed.run_round()


@pytest.mark.parametrize("path", sorted(TABLE2.rglob("*.toml")), ids=lambda p: str(p.relative_to(TABLE2)))
def test_table2_configs_fix_the_clients(path: Path) -> None:
    assert all(run.selection.name == "fixed" for run in load_config(path).runs)
