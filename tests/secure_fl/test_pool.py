"""The client pool (issue 24): vectorised local training agrees with the per-client loop.

Two levels: :func:`train_cohort` against :meth:`LocalTrainer.train` client by client (every
model × loss, every kind of objective, uneven client sizes, empty clients, E > 1, momentum
with and without Nesterov), and the embedded engine run with ``clients = "vectorised"`` against
``"loop"`` for every method (same parameters after the rounds, same metrics to float
tolerance). Data: scikit-learn's digits.

``SECURE_FL_TEST_DEVICE=cuda`` runs the same checks with models, data and the cohort on the GPU
(the default, ``cpu``, is what CI runs); TF32 is switched off there so both paths do float32.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
import torch

from secure_fl import training_pool
from secure_fl.algorithms import ClientData, LocalObjective, LocalTrainer, LocalTraining
from secure_fl.config import parse_config
from secure_fl.data import load_dataset
from secure_fl.losses import LOSSES, Loss, make_loss, register_loss
from secure_fl.models import MLP, build_model
from secure_fl.runtime import build_simulation
from secure_fl.runtime.pool import ClientPool, cpu_state_budget, last_level_cache
from secure_fl.training_chain import linear_chain
from secure_fl.training_pool import (
    CohortJob,
    _rows_of_one_tensor,
    cohort_key,
    train_cohort,
    vectorisable,
)

DEVICE = torch.device(os.environ.get("SECURE_FL_TEST_DEVICE", "cpu"))
if DEVICE.type == "cuda":
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
SIZES = (37, 20, 12, 0, 29, 5)
"""Uneven clients, an empty one; with B = 8 every last batch has at least 3 samples (BatchNorm)."""


@pytest.fixture(scope="module")
def digits() -> tuple[torch.Tensor, torch.Tensor]:
    data = load_dataset("digits")
    return torch.from_numpy(data.x_train), torch.from_numpy(data.y_train)


def clients_of(digits: tuple[torch.Tensor, torch.Tensor], sizes: Sequence[int] = SIZES,
               channels: int = 1) -> list[ClientData]:
    x, y = digits
    out, begin = [], 0
    for cid, n in enumerate(sizes):
        xs = x[begin:begin + n].repeat(1, channels, 1, 1)
        ys = y[begin:begin + n]
        out.append(ClientData(cid, xs.to(DEVICE), ys.to(DEVICE), np.bincount(ys.numpy(), minlength=10)))
        begin += n
    return out


def objective(kind: str, client: ClientData, trainer: LocalTrainer, start: torch.Tensor) -> LocalObjective:
    g = torch.Generator().manual_seed(100 + client.client_id)
    if kind == "plain":
        return LocalObjective()
    if kind == "weights":
        return LocalObjective(class_weight=(torch.rand(10, generator=g) + 0.5).to(DEVICE))
    if kind == "weighted_mean":
        return LocalObjective(class_weight=(torch.rand(10, generator=g) + 0.5).to(DEVICE), weighted_mean=True)
    if kind == "shift":
        return LocalObjective(logit_shift=torch.randn(10, generator=g).to(DEVICE))
    if kind == "proximal":  # FedProx's correction, mu = 0.1
        anchor = trainer.layout.parameter_views(start)

        def proximal(params: Sequence[torch.Tensor], grads: Sequence[torch.Tensor]) -> None:
            torch._foreach_add_(list(grads), torch._foreach_sub(list(params), anchor), alpha=0.1)

        return LocalObjective(gradient_correction=proximal)
    raise AssertionError(kind)


def compare(trainer: LocalTrainer, clients: Sequence[ClientData], kind: str, *, lr: float | Sequence[float] = 0.05,
            atol: float = 1e-5) -> None:
    start = trainer.layout.flatten()
    lrs = [lr] * len(clients) if isinstance(lr, float) else list(lr)
    loop = [trainer.train(c, start, lr=r, shuffle=torch.Generator().manual_seed(c.client_id),
                          objective=objective(kind, c, trainer, start)) for c, r in zip(clients, lrs)]
    jobs = [CohortJob(data=c, start=start, lr=r, shuffle=torch.Generator().manual_seed(c.client_id),
                      objective=objective(kind, c, trainer, start)) for c, r in zip(clients, lrs)]
    together = train_cohort(trainer, jobs)
    for c, a, b in zip(clients, loop, together):
        assert a.steps == b.steps, c.client_id
        assert b.loss == pytest.approx(a.loss, rel=1e-4, abs=1e-6), c.client_id
        torch.testing.assert_close(b.vector, a.vector, atol=atol, rtol=1e-4, msg=lambda text, c=c: f"client {c.client_id}: {text}")
    assert not torch.equal(together[0].vector, start)  # it trained


TRAINING = LocalTraining(epochs=2, batch_size=8, lr=0.05, momentum=0.9, weight_decay=1e-3)


@pytest.mark.parametrize("loss", sorted(LOSSES))
@pytest.mark.parametrize("kind", ["plain", "weighted_mean", "shift"])
def test_every_loss_matches_the_loop(digits: Any, loss: str, kind: str) -> None:
    torch.manual_seed(0)
    model = build_model("mlp", input_shape=(1, 8, 8), num_classes=10, hidden=(16,)).to(DEVICE)
    compare(LocalTrainer(model, training=TRAINING, loss=make_loss(loss)), clients_of(digits), kind)


@pytest.mark.parametrize("kind", ["weights", "proximal"])
@pytest.mark.parametrize("nesterov", [False, True])
def test_objectives_and_the_optimiser_match_the_loop(digits: Any, kind: str, nesterov: bool) -> None:
    torch.manual_seed(0)
    model = build_model("mlp", input_shape=(1, 8, 8), num_classes=10, hidden=(16,)).to(DEVICE)
    training = LocalTraining(epochs=2, batch_size=8, lr=0.05, momentum=0.9, weight_decay=1e-3, nesterov=nesterov)
    compare(LocalTrainer(model, training=training, loss=make_loss("ce")), clients_of(digits), kind)


@pytest.mark.parametrize("nesterov", [False, True])
def test_clients_on_different_learning_rates_match_the_loop(digits: Any, nesterov: bool) -> None:
    """One rate for the cohort takes the fused optimiser step; rates per client the per-row one."""
    torch.manual_seed(0)
    model = build_model("mlp", input_shape=(1, 8, 8), num_classes=10, hidden=(16,)).to(DEVICE)
    training = LocalTraining(epochs=2, batch_size=8, lr=0.05, momentum=0.9, weight_decay=1e-3, nesterov=nesterov)
    clients = clients_of(digits)
    compare(LocalTrainer(model, training=training, loss=make_loss("ce")), clients, "proximal",
            lr=[0.05 * 0.5 ** (i % 3) for i in range(len(clients))])


def test_starts_of_any_layout_and_precision_train_alike(digits: Any) -> None:
    """Each client's start is copied into the cohort's rows as it comes: a strided view or a
    float64 vector trains exactly like the contiguous float32 one."""
    torch.manual_seed(0)
    model = build_model("mlp", input_shape=(1, 8, 8), num_classes=10, hidden=(16,)).to(DEVICE)
    trainer = LocalTrainer(model, training=TRAINING, loss=make_loss("ce"))
    start = trainer.layout.flatten()
    strided = torch.stack([start, torch.zeros_like(start)], dim=1)[:, 0]
    assert not strided.is_contiguous()
    clients = clients_of(digits)

    def train(first: torch.Tensor) -> list[torch.Tensor]:
        starts = [first] + [start] * (len(clients) - 1)
        jobs = [CohortJob(data=c, start=s, lr=0.05, shuffle=torch.Generator().manual_seed(c.client_id),
                          objective=LocalObjective()) for c, s in zip(clients, starts)]
        return [r.vector for r in train_cohort(trainer, jobs)]

    reference = train(start)
    for first in (strided, start.double()):
        for a, b in zip(reference, train(first)):
            assert a.dtype == b.dtype == torch.float32
            assert torch.equal(a, b)


@pytest.mark.parametrize("norm", [False, True])
def test_clients_sliced_from_one_tensor_train_like_separate_ones(digits: Any, norm: bool) -> None:
    """Row slices of one tensor (``client_data``'s layout) take the one-gather path; copies the
    per-client one. With BatchNorm, batches of one width train as a group that need not be a
    prefix of the cohort (the gather's indexed path)."""
    torch.manual_seed(0)
    if norm:
        model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 16), torch.nn.BatchNorm1d(16),
                                    torch.nn.ReLU(), torch.nn.Linear(16, 10)).to(DEVICE)
    else:
        model = build_model("mlp", input_shape=(1, 8, 8), num_classes=10, hidden=(16,)).to(DEVICE)
    trainer = LocalTrainer(model, training=TRAINING, loss=make_loss("ce"))
    separate = clients_of(digits)
    whole_x = torch.cat([c.x for c in separate])
    whole_y = torch.cat([c.y for c in separate])
    sliced, begin = [], 0
    for c in separate:
        n = c.num_samples
        sliced.append(ClientData(c.client_id, whole_x[begin:begin + n], whole_y[begin:begin + n], c.class_counts))
        begin += n
    assert _rows_of_one_tensor([c.x for c in sliced]) is not None
    assert _rows_of_one_tensor([c.x for c in separate]) is None
    start = trainer.layout.flatten()

    def train(clients: Sequence[ClientData]) -> list[torch.Tensor]:
        jobs = [CohortJob(data=c, start=start, lr=0.05, shuffle=torch.Generator().manual_seed(c.client_id),
                          objective=LocalObjective()) for c in clients]
        return [r.vector for r in train_cohort(trainer, jobs)]

    for a, b in zip(train(separate), train(sliced)):
        assert torch.equal(a, b)  # the same rows, gathered either way
    compare(trainer, sliced, "plain")


