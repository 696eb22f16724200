"""Suggestions for misspelt names: ``unknown key 'train.rouds' (did you mean 'rounds'?)``.

Used by every message that refuses a name a user typed (config keys, registry names,
parameters), so that each says what to type instead.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable

__all__ = ["closest", "did_you_mean"]


def closest(word: str, options: Iterable[str]) -> str | None:
    """The option most similar to ``word`` (difflib's ratio ≥ 0.6), else ``None``."""
    choices = sorted({str(o) for o in options})
    found = difflib.get_close_matches(str(word), choices, n=1, cutoff=0.6)
    if not found:  # case or separator slips: 'Paillier', 'train-rounds'
        folded = {c.lower().replace("-", "_"): c for c in choices}
        key = str(word).lower().replace("-", "_")
        return folded.get(key)
    return found[0]


def did_you_mean(word: str, options: Iterable[str]) -> str:
    """`` (did you mean 'x'?)`` for the closest option, or the empty string."""
    match = closest(word, options)
    return f" (did you mean {match!r}?)" if match is not None and match != word else ""
