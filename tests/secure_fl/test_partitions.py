"""Partitioners and imbalance measures: each scheme's defining property, and determinism."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from secure_fl.data import (
    PARTITIONERS,
    InfeasiblePartitionError,
    Partition,
    PartitionParameterError,
    climb_partition,
    cosine_similarity_to_global,
    dirichlet_partition,
    dubhe_partition,
    emd,
    emd_avg,
    global_imbalance,
    half_normal_class_sizes,
    keep_minority,
    l1_to_uniform,
    load_dataset,
    local_imbalance,
    ratio_loss_partition,
)

EMD_TOLERANCE = 0.02  # docs/data.md: Dubhe's achieved EMD_avg is within this of the target
GAMMA_TOLERANCE = 0.05  # relative, ratio_loss_partition's default


@pytest.fixture(scope="module")
def balanced() -> np.ndarray:
    """mnist5k's training labels: 400 per class."""
    return load_dataset("mnist5k").y_train


@pytest.fixture(scope="module")
def natural() -> np.ndarray:
    """A larger, mildly uneven label vector (like MNIST's 5421..6742 per class)."""
    rng = np.random.default_rng(0)
    sizes = rng.integers(1500, 1900, size=10)
    return rng.permutation(np.repeat(np.arange(10), sizes))


def rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


SCHEMES: list[tuple[str, dict[str, Any]]] = [
    ("dirichlet", {"alpha": 0.3}),
    ("climb", {"alpha": 0.2, "minority_classes": (0, 1), "rho": 5.0}),
    ("ratio", {"global_ratio": 10.0}),
    ("dubhe", {"rho": 5.0, "emd_avg": 1.0}),
]


def _assert_valid(partition: Partition, n: int, num_clients: int) -> None:
    assert partition.num_clients == num_clients
    everything = partition.all_indices()
    assert everything.dtype == np.int64
    assert np.unique(everything).size == everything.size, "an index is in two clients"
    assert everything.min() >= 0 and everything.max() < n
    assert all(ix.size > 0 for ix in partition.client_indices)
    assert partition.meta["num_samples"] == everything.size


@pytest.mark.parametrize(("name", "params"), SCHEMES)
def test_common_invariants_and_determinism(
    balanced: np.ndarray, name: str, params: dict[str, Any]
) -> None:
    first = PARTITIONERS[name](balanced, num_clients=40, rng=rng(5), **params)
    _assert_valid(first, balanced.size, 40)
    again = PARTITIONERS[name](balanced, num_clients=40, rng=rng(5), **params)
    for a, b in zip(first.client_indices, again.client_indices, strict=True):
        np.testing.assert_array_equal(a, b)
    assert dict(first.meta) == dict(again.meta)
    other = PARTITIONERS[name](balanced, num_clients=40, rng=rng(6), **params)
    assert any(
        not np.array_equal(a, b)
        for a, b in zip(first.client_indices, other.client_indices, strict=True)
    )
    counts = first.class_counts(balanced, 10)
    assert counts.shape == (40, 10) and counts.sum() == first.meta["num_samples"]
    assert first.meta["emd_avg"] == pytest.approx(emd_avg(counts))
    assert first.meta["rho"] == pytest.approx(global_imbalance(counts))


@pytest.mark.parametrize(("name", "params"), SCHEMES)
def test_rejects_global_random_state(
    balanced: np.ndarray, name: str, params: dict[str, Any]
) -> None:
    with pytest.raises(PartitionParameterError, match="rng"):
        PARTITIONERS[name](balanced, num_clients=4, rng=0, **params)


@pytest.mark.parametrize(("name", "params"), SCHEMES)
def test_more_clients_than_samples(name: str, params: dict[str, Any]) -> None:
    labels = np.repeat(np.arange(10), 3)
    with pytest.raises(ValueError, match="num_clients"):
        PARTITIONERS[name](labels, num_clients=31, rng=rng(), **params)


# --- Dirichlet ------------------------------------------------------------------------------