@pytest.mark.parametrize("name", ["lenet5", "climb_cnn", "cnn7"])
def test_convolutional_models_match_the_loop(digits: Any, name: str) -> None:
    torch.manual_seed(0)
    model = build_model(name, input_shape=(1, 8, 8), num_classes=10).to(DEVICE)
    compare(LocalTrainer(model, training=TRAINING, loss=make_loss("ce")), clients_of(digits), "weighted_mean",
            lr=0.01)


def test_linear_chains_take_the_hand_written_step_and_nothing_else() -> None:
    """The MLP (any depth) and a plain Flatten-Linear-ReLU Sequential are chains; a model with any
    other layer, another flatten, or its own forward goes through torch.func."""
    def mlp(**options: Any) -> torch.nn.Module:
        return build_model("mlp", input_shape=(1, 8, 8), num_classes=10, **options)

    layers = linear_chain(mlp(hidden=(16, 12)))
    assert layers is not None
    assert [(layer.weight, layer.bias, layer.relu) for layer in layers] == [
        ("net.1.weight", "net.1.bias", True), ("net.3.weight", "net.3.bias", True), ("net.5.weight", "net.5.bias", False)]
    nn = torch.nn
    assert linear_chain(nn.Sequential(nn.Flatten(), nn.Linear(64, 10, bias=False))) is not None

    class Scaled(MLP):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return 2 * super().forward(x)

    refused: list[torch.nn.Module] = [
        build_model("lenet5", input_shape=(1, 8, 8), num_classes=10),
        Scaled(input_shape=(1, 8, 8), num_classes=10),
        nn.Sequential(nn.Linear(8, 10)),  # no Flatten: Linear would act on the last axis only
        nn.Sequential(nn.Flatten(start_dim=2), nn.Linear(8, 10)),
        nn.Sequential(nn.Flatten(), nn.Linear(64, 16), nn.Dropout(), nn.Linear(16, 10)),
        nn.Sequential(nn.Flatten(), nn.Linear(64, 16), nn.Tanh(), nn.Linear(16, 10)),
        nn.Sequential(nn.Flatten(), nn.Linear(64, 16), nn.ReLU(), nn.ReLU(), nn.Linear(16, 10)),
        nn.Sequential(nn.Flatten(), nn.Linear(64, 16), nn.BatchNorm1d(16), nn.Linear(16, 10)),
        nn.Sequential(nn.Flatten()),
    ]
    assert [linear_chain(model) for model in refused] == [None] * len(refused)


