"""Experiment configs: TOML files validated on load, expanded into the runs they define.

The schema is documented in docs/runtime.md. In short, a file holds one base run::

    name = "demo"            seed = 0            tail_rounds = 5
    [data]      dataset, num_clients, partition, partition_params, minority_classes, ...
    [model]     name = "mlp", then the model's options (hidden = [128, 128])
    [train]     rounds, clients_per_round, local_epochs, batch_size, lr, momentum, ...
    [method]    name = "fedavg", then its hyper-parameters (mu = 0.01)   or  method = "fedavg"
    [loss]      name = "ce", then its parameters                            or  loss = "ce"
    [selection] name = "random", then its parameters                        or  selection = "random"
    [secure]    protocol, update_protocol, update_clip, update_frac_bits,
                [secure.statistics] per-statistic protocol, [secure.<protocol>] its options
    [privacy]   optional: delta, [privacy.dp_sgd] DP-SGD for local training,
                [privacy.statistics] distributed DP per statistic name (or ``default``)
    [runtime]   optional: engine ("embedded" | "flower-simulation" | "flower"), clients
                ("vectorised" | "loop"), stage_timeout (seconds a distributed stage waits)
    [mitigation] optional: name ("none" | "guard" | "cohorts" | "dp") and its parameters —
                what stops multi-round disaggregation (docs/audit.md, "Mitigations")

and optionally ``[[runs]]`` (tables merged over the base, one run each) and ``[sweep]``
(dotted key → list of values; the cartesian product of all lists is taken for every run).
Every error is a :class:`ConfigError` naming the file and the offending key or value.
Configs are data: argument parsing lives in the CLI, never here.
"""

from __future__ import annotations

import copy
import inspect
import itertools
import json
import math
import tomllib
import types
import typing
from collections.abc import Mapping, Sequence
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path
from typing import Any, Literal

from secure_fl.suggest import did_you_mean

__all__ = [
    "MITIGATIONS",
    "ComponentConfig",
    "ConfigError",
    "DPSGDSettings",
    "DataConfig",
    "ExperimentConfig",
    "MitigationConfig",
    "ModelConfig",
    "PrivacyConfig",
    "RunConfig",
    "RuntimeConfig",
    "SecureConfig",
    "TrainConfig",
    "declared_statistics",
    "load_config",
    "parse_config",
    "planned_protocols",
]


class ConfigError(ValueError):
    """A config that cannot be run; the message names the key or value at fault."""


class _FieldError(Exception):
    def __init__(self, key: str, message: str) -> None:
        super().__init__(f"{key}: {message}")
        self.key, self.message = key, message


def _check(condition: bool, key: str, message: str) -> None:
    if not condition:
        raise _FieldError(key, message)


# --- sections -------------------------------------------------------------------------------

@dataclass(frozen=True, kw_only=True)
class DataConfig:
    """Which data, how it is split among clients, which classes are the minority."""

    dataset: str
    num_clients: int
    partition: str = "dirichlet"
    partition_params: dict[str, Any] = field(default_factory=dict)
    root: str | None = None
    test_fraction: float = 0.2
    minority_classes: tuple[int, ...] = ()
    """Evaluated as minority accuracy; also handed to partitioners that take ``minority_classes``."""
    minority_rho: float = 1.0
    """Keep 1/ρ of each minority class before partitioning (1: keep all)."""
    train_samples: int | None = None
    """Use a stratified random subset of this many training samples (fast demos)."""
    test_samples: int | None = None
    seed: int | None = None
    """Seed of the split, subset and partition; the run's seed when absent."""

    def __post_init__(self) -> None:
        from secure_fl.data import DATASETS, PARTITIONERS

        key = self.dataset.strip().lower().replace("_", "-")
        _check(key in DATASETS, "dataset", f"unknown dataset {self.dataset!r}{did_you_mean(key, DATASETS)}; "
                                          f"known: {', '.join(sorted(DATASETS))}")
        _check(self.num_clients >= 1, "num_clients", f"must be >= 1, got {self.num_clients}")
        _check(self.partition in PARTITIONERS, "partition",
               f"unknown partition {self.partition!r}{did_you_mean(self.partition, PARTITIONERS)}; "
               f"known: {', '.join(sorted(PARTITIONERS))}")
        partitioner = PARTITIONERS[self.partition]
        fixed = {"labels", "num_clients", "rng"}
        accepted = _keyword_parameters(partitioner, exclude=fixed)
        if accepted is not None:
            for name in self.partition_params:
                _check(name in accepted, f"partition_params.{name}",
                       f"unknown parameter of partition {self.partition!r}{did_you_mean(name, accepted)}; "
                       f"known: {', '.join(sorted(accepted))}")
        for name in _required_parameters(partitioner, exclude=fixed):
            _check(name in self.partition_params, "partition_params",
                   f"partition {self.partition!r} needs '{name}' (e.g. partition_params = {{ {name} = ... }})")
        _check(0.0 < self.test_fraction < 1.0, "test_fraction", f"must lie in (0, 1), got {self.test_fraction}")
        _check(all(c >= 0 for c in self.minority_classes), "minority_classes", "class ids must be >= 0")
        _check(len(set(self.minority_classes)) == len(self.minority_classes), "minority_classes", "repeated class id")
        _check(self.minority_rho >= 1.0, "minority_rho", f"must be >= 1, got {self.minority_rho}")
        _check(self.minority_rho == 1.0 or bool(self.minority_classes), "minority_rho",
               "needs minority_classes")
        for name in ("train_samples", "test_samples"):
            value = getattr(self, name)
            _check(value is None or value >= 1, name, f"must be >= 1, got {value}")
        _check(self.seed is None or self.seed >= 0, "seed", f"must be >= 0, got {self.seed}")


