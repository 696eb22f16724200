"""The server loop: drives rounds by messages, holds only the server's knowledge.

A round is: select the cohort (the selection may announce public values to every client); queue
the round's broadcasts and the global model (``train``) for it; let the method's server half
aggregate — its statistic and update requests open protocol runs whose first exchange carries
the queued training messages too (one round trip saved); then
``after_round`` and evaluation on the server's own test set. The loop never holds a client's
data, counts, loss or update: it sees releases (:class:`~secure_fl.stats.Release`) and what the
network brought it.

:class:`Mailbox` is the server's network during a run: runtime messages queued for clients go
out with the next exchange (or with :meth:`Mailbox.flush`), and nodes' refusals of runtime
messages are collected instead of reaching a protocol driver.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
import torch
import torch.nn.functional as F

from protocols import AbortedError, Message, Network, Replies, Transcript
from secure_fl.algorithms import (
    HeldOut,
    LocalTrainer,
    RunInfo,
    ServerMethod,
    ServerRound,
    ServerSetup,
)
from secure_fl.algorithms.base import check_round_metrics
from secure_fl.metrics import evaluate_predictions
from secure_fl.runtime.messages import Kind, RuntimeMessage, is_runtime
from secure_fl.runtime.rng import Seeds
from secure_fl.selection.strategy import SelectionContext, SelectionStrategy
from secure_fl.stats import Release
from secure_fl.stats.coordinator import StatsCoordinator
from secure_fl.stats.updates import UpdateSum

__all__ = ["MODEL_BROADCAST", "Mailbox", "RoundOutcome", "ServerLoop"]

MODEL_BROADCAST = "model_broadcast"


class Mailbox(Network):
    """The run's network as the server uses it (see the module docstring)."""

    def __init__(self, network: Network) -> None:
        self.network = network
        self._queued: dict[int, list[Message]] = defaultdict(list)
        self.refusals: list[str] = []

    @property
    def transcript(self) -> Transcript:  # type: ignore[override]
        return self.network.transcript

    def queue(self, party: int, message: Message) -> None:
        self._queued[party].append(message)

    def exchange(self, outbox: Mapping[int, Sequence[Message]]) -> Replies:
        merged = {p: [*self._queued.pop(p, []), *outbox.get(p, [])] for p in sorted({*outbox, *self._queued})}
        replies = self.network.exchange(merged)
        for party, messages in replies.messages.items():
            kept = []
            for message in messages:
                if is_runtime(message.data):
                    self.refusals.append(f"client {party}: {_reason(message.data)}")
                else:
                    kept.append(message)
            replies.messages[party] = kept
        return replies

    def flush(self) -> None:
        """Send what is queued now (when no protocol exchange will carry it)."""
        if self._queued:
            self.exchange({})

    def discard(self) -> None:
        """Forget what is queued (a round being abandoned)."""
        self._queued.clear()


def _reason(data: bytes) -> str:
    try:
        message = RuntimeMessage.from_bytes(data)
    except Exception:  # noqa: BLE001 -- an unreadable reply is reported as such
        return "unreadable runtime reply"
    return message.reason if message.kind == Kind.REFUSE else f"unexpected {message.kind.name.lower()}"


@dataclass(frozen=True)
class RoundOutcome:
    """What one round did, as the server knows it."""

    round: int
    selected: tuple[int, ...]
    releases: tuple[Release, ...]
    clipped: int
    seconds: float
    metrics: dict[str, float | None] = field(default_factory=dict)
    refusals: tuple[str, ...] = ()


