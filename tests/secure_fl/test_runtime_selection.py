"""Selection in a run: ``random`` and ``fixed``, ``greedy`` and ``dubhe`` as halves over the network."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest
import torch

from protocols import SERVER, LocalNetwork, PolicyError, Visibility
from secure_fl.config import RunConfig, load_config, parse_config
from secure_fl.data import Dataset
from secure_fl.runtime import Seeds, Simulation, build_simulation, dump_state, load_state
from secure_fl.selection import (
    SELECTION_STRATEGIES,
    DubheParams,
    DubheSelection,
    FixedSelection,
    GreedySelection,
    Population,
    RandomSelection,
    SelectionContext,
    kl_greedy,
    make_selection,
)
from secure_fl.selection.dubhe import ANNOUNCE_SIGMA, ANNOUNCE_STEP, STATISTICS
from secure_fl.selection.dubhe_client import DubheClient
from secure_fl.selection.greedy import LABEL_COUNTS
from secure_fl.stats import StatisticsPlan
from secure_fl.stats.coordinator import StatsCoordinator

CPU = torch.device("cpu")
TABLE2 = Path(__file__).resolve().parents[2] / "experiments" / "ratio_loss" / "table2"
KEYS = "key_bits = 1024, allow_weak_keys = true"


def context(seed: int, round: int, *, num_clients: int = 100, per_round: int = 20) -> SelectionContext:
    """The context the server loop builds: the generator keyed by (seed, "selection", round)."""
    stats = StatsCoordinator(StatisticsPlan(clients=tuple(range(num_clients))), LocalNetwork())
    return SelectionContext(round=round, num_clients=num_clients, clients_per_round=per_round,
                            rng=Seeds(seed).numpy("selection", round), stats=stats)


# --- fixed and random -------------------------------------------------------------------------

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


# --- in a run ---------------------------------------------------------------------------------

def synthetic(n: int = 960, classes: int = 4, seed: int = 0) -> Dataset:
    rng = np.random.default_rng(seed)
    y = rng.integers(0, classes, size=n).astype(np.int64)
    centres = rng.normal(size=(classes, 1, 4, 4)).astype(np.float32)
    x = (centres[y] + 0.7 * rng.normal(size=(n, 1, 4, 4))).astype(np.float32)
    cut = n * 4 // 5
    return Dataset(name="synthetic", x_train=x[:cut], y_train=y[:cut], x_test=x[cut:], y_test=y[cut:],
                   num_classes=classes)


def config(selection: str, *, clients: int = 8, per_round: int = 3, alpha: float = 1.0) -> RunConfig:
    return parse_config(f"""
seed = 3
selection = {selection}
[data]
dataset = "digits"
num_clients = {clients}
partition = "dirichlet"
partition_params = {{ alpha = {alpha} }}
[model]
name = "mlp"
hidden = [8]
[train]
rounds = 5
clients_per_round = {per_round}
batch_size = 16
lr = 0.05
""").runs[0]


def build(cfg: RunConfig, checkpoint: object = None) -> Simulation:
    """A simulation; resumed from ``checkpoint`` in the runner's order (snapshots, setup, restore)."""
    sim = build_simulation(cfg, device=CPU, dataset=synthetic())
    if checkpoint is not None:
        sim.prepare_resume(checkpoint)  # type: ignore[arg-type]
    sim.setup()
    if checkpoint is not None:
        sim.restore(checkpoint)  # type: ignore[arg-type]
    return sim


def test_a_fixed_run_keeps_round_zeros_clients_and_resumes_with_them() -> None:
    random_run = build(config('"random"'))
    random_rounds = [random_run.run_round().selected for _ in range(3)]
    straight = build(config('"fixed"'))
    selected, metrics = [], []
    for _ in range(4):
        selected.append(straight.run_round().selected)
        metrics.append(straight.evaluate())
    assert selected == [random_rounds[0]] * 4 and len(set(random_rounds)) > 1

    first = build(config('"fixed"'))
    first.run_round()
    first.run_round()
    resumed = build(config('"fixed"'), first.checkpoint())
    tail = []
    for _ in range(2):
        tail.append(resumed.run_round().selected)
        assert resumed.evaluate() == metrics[len(tail) + 1]
    assert tail == [random_rounds[0]] * 2
    assert torch.equal(resumed.global_vector, straight.global_vector)


def test_a_resume_from_a_checkpoint_without_the_draw_is_refused() -> None:
    first = build(config('"fixed"'))
    first.run_round()
    checkpoint = dataclasses.replace(first.checkpoint(), selection=dump_state({}))
    resumed = build(config('"fixed"'), checkpoint)
    with pytest.raises(RuntimeError, match="no clients at round 1"):
        resumed.run_round()


