"""Global statistics: the sums over clients a method declares, asked for by the server, computed by clients.

A method declares a statistic (:class:`StatisticDeclaration`: name, length, bound, kind, who
learns it, whether clients clip). The server's :class:`StatsCoordinator` requests it from a
cohort and gets a :class:`Release` (value when the server learns it, contributors, dropouts,
clipped count, bytes, protocol, ε); each client's :class:`StatsParticipant` checks the request,
computes its own contribution, clips, noises and encodes it, and hears what it learned
(:class:`Learned`). Both sides follow the run's public :class:`StatisticsPlan`.
"""

from .coordinator import StatsCoordinator
from .declaration import LEARNERS, TOTAL_SAMPLES, StatisticDeclaration
from .noise import DEFAULT_STATISTIC, StatisticPrivacy, StatisticsPrivacy
from .participant import StatsParticipant
from .plan import MODEL_UPDATE, Layout, StatisticsPlan, UpdateSettings
from .release import Learned, Release
from .updates import UpdateSum

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
    "StatsCoordinator",
    "StatsParticipant",
    "UpdateSettings",
    "UpdateSum",
]
