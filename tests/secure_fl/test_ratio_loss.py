"""Ratio Loss (paper 002): Eq. 6 and Eq. 7 on hand-made numbers, the per-class auxiliary updates
against autograd, the monitor on a short real run, the secure round total, the losses (GHMC,
Ratio, MSE, MFE), the method's two halves (broadcast, the server's held-out data, errors, resume),
the harness's scoring of the monitor (simulator telemetry) and the report tables."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from protocols import SERVER, PolicyError
from secure_fl.algorithms import FlatLayout, HeldOut, ServerRound, ServerSetup, make_algorithm
from secure_fl.algorithms.ratio_loss import (
    BROADCAST,
    MONITOR_COSINE,
    PARTITION_COSINE,
    VARIANTS,
    RatioLossParams,
    RatioLossServer,
    auxiliary_from_holdout,
    monitor_history,
    partition_cosine,
    score_history,
    true_composition,
    variant_metric,
)
from secure_fl.algorithms.ratio_monitor import (
    MONITOR_TOTAL,
    ImbalanceDetector,
    OutputLayer,
    auxiliary_class_updates,
    class_ratios,
    cosine_similarity,
    estimate_composition,
    ratio_matrix,
    recipe_step,
)
from secure_fl.audit.ledger import build_ledger
from secure_fl.config import RunConfig
from secure_fl.losses import make_loss
from secure_fl.runtime import build_simulation
from secure_fl.runtime.simulation import RoundResult, Simulation

WEAK = {"key_bits": 1024, "allow_weak_keys": True}


# --- Eq. 6: the ratios, by hand --------------------------------------------------------------------

def _hand_updates() -> np.ndarray:
    """(C=3, C=3, s=2): u[q, p, i] = update of W_(p,i) from class q's auxiliary samples."""
    u = np.zeros((3, 3, 2))
    u[0, 0], u[1, 0], u[2, 0] = [4.0, 2.0], [-1.0, -1.0], [-3.0, 0.5]
    u[1, 1], u[0, 1], u[2, 1] = [3.0, 0.0], [-1.0, 0.0], [-2.0, 0.0]
    u[2, 2], u[0, 2], u[1, 2] = [1.0, 1.0], [-0.5, -4.0], [-0.5, 0.0]
    return u


def test_ratio_matrix_by_hand() -> None:
    ra = ratio_matrix(_hand_updates())
    # Ra_{p,i} = (Q−1) u[p,p,i] / Σ_{j≠p} u[j,p,i], Q = 3
    assert ra[0, 0] == pytest.approx(2 * 4.0 / (-1.0 - 3.0))      # −2
    assert ra[0, 1] == pytest.approx(2 * 2.0 / (-1.0 + 0.5))      # −8
    assert ra[1, 0] == pytest.approx(2 * 3.0 / (-1.0 - 2.0))      # −2
    assert math.isnan(ra[1, 1])                                   # 0 / 0: a dead unit
    assert ra[2, 0] == pytest.approx(2 * 1.0 / (-0.5 - 0.5))      # −2
    assert ra[2, 1] == pytest.approx(2 * 1.0 / (-4.0 + 0.0))      # −0.5


def test_class_ratios_by_hand() -> None:
    u = _hand_updates()
    # the paper: |mean_i Ra_{p,i}| over the defined components
    assert class_ratios(u, "mean") == pytest.approx([5.0, 2.0, 1.25])
    assert class_ratios(u, "median") == pytest.approx([5.0, 2.0, 1.25])
    # pooled: |(Q−1) Σ_i own / Σ_i others|
    assert class_ratios(u, "pooled") == pytest.approx([2 * 6.0 / 4.5, 2 * 3.0 / 3.0, 2 * 2.0 / 5.0])
    three = np.concatenate([u, u[:, :, :1] * np.array([1.0, 1.0, 1.0])[:, None, None]], axis=2)
    three[0, 0, 2], three[1, 0, 2], three[2, 0, 2] = 1.0, -1e-6, 0.0  # one near-zero denominator
    assert class_ratios(three, "mean")[0] > 1e4            # the paper's mean blows up …
    assert class_ratios(three, "median")[0] == pytest.approx(8.0)   # … the median does not


# --- Eq. 7: the estimate, on exact linear models -----------------------------------------------------

def _linear_round(counts: np.ndarray, *, equal_others: bool, k: int = 4, seed: int = 0):
    """Per-sample templates a (own, > 0) and b (others, < 0) per output node, and the round's ΔG."""
    rng = np.random.default_rng(seed)
    c, s = counts.size, 6
    n_a = np.full(c, 8.0)
    per = np.zeros((c, c, s))
    for p in range(c):
        own = rng.uniform(1.0, 2.0, s)
        for q in range(c):
            per[q, p] = own if q == p else (-own / 4.0 if equal_others else -rng.uniform(0.1, 0.6, s))
    aux_updates = per * n_a[:, None, None]                  # the updates of n_a samples of class q
    before = rng.normal(size=(c, s))
    delta = np.einsum("q,qps->ps", counts, per) / k          # unweighted mean of the K clients' updates
    return before, before + delta, aux_updates, n_a