def test_dirichlet_covers_everything_and_concentrates_with_small_alpha(natural: np.ndarray) -> None:
    small = dirichlet_partition(natural, num_clients=10, alpha=0.05, rng=rng())
    large = dirichlet_partition(natural, num_clients=10, alpha=1000.0, rng=rng())
    for p in (small, large):
        _assert_valid(p, natural.size, 10)
        assert p.meta["coverage"] == 1.0
    assert small.meta["emd_avg"] > 1.0
    assert large.meta["emd_avg"] < 0.1


def test_dirichlet_class_shares_follow_one_draw_per_class(natural: np.ndarray) -> None:
    """Client i's share of class c is p_{c,i}: reproduce the draws from the same seed."""
    part = dirichlet_partition(natural, num_clients=5, alpha=0.5, rng=rng(9))
    counts = part.class_counts(natural, 10)
    replay = rng(9)
    for c in range(10):
        replay.permutation(np.flatnonzero(natural == c))
        p = replay.dirichlet(np.full(5, 0.5))
        np.testing.assert_allclose(
            counts[:, c] / counts[:, c].sum(), p, atol=2.0 / counts[:, c].sum()
        )


def test_dirichlet_balance_is_wang_et_al_s_step(natural: np.ndarray) -> None:
    """FedMA's "## Balance": a client holding N/n samples or more gets no share of later classes."""
    n, alpha = 10, 0.1
    part = dirichlet_partition(natural, num_clients=n, alpha=alpha, rng=rng(3), balance=True)
    _assert_valid(part, natural.size, n)
    assert part.meta["balance"] == 1.0
    counts = part.class_counts(natural, 10)
    replay, held = rng(3), np.zeros(n)
    for c in range(10):
        replay.permutation(np.flatnonzero(natural == c))
        p = replay.dirichlet(np.full(n, alpha)) * (held < natural.size / n)
        cuts = np.floor(np.cumsum(p / p.sum())[:-1] * counts[:, c].sum()).astype(np.int64)
        np.testing.assert_array_equal(counts[:, c], np.diff(np.concatenate([[0], cuts, [counts[:, c].sum()]])))
        held += counts[:, c]
    plain = dirichlet_partition(natural, num_clients=n, alpha=alpha, rng=rng(3))
    assert part.sizes.std() < plain.sizes.std()  # the point of the step: sizes near N/n


def test_dirichlet_balance_survives_a_class_whose_whole_share_lands_on_full_clients(balanced: np.ndarray) -> None:
    """At α = 0.001 each draw is one-hot, sometimes on a full client; the class then goes to an open one.

    Seed 0 takes that branch once: one class finds every open client's share exactly 0."""
    part = dirichlet_partition(balanced, num_clients=4, alpha=0.001, rng=rng(0), balance=True)
    _assert_valid(part, balanced.size, 4)
    assert part.sizes.max() <= balanced.size / 4 + 400  # at most one class past the N/n mark
    with pytest.raises(PartitionParameterError, match="balance"):
        dirichlet_partition(balanced, num_clients=4, alpha=0.5, rng=rng(), balance=1)  # type: ignore[arg-type]


def test_dirichlet_min_size_and_parameters(balanced: np.ndarray) -> None:
    part = dirichlet_partition(balanced, num_clients=20, alpha=0.5, rng=rng(), min_size=50)
    assert part.sizes.min() >= 50
    for alpha in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(PartitionParameterError, match="alpha"):
            dirichlet_partition(balanced, num_clients=4, alpha=alpha, rng=rng())
    with pytest.raises(InfeasiblePartitionError, match="min_size"):
        dirichlet_partition(balanced, num_clients=100, alpha=0.5, rng=rng(), min_size=41)


# --- CLIMB ----------------------------------------------------------------------------------


def test_keep_minority_keeps_one_over_rho(natural: np.ndarray) -> None:
    kept = keep_minority(natural, minority_classes=[0, 3], rho=10.0, rng=rng())
    before = np.bincount(natural, minlength=10)
    after = np.bincount(natural[kept], minlength=10)
    for c in range(10):
        expected = round(before[c] / 10.0) if c in (0, 3) else before[c]
        assert after[c] == expected
    assert np.all(np.diff(kept) > 0)


