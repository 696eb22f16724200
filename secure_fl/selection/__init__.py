"""Client selection under class imbalance: random, fixed, greedy (full knowledge) and Dubhe (paper 004).

In a run (by name from a config's ``[selection]``, :func:`make_selection`):

* :mod:`.strategy` — :class:`SelectionStrategy` (the server's half), :class:`SelectionClient`
  (the client's half, in each node), the registry :data:`SELECTION_STRATEGIES`;
* :mod:`.basic` — ``random`` and ``fixed``; :mod:`.greedy` — ``greedy``, reading every client's
  counts in the clear; :mod:`.dubhe_server` / :mod:`.dubhe_client` — ``dubhe``, with the rules
  both halves share in :mod:`.dubhe` and the registry codebook and Eq. 6 in :mod:`.registry`.

In the selection study (``secure-fl select``, every party in one process, no training):

* :class:`Population` — per-client label counts; p_o of a selected set; ‖p_o − p_u‖₁;
* :class:`RandomSelector`, :class:`GreedySelector`, :class:`DubheSelector` (:mod:`.dubhe_embedded`)
  by name in :data:`SELECTORS` (:func:`make_selector`); :mod:`.study` and :mod:`.experiments`.

See docs/dubhe.md.
"""

from __future__ import annotations

from typing import Any

from .base import Population, Selector, dubhe_population, synthetic_labels
from .baselines import GreedySelector, RandomSelector
from .basic import FixedSelection, RandomSelection
from .dubhe import DubheParams
from .dubhe_client import DubheClient
from .dubhe_embedded import DubheSelector
from .dubhe_server import DubheSelection
from .greedy import GreedyClient, GreedySelection, kl_greedy, kl_to_uniform
from .registry import (
    NO_CATEGORY,
    RegistryCodebook,
    expected_participants,
    participation_probability,
)
from .strategy import (
    SELECTION_STRATEGIES,
    ClientSelectionContext,
    SelectionClient,
    SelectionContext,
    SelectionStrategy,
    make_selection,
    register_selection,
    selection_class,
)

__all__ = [
    "NO_CATEGORY",
    "SELECTION_STRATEGIES",
    "SELECTORS",
    "ClientSelectionContext",
    "DubheClient",
    "DubheParams",
    "DubheSelection",
    "DubheSelector",
    "FixedSelection",
    "GreedyClient",
    "GreedySelection",
    "GreedySelector",
    "Population",
    "RandomSelection",
    "RandomSelector",
    "RegistryCodebook",
    "SelectionClient",
    "SelectionContext",
    "SelectionStrategy",
    "Selector",
    "dubhe_population",
    "expected_participants",
    "kl_greedy",
    "kl_to_uniform",
    "make_selection",
    "make_selector",
    "participation_probability",
    "register_selection",
    "selection_class",
    "synthetic_labels",
]

SELECTORS: dict[str, type[Selector]] = {
    "random": RandomSelector,
    "greedy": GreedySelector,
    "dubhe": DubheSelector,
}


def make_selector(name: str, **params: Any) -> Selector:
    """A study selector by name; Dubhe's keyword parameters fill :class:`DubheParams`."""
    try:
        cls = SELECTORS[name]
    except KeyError:
        raise ValueError(f"unknown selection strategy {name!r}; known: {', '.join(SELECTORS)}") from None
    if cls is DubheSelector:
        return DubheSelector(DubheParams(**params))
    if params:
        raise ValueError(f"strategy {name!r} takes no parameters, got {sorted(params)}")
    return cls()
