"""Global statistics: the sums over clients a method declares, asked for by the server, computed by clients.

A method declares a statistic (:class:`StatisticDeclaration`: name, length, bound, kind, who
learns it, whether clients clip). The server's :class:`StatsCoordinator` requests it from a
cohort and gets a :class:`Release` (value when the server learns it, contributors, dropouts,
clipped count, bytes, protocol, ε); each client's :class:`StatsParticipant` checks the request,
computes its own contribution, clips, noises and encodes it, and hears what it learned
(:class:`Learned`). Both sides follow the run's public :class:`StatisticsPlan`.

This package exports what both sides share; the server's side lives in
:mod:`secure_fl.stats.coordinator` and :mod:`secure_fl.stats.updates`, the client's in
:mod:`secure_fl.stats.participant`, and neither imports the other (an import-linter contract).
"""

from .declaration import LEARNERS, TOTAL_SAMPLES, StatisticDeclaration
from .noise import DEFAULT_STATISTIC, StatisticPrivacy, StatisticsPrivacy
from .plan import MODEL_UPDATE, Layout, StatisticsPlan, UpdateSettings
from .release import Learned, Release

__all__ = [
    "DEFAULT_STATISTIC",
    "LEARNERS",
    "MODEL_UPDATE",
    "TOTAL_SAMPLES",
    "Layout",
    "Learned",
    "Release",
    "StatisticDeclaration",
    "StatisticPrivacy",
    "StatisticsPlan",
    "StatisticsPrivacy",
    "UpdateSettings",
]
