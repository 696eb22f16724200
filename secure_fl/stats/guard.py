"""Public rules on *which sets of clients* a statistic may be summed over (issue 25).

A secure sum hides one round's inputs, but sums over changing sets combine: any vector in the
row space of a statistic's participation matrix (one 0/1 row per release, one column per
client) is a linear combination of released sums. Both policies here are public, part of the
run's :class:`~secure_fl.stats.plan.StatisticsPlan`; every client applies them to every request
it is asked to join and refuses (a clean dropout with the reason) what they forbid; the server's
selection applies the same rule so that an honest server is never refused.

* :class:`SpanGuard` (``[mitigation] name = "guard"``): no non-empty set of fewer than ``k``
  clients may have its indicator vector in the span of the participation vectors seen so far
  plus the requested one. A single client's contribution is the case |S| = 1.
* :class:`FixedCohorts` (``name = "cohorts"``): the participants must be a union of whole
  public cohorts, so every recoverable combination is a combination of cohort sums.

Membership of every release is public. For the span guard the server announces each covered
release's contributors to the next request's participants (a runtime ``bulletin``) before the
run opens, so a client checks the span of *every* release so far, not only the ones it joined.
A client also holds the server to that record: a release it joined and saw summed that the
record omits or tells differently makes it refuse every later release of that statistic. See
docs/audit.md for what that covers and what it does not (a server telling different clients
different stories about releases none of them joined).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from protocols import PolicyError

__all__ = ["MAX_CANDIDATE_SETS", "FixedCohorts", "ReleasePolicy", "SpanGuard", "make_cohorts", "small_set_in_span"]

MAX_CANDIDATE_SETS = 200_000
"""The span check enumerates sets of fewer than k clients (as unions of clients that always
appear together); beyond this many it refuses rather than guess."""


def small_set_in_span(rows: Sequence[Sequence[int]], k: int) -> tuple[int, ...] | None:
    """A non-empty set of fewer than ``k`` clients whose indicator lies in the span of the
    participation ``rows`` (each a tuple of client ids), or ``None`` when there is none.

    Only clients that appear in some row can be in such a set (a column of zeros stays zero);
    clients whose columns are identical get the same value in every row-space vector, so the
    candidates are unions of those classes. Each candidate is tested against the orthogonal
    projector onto the row space.
    """
    if not rows:
        return None
    present = sorted({c for row in rows for c in row})
    index = {c: i for i, c in enumerate(present)}
    matrix = np.zeros((len(rows), len(present)))
    for r, row in enumerate(rows):
        matrix[r, [index[c] for c in row]] = 1.0
    classes: dict[bytes, list[int]] = {}
    for j, client in enumerate(present):
        classes.setdefault(matrix[:, j].tobytes(), []).append(client)
    groups = sorted((tuple(g) for g in classes.values() if len(g) < k), key=lambda g: (len(g), g))
    count = sum(math.comb(len(groups), j) for j in range(1, min(k - 1, len(groups)) + 1))
    if count > MAX_CANDIDATE_SETS:
        raise ValueError(f"the guard would test {count} candidate sets (more than {MAX_CANDIDATE_SETS}); "
                         "use a smaller k or fixed cohorts")
    _, singular, vt = np.linalg.svd(matrix, full_matrices=False)
    rank = int(np.sum(singular > 1e-9 * max(1.0, float(singular[0]) if singular.size else 1.0)))
    basis = vt[:rank]
    projector: npt.NDArray[np.float64] = basis.T @ basis
    for size in range(1, min(k - 1, len(groups)) + 1):
        for combo in itertools.combinations(groups, size):
            members = [c for g in combo for c in g]
            if len(members) >= k:
                continue
            indicator = np.zeros(len(present))
            indicator[[index[c] for c in members]] = 1.0
            if np.linalg.norm(projector @ indicator - indicator) < 1e-7:
                return tuple(sorted(members))
    return None


def make_cohorts(num_clients: int, *, size: int, seed: int) -> tuple[tuple[int, ...], ...]:
    """Clients 0..N-1 grouped once into ⌊N/size⌋ cohorts of at least ``size`` (a public, seeded
    shuffle; the remainder is spread over the first cohorts)."""
    if not 2 <= size <= num_clients:
        raise ValueError(f"cohort size must lie in [2, {num_clients}], got {size}")
    order = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(0xC0407,))).permutation(num_clients)
    count = num_clients // size
    groups: list[list[int]] = [[] for _ in range(count)]
    for position, client in enumerate(order):
        groups[position % count].append(int(client))
    return tuple(sorted(tuple(sorted(g)) for g in groups))


@dataclass(frozen=True)
class ReleasePolicy:
    """A public rule on participant sets (base of :class:`SpanGuard` and :class:`FixedCohorts`).

    ``exempt``: statistics the rule does not cover — a selection's own statistics that its design
    reads per client (Dubhe's volunteer coins, greedy's counts), listed so by the run.
    """

    exempt: frozenset[str] = field(default_factory=frozenset, kw_only=True)

    needs_history: bool = field(default=False, init=False)
    """Whether the rule depends on earlier releases (the server then announces them)."""

    def covers(self, statistic: str, session: str = "") -> bool:
        return not session and statistic not in self.exempt

    def violation(self, history: Sequence[tuple[int, ...]], participants: tuple[int, ...], *,
                  num_clients: int) -> str | None:
        """Why a release over ``participants`` after ``history`` is refused (``None``: allowed)."""
        raise NotImplementedError

    def describe(self) -> dict[str, Any]:
        raise NotImplementedError


@dataclass(frozen=True)
class SpanGuard(ReleasePolicy):
    """Refuse a release that puts a set of fewer than ``k`` clients in the span (module docstring)."""

    k: int = 4
    needs_history: bool = field(default=True, init=False)

    def violation(self, history: Sequence[tuple[int, ...]], participants: tuple[int, ...], *,
                  num_clients: int) -> str | None:
        if len(participants) < self.k:
            return f"guard: a release over {len(participants)} clients (fewer than k = {self.k})"
        if participants in history:
            return None  # a repeated set adds nothing to the span
        try:
            exposed = small_set_in_span([*history, participants], self.k)
        except ValueError as error:
            return f"guard: {error}"
        if exposed is None:
            return None
        return (f"guard: with the {len(history)} earlier release(s), a release over {list(participants)} would "
                f"reveal the sum of clients {list(exposed)} (fewer than k = {self.k})")

    def describe(self) -> dict[str, Any]:
        return {"name": "guard", "k": self.k}


@dataclass(frozen=True)
class FixedCohorts(ReleasePolicy):
    """Only unions of whole public cohorts (module docstring)."""

    cohorts: tuple[tuple[int, ...], ...] = ()

    def __post_init__(self) -> None:
        members = [c for g in self.cohorts for c in g]
        if not self.cohorts or len(members) != len(set(members)):
            raise ValueError("cohorts must be non-empty and disjoint")

    def cohort_of(self) -> Mapping[int, int]:
        return {c: i for i, g in enumerate(self.cohorts) for c in g}

    def violation(self, history: Sequence[tuple[int, ...]], participants: tuple[int, ...], *,
                  num_clients: int) -> str | None:
        chosen = set(participants)
        for group in self.cohorts:
            inside = chosen.intersection(group)
            if inside and len(inside) != len(group):
                return (f"cohorts: the request holds {sorted(inside)} of cohort {list(group)}; only whole cohorts "
                        "are summed")
        if not chosen <= {c for g in self.cohorts for c in g}:
            return "cohorts: the request names clients outside every cohort"
        return None

    def describe(self) -> dict[str, Any]:
        return {"name": "cohorts", "cohorts": [list(g) for g in self.cohorts]}


class ReleaseChecker:
    """One client's (or the server's) record of participant sets per statistic, and the check.

    ``history`` holds the releases this party joined (the participants asked, then the
    contributors once it saw the result); ``public`` the contributors of every release the server
    announced. A policy that :attr:`~ReleasePolicy.needs_history` checks against both, and the
    server's announcement must agree with every release this party saw summed.
    """

    def __init__(self, policy: ReleasePolicy, *, num_clients: int) -> None:
        self.policy = policy
        self.num_clients = num_clients
        self.history: dict[str, dict[int, tuple[int, ...]]] = {}
        """statistic → round → the participant set of that release (the contributors once known)."""
        self.public: dict[str, dict[int, tuple[int, ...]]] = {}
        """statistic → round → the contributors the server announced."""
        self.summed: dict[str, set[int]] = {}
        """statistic → rounds of the releases this party joined and saw summed."""
        self.distrust: dict[str, str] = {}
        """statistic → why the server's record of it cannot be trusted (every later release refused)."""

    def check(self, statistic: str, round: int, participants: Sequence[int], *, session: str = "") -> str | None:
        if not self.policy.covers(statistic, session):
            return None
        if statistic in self.distrust:
            return self.distrust[statistic]
        seen = self.history.get(statistic, {})
        if self.policy.needs_history:
            public = self.public.get(statistic, {})
            missing = sorted(r for r in self.summed.get(statistic, ()) if r != round and r not in public)
            if missing:
                return (f"guard: the server's public record of {statistic!r} omits the release of round {missing[0]} "
                        "that this client joined")
            seen = {**public, **seen}
        earlier = [p for r, p in sorted(seen.items()) if r != round]
        return self.policy.violation(earlier, tuple(sorted(int(c) for c in participants)),
                                     num_clients=self.num_clients)

    def record(self, statistic: str, round: int, participants: Sequence[int], *, session: str = "",
               summed: bool = False) -> None:
        """This party joined a release (``summed``: and saw its result, over ``participants``)."""
        if not self.policy.covers(statistic, session):
            return
        members = tuple(sorted(int(c) for c in participants))
        self.history.setdefault(statistic, {})[int(round)] = members
        if summed:
            self.summed.setdefault(statistic, set()).add(int(round))
            self._agree(statistic, int(round))

    def learn(self, statistic: str, releases: Sequence[tuple[int, Sequence[int]]]) -> None:
        """The server's announcement of releases of ``statistic``: kept, and checked against
        what this party saw summed (:class:`PolicyError` on a contradiction, after which every
        later release of it is refused). Announcing a release twice alike is harmless."""
        if not self.policy.covers(statistic):
            raise PolicyError(f"the server announced releases of {statistic!r}, which no release rule covers")
        public = self.public.setdefault(statistic, {})
        for round, members in releases:
            entry = tuple(sorted(int(c) for c in members))
            if int(round) in public and public[int(round)] != entry:
                self._refuse(statistic, f"guard: the server announced two different releases of {statistic!r} "
                                        f"at round {round}")
            public[int(round)] = entry
            self._agree(statistic, int(round))

    def _agree(self, statistic: str, round: int) -> None:
        announced = self.public.get(statistic, {}).get(round)
        if round in self.summed.get(statistic, ()) and announced is not None:
            mine = self.history[statistic][round]
            if announced != mine:
                self._refuse(statistic, f"guard: the server announced the release of {statistic!r} at round {round} "
                                        f"over {list(announced)}, but this client saw it summed over {list(mine)}")

    def _refuse(self, statistic: str, reason: str) -> None:
        self.distrust[statistic] = reason
        raise PolicyError(reason)

    def state(self) -> dict[str, Any]:
        def table(rounds_by_name: Mapping[str, Mapping[int, tuple[int, ...]]]) -> dict[str, Any]:
            return {name: {str(r): list(p) for r, p in rounds.items()} for name, rounds in rounds_by_name.items()}

        return {"joined": table(self.history), "public": table(self.public),
                "summed": {name: sorted(rounds) for name, rounds in self.summed.items()},
                "distrust": dict(self.distrust)}

    def load_state(self, state: Mapping[str, Any]) -> None:
        def table(rounds_by_name: Mapping[str, Any]) -> dict[str, dict[int, tuple[int, ...]]]:
            return {str(name): {int(r): tuple(int(c) for c in p) for r, p in rounds.items()}
                    for name, rounds in rounds_by_name.items()}

        if "joined" in state:  # older snapshots hold the joined history alone, by statistic name
            history, public = table(state["joined"]), table(state["public"])
            summed = {str(name): {int(r) for r in rounds} for name, rounds in state["summed"].items()}
            distrust = {str(name): str(reason) for name, reason in state["distrust"].items()}
        else:
            history, public, summed, distrust = table(state), {}, {}, {}
        self.history, self.public, self.summed, self.distrust = history, public, summed, distrust
