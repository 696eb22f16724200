"""secure_fl.privacy: noise sources and samplers, accounting, distributed DP sums, dp-check, DP-SGD."""

from __future__ import annotations

import argparse
import itertools
import json
import math
import warnings
from collections.abc import Iterator

import numpy as np
import pytest
import torch

from protocols import DropoutPlan, make_sum
from secure_fl.privacy import (
    MODEL,
    ORDERS,
    RUN,
    CryptoRandom,
    DistributedDP,
    InsecureRandomWarning,
    NoisySum,
    PrivacyBudgetError,
    PrivacyLedger,
    SeededRandom,
    Sensitivity,
    calibrate_sigma,
    create_mechanism,
    formal_guarantees,
    random_source,
    rdp_to_dp,
    samplers,
)
from secure_fl.stats import StatisticDeclaration

pytestmark = pytest.mark.filterwarnings("ignore::secure_fl.privacy.InsecureRandomWarning")

HISTOGRAM = StatisticDeclaration(name="label_histogram", length=10, bound=500, kind="int",
                                 learners=frozenset({"server", "clients"}))


def seeded(seed: int = 0) -> SeededRandom:
    return SeededRandom(seed)


def insecure(**kw: object) -> DistributedDP:
    base: dict[str, object] = {"epsilon": 1.0, "delta": 1e-5, "secure_mode": False, "seed": 7}
    base.update(kw)
    return DistributedDP(**base)  # type: ignore[arg-type]


# --- randomness -----------------------------------------------------------------------------------

def test_secure_source_is_the_default_and_refuses_seeds() -> None:
    assert isinstance(random_source(), CryptoRandom)
    with pytest.raises(ValueError, match="secure mode"):
        random_source(seed=1)
    with pytest.raises(ValueError, match="secure mode"):
        DistributedDP(epsilon=1, delta=1e-5, seed=3)
    with pytest.warns(InsecureRandomWarning):
        src = random_source(secure_mode=False, seed=1)
    assert not src.secure and np.array_equal(src.words(4), SeededRandom(1).words(4))
    a, b = CryptoRandom(), CryptoRandom()
    assert not np.array_equal(a.words(4), b.words(4))  # fresh keys


def test_uniform_integers_and_bits_are_unbiased() -> None:
    rng = CryptoRandom()
    draws = rng.below(6, 60_000)
    counts = np.bincount(draws, minlength=6)
    assert draws.min() >= 0 and draws.max() < 6
    assert np.all(np.abs(counts - 10_000) < 500)
    assert abs(rng.bits(40_000).mean() - 0.5) < 0.02
    u = rng.uniform(10_000)
    assert u.min() >= 0 and u.max() < 1


# --- samplers -------------------------------------------------------------------------------------

@pytest.mark.parametrize("variance", [0.17, 4.0, 300.0])
def test_skellam_moments(variance: float) -> None:
    x = samplers.skellam(variance, 200_000, CryptoRandom())
    assert x.dtype == np.int64
    assert abs(x.mean()) < 5 * math.sqrt(variance / 200_000)
    assert x.var() == pytest.approx(variance, rel=0.03)


def test_poisson_table_is_exact_integer_weights() -> None:
    for lam in (0.05, 7.0, 2000.0):
        first, cumulative = samplers._poisson_table(lam)
        assert int(cumulative[-1]) == 2**48 and first >= 0
        assert samplers.poisson_tv(lam) < 1e-10
    with pytest.raises(ValueError, match="ddg"):
        samplers.poisson(samplers.POISSON_MAX_MEAN * 2, 1, seeded())


@pytest.mark.parametrize("sigma", [0.6, 3.0, 40.0])
def test_discrete_gaussian_moments(sigma: float) -> None:
    x = samplers.discrete_gaussian(sigma, 100_000, seeded(1))
    assert abs(x.mean()) < 5 * sigma / math.sqrt(100_000)
    expected = sigma if sigma >= 1 else x.std()  # below 1 the DG's std is under σ
    assert x.std() == pytest.approx(expected, rel=0.02)
    if sigma < 1:
        assert x.std() < sigma


