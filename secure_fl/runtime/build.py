"""From a validated :class:`~secure_fl.config.RunConfig` to a ready :class:`Simulation`.

Data preparation, in order, each step seeded from the run's data seed:
1. load the dataset (``data.dataset``, split by ``data.seed``/the run seed where it has no official split);
2. optionally a stratified subset of ``train_samples`` / ``test_samples``;
3. optionally keep 1/ρ of each minority class (``minority_rho``);
4. partition among ``num_clients`` clients (``minority_classes`` is handed to partitioners that take it);
5. reorder the training images once so every client's samples are one contiguous slice on the device.

Privacy (``[privacy]``): the statistics service gets a
:class:`~secure_fl.stats.StatisticsPrivacy` for ``[privacy.statistics]``, and the simulation a
:class:`~secure_fl.privacy.dpsgd.DPSGDConfig` for ``[privacy.dp_sgd]`` (:func:`dp_sgd_config`).
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from secure_fl.algorithms import ClientData, FlatLayout, HeldOut, LocalTraining, make_algorithm
from secure_fl.config import ConfigError, RunConfig
from secure_fl.data import PARTITIONERS, Dataset, keep_minority, load_dataset
from secure_fl.losses import make_loss
from secure_fl.models import build_model
from secure_fl.runtime.messages import run_digest
from secure_fl.runtime.mitigation import mitigated_selection, release_policy, run_privacy
from secure_fl.runtime.rng import Seeds
from secure_fl.runtime.simulation import Simulation
from secure_fl.selection import make_selection
from secure_fl.selection.strategy import SelectionStrategy
from secure_fl.stats import StatisticsPlan, StatisticsPrivacy, UpdateSettings
from secure_fl.stats.noise import DEFAULT_STATISTIC

if TYPE_CHECKING:
    from secure_fl.privacy.dpsgd import DPSGDConfig

__all__ = [
    "build_simulation",
    "client_data",
    "dp_sgd_config",
    "initial_model",
    "local_training",
    "prepare_partition",
    "statistics_plan",
    "stratified_subset",
]


def local_training(config: RunConfig) -> LocalTraining:
    t = config.train
    return LocalTraining(
        epochs=t.local_epochs, batch_size=t.batch_size, lr=t.lr, momentum=t.momentum,
        weight_decay=t.weight_decay, lr_decay=t.lr_decay, lr_decay_every=t.lr_decay_every, nesterov=t.nesterov,
    )


def stratified_subset(labels: np.ndarray, size: int, rng: np.random.Generator) -> np.ndarray:
    """``size`` indices drawn per class in proportion to the class sizes (sorted)."""
    if size >= labels.size:
        return np.arange(labels.size)
    classes, counts = np.unique(labels, return_counts=True)
    quota = np.floor(counts * size / labels.size).astype(np.int64)
    remainder = counts * size / labels.size - quota
    for i in np.argsort(-remainder, kind="stable")[: size - int(quota.sum())]:
        quota[i] += 1
    chosen = [rng.choice(np.flatnonzero(labels == c), size=q, replace=False) for c, q in zip(classes, quota)]
    return np.sort(np.concatenate(chosen))


def prepare_partition(config: RunConfig, dataset: Dataset) -> tuple[np.ndarray, tuple[np.ndarray, ...]]:
    """Training indices in use and each client's indices into the training set."""
    data = config.data
    seeds = Seeds(config.data_seed)
    labels = dataset.y_train
    pool = np.arange(labels.size)
    if data.train_samples is not None:
        pool = stratified_subset(labels, data.train_samples, seeds.numpy("train_subset"))
    if data.minority_rho > 1.0:
        kept = keep_minority(labels[pool], minority_classes=data.minority_classes, rho=data.minority_rho,
                             rng=seeds.numpy("minority"))
        pool = pool[kept]
    params = dict(data.partition_params)
    partitioner = PARTITIONERS[data.partition]
    if data.minority_classes and "minority_classes" not in params \
            and "minority_classes" in inspect.signature(partitioner).parameters:
        params["minority_classes"] = list(data.minority_classes)
    partition = partitioner(labels[pool], num_clients=data.num_clients, rng=seeds.numpy("partition"), **params)
    return pool, tuple(pool[ix] for ix in partition.client_indices)


