"""CLIMB: the dual step and the weights on hand-made numbers, secure = plain averages, what the
server can read in the transcript, and a short real run against FedAvg. Also the Focal loss."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from protocols import SERVER, Visibility
from secure_fl.algorithms import (
    ClientContext,
    ClientData,
    ClientState,
    ContributionContext,
    LocalTrainer,
    LocalTraining,
    RunInfo,
    make_algorithm,
)
from secure_fl.algorithms.climb import (
    DUAL_SUM,
    LAMBDA_SUM,
    Climb,
    ClimbClient,
    ClimbParams,
    ClimbServer,
    climb_weight,
    dual_declaration,
    dual_step,
    lambda_declaration,
)
from secure_fl.audit.ledger import build_ledger
from secure_fl.config import RunConfig
from secure_fl.losses import make_loss
from secure_fl.runtime import build_simulation
from secure_fl.stats import Learned, UpdateSettings

from .helpers import MethodNet, tiny_client

WEAK = {"key_bits": 1024, "allow_weak_keys": True}


@pytest.fixture
def one_thread():
    """Tiny models train fastest on one thread (and do not fight the shared cores)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# --- the dual step and the weights ----------------------------------------------------------------

def test_dual_step_hand_made() -> None:
    # λ + η/N (f_i − f̄ − ε) with η = 2, N = 100, ε = 0.01
    assert dual_step(0.5, 2.0, 1.0, step=0.02, tolerance=0.01, lambda_max=5.0) == pytest.approx(0.5198)
    # below zero: projected to 0
    assert dual_step(0.01, 0.5, 1.0, step=0.02, tolerance=0.01, lambda_max=5.0) == 0.0
    # above the clamp: projected to lambda_max
    assert dual_step(4.9, 10.0, 0.0, step=1.0, tolerance=0.01, lambda_max=5.0) == 5.0
    # a client exactly at f̄ + ε keeps its λ
    assert dual_step(1.25, 1.01, 1.0, step=0.02, tolerance=0.01, lambda_max=5.0) == pytest.approx(1.25)


def test_step_scaling_and_weights() -> None:
    assert ClimbParams().dual_step_size(100) == pytest.approx(0.02)
    assert ClimbParams(dual_scaling="none").dual_step_size(100) == pytest.approx(2.0)
    lams = [0.0, 0.3, 0.6, 1.1]
    mean = sum(lams) / len(lams)
    weights = [climb_weight(lam, mean) for lam in lams]
    assert weights == pytest.approx([0.5, 0.8, 1.1, 1.6])
    assert sum(weights) == pytest.approx(len(lams))  # Σ w_i = N: the Lagrangian's weights average 1


@pytest.mark.parametrize("bad", [
    {"dual_lr": 0.0}, {"lambda_max": -1.0}, {"loss_bound": math.inf}, {"primal_steps": 0},
    {"dual_scaling": "sqrt"}, {"tolerance": math.nan},
])
def test_params_are_validated(bad: dict) -> None:
    with pytest.raises(ValueError):
        ClimbParams(**bad)


def test_registered_with_declarations() -> None:
    algo = make_algorithm("climb", {"primal_steps": 3})
    assert isinstance(algo, Climb) and algo.params.primal_steps == 3
    dual, lam = dual_declaration(algo.params), lambda_declaration(algo.params)
    assert dual.name == DUAL_SUM and lam.name == LAMBDA_SUM
    # one bound for (f_i, λ_i): the larger of the two public bounds
    assert dual.length == 2 and dual.bound == 20.0 and lam.bound == 5.0 and lam.length == 1
    assert dual.kind == "float" and dual.clip and not lam.clip
    assert dual.learners == {"server", "clients"}
    assert dual_declaration(ClimbParams(loss_bound=2.0, lambda_max=8.0)).bound == 8.0
    # both halves declare the same statistics (public): the client checks each request against its own
    client = algo.client(_info(4))
    assert isinstance(client, ClimbClient)
    assert client.declarations()[DUAL_SUM] == dual and client.declarations()[LAMBDA_SUM] == lam
    minimal = make_algorithm("climb", {"server_learns": False})
    assert dual_declaration(minimal.params).learners == {"clients"}
    assert lambda_declaration(minimal.params).learners == {"clients"}


# --- the client side on a hand-made client ----------------------------------------------------------

def _trainer() -> LocalTrainer:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 2))
    return LocalTrainer(model, training=LocalTraining(epochs=1, batch_size=4, lr=0.1),
                        loss=make_loss("ce"))