def test_keep_minority_parameters(balanced: np.ndarray) -> None:
    with pytest.raises(PartitionParameterError, match="rho"):
        keep_minority(balanced, minority_classes=[0], rho=0.5, rng=rng())
    with pytest.raises(PartitionParameterError, match="minority_classes"):
        keep_minority(balanced, minority_classes=[10], rho=2.0, rng=rng())
    with pytest.raises(PartitionParameterError, match="duplicates"):
        keep_minority(balanced, minority_classes=[1, 1], rho=2.0, rng=rng())


def test_climb_alpha_zero_gives_single_class_clients(balanced: np.ndarray) -> None:
    for clients in (10, 37, 100):
        part = climb_partition(
            balanced, num_clients=clients, alpha=0.0, rng=rng(), minority_classes=(0, 1, 2), rho=10
        )
        counts = part.class_counts(balanced, 10)
        assert np.all((counts > 0).sum(axis=1) == 1)
        assert part.meta["rho"] == pytest.approx(10.0)  # 400 vs 40 per class
        assert part.meta["num_samples"] == 7 * 400 + 3 * 40


def test_climb_alpha_one_is_iid_and_alpha_mixes(balanced: np.ndarray) -> None:
    iid = climb_partition(balanced, num_clients=10, alpha=1.0, rng=rng())
    assert iid.meta["coverage"] == 1.0 and iid.meta["emd_avg"] < 0.25
    # α = 0.5, 10 clients, 10 classes: each client is half iid, half one class.
    half = climb_partition(balanced, num_clients=10, alpha=0.5, rng=rng())
    counts = half.class_counts(balanced, 10)
    top = counts.max(axis=1) / counts.sum(axis=1)
    assert np.all(np.abs(top - (0.5 + 0.5 / 10)) < 0.06)


def test_climb_contiguous_shards_are_equal_runs(balanced: np.ndarray) -> None:
    part = climb_partition(
        balanced,
        num_clients=7,
        alpha=0.0,
        rng=rng(),
        minority_classes=(0,),
        rho=4,
        shards="contiguous",
    )
    assert part.sizes.max() - part.sizes.min() <= 1
    counts = part.class_counts(balanced, 10)
    assert (counts > 0).sum(axis=1).max() >= 2  # runs straddle classes, as in the authors' code


def test_climb_parameters(balanced: np.ndarray) -> None:
    for alpha in (-0.1, 1.1):
        with pytest.raises(PartitionParameterError, match="alpha"):
            climb_partition(balanced, num_clients=4, alpha=alpha, rng=rng())
    with pytest.raises(PartitionParameterError, match="rho"):
        climb_partition(
            balanced, num_clients=4, alpha=0.1, rng=rng(), minority_classes=(0,), rho=0.9
        )
    with pytest.raises(PartitionParameterError, match="shards"):
        climb_partition(balanced, num_clients=4, alpha=0.1, rng=rng(), shards="random")  # type: ignore[arg-type]


# --- Ratio Loss -----------------------------------------------------------------------------


@pytest.mark.parametrize("gamma", [1.0, 10.0, 20.0, 50.0])
def test_ratio_equal_per_class_counts_and_global_ratio(natural: np.ndarray, gamma: float) -> None:
    part = ratio_loss_partition(natural, num_clients=100, global_ratio=gamma, rng=rng())
    counts = part.class_counts(natural, 10)
    for row in counts:
        held = row[row > 0]
        assert held.size >= 1 and np.all(held == held[0]), "unequal per-class counts on a client"
    total = counts.sum(axis=0)
    achieved = total.max() / total.min()
    assert abs(achieved / gamma - 1.0) <= GAMMA_TOLERANCE
    assert part.meta["global_ratio"] == pytest.approx(achieved)
    assert global_imbalance(counts) == pytest.approx(achieved)
    if gamma > 1:
        assert total.argmin() == 0  # the default minority class


def test_ratio_classes_per_client(balanced: np.ndarray) -> None:
    part = ratio_loss_partition(
        balanced, num_clients=50, global_ratio=5.0, rng=rng(), classes_per_client=(2, 5),
        minority_classes=(8, 9),
    )  # fmt: skip
    held = (part.class_counts(balanced, 10) > 0).sum(axis=1)
    assert held.min() >= 2 and held.max() <= 5
    total = part.class_counts(balanced, 10).sum(axis=0)
    assert set(np.flatnonzero(total == total.min())) <= {8, 9}
    fixed = ratio_loss_partition(
        balanced, num_clients=50, global_ratio=1.0, rng=rng(), classes_per_client=3
    )
    assert np.all((fixed.class_counts(balanced, 10) > 0).sum(axis=1) == 3)


