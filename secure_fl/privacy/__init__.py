"""Differential privacy for secure-fl: distributed noise for secure sums, DP-SGD, accounting.

* :class:`NoisySum` + :class:`DistributedDP` — clients add Skellam (default) or discrete
  Gaussian integer noise before a secure sum of a declared statistic; sensitivity from the
  declaration (record or client level), noise for the expected honest survivors, the
  encoding widened for the noise tail; every release recorded in a :class:`PrivacyLedger`.
* :class:`DPSGD` (:mod:`secure_fl.privacy.dpsgd`, imports torch/Opacus lazily) — DP-SGD for
  any method's local training, with a per-client accountant state that survives rounds.
* :func:`formal_guarantees` — per statistic, model and run: the formal (ε, δ) for the audit.
* :func:`empirical_check` (:mod:`secure_fl.privacy.empirical`) — the distributed mechanism
  run many times on neighbouring inputs through a real protocol, with a Clopper–Pearson
  lower bound on ε (``secure-fl dp-check``).

Randomness comes from :func:`random_source`: AES-CTR keyed from :mod:`secrets` unless
``secure_mode=False`` (tests), as in Opacus. See docs/privacy.md.
"""

from __future__ import annotations

from typing import Any

from .accounting import (
    MECHANISMS,
    ORDERS,
    DiscreteGaussianMechanism,
    NoiseMechanism,
    Sensitivity,
    SkellamMechanism,
    calibrate_sigma,
    create_mechanism,
    rdp_to_dp,
)
from .distributed import DistributedDP, Level, NoisyRelease, NoisySum, PrivacyBudgetError
from .ledger import (
    MODEL,
    RUN,
    Guarantee,
    PrivacyLedger,
    Release,
    composition_delta,
    formal_guarantees,
)
from .sources import CryptoRandom, InsecureRandomWarning, RandomSource, SeededRandom, random_source

__all__ = [
    "DPSGD",
    "MECHANISMS",
    "MODEL",
    "ORDERS",
    "RUN",
    "CryptoRandom",
    "DPSGDConfig",
    "DPSGDState",
    "DiscreteGaussianMechanism",
    "DistributedDP",
    "Guarantee",
    "InsecureRandomWarning",
    "Level",
    "NoiseMechanism",
    "NoisyRelease",
    "NoisySum",
    "PrivacyBudgetError",
    "PrivacyLedger",
    "RandomSource",
    "Release",
    "SeededRandom",
    "Sensitivity",
    "SkellamMechanism",
    "calibrate_sigma",
    "composition_delta",
    "create_mechanism",
    "empirical_check",
    "formal_guarantees",
    "random_source",
    "rdp_to_dp",
]

_LAZY = {
    "DPSGD": "secure_fl.privacy.dpsgd",
    "DPSGDConfig": "secure_fl.privacy.dpsgd",
    "DPSGDState": "secure_fl.privacy.dpsgd",
    "empirical_check": "secure_fl.privacy.empirical",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'secure_fl.privacy' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