def held_out(dataset: Dataset, client_indices: Sequence[np.ndarray]) -> HeldOut | None:
    """The training samples outside every client's data (``None`` when the clients hold them all)."""
    used = np.concatenate(client_indices) if client_indices else np.empty(0, dtype=np.int64)
    rest = np.setdiff1d(np.arange(dataset.y_train.size), used)
    return HeldOut(x=dataset.x_train, y=dataset.y_train, index=rest) if rest.size else None


def client_data(
    dataset: Dataset, client_indices: Sequence[np.ndarray], *, device: torch.device
) -> dict[int, ClientData]:
    """Each client's samples as contiguous slices of one reordered tensor on ``device``."""
    order = np.concatenate(client_indices) if client_indices else np.empty(0, dtype=np.int64)
    x = torch.from_numpy(np.ascontiguousarray(dataset.x_train[order])).to(device)
    y = torch.from_numpy(np.ascontiguousarray(dataset.y_train[order])).to(device)
    clients: dict[int, ClientData] = {}
    offset = 0
    for cid, indices in enumerate(client_indices):
        n = int(indices.size)
        counts = np.bincount(dataset.y_train[indices], minlength=dataset.num_classes).astype(np.int64)
        clients[cid] = ClientData(client_id=cid, x=x[offset : offset + n], y=y[offset : offset + n],
                                  class_counts=counts)
        offset += n
    return clients


def dp_sgd_config(config: RunConfig, clients: Mapping[int, ClientData]) -> DPSGDConfig | None:
    """``[privacy.dp_sgd]`` as a :class:`~secure_fl.privacy.dpsgd.DPSGDConfig` (``None`` when off).

    With ``target_epsilon`` the noise multiplier comes from ``DPSGDConfig.for_budget`` for a
    client that trains in every one of the planned rounds (selection is not credited): steps =
    rounds × local_epochs × ⌈n/B⌉ at Poisson rate q = 1/⌈n/B⌉, for the smallest and the largest
    client (n of each), keeping the larger σ.
    """
    settings = config.privacy.dp_sgd
    if settings is None:
        return None
    from secure_fl.privacy.dpsgd import DPSGDConfig, sample_rate

    def make(**sigma: Any) -> DPSGDConfig:
        return DPSGDConfig(**sigma, max_grad_norm=settings.max_grad_norm, accountant=settings.accountant,
                           clipping=settings.clipping, secure_mode=settings.secure_mode)

    if settings.noise_multiplier is not None:
        return make(noise_multiplier=settings.noise_multiplier, delta=settings.delta)
    assert settings.target_epsilon is not None
    sizes = sorted({c.num_samples for c in clients.values() if c.num_samples > 0})
    if not sizes:
        raise ConfigError("privacy.dp_sgd.target_epsilon: no client has training samples")
    t, best = config.train, None
    for n in sorted({sizes[0], sizes[-1]}):
        q = sample_rate(n, t.batch_size)
        sigma = DPSGDConfig.for_budget(
            epsilon=settings.target_epsilon, delta=settings.delta, sample_rate=q,
            steps=t.rounds * t.local_epochs * round(1 / q), accountant=settings.accountant,
        ).noise_multiplier
        best = sigma if best is None else max(best, sigma)
    assert best is not None
    return make(noise_multiplier=best, delta=settings.delta)