def _client(cid: int, n: int = 6) -> ClientData:
    g = torch.Generator().manual_seed(cid)
    x = torch.randn(n, 3, generator=g)
    y = torch.randint(0, 2, (n,), generator=g)
    return ClientData(client_id=cid, x=x, y=y, class_counts=np.bincount(y.numpy(), minlength=2))


def _info(num_clients: int, dimension: int = 8) -> RunInfo:
    return RunInfo(num_clients=num_clients, num_classes=2, dimension=dimension, rounds=10,
                   training=LocalTraining(epochs=1, batch_size=4, lr=0.1), updates=UpdateSettings(dimension=dimension))


def _ctx(trainer: LocalTrainer, data: ClientData, state: dict, round: int, num_clients: int = 4) -> ClientContext:
    return ClientContext(round=round, data=data, state=state, global_vector=trainer.layout.flatten(),
                         broadcast={}, lr=0.1, info=_info(num_clients, trainer.layout.dimension), trainer=trainer,
                         shuffle=torch.Generator().manual_seed(round))


def _learn(client: ClimbClient, data: ClientData, state: dict, name: str, round: int, total: list[float],
           contributors: tuple[int, ...]) -> None:
    """The client hears a sum it was sent (as its node does when a release reaches it)."""
    learned = Learned(name=name, round=round, value=np.array(total), contributors=contributors, clipped=0)
    client.learned(learned, ClientState(client_id=data.client_id, round=round, data=data, state=state,
                                        learned={name: learned}))


def test_client_takes_its_pending_dual_step_and_measures_its_loss() -> None:
    trainer, data = _trainer(), _client(1)
    client = Climb(ClimbParams(primal_steps=2, dual_lr=2.0, tolerance=0.01)).client(_info(4, trainer.layout.dimension))
    assert isinstance(client, ClimbClient)
    state = {"lambda": 0.5, "pending": (0, 2.0)}  # this client's f_i at round 0
    _learn(client, data, state, DUAL_SUM, 0, [3.0, 0.6], (0, 1, 3))  # f̄, λ̄ of round 0, released to its clients
    assert state["loss_mean"] == (0, pytest.approx(1.0)) and state["lambda_mean"] == pytest.approx(0.2)
    _learn(client, data, state, LAMBDA_SUM, 1, [0.9], (0, 1, 3))  # a primal round's new cohort: λ̄ alone
    assert state["loss_mean"] == (0, pytest.approx(1.0)) and state["lambda_mean"] == pytest.approx(0.3)
    start = trainer.layout.flatten()
    with torch.no_grad():
        expected_loss = float(F.cross_entropy(trainer.model(data.x), data.y))
    update = client.train(_ctx(trainer, data, state, round=2))
    lam = 0.5 + (2.0 / 4) * (2.0 - 1.0 - 0.01)  # η/N with N = 4
    assert state["lambda"] == pytest.approx(lam)
    assert state["pending"][0] == 2 and state["pending"][1] == pytest.approx(expected_loss, rel=1e-5)
    contribution = ContributionContext(client_id=1, round=2, data=data, state=state, learned={}, update=update)
    assert float(np.asarray(client.contribution(LAMBDA_SUM, contribution))[0]) == pytest.approx(lam)
    joint = np.asarray(client.contribution(DUAL_SUM, contribution), dtype=np.float64)
    assert joint.shape == (2,) and joint[1] == pytest.approx(lam)
    assert joint[0] == pytest.approx(expected_loss, rel=1e-5)
    assert float(update.extras["climb_loss"][0]) == pytest.approx(expected_loss, rel=1e-5)
    assert update.num_samples == data.num_samples and update.delta.shape == start.shape
    # a primal-only round: λ and the pending measurement stay, no loss is measured (nor can it be asked for)
    trainer.layout.load(start)
    update = client.train(_ctx(trainer, data, state, round=3))
    assert state["lambda"] == pytest.approx(lam) and state["pending"][0] == 2
    assert "climb_loss" not in update.extras
    from protocols import PolicyError

    with pytest.raises(PolicyError, match="measured none"):
        client.contribution(DUAL_SUM, ContributionContext(client_id=1, round=3, data=data, state=state, learned={},
                                                          update=update))