def test_paper_estimator_is_exact_when_eq7_holds() -> None:
    counts = np.array([120.0, 30.0, 75.0, 400.0])
    before, after, aux, n_a = _linear_round(counts, equal_others=True)
    for estimator in ("paper", "pooled"):
        est = estimate_composition(before, after, aux, counts.sum(), aux_counts=n_a, clients=4, estimator=estimator)
        np.testing.assert_allclose(est, counts, rtol=1e-9)
    # |Ra| = (Q−1)·4/(Q−1) = 4 > 1.25 everywhere here; a higher threshold keeps nothing → all components
    est = estimate_composition(before, after, aux, counts.sum(), aux_counts=n_a, clients=4, threshold=10.0)
    np.testing.assert_allclose(est, counts, rtol=1e-9)


def test_threshold_drops_the_components_that_break_eq7() -> None:
    counts = np.array([50.0, 10.0, 90.0])
    before, after, aux, n_a = _linear_round(counts, equal_others=True, k=3, seed=1)
    # add a component per class with |Ra| = 1 < T_Ra whose global change is garbage
    aux = np.concatenate([aux, np.zeros((3, 3, 1))], axis=2)
    for p in range(3):
        for q in range(3):
            aux[q, p, -1] = 8.0 if q == p else -8.0
    before = np.concatenate([before, np.zeros((3, 1))], axis=1)
    after = np.concatenate([after, np.full((3, 1), 5.0)], axis=1)
    ra = ratio_matrix(aux)
    assert np.allclose(np.abs(ra[:, -1]), 1.0)
    est = estimate_composition(before, after, aux, counts.sum(), aux_counts=n_a, clients=3)
    np.testing.assert_allclose(est, counts, rtol=1e-9)
    unfiltered = estimate_composition(before, after, aux, counts.sum(), aux_counts=n_a, clients=3, threshold=0.0)
    assert not np.allclose(unfiltered, counts, rtol=1e-3)


def test_least_squares_is_exact_on_any_linear_round_and_paper_is_close() -> None:
    counts = np.array([200.0, 20.0, 60.0, 150.0, 5.0])
    before, after, aux, n_a = _linear_round(counts, equal_others=False, k=5, seed=2)
    est = estimate_composition(before, after, aux, counts.sum(), aux_counts=n_a, clients=5, estimator="lstsq")
    np.testing.assert_allclose(est, counts, rtol=1e-6)
    paper = estimate_composition(before, after, aux, counts.sum(), aux_counts=n_a, clients=5)
    assert cosine_similarity(paper, counts) > 0.9


def test_calibration_recovers_a_wrong_step() -> None:
    counts = np.array([120.0, 30.0, 75.0, 400.0])
    before, after, aux, n_a = _linear_round(counts, equal_others=True)
    wrong = 3.0 * aux                                        # the recipe's step overstated 3×
    off = estimate_composition(before, after, wrong, counts.sum(), aux_counts=n_a, clients=4)
    assert not np.allclose(off, counts, rtol=1e-2)
    fixed = estimate_composition(before, after, wrong, counts.sum(), aux_counts=n_a, clients=4, calibrate=True)
    np.testing.assert_allclose(fixed, counts, rtol=1e-9)


def test_estimate_validates_its_inputs() -> None:
    before, after, aux, n_a = _linear_round(np.array([1.0, 2.0, 3.0]), equal_others=True, k=2)
    with pytest.raises(ValueError, match="aux_updates"):
        estimate_composition(before, after, aux[:2], 6.0, aux_counts=n_a, clients=2)
    with pytest.raises(ValueError, match="clients"):
        estimate_composition(before, after, aux, 6.0, aux_counts=n_a, clients=0)
    with pytest.raises(ValueError, match="estimator"):
        estimate_composition(before, after, aux, 6.0, aux_counts=n_a, clients=2, estimator="magic")  # type: ignore[arg-type]


def test_recipe_step() -> None:
    assert recipe_step(0.01, epochs=2, batch_size=32) == pytest.approx(0.01 * 2 / 32)
    assert recipe_step(0.01, epochs=1, batch_size=10, momentum=0.9) == pytest.approx(0.01 / 10 / 0.1)
    with pytest.raises(ValueError):
        recipe_step(0.0, epochs=1, batch_size=1)


# --- the per-class auxiliary updates against autograd ------------------------------------------------