@dataclass(frozen=True, kw_only=True)
class ModelConfig:
    name: str = "mlp"
    options: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        from secure_fl.models import MODELS

        key = self.name.strip().lower().replace("-", "_")
        _check(key in MODELS, "name", f"unknown model {self.name!r}{did_you_mean(key, MODELS)}; "
                                      f"known: {', '.join(sorted(MODELS))}")
        accepted = _keyword_parameters(MODELS[key], exclude={"input_shape", "num_classes"})
        if accepted is not None:
            for option in self.options:
                _check(option in accepted, option,
                       f"unknown option of model {self.name!r}{did_you_mean(option, accepted)}; "
                       f"known: {', '.join(sorted(accepted)) or 'none'}")


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """Rounds, participation, and the client optimiser (defaults: FedShift's recipe, B = 32)."""

    rounds: int
    clients_per_round: int
    local_epochs: int = 1
    batch_size: int = 32
    lr: float = 0.01
    momentum: float = 0.9
    weight_decay: float = 1e-4
    lr_decay: float = 0.95
    lr_decay_every: int = 10
    nesterov: bool = False
    eval_batch_size: int = 1024

    def __post_init__(self) -> None:
        _check(self.rounds >= 1, "rounds", f"must be >= 1, got {self.rounds}")
        _check(self.clients_per_round >= 1, "clients_per_round", f"must be >= 1, got {self.clients_per_round}")
        _check(self.local_epochs >= 1, "local_epochs", f"must be >= 1, got {self.local_epochs}")
        _check(self.batch_size >= 1, "batch_size", f"must be >= 1, got {self.batch_size}")
        _check(math.isfinite(self.lr) and self.lr > 0, "lr", f"must be positive, got {self.lr}")
        _check(0.0 <= self.momentum < 1.0, "momentum", f"must lie in [0, 1), got {self.momentum}")
        _check(self.weight_decay >= 0, "weight_decay", f"must be >= 0, got {self.weight_decay}")
        _check(0.0 < self.lr_decay <= 1.0, "lr_decay", f"must lie in (0, 1], got {self.lr_decay}")
        _check(self.lr_decay_every >= 1, "lr_decay_every", f"must be >= 1, got {self.lr_decay_every}")
        _check(not self.nesterov or self.momentum > 0, "nesterov", "needs momentum > 0")
        _check(self.eval_batch_size >= 1, "eval_batch_size", f"must be >= 1, got {self.eval_batch_size}")


@dataclass(frozen=True, kw_only=True)
class SecureConfig:
    """Which protocol computes statistics and which aggregates model updates.

    ``protocol`` serves every statistic unless ``statistics`` names another for it;
    ``update_protocol`` is ``clear`` (float32 sum, no encoding) or a protocol name, with
    fixed-point encoding of ``update_frac_bits`` fractional bits and per-entry bound
    ``update_clip`` (larger entries are clipped and counted). ``options`` holds each
    protocol's keyword options (``[secure.paillier] key_bits = 2048``). ``authenticate``: every
    party gets an Ed25519 signing key registered before the run (the embedded engine plays the
    registration step) and every protocol message is signed and checked against the registry;
    it also turns on what needs registered keys (CKKS/BFV verified aggregates; masking's
    ``active_server`` may then be set).
    """

    protocol: str = "plain"
    update_protocol: str = "clear"
    update_clip: float = 1.0
    update_frac_bits: int = 24
    statistics: dict[str, str] = field(default_factory=dict)
    options: dict[str, dict[str, Any]] = field(default_factory=dict)
    authenticate: bool = False

    def __post_init__(self) -> None:
        from protocols import PROTOCOLS

        known = ", ".join(PROTOCOLS)
        _check(self.protocol in PROTOCOLS, "protocol",
               f"unknown protocol {self.protocol!r}{did_you_mean(self.protocol, PROTOCOLS)}; known: {known}")
        _check(self.update_protocol == "clear" or self.update_protocol in PROTOCOLS, "update_protocol",
               f"unknown protocol {self.update_protocol!r}{did_you_mean(self.update_protocol, PROTOCOLS)}; "
               f"known: {known}")
        for name, protocol in self.statistics.items():
            _check(isinstance(protocol, str) and protocol in PROTOCOLS, f"statistics.{name}",
                   f"unknown protocol {protocol!r}{did_you_mean(str(protocol), PROTOCOLS)}; known: {known}")
        _check(math.isfinite(self.update_clip) and self.update_clip > 0, "update_clip",
               f"must be positive, got {self.update_clip}")
        _check(0 <= self.update_frac_bits <= 52, "update_frac_bits", f"must lie in [0, 52], got {self.update_frac_bits}")
        for protocol, options in self.options.items():
            _check_protocol_options(protocol, options)
            _check(not options.get("active_server") or self.authenticate, f"{protocol}.active_server",
                   "defending against an active server needs registered signing keys: set "
                   "secure.authenticate = true")

    def protocol_options(self) -> dict[str, dict[str, Any]]:
        return {name: dict(options) for name, options in self.options.items()}


def _check_protocol_options(protocol: str, options: Mapping[str, Any]) -> None:
    """Build the protocol's options (no keys are generated) so bad options fail at load."""
    from protocols import descriptor

    d = descriptor(protocol)
    try:
        option_cls = d.options_class
    except ImportError:
        return  # the protocol's library is not installed here; the run reports it when it starts
    if option_cls is None:
        _check(not options, protocol, f"protocol {protocol!r} takes no options, got {', '.join(sorted(options))}")
        return
    accepted = {f.name for f in fields(option_cls)}
    for key in options:
        _check(key in accepted, f"{protocol}.{key}",
               f"unknown option of protocol {protocol!r}{did_you_mean(key, accepted)}; "
               f"known: {', '.join(sorted(accepted))}")
    try:
        option_cls(**options)
    except (TypeError, ValueError) as error:
        raise _FieldError(protocol, str(error)) from None