def test_ratio_parameters(balanced: np.ndarray) -> None:
    with pytest.raises(PartitionParameterError, match="global_ratio"):
        ratio_loss_partition(balanced, num_clients=20, global_ratio=0.5, rng=rng())
    with pytest.raises(PartitionParameterError, match="classes_per_client"):
        ratio_loss_partition(
            balanced, num_clients=20, global_ratio=2, rng=rng(), classes_per_client=(3, 11)
        )
    with pytest.raises(PartitionParameterError, match="minority"):
        ratio_loss_partition(
            balanced, num_clients=20, global_ratio=2, rng=rng(), minority_classes=()
        )
    with pytest.raises(InfeasiblePartitionError, match="global_ratio"):
        ratio_loss_partition(balanced, num_clients=3000, global_ratio=10, rng=rng(), max_tries=3)


# --- Dubhe ----------------------------------------------------------------------------------


def test_half_normal_sizes_hit_rho_and_shape() -> None:
    sizes = half_normal_class_sizes(np.full(10, 6000), rho=10.0)
    assert sizes[0] == 6000 and sizes[-1] == 600
    expected = 6000 * 10.0 ** (-((np.arange(10) / 9) ** 2))
    assert np.all(np.abs(sizes - expected) <= 0.5)
    assert np.all(np.diff(sizes) < 0)
    np.testing.assert_array_equal(half_normal_class_sizes(np.full(4, 7), rho=1.0), np.full(4, 7))


@pytest.mark.parametrize("profile", ["dirichlet", "mixture"])
@pytest.mark.parametrize("target", [0.5, 1.0, 1.5])
@pytest.mark.parametrize("rho", [2.0, 10.0])
def test_dubhe_hits_rho_and_emd_avg(natural: np.ndarray, rho: float, target: float, profile: str) -> None:
    part = dubhe_partition(natural, num_clients=200, rho=rho, emd_avg=target, rng=rng(), profile=profile)
    counts = part.class_counts(natural, 10)
    total = counts.sum(axis=0)
    assert abs(total[0] / total[-1] / rho - 1.0) <= 0.01
    assert np.all(np.diff(total) <= 0)  # class 0 most frequent, class 9 least
    assert abs(emd_avg(counts) - target) <= EMD_TOLERANCE
    assert part.meta["emd_avg"] == pytest.approx(emd_avg(counts))
    assert part.meta["emd_avg_target"] == target


@pytest.mark.parametrize(("profile", "knob", "one_class"), [("dirichlet", "concentration", lambda v: v < 0.01),
                                                            ("mixture", "mix_weight", lambda v: v > 0.9)])
def test_dubhe_extremes_and_parameters(natural: np.ndarray, profile: str, knob: str,
                                       one_class: Callable[[float], bool]) -> None:
    top = dubhe_partition(natural, num_clients=50, rho=10.0, emd_avg=1.73, rng=rng(), tolerance=0.1,
                          profile=profile)
    assert one_class(top.meta[knob])
    floor = dubhe_partition(natural, num_clients=1000, rho=10.0, emd_avg=0.0, rng=rng(), profile=profile)
    assert 0.0 < floor.meta["emd_avg"] < 0.5  # ~9 samples per client: rounding floor
    balanced = dubhe_partition(natural, num_clients=10, rho=1.0, emd_avg=0.0, rng=rng(), profile=profile)
    assert balanced.meta["emd_avg"] < 0.02
    with pytest.raises(InfeasiblePartitionError, match="reachable range"):
        dubhe_partition(natural, num_clients=50, rho=10.0, emd_avg=1.95, rng=rng(), profile=profile)
    with pytest.raises(PartitionParameterError, match="emd_avg"):
        dubhe_partition(natural, num_clients=50, rho=10.0, emd_avg=2.5, rng=rng(), profile=profile)
    with pytest.raises(PartitionParameterError, match="rho"):
        dubhe_partition(natural, num_clients=50, rho=0.5, emd_avg=1.0, rng=rng(), profile=profile)