@pytest.mark.parametrize("path", sorted(TABLE2.rglob("*.toml")), ids=lambda p: str(p.relative_to(TABLE2)))
def test_table2_configs_fix_the_clients(path: Path) -> None:
    assert all(run.selection.name == "fixed" for run in load_config(path).runs)


# --- greedy -----------------------------------------------------------------------------------

def counts_of(sim: Simulation) -> np.ndarray:
    """Every client's label counts: the harness's knowledge, read from the nodes."""
    return np.stack([sim.class_counts[c] for c in range(sim.num_clients)])


def test_greedy_picks_the_kl_greedy_set_from_counts_it_read_in_the_clear() -> None:
    sim = build(config('"greedy"'))
    truth = counts_of(sim)
    for r in range(3):
        chosen = sim.run_round().selected
        assert chosen == kl_greedy(truth, 3, Seeds(3).numpy("selection", r))
    strategy = sim.selection
    assert isinstance(strategy, GreedySelection) and strategy.counts is not None
    assert np.array_equal(strategy.counts, truth)
    # Each client's counts came to the server in a run of its own, in the clear, once.
    uploads = [e for e in sim.transcript if e.statistic == LABEL_COUNTS and e.receiver == SERVER]
    assert sorted(e.sender for e in uploads) == list(range(sim.num_clients))
    assert all(e.visibility == Visibility.CLEAR and e.owner == e.sender and e.dimension == 4 and e.round == 0
               for e in uploads)
    assert len({e.run_id for e in uploads}) == sim.num_clients
    # A resumed run keeps the counts from the checkpoint (no second reading) and selects alike.
    resumed = build(config('"greedy"'), sim.checkpoint())
    assert resumed.run_round().selected == kl_greedy(truth, 3, Seeds(3).numpy("selection", 3))
    assert not [e for e in resumed.transcript if e.statistic == LABEL_COUNTS]


# --- dubhe ------------------------------------------------------------------------------------

DUBHE = (f'{{ name = "dubhe", tries = 3, search_tries = 3, search_grid = [[0.5, 0.9], [0.1, 0.4]], {KEYS} }}')


def dubhe_config() -> RunConfig:
    return config(DUBHE, clients=12, per_round=4, alpha=0.3)


@pytest.fixture(scope="module")
def dubhe_run() -> tuple[Simulation, list[tuple[int, ...]]]:
    """Four rounds of Dubhe (H = 3, σ searched) with 1024-bit keys."""
    sim = build(dubhe_config())
    return sim, [sim.run_round().selected for _ in range(4)]


def test_dubhe_server_reads_no_registry_or_counts(dubhe_run: tuple[Simulation, list[tuple[int, ...]]]) -> None:
    sim, selected = dubhe_run
    strategy = sim.selection
    assert isinstance(strategy, DubheSelection) and strategy.sigma is not None
    assert all(len(s) == 4 == len(set(s)) for s in selected)
    dubhe = {e for e in STATISTICS.values()} | {ANNOUNCE_SIGMA, ANNOUNCE_STEP}
    to_server = [e for e in sim.transcript if e.receiver == SERVER and e.statistic in dubhe]
    coins = {STATISTICS["volunteers"]: 3, STATISTICS["search_volunteers"]: 2 * 3}
    # Nothing of a registry, a count vector or R_A reaches the server in the clear: ciphertexts,
    # key set-up, the agent's one-entry index. The only clear uploads are each client's coin flips.
    clear = [e for e in to_server if e.visibility == Visibility.CLEAR]
    assert clear and all(e.statistic in coins and e.dimension == coins[e.statistic] and e.owner == e.sender
                         for e in clear)
    data = [e for e in to_server if e.statistic in (STATISTICS["registry"], STATISTICS["search_registry"],
                                                      STATISTICS["counts"])]
    assert data and all(e.visibility == Visibility.CIPHERTEXT for e in data)
    answers = [e for e in to_server if e.stage == "argmin"]
    assert answers and all(e.dimension == 1 for e in answers)
    assert {e.visibility for e in to_server if e.statistic == STATISTICS["setup"]} <= {Visibility.PUBLIC,
                                                                                      Visibility.SEALED}
    # The server's releases of the registry sums hold no value; the clients learned R_A.
    registries = [r for r in sim.stats.records if r.name in (STATISTICS["registry"], STATISTICS["search_registry"])]
    assert registries and all(r.value is None and "server" not in r.learned_by and r.protocol == "paillier"
                              for r in registries)
    assert not any(isinstance(v, np.ndarray) for v in vars(strategy).values())
    codebook = strategy.codebook
    assert codebook is not None
    expected = codebook.one_hot(codebook.categorize(counts_of(sim), strategy.sigma)).sum(axis=0)
    for node in sim.nodes.values():
        assert isinstance(node.selection, DubheClient) and node.selection.registration is not None
        overall = node.selection.registration.overall
        assert overall is not None and np.array_equal(overall, expected)


