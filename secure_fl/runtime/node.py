"""A client node: one client's data, model work, state and secrets, answering messages as bytes.

The node is the client's whole side of a run. Its inbox holds runtime messages (the round's
broadcasts and the global model to train on, :mod:`.messages`) and protocol envelopes (the
statistics and update sums, handled by its :class:`~secure_fl.stats.StatsParticipant`). It
trains with its method's client half, contributes to the sums the server opens — checking each
request against its own declarations — and keeps what it learns. Nothing it holds is reachable
from the server except through its replies.

:meth:`ClientNode.snapshot` serialises everything the client keeps between messages — the
method's state, its protocol keys, what it learned, the last round it trained — so a node can
be restarted from its snapshot (a fresh process per message, a killed node that resumes).

Training runs on a :class:`~secure_fl.algorithms.LocalTrainer` the engine may share between the
nodes of one process as scratch compute: the node loads its own weights into it before every
use and keeps nothing in it. With a :class:`~secure_fl.runtime.pool.ClientPool` (the same kind of
shared client-side compute) the training message only submits the node's training; the pool
trains the pending cohort together at the first use of a result, and the node settles — takes
its own update and state back — before it handles anything else (:meth:`ClientNode.settle`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from protocols import (
    Directory,
    Identity,
    Message,
    PolicyError,
    ProtocolError,
    StageError,
    SumRequest,
    WireError,
)
from secure_fl.algorithms import (
    ClientContext,
    ClientData,
    ClientMethod,
    ClientState,
    ContributionContext,
    LocalTrainer,
    LocalUpdate,
    RunInfo,
)
from secure_fl.algorithms.base import DP_SGD_STATE
from secure_fl.runtime.messages import Kind, RuntimeMessage, is_runtime
from secure_fl.runtime.rng import Seeds
from secure_fl.selection.strategy import ClientSelectionContext, SelectionClient
from secure_fl.snapshots import dump_state, load_state
from secure_fl.stats import Learned, StatisticDeclaration, StatisticsPlan
from secure_fl.stats.participant import StatsParticipant

if TYPE_CHECKING:
    from secure_fl.privacy.dpsgd import DPSGD, DPSGDConfig
    from secure_fl.runtime.pool import ClientPool, PendingTraining

__all__ = ["ClientNode", "NodeTelemetry"]


@dataclass
class NodeTelemetry:
    """What the node measured of itself in its last round: local knowledge, never sent."""

    round: int = -1
    loss: float = 0.0
    num_samples: int = 0
    dp_epsilon: float | None = None


class ClientNode:
    """One client of a run (see the module docstring)."""

    def __init__(
        self,
        *,
        data: ClientData,
        method: ClientMethod,
        plan: StatisticsPlan,
        info: RunInfo,
        trainer: LocalTrainer,
        seeds: Seeds,
        digest: bytes,
        selection: SelectionClient | None = None,
        dp_sgd: DPSGDConfig | None = None,
        extra_sessions: Mapping[tuple[str, str], Any] | None = None,
        noise_seed: Callable[[str, int, int], np.random.SeedSequence] | None = None,
        pool: ClientPool | None = None,
        authenticate: bool = False,
        identity: Identity | None = None,
    ) -> None:
        self.client_id = data.client_id
        self.data = data
        self.method = method
        self.selection = selection
        self.info = info
        self.trainer = trainer
        self.seeds = seeds
        self.digest = digest
        self.dp_sgd_config = dp_sgd
        self._dp_sgd: DPSGD | None = None
        self.pool = pool if dp_sgd is None else None
        """Shared with the process's other nodes to train together (never under DP-SGD)."""
        self._pending: tuple[int, PendingTraining] | None = None
        self._begun: tuple[Sequence[bytes], int, list[Message]] | None = None
        self._repeated: list[Learned] = []
        """Reuses that arrived while this node's training waited in the pool (see :meth:`_repeat`)."""
        self.state: dict[str, Any] = {}
        """The method's persistent client state (SCAFFOLD's c_i, CLIMB's λ_i, FedShift's prior...)."""
        self.learned: dict[int, dict[str, Learned]] = {}
        """What this client learned, by round and statistic (the current and setup rounds)."""
        self.trained_round = -1
        self.update: LocalUpdate | None = None
        self._broadcast: dict[str, torch.Tensor] = {}
        self._broadcast_round = -1
        self.telemetry = NodeTelemetry()
        self.refusals: list[str] = []
        self.dirty = False
        """Whether the state changed since the last snapshot."""
        self._method_statistics = frozenset(method.declarations())
        self._selection_statistics = frozenset(selection.declarations()) if selection is not None else frozenset()
        self._declarations: dict[str, StatisticDeclaration] = dict(method.declarations())
        if selection is not None:
            self._declarations.update(selection.declarations())
        self.participant = StatsParticipant(
            self.client_id, plan=plan, declarations=self._declarations.get, source=self._source,
            on_learned=self._learned, extra_sessions=extra_sessions,
            noise_seed=None if noise_seed is None else (lambda name, r: noise_seed(name, r, self.client_id)),
        )
        if identity is not None and identity.party != self.client_id:
            raise ValueError(f"the signing key of {identity!r} given to client {self.client_id}")
        self.identity = identity if identity is not None else (Identity(self.client_id) if authenticate else None)
        """This client's signing key (``authenticate``): made here — or ``identity``, the key a node
        rebuilt for every message made once and keeps in its own state —, never leaves the node;
        only its public half goes to the registration step (:meth:`register`)."""

    def register(self, directory: Directory) -> None:
        """Set-up: the registry of every party's public key, this node's among them."""
        if self.identity is None:
            raise RuntimeError("this node was built without authenticate")
        self.participant.register(self.identity, directory)

    # --- the network side ----------------------------------------------------------------------

    def begin(self, inbox: Sequence[bytes]) -> None:
        """Handle the runtime messages at the head of ``inbox`` now; :meth:`handle` of the same inbox
        answers the rest. The engine calls it for every node of an exchange before any node's
        :meth:`handle`, so that all of them have submitted their training to the pool first."""
        out: list[Message] = []
        count = 0
        for data in inbox:
            if not is_runtime(data):
                break
            out.extend(self._runtime(data))
            count += 1
        self._begun = (inbox, count, out)

    def handle(self, inbox: Sequence[bytes]) -> list[Message]:
        """Answer the messages of one exchange, in order."""
        out: list[Message] = []
        start = 0
        if self._begun is not None and self._begun[0] is inbox:
            start, out = self._begun[1], list(self._begun[2])
        self._begun = None
        for data in inbox[start:]:
            if is_runtime(data):
                out.extend(self._runtime(data))
            else:
                self.settle()
                out.extend(self.participant.handle(data))
                self.dirty = True
        return out

    def _runtime(self, data: bytes) -> list[Message]:
        round_ = self.trained_round
        try:
            message = RuntimeMessage.from_bytes(data, dimension=self.info.dimension)
            round_ = message.round
            if message.digest != self.digest:
                raise StageError("a message of another run")
            if message.kind == Kind.REUSE:  # does not wait for the pooled training (see _repeat)
                self._repeat(message)
                return []
            self.settle()
            if message.kind == Kind.BROADCAST:
                self._receive_broadcast(message)
            elif message.kind == Kind.TRAIN:
                self._train(message)
            elif message.kind == Kind.ABORT:
                self.update, self._broadcast, self._repeated = None, {}, []
            elif message.kind == Kind.BULLETIN:
                self.participant.learn_releases(message.name, message.releases)  # public, for the release rule
                self.dirty = True
            else:
                raise StageError(f"a node does not accept {message.kind.name.lower()} messages")
            return []
        except ProtocolError as error:
            reason = f"{type(error).__name__}: {error}"
            self.refusals.append(reason)
            reply = RuntimeMessage(kind=Kind.REFUSE, round=round_, digest=self.digest, reason=reason)
            return [reply.message(statistic="refusal")]

    def _repeat(self, message: RuntimeMessage) -> None:
        """The server points this client at an earlier release of a constant statistic for this
        round. It arrives right after the round's training message: with a pool, the node takes
        it once its training is settled, so that the cohort still trains together."""
        (earlier, contributors), = message.releases
        if message.round < self.trained_round:
            raise StageError(f"a reuse for round {message.round}, after round {self.trained_round}")
        if message.name in self.learned.get(message.round, {}) or any(
                k.round == message.round and k.name == message.name for k in self._repeated):
            raise StageError(f"statistic {message.name!r} of round {message.round} is known already (a replay)")
        learned = self.participant.repeat(message.name, message.round, earlier, contributors)
        if self._pending is not None:
            self._repeated.append(learned)
        else:
            self._learned(learned)

    def _receive_broadcast(self, message: RuntimeMessage) -> None:
        if message.round <= self.trained_round:
            raise StageError(f"a broadcast for round {message.round}, already trained")
        assert message.vector is not None
        if self.selection is not None and message.name in self.selection.announcements:
            self.selection.heard(message.name, message.round, message.vector)  # public, for the selection half
            self.dirty = True
            return
        if message.round != self._broadcast_round:
            self._broadcast, self._broadcast_round = {}, message.round
        if message.name in self._broadcast:
            raise StageError(f"broadcast {message.name!r} of round {message.round} arrived twice")
        self._broadcast[message.name] = torch.from_numpy(message.vector).to(self.data.x.device)

    # --- training ------------------------------------------------------------------------------

    def _dp_for(self, round: int) -> DPSGD | None:
        """This client's DP-SGD; in insecure mode keyed by (round, client), so resumes repeat it."""
        if self.dp_sgd_config is None:
            return None
        from secure_fl.privacy.dpsgd import DPSGD

        if self.dp_sgd_config.secure_mode:
            if self._dp_sgd is None:
                self._dp_sgd = DPSGD(self.dp_sgd_config)
            return self._dp_sgd
        from secure_fl.privacy import SeededRandom

        return DPSGD(self.dp_sgd_config, rng=SeededRandom(self.seeds.sequence("dp_sgd", round, self.client_id)))

    def _train(self, message: RuntimeMessage) -> None:
        r = message.round
        if r <= self.trained_round:
            raise StageError(f"round {r} was trained already (a replay)")
        assert message.vector is not None
        device = self.data.x.device
        global_vector = torch.from_numpy(message.vector).to(device)
        broadcast = dict(self._broadcast) if self._broadcast_round == r else {}
        attempt = partial(self._attempt, r, global_vector, broadcast)
        if self.pool is None:
            self._finish(r, *attempt(self.trainer))
            return
        submitted = self.pool.submit(attempt, self.state)
        if isinstance(submitted, tuple):
            self._finish(r, *submitted)
        else:
            self._pending = (r, submitted)
            self.trained_round = r  # a second training message of this round is a replay

    def _attempt(self, r: int, global_vector: torch.Tensor, broadcast: Mapping[str, torch.Tensor],
                 trainer: LocalTrainer) -> tuple[LocalUpdate, ClientContext]:
        """One run of the method's ``train`` on ``trainer``: the same context and seeded generators
        every time (the pool runs it twice, see :mod:`secure_fl.runtime.pool`)."""
        ctx = ClientContext(
            round=r, data=self.data, state=self.state, global_vector=global_vector, broadcast=broadcast,
            lr=self.info.training.lr_at(r), info=self.info, trainer=trainer,
            shuffle=self.seeds.torch("shuffle", r, self.client_id), dp_sgd=self._dp_for(r),
        )
        with self.seeds.torch_global("client", r, self.client_id, device=self.data.x.device):
            update = self.method.train(ctx)
        return update, ctx

    def settle(self) -> None:
        """Take this node's pooled training back (the pool trains the pending cohort if it has not yet)."""
        if self._pending is None:
            return
        r, pending = self._pending
        self._pending = None
        self._finish(r, *pending.result())
        repeated, self._repeated = self._repeated, []
        for learned in repeated:
            self._learned(learned)

    def _finish(self, r: int, update: LocalUpdate, ctx: ClientContext) -> None:
        if self.dp_sgd_config is not None and ctx.trainings == 0 and self.data.num_samples > 0 \
                and bool(torch.any(update.delta != 0)):
            raise RuntimeError(
                f"method {type(self.method).__name__} changed client {self.client_id}'s model without "
                "ClientContext.train, so DP-SGD cannot protect it; train through ctx.train(objective)")
        self.trained_round, self.update = r, update
        self.learned = {k: v for k, v in self.learned.items() if not k > 0 or k >= r}
        self.telemetry = NodeTelemetry(round=r, loss=update.loss, num_samples=update.num_samples,
                                       dp_epsilon=ctx.dp_epsilon)
        self.dirty = True

    # --- statistics ----------------------------------------------------------------------------

    def _source(self, declaration: StatisticDeclaration, request: SumRequest) -> Any:
        ctx = ContributionContext(
            client_id=self.client_id, round=request.round, data=self.data, state=self.state,
            learned=self.learned.get(request.round, {}),
            update=self.update if self.trained_round == request.round else None,
            cohort_size=len(request.participants),
        )
        if declaration.name in self._method_statistics:
            vector = self.method.contribution(declaration.name, ctx)
        elif self.selection is not None and declaration.name in self._selection_statistics:
            vector = self.selection.contribution(declaration.name, self._selection_context(request.round))
        else:
            raise PolicyError(f"no part of this client contributes {declaration.name!r}")
        if isinstance(vector, torch.Tensor):
            return vector.detach().to("cpu", torch.float64).numpy()
        return vector

    def _selection_context(self, round: int) -> ClientSelectionContext:
        """The selection half's view: this client's counts, and its own coins keyed by (round, client)."""
        def rng(stream: str, *keys: int) -> np.random.Generator:
            return self.seeds.numpy(stream, round, self.client_id, *keys)

        return ClientSelectionContext(client_id=self.client_id, round=round,
                                      counts=np.asarray(self.data.class_counts, dtype=np.int64), rng=rng)

    def _learned(self, learned: Learned) -> None:
        self.learned.setdefault(learned.round, {})[learned.name] = learned
        ctx = ClientState(client_id=self.client_id, round=learned.round, data=self.data, state=self.state,
                          learned=self.learned[learned.round])
        self.method.learned(learned, ctx)
        if self.selection is not None:
            self.selection.learned(learned)
        self.dirty = True

    # --- snapshots -----------------------------------------------------------------------------

    def snapshot(self) -> bytes:
        """Everything this client keeps between messages, as bytes (its own secrets included)."""
        self.settle()
        self.dirty = False
        return dump_state({
            "state": self.state,
            "participant": self.participant.state(),
            "trained_round": self.trained_round,
            "selection": {} if self.selection is None else self.selection.state_dict(),
        })

    def restore(self, data: bytes) -> None:
        """Continue from :meth:`snapshot`; a live round is forgotten (its messages are refused)."""
        self.settle()
        try:
            saved = load_state(data, device=self.data.x.device)
        except Exception as error:  # noqa: BLE001 -- any unreadable snapshot is one typed error
            raise WireError(f"client {self.client_id}: unreadable snapshot ({type(error).__name__})") from None
        if not isinstance(saved, dict) or set(saved) != {"state", "participant", "trained_round", "selection"}:
            raise WireError(f"client {self.client_id}: not a node snapshot")
        state, trained_round = saved["state"], saved["trained_round"]
        if not isinstance(state, dict) or isinstance(trained_round, bool) or not isinstance(trained_round, int) \
                or not isinstance(saved["participant"], dict) or not isinstance(saved["selection"], dict):
            raise WireError(f"client {self.client_id}: a node snapshot with fields of the wrong type")
        before = self.participant.state()
        self.participant.load_state(saved["participant"])  # whole or not at all
        if self.selection is not None:
            try:
                self.selection.load_state_dict(saved["selection"])
            except (KeyError, TypeError, ValueError) as error:
                self.participant.load_state(before)
                raise WireError(f"client {self.client_id}: bad selection state in snapshot: {error}") from None
        elif saved["selection"]:
            self.participant.load_state(before)
            raise WireError(f"client {self.client_id}: the snapshot holds selection state this run has no use for")
        self.state, self.trained_round = dict(state), trained_round
        self.update, self._broadcast, self._broadcast_round = None, {}, -1
        self.learned, self._repeated = {}, []
        self.dirty = False

    def dp_state(self) -> Any:
        """This client's DP-SGD accountant (local knowledge)."""
        self.settle()
        from secure_fl.privacy.dpsgd import DPSGDState

        return DPSGDState.from_dict(self.state.get(DP_SGD_STATE))