@dataclass(frozen=True, kw_only=True)
class DPSGDSettings:
    """``[privacy.dp_sgd]``: DP-SGD for every client's local training (any method).

    Exactly one of ``noise_multiplier`` (σ, fixed) and ``target_epsilon`` (σ derived with
    ``DPSGDConfig.for_budget`` so that a client taking part in every planned round, with the
    smallest client's sampling rate, stays within (target_epsilon, delta)).
    ``secure_mode = false`` (tests, experiments only) draws batches and noise from generators
    keyed by the run seed, round and client instead of the CSPRNG.
    """

    noise_multiplier: float | None = None
    target_epsilon: float | None = None
    max_grad_norm: float = 1.0
    delta: float = 1e-5
    accountant: Literal["rdp", "prv"] = "rdp"
    clipping: Literal["ghost", "per-sample"] = "ghost"
    secure_mode: bool = True

    def __post_init__(self) -> None:
        _check((self.noise_multiplier is None) != (self.target_epsilon is None), "noise_multiplier",
               "give exactly one of noise_multiplier and target_epsilon")
        for name in ("noise_multiplier", "target_epsilon"):
            value = getattr(self, name)
            _check(value is None or (math.isfinite(value) and value > 0), name, f"must be positive, got {value}")
        _check(math.isfinite(self.max_grad_norm) and self.max_grad_norm > 0, "max_grad_norm",
               f"must be positive, got {self.max_grad_norm}")
        _check(0.0 < self.delta < 1.0, "delta", f"must lie in (0, 1), got {self.delta}")


@dataclass(frozen=True, kw_only=True)
class PrivacyConfig:
    """``[privacy]``: DP-SGD (``dp_sgd``) and distributed DP per statistic (``statistics``).

    ``statistics`` maps a statistic name — or ``default``, for every statistic without an
    entry — to its budget (:class:`~secure_fl.stats.StatisticPrivacy`: epsilon, delta, level,
    releases, mechanism, colluders, secure_mode). ``delta`` is the δ at which the whole run's
    composition is reported (default: DP-SGD's δ, else the smallest statistic δ).
    """

    dp_sgd: DPSGDSettings | None = None
    statistics: dict[str, Any] = field(default_factory=dict)
    delta: float | None = None

    def __post_init__(self) -> None:
        _check(self.delta is None or 0.0 < self.delta < 1.0, "delta", f"must lie in (0, 1), got {self.delta}")

    @property
    def enabled(self) -> bool:
        return self.dp_sgd is not None or bool(self.statistics)

    @property
    def reporting_delta(self) -> float:
        if self.delta is not None:
            return self.delta
        if self.dp_sgd is not None:
            return self.dp_sgd.delta
        if self.statistics:
            return float(min(entry.delta for entry in self.statistics.values()))
        return 1e-5

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.delta is not None:
            out["delta"] = self.delta
        if self.dp_sgd is not None:
            out["dp_sgd"] = _plain(self.dp_sgd)
        if self.statistics:
            out["statistics"] = {name: entry.as_dict() for name, entry in sorted(self.statistics.items())}
        return out


ENGINES = ("embedded", "flower-simulation", "flower")
CLIENT_PATHS = ("vectorised", "loop")


@dataclass(frozen=True, kw_only=True)
class RuntimeConfig:
    """``[runtime]``: where the parties run and how a process trains its clients.

    None of it changes what a run computes (same config and seed → same metrics on every
    engine and client path). Only a non-embedded ``engine`` enters the run's identity
    (:meth:`RunConfig.to_dict`), so that the same config run on two engines is two stored runs
    to compare; the client path and the timeout never do.
    ``engine``: ``embedded`` (one process, in-process network), ``flower-simulation`` (Flower's
    Ray simulation engine), ``flower`` (a running SuperLink; ``secure-fl deploy``).
    ``clients``: ``vectorised`` trains the clients of one process together where the model and
    objective allow it, ``loop`` one after another. ``stage_timeout``: seconds a distributed
    engine waits for one protocol stage's replies before counting the silent parties as dropouts.
    """

    engine: str = "embedded"
    clients: str = "vectorised"
    stage_timeout: float = 120.0

    def __post_init__(self) -> None:
        _check(self.engine in ENGINES, "engine",
               f"unknown engine {self.engine!r}{did_you_mean(self.engine, ENGINES)}; known: {', '.join(ENGINES)}")
        _check(self.clients in CLIENT_PATHS, "clients",
               f"unknown client path {self.clients!r}{did_you_mean(self.clients, CLIENT_PATHS)}; "
               f"known: {', '.join(CLIENT_PATHS)}")
        _check(math.isfinite(self.stage_timeout) and self.stage_timeout > 0, "stage_timeout",
               f"must be positive seconds, got {self.stage_timeout}")

    def identity(self) -> dict[str, Any]:
        """What of this section is part of the run's identity (empty on the embedded engine)."""
        return {} if self.engine == "embedded" else {"engine": self.engine}


# --- mitigations against multi-round disaggregation (issue 25) ------------------------------

@dataclass(frozen=True, kw_only=True)
class NoMitigation:
    """``name = "none"``: releases as the method and the selection make them."""


@dataclass(frozen=True, kw_only=True)
class GuardMitigation:
    """``name = "guard"``: every client refuses a release that would put any set of fewer than
    ``k`` clients in the span of the participation vectors of that statistic's releases so far
    (the rule: docs/audit.md, "Cohort guard"); the server's selection follows the same public rule."""

    k: int = 4

    def __post_init__(self) -> None:
        _check(self.k >= 2, "k", f"must be >= 2 (k = 1 protects nothing), got {self.k}")


@dataclass(frozen=True, kw_only=True)
class CohortMitigation:
    """``name = "cohorts"``: clients grouped once (seeded by the run seed, public) into cohorts
    of at least ``size``; selection and every secure sum take whole cohorts."""

    size: int = 4

    def __post_init__(self) -> None:
        _check(self.size >= 2, "size", f"must be >= 2 (a cohort of one is a client), got {self.size}")