def test_tail_bounds_hold() -> None:
    rng = seeded(2)
    for variance in (0.2, 30.0):
        t = samplers.skellam_tail(variance, 1e-3)
        x = samplers.skellam(variance, 200_000, rng)
        assert np.mean(np.abs(x) > t) <= 1e-3
        assert samplers.skellam_tail(variance, 2**-40) > t
    for sigma in (1.0, 25.0):
        t = samplers.discrete_gaussian_tail(sigma, 1e-3)
        x = samplers.discrete_gaussian(sigma, 100_000, rng)
        assert np.mean(np.abs(x) > t) <= 1e-3


def test_gaussian_is_standard() -> None:
    z = samplers.gaussian((300, 300), CryptoRandom())
    assert z.shape == (300, 300)
    assert abs(z.mean()) < 0.02 and z.std() == pytest.approx(1.0, rel=0.02)


# --- accounting -----------------------------------------------------------------------------------

def test_rdp_conversion_matches_opacus() -> None:
    from opacus.accountants.analysis.rdp import get_privacy_spent

    curve = np.asarray(ORDERS, dtype=float) / (2 * 3.0**2)
    ours, _ = rdp_to_dp(curve, 1e-5)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs, _ = get_privacy_spent(orders=list(ORDERS), rdp=list(curve), delta=1e-5)
    assert ours == pytest.approx(theirs)


def test_skellam_tends_to_the_gaussian_and_sums_exactly() -> None:
    sk = create_mechanism("skellam")
    unit = Sensitivity.unit_count()
    big = sk.rdp(ORDERS, sigma=100.0, honest=1, sensitivity=unit, dim=1)
    gauss = np.asarray(ORDERS) / (2 * 100.0**2)
    assert np.allclose(big, gauss, rtol=1e-3)
    # h clients with σ/√h are exactly one client with σ
    assert np.allclose(sk.rdp(ORDERS, sigma=1.0, honest=25, sensitivity=unit, dim=10),
                       sk.rdp(ORDERS, sigma=5.0, honest=1, sensitivity=unit, dim=10))


def test_calibration_is_tight_and_composes() -> None:
    unit = Sensitivity.unit_count()
    for name in ("skellam", "ddg"):
        mech = create_mechanism(name)
        sigma = calibrate_sigma(mech, epsilon=1.0, delta=1e-5, sensitivity=unit, dim=10, honest=10)
        eps = rdp_to_dp(mech.rdp(ORDERS, sigma=sigma, honest=10, sensitivity=unit, dim=10), 1e-5)[0]
        eps_less = rdp_to_dp(mech.rdp(ORDERS, sigma=sigma * 0.99, honest=10, sensitivity=unit, dim=10), 1e-5)[0]
        assert eps <= 1.0 < eps_less
    sk = create_mechanism("skellam")
    one = calibrate_sigma(sk, epsilon=1.0, delta=1e-5, sensitivity=unit, dim=10, honest=1)
    many = calibrate_sigma(sk, epsilon=1.0, delta=1e-5, sensitivity=unit, dim=10, honest=1, releases=16)
    assert 2.5 < many / one < 4.5  # ~√16 under RDP composition (not 16 as under basic composition)
    # the Gaussian analytic value for ε = 1, δ = 1e-5 under the same RDP conversion is ≈ 4.05
    assert 4.0 < one < 4.3


def test_ddg_pays_for_small_per_client_sigma() -> None:
    unit = Sensitivity.unit_count()
    ddg, sk = create_mechanism("ddg"), create_mechanism("skellam")
    s_ddg = calibrate_sigma(ddg, epsilon=1.0, delta=1e-5, sensitivity=unit, dim=10, honest=100)
    s_sk = calibrate_sigma(sk, epsilon=1.0, delta=1e-5, sensitivity=unit, dim=10, honest=100)
    assert s_ddg > 1.5 * s_sk  # Kairouz et al.'s τ term: the reason Skellam is the default


def test_sensitivity_checks_and_scaling() -> None:
    with pytest.raises(ValueError):
        Sensitivity(l1=1.0, l2=2.0, linf=1.0)
    box = Sensitivity.box(length=4, bound=3.0)
    assert (box.l1, box.l2, box.linf) == (12.0, 6.0, 3.0)
    scaled = Sensitivity.unit_count().scaled(256, rounding_dim=4)
    assert (scaled.l1, scaled.l2, scaled.linf) == (260.0, 258.0, 257.0)