def test_dubhe_mixture_extremes_are_the_papers() -> None:
    labels = np.repeat(np.arange(10), 600)
    floor = dubhe_partition(labels, num_clients=1000, rho=10.0, emd_avg=0.0, rng=rng(), profile="mixture")
    assert floor.meta["mix_weight"] == 0.0  # "EMD_avg = 0": as even as whole samples allow
    with pytest.raises(PartitionParameterError, match="profile"):
        dubhe_partition(labels, num_clients=10, rho=10.0, emd_avg=1.0, rng=rng(), profile="zipf")  # type: ignore[arg-type]


def test_dubhe_dirichlet_clients_mix_a_few_classes_and_dominance_follows_the_global_skew() -> None:
    labels = np.repeat(np.arange(10), 6000)
    part = dubhe_partition(labels, num_clients=1000, rho=10.0, emd_avg=1.5, rng=rng())
    counts = part.class_counts(labels, 10)
    p = counts / counts.sum(axis=1, keepdims=True)
    top = np.sort(p, axis=1)[:, ::-1]
    # Neither extreme: most clients are led by one class, but many hold a second one too.
    assert 0.5 < np.mean(top[:, 0]) < 0.95
    assert np.mean(top[:, 1] > 0.1) > 0.2
    # Which class leads a client follows p_g (Dir(β·C·p_g) at small β): rare classes lead few.
    leaders = np.bincount(np.argmax(p, axis=1), minlength=10) / 1000
    p_g = counts.sum(axis=0) / counts.sum()
    assert np.abs(leaders - p_g).sum() < 0.15
    sizes = counts.sum(axis=1)
    assert sizes.min() >= 0.6 * sizes.mean() and sizes.max() <= 1.6 * sizes.mean()


# --- imbalance measures ---------------------------------------------------------------------


def test_measures_on_a_hand_example() -> None:
    counts = np.array([[10, 0, 5], [0, 20, 5], [10, 10, 10]])
    # global V = [20, 30, 20]
    assert global_imbalance(counts) == pytest.approx(1.5)
    np.testing.assert_array_equal(local_imbalance(counts), [np.inf, np.inf, 1.0])
    np.testing.assert_allclose(local_imbalance(counts, present_only=True), [2.0, 4.0, 1.0])
    v = np.array([20, 30, 20])
    expected_cs = counts @ v / (np.linalg.norm(counts, axis=1) * np.linalg.norm(v))
    np.testing.assert_allclose(cosine_similarity_to_global(counts), expected_cs)
    p_g = v / 70
    expected_emd = np.abs(counts / counts.sum(axis=1, keepdims=True) - p_g).sum(axis=1)
    np.testing.assert_allclose(emd(counts), expected_emd)
    assert emd_avg(counts) == pytest.approx(expected_emd.mean())
    assert l1_to_uniform([1, 1, 2]) == pytest.approx(abs(0.25 - 1 / 3) * 2 + abs(0.5 - 1 / 3))
    assert l1_to_uniform([0.2, 0.2, 0.2, 0.2, 0.2]) == pytest.approx(0.0)
    assert global_imbalance([[1, 0]]) == np.inf


def test_emd_reference_and_empty_clients() -> None:
    counts = np.array([[5, 5], [0, 0]])
    values = emd(counts, reference=[1, 0])
    assert values[0] == pytest.approx(1.0) and np.isnan(values[1])
    assert emd_avg(counts, reference=[1, 0]) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="non-negative"):
        emd([[-1, 2]])


@settings(max_examples=60, deadline=None)
@given(
    arrays(np.int64, st.tuples(st.integers(1, 8), st.integers(2, 6)), elements=st.integers(0, 50))
)
def test_measure_ranges(counts: np.ndarray) -> None:
    counts = counts.copy()
    counts[:, 0] += 1  # every client holds something
    values = emd(counts)
    assert np.all((values >= -1e-12) & (values <= 2.0 + 1e-12))
    cs = cosine_similarity_to_global(counts)
    assert np.all((cs >= -1e-12) & (cs <= 1.0 + 1e-12))
    same = np.tile(counts[0], (3, 1))
    assert emd_avg(same) == pytest.approx(0.0, abs=1e-12)
    assert global_imbalance(counts) >= 1.0
