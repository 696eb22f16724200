"""Client selection lives in :mod:`secure_fl.selection`; these names are re-exported for older imports."""

from secure_fl.selection.basic import FixedSelection, RandomSelection
from secure_fl.selection.strategy import (
    SELECTION_STRATEGIES,
    SelectionClient,
    SelectionContext,
    SelectionStrategy,
    make_selection,
    register_selection,
    selection_class,
)

__all__ = [
    "SELECTION_STRATEGIES",
    "FixedSelection",
    "RandomSelection",
    "SelectionClient",
    "SelectionContext",
    "SelectionStrategy",
    "make_selection",
    "register_selection",
    "selection_class",
]