@dataclass(frozen=True, kw_only=True)
class DPMitigation:
    """``name = "dp"``: client-level distributed DP on every release, model updates included.

    ``epsilon``/``delta``: each noised statistic's budget over the run (the run's composed ε
    per client is reported by the accountant); ``update_l2``: the L2 bound every client clips
    its (scaled) model update to before noising — the sensitivity of one client's update.
    ``counts``: ``client`` (the default) noises every statistic at client level; ``record`` noises
    statistics that declare a per-record sensitivity (sample and label counts) at record level
    only — a weaker guarantee for them, stated in the run's ε, for populations too small for
    client-level counts (their noise then exceeds the sums).
    ``secure_mode = false`` (tests, audits) draws the noise from the run seed.
    """

    epsilon: float = 2.0
    delta: float = 1e-5
    update_l2: float = 0.05
    counts: str = "client"
    secure_mode: bool = True

    def __post_init__(self) -> None:
        _check(math.isfinite(self.epsilon) and self.epsilon > 0, "epsilon", f"must be finite and > 0, got {self.epsilon}")
        _check(0 < self.delta < 1, "delta", f"must lie in (0, 1), got {self.delta}")
        _check(math.isfinite(self.update_l2) and self.update_l2 > 0, "update_l2",
               f"must be finite and > 0, got {self.update_l2}")
        _check(self.counts in ("client", "record"), "counts", f"must be 'client' or 'record', got {self.counts!r}")


MITIGATIONS: dict[str, type[Any]] = {
    "none": NoMitigation,
    "guard": GuardMitigation,
    "cohorts": CohortMitigation,
    "dp": DPMitigation,
}
"""``[mitigation] name`` → its frozen parameters class (the fields are the table's other keys)."""


@dataclass(frozen=True)
class MitigationConfig:
    """``[mitigation]``: a name from :data:`MITIGATIONS` and its parameters."""

    name: str = "none"
    params: Any = field(default_factory=NoMitigation)

    @property
    def enabled(self) -> bool:
        return self.name != "none"

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, **_plain(self.params)}


def _mitigation_section(table: Any, source: str) -> MitigationConfig:
    if not isinstance(table, dict):
        raise ConfigError(f"{source}: 'mitigation' must be a table with 'name' and its parameters")
    params = dict(table)
    name = params.pop("name", "none")
    if not isinstance(name, str) or name not in MITIGATIONS:
        raise ConfigError(f"{source}: mitigation.name: unknown mitigation {name!r}"
                          f"{did_you_mean(str(name), MITIGATIONS)}; known: {', '.join(MITIGATIONS)}")
    return MitigationConfig(name=name, params=_section(MITIGATIONS[name], params, "mitigation", source))


def _check_mitigation(mitigation: MitigationConfig, data: DataConfig, privacy: PrivacyConfig,
                      runtime: RuntimeConfig, source: str) -> None:
    """What a mitigation needs of the rest of the run."""
    p = mitigation.params
    if isinstance(p, GuardMitigation) and p.k > data.num_clients:
        raise ConfigError(f"{source}: mitigation.k = {p.k} exceeds data.num_clients = {data.num_clients}")
    if isinstance(p, CohortMitigation) and p.size > data.num_clients:
        raise ConfigError(f"{source}: mitigation.size = {p.size} exceeds data.num_clients = {data.num_clients}")
    if isinstance(p, DPMitigation) and privacy.statistics:
        raise ConfigError(f"{source}: mitigation 'dp' noises every release itself; drop [privacy.statistics] "
                          "(or use mitigation 'none' with it)")


def _check_distributed_dp(run: RunConfig, source: str) -> None:
    """Distributed DP calibrates each client's noise for the *sum*: a statistic or update that
    the server receives one by one (a protocol of the ``clear`` family: ``plain``, ``clear``)
    would carry only a fraction of the noise the reported ε assumes, so that is refused."""
    from protocols import DESCRIPTORS
    from secure_fl.stats import DEFAULT_STATISTIC

    everything = isinstance(run.mitigation.params, DPMitigation)
    if not everything and not run.privacy.statistics:
        return
    noised = {name: protocol for name, protocol in planned_protocols(run).items()
              if everything or name in run.privacy.statistics or DEFAULT_STATISTIC in run.privacy.statistics}
    if everything:
        noised["model updates (secure.update_protocol)"] = run.secure.update_protocol
    for name, protocols in sorted(noised.items()):
        clear = [p for p in protocols.split("/") if DESCRIPTORS[p].family == "clear"]
        if clear:
            table = "mitigation 'dp'" if everything else "privacy.statistics"
            raise ConfigError(f"{source}: {table}: distributed DP adds each client's share of the noise before a "
                              f"secure sum, but {name} goes through {clear[0]!r}, which hands the server every "
                              "client's input: choose a secure protocol ([secure] protocol, update_protocol or "
                              "secure.statistics: masking, secagg+, paillier, ckks, bfv)")


@dataclass(frozen=True)
class ComponentConfig:
    """A registry name and its parameters (method, loss, selection)."""

    name: str
    params: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, **self.params}


@dataclass(frozen=True, kw_only=True)
class RunConfig:
    """One fully specified run; :meth:`to_dict` is what the store keeps and compares on resume."""

    name: str
    seed: int
    data: DataConfig
    model: ModelConfig
    train: TrainConfig
    method: ComponentConfig
    loss: ComponentConfig
    selection: ComponentConfig
    secure: SecureConfig
    tail_rounds: int = 5
    label: str = ""
    privacy: PrivacyConfig = field(default_factory=PrivacyConfig)
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
    mitigation: MitigationConfig = field(default_factory=MitigationConfig)

    @property
    def data_seed(self) -> int:
        return self.seed if self.data.seed is None else self.data.seed

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "seed": self.seed,
            "tail_rounds": self.tail_rounds,
            "data": _plain(self.data),
            "model": {"name": self.model.name, **self.model.options},
            "train": _plain(self.train),
            "method": self.method.to_dict(),
            "loss": self.loss.to_dict(),
            "selection": self.selection.to_dict(),
            "secure": _secure_dict(self.secure),
            **({"privacy": self.privacy.to_dict()} if self.privacy.enabled else {}),
            **({"runtime": self.runtime.identity()} if self.runtime.identity() else {}),
            **({"mitigation": self.mitigation.to_dict()} if self.mitigation.enabled else {}),
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any], *, label: str = "", source: str = "<stored>") -> RunConfig:
        return _build_run(copy.deepcopy(dict(raw)), source=source, label=label)


