"""One client's side of the run's statistics: check each request, compute, clip, noise, encode.

A :class:`StatsParticipant` lives in a client node. When the server opens a sum at this client
it checks the request against what the client itself expects — the statistic is one its
method declared, through the protocol the run's plan names for it, with exactly the encoding
and recipients the declaration implies, and a once-per-run statistic only once — and refuses
otherwise (a clean dropout with the reason). Where the plan holds a public rule on participant
sets (:mod:`.guard`: issue 25's cohort guard or fixed cohorts) it also refuses a request whose
participants, with the sets of the releases it joined before, that rule forbids. Then it asks its owner for the vector, clips it to
the declared bound when the declaration allows clipping (counting what it clipped, the count
carried inside the sum, :mod:`.tally`), adds its share of distributed-DP noise when the plan
noises the statistic, and encodes it for the protocol. What it learns comes back as
:class:`~secure_fl.stats.release.Learned`.

It keeps the last release of each constant statistic it learned (|D_i|'s total), so that the
server can point it at that release instead of summing again (:meth:`StatsParticipant.repeat`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from protocols import (
    Authenticator,
    BoundError,
    ClientEndpoint,
    ClientSession,
    Directory,
    EncodingError,
    Identity,
    Message,
    PolicyError,
    ProtocolError,
    RunResult,
    SumRequest,
    WireError,
    descriptor,
    encode,
)

from .declaration import StatisticDeclaration
from .guard import ReleaseChecker
from .plan import Layout, Layouts, StatisticsPlan
from .release import Learned
from .tally import read_tally, tally

__all__ = ["StatsParticipant"]

Source = Callable[[StatisticDeclaration, SumRequest], npt.ArrayLike]
"""This client's vector of a declared statistic for a request (in the declaration's units)."""


class StatsParticipant:
    """A client's statistics endpoint (see the module docstring)."""

    def __init__(
        self,
        client_id: int,
        *,
        plan: StatisticsPlan,
        declarations: Callable[[str], StatisticDeclaration | None],
        source: Source,
        on_learned: Callable[[Learned], None],
        extra_sessions: Mapping[tuple[str, str], Any] | None = None,
        noise_seed: Callable[[str, int], np.random.SeedSequence] | None = None,
    ) -> None:
        self.client_id = client_id
        self.plan = plan
        self.layouts = Layouts(plan)
        self.declarations = declarations
        self.source = source
        self.on_learned = on_learned
        self.noise_seed = noise_seed
        sessions: dict[str | tuple[str, str], ClientSession] = {
            name: descriptor(name).client_session(client_id, clients=plan.clients, options=plan.options_for(name))
            for name in plan.protocols()
        }
        self.extra = dict(extra_sessions or {})
        for (name, tag), options in self.extra.items():
            sessions[(name, tag)] = descriptor(name).client_session(client_id, clients=plan.clients, options=options)
        self.sessions = sessions
        self.endpoint = ClientEndpoint(client_id, sessions=sessions, contribute=self._contribute,
                                       on_result=self._result)
        self.once: dict[str, int] = {}
        """Once-per-run statistics this client contributed to, and the round of that release."""
        self.constants: dict[str, Learned] = {}
        """The last release of each constant statistic this client learned."""
        self.clipped = 0
        """Entries this client clipped so far (its own telemetry; the server learns only sums)."""
        self.guard = None if plan.policy is None else ReleaseChecker(plan.policy, num_clients=len(plan.clients))
        """The participant sets of the releases this client joined, checked against the plan's policy."""

    def handle(self, data: bytes) -> list[Message]:
        return self.endpoint.handle(data)

    def register(self, identity: Identity, directory: Directory) -> None:
        """Set-up: this client's signing key and the registry of everyone's (``authenticate``).
        From now on it signs every message it sends and refuses any not signed by its sender's
        registered key; its sessions check the signatures their protocols carry."""
        for session in self.sessions.values():
            session.register(identity, directory)
        self.endpoint.authenticator = Authenticator(identity, directory)

    # --- checks ---------------------------------------------------------------------------------

    def _layout(self, protocol: str, request: SumRequest) -> tuple[StatisticDeclaration, Layout]:
        declaration = self.declarations(request.statistic)
        if declaration is None:
            raise PolicyError(f"this client contributes to no statistic {request.statistic!r}")
        if request.session:
            if (protocol, request.session) not in self.extra:
                raise PolicyError(f"no {protocol!r} session {request.session!r} is planned for this run")
        elif protocol != self.plan.protocol_for(declaration):
            raise PolicyError(f"statistic {declaration.name!r} goes through {self.plan.protocol_for(declaration)!r} "
                              f"in this run, not {protocol!r}")
        # A store run (Dubhe's counts, protocols.argmin) is encoded for the largest try it will
        # enter, a public parameter of the run, not for the clients uploading in this request.
        summands = request.spec.summands if request.kind == "store" and request.spec else len(request.participants)
        layout = self.layouts(declaration, summands, protocol)
        if request.spec != layout.spec:
            raise PolicyError(f"statistic {declaration.name!r}: the requested encoding {request.spec} is not the "
                              f"declared one {layout.spec}")
        if request.reveal != declaration.reveal:
            raise PolicyError(f"statistic {declaration.name!r} is declared for {sorted(declaration.learners)}; "
                              "the request reveals it to others")
        return declaration, layout

    def _contribute(self, protocol: str, request: SumRequest) -> npt.NDArray[Any]:
        declaration, layout = self._layout(protocol, request)
        if not declaration.per_round:
            done = self.once.get(declaration.name)
            if done is not None and done != request.round:
                raise PolicyError(f"statistic {declaration.name!r} is released once per run; it was "
                                  f"released at round {done}")
        if self.guard is not None and request.kind == "sum":
            reason = self.guard.check(declaration.name, request.round, request.participants, session=request.session)
            if reason is not None:
                raise PolicyError(reason)
        vector = np.asarray(self.source(declaration, request), dtype=np.float64).reshape(-1)
        if vector.shape != (declaration.length,):
            raise EncodingError(f"statistic {declaration.name!r}: {vector.size} entries, declared {declaration.length}")
        if not np.all(np.isfinite(vector)):
            raise EncodingError(f"statistic {declaration.name!r}: the vector holds NaN or infinity")
        values, clipped = self._prepare(declaration, layout, vector, request.round)
        if not declaration.per_round:
            self.once[declaration.name] = request.round
        if self.guard is not None and request.kind == "sum":
            self.guard.record(declaration.name, request.round, request.participants, session=request.session)
        if not descriptor(protocol).encoded:
            return values
        encoded = encode(layout.base, values).values
        return np.concatenate([encoded, tally(layout.base, clipped, layout.digits)]) if layout.digits else encoded

    def _prepare(self, declaration: StatisticDeclaration, layout: Layout, vector: npt.NDArray[np.float64],
                 round: int) -> tuple[npt.NDArray[np.float64], int]:
        """The vector to encode (clipped, or noised) and how many entries this client clipped."""
        low = -float(declaration.bound) if declaration.signed else 0.0
        high = float(declaration.bound)
        outside = (vector < low) | (vector > high)
        if np.any(outside) and not declaration.clip and descriptor(layout.protocol).encoded:
            index = int(np.flatnonzero(outside)[0])
            raise BoundError(f"statistic {declaration.name!r}: entry {index} = {float(vector[index])!r} is outside "
                             f"[{low}, {high}] and the declaration does not allow clipping")
        if layout.noisy is not None:
            noisy = layout.noisy
            l2 = self.plan.privacy.update_l2 if self.plan.privacy is not None else None
            if l2 is not None and self.plan.is_update(declaration):
                norm = float(np.linalg.norm(vector))
                if norm > l2:  # the update's sensitivity is its L2 bound: clip to it before noising
                    vector = vector * (l2 / norm)
            if self.noise_seed is not None and not noisy.config.secure_mode:
                from secure_fl.privacy import SeededRandom

                noisy.rng = SeededRandom(self.noise_seed(declaration.name, round))
            perturbed, clipped_inputs, clipped_noise = noisy.perturb(vector)
            self.clipped += clipped_inputs + clipped_noise
            return perturbed, clipped_inputs + clipped_noise
        if not descriptor(layout.protocol).encoded:
            return vector, 0
        clipped = int(np.count_nonzero(outside))
        self.clipped += clipped
        return (np.clip(vector, low, high) if clipped else vector), clipped

    # --- results --------------------------------------------------------------------------------

    def _result(self, result: RunResult) -> None:
        declaration = self.declarations(result.request.statistic)
        if declaration is None:  # a run this client took part in without an input of its own
            self.on_learned(Learned(result.request.statistic, result.request.round, result.total,
                                    result.contributors, None))
            return
        if self.guard is not None and result.request.kind == "sum":  # the set actually summed
            self.guard.record(declaration.name, result.request.round, result.contributors,
                              session=result.request.session, summed=True)
        layout = self.layouts(declaration, len(result.request.participants), result.protocol)
        values, clipped = result.total, None
        if layout.digits:
            values, clipped = read_tally(layout.base, values, layout.digits, len(result.contributors))
        learned = Learned(declaration.name, result.request.round, values, result.contributors, clipped)
        if declaration.constant and not result.request.session and result.contributors:
            self.constants[declaration.name] = learned
        self.on_learned(learned)

    def repeat(self, statistic: str, round: int, earlier: int, contributors: Sequence[int]) -> Learned:
        """The server points this client at its release of a constant ``statistic`` of round
        ``earlier`` over ``contributors`` for ``round``: that release again, as this round's value.
        A :class:`PolicyError` unless the statistic is declared constant, this client learned that
        very release last, and it is one of its contributors."""
        declaration = self.declarations(statistic)
        if declaration is None or not declaration.constant:
            raise PolicyError(f"statistic {statistic!r} is not a constant statistic of this client: "
                              "an earlier release cannot stand for it")
        last = self.constants.get(statistic)
        if last is None or last.round != earlier or last.contributors != tuple(contributors):
            held = "none" if last is None else f"round {last.round} over {len(last.contributors)} clients"
            raise PolicyError(f"statistic {statistic!r}: pointed at the release of round {earlier} over "
                              f"{len(contributors)} clients, the last this client learned is {held}")
        if self.client_id not in last.contributors:
            raise PolicyError(f"statistic {statistic!r}: this client is not a contributor of that release")
        if round <= earlier:
            raise PolicyError(f"statistic {statistic!r}: round {round} cannot repeat the release of round {earlier}")
        return Learned(statistic, round, last.value.copy(), last.contributors, None if last.clipped is None else 0)

    def learn_releases(self, statistic: str, releases: Sequence[tuple[int, Sequence[int]]]) -> None:
        """The server's public record of earlier releases of ``statistic`` (a runtime bulletin),
        for the release rule; a :class:`PolicyError` when this client has no rule that needs it,
        or when it contradicts a release this client saw summed."""
        if self.guard is None or not self.guard.policy.needs_history:
            raise PolicyError("this run's clients keep no release record: a bulletin is not expected")
        self.guard.learn(statistic, releases)

    # --- snapshots ------------------------------------------------------------------------------

    def state(self) -> dict[str, Any]:
        """This client's protocol sessions (its own keys, hex) and its once-per-run record: plain data."""
        sessions = {}
        for key, session in self.sessions.items():
            name, tag = (key, "") if isinstance(key, str) else key
            sessions[f"{name}/{tag}"] = session.to_bytes().hex()
        out: dict[str, Any] = {"sessions": sessions, "once": dict(self.once), "clipped": self.clipped}
        if self.guard is not None:
            out["guard"] = self.guard.state()
        if self.constants:
            out["constants"] = {name: {"round": k.round, "value": [float(v) for v in k.value],
                                       "contributors": list(k.contributors), "clipped": k.clipped}
                                for name, k in self.constants.items()}
        return out

    def load_state(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state` whole or not at all (a refused snapshot changes nothing)."""
        before = self.state()
        try:
            sessions = state["sessions"]
            once = {str(k): int(v) for k, v in state["once"].items()}
            clipped = int(state["clipped"])
            guard = state.get("guard", {})
            if not isinstance(guard, Mapping):
                raise TypeError("guard history must be a table")
            constants = {str(name): _learned_from_state(str(name), item)
                         for name, item in state.get("constants", {}).items()}
            for label, data in sessions.items():
                name, _, tag = str(label).partition("/")
                key: str | tuple[str, str] = (name, tag) if tag else name
                if key not in self.sessions:
                    raise WireError(f"snapshot holds a session {label!r} this run does not plan")
                self.sessions[key].load_bytes(bytes.fromhex(str(data)))
        except (KeyError, TypeError, ValueError, AttributeError, ProtocolError) as error:
            for label, data in before["sessions"].items():
                name, _, tag = label.partition("/")
                self.sessions[(name, tag) if tag else name].load_bytes(bytes.fromhex(data))
            raise WireError(f"not a participant snapshot: {type(error).__name__}: {error}") from None
        self.once, self.clipped, self.constants = once, clipped, constants
        if self.guard is not None:
            self.guard.load_state(guard)
        self.endpoint.forget()


def _learned_from_state(name: str, item: Mapping[str, Any]) -> Learned:
    value = np.asarray(item["value"], dtype=np.float64)
    clipped = item["clipped"]
    if value.ndim != 1 or not value.size or not np.all(np.isfinite(value)) \
            or (clipped is not None and (isinstance(clipped, bool) or not isinstance(clipped, int))):
        raise ValueError(f"a malformed release of {name!r}")
    contributors = tuple(int(c) for c in item["contributors"])
    return Learned(name, int(item["round"]), value, contributors, clipped)
