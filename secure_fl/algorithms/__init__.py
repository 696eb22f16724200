"""Federated methods: a server half and a client half each, frozen dataclass hyper-parameters, a registry.

======================  =================  ==============================================
name                    class              hyper-parameters (``Params``)
======================  =================  ==============================================
``fedavg``              :class:`FedAvg`       ``server_lr``
``fedprox``             :class:`FedProx`      ``server_lr``, ``mu``
``scaffold``            :class:`Scaffold`     ``server_lr``, ``momentum_aware``
``reweighting``         :class:`Reweighting`  ``server_lr``, ``power``, ``mean``
``fedshift``            :class:`FedShift`     ``server_lr``, ``smoothing``, ``count_bound``
``climb``               :class:`Climb`        see :mod:`secure_fl.algorithms.climb`
``ratio_loss``          :class:`RatioLossMethod`  see :mod:`secure_fl.algorithms.ratio_loss`
======================  =================  ==============================================

The client optimiser (SGD, momentum, weight decay, learning-rate decay, E, B) is shared by
all methods: :class:`LocalTraining`. See :mod:`secure_fl.algorithms.base` for the two halves.
"""

from secure_fl.algorithms.base import (
    ALGORITHMS,
    ClientContext,
    ClientMethod,
    ClientState,
    ContributionContext,
    HeldOut,
    LocalUpdate,
    Method,
    RunInfo,
    ServerMethod,
    ServerRound,
    ServerSetup,
    algorithm_class,
    make_algorithm,
    register_algorithm,
)
from secure_fl.algorithms.climb import Climb, ClimbParams  # noqa: F401  (registers 'climb')
from secure_fl.algorithms.fedavg import FedAvg, FedAvgParams
from secure_fl.algorithms.fedprox import FedProx, FedProxParams
from secure_fl.algorithms.fedshift import FedShift, FedShiftParams  # noqa: F401  (registers 'fedshift')
from secure_fl.algorithms.ratio_loss import RatioLossMethod, RatioLossParams  # noqa: F401
from secure_fl.algorithms.reweighting import (
    Reweighting,
    ReweightingParams,
    inverse_frequency_weights,
)
from secure_fl.algorithms.scaffold import Scaffold, ScaffoldParams
from secure_fl.training import (
    ClientData,
    FlatLayout,
    LocalObjective,
    LocalResult,
    LocalTrainer,
    LocalTraining,
)

__all__ = [
    "ALGORITHMS",
    "ClientContext",
    "ClientData",
    "ClientMethod",
    "ClientState",
    "ContributionContext",
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
    "LocalUpdate",
    "Method",
    "Reweighting",
    "ReweightingParams",
    "RunInfo",
    "Scaffold",
    "ScaffoldParams",
    "ServerMethod",
    "ServerRound",
    "ServerSetup",
    "algorithm_class",
    "inverse_frequency_weights",
    "make_algorithm",
    "register_algorithm",
]