class ServerLoop:
    """The server's side of a run (see the module docstring)."""

    def __init__(
        self,
        *,
        info: RunInfo,
        method: ServerMethod,
        selection: SelectionStrategy,
        stats: StatsCoordinator,
        updates: UpdateSum,
        mailbox: Mailbox,
        model: LocalTrainer,
        x_test: torch.Tensor,
        y_test: torch.Tensor,
        seeds: Seeds,
        device: torch.device,
        digest: bytes,
        clients_per_round: int,
        minority_classes: Sequence[int] = (),
        eval_batch_size: int = 1024,
        holdout: HeldOut | None = None,
    ) -> None:
        if not 1 <= clients_per_round <= info.num_clients:
            raise ValueError(f"clients_per_round must lie in [1, {info.num_clients}], got {clients_per_round}")
        self.info = info
        self.method = method
        self.selection = selection
        self.stats = stats
        self.updates = updates
        self.mailbox = mailbox
        self.model = model
        self.layout = model.layout
        self.x_test, self.y_test = x_test, y_test
        self.y_test_np = y_test.cpu().numpy()
        self.seeds = seeds
        self.device = device
        self.digest = digest
        self.clients_per_round = clients_per_round
        self.minority_classes = tuple(minority_classes)
        self.eval_batch_size = eval_batch_size
        self.holdout = holdout
        self.global_vector = self.layout.flatten()
        self.next_round = 0
        stats.announce = self._bulletin  # the span guard's public record of releases (issue 25)
        stats.reuse = self._reuse

    @property
    def clients(self) -> tuple[int, ...]:
        return tuple(range(self.info.num_clients))

    def setup(self) -> None:
        """The method's and the selection's once-per-run set-up (again on resume)."""
        self.method.setup(ServerSetup(info=self.info, stats=self.stats, clients=self.clients, device=self.device,
                                      holdout=self.holdout, model=self.model))
        self.selection.setup(num_clients=self.info.num_clients, num_classes=self.info.num_classes, stats=self.stats)

    def _round(self, r: int, cohort: tuple[int, ...], metrics: dict[str, float]) -> ServerRound:
        return ServerRound(round=r, global_vector=self.global_vector, cohort=cohort, info=self.info,
                           stats=self.stats, updates=self.updates, metrics=metrics)

    def _send_training(self, r: int, cohort: tuple[int, ...], extras: Mapping[str, torch.Tensor]) -> None:
        messages = [
            RuntimeMessage(kind=Kind.BROADCAST, round=r, digest=self.digest, name=name,
                           vector=vector.detach().to("cpu", torch.float32).numpy()).message(
                statistic=f"{name}_broadcast")
            for name, vector in extras.items()
        ]
        train = RuntimeMessage(kind=Kind.TRAIN, round=r, digest=self.digest,
                               vector=self.global_vector.detach().to("cpu", torch.float32).numpy())
        messages.append(train.message(statistic=MODEL_BROADCAST))
        for pid in cohort:
            for message in messages:
                self.mailbox.queue(pid, message)

    def _bulletin(self, pid: int, statistic: str, r: int, releases: tuple[tuple[int, tuple[int, ...]], ...]) -> None:
        """The public record of earlier releases, queued for ``pid`` ahead of a run it is asked to join."""
        message = RuntimeMessage(kind=Kind.BULLETIN, round=r, digest=self.digest, name=statistic, releases=releases)
        self.mailbox.queue(pid, message.message(statistic=f"{statistic}_bulletin"))

    def _reuse(self, r: int, statistic: str, earlier: int, contributors: tuple[int, ...]) -> int:
        """Point ``contributors`` at their release of ``statistic`` of round ``earlier`` (a constant
        statistic, not summed again); queued for the round's next exchange. The bytes queued."""
        message = RuntimeMessage(kind=Kind.REUSE, round=r, digest=self.digest, name=statistic,
                                 releases=((earlier, contributors),)).message(statistic=statistic)
        for pid in contributors:
            self.mailbox.queue(pid, message)
        return len(message.data) * len(contributors)

    def _announcer(self, r: int) -> Callable[[str, npt.NDArray[np.float64]], None]:
        """The selection's announcements: a public broadcast to every client, sent with the next exchange."""
        def announce(name: str, vector: npt.NDArray[np.float64]) -> None:
            message = RuntimeMessage(kind=Kind.BROADCAST, round=r, digest=self.digest, name=name,
                                     vector=np.asarray(vector, dtype=np.float32)).message(statistic=name)
            for pid in self.clients:
                self.mailbox.queue(pid, message)
        return announce

    def run_round(self) -> RoundOutcome:
        start = time.perf_counter()
        r = self.next_round
        cohort = tuple(self.selection.select(SelectionContext(
            round=r, num_clients=self.info.num_clients, clients_per_round=self.clients_per_round,
            rng=self.seeds.numpy("selection", r), stats=self.stats, announce=self._announcer(r))))
        if not cohort or len(set(cohort)) != len(cohort) or not set(cohort) <= set(self.clients):
            raise RuntimeError(f"selection {self.selection.name!r} returned an invalid client set {cohort}")
        metrics: dict[str, float] = {}
        ctx = self._round(r, cohort, metrics)
        refused_before = len(self.mailbox.refusals)
        self._send_training(r, cohort, self.method.broadcast(ctx))
        try:
            new_global = self.method.aggregate(ctx)
            self.mailbox.flush()
        except AbortedError:
            self._abort(r, cohort)
            raise
        if new_global.shape != self.global_vector.shape:
            raise RuntimeError(f"{type(self.method).__name__}.aggregate returned shape {tuple(new_global.shape)}")
        self.global_vector = new_global.detach().to(torch.float32)
        after = self._round(r, cohort, metrics)
        after.releases = ctx.releases
        self.method.after_round(after)
        source = f"method {type(self.method).__name__}"
        reported = check_round_metrics(metrics, source=source)
        reported.update(check_round_metrics(self.method.round_metrics(), source=source))
        self.next_round = r + 1
        clipped = sum(rel.clipped or 0 for rel in after.releases)
        return RoundOutcome(round=r, selected=cohort, releases=tuple(after.releases), clipped=clipped,
                            seconds=time.perf_counter() - start, metrics=reported,
                            refusals=tuple(self.mailbox.refusals[refused_before:]))

    def _abort(self, r: int, cohort: tuple[int, ...]) -> None:
        """A protocol run of the round could not finish: tell the cohort to drop what it holds of
        the round (its update, the broadcasts), so nothing of it is contributed later."""
        self.mailbox.discard()
        message = RuntimeMessage(kind=Kind.ABORT, round=r, digest=self.digest).message(statistic="abort")
        for pid in cohort:
            self.mailbox.queue(pid, message)
        self.mailbox.flush()

    def evaluate(self) -> dict[str, Any]:
        """Accuracy, per-class and minority accuracy, AUC and test loss of the global model
        on the server's own test set."""
        self.layout.load(self.global_vector)
        model = self.model.model
        model.eval()
        try:
            with torch.inference_mode():
                logits = torch.cat([
                    model(self.x_test[i : i + self.eval_batch_size])
                    for i in range(0, self.x_test.shape[0], self.eval_batch_size)
                ])
                test_loss = float(F.cross_entropy(logits.float(), self.y_test))
        finally:
            model.train()
        scores = logits.float().cpu().numpy()
        if not np.all(np.isfinite(scores)):
            return {"accuracy": None, "per_class_accuracy": [None] * self.info.num_classes,
                    "minority_accuracy": None, "auc": None, "test_loss": None, "diverged": True}
        metrics = evaluate_predictions(self.y_test_np, scores, num_classes=self.info.num_classes,
                                       minority_classes=self.minority_classes or None)
        metrics["test_loss"] = test_loss
        return metrics

    # --- checkpoints ---------------------------------------------------------------------------

    def state(self) -> dict[str, Any]:
        return {"global": self.global_vector, "other": self.layout.other_state(),
                "method": self.method.state_dict(), "selection": self.selection.state_dict(),
                "stats": self.stats.state()}

    def restore_model(self, global_vector: torch.Tensor, other: Mapping[str, torch.Tensor], round: int) -> None:
        if global_vector.shape != self.global_vector.shape:
            raise ValueError("checkpoint belongs to another model (different number of weights)")
        self.global_vector = global_vector.to(self.device, torch.float32)
        self.layout.load(self.global_vector)
        self.layout.load_other(dict(other))
        self.next_round = round + 1