def test_auxiliary_class_updates_match_autograd() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(6, 5), nn.ReLU(), nn.Linear(5, 3))
    layout = FlatLayout(model)
    vector = layout.flatten()
    x, y = torch.randn(12, 1, 2, 3), torch.tensor([0, 1, 2] * 4)
    w = np.array([1.0, 2.0, 0.5])
    got = auxiliary_class_updates(model, layout, vector, x, y, num_classes=3, step=0.1, class_weight=w)
    for q in range(3):
        model.zero_grad()
        mask = y == q
        loss = float(w[q]) * F.cross_entropy(model(x[mask]), y[mask], reduction="sum")
        loss.backward()
        expected = -0.1 * model[3].weight.grad.double().numpy()
        np.testing.assert_allclose(got[q], expected, rtol=1e-5, atol=1e-8)
    torch.testing.assert_close(layout.flatten(), vector)    # the model is left as it was
    out = OutputLayer.of(model, layout, 3)
    np.testing.assert_array_equal(out.weights(vector), model[3].weight.detach().double().numpy())


# --- the detector --------------------------------------------------------------------------------------

def test_detector_needs_a_persistent_similar_imbalance() -> None:
    d = ImbalanceDetector(rounds=3, similarity=0.8, ratio=5.0)
    balanced = [100.0, 100.0, 100.0]
    skewed = [300.0, 100.0, 10.0]
    assert not d.observe(0, balanced)
    assert not d.observe(1, skewed) and not d.observe(2, skewed)
    assert not d.observe(3, balanced)                     # the streak breaks
    assert not d.observe(4, skewed) and not d.observe(5, [310.0, 95.0, 12.0])
    assert d.observe(6, skewed) and d.detected_round == 6
    assert d.observe(7, balanced)                         # detection is sticky
    other = ImbalanceDetector()
    other.load_state_dict(d.state_dict())
    assert other.state_dict() == d.state_dict()
    # imbalanced every round, but the rarest class moves: noise, not a persistent imbalance
    moving = ImbalanceDetector(rounds=2, similarity=-1.0, ratio=2.0)
    assert not moving.observe(0, [300.0, 10.0, 100.0]) and not moving.observe(1, [10.0, 300.0, 100.0])
    assert not moving.observe(2, [100.0, 300.0, 10.0])
    # mild imbalance (max/min ≤ ratio) never fires
    mild = ImbalanceDetector(rounds=1, ratio=5.0)
    assert not any(mild.observe(r, [120.0, 100.0, 30.0]) for r in range(5))


# --- losses ------------------------------------------------------------------------------------------

def _batch(n: int = 10, c: int = 4, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, c, generator=g) * 2, torch.randint(0, c, (n,), generator=g)


def test_ratio_loss_is_eq11() -> None:
    logits, target = _batch()
    loss = make_loss("ratio", {"alpha": 1.0, "beta": 0.1})
    ratios = torch.tensor([5.0, -2.0, 0.0, 30.0])
    w = loss.class_weights(ratios)
    torch.testing.assert_close(w, torch.tensor([1.5, 1.2, 1.0, 4.0]))
    per = -F.log_softmax(logits, -1)[torch.arange(10), target]
    assert float(loss(logits, target, class_weight=w)) == pytest.approx(float((w[target] * per).mean()), rel=1e-6)
    assert float(loss(logits, target)) == pytest.approx(float(per.mean()), rel=1e-6)  # no ℝ yet: α·CE
    with pytest.raises(ValueError):
        make_loss("ratio", {"alpha": -1.0})


def test_ghmc_weights_by_hand() -> None:
    # p_t of the true class: 0.95, 0.95, 0.95, 0.5 → g = 0.05, 0.05, 0.05, 0.5: bins 0 (3) and 5 (1)
    probs = torch.tensor([[0.95, 0.05], [0.95, 0.05], [0.05, 0.95], [0.5, 0.5]])
    logits, target = probs.log(), torch.tensor([0, 0, 1, 0])
    ghmc = make_loss("ghmc")
    beta = ghmc.harmonizing_weights(logits, target)
    torch.testing.assert_close(beta, torch.tensor([4 / (3 * 2), 4 / (3 * 2), 4 / (3 * 2), 4 / (1 * 2)]))
    ce = F.cross_entropy(logits, target, reduction="none")
    assert float(ghmc(logits, target)) == pytest.approx(float((beta * ce).mean()), rel=1e-6)
    # one occupied bin: every weight is 1, GHMC = CE
    same, t = torch.zeros(5, 3), torch.zeros(5, dtype=torch.long)
    assert float(ghmc(same, t)) == pytest.approx(float(F.cross_entropy(same, t)), rel=1e-6)