@pytest.mark.parametrize("kind", ["plain", "weights", "weighted_mean", "shift", "proximal"])
@pytest.mark.parametrize("loss", ["ce", "focal", "ghmc", "mfe"])
def test_deep_and_bias_free_chains_match_the_loop(digits: Any, kind: str, loss: str) -> None:
    """Two ReLU layers, and a chain without biases or a ReLU before the logits: the hand-written
    backward agrees with the loop's autograd for every kind of objective."""
    torch.manual_seed(0)
    deep = build_model("mlp", input_shape=(1, 8, 8), num_classes=10, hidden=(16, 12)).to(DEVICE)
    nn = torch.nn
    bare = nn.Sequential(nn.Flatten(), nn.Linear(64, 16, bias=False), nn.ReLU(), nn.Linear(16, 10, bias=False),
                         nn.ReLU()).to(DEVICE)
    for model in (deep, bare):
        assert linear_chain(model) is not None
        compare(LocalTrainer(model, training=TRAINING, loss=make_loss(loss)), clients_of(digits), kind)


def test_the_chain_step_agrees_with_the_torch_func_step(digits: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same cohort trained with the hand-written step and, with it switched off, through torch.func."""
    torch.manual_seed(0)
    model = build_model("mlp", input_shape=(1, 8, 8), num_classes=10, hidden=(16, 12)).to(DEVICE)
    trainer = LocalTrainer(model, training=TRAINING, loss=make_loss("focal"))
    start = trainer.layout.flatten()
    clients = clients_of(digits)

    def train() -> list[Any]:
        return train_cohort(trainer, [CohortJob(data=c, start=start, lr=0.05, shuffle=torch.Generator().manual_seed(
            c.client_id), objective=objective("shift", c, trainer, start)) for c in clients])

    chained = train()
    monkeypatch.setattr(training_pool, "linear_chain", lambda _model: None)
    functional = train()
    for a, b in zip(chained, functional):
        assert a.steps == b.steps
        assert a.loss == pytest.approx(b.loss, rel=1e-5, abs=1e-7)
        torch.testing.assert_close(a.vector, b.vector, atol=1e-5, rtol=1e-5)


@pytest.mark.slow
def test_batch_norm_keeps_per_client_running_statistics(digits: Any) -> None:
    torch.manual_seed(0)
    model = build_model("resnet18", input_shape=(3, 8, 8), num_classes=10).to(DEVICE)
    training = LocalTraining(epochs=1, batch_size=8, lr=0.01, momentum=0.9)
    trainer = LocalTrainer(model, training=training, loss=make_loss("ce"))
    clients = clients_of(digits, (19, 11, 8), channels=3)
    # digits' constant border pixels leave near-zero BatchNorm variances, which magnify the batched
    # convolutions' different summation order (conv nets without BatchNorm agree to 1e-5 above)
    # on an H200 (cuDNN, TF32 off) 80 of 11.2M entries differed by up to 0.012 after one epoch; on
    # the CPU the kernels, hence the order, depend on the processor: 2 entries by up to 0.0058 on
    # a 2-vCPU Xeon with AVX-512 and AMX (2026-11-26), none above 0.005 on the earlier development box
    compare(trainer, clients, "plain", lr=0.01, atol=1e-2 if DEVICE.type == "cpu" else 3e-2)
    start = trainer.layout.flatten()
    out = train_cohort(trainer, [CohortJob(data=c, start=start, lr=0.01, shuffle=torch.Generator().manual_seed(0),
                                           objective=LocalObjective()) for c in clients])
    running = trainer.layout.slice_of("stem.1.running_mean")
    assert not torch.allclose(out[0].vector[running], out[1].vector[running])  # each client its own


def test_mixed_objectives_are_refused_in_one_cohort(digits: Any) -> None:
    model = build_model("mlp", input_shape=(1, 8, 8), num_classes=10, hidden=(4,)).to(DEVICE)
    trainer = LocalTrainer(model, training=TRAINING, loss=make_loss("ce"))
    start = trainer.layout.flatten()
    a, b = clients_of(digits, (8, 8))
    jobs = [CohortJob(data=a, start=start, lr=0.1, shuffle=torch.Generator(), objective=LocalObjective()),
            CohortJob(data=b, start=start, lr=0.1, shuffle=torch.Generator(),
                      objective=LocalObjective(logit_shift=torch.zeros(10)))]
    assert cohort_key(jobs[0]) != cohort_key(jobs[1])
    with pytest.raises(ValueError, match="different kinds"):
        train_cohort(trainer, jobs)


@register_loss("test_pool_opaque")
@dataclass(frozen=True)
class Opaque(Loss):
    """A loss with no batched form: the pool must not take it."""

    def __call__(self, logits: torch.Tensor, target: torch.Tensor, *,
                 class_weight: torch.Tensor | None = None) -> torch.Tensor:
        return torch.nn.functional.cross_entropy(logits, target)


def test_a_loss_without_a_batched_form_is_not_vectorisable() -> None:
    model = build_model("mlp", input_shape=(1, 8, 8), num_classes=10, hidden=(4,)).to(DEVICE)
    trainer = LocalTrainer(model, training=TRAINING, loss=Opaque())
    assert "no batched form" in (vectorisable(trainer) or "")
    with pytest.raises(ValueError, match="no batched form"):
        ClientPool(trainer)


def test_chunks_by_memory_budget_give_the_same_results(digits: Any) -> None:
    model = build_model("mlp", input_shape=(1, 8, 8), num_classes=10, hidden=(16,)).to(DEVICE)
    trainer = LocalTrainer(model, training=TRAINING, loss=make_loss("ce"))
    clients = clients_of(digits)
    start = trainer.layout.flatten()

    def run(budget: int | None) -> tuple[list[torch.Tensor], int]:
        pool = ClientPool(trainer, memory_budget=budget)
        pending = [pool.submit(lambda t, c=c: (t.train(c, start, lr=0.05, shuffle=torch.Generator().manual_seed(
            c.client_id)), None), {}) for c in clients]  # type: ignore[misc]
        pool.resolve()
        return [p.result()[0].vector for p in pending], pool.cohorts  # type: ignore[union-attr]

    whole, one = run(None)
    chunked, many = run(1)  # one client per chunk
    assert one == 1 and many == len(clients)
    for a, b in zip(whole, chunked):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)


def test_chunks_hold_clients_of_like_sizes(digits: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A chunk runs as many steps as its largest client: the pool chunks clients largest first,
    whatever order they came in, and each still gets its own result."""
    model = build_model("mlp", input_shape=(1, 8, 8), num_classes=10, hidden=(16,)).to(DEVICE)
    trainer = LocalTrainer(model, training=TRAINING, loss=make_loss("ce"))
    clients = clients_of(digits, sizes=(5, 37, 12, 29))
    start = trainer.layout.flatten()
    calls: list[list[int]] = []

    def recording(trainer_: LocalTrainer, jobs: Sequence[CohortJob]) -> list[Any]:
        calls.append([job.data.num_samples for job in jobs])
        return train_cohort(trainer_, jobs)

    monkeypatch.setattr("secure_fl.runtime.pool.train_cohort", recording)
    per_client = training_pool.client_bytes(trainer, clients[1].x, batch_size=TRAINING.batch_size, samples=37)
    pool = ClientPool(trainer, memory_budget=2 * per_client)  # two clients a chunk
    pending = [pool.submit(lambda t, c=c: (t.train(c, start, lr=0.05, shuffle=torch.Generator().manual_seed(
        c.client_id)), None), {}) for c in clients]  # type: ignore[misc]
    pool.resolve()
    assert calls == [[37, 29], [12, 5]]
    assert trainer._optimizer is None  # the pool never builds torch.optim's (its import alone is ~0.9 s)
    for c, p in zip(clients, pending):
        alone = trainer.train(c, start, lr=0.05, shuffle=torch.Generator().manual_seed(c.client_id))
        torch.testing.assert_close(p.result()[0].vector, alone.vector, atol=1e-5, rtol=1e-4)  # type: ignore[union-attr]


# --- the engine: vectorised and loop give the same run ---------------------------------------------

METHODS = {
    "fedavg": '"fedavg"',
    "fedprox": '{ name = "fedprox", mu = 0.1 }',
    "scaffold": '"scaffold"',
    "fedshift": '"fedshift"',
    "climb": '{ name = "climb", primal_steps = 1 }',
    "reweighting": '"reweighting"',
    "ratio_loss": '"ratio_loss"',
}


def run_config(method: str, clients: str, *, loss: str = "ce", extra: str = "") -> Any:
    loss_name = "ratio" if method == "ratio_loss" else loss
    text = f"""
seed = 5
[data]
dataset = "digits"
num_clients = 8
train_samples = 1000
partition = "dirichlet"
partition_params = {{ alpha = 0.5 }}
[model]
name = "mlp"
hidden = [16]
[train]
rounds = 3
clients_per_round = 6
batch_size = 16
lr = 0.05
momentum = 0.9
weight_decay = 1e-4
[loss]
name = "{loss_name}"
[runtime]
clients = "{clients}"
{extra}
[[runs]]
method = {METHODS[method]}
"""
    return parse_config(text).runs[0]


def play(cfg: Any, rounds: int = 3) -> tuple[Any, list[dict[str, Any]]]:
    sim = build_simulation(cfg, device=DEVICE)
    sim.setup()
    metrics = []
    for _ in range(rounds):
        sim.run_round()
        metrics.append(sim.evaluate())
    return sim, metrics


@pytest.mark.parametrize("method", sorted(METHODS))
def test_vectorised_and_loop_runs_agree(method: str) -> None:
    vec, vec_metrics = play(run_config(method, "vectorised"))
    loop, loop_metrics = play(run_config(method, "loop"))
    assert vec.pool is not None and loop.pool is None
    assert vec.pool.cohorts == 3  # one cohort a round: every node's training was pending together
    torch.testing.assert_close(vec.global_vector, loop.global_vector, atol=1e-5, rtol=1e-4)
    for a, b in zip(vec_metrics, loop_metrics):
        assert a["accuracy"] == pytest.approx(b["accuracy"], abs=2 / 360)  # at most a couple of test images
        assert a["test_loss"] == pytest.approx(b["test_loss"], rel=1e-4)


def test_a_checkpointed_vectorised_run_resumes_like_the_loop() -> None:
    cfg = run_config("scaffold", "vectorised")
    sim, _ = play(cfg, rounds=2)
    checkpoint = sim.checkpoint()
    resumed = build_simulation(cfg, device=DEVICE)
    resumed.prepare_resume(checkpoint)
    resumed.setup()
    resumed.restore(checkpoint)
    resumed.run_round()
    sim.run_round()
    torch.testing.assert_close(resumed.global_vector, sim.global_vector, atol=1e-6, rtol=1e-5)


def test_what_cannot_be_vectorised_falls_back_to_the_loop_and_says_so(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="secure_fl.run"):
        sim, _ = play(run_config("fedavg", "vectorised", loss="test_pool_opaque"), rounds=1)
    assert sim.pool is None
    said = [r.getMessage() for r in caplog.records if "does not apply" in r.getMessage()]
    assert len(said) == 1 and "no batched form" in said[0]


def test_the_cpu_chunk_budget_follows_the_last_level_cache(tmp_path: Any) -> None:
    for index, size in (("index0", "48K"), ("index2", "1024K"), ("index3", "32768K"), ("index4", "n/a")):
        (tmp_path / index).mkdir()
        (tmp_path / index / "size").write_text(size + "\n")
    assert last_level_cache(tmp_path) == 32 << 20
    assert last_level_cache(tmp_path / "missing") is None
    assert cpu_state_budget(32 << 20) == 16 << 20
    assert cpu_state_budget(96 << 20) == 48 << 20
    assert cpu_state_budget(480 << 20) == 128 << 20  # capped
    assert cpu_state_budget(4 << 20) == 16 << 20  # a chunk still amortises a step's fixed cost
    assert cpu_state_budget(None) == 128 << 20
