"""The server's side of a run's statistics: open a declared sum over a cohort, get a :class:`Release`.

One :class:`StatsCoordinator` lives for one run on the server. It keeps the server session of
each protocol the run uses (so keys are set up once per run, by messages between the parties),
the declarations methods made, a :class:`~secure_fl.stats.release.Release` per request, and
the run's privacy ledger. It never sees a client's input: it sends each cohort member an
``open`` (:class:`protocols.SumRequest`) through the run's network, drives the protocol and
reads what the protocol lets the server read.

Once-per-run statistics (``per_round = False``) are released once: asked again for the same
round and cohort — a resumed run's set-up — the coordinator answers from its checkpointed release, and
the clients answer from theirs, so nothing is summed (or noised, or charged) twice.

A constant statistic (``constant``: each client's input is fixed for the run, |D_i|) asked for
over exactly the contributors of its last release is not summed again either: the runtime
points those clients at that release (:attr:`StatsCoordinator.reuse`, a ``reuse`` message) and
the coordinator answers with a :class:`Release` that repeats it (``reused_from``); neither side
learns anything it did not know. A statistic the run noises (``[privacy.statistics]``) is
summed afresh every time, as the releases its noise was calibrated for. Without the runtime's
hook every request is summed.
"""

from __future__ import annotations

import math
import secrets
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from protocols import (
    Authenticator,
    Directory,
    Identity,
    Network,
    RunContext,
    ServerSession,
    SumRequest,
    Transcript,
    descriptor,
    drive,
)

from .declaration import StatisticDeclaration
from .plan import Layouts, StatisticsPlan, ascending
from .release import Release
from .tally import read_tally

if TYPE_CHECKING:
    from secure_fl.privacy import NoisySum, PrivacyLedger

__all__ = ["StatsCoordinator"]