def test_mse_and_mfe() -> None:
    logits, target = _batch(12, 3, seed=3)
    p = F.softmax(logits, -1)
    e = 0.5 * ((p - F.one_hot(target, 3)) ** 2).sum(-1)
    assert float(make_loss("mse")(logits, target)) == pytest.approx(float(e.mean()), rel=1e-6)
    means = [e[target == c].mean() for c in range(3) if (target == c).any()]
    assert float(make_loss("mfe", {"reduction": "sum"})(logits, target)) == pytest.approx(float(sum(means)), rel=1e-6)
    assert float(make_loss("mfe")(logits, target)) == pytest.approx(float(sum(means) / len(means)), rel=1e-6)
    assert float(make_loss("mfe", {"variant": "msfe", "reduction": "sum"})(logits, target)) == pytest.approx(
        float(sum(m ** 2 for m in means)), rel=1e-6)
    # binary: FPE + FNE, the minority (positive) class weighs as much as the majority
    two = torch.tensor([[2.0, 0.0]] * 9 + [[0.0, 1.0]])
    t = torch.tensor([0] * 9 + [1])
    e2 = 0.5 * ((F.softmax(two, -1) - F.one_hot(t, 2)) ** 2).sum(-1)
    fpe, fne = e2[:9].mean(), e2[9:].mean()
    assert float(make_loss("mfe", {"reduction": "sum"})(two, t)) == pytest.approx(float(fpe + fne), rel=1e-6)
    with pytest.raises(ValueError):
        make_loss("mfe", {"variant": "other"})


def test_every_new_loss_trains_backward() -> None:
    logits, target = _batch()
    for name in ("ghmc", "ratio", "mse", "mfe"):
        x = logits.clone().requires_grad_(True)
        make_loss(name)(x, target, class_weight=torch.ones(4)).backward()
        assert x.grad is not None and torch.isfinite(x.grad).all(), name


# --- the method on real (small) runs -----------------------------------------------------------------

def _digits(*, protocol: str = "plain", options: dict | None = None, method: dict | None = None,
            loss: object = "ce", rounds: int = 4, clients: int = 30, per_round: int = 10, lr: float = 0.01,
            statistics: dict | None = None) -> dict:
    return {
        "name": "ratio-test", "seed": 0,
        "data": {"dataset": "digits", "num_clients": clients, "partition": "ratio", "train_samples": 1150,
                 "partition_params": {"global_ratio": 1.0}, "minority_classes": [0]},
        "model": {"name": "mlp", "hidden": [32]},
        "train": {"rounds": rounds, "clients_per_round": per_round, "local_epochs": 1, "batch_size": 16, "lr": lr,
                  "momentum": 0.0, "weight_decay": 0.0, "lr_decay": 1.0, "lr_decay_every": 1},
        "method": {"name": "ratio_loss", "mitigation": "off", **(method or {})},
        "loss": loss if isinstance(loss, dict) else {"name": loss},
        "secure": {"protocol": protocol, **({"statistics": statistics} if statistics else {}), **(options or {})},
    }


def _build(raw: dict) -> Simulation:
    return build_simulation(RunConfig.from_dict(raw), device=torch.device("cpu"))


def _run(raw: dict, rounds: int | None = None) -> tuple[Simulation, list[RoundResult]]:
    sim = _build(raw)
    sim.setup()
    return sim, [sim.run_round() for _ in range(rounds or raw["train"]["rounds"])]


def _server(sim: Simulation) -> RatioLossServer:
    server = sim.server.method
    assert isinstance(server, RatioLossServer)
    return server


def _scored(sim: Simulation) -> list[dict]:
    """The server's history scored against the truth the harness knows (every node's counts)."""
    history = _server(sim).history
    truth = {h["round"]: true_composition(sim.class_counts, h["contributors"]) for h in history}
    return score_history(history, truth)


def test_monitor_tracks_the_round_composition_on_a_real_run() -> None:
    sim, results = _run(_digits(rounds=5))
    server = _server(sim)
    assert server.monitor is not None and server.monitor.aux_counts.min() >= 1
    assert len(server.history) == 5
    scored = _scored(sim)
    for h, stored, result, r in zip(scored, server.history, results, range(5), strict=True):
        assert h["round"] == r and h["contributors"] == list(result.selected) and sum(h["truth"]) == h["total"]
        assert cosine_similarity(h["estimate"], h["truth"]) == pytest.approx(h["cosine"])
        # the server holds no truth: the score is the harness's, reported as simulator telemetry
        assert not {"truth", "cosine", "variants"} & set(stored)
        assert result.metrics == {} and result.telemetry["sim." + MONITOR_COSINE] == pytest.approx(h["cosine"])
        assert set(h["variants"]) == {f"{e}/{t}" for e, t in VARIANTS}
        for variant, cosine in h["variants"].items():
            assert result.telemetry["sim." + variant_metric(variant)] == pytest.approx(cosine)
        assert result.telemetry["sim." + PARTITION_COSINE] == pytest.approx(
            partition_cosine(sim.class_counts.values()))
    cos = [h["cosine"] for h in scored]
    assert min(cos) >= 0.9, cos
    assert 0 < partition_cosine(sim.class_counts.values()) <= 1