@dataclass(frozen=True)
class ExperimentConfig:
    """What a config file defines: its runs, in the order they are executed."""

    name: str
    runs: tuple[RunConfig, ...]
    source: str = "<string>"


# --- loading --------------------------------------------------------------------------------

TOP_LEVEL = ("name", "seed", "tail_rounds", "data", "model", "train", "method", "loss", "selection",
             "secure", "privacy", "runtime", "mitigation", "sweep", "runs")
COMPONENT_DEFAULTS = {"method": "fedavg", "loss": "ce", "selection": "random"}


Override = tuple[str, Any]
"""``(dotted key, value)`` set in every run after ``[[runs]]`` and ``[sweep]`` (the CLI's ``--set``)."""


def load_config(path: str | Path, *, overrides: Sequence[Override] = ()) -> ExperimentConfig:
    """Read and validate a TOML config file (with ``overrides`` applied to every run)."""
    file = Path(path)
    if file.is_dir():
        raise ConfigError(f"{file} is a folder; name a config file (e.g. experiments/demo.toml)")
    try:
        text = file.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{file}: cannot read config: no such file") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{file}: cannot read config: not a text (UTF-8) file; a config is TOML") from None
    except OSError as error:
        raise ConfigError(f"{file}: cannot read config: {error.strerror or error}") from None
    return parse_config(text, source=str(file), assignments=overrides)


def override_value(text: str) -> Any:
    """A ``--set`` value: read as a TOML value (``3``, ``0.1``, ``true``, ``[1, 2]``, ``"x"``,
    ``{ name = "fedprox", mu = 0.1 }``), else taken as a string (``paillier``)."""
    try:
        return tomllib.loads(f"value = {text}")["value"]
    except tomllib.TOMLDecodeError:
        return text


def parse_config(text: str, *, source: str = "<string>", assignments: Sequence[Override] = ()) -> ExperimentConfig:
    """Validate a config's text; ``assignments`` (``--set``) are applied to every run last."""
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(f"{source}: not valid TOML: {error}") from None
    settable = [k for k in TOP_LEVEL if k not in ("sweep", "runs")]
    for path, _ in assignments:
        top = path.split(".")[0]
        if top not in settable or not all(path.split(".")):
            raise ConfigError(f"--set {path}: unknown key '{top}'{did_you_mean(top, settable)}; "
                              f"set one of {', '.join(settable)} (dotted: train.rounds)")
    for key in raw:
        if key not in TOP_LEVEL:
            raise ConfigError(f"{source}: unknown key '{key}'{did_you_mean(key, TOP_LEVEL)}; "
                              f"known top-level keys: {', '.join(TOP_LEVEL)}")
    sweep = raw.pop("sweep", {})
    overrides = raw.pop("runs", [{}])
    if not isinstance(sweep, dict):
        raise ConfigError(f"{source}: 'sweep' must be a table of key = [values]")
    if not isinstance(overrides, list) or not overrides or not all(isinstance(o, dict) for o in overrides):
        raise ConfigError(f"{source}: 'runs' must be a non-empty array of tables ([[runs]])")
    axes = _sweep_axes(sweep, source)
    # a value set from the command line replaces a sweep over it (and over keys inside it)
    axes = [(p, v) for p, v in axes if not any(p == a or p.startswith(a + ".") for a, _ in assignments)]
    runs: list[RunConfig] = []
    for index, override in enumerate(overrides):
        for key in override:
            if key not in TOP_LEVEL or key in ("sweep", "runs"):
                keys = [k for k in TOP_LEVEL if k not in ("sweep", "runs")]
                raise ConfigError(f"{source}: unknown key 'runs[{index}].{key}'{did_you_mean(key, keys)}; "
                                  f"a run may set {', '.join(keys)}")
        base = _merge(copy.deepcopy(raw), _normalise_components(copy.deepcopy(override)))
        for combo in itertools.product(*(values for _, values in axes)) if axes else [()]:
            candidate = copy.deepcopy(base)
            parts = _override_label(override) if len(overrides) > 1 else []
            for (path, _), value in zip(axes, combo):
                _set_path(candidate, path, copy.deepcopy(value))
                parts.append(f"{path}={_short(value)}")
            for path, value in assignments:
                try:
                    _set_path(candidate, path, copy.deepcopy(override_value(value) if isinstance(value, str)
                                                             else value))
                except ConfigError as error:
                    raise ConfigError(f"--set {path}: {error}") from None
            where = " ".join(parts)
            runs.append(_build_run(candidate, source=source if not where else f"{source} ({where})", label=where))
    _check_statistic_names(runs, source)
    for run in runs:
        _check_distributed_dp(run, source)
    name = raw.get("name", Path(source).stem if source != "<string>" else "experiment")
    return ExperimentConfig(name=str(name), runs=tuple(runs), source=source)


# --- statistic names ------------------------------------------------------------------------

METHOD, UPDATE, SELECTION, SELECTION_SESSION = "method", "update", "selection", "selection session"
"""Who declares a statistic of a run (:func:`declared_statistics`)."""