def test_client_without_released_mean_skips_the_step() -> None:
    trainer, data = _trainer(), _client(2)
    client = Climb(ClimbParams(primal_steps=1)).client(_info(4, trainer.layout.dimension))
    state = {"lambda": 0.7, "pending": (5, 3.0), "loss_mean": (4, 1.0)}  # round 5's f̄ never reached this client
    client.train(_ctx(trainer, data, state, round=6))
    assert state["lambda"] == 0.7 and state["pending"][0] == 6


# --- aggregation: hand-made numbers, every protocol -----------------------------------------------

DIM = 5
LAMBDAS = {0: 0.0, 1: 0.3, 2: 0.6}
LOSSES = {0: 1.0, 1: 2.0, 2: 3.5}
SIZES = {0: 10, 1: 20, 2: 30}


def _delta(c: int) -> torch.Tensor:
    return torch.linspace(-0.01, 0.01, DIM) * (c + 1)


def _expected_mean() -> torch.Tensor:
    lam_bar = sum(LAMBDAS.values()) / 3
    total = sum(SIZES.values())
    return sum(SIZES[c] / total * (1 + LAMBDAS[c] - lam_bar) * _delta(c).double() for c in LAMBDAS).float()


def _climb_net(protocol: str, *, server_learns: bool = True, options: dict | None = None,
               primal_steps: int = 2) -> MethodNet:
    """CLIMB's server half and four client nodes; clients 0-2 hold SIZES samples, client 3 eight."""
    sizes = {**SIZES, 3: 8}
    clients = {c: tiny_client(c, n) for c, n in sizes.items()}
    net = MethodNet(Climb(ClimbParams(primal_steps=primal_steps, server_learns=server_learns)), clients,
                    num_classes=2, protocol=protocol, update_protocol=protocol if protocol != "plain" else "clear",
                    options=options)
    assert net.info.dimension >= DIM  # the hand-made updates fill the first DIM entries of the model
    return net


def _aggregate(protocol: str, *, server_learns: bool = True, options: dict | None = None):
    net = _climb_net(protocol, server_learns=server_learns, options=options)
    server = net.server
    assert isinstance(server, ClimbServer)
    server.dual_rounds, server.loss_means = [0], {0: 1.5}  # a dual step may have happened: λ̄ must be summed
    d = net.info.dimension
    for c, lam in LAMBDAS.items():  # each client's own λ_i and this round's update, in its node
        net.nodes[c].state["lambda"] = lam
        net.trained(c, 2, torch.nn.functional.pad(_delta(c), (0, d - DIM)),
                    extras={"climb_loss": torch.tensor([LOSSES[c]], dtype=torch.float64)})
    new = server.aggregate(net.round(2, (0, 1, 2)))
    return server, net, new[:DIM]


def test_aggregate_hand_made_plain() -> None:
    algo, net, new = _aggregate("plain")
    assert algo.lambda_mean == pytest.approx(0.3, abs=1e-6)  # fixed point, 24 fractional bits
    assert algo.loss_means[2] == pytest.approx(6.5 / 3, abs=1e-6)
    torch.testing.assert_close(new, _expected_mean(), rtol=1e-5, atol=1e-7)
    names = [r.name for r in net.stats.records]
    assert names == ["climb_dual", "total_samples", "model_update"]  # f̄ and λ̄ in one sum
    # the clients learned λ̄ and f̄ from the releases; client 3 was not in the round and learned nothing
    for c in (0, 1, 2):
        state = net.nodes[c].state
        assert state["lambda_mean"] == pytest.approx(0.3, abs=1e-6)
        assert state["loss_mean"][0] == 2 and state["loss_mean"][1] == pytest.approx(6.5 / 3, abs=1e-6)
    assert "loss_mean" not in net.nodes[3].state and not net.nodes[3].learned


def test_a_loss_above_its_bound_is_clipped_in_the_joint_sum_and_lambda_is_not() -> None:
    """The pair shares one bound (20): a loss of 30 is clipped to it and counted; λ̄ is exact."""
    net = _climb_net("plain")
    server = net.server
    assert isinstance(server, ClimbServer)
    server.dual_rounds = [0]
    d = net.info.dimension
    losses = {**LOSSES, 2: 30.0}
    for c, lam in LAMBDAS.items():
        net.nodes[c].state["lambda"] = lam
        net.trained(c, 2, torch.nn.functional.pad(_delta(c), (0, d - DIM)),
                    extras={"climb_loss": torch.tensor([losses[c]], dtype=torch.float64)})
    server.aggregate(net.round(2, (0, 1, 2)))
    (release,) = [r for r in net.stats.records if r.name == DUAL_SUM]
    assert release.clipped == 1
    assert server.loss_means[2] == pytest.approx((1.0 + 2.0 + 20.0) / 3, abs=1e-6)
    assert server.lambda_mean == pytest.approx(0.3, abs=1e-6)


