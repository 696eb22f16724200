"""Methods: registry, hyper-parameters, local objectives, and FedAvg ≡ centralised SGD."""

from __future__ import annotations

import copy
import dataclasses
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from secure_fl.algorithms import (
    ALGORITHMS,
    FedAvg,
    FedProx,
    FedProxParams,
    FlatLayout,
    LocalObjective,
    LocalTrainer,
    LocalTraining,
    Method,
    Reweighting,
    ReweightingParams,
    RunInfo,
    Scaffold,
    ScaffoldParams,
    ServerMethod,
    inverse_frequency_weights,
    make_algorithm,
    register_algorithm,
)
from secure_fl.data import Dataset
from secure_fl.losses import LOSSES, CrossEntropy, make_loss
from secure_fl.models import build_model
from secure_fl.runtime import RandomSelection, Seeds, Simulation, client_data
from secure_fl.runtime.node import ClientNode
from secure_fl.stats import StatisticsPlan, UpdateSettings

CPU = torch.device("cpu")


def synthetic(n: int = 240, classes: int = 3, seed: int = 0) -> Dataset:
    rng = np.random.default_rng(seed)
    y = rng.integers(0, classes, size=n).astype(np.int64)
    centres = rng.normal(size=(classes, 1, 4, 4)).astype(np.float32)
    x = (centres[y] + 0.5 * rng.normal(size=(n, 1, 4, 4))).astype(np.float32)
    return Dataset(name="synthetic", x_train=x[: n * 3 // 4], y_train=y[: n * 3 // 4],
                   x_test=x[n * 3 // 4 :], y_test=y[n * 3 // 4 :], num_classes=classes)


def simulation(dataset: Dataset, method: Method, training: LocalTraining, *, shards: list[np.ndarray],
               per_round: int | None = None, seed: int = 0) -> Simulation:
    seeds = Seeds(seed)
    with seeds.torch_global("init"):
        model = build_model("mlp", input_shape=dataset.input_shape, num_classes=dataset.num_classes, hidden=(8,))
    plan = StatisticsPlan(clients=tuple(range(len(shards))), protocol="plain",
                          updates=UpdateSettings(dimension=FlatLayout(model).dimension))
    sim = Simulation(
        clients=client_data(dataset, shards, device=CPU), x_test=torch.from_numpy(dataset.x_test),
        y_test=torch.from_numpy(dataset.y_test), num_classes=dataset.num_classes, model=model,
        method=method, loss=make_loss("ce"), selection=RandomSelection(), training=training,
        clients_per_round=per_round or len(shards), plan=plan, seeds=seeds, device=CPU, rounds=10,
    )
    sim.setup()
    return sim


def node(sim: Simulation, cid: int = 0) -> ClientNode:
    """A client's node (the embedded harness may look inside the parties; tests do too)."""
    return sim.nodes[cid]


def server_half(sim: Simulation) -> ServerMethod:
    return sim.server.method


def client_half(sim: Simulation, method: Method) -> object:
    """A fresh client half of ``method`` for the run (its objective needs nothing from the node)."""
    info: RunInfo = sim.info
    return method.client(info)


# --- registry and hyper-parameters ------------------------------------------------------------

def test_registry_names_are_the_lower_case_contract_names() -> None:
    assert {"fedavg", "fedprox", "scaffold", "reweighting"} <= set(ALGORITHMS)
    assert all(name == name.lower() for name in ALGORITHMS)
    assert ALGORITHMS["fedavg"] is FedAvg and FedAvg.name == "fedavg"
    assert "ce" in LOSSES and CrossEntropy.name == "ce"


def test_hyper_parameters_are_frozen_dataclasses() -> None:
    for cls in (FedAvg, FedProx, Scaffold, Reweighting):
        assert dataclasses.is_dataclass(cls.Params)
        with pytest.raises(dataclasses.FrozenInstanceError):
            cls.Params().server_lr = 2.0  # type: ignore[misc]
    assert make_algorithm("fedprox", {"mu": 0.1}).params == FedProxParams(mu=0.1)


def test_make_algorithm_names_what_is_wrong() -> None:
    with pytest.raises(ValueError, match="unknown method 'fedsgd'.*fedavg"):
        make_algorithm("fedsgd")
    with pytest.raises(ValueError, match=r"unknown parameter\(s\) lambda_ for method 'fedprox'; known: mu, server_lr"):
        make_algorithm("fedprox", {"lambda_": 0.1})
    with pytest.raises(ValueError, match="mu must be >= 0"):
        make_algorithm("fedprox", {"mu": -1.0})
    with pytest.raises(ValueError, match="unknown parameter.*gamma"):
        make_loss("ce", {"gamma": 2.0})


def test_register_refuses_non_frozen_params_and_takeovers() -> None:
    @dataclasses.dataclass
    class Loose:
        x: int = 0

    class Bad(FedAvg):
        Params = Loose  # type: ignore[assignment]

    with pytest.raises(TypeError, match="frozen dataclass"):
        register_algorithm("bad_method")(Bad)
    with pytest.raises(ValueError, match="already registered"):
        register_algorithm("fedavg")(FedProx)
    with pytest.raises(ValueError, match="lower-case"):
        register_algorithm("FedX")


def test_local_training_schedule_and_validation() -> None:
    t = LocalTraining(lr=0.01, lr_decay=0.95, lr_decay_every=10)
    assert t.lr_at(0) == t.lr_at(9) == 0.01
    assert t.lr_at(10) == pytest.approx(0.0095) and t.lr_at(25) == pytest.approx(0.01 * 0.95**2)
    assert t.steps_per_epoch(600) == 19
    for bad in ({"momentum": 1.0}, {"lr": 0.0}, {"batch_size": 0}, {"lr_decay": 1.5}, {"nesterov": True}):
        with pytest.raises(ValueError):
            LocalTraining(**bad)  # type: ignore[arg-type]


# --- the target: FedAvg with one client reproduces centralised SGD ----------------------------

def centralised(dataset: Dataset, training: LocalTraining, rounds: int, *, seed: int = 0) -> torch.Tensor:
    """Plain PyTorch SGD over the same data, in the order the client would see it."""
    seeds = Seeds(seed)
    with seeds.torch_global("init"):
        model = build_model("mlp", input_shape=dataset.input_shape, num_classes=dataset.num_classes, hidden=(8,))
    x, y = torch.from_numpy(dataset.x_train), torch.from_numpy(dataset.y_train)
    opt = torch.optim.SGD(model.parameters(), lr=training.lr, momentum=training.momentum,
                          weight_decay=training.weight_decay)
    for r in range(rounds):
        for group in opt.param_groups:
            group["lr"] = training.lr_at(r)
        shuffle = seeds.torch("shuffle", r, 0)
        for _ in range(training.epochs):
            order = torch.randperm(x.shape[0], generator=shuffle)
            for begin in range(0, x.shape[0], training.batch_size):
                index = order[begin : begin + training.batch_size]
                loss = torch.nn.functional.cross_entropy(model(x[index]), y[index])
                opt.zero_grad()
                loss.backward()
                opt.step()
    return torch.cat([p.detach().reshape(-1) for p in model.state_dict().values()])


def test_fedavg_with_one_client_is_centralised_sgd_momentum_and_weight_decay() -> None:
    data = synthetic()
    training = LocalTraining(epochs=3, batch_size=16, lr=0.05, momentum=0.9, weight_decay=1e-3)
    sim = simulation(data, FedAvg(), training, shards=[np.arange(data.y_train.size)])
    sim.run_round()
    expected = centralised(data, training, rounds=1)
    torch.testing.assert_close(sim.global_vector, expected, rtol=0, atol=1e-6)


def test_fedavg_with_one_client_is_centralised_sgd_over_rounds_with_lr_decay() -> None:
    data = synthetic()
    training = LocalTraining(epochs=1, batch_size=20, lr=0.1, momentum=0.0, weight_decay=1e-3, lr_decay=0.5,
                             lr_decay_every=2)
    sim = simulation(data, FedAvg(), training, shards=[np.arange(data.y_train.size)])
    for _ in range(5):
        sim.run_round()
    torch.testing.assert_close(sim.global_vector, centralised(data, training, rounds=5), rtol=0, atol=1e-6)


def test_fedavg_weights_updates_by_client_size() -> None:
    data = synthetic(n=400)
    shards = [np.arange(0, 60), np.arange(60, 300)]
    training = LocalTraining(epochs=1, batch_size=32, lr=0.05)
    sim = simulation(data, FedAvg(), training, shards=shards)
    start = sim.global_vector.clone()
    # each client's local model, trained alone from the same start with the same generators
    locals_ = []
    for cid, shard in enumerate(shards):
        trainer = LocalTrainer(copy.deepcopy(sim.server.model.model), training=training, loss=make_loss("ce"))
        with sim.seeds.torch_global("client", 0, cid):
            result = trainer.train(node(sim, cid).data, start, lr=training.lr_at(0),
                                   shuffle=sim.seeds.torch("shuffle", 0, cid))
        locals_.append(result.vector)
    sim.run_round()
    n0, n1 = len(shards[0]), len(shards[1])
    expected = start + (n0 * (locals_[0] - start) + n1 * (locals_[1] - start)) / (n0 + n1)
    torch.testing.assert_close(sim.global_vector, expected, rtol=0, atol=1e-6)
    totals = [r for r in sim.stats.records if r.name == "total_samples"]
    assert len(totals) == 1 and totals[0].contributors == (0, 1) and totals[0].scalar() == n0 + n1
    # the server got the sizes' total and the weighted sum, never a client's own update or size
    (update,) = [r for r in sim.stats.records if r.name == "model_update"]
    assert update.contributors == (0, 1) and update.protocol == "clear"


# --- FedProx, SCAFFOLD, Reweighting -----------------------------------------------------------

def test_fedprox_with_mu_zero_is_fedavg() -> None:
    data = synthetic()
    shards = np.array_split(np.arange(data.y_train.size), 3)
    training = LocalTraining(epochs=1, batch_size=16, lr=0.05, momentum=0.5)
    a = simulation(data, FedAvg(), training, shards=shards)
    b = simulation(data, FedProx(FedProxParams(mu=0.0)), training, shards=shards)
    for _ in range(2):
        a.run_round()
        b.run_round()
    torch.testing.assert_close(a.global_vector, b.global_vector, rtol=0, atol=0)


def test_fedprox_adds_the_proximal_gradient() -> None:
    data = synthetic()
    training = LocalTraining(epochs=1, batch_size=data.y_train.size, lr=0.1)  # one full-batch step
    method = FedProx(FedProxParams(mu=0.5))
    sim = simulation(data, method, training, shards=[np.arange(data.y_train.size)])
    trainer = node(sim).trainer
    anchor = sim.global_vector.clone()
    start = anchor + 0.01  # local weights away from the anchor: the proximal pull is non-zero
    ctx_objective = client_half(sim, method).local_objective(  # type: ignore[attr-defined]
        SimpleNamespace(layout=trainer.layout, global_vector=anchor)
    )
    data0 = node(sim).data
    result = trainer.train(data0, start, lr=0.1, shuffle=torch.Generator().manual_seed(0), objective=ctx_objective)
    # the same step by autograd on loss + mu/2 ||w - anchor||^2
    trainer.layout.load(start)
    params = trainer.layout.parameters
    anchors = trainer.layout.parameter_views(anchor)
    loss = torch.nn.functional.cross_entropy(trainer.model(data0.x), data0.y)
    loss = loss + 0.25 * sum(((p - a) ** 2).sum() for p, a in zip(params, anchors))
    grads = torch.autograd.grad(loss, params)
    expected = torch.cat([(p - 0.1 * g).detach().reshape(-1) for p, g in zip(params, grads)])
    torch.testing.assert_close(result.vector, expected, rtol=1e-5, atol=1e-6)


def test_scaffold_with_one_client_is_fedavg() -> None:
    """With N = 1 the server's c equals the client's c_i after every round: no correction."""
    data = synthetic()
    training = LocalTraining(epochs=1, batch_size=16, lr=0.05, momentum=0.9)
    a = simulation(data, FedAvg(), training, shards=[np.arange(data.y_train.size)])
    b = simulation(data, Scaffold(), training, shards=[np.arange(data.y_train.size)])
    for _ in range(3):
        a.run_round()
        b.run_round()
    torch.testing.assert_close(a.global_vector, b.global_vector, rtol=0, atol=1e-5)


def test_scaffold_server_control_is_the_mean_of_client_controls() -> None:
    data = synthetic()
    shards = np.array_split(np.arange(data.y_train.size), 3)
    sim = simulation(data, Scaffold(ScaffoldParams(momentum_aware=False)),
                     LocalTraining(epochs=1, batch_size=16, lr=0.05), shards=shards)
    for _ in range(3):
        sim.run_round()
    controls = [node(sim, c).state["control"] for c in range(3)]  # each client's own c_i, in its node
    control = server_half(sim).control  # type: ignore[attr-defined]
    assert control is not None
    torch.testing.assert_close(control, torch.stack(controls).mean(0), rtol=0, atol=1e-6)
    assert {"control_update", "control_broadcast"} <= set(sim.stats.bytes_by_statistic())
    # c reaches the cohort as a runtime broadcast; the changes come back only as the secure sum
    assert {r.name for r in sim.stats.records} == {"total_samples", "model_update", "control_update"}
    # first round, plain SGD: c_i+ = (x - y_i) / (K lr), i.e. minus the client's update per step
    fresh = simulation(data, Scaffold(ScaffoldParams(momentum_aware=False)),
                       LocalTraining(epochs=1, batch_size=16, lr=0.05), shards=shards)
    start = fresh.global_vector.clone()
    fresh.run_round()
    state = node(fresh).state["control"]
    assert state.abs().max() > 0
    state_dict = server_half(fresh).state_dict()
    assert set(state_dict) == {"control"} and state_dict["control"].shape == start.shape


def test_inverse_frequency_weights() -> None:
    w = inverse_frequency_weights(np.array([30, 10, 0]))
    p = np.array([0.75, 0.25, 0.0])
    assert w[2] == 0 and w[0] / w[1] == pytest.approx(1 / 3)
    assert float((p * w).sum()) == pytest.approx(1.0)
    np.testing.assert_allclose(inverse_frequency_weights(np.array([5, 5]), power=0.0), [1.0, 1.0])
    with pytest.raises(ValueError):
        inverse_frequency_weights(np.zeros(3))


def test_weighted_cross_entropy_is_the_mean_of_weighted_sample_losses() -> None:
    logits = torch.randn(6, 3, generator=torch.Generator().manual_seed(0))
    target = torch.tensor([0, 1, 2, 0, 0, 1])
    weight = torch.tensor([0.5, 2.0, 1.0])
    per_sample = torch.nn.functional.cross_entropy(logits, target, reduction="none")
    assert CrossEntropy()(logits, target, class_weight=weight) == pytest.approx(
        float((weight[target] * per_sample).mean()))
    assert CrossEntropy()(logits, target) == pytest.approx(float(per_sample.mean()))


def test_reweighting_trains_with_its_clients_class_weights() -> None:
    data = synthetic()
    method = Reweighting()
    sim = simulation(data, method, LocalTraining(epochs=1, batch_size=16, lr=0.05),
                     shards=[np.arange(data.y_train.size)])
    ctx = SimpleNamespace(data=node(sim).data)
    objective = client_half(sim, method).local_objective(ctx)  # type: ignore[attr-defined]
    assert isinstance(objective, LocalObjective) and objective.class_weight is not None
    np.testing.assert_allclose(objective.class_weight.numpy(),
                               inverse_frequency_weights(node(sim).data.class_counts), rtol=1e-6)
    before = sim.global_vector.clone()
    sim.run_round()
    assert not torch.equal(before, sim.global_vector)


def test_weighted_mean_is_pytorchs_weighted_cross_entropy() -> None:
    """``weighted_mean``: one local step is one SGD step on ``CrossEntropyLoss(weight=w)`` (Σ w ℓ / Σ w)."""
    data = synthetic()
    sim = simulation(data, FedAvg(), LocalTraining(epochs=1, batch_size=16, lr=0.05), shards=[np.arange(data.y_train.size)])
    client, start = node(sim).data, sim.global_vector.clone()
    weight = torch.tensor([0.5, 3.0, 1.0])  # mean weight over the batch ≠ 1, so the division shows
    model = copy.deepcopy(node(sim).trainer.model)
    trainer = LocalTrainer(model, training=LocalTraining(epochs=1, batch_size=10_000, lr=0.1), loss=make_loss("ce"))
    steps = {}
    for flag in (False, True):
        result = trainer.train(client, start, lr=0.1, shuffle=torch.Generator().manual_seed(0),
                               objective=LocalObjective(class_weight=weight, weighted_mean=flag))
        steps[flag] = result.vector - start
    trainer.layout.load(start)
    loss = torch.nn.CrossEntropyLoss(weight=weight)(model(client.x), client.y)
    grads = torch.autograd.grad(loss, trainer.layout.parameters)
    torch.testing.assert_close(steps[True], -0.1 * torch.cat([g.reshape(-1) for g in grads]), rtol=1e-4, atol=1e-7)
    ratio = float(weight[client.y].mean())
    torch.testing.assert_close(steps[False], steps[True] * ratio, rtol=1e-4, atol=1e-7)


def test_reweighting_mean_option() -> None:
    data = synthetic()
    method = Reweighting(ReweightingParams(mean="weights"))
    sim = simulation(data, method, LocalTraining(epochs=1, batch_size=16, lr=0.05),
                     shards=[np.arange(data.y_train.size)])
    ctx = SimpleNamespace(data=node(sim).data)
    objective = client_half(sim, method).local_objective(ctx)  # type: ignore[attr-defined]
    assert objective.weighted_mean and objective.class_weight is not None
    assert not client_half(sim, Reweighting()).local_objective(ctx).weighted_mean  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match="mean"):
        ReweightingParams(mean="median")  # type: ignore[arg-type]