# --- distributed DP sums --------------------------------------------------------------------------

def histograms(n: int, seed: int = 0) -> dict[int, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {c: rng.integers(0, 400, size=10) for c in range(n)}


def test_record_level_histogram_target() -> None:
    """The issue's target: a 10-class histogram at ε = 1, δ = 1e-5, record level."""
    noisy = NoisySum(HISTOGRAM, insecure(), clients=100, record=Sensitivity.unit_count())
    assert noisy.sigma_total == pytest.approx(math.sqrt(100) * noisy.sigma)
    spec = noisy.spec(100)
    assert spec.signed and spec.bound == HISTOGRAM.bound + noisy.noise_bound
    assert noisy.noise_bound >= 5  # the tail of σ ≈ 0.42 Skellam at 2^-40
    draws = noisy.noise(400_000)
    assert draws.std() == pytest.approx(noisy.sigma, rel=0.05)
    session = make_sum("plain", clients=list(range(100)))
    inputs = histograms(100)
    release = noisy.sum(session, inputs, round=0)
    true = sum(inputs.values())
    assert release.outcome is not None and release.outcome.total.dtype == np.float64
    assert np.all(np.abs(release.total - true) < 8 * noisy.sigma_total)
    assert release.clipped_noise == 0 and release.clipped_inputs == 0
    g = noisy.guarantee()
    assert g.epsilon <= 1.0 + 1e-9 and g.releases == 1 and g.level == "record"
    with pytest.raises(PrivacyBudgetError):
        noisy.sum(session, inputs, round=1)


def test_budget_over_rounds_and_composition() -> None:
    ledger = PrivacyLedger()
    noisy = NoisySum(HISTOGRAM, insecure(releases=5), clients=10, record=Sensitivity.unit_count(), ledger=ledger)
    session = make_sum("plain", clients=list(range(10)))
    inputs = histograms(10)
    eps = []
    for r in range(5):
        noisy.sum(session, inputs, round=r)
        eps.append(ledger.guarantee(1e-5, statistic="label_histogram").epsilon)
    assert all(a < b for a, b in itertools.pairwise(eps))
    assert eps[-1] <= 1.0 + 1e-9
    assert ledger.guarantee(1e-5, up_to_round=0).epsilon == pytest.approx(eps[0])


def test_dropouts_are_accounted_with_actual_survivors() -> None:
    ledger = PrivacyLedger()
    noisy = NoisySum(HISTOGRAM, insecure(releases=3, strict=False), clients=10, expected_survivors=8,
                     record=Sensitivity.unit_count(), ledger=ledger)
    ten = NoisySum(HISTOGRAM, insecure(releases=3), clients=10, record=Sensitivity.unit_count())
    assert noisy.sigma == pytest.approx(ten.sigma * math.sqrt(10 / 8), rel=1e-3)
    session = make_sum("plain", clients=list(range(10)))
    inputs = histograms(10)
    two = noisy.sum(session, inputs, round=0, dropouts=DropoutPlan({8: "upload", 9: "upload"}))
    assert len(two.outcome.contributors) == 8 and two.release.honest == 8  # type: ignore[union-attr]
    eps_ok = ledger.releases[-1].rdp()
    four = noisy.sum(session, inputs, round=1, dropouts=DropoutPlan({c: "upload" for c in (6, 7, 8, 9)}))
    assert four.release.honest == 6
    assert np.all(ledger.releases[-1].rdp() > eps_ok)  # fewer honest survivors: less noise, more ε
    true6 = sum(inputs[c] for c in range(6))
    assert np.all(np.abs(four.total - true6) < 8 * noisy.sigma * math.sqrt(6))


def test_colluders_reduce_counted_noise() -> None:
    plain = NoisySum(HISTOGRAM, insecure(), clients=20, record=Sensitivity.unit_count())
    wary = NoisySum(HISTOGRAM, insecure(colluders=5), clients=20, record=Sensitivity.unit_count())
    assert wary.sigma == pytest.approx(plain.sigma * math.sqrt(20 / 15), rel=1e-3)
    with pytest.raises(ValueError, match="honest"):
        NoisySum(HISTOGRAM, insecure(colluders=20), clients=20, record=Sensitivity.unit_count())


def test_record_level_needs_a_record_sensitivity_and_client_level_uses_the_box() -> None:
    with pytest.raises(ValueError, match="per-record"):
        NoisySum(HISTOGRAM, insecure(), clients=10)
    small = StatisticDeclaration(name="registry", length=8, bound=1, kind="int")
    noisy = NoisySum(small, insecure(level="client"), clients=10)
    assert noisy.sensitivity == Sensitivity.box(length=8, bound=1)
    inputs = {c: np.random.default_rng(c).integers(0, 2, size=8) for c in range(10)}
    release = noisy.sum(make_sum("plain", clients=list(range(10))), inputs, round=0)
    assert release.release.level == "client"
    assert np.abs(release.total - sum(inputs.values())).max() < 8 * noisy.sigma_total


def test_float_statistic_in_fixed_point() -> None:
    mean_loss = StatisticDeclaration(name="mean_loss", length=1, bound=10.0, kind="float", frac_bits=8)
    noisy = NoisySum(mean_loss, insecure(level="client"), clients=10)
    assert noisy.integer_sensitivity.l2 == pytest.approx(10.0 * 256 + 1)
    inputs = {c: np.array([1.0 + 0.1 * c]) for c in range(10)}
    release = noisy.sum(make_sum("plain", clients=list(range(10))), inputs, round=0)
    assert abs(release.total[0] - 14.5) < 8 * noisy.sigma_total / 256
    over = noisy.perturb(np.array([99.0]))  # input beyond the bound: clipped and counted
    assert over[1] == 1


def test_input_outside_the_bound_is_clipped_before_noise() -> None:
    noisy = NoisySum(HISTOGRAM, insecure(), clients=3, record=Sensitivity.unit_count())
    vec = np.full(10, 10_000)
    noisy_vec, clipped_in, _ = noisy.perturb(vec)
    assert clipped_in == 10
    assert np.all(np.abs(noisy_vec - HISTOGRAM.bound) <= noisy.noise_bound)
    with pytest.raises(ValueError, match="integral"):
        noisy.perturb(np.full(10, 0.5))


def test_through_the_coordinator_and_participants_with_paillier() -> None:
    """The statistics layer noises a declared statistic: each participant adds its own noise, the
    Paillier sum adds the noisy vectors, the coordinator's ledger records the release."""
    from functools import partial

    from protocols import LocalNetwork, Message
    from secure_fl.stats import Learned, StatisticPrivacy, StatisticsPlan, StatisticsPrivacy
    from secure_fl.stats.coordinator import StatsCoordinator
    from secure_fl.stats.participant import StatsParticipant

    privacy = StatisticsPrivacy({"label_histogram": StatisticPrivacy(epsilon=1.0, mechanism="ddg",
                                                                     secure_mode=False)}, seed=7)
    plan = StatisticsPlan(clients=tuple(range(5)), protocol="paillier", privacy=privacy,
                          options={"paillier": {"key_bits": 1024, "allow_weak_keys": True}})
    network = LocalNetwork()
    coordinator = StatsCoordinator(plan, network)
    inputs = histograms(5, seed=3)
    learned: list[Learned] = []

    def deliver(participant: StatsParticipant, data: list[bytes]) -> list[Message]:
        return [reply for item in data for reply in participant.handle(item)]

    def source(client: int, declaration: StatisticDeclaration, request: object) -> np.ndarray:
        return inputs[client]

    for c in plan.clients:
        participant = StatsParticipant(
            c, plan=plan, declarations={HISTOGRAM.name: HISTOGRAM}.get,
            source=partial(source, c), on_learned=learned.append,
            noise_seed=partial(privacy.client_noise_seed, client=c))
        network.attach(c, partial(deliver, participant))
    release = coordinator.request(HISTOGRAM, cohort=plan.clients, round=0)
    noisy = coordinator.noisy["label_histogram"]
    assert release.value is not None
    assert np.all(np.abs(release.value - sum(inputs.values())) < 8 * noisy.sigma_total)
    assert release.protocol == "paillier" and release.contributors == plan.clients
    assert coordinator.layouts(HISTOGRAM, 5).spec.signed  # widened for the noise
    assert len(learned) == 5 and all(np.array_equal(item.value, release.value) for item in learned)
    ledger = coordinator.ledger
    assert ledger is not None
    assert ledger.releases[0].mechanism == "ddg" and ledger.guarantee(1e-5).epsilon <= 1.0 + 1e-9


def test_ledger_round_trip_and_formal_guarantees() -> None:
    from secure_fl.privacy.dpsgd import DPSGDState

    ledger = PrivacyLedger()
    session = make_sum("plain", clients=list(range(10)))
    hist = NoisySum(HISTOGRAM, insecure(releases=2), clients=10, record=Sensitivity.unit_count(), ledger=ledger)
    totals = StatisticDeclaration(name="total_samples", length=1, bound=5000, kind="int")
    tot = NoisySum(totals, insecure(epsilon=0.5), clients=10, record=Sensitivity.unit_count(), ledger=ledger)
    for r in range(2):
        hist.sum(session, histograms(10), round=r)
    tot.sum(session, {c: np.array([100 + c]) for c in range(10)}, round=0)
    again = PrivacyLedger.from_json(ledger.to_json())
    assert again == ledger
    states = {0: DPSGDState(history=[(1.0, 0.05, 200)]), 1: DPSGDState(history=[(1.0, 0.05, 400)])}
    report = formal_guarantees(again, delta=1e-5, model=states)
    assert set(report) == {"label_histogram", "total_samples", MODEL, RUN}
    assert report["label_histogram"].epsilon <= 1.0 + 1e-9 and report["total_samples"].epsilon <= 0.5 + 1e-9
    assert report[MODEL].epsilon == pytest.approx(states[1].epsilon(1e-5))
    assert report[RUN].epsilon > max(g.epsilon for k, g in report.items() if k != RUN)
    assert report[RUN].epsilon < sum(g.epsilon for k, g in report.items() if k != RUN)
    assert json.dumps({k: g.as_dict() for k, g in report.items()})


# --- empirical check and the CLI ------------------------------------------------------------------

def test_empirical_lower_bound_stays_below_the_claim() -> None:
    from secure_fl.privacy.empirical import empirical_check

    result = empirical_check(epsilon=1.0, delta=1e-5, classes=10, clients=100, trials=6000,
                             secure_mode=False, seed=11)
    assert result.empirical_epsilon_lower_bound < result.claimed_epsilon
    assert result.sigma_per_client == pytest.approx(result.sigma_analytic, rel=0.05)
    assert result.sigma_total == pytest.approx(result.sigma_total_analytic, rel=0.05)
    assert result.clipped == 0


def test_empirical_check_catches_an_under_noised_mechanism() -> None:
    from secure_fl.privacy.empirical import empirical_check

    broken = empirical_check(epsilon=1.0, delta=1e-5, classes=10, clients=100, trials=3000,
                             secure_mode=False, seed=12, noise_scale=0.1)
    assert broken.empirical_epsilon_lower_bound > 1.0
    client = empirical_check(epsilon=1.0, delta=1e-5, classes=4, clients=20, level="client", trials=3000,
                             count_bound=8, secure_mode=False, seed=13, noise_scale=0.05)
    assert client.empirical_epsilon_lower_bound > 1.0


def test_clopper_pearson_known_values() -> None:
    from secure_fl.privacy.empirical import clopper_pearson, empirical_epsilon

    low, high = clopper_pearson(0, 100, 0.025)
    assert low == 0.0 and high == pytest.approx(1 - 0.025 ** (1 / 100))
    low, high = clopper_pearson(50, 100, 0.025)
    assert 0.39 < low < 0.5 < high < 0.61
    same = np.random.default_rng(0).normal(size=4000)
    assert empirical_epsilon(same[:2000], same[2000:], delta=1e-5)[0] < 0.3


def dp_check_main(argv: list[str]) -> int:
    from secure_fl.cli import dp_check

    parser = argparse.ArgumentParser(prog="secure-fl")
    sub = parser.add_subparsers(dest="command", required=True)
    dp_check.register(sub)
    args = parser.parse_args(argv)
    return int(args.func(args))


def test_cli_json(capsys: pytest.CaptureFixture[str]) -> None:
    code = dp_check_main(["dp-check", "--epsilon", "1", "--delta", "1e-5", "--classes", "10", "--clients", "100",
                          "--trials", "2000", "--seed", "5", "--json"])
    out = capsys.readouterr().out
    assert code == 0 and out.count("\n") == 1
    report = json.loads(out)
    assert list(report)[:4] == ["claimed_epsilon", "empirical_epsilon_lower_bound", "sigma_per_client",
                                "sigma_analytic"]
    assert report["empirical_epsilon_lower_bound"] < report["claimed_epsilon"] == 1.0
    assert report["secure_mode"] is False


def test_cli_paillier_table_and_errors(capsys: pytest.CaptureFixture[str]) -> None:
    code = dp_check_main(["dp-check", "--epsilon", "2", "--delta", "1e-6", "--classes", "3", "--clients", "4",
                          "--protocol", "paillier", "--key-bits", "1024", "--insecure-test-keys", "--trials", "200", "--batch", "100",
                          "--seed", "1"])
    out = capsys.readouterr().out
    assert code == 0 and "protocol paillier" in out and "OK" in out
    assert dp_check_main(["dp-check", "--epsilon", "0", "--delta", "1e-5", "--classes", "3",
                          "--clients", "4"]) == 2


# --- DP-SGD ---------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def digits() -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]]:
    from secure_fl.data import load_dataset

    ds = load_dataset("digits", seed=0)
    # Tiny models on a busy 2-core machine: one intra-op thread avoids spinning workers.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield (torch.from_numpy(ds.x_train), torch.from_numpy(ds.y_train), torch.from_numpy(ds.x_test),
           torch.from_numpy(ds.y_test))
    torch.set_num_threads(threads)