def test_lambda_sum_skipped_while_it_cannot_have_changed() -> None:
    net = _climb_net("plain")
    server = net.server
    assert isinstance(server, ClimbServer)
    d = net.info.dimension
    cohorts = [(0, 1, 2), (0, 1, 3), (0, 1, 2), (1, 2, 3), (0, 1, 2), (0, 1, 2)]
    for r, cohort in enumerate(cohorts):
        for c in cohort:
            extras = {"climb_loss": torch.tensor([LOSSES.get(c, 1.0)], dtype=torch.float64)} if r % 2 == 0 else {}
            net.trained(c, r, torch.nn.functional.pad(_delta(c), (0, d - DIM)), extras=extras)
        server.aggregate(net.round(r, cohort))
    rounds = [(r.name, r.round) for r in net.stats.records if r.name.startswith("climb")]
    # f̄ and λ̄ together at every dual round; λ̄ alone at a primal round with a new cohort, once a
    # client can have stepped (round 1's λ̄ = 0 is public: no step before a second dual round);
    # round 5 keeps round 4's cohort and λ̄
    assert rounds == [("climb_dual", 0), ("climb_dual", 2), ("climb_lambda", 3), ("climb_dual", 4)]
    assert server.dual_rounds == [0, 2, 4]


@pytest.mark.parametrize("protocol,options", [
    ("masking", {}),
    ("secagg+", {}),
    ("paillier", {"paillier": WEAK}),
])
def test_secure_averages_equal_plain_averages(protocol: str, options: dict) -> None:
    plain_algo, _, plain_new = _aggregate("plain")
    algo, net, new = _aggregate(protocol, options=options)
    assert algo.lambda_mean == pytest.approx(plain_algo.lambda_mean, abs=1e-4)
    assert algo.loss_means[2] == pytest.approx(plain_algo.loss_means[2], abs=1e-4)
    torch.testing.assert_close(new, plain_new, rtol=0, atol=1e-6)
    assert {r.protocol for r in net.stats.records} == {protocol}
    uploads = [e for e in net.transcript if e.sender != SERVER and e.statistic.startswith(("climb", "model"))
               and e.dimension > 0]
    assert uploads and not [e for e in uploads if e.visibility is Visibility.CLEAR]


# --- what the server can read -----------------------------------------------------------------------

def _tiny_run(protocol: str, options: dict, *, server_learns: bool = True, rounds: int = 4, per_round: int = 5):
    raw = {
        "name": "climb-transcript", "seed": 0,
        "data": {"dataset": "digits", "num_clients": 5, "partition": "climb",
                 "partition_params": {"alpha": 0.2}, "minority_classes": [0], "minority_rho": 5},
        "model": {"name": "mlp", "hidden": [16]},
        "train": {"rounds": rounds, "clients_per_round": per_round, "local_epochs": 1, "batch_size": 32, "lr": 0.05,
                  "momentum": 0.0, "weight_decay": 0.0, "lr_decay": 1.0, "lr_decay_every": 1},
        "method": {"name": "climb", "primal_steps": 2, "dual_lr": 2.0, "server_learns": server_learns},
        "secure": {"protocol": protocol, "update_protocol": protocol, "update_clip": 1.0, **options},
    }
    sim = build_simulation(RunConfig.from_dict(raw), device=torch.device("cpu"))
    sim.setup()
    for _ in range(rounds):
        sim.run_round()
    return sim


@pytest.mark.parametrize("protocol,options,server_learns", [
    ("masking", {}, True),
    ("paillier", {"paillier": {**WEAK, "keyholder": "all"}}, False),
])
def test_server_reads_no_client_loss_or_lambda(protocol: str, options: dict, server_learns: bool,
                                               one_thread: None) -> None:
    sim = _tiny_run(protocol, options, server_learns=server_learns, rounds=6, per_round=3)
    declared = sim.stats.declarations
    assert {DUAL_SUM, LAMBDA_SUM} <= set(declared)
    assert declared[LAMBDA_SUM].bound == 5.0
    ledger = build_ledger(sim.stats.transcript, clients=range(5), protocol_options=options)
    for statistic in (DUAL_SUM, LAMBDA_SUM, "model_update", "total_samples"):
        assert ledger.runs_of(statistic), statistic
        for c in range(5):
            assert not ledger.server_reads_individually(statistic, c), (statistic, c)
    for statistic in (DUAL_SUM, LAMBDA_SUM):
        for run in ledger.runs_of(statistic):
            assert run.k == 3
            assert (SERVER in run.learners) == server_learns
            assert len(set(run.learners) - {SERVER}) == 3  # every member of the cohort learns f̄, λ̄
    # the clients' dual variables moved (someone's loss exceeded f̄ + ε)
    assert max(node.state.get("lambda", 0.0) for node in sim.nodes.values()) > 0