def test_auxiliary_samples_are_held_out_of_every_client() -> None:
    sim, _ = _run(_digits(rounds=1))
    monitor = _server(sim).monitor
    assert monitor is not None
    aux = monitor.aux_x.reshape(monitor.aux_x.shape[0], -1)
    for node in sim.nodes.values():
        rows = node.data.x.reshape(node.data.x.shape[0], -1)
        assert not (torch.cdist(aux, rows).min(dim=1).values == 0).any()
    # and not from the test set either
    x_test = sim.server.x_test
    assert not (torch.cdist(aux, x_test.reshape(x_test.shape[0], -1)).min(dim=1).values == 0).any()


def test_auxiliary_samples_come_from_the_servers_holdout() -> None:
    sim = _build(_digits(rounds=1))
    sim.setup()
    holdout = sim.server.holdout
    held = sum(node.data.num_samples for node in sim.nodes.values())
    assert holdout is not None and len(holdout) == holdout.y.size - held > 0
    x_h, y_h = auxiliary_from_holdout(holdout, num_classes=10, per_class=32, seed=0)
    monitor = _server(sim).monitor
    assert monitor is not None
    np.testing.assert_array_equal(monitor.aux_x.numpy(), x_h)
    np.testing.assert_array_equal(monitor.aux_y.numpy(), y_h)
    per_class = np.minimum(32, np.bincount(holdout.labels, minlength=10))   # all of a class when fewer
    assert np.bincount(y_h, minlength=10).tolist() == per_class.tolist() and per_class.min() >= 1
    # aux_seed picks another draw of the same size per class
    x_1, y_1 = auxiliary_from_holdout(holdout, num_classes=10, per_class=32, seed=1)
    assert np.bincount(y_1, minlength=10).tolist() == per_class.tolist() and not np.array_equal(x_1, x_h)
    # a class with nothing held out is refused, with the advice
    labels = holdout.labels
    starved = HeldOut(x=holdout.x, y=holdout.y, index=holdout.index[labels != 3])
    with pytest.raises(ValueError, match=r"class\(es\) \[3\].*data.train_samples"):
        auxiliary_from_holdout(starved, num_classes=10, per_class=32)


def test_a_server_without_held_out_samples_fails_clearly() -> None:
    for nothing in (None, HeldOut(x=np.zeros((3, 2)), y=np.arange(3), index=np.array([], dtype=np.int64))):
        with pytest.raises(ValueError, match="the server holds no held-out training samples"):
            auxiliary_from_holdout(nothing, num_classes=3, per_class=2)
    sim = _build(_digits(rounds=1))
    sim.server.holdout = None          # a run whose partition used every training sample
    with pytest.raises(ValueError, match="no held-out training samples.*data.train_samples"):
        sim.setup()


def test_the_server_needs_its_own_model() -> None:
    sim = _build(_digits(rounds=1))
    server = sim.server
    setup = ServerSetup(info=sim.info, stats=sim.stats, clients=server.clients, device=torch.device("cpu"),
                        holdout=server.holdout, model=None)
    with pytest.raises(RuntimeError, match="copy of the public model"):
        _server(sim).setup(setup)


def test_the_monitor_does_not_touch_training() -> None:
    """With ℝ off and FedAvg's weights, ratio_loss is FedAvg plus a monitor: the same models. The
    monitor runs on the server's own copy of the model, never on the clients' trainer."""
    raw = _digits(rounds=2, method={"aggregation": "samples"})
    monitored, _ = _run(raw)
    plain, _ = _run({**raw, "method": {"name": "fedavg"}})
    torch.testing.assert_close(monitored.global_vector, plain.global_vector, rtol=0, atol=0)
    model = _server(monitored)._model
    assert model is monitored.server.model
    assert all(model.model is not node.trainer.model for node in monitored.nodes.values())