def load_run_dataset(config: RunConfig) -> Dataset:
    data = config.data
    dataset = load_dataset(data.dataset, root=data.root, seed=config.data_seed, test_fraction=data.test_fraction)
    if data.test_samples is not None and data.test_samples < dataset.y_test.size:
        keep = stratified_subset(dataset.y_test, data.test_samples, Seeds(config.data_seed).numpy("test_subset"))
        dataset = Dataset(name=dataset.name, x_train=dataset.x_train, y_train=dataset.y_train,
                          x_test=dataset.x_test[keep], y_test=dataset.y_test[keep],
                          num_classes=dataset.num_classes, class_names=dataset.class_names)
    bad = [c for c in data.minority_classes if c >= dataset.num_classes]
    if bad:
        raise ValueError(f"data.minority_classes {bad} outside the {dataset.num_classes} classes of {dataset.name}")
    return dataset


def initial_model(config: RunConfig, dataset: Dataset, *, device: torch.device) -> torch.nn.Module:
    """The run's initial global model, drawn from the run seed (every engine and party builds the same)."""
    with Seeds(config.seed).torch_global("init"):
        model = build_model(config.model.name, input_shape=dataset.input_shape, num_classes=dataset.num_classes,
                            **config.model.options)
    return model.to(device)


def statistics_plan(config: RunConfig, selection: SelectionStrategy, *, dimension: int,
                    privacy: StatisticsPrivacy | None) -> StatisticsPlan:
    """The run's statistics plan: public, the same at the server and at every client."""
    secure = config.secure
    updates = UpdateSettings(dimension=dimension, protocol=secure.update_protocol,
                             clip=secure.update_clip, frac_bits=secure.update_frac_bits)
    return StatisticsPlan(
        clients=tuple(range(config.data.num_clients)), protocol=secure.protocol,
        overrides={**selection.protocols, **secure.statistics}, options=secure.protocol_options(),
        privacy=privacy, updates=updates, policy=release_policy(config, selection),
    )


def build_simulation(
    config: RunConfig, *, device: torch.device, dataset: Dataset | None = None
) -> Simulation:
    """Everything a run needs, built deterministically from its config and seed."""
    dataset = dataset if dataset is not None else load_run_dataset(config)
    _, indices = prepare_partition(config, dataset)
    clients = client_data(dataset, indices, device=device)
    seeds = Seeds(config.seed)
    model = initial_model(config, dataset, device=device)
    privacy = config.privacy
    noised = run_privacy(config)
    dp_sgd = dp_sgd_config(config, clients)
    if dp_sgd is not None:
        from secure_fl.privacy.dpsgd import DPSGD

        try:
            DPSGD.validate(model)
        except ValueError as error:
            raise ConfigError(f"privacy.dp_sgd: model {config.model.name!r}: {error}") from None
    selection = make_selection(config.selection.name, config.selection.params)
    plan = statistics_plan(config, selection, dimension=FlatLayout(model).dimension, privacy=noised)
    selection = mitigated_selection(selection, plan.policy)
    return Simulation(
        clients=clients,
        x_test=torch.from_numpy(dataset.x_test).to(device),
        y_test=torch.from_numpy(dataset.y_test).to(device),
        num_classes=dataset.num_classes,
        model=model,
        method=make_algorithm(config.method.name, config.method.params),
        loss=make_loss(config.loss.name, config.loss.params),
        selection=selection,
        training=local_training(config),
        clients_per_round=config.train.clients_per_round,
        plan=plan,
        seeds=seeds,
        device=device,
        rounds=config.train.rounds,
        digest=run_digest(config.to_dict()),
        minority_classes=config.data.minority_classes,
        eval_batch_size=config.train.eval_batch_size,
        dp_sgd=dp_sgd,
        privacy_delta=privacy.reporting_delta if privacy.enabled else (
            noised.statistics[DEFAULT_STATISTIC].delta if noised is not None else None),
        holdout=held_out(dataset, indices),
        clients_path=config.runtime.clients,
        authenticate=config.secure.authenticate,
    )