def declared_statistics(run: RunConfig) -> dict[str, str]:
    """Every statistic ``run`` may sum, by name → who declares it, without loading data.

    The names come from the halves that the clients run — the method's client half
    (:meth:`~secure_fl.algorithms.ClientMethod.declarations`: its statistics, ``total_samples``,
    and the model-sized update sums, ``model_update`` and SCAFFOLD's ``control_update``) and the
    selection's client half — built with the run's public settings. Their names do not depend on
    the data, so the number of classes and the model size are placeholders here. ``update``:
    a model-sized sum (its protocol is ``secure.update_protocol``); ``selection``: a selection
    statistic the run's plan routes (greedy's counts, Dubhe's coin flips); ``selection session``:
    one the strategy sums on a session of its own (Dubhe's registries), whose protocol no config
    table changes.
    """
    from secure_fl.algorithms import LocalTraining, RunInfo, make_algorithm
    from secure_fl.selection import make_selection
    from secure_fl.stats import UpdateSettings

    num_classes = max([10, *(c + 1 for c in run.data.minority_classes)])
    t = run.train
    training = LocalTraining(epochs=t.local_epochs, batch_size=t.batch_size, lr=t.lr, momentum=t.momentum,
                             weight_decay=t.weight_decay, lr_decay=t.lr_decay, lr_decay_every=t.lr_decay_every,
                             nesterov=t.nesterov)
    updates = UpdateSettings(dimension=1, protocol=run.secure.update_protocol, clip=run.secure.update_clip,
                             frac_bits=run.secure.update_frac_bits)
    info = RunInfo(num_clients=run.data.num_clients, num_classes=num_classes, dimension=1, rounds=t.rounds,
                   training=training, updates=updates)
    client = make_algorithm(run.method.name, run.method.params).client(info)
    out = {name: (UPDATE if name in client.update_statistics else METHOD) for name in client.declarations()}
    strategy = make_selection(run.selection.name, run.selection.params)
    selection_client = strategy.client(num_classes=num_classes)
    if selection_client is not None:
        for name in selection_client.declarations():
            out.setdefault(name, SELECTION if name in strategy.protocols else SELECTION_SESSION)
    return out


def planned_protocols(run: RunConfig) -> dict[str, str]:
    """The protocol each statistic of ``run`` goes through, by name (model-sized sums excluded:
    they use ``secure.update_protocol``), as the run's plan routes it — what the run's header shows
    before any release names its protocol."""
    from secure_fl.selection import make_selection

    strategy = make_selection(run.selection.name, run.selection.params)
    sessions = {protocol for protocol, _ in strategy.sessions()}
    out: dict[str, str] = {}
    for name, kind in sorted(declared_statistics(run).items()):
        if kind == UPDATE:
            continue
        if kind == SELECTION_SESSION:
            out[name] = "/".join(sorted(sessions)) or run.secure.protocol
        elif kind == SELECTION:
            out[name] = run.secure.statistics.get(name, strategy.protocols[name])
        else:
            out[name] = run.secure.statistics.get(name, run.secure.protocol)
    return out


def _check_statistic_names(runs: Sequence[RunConfig], source: str) -> None:
    """``[secure.statistics]`` and ``[privacy.statistics]`` name only statistics the runs sum.

    Per run: a model-sized update sum takes its protocol from ``secure.update_protocol`` and gets
    no distributed-DP noise, and a statistic a selection sums on its own session takes no protocol
    from the config — naming either would be ignored, so it is an error. A name that no run of the
    file declares is a typo (an error suggesting the closest declared name); one that only some
    runs of a sweep declare applies to those runs.
    """
    from secure_fl.stats import DEFAULT_STATISTIC

    if not any(r.secure.statistics or r.privacy.statistics for r in runs):
        return
    cache: dict[str, dict[str, str]] = {}
    declared: list[dict[str, str]] = []
    for run in runs:
        key = json.dumps([run.method.to_dict(), run.selection.to_dict(), run.secure.update_protocol,
                          run.data.minority_classes, run.train.rounds], sort_keys=True, default=str)
        if key not in cache:
            try:
                cache[key] = declared_statistics(run)
            except (TypeError, ValueError) as error:
                raise ConfigError(f"{source}: method: {error}") from None
        declared.append(cache[key])
    every = {name for names in declared for name in names}
    for run, names in zip(runs, declared):
        where = f"method {run.method.name!r}" + (
            f" with selection {run.selection.name!r}" if run.selection.name != COMPONENT_DEFAULTS["selection"] else "")
        summed = ", ".join(sorted(n for n, kind in names.items() if kind != UPDATE))
        for table, entries in (("secure.statistics", run.secure.statistics), ("privacy.statistics",
                                                                              run.privacy.statistics)):
            for name in entries:
                if table == "privacy.statistics" and name == DEFAULT_STATISTIC:
                    continue
                kind = names.get(name)
                if kind == UPDATE:
                    if table == "secure.statistics":
                        raise ConfigError(
                            f"{source}: {table}.{name}: {name!r} is a model-sized update sum; set its protocol "
                            f"with secure.update_protocol (now {run.secure.update_protocol!r}) instead")
                    raise ConfigError(
                        f"{source}: {table}.{name}: {name!r} is a model-sized update sum, which gets no "
                        "distributed-DP noise; protect model updates with [privacy.dp_sgd] instead")
                if kind == SELECTION_SESSION and table == "secure.statistics":
                    strategy = _selection_sessions(run)
                    raise ConfigError(
                        f"{source}: {table}.{name}: selection {run.selection.name!r} sums {name!r} on its own "
                        f"session ({strategy}); remove the entry (its protocol cannot be changed here)")
                if kind is None and name not in every:
                    if len(runs) == 1:
                        scope, what = "in this run", f"{where} sums: {summed or 'none'}"
                    else:
                        summed = ", ".join(sorted({n for names_ in declared for n, k in names_.items() if k != UPDATE}))
                        scope, what = "in any run of this file", f"its runs sum: {summed or 'none'}"
                    options = [n for names_ in declared for n, k in names_.items() if k != UPDATE]
                    raise ConfigError(f"{source}: {table}.{name}: no statistic {name!r} {scope}"
                                      f"{did_you_mean(name, options)}; {what}")


def _selection_sessions(run: RunConfig) -> str:
    from secure_fl.selection import make_selection

    sessions = make_selection(run.selection.name, run.selection.params).sessions()
    return ", ".join(f"{protocol} '{tag}'" for protocol, tag in sessions) or "its own"


def _override_label(override: Mapping[str, Any], prefix: str = "") -> list[str]:
    """What a ``[[runs]]`` entry sets, for the run's label: ``method=climb secure.protocol=ckks``."""
    parts = []
    for key, value in override.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and not (not prefix and key in (*COMPONENT_DEFAULTS, "model")):
            parts.extend(_override_label(value, prefix=f"{path}."))
        else:
            parts.append(f"{path}={_short(value)}")
    return parts