def mlp() -> torch.nn.Module:
    from secure_fl.models import build_model

    torch.manual_seed(0)
    return build_model("mlp", input_shape=(1, 8, 8), num_classes=10)


def test_dpsgd_two_rounds_epsilon_grows_and_model_learns(digits) -> None:  # type: ignore[no-untyped-def]
    from secure_fl.privacy.dpsgd import DPSGD, DPSGDConfig, DPSGDState

    x, y, xt, yt = digits
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    dp = DPSGD(DPSGDConfig(noise_multiplier=1.0, max_grad_norm=1.0, secure_mode=False, seed=0))
    state = DPSGDState()
    eps = []
    for _ in range(2):  # two rounds; the state is what the runtime keeps between them (as JSON)
        result = dp.train(model, opt, x, y, loss_fn=torch.nn.functional.cross_entropy, epochs=2,
                          batch_size=64, state=DPSGDState.from_dict(json.loads(json.dumps(state.to_dict()))))
        state = result.state
        eps.append(result.epsilon)
    assert 0 < eps[0] < eps[1] < math.inf
    assert state.steps == 2 * 2 * 23
    accuracy = (model(xt).argmax(1) == yt).float().mean().item()
    assert accuracy > 0.3
    # no Opacus residue on the model: hooks and per-sample gradients are gone
    assert all(not hasattr(p, "grad_sample") for p in model.parameters())
    assert all(not m._forward_hooks and not m._backward_hooks for m in model.modules())
    # the budget helper: ε after the planned steps stays at the target
    cfg = DPSGDConfig.for_budget(epsilon=8.0, delta=1e-5, sample_rate=1 / 23, steps=460, secure_mode=False)
    planned = DPSGDState(history=[(cfg.noise_multiplier, 1 / 23, 460)])
    assert 7.8 < planned.epsilon(1e-5) <= 8.0


