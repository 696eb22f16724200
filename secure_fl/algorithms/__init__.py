"""Federated methods: one class each, frozen dataclass hyper-parameters, a registry by name.

======================  =================  ==============================================
name                    class              hyper-parameters (``Params``)
======================  =================  ==============================================
``fedavg``              :class:`FedAvg`       ``server_lr``
``fedprox``             :class:`FedProx`      ``server_lr``, ``mu``
``scaffold``            :class:`Scaffold`     ``server_lr``
``reweighting``         :class:`Reweighting`  ``server_lr``, ``power``
======================  =================  ==============================================

The client optimiser (SGD, momentum, weight decay, learning-rate decay, E, B) is shared by
all methods: :class:`LocalTraining`. See :mod:`secure_fl.algorithms.base` for the hooks.
"""

from secure_fl.algorithms.base import (
    ALGORITHMS,
    Algorithm,
    ClientContext,
    ClientUpdate,
    HeldOut,
    ServerContext,
    SetupContext,
    algorithm_class,
    make_algorithm,
    register_algorithm,
)
from secure_fl.algorithms.climb import Climb, ClimbParams  # noqa: F401  (registers 'climb')
from secure_fl.algorithms.fedavg import FedAvg, FedAvgParams
from secure_fl.algorithms.fedprox import FedProx, FedProxParams
from secure_fl.algorithms.fedshift import FedShift, FedShiftParams  # noqa: F401  (registers 'fedshift')
from secure_fl.algorithms.local import (
    ClientData,
    FlatLayout,
    LocalObjective,
    LocalResult,
    LocalTrainer,
    LocalTraining,
)
from secure_fl.algorithms.ratio_loss import RatioLossMethod, RatioLossParams  # noqa: F401
from secure_fl.algorithms.reweighting import (
    Reweighting,
    ReweightingParams,
    inverse_frequency_weights,
)
from secure_fl.algorithms.scaffold import Scaffold, ScaffoldParams

__all__ = [
    "ALGORITHMS",
    "Algorithm",
    "ClientContext",
    "ClientData",
    "ClientUpdate",
    "FedAvg",
    "FedAvgParams",
    "FedProx",
    "FedProxParams",
    "FlatLayout",
    "HeldOut",
    "LocalObjective",
    "LocalResult",
    "LocalTrainer",
    "LocalTraining",
    "Reweighting",
    "ReweightingParams",
    "Scaffold",
    "ScaffoldParams",
    "ServerContext",
    "SetupContext",
    "algorithm_class",
    "inverse_frequency_weights",
    "make_algorithm",
    "register_algorithm",
]