class StatsCoordinator:
    """Requests declared statistics from cohorts over the run's network (see the module docstring)."""

    def __init__(self, plan: StatisticsPlan, network: Network) -> None:
        self.plan = plan
        self.network = network
        self.layouts = Layouts(plan)
        self.declarations: dict[str, StatisticDeclaration] = {}
        self.records: list[Release] = []
        self._sessions: dict[tuple[str, str], ServerSession] = {}
        self._options: dict[tuple[str, str], Any] = {}
        self.ledger: PrivacyLedger | None = None
        if plan.privacy is not None:
            from secure_fl.privacy import PrivacyLedger

            self.ledger = PrivacyLedger()
        self._accounting: dict[str, NoisySum] = {}
        self._once: dict[tuple[str, int, tuple[int, ...]], Release] = {}
        self.authenticator: Authenticator | None = None
        """Set by :meth:`register` (``authenticate``): the server signs and checks every envelope."""
        self.announce: Callable[[int, str, int, tuple[tuple[int, tuple[int, ...]], ...]], None] | None = None
        """Set by the runtime when the release rule needs the history (the span guard): called
        with (client, statistic, round, releases) before a run opens, to queue the public record
        of the releases that client has not been told yet."""
        self.reuse: Callable[[int, str, int, tuple[int, ...]], int] | None = None
        """Set by the runtime: called with (round, statistic, earlier round, contributors) to point
        those clients at the earlier release of a constant statistic; returns the bytes it queued."""
        self._constants: dict[str, Release] = {}
        """The last release of each constant statistic (from a sum, not a repeat)."""
        self.public: dict[str, list[tuple[int, tuple[int, ...]]]] = {}
        """statistic → (round, contributors) of each release the rule covers, in order."""
        self._told: dict[tuple[int, str], int] = {}

    def register(self, identity: Identity, directory: Directory) -> None:
        """Set-up: the server's signing key and the registry of everyone's, before any sum."""
        if self._sessions:
            raise RuntimeError("register keys before the first sum")
        self.authenticator = Authenticator(identity, directory)

    @property
    def transcript(self) -> Transcript:
        return self.network.transcript

    @property
    def clients(self) -> tuple[int, ...]:
        return self.plan.clients

    # --- sessions and declarations -----------------------------------------------------------

    def add_session(self, protocol: str, tag: str, options: Any) -> None:
        """A second session of ``protocol`` with its own options and keys (e.g. Dubhe's Paillier)."""
        if not tag:
            raise ValueError("an extra session needs a tag")
        self._options[(protocol, tag)] = options

    def session(self, protocol: str, tag: str = "") -> ServerSession:
        """The run's one server session of ``protocol`` (and ``tag``), created on first use."""
        key = (protocol, tag)
        session = self._sessions.get(key)
        if session is None:
            options = self._options[key] if tag else self.plan.options_for(protocol)
            session = descriptor(protocol).server_session(clients=self.clients, options=options)
            session.tag = tag
            if self.authenticator is not None:
                session.directory = self.authenticator.directory
            self._sessions[key] = session
        return session

    def ensure_ready(self, protocol: str, *, round: int, tag: str = "") -> ServerSession:
        """The session, its key set-up run first if it has not happened yet."""
        session = self.session(protocol, tag)
        if not session.ready:
            run_id = secrets.token_bytes(16)
            party = session.setup(run_id=run_id, round=round, statistic=f"{tag}_setup" if tag else "setup")
            if party is not None:
                context = RunContext(protocol, run_id, round, party.request.statistic, descriptor(protocol).stages)
                drive(party, self.network, context, authenticator=self.authenticator)
        return session

    def declare(self, declaration: StatisticDeclaration) -> StatisticDeclaration:
        """Register a declaration for the audit; one name means one declaration per run."""
        known = self.declarations.get(declaration.name)
        if known is not None and known != declaration:
            raise ValueError(
                f"statistic {declaration.name!r} was already declared differently in this run: "
                f"{known.as_dict()} vs {declaration.as_dict()}")
        self.declarations[declaration.name] = declaration
        return declaration

    # --- requests ------------------------------------------------------------------------------

    def request(self, declaration: StatisticDeclaration, *, cohort: Sequence[int], round: int,
                protocol: str | None = None, tag: str = "") -> Release:
        """Sum ``declaration`` over ``cohort`` through its protocol; what the server may know of it."""
        self.declare(declaration)
        members = ascending(cohort)
        unknown = set(members) - set(self.clients)
        if unknown:
            raise ValueError(f"statistic {declaration.name!r}: clients {sorted(unknown)} are not in this run")
        once = (declaration.name, round, members)
        if not declaration.per_round and once in self._once:
            return self._once[once]
        layout = self.layouts(declaration, len(members), protocol)
        repeat = self._repeat(declaration, members, round, layout.protocol, tag) if layout.noisy is None else None
        if repeat is not None:
            return repeat
        session = self.session(layout.protocol, tag)
        session.check(spec=layout.spec, reveal=declaration.reveal)
        accounting = self._noise_accounting(declaration, len(members)) if layout.noisy is not None else None
        if accounting is not None:
            self._check_budget(accounting)
        self.ensure_ready(layout.protocol, round=round, tag=tag)
        run_id = secrets.token_bytes(16)
        request = SumRequest(kind="sum", statistic=declaration.name, round=round, spec=layout.spec,
                             reveal=declaration.reveal, participants=members, session=tag)
        self._announce(declaration.name, round, members, tag)
        party = session.open(run_id=run_id, request=request)
        start = len(self.transcript)
        context = RunContext(layout.protocol, run_id, round, declaration.name, descriptor(layout.protocol).stages)
        refusals = drive(party, self.network, context, authenticator=self.authenticator)
        contributors = tuple(party.contributors)
        value: np.ndarray | None = None
        clipped: int | None = None
        if party.result is not None:
            value, clipped = np.asarray(party.result, dtype=np.float64), 0
            if layout.digits:
                value, clipped = read_tally(layout.base, value, layout.digits, len(contributors))
        epsilon = None
        if accounting is not None:
            accounting._record(round=round, contributors=len(contributors))
            clipped = None
            assert self.ledger is not None
            epsilon = self.ledger.guarantee(accounting.config.delta, statistic=declaration.name).epsilon
        run_hex = run_id.hex()
        spent = sum(e.bytes for e in self.transcript.entries[start:] if e.run_id == run_hex)
        learned = ["server"] if party.result is not None else []
        if declaration.reveal.clients:
            learned += [f"client-{c}" for c in contributors]
        release = Release(
            name=declaration.name, round=round, protocol=layout.protocol, value=value, contributors=contributors,
            dropouts=tuple(c for c in members if c not in set(contributors)), learned_by=tuple(learned),
            clipped=clipped, bytes=spent, epsilon=epsilon if epsilon is None or math.isfinite(epsilon) else None,
            noise=None if layout.noisy is None else layout.noisy.describe(),
            refusals=tuple(refusals) + tuple(party.rejections),
        )
        self.records.append(release)
        if self._needs_history(declaration.name, tag) and contributors and party.result is not None:
            self.public.setdefault(declaration.name, []).append((round, contributors))
        if not declaration.per_round:
            self._once[once] = release
        if declaration.constant and not tag and contributors:
            self._constants[declaration.name] = release
        return release

    def _repeat(self, declaration: StatisticDeclaration, members: tuple[int, ...], round: int, protocol: str,
                tag: str) -> Release | None:
        """The last release of a constant statistic again, when ``members`` are its contributors
        (see the module docstring); ``None`` when it must be summed."""
        notify, reuse = declaration.reveal.clients, self.reuse  # clients that learn it must be told
        if not declaration.constant or tag or (notify and reuse is None):
            return None
        earlier = self._constants.get(declaration.name)
        if earlier is None or earlier.contributors != members or earlier.protocol != protocol \
                or earlier.round >= round:
            return None
        spent = reuse(round, declaration.name, earlier.round, members) if notify and reuse is not None else 0
        release = Release(  # never noised (request sums a noised statistic every time): no ε, no noise
            name=declaration.name, round=round, protocol=protocol,
            value=None if earlier.value is None else earlier.value.copy(), contributors=members, dropouts=(),
            learned_by=earlier.learned_by, clipped=None if earlier.clipped is None else 0, bytes=spent,
            reused_from=earlier.round,
        )
        self.records.append(release)
        return release

    def _needs_history(self, statistic: str, tag: str) -> bool:
        policy = self.plan.policy
        return policy is not None and policy.needs_history and policy.covers(statistic, tag)

    def _announce(self, statistic: str, round: int, members: tuple[int, ...], tag: str) -> None:
        """Each participant gets the public record of the releases of ``statistic`` it has not
        been told of (after a resume: all of them again; a client takes a repeat as it is)."""
        if self.announce is None or not self._needs_history(statistic, tag):
            return
        history = self.public.get(statistic, [])
        for pid in members:
            told = self._told.get((pid, statistic), 0)
            if told < len(history):
                self.announce(pid, statistic, round, tuple(history[told:]))
                self._told[(pid, statistic)] = len(history)

    # --- distributed DP ------------------------------------------------------------------------

    def _noise_accounting(self, declaration: StatisticDeclaration, summands: int) -> NoisySum:
        """The statistic's calibration as the server accounts for it (the clients draw the noise)."""
        noisy = self._accounting.get(declaration.name)
        if noisy is None:
            assert self.plan.privacy is not None
            noisy = self.plan.privacy.noisy_sum(declaration, clients=len(self.clients), contributors=summands,
                                                ledger=self.ledger, update=self.plan.is_update(declaration))
            assert noisy is not None
            self._accounting[declaration.name] = noisy
        return noisy

    def _check_budget(self, noisy: NoisySum) -> None:
        from secure_fl.privacy import PrivacyBudgetError

        try:
            noisy._check_budget()
        except PrivacyBudgetError as error:
            raise PrivacyBudgetError(
                f"{error} (in a run config: [privacy.statistics] {noisy.declaration.name} = {{ ..., releases = N }})"
            ) from None

    @property
    def noisy(self) -> Mapping[str, NoisySum]:
        """The calibration of each noised statistic requested so far."""
        return dict(self._accounting)

    def run_delta(self, *, fallback: float) -> float:
        """The δ of the run's one ε: :func:`~secure_fl.privacy.composition_delta` over the noised
        statistics released so far (``fallback`` when none is) — every engine reports at this δ."""
        from secure_fl.privacy import composition_delta

        released = self.ledger.statistics() if self.ledger is not None else ()
        return composition_delta((noisy.config.delta for name, noisy in sorted(self._accounting.items())
                                  if name in released), fallback=fallback)

    # --- accounting of bytes and checkpoints ---------------------------------------------------

    def bytes_by_statistic(self, round: int | None = None) -> dict[str, int]:
        """Transcript bytes per statistic name, for one round or the whole run so far."""
        totals: dict[str, int] = defaultdict(int)
        if round is not None:
            for (statistic, _), count in self.transcript.round_bytes(round).items():
                totals[statistic] += count
            return dict(totals)
        for entry in self.transcript.entries:
            totals[entry.statistic] += entry.bytes
        return dict(totals)

    def state(self) -> dict[str, Any]:
        """Plain data for the server's checkpoint: the ledger, the once-per-run releases and the
        last release of each constant statistic."""
        return {
            "ledger": None if self.ledger is None else self.ledger.to_dict(),
            "once": [{**_release_state(r), "cohort": list(key[2])} for key, r in self._once.items()],
            **({"constants": [_release_state(r) for r in self._constants.values()]} if self._constants else {}),
            **({"public": {name: [[r, list(c)] for r, c in entries] for name, entries in self.public.items()}}
               if self.public else {}),
        }

    def load_state(self, state: Mapping[str, Any]) -> None:
        if state.get("ledger") is not None:
            if self.ledger is None:
                raise ValueError("this run keeps no privacy ledger but the checkpoint has one")
            from secure_fl.privacy import PrivacyLedger

            self.ledger.releases[:] = PrivacyLedger.from_dict(state["ledger"]).releases
        self.public = {str(name): [(int(r), tuple(int(c) for c in members)) for r, members in entries]
                       for name, entries in state.get("public", {}).items()}
        self._told = {}
        self._once = {}
        for item in state.get("once", []):
            release = _release_from_state(item)
            self._once[(release.name, release.round, tuple(int(c) for c in item["cohort"]))] = release
        self._constants = {}
        for item in state.get("constants", []):
            release = _release_from_state(item)
            self._constants[release.name] = release


def _release_state(release: Release) -> dict[str, Any]:
    out = release.as_dict()
    out["value"] = None if release.value is None else [float(v) for v in release.value]
    out["epsilon"] = release.epsilon
    if release.noise is not None:
        out["noise"] = release.noise
    return out


def _release_from_state(item: Mapping[str, Any]) -> Release:
    value = item.get("value")
    return Release(
        name=str(item["name"]), round=int(item["round"]), protocol=str(item["protocol"]),
        value=None if value is None else np.asarray(value, dtype=np.float64),
        contributors=tuple(int(c) for c in item["contributors"]), dropouts=tuple(int(c) for c in item["dropped"]),
        learned_by=tuple(str(x) for x in item["learned_by"]),
        clipped=None if item.get("clipped") is None else int(item["clipped"]), bytes=int(item["bytes"]),
        epsilon=None if item.get("epsilon") is None else float(item["epsilon"]),
        noise=None if item.get("noise") is None else dict(item["noise"]),
    )