def test_ghost_clipping_equals_per_sample_clipping(digits) -> None:  # type: ignore[no-untyped-def]
    from secure_fl.privacy.dpsgd import DPSGD, DPSGDConfig

    x, y, _, _ = digits
    trained = {}
    for clipping in ("ghost", "per-sample"):
        model = mlp()
        opt = torch.optim.SGD(model.parameters(), lr=0.5)
        # (almost) no noise and a clipping norm that binds: only the clipped sums differ, if anything
        dp = DPSGD(DPSGDConfig(noise_multiplier=1e-9, max_grad_norm=0.05, clipping=clipping,
                               secure_mode=False, seed=3))
        dp.train(model, opt, x[:600], y[:600], loss_fn=torch.nn.functional.cross_entropy, batch_size=64)
        trained[clipping] = torch.cat([p.detach().flatten() for p in model.parameters()])
    start = torch.cat([p.detach().flatten() for p in mlp().parameters()])
    assert (trained["ghost"] - start).abs().max() > 1e-3
    assert torch.allclose(trained["ghost"], trained["per-sample"], atol=1e-6)


@pytest.mark.parametrize("clipping", ["ghost", "per-sample"])
def test_dpsgd_secure_mode_empty_batches_and_post_noise_correction(digits, clipping) -> None:  # type: ignore[no-untyped-def]
    from secure_fl.privacy.dpsgd import DPSGD, DPSGDConfig

    x, y, _, _ = digits
    with pytest.raises(ValueError, match="secure mode"):
        DPSGDConfig(noise_multiplier=1.0, seed=1)
    model = mlp()
    before = [p.detach().clone() for p in model.parameters()]
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    dp = DPSGD(DPSGDConfig(noise_multiplier=1.0, clipping=clipping))  # secure mode: CSPRNG masks and noise
    assert dp.rng.secure

    def zero(params, grads) -> None:  # type: ignore[no-untyped-def]
        for g in grads:
            g.zero_()

    # 40 samples, batches of 2: q = 1/20, so empty Poisson batches happen; every step still counts
    result = dp.train(model, opt, x[:40], y[:40], loss_fn=torch.nn.functional.cross_entropy, epochs=2,
                      batch_size=2, gradient_correction=zero)
    assert result.steps == 40 and result.state.history[0][1] == pytest.approx(1 / 20)
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))  # correction ran after the noise