def test_held_out_rows_are_checked_and_copied_on_demand() -> None:
    from secure_fl.runtime.build import held_out

    x, y = np.arange(20, dtype=np.float32).reshape(10, 2), np.arange(10) % 3
    rest = held_out(SimpleNamespace(x_train=x, y_train=y), [np.array([0, 5, 2]), np.array([9])])
    assert rest is not None and rest.index.tolist() == [1, 3, 4, 6, 7, 8] and len(rest) == 6
    assert rest.labels.tolist() == (y[[1, 3, 4, 6, 7, 8]]).tolist()
    xs, ys = rest.take(np.array([0, 5]))
    assert xs.tolist() == x[[1, 8]].tolist() and ys.tolist() == y[[1, 8]].tolist()
    xs[0, 0] = -1.0
    assert x[1, 0] == 2.0  # a copy, not a view into the training set
    assert held_out(SimpleNamespace(x_train=x, y_train=y), [np.arange(10)]) is None
    for bad in (np.array([3, 1]), np.array([1, 1]), np.array([0, 10]), np.array([-1, 2])):
        with pytest.raises(ValueError):
            HeldOut(x=x, y=y, index=bad)


@pytest.mark.parametrize("protocol,options", [
    ("masking", {}),
    ("paillier", {"paillier": WEAK}),
])
def test_secure_total_equals_plain_and_no_client_count_is_readable(protocol: str, options: dict) -> None:
    plain_sim, _ = _run(_digits(rounds=3))
    plain = _server(plain_sim).history
    sim, _ = _run(_digits(rounds=3, statistics={MONITOR_TOTAL: protocol}, options=options))
    secure = _scored(sim)
    assert [h["total"] for h in secure] == [h["total"] for h in plain]
    assert [h["total"] for h in secure] == [float(sum(h["truth"])) for h in secure]
    np.testing.assert_allclose([h["estimate"] for h in secure], [h["estimate"] for h in plain], rtol=1e-9)
    declaration = sim.stats.declarations[MONITOR_TOTAL]
    assert declaration.learners == {"server"} and declaration.length == 1
    records = [r for r in sim.stats.records if r.name == MONITOR_TOTAL]
    assert [r.protocol for r in records] == [protocol] * 3 and all(len(r.contributors) == 10 for r in records)
    ledger = build_ledger(sim.stats.transcript, clients=range(30), protocol_options=options)
    assert ledger.runs_of(MONITOR_TOTAL)
    for run in ledger.runs_of(MONITOR_TOTAL):
        assert run.k == 10 and SERVER in run.learners
    for c in range(30):
        assert not ledger.server_reads_individually(MONITOR_TOTAL, c), c


def test_plain_total_is_readable_control() -> None:
    """Under ``plain`` the same check sees every count: it would catch a leak."""
    sim, _ = _run(_digits(rounds=2))
    ledger = build_ledger(sim.stats.transcript, clients=range(30))
    selected = {c for r in sim.stats.records if r.name == MONITOR_TOTAL for c in r.contributors}
    assert selected and all(ledger.server_reads_individually(MONITOR_TOTAL, c) for c in selected)


def test_ratio_loss_broadcasts_r_and_clients_train_with_it() -> None:
    raw = _digits(rounds=3, method={"mitigation": "always"}, loss={"name": "ratio", "alpha": 1.0, "beta": 0.1})
    sim, results = _run(raw)
    server = _server(sim)
    assert all(h["mitigating"] for h in server.history)
    assert all(len(h["ratios"]) == 10 and min(h["ratios"]) > 0 for h in server.history)
    # ℝ goes to the round's clients with the model as one message each, every round (round 0's too);
    # the runtime counts the message bytes (C float32 and the runtime header)
    sizes = [sim.stats.bytes_by_statistic(r)[f"{BROADCAST}_broadcast"] for r in range(3)]
    assert len(set(sizes)) == 1 and sizes[0] % 10 == 0 and sizes[0] // 10 >= 10 * 4
    # each client of the last round got the ℝ of G_2, and its class weights are α + β·Ra_p of it
    loss = make_loss("ratio", {"alpha": 1.0, "beta": 0.1})
    for c in results[-1].selected:
        node = sim.nodes[c]
        got = node._broadcast[BROADCAST]
        np.testing.assert_array_equal(got.numpy(), np.float32(server.history[-1]["ratios"]))
        ctx = SimpleNamespace(broadcast={BROADCAST: got}, num_classes=10, trainer=node.trainer, data=node.data)
        objective = node.method.local_objective(ctx)  # type: ignore[attr-defined]
        torch.testing.assert_close(objective.class_weight, loss.class_weights(got))
    # the server prepared G_3's ℝ in after_round; its broadcast sends exactly that, and the
    # monitor's templates use the weights the clients will derive from it
    ctx = ServerRound(round=3, global_vector=sim.global_vector, cohort=(0, 1), info=sim.info, stats=sim.stats,
                      updates=sim.server.updates)
    sent = server.broadcast(ctx)[BROADCAST]
    np.testing.assert_allclose(sent.double().numpy(), server._ratios, rtol=1e-6)
    np.testing.assert_allclose(server._weights, loss.class_weights(sent).numpy(), rtol=1e-12)


