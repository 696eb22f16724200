"""The clip count of a sum, carried inside the sum itself.

A client that clips entries of its contribution counts them; the server may learn only the
total over the round's contributors, never one client's count. So the count travels as
``digits`` extra entries appended to the vector — its base-``B`` digits, ``B = entry_max + 1``
of the statistic's encoding — and the secure sum adds every digit column like any other entry.
A digit never exceeds ``entry_max``, so the digits need no wider slots than the statistic's
own entries and the sum of a column never wraps (the encoding's headroom bits cover it);
the total is ``Σ_j S_j B^j`` with ``S_j`` the summed column ``j``: exact, in Python integers.

The digits are appended to the *encoded* vector (each an encoded entry in ``[0, entry_max]``),
so they never pass through the statistic's bound or rounding. A protocol decodes the sum's
tail like any entry — ``S_j / scale``, minus ``k·m / scale`` for a signed spec with offset
``m`` — which :func:`read_tally` undoes exactly (float64 holds every such value).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from protocols import VectorSpec

__all__ = ["digits_for", "read_tally", "tally"]


def digits_for(spec: VectorSpec, length: int) -> int:
    """Digits needed to count up to ``length`` clipped entries in base ``entry_max + 1``."""
    base = spec.entry_max + 1
    digits, capacity = 1, base
    while capacity <= length:
        digits += 1
        capacity *= base
    return digits


def tally(spec: VectorSpec, clipped: int, digits: int) -> npt.NDArray[np.uint64]:
    """The ``digits`` base-``B`` digits of ``clipped``, as encoded entries to append to an encoded vector."""
    base = spec.entry_max + 1
    if not 0 <= clipped < base**digits:
        raise ValueError(f"{clipped} clipped entries do not fit {digits} digits")
    out = np.empty(digits, dtype=np.uint64)
    rest = clipped
    for j in range(digits):
        rest, digit = divmod(rest, base)
        out[j] = digit
    return out


def read_tally(spec: VectorSpec, total: npt.NDArray[np.float64], digits: int,
               contributors: int) -> tuple[npt.NDArray[np.float64], int]:
    """Split a decoded sum into the statistic and the total clip count of its contributors."""
    base = spec.entry_max + 1
    values, tail = total[: total.size - digits], total[total.size - digits :]
    offset = contributors * (spec.magnitude if spec.signed else 0)
    clipped = 0
    for j in reversed(range(digits)):
        column = round(float(tail[j]) * spec.scale) + offset
        clipped = clipped * base + column
    return values, clipped