def test_plain_protocol_is_readable_control(one_thread: None) -> None:
    """The check above would catch a leak: under ``plain`` the server reads every f_i and λ_i."""
    sim = _tiny_run("plain", {}, rounds=3)
    ledger = build_ledger(sim.stats.transcript, clients=range(5))
    assert all(ledger.server_reads_individually(DUAL_SUM, c) for c in range(5))


def test_checkpoint_roundtrip() -> None:
    algo = Climb().server(_info(4))
    assert isinstance(algo, ClimbServer)
    algo.dual_rounds, algo.loss_means, algo.lambda_mean, algo.lambda_clients = [0, 5], {0: 1.2, 5: 0.9}, 0.4, (0, 1)
    other = Climb().server(_info(4))
    other.load_state_dict(algo.state_dict())
    assert other.state_dict() == algo.state_dict()
    with pytest.raises(ValueError):
        other.load_state_dict({"loss_means": {}})


# --- Focal loss --------------------------------------------------------------------------------------

def test_focal_loss() -> None:
    g = torch.Generator().manual_seed(0)
    logits, target = torch.randn(8, 4, generator=g), torch.randint(0, 4, (8,), generator=g)
    assert float(make_loss("focal", {"gamma": 0.0})(logits, target)) == pytest.approx(
        float(F.cross_entropy(logits, target)))
    p_t = F.softmax(logits, dim=-1)[torch.arange(8), target]
    by_hand = (-(1 - p_t) ** 2 * torch.log(p_t)).mean()
    assert float(make_loss("focal")(logits, target)) == pytest.approx(float(by_hand), rel=1e-6)
    w = torch.tensor([1.0, 2.0, 0.5, 3.0])
    weighted = (w[target] * -(1 - p_t) ** 2 * torch.log(p_t)).mean()
    assert float(make_loss("focal")(logits, target, class_weight=w)) == pytest.approx(float(weighted), rel=1e-6)
    with pytest.raises(ValueError):
        make_loss("focal", {"gamma": -1.0})


# --- a short real run -------------------------------------------------------------------------------

def _digits_run(method: dict, seed: int) -> dict:
    """Digits, 20 single-class clients (α = 0), class 0 kept at 1/5 so one client holds it."""
    raw = {
        "name": "climb-vs-fedavg", "seed": seed, "tail_rounds": 5,
        "data": {"dataset": "digits", "num_clients": 20, "partition": "climb", "partition_params": {"alpha": 0.0},
                 "minority_classes": [0], "minority_rho": 5},
        "model": {"name": "mlp", "hidden": [32]},
        "train": {"rounds": 60, "clients_per_round": 20, "local_epochs": 1, "batch_size": 16, "lr": 0.1,
                  "momentum": 0.0, "weight_decay": 0.0, "lr_decay": 1.0, "lr_decay_every": 1},
        "method": method,
        "secure": {"protocol": "plain"},
    }
    sim = build_simulation(RunConfig.from_dict(raw), device=torch.device("cpu"))
    sim.setup()
    tail = []
    while sim.next_round < 60:
        sim.run_round()
        if sim.next_round > 55:
            tail.append(sim.evaluate())
    return {k: float(np.mean([m[k] for m in tail])) for k in ("accuracy", "minority_accuracy")}


@pytest.mark.slow
def test_climb_raises_minority_accuracy_over_fedavg(one_thread: None) -> None:
    fedavg = _digits_run({"name": "fedavg"}, seed=0)
    climb = _digits_run({"name": "climb", "primal_steps": 1, "dual_lr": 2.0}, seed=0)
    assert climb["minority_accuracy"] >= fedavg["minority_accuracy"] + 0.2, (climb, fedavg)
    assert climb["accuracy"] >= fedavg["accuracy"] - 0.01, (climb, fedavg)
