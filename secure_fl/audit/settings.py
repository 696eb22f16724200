"""What the audit runs: the methods and protocols of the matrix and the demo-sized run of a cell.

Kept free of torch so that building the ``secure-fl`` parser stays cheap.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = [
    "DEFAULT_METHODS",
    "DEFAULT_MITIGATIONS",
    "DEFAULT_PROTOCOLS",
    "METHOD_LOSS",
    "MITIGATION_DEFAULTS",
    "SELECTION_METHODS",
    "AuditSettings",
]

DEFAULT_METHODS = ("fedavg", "fedshift", "climb", "ratio_loss", "dubhe")
DEFAULT_PROTOCOLS = ("plain", "paillier", "ckks", "masking")
DEFAULT_MITIGATIONS = ("none",)
MITIGATION_DEFAULTS: dict[str, dict[str, Any]] = {
    "none": {},
    "guard": {"k": 4},
    "cohorts": {"size": 4},
    "dp": {"epsilon": 2.0, "delta": 1e-5, "update_l2": 0.05, "counts": "record", "secure_mode": False},
}
"""The ``[mitigation]`` table of a cell, per mitigation name (the audit's noise is seeded, so cells
repeat; ``AuditSettings.mitigation_params`` overrides). ``dp`` noises counts at record level:
client-level noise on a sample count of 8 clients exceeds the count and no method can average
(docs/audit.md, "Client-level DP on every release")."""

SELECTION_METHODS = {"dubhe": ("fedavg", "dubhe")}
"""Audit "methods" that are a selection strategy on top of a federated method."""
METHOD_LOSS = {"ratio_loss": "ratio"}
"""Methods that need a particular loss (Ratio Loss applies its class weights through loss 'ratio')."""


@dataclass(frozen=True, kw_only=True)
class AuditSettings:
    """The demo-sized run every cell uses (same data, partition, model and seed in every cell).

    Protocol options: ``key_bits``, ``keyholder`` and ``masking_threshold`` go to every protocol
    whose options have a field of that name (``key_bits`` → ``key_bits`` and, below 2048,
    ``allow_weak_keys``; ``masking_threshold`` → ``threshold``); ``protocol_options`` adds or
    overrides options per protocol. ``clients_only_options`` are applied, per protocol, when a
    statistic that only clients may learn goes through a protocol whose sums the server does not
    learn by construction (HE: the clients must hold the key).
    """

    dataset: str = "digits"
    num_clients: int = 8
    clients_per_round: int = 4
    rounds: int = 10
    partition: str = "dirichlet"
    partition_params: Mapping[str, Any] = field(default_factory=lambda: {"alpha": 0.5})
    hidden: tuple[int, ...] = (32,)
    lr: float = 0.05
    batch_size: int = 16
    local_epochs: int = 1
    momentum: float = 0.0
    seed: int = 0
    aux_per_class: int = 20
    key_bits: int = 2048
    keyholder: str = "agent"
    masking_threshold: int | float | None = None
    protocol_options: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    clients_only_options: Mapping[str, Mapping[str, Any]] = field(
        default_factory=lambda: {"paillier": {"keyholder": "all"}, "ckks": {"keyholder": "all"}})
    update_frac_bits: int = 16
    update_clip: float = 1.0
    train_samples: int | None = 1200
    """Training samples used (of digits' 1437): the rest stay with nobody, which Ratio Loss's
    monitor needs as auxiliary data (the same in every cell, so cells stay comparable)."""
    method_params: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    selection_params: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    privacy: Mapping[str, Any] = field(default_factory=dict)
    """The runs' ``[privacy]`` table (DP-SGD, distributed DP per statistic); empty: no DP."""
    torch_threads: int = 1
    mitigation_params: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    """Per mitigation name, parameters over :data:`MITIGATION_DEFAULTS` (e.g. ``{"guard": {"k": 3}}``)."""
    tail_rounds: int = 5
    """Utility: mean test accuracy of the global model over the run's last ``tail_rounds`` rounds."""

    def mitigation_table(self, name: str) -> dict[str, Any]:
        """The ``[mitigation]`` table of a cell with mitigation ``name``."""
        return {"name": name, **MITIGATION_DEFAULTS.get(name, {}), **dict(self.mitigation_params.get(name, {}))}

    def options_for(self, protocol: str, *, clients_only: bool = False) -> dict[str, Any]:
        """The keyword options of ``protocol`` in a cell (see the class docstring)."""
        from protocols import descriptor

        common = {"key_bits": self.key_bits, "allow_weak_keys": self.key_bits < 2048, "keyholder": self.keyholder,
                  "threshold": self.masking_threshold}
        options = descriptor(protocol).applicable(**{k: v for k, v in common.items() if v is not None})
        options.update(self.protocol_options.get(protocol, {}))
        if clients_only:
            options.update(self.clients_only_options.get(protocol, {}))
        return options

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        for name in ("partition_params", "privacy"):
            data[name] = dict(getattr(self, name))
        for name in ("method_params", "selection_params", "protocol_options", "clients_only_options",
                     "mitigation_params"):
            data[name] = {k: dict(v) for k, v in getattr(self, name).items()}
        data["hidden"] = list(self.hidden)
        return data