def _short(value: Any) -> str:
    if isinstance(value, dict):
        return str(value.get("name", json.dumps(value, sort_keys=True)))
    return json.dumps(value) if not isinstance(value, str) else value


def _sweep_axes(sweep: Mapping[str, Any], source: str, prefix: str = "") -> list[tuple[str, list[Any]]]:
    axes: list[tuple[str, list[Any]]] = []
    for key, value in sweep.items():
        path = f"{prefix}{key}"
        top = path.split(".")[0]
        if top not in TOP_LEVEL or top in ("sweep", "runs"):
            keys = [k for k in TOP_LEVEL if k not in ("sweep", "runs")]
            raise ConfigError(f"{source}: unknown key 'sweep.{path}'{did_you_mean(top, keys)}; a sweep varies one of "
                              f"{', '.join(keys)}")
        if isinstance(value, dict):
            axes.extend(_sweep_axes(value, source, prefix=f"{path}."))
        elif isinstance(value, list) and value:
            axes.append((path, value))
        else:
            raise ConfigError(f"{source}: 'sweep.{path}' must be a non-empty list of values")
    return axes


def _set_path(raw: dict[str, Any], path: str, value: Any) -> None:
    keys = path.split(".")
    node = raw
    for key in keys[:-1]:
        child = node.get(key)
        if isinstance(child, str) and (key in COMPONENT_DEFAULTS or key == "model"):
            child = {"name": child}
        if child is None:
            child = {}
        if not isinstance(child, dict):
            raise ConfigError(f"key '{path}': '{key}' is a value, not a table")
        node[key] = child
        node = child
    node[keys[-1]] = value


def _normalise_components(raw: dict[str, Any]) -> dict[str, Any]:
    for key in ("method", "loss", "selection", "model", "mitigation"):
        if isinstance(raw.get(key), str):
            raw[key] = {"name": raw[key]}
    return raw