def test_dpsgd_refuses_batch_norm_and_foreign_optimizers() -> None:
    from secure_fl.privacy.dpsgd import DPSGD, DPSGDConfig

    dp = DPSGD(DPSGDConfig(noise_multiplier=1.0, secure_mode=False, seed=0))
    bn = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4))
    with pytest.raises(ValueError, match="not compatible"):
        dp.train(bn, torch.optim.SGD(bn.parameters(), lr=0.1), torch.zeros(8, 4), torch.zeros(8, dtype=torch.long),
                 loss_fn=torch.nn.functional.cross_entropy)
    model, other = mlp(), mlp()
    with pytest.raises(ValueError, match="exactly the model"):
        dp.train(model, torch.optim.SGD(other.parameters(), lr=0.1), torch.zeros(8, 1, 8, 8),
                 torch.zeros(8, dtype=torch.long), loss_fn=torch.nn.functional.cross_entropy)


def test_dpsgd_drives_the_runtime_local_trainer(digits) -> None:  # type: ignore[no-untyped-def]
    from secure_fl.algorithms import ClientData, LocalObjective, LocalTrainer, LocalTraining
    from secure_fl.losses import make_loss
    from secure_fl.privacy.dpsgd import DPSGD, DPSGDConfig, DPSGDState

    x, y, _, _ = digits
    trainer = LocalTrainer(mlp(), training=LocalTraining(epochs=1, batch_size=64, lr=0.3), loss=make_loss("ce"))
    data = ClientData(client_id=3, x=x[:600], y=y[:600], class_counts=np.bincount(y[:600].numpy(), minlength=10))
    start = trainer.layout.flatten()
    dp = DPSGD(DPSGDConfig(noise_multiplier=1.1, secure_mode=False, seed=4))
    local, result = dp.train_client(trainer, data, start, lr=0.3, state=DPSGDState())
    assert local.steps == result.steps == 10
    assert local.vector.shape == start.shape and not torch.equal(local.vector, start)
    assert 0 < result.epsilon < math.inf
    # a method's objective: class weights and a logit shift in the (vmapped) per-sample loss
    objective = LocalObjective(class_weight=torch.linspace(0.5, 1.5, 10), logit_shift=torch.randn(10))
    local2, result2 = dp.train_client(trainer, data, start, lr=0.3, objective=objective, state=result.state)
    assert result2.state.steps == 20 and result2.epsilon > result.epsilon
    assert torch.isfinite(local2.vector).all()