def test_mitigation_off_sends_nothing_and_detect_waits_for_the_detector() -> None:
    sim, _ = _run(_digits(rounds=2))
    assert not any(k.startswith(BROADCAST) for r in range(2) for k in sim.stats.bytes_by_statistic(r))
    assert all(BROADCAST not in node._broadcast for node in sim.nodes.values())
    detect, _ = _run(_digits(rounds=3, method={"mitigation": "detect", "detect_rounds": 1, "detect_ratio": 1.0},
                             loss={"name": "ratio"}))
    server = _server(detect)
    assert server.detector.detected_round == 0
    assert [x["mitigating"] for x in server.history] == [False, True, True]
    assert [f"{BROADCAST}_broadcast" in detect.stats.bytes_by_statistic(r) for r in range(3)] == [False, True, True]


def test_ratio_loss_needs_the_ratio_loss() -> None:
    with pytest.raises(ValueError, match="loss 'ratio'"):
        _run(_digits(rounds=1, method={"mitigation": "always"}, loss="ce"))
    # a client that gets ℝ but trains with another loss refuses too
    sim = _build(_digits(rounds=1, loss="ce"))
    node = sim.nodes[0]
    ctx = SimpleNamespace(broadcast={BROADCAST: torch.ones(10)}, num_classes=10, trainer=node.trainer, data=node.data)
    with pytest.raises(ValueError, match="loss 'ratio'"):
        node.method.local_objective(ctx)  # type: ignore[attr-defined]
    # and a malformed ℝ is a protocol error (the node refuses the round)
    ratio = _build(_digits(rounds=1, loss="ratio")).nodes[0]
    bad = SimpleNamespace(broadcast={BROADCAST: torch.ones(3)}, num_classes=10, trainer=ratio.trainer,
                          data=ratio.data)
    with pytest.raises(PolicyError, match=BROADCAST):
        ratio.method.local_objective(bad)  # type: ignore[attr-defined]


def test_params_are_validated() -> None:
    for bad in ({"aggregation": "median"}, {"mitigation": "sometimes"}, {"aux_per_class": 0},
                {"estimator": "x"}, {"ratio_average": "mode"}, {"templates": "end"}, {"detect_ratio": 0.5},
                {"threshold": -1.0}, {"aux_seed": -1}):
        with pytest.raises(ValueError):
            make_algorithm("ratio_loss", bad)
    # the dataset-reloading fallback is gone: its parameters are unknown now
    for retired in ("aux_dataset", "aux_root", "data_seed", "test_fraction"):
        with pytest.raises(ValueError, match="unknown parameter"):
            make_algorithm("ratio_loss", {retired: 0})
    assert isinstance(make_algorithm("ratio_loss").params, RatioLossParams)


def test_a_resumed_run_continues_identically() -> None:
    raw = _digits(rounds=4, method={"mitigation": "always"}, loss={"name": "ratio"})
    whole, whole_results = _run(raw)
    first, first_results = _run(raw, rounds=2)
    checkpoint = first.checkpoint()
    second = _build(raw)
    second.prepare_resume(checkpoint)
    second.setup()
    second.restore(checkpoint)
    second_results = [second.run_round() for _ in range(2)]
    torch.testing.assert_close(second.global_vector, whole.global_vector)
    np.testing.assert_allclose([h["estimate"] for h in _server(second).history],
                               [h["estimate"] for h in _server(whole).history])
    results = first_results + second_results
    for resumed, straight in zip(results, whole_results, strict=True):
        assert resumed.telemetry == pytest.approx(straight.telemetry)
    # what the report reads: the stored server state joined with the stored simulator telemetry
    history, telemetry = monitor_history(second.checkpoint().algorithm, {r.round: r.telemetry for r in results})
    assert len(history) == 4 and 0 < telemetry[PARTITION_COSINE] <= 1 and telemetry["aux_counts"]
    assert [h["cosine"] for h in history] == pytest.approx([h["cosine"] for h in _scored(whole)])
    assert history[0]["variants"] == pytest.approx(_scored(whole)[0]["variants"])
    # without the checkpoint (dropped state), the telemetry alone still gives the curve
    alone, _ = monitor_history(None, {r.round: r.telemetry for r in results})
    assert [h["round"] for h in alone] == [0, 1, 2, 3] and alone[3]["cosine"] == pytest.approx(history[3]["cosine"])
    with pytest.raises(ValueError, match="not a ratio_loss"):
        monitor_history({"detector": {}})