def _merge(base: dict[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    _normalise_components(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            if key in ("method", "loss", "selection", "model", "mitigation") and "name" in value \
                    and value["name"] != base[key].get("name"):
                base[key] = dict(value)  # another component: its parameters start afresh
            else:
                _merge(base[key], value)
        else:
            base[key] = value
    return base


def _build_run(raw: dict[str, Any], *, source: str, label: str) -> RunConfig:
    _normalise_components(raw)
    for key in raw:
        if key not in TOP_LEVEL or key in ("sweep", "runs"):
            keys = [k for k in TOP_LEVEL if k not in ("sweep", "runs")]
            raise ConfigError(f"{source}: unknown key '{key}'{did_you_mean(key, keys)}")
    for key in ("data", "train"):
        if key not in raw:
            raise ConfigError(f"{source}: missing table [{key}]")
    seed = raw.get("seed", 0)
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ConfigError(f"{source}: seed must be a non-negative integer, got {seed!r}")
    tail = raw.get("tail_rounds", 5)
    if isinstance(tail, bool) or not isinstance(tail, int) or tail < 1:
        raise ConfigError(f"{source}: tail_rounds must be a positive integer, got {tail!r}")
    name = raw.get("name", "run")
    if not isinstance(name, str):
        raise ConfigError(f"{source}: name must be a string, got {name!r}")
    data = _section(DataConfig, raw["data"], "data", source)
    model_raw = dict(raw.get("model", {}))
    model_name = model_raw.pop("name", "mlp")
    model = _section(ModelConfig, {"name": model_name, "options": model_raw}, "model", source)
    train = _section(TrainConfig, raw["train"], "train", source)
    if train.clients_per_round > data.num_clients:
        raise ConfigError(f"{source}: train.clients_per_round = {train.clients_per_round} exceeds "
                          f"data.num_clients = {data.num_clients}")
    secure = _secure_section(raw.get("secure", {}), source)
    privacy = _privacy_section(raw.get("privacy", {}), source)
    runtime = _section(RuntimeConfig, raw.get("runtime", {}), "runtime", source)
    mitigation = _mitigation_section(raw.get("mitigation", {}), source)
    _check_mitigation(mitigation, data, privacy, runtime, source)
    method = _component("method", raw, source)
    loss = _component("loss", raw, source)
    selection = _component("selection", raw, source)
    return RunConfig(name=name, seed=seed, data=data, model=model, train=train, method=method, loss=loss,
                     selection=selection, secure=secure, tail_rounds=tail, label=label, privacy=privacy,
                     runtime=runtime, mitigation=mitigation)


def _component(kind: str, raw: Mapping[str, Any], source: str) -> ComponentConfig:
    table = raw.get(kind, {"name": COMPONENT_DEFAULTS[kind]})
    if not isinstance(table, dict):
        raise ConfigError(f"{source}: '{kind}' must be a name or a table with 'name', got {table!r}")
    params = dict(table)
    name = params.pop("name", COMPONENT_DEFAULTS[kind])
    if not isinstance(name, str):
        raise ConfigError(f"{source}: '{kind}.name' must be a string, got {name!r}")
    try:
        if kind == "method":
            from secure_fl.algorithms import make_algorithm

            make_algorithm(name, params)
        elif kind == "loss":
            from secure_fl.losses import make_loss

            make_loss(name, params)
        else:
            from secure_fl.selection import make_selection

            make_selection(name, params)
    except (TypeError, ValueError) as error:
        raise ConfigError(f"{source}: {kind}: {error}") from None
    return ComponentConfig(name=name, params=params)


def _secure_section(table: Any, source: str) -> SecureConfig:
    from protocols import PROTOCOLS

    if not isinstance(table, dict):
        raise ConfigError(f"{source}: 'secure' must be a table")
    plain = {k: v for k, v in table.items() if k not in PROTOCOLS}
    options = {k: v for k, v in table.items() if k in PROTOCOLS}
    own = [f.name for f in fields(SecureConfig) if f.name != "options"]
    for key in plain:
        if key not in own:
            raise ConfigError(f"{source}: unknown key 'secure.{key}'{did_you_mean(key, [*own, *PROTOCOLS])}; "
                              f"known keys: {', '.join(own)}, and a table of options per protocol "
                              f"([secure.<protocol>], one of {', '.join(PROTOCOLS)})")
    for name, value in options.items():
        if not isinstance(value, dict):
            raise ConfigError(f"{source}: 'secure.{name}' must be a table of that protocol's options")
    plain["options"] = options
    secure: SecureConfig = _section(SecureConfig, plain, "secure", source)
    return secure


PRIVACY_KEYS = ("delta", "dp_sgd", "statistics")


def _privacy_section(table: Any, source: str) -> PrivacyConfig:
    from secure_fl.stats import DEFAULT_STATISTIC, StatisticPrivacy
    from secure_fl.stats.declaration import _NAME

    if not isinstance(table, dict):
        raise ConfigError(f"{source}: 'privacy' must be a table")
    for key in table:
        if key not in PRIVACY_KEYS:
            raise ConfigError(f"{source}: unknown key 'privacy.{key}'{did_you_mean(key, PRIVACY_KEYS)}; "
                              f"known keys: {', '.join(PRIVACY_KEYS)}")
    dp_sgd = None
    if "dp_sgd" in table:
        dp_sgd = _section(DPSGDSettings, table["dp_sgd"], "privacy.dp_sgd", source)
    statistics: dict[str, Any] = {}
    entries = table.get("statistics", {})
    if not isinstance(entries, dict):
        raise ConfigError(f"{source}: 'privacy.statistics' must be a table of statistic name = {{ epsilon = ... }}")
    for name, entry in entries.items():
        if not _NAME.match(name):
            raise ConfigError(f"{source}: privacy.statistics.{name}: not a statistic name (lower-case snake_case; "
                              f"'{DEFAULT_STATISTIC}' applies to every statistic without an entry)")
        statistics[name] = _section(StatisticPrivacy, entry, f"privacy.statistics.{name}", source)
    delta = table.get("delta")
    if delta is not None:
        delta = _coerce(delta, float, "privacy.delta", source)
    try:
        return PrivacyConfig(dp_sgd=dp_sgd, statistics=statistics, delta=delta)
    except _FieldError as error:
        raise ConfigError(f"{source}: privacy.{error.key}: {error.message}") from None


def _section(cls: type[Any], table: Any, path: str, source: str) -> Any:
    if not isinstance(table, dict):
        raise ConfigError(f"{source}: '{path}' must be a table")
    known = {f.name: f for f in fields(cls)}
    hints = typing.get_type_hints(cls)
    kwargs: dict[str, Any] = {}
    for key, value in table.items():
        if key not in known:
            shown = [k for k in known if not (cls is SecureConfig and k == "options")]
            raise ConfigError(f"{source}: unknown key '{path}.{key}'{did_you_mean(key, shown)}; "
                              f"known keys: {', '.join(shown)}")
        kwargs[key] = _coerce(value, hints[key], f"{path}.{key}", source)
    for name, f in known.items():
        if f.default is MISSING and f.default_factory is MISSING and name not in kwargs:
            raise ConfigError(f"{source}: missing key '{path}.{name}'")
    try:
        return cls(**kwargs)
    except _FieldError as error:
        raise ConfigError(f"{source}: {path}.{error.key}: {error.message}") from None
    except ValueError as error:  # classes validated outside this module (e.g. StatisticPrivacy)
        raise ConfigError(f"{source}: {path}: {error}") from None


def _coerce(value: Any, hint: Any, key: str, source: str) -> Any:
    """Check ``value`` against a simple type hint, converting ints to floats and lists to tuples."""
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        options = [a for a in args if a is not type(None)]
        return _coerce(value, options[0], key, source)
    if hint is Any:
        return value
    if hint is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{source}: {key} must be true or false, got {value!r}")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{source}: {key} must be an integer, got {value!r}")
        return value
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{source}: {key} must be a number, got {value!r}")
        return float(value)
    if hint is str:
        if not isinstance(value, str):
            raise ConfigError(f"{source}: {key} must be a string, got {value!r}")
        return value
    if origin is Literal:
        if value not in args:
            raise ConfigError(f"{source}: {key} must be one of {', '.join(map(repr, args))}, got {value!r}")
        return value
    if origin is tuple:
        if not isinstance(value, list):
            raise ConfigError(f"{source}: {key} must be a list, got {value!r}")
        return tuple(_coerce(v, args[0], f"{key}[{i}]", source) for i, v in enumerate(value))
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{source}: {key} must be a table, got {value!r}")
        return {k: _coerce(v, args[1], f"{key}.{k}", source) for k, v in value.items()}
    raise TypeError(f"config type {hint!r} of {key} is not supported")  # a bug in this module


def _keyword_parameters(func: Any, *, exclude: set[str]) -> set[str] | None:
    """Names a callable accepts as keywords (None if it takes **kwargs)."""
    try:
        signature = inspect.signature(func)
    except (TypeError, ValueError):
        return None
    names: set[str] = set()
    for parameter in signature.parameters.values():
        if parameter.kind is inspect.Parameter.VAR_KEYWORD:
            return None
        if parameter.kind in (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD):
            names.add(parameter.name)
    return names - exclude


def _required_parameters(func: Any, *, exclude: set[str]) -> set[str]:
    try:
        signature = inspect.signature(func)
    except (TypeError, ValueError):
        return set()
    return {
        p.name for p in signature.parameters.values()
        if p.default is inspect.Parameter.empty
        and p.kind in (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    } - exclude


def _plain(section: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for f in fields(section):
        value = getattr(section, f.name)
        if isinstance(value, tuple):
            value = list(value)
        if value is None:
            continue
        out[f.name] = value
    return out


def _secure_dict(secure: SecureConfig) -> dict[str, Any]:
    out = _plain(secure)
    out.update(out.pop("options"))
    if not out["authenticate"]:
        del out["authenticate"]  # runs stored before the option existed keep their identity
    if not out["statistics"]:
        del out["statistics"]
    return out