def test_dubhe_picks_the_best_balanced_try(dubhe_run: tuple[Simulation, list[tuple[int, ...]]]) -> None:
    sim, selected = dubhe_run
    strategy = sim.selection
    assert isinstance(strategy, DubheSelection) and len(strategy.last_tries) == 3
    population = Population(counts_of(sim))
    best = min(range(3), key=lambda h: (population.l1(strategy.last_tries[h]), h))
    assert selected[-1] == strategy.last_tries[best]
    assert strategy.epoch is not None and [m for m, _ in strategy.epoch.steps] == [2, 2]  # σ_1, then σ_2


def test_a_resumed_dubhe_run_selects_what_the_uninterrupted_one_selects(
        dubhe_run: tuple[Simulation, list[tuple[int, ...]]]) -> None:
    _, straight = dubhe_run
    first = build(dubhe_config())
    assert [first.run_round().selected for _ in range(2)] == straight[:2]
    resumed = build(dubhe_config(), first.checkpoint())
    assert [resumed.run_round().selected for _ in range(2)] == straight[2:]
    names = {e.statistic for e in resumed.transcript}
    # σ and R_A came from the checkpoint and the clients' snapshots: no new search or registration;
    # the server set up fresh keys and had the counts uploaded again for the tries.
    assert STATISTICS["search_registry"] not in names and STATISTICS["registry"] not in names
    assert {STATISTICS["setup"], STATISTICS["counts"], STATISTICS["selection"]} <= names


def test_fresh_uploads_every_round_select_the_same(dubhe_run: tuple[Simulation, list[tuple[int, ...]]]) -> None:
    _, straight = dubhe_run
    fresh = build(config(DUBHE.replace("}", ', uploads = "round" }'), clients=12, per_round=4, alpha=0.3))
    assert [fresh.run_round().selected for _ in range(4)] == straight
    uploads = [e for e in fresh.transcript if e.statistic == STATISTICS["counts"] and e.receiver == SERVER]
    # Only the tries' members upload, every round and every search step (a store run of fewer
    # clients than the run's largest try: each client checks the encoding against that public size).
    rounds = {e.round: {u.sender for u in uploads if u.round == e.round} for e in uploads}
    assert rounds[1] and len(rounds[1]) < fresh.num_clients and not any(r.refusals for r in fresh.stats.records)


def test_dubhe_reads_one_flat_table_into_its_params() -> None:
    strategy = make_selection("dubhe", {"tries": 3, "sigma": [0.8, 0.1], "search": "grid", "seed": 7,
                                        "reregister_every": 5})
    assert isinstance(strategy, DubheSelection)
    assert strategy.params == DubheParams(tries=3, sigma=(0.8, 0.1), search="grid")
    assert (strategy.seed, strategy.reregister_every) == (7, 5)
    assert strategy.sessions()[("paillier", "dubhe")].keyholder == "all"
    with pytest.raises(ValueError, match=r"unknown parameter\(s\) tris .*known: .*reregister_every.*tries"):
        make_selection("dubhe", {"tris": 3})
    with pytest.raises(ValueError, match="unknown parameter"):
        make_selection("dubhe", {"params": {}})
    with pytest.raises(ValueError, match="reregister_every"):
        make_selection("dubhe", {"reregister_every": -1})
    with pytest.raises(ValueError, match="selection study"):
        make_selection("dubhe", {"protocol": "plain"})
    with pytest.raises(ValueError, match="unknown parameter.*counts"):
        make_selection("greedy", {"counts": None})


@pytest.mark.parametrize("name, vector", [
    (ANNOUNCE_SIGMA, [4, 0]),           # one threshold index missing
    (ANNOUNCE_SIGMA, [4, 0, 2]),        # σ_2 has two values
    (ANNOUNCE_SIGMA, [0, 0, 0]),        # K = 0
    (ANNOUNCE_SIGMA, [4, 0.5, 0]),      # not an index
    (ANNOUNCE_STEP, [4, 0, 0, 0, 1, 0, 0, 1]),  # three candidates, the grid's steps have at most two
    ("dubhe_other", [1]),
])
def test_a_client_refuses_malformed_announcements(name: str, vector: Sequence[float]) -> None:
    strategy = make_selection("dubhe", {"search_grid": [[0.5, 0.9], [0.1, 0.4]]})
    client = strategy.client(num_classes=4)
    assert isinstance(client, DubheClient)
    client.heard(ANNOUNCE_SIGMA, 0, np.array([4, 1, 0], dtype=np.float32))  # well-formed
    with pytest.raises(PolicyError):
        client.heard(name, 0, np.asarray(vector, dtype=np.float32))