def test_uniform_aggregation_is_eq4() -> None:
    """G_{t+1} = G_t + (1/K) Σ Δ_j, whatever the client sizes (the paper's Eq. 4)."""
    sim = _build(_digits(rounds=1))
    sim.setup()
    start = sim.global_vector.clone()
    result = sim.run_round()
    updates = [sim.nodes[c].update for c in result.selected]
    assert all(u is not None for u in updates)
    expected = start + sum(u.delta for u in updates if u is not None) / len(updates)
    torch.testing.assert_close(sim.global_vector, expected, rtol=1e-5, atol=1e-7)
    assert len({u.num_samples for u in updates if u is not None}) > 1


# --- the report tables -------------------------------------------------------------------------------

_REPORT_RUNS = """\
[data]
dataset = "digits"
num_clients = 30
partition = "ratio"
train_samples = 1150
partition_params = { global_ratio = 2.0, classes_per_client = 3 }
minority_classes = [0]
[model]
name = "mlp"
hidden = [16]
[train]
rounds = 2
clients_per_round = 10
lr = 0.01
momentum = 0.0
[method]
name = "ratio_loss"
mitigation = "off"
"""
"""Small digits runs for the report tests (digits is split by seed: the runtime's holdout keeps the
monitor's auxiliary samples out of every client's data whatever the run's seed)."""

def test_report_tables_from_stored_runs(tmp_path) -> None:
    from secure_fl.config import parse_config
    from secure_fl.report import build_report
    from secure_fl.runtime.runner import run_experiment
    from secure_fl.store import RunStore

    text = """
name = "ratio-report-test"
seed = 0
tail_rounds = 1
""" + _REPORT_RUNS + """
[[runs]]
loss = "mse"
[[runs]]
loss = "mfe"
[[runs]]
method = { name = "ratio_loss", mitigation = "always" }
loss = "ratio"
"""
    config = tmp_path / "t.toml"
    config.write_text(text)
    with RunStore.open_workspace(tmp_path / "ws") as store:
        run_experiment(parse_config(text, source=str(config)), store, device=torch.device("cpu"))
        options = {"workspace": str(tmp_path / "ws")}
        t2, runs = build_report([str(config)], "ratio-table2", store=store, options=options)
        assert "2:1" in t2.markdown and "L_RL (ours)" in t2.markdown and "Ac.M %" in t2.markdown
        assert len(runs) == 3 and len(t2.data["monitor"]) == 3
        t4, _ = build_report([str(config)], "ratio-table4", store=store, options=options)
        assert "L_MFE" in t4.markdown and "CS 0." in t4.markdown
        f2, _ = build_report([str(config)], "ratio-fig2", store=store, options=options, out_dir=tmp_path / "out")
        assert len(f2.data["runs"]) == 3 and f2.figures and f2.figures[0].exists()
        # the curve is the simulator telemetry stored with each round (sim.*), beside the method's metrics
        for run in runs:
            stored = [row.metrics for row in store.rounds(run.id)]
            row = next(v for v in f2.data["runs"].values() if v["run"] == run.id)
            assert row["per_round"] == pytest.approx([m["sim." + MONITOR_COSINE] for m in stored])
            assert set(row["variants"]) == {f"{e}/{t}" for e, t in VARIANTS}
        # telemetry from another workspace than the runs' is refused, not silently left out
        from secure_fl.report import ReportError

        with pytest.raises(ReportError, match="--workspace DIR"):
            build_report([str(config)], "ratio-fig2", store=store, options={"workspace": str(tmp_path / "other")})
    # the report's own workspace is where the formatter reads the telemetry
    f2w, _ = build_report([str(config)], "ratio-fig2", workspace=tmp_path / "ws")
    assert len(f2w.data["runs"]) == 3


def test_fig2_report_adds_the_mean_over_seeds(tmp_path) -> None:
    from secure_fl.config import parse_config
    from secure_fl.report import build_report
    from secure_fl.runtime.runner import run_experiment
    from secure_fl.store import RunStore

    text = """
name = "ratio-fig2-seeds-test"
tail_rounds = 1
""" + _REPORT_RUNS + """
[sweep]
seed = [0, 1]
"""
    config = tmp_path / "t.toml"
    config.write_text(text)
    with RunStore.open_workspace(tmp_path / "ws") as store:
        run_experiment(parse_config(text, source=str(config)), store, device=torch.device("cpu"))
    report, runs = build_report([str(config)], "ratio-fig2", workspace=tmp_path / "ws")
    assert len(runs) == 2
    per_run = [row["mean"] for row in report.data["runs"].values()]
    (setting, summary), = report.data["seed_means"].items()
    assert "Γ=2:1" in setting and "seed" not in setting
    assert summary["seeds"] == 2
    assert summary["mean"] == pytest.approx(float(np.mean(per_run)))
    assert summary["std"] == pytest.approx(float(np.std(per_run)))
    assert summary["seeds_at_target"] == sum(m >= 0.98 for m in per_run)
    assert "mean of 2 seeds" in report.markdown
