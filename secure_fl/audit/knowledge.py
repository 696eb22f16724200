"""What the attacker knows of the method: its client half, run on hypothesised clients.

The method and its hyper-parameters are public (threat model), so the attacker builds the
method's client half itself (``Method.client(info)``, and the selection's client half) and asks
it what a client *would* do — never a real client's data:

* **contributions** (:meth:`MethodModel.count_map`): the vector a client with hypothesised label
  counts sends for a statistic. When it is an affine function of the counts the statistic
  reveals them (full rank: the counts; a multiple of ``Σ counts``: the sample count), and the
  attacker inverts it — no list of statistic names;
* **the local objective** (:meth:`MethodModel.objective`): per-class weights and logit shifts
  a client with hypothesised counts trains with, given the broadcast vectors the server sent
  it and the releases the server knows it learned (replayed into the half's ``learned``) —
  FedShift's shift ln(P_i/P) and Ratio Loss's α + β·Ra_p come out of the methods' own code;
* **the update weight** (:meth:`MethodModel.update_weight`): the factor a client of |D_i| = n
  scales its update by (|D_i|/Σ|D_j| from the learned total, or a public 1/K);
* **per-class profiles** (:meth:`MethodModel.class_profile`): a statistic computed from local
  training (CLIMB's loss f_i), evaluated by training the client half on the attacker's own
  auxiliary samples of one class at a time.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

from secure_fl.algorithms import (
    ClientContext,
    ClientData,
    ClientState,
    ContributionContext,
    LocalObjective,
    LocalTrainer,
    LocalUpdate,
    Method,
    RunInfo,
)
from secure_fl.audit.views import Read
from secure_fl.selection.strategy import ClientSelectionContext, SelectionClient, SelectionStrategy
from secure_fl.stats import Learned, StatisticDeclaration

__all__ = ["CountMap", "MethodModel"]

FloatArray = npt.NDArray[np.float64]

@dataclass(frozen=True)
class CountMap:
    """A statistic's contribution as an affine function of the client's label counts: ``A n + b``."""

    matrix: FloatArray
    offset: FloatArray

    @property
    def reveals_counts(self) -> bool:
        """Full column rank: the counts follow from one contribution."""
        return bool(np.linalg.matrix_rank(self.matrix) == self.matrix.shape[1])

    @property
    def reveals_size(self) -> bool:
        """One entry, equal in every class: the contribution is a multiple of |D_i|."""
        row = self.matrix.reshape(-1)
        return self.matrix.shape[0] == 1 and bool(row[0] != 0) and bool(np.allclose(row, row[0]))

    def counts(self, value: npt.ArrayLike, *, contributors: int = 1) -> FloatArray:
        """The non-negative counts behind ``value`` — one contribution, or the sum of
        ``contributors`` of them (then the summed counts) — by least squares."""
        from secure_fl.audit.attacks import nonnegative_solve

        target = np.asarray(value, dtype=np.float64).reshape(-1)[: self.offset.size] - contributors * self.offset
        return nonnegative_solve(self.matrix, target)

    def size(self, value: npt.ArrayLike, *, contributors: int = 1) -> float:
        """|D_i| behind a size statistic's ``value`` (Σ|D_j| behind a sum of ``contributors``)."""
        first = float(np.asarray(value, dtype=np.float64).reshape(-1)[0])
        return (first - contributors * float(self.offset[0])) / float(self.matrix[0, 0])


def _guessed_coins(stream: str, *keys: int) -> np.random.Generator:
    """A hypothesised client's own random draws: the attacker does not know a client's coins."""
    return np.random.default_rng(0)


class MethodModel:
    """The attacker's copies of the method's and the selection's client halves (see the module docstring)."""

    def __init__(self, method: Method, selection: SelectionStrategy, info: RunInfo, *, trainer: LocalTrainer,
                 input_shape: Sequence[int], device: torch.device) -> None:
        self.info = info
        self.half = method.client(info)
        self.strategy = selection
        self.trainer = trainer
        self.input_shape = tuple(input_shape)
        self.device = device
        fresh = self.selection_half()
        self.selection_declarations: dict[str, StatisticDeclaration] = (
            {} if fresh is None else dict(fresh.declarations()))
        self.declarations: dict[str, StatisticDeclaration] = {**self.half.declarations(),
                                                              **self.selection_declarations}
        self.update_statistics: tuple[str, ...] = tuple(self.half.update_statistics)
        self._count_maps: dict[str, CountMap | None] = {}

    @classmethod
    def of(cls, method: Method, selection: SelectionStrategy, info: RunInfo, *, model: torch.nn.Module,
           loss: Any, input_shape: Sequence[int], device: torch.device) -> MethodModel:
        """From the public method, selection, run info, model and loss (the model is copied)."""
        trainer = LocalTrainer(copy.deepcopy(model), training=info.training, loss=loss)
        return cls(method, selection, info, trainer=trainer, input_shape=input_shape, device=device)

    # --- hypothesised clients ----------------------------------------------------------------

    def data(self, counts: npt.ArrayLike, *, client: int = 0, x: torch.Tensor | None = None) -> ClientData:
        """A client holding ``counts`` samples of each class (features: ``x`` or zeros)."""
        n = np.rint(np.clip(np.asarray(counts, dtype=np.float64), 0, None)).astype(np.int64)
        y = torch.from_numpy(np.repeat(np.arange(n.size), n)).to(self.device)
        features = x if x is not None else torch.zeros((int(n.sum()), *self.input_shape), device=self.device)
        return ClientData(client_id=client, x=features, y=y, class_counts=n)

    def selection_half(self, *, learned: Sequence[Learned] = (),
                       heard: Sequence[tuple[str, int, npt.ArrayLike]] = ()) -> SelectionClient | None:
        """A fresh client half of the selection that heard the server's announcements ``heard``
        (name, round, vector) and learned ``learned``; ``None`` when the selection has none."""
        half = self.strategy.client(num_classes=self.info.num_classes)
        if half is None:
            return None
        for name, round, vector in heard:
            if name in half.announcements:
                with contextlib.suppress(Exception):  # an announcement a hypothesised client refuses
                    half.heard(name, round, np.asarray(vector, dtype=np.float32))
        for item in learned:
            with contextlib.suppress(Exception):  # a value this hypothesised client cannot use
                half.learned(item)
        return half

    def _contribute(self, name: str, ctx: ContributionContext, selection: SelectionClient | None = None
                    ) -> FloatArray:
        if name in self.selection_declarations:
            half = selection if selection is not None else self.selection_half()
            assert half is not None
            vector: Any = half.contribution(name, ClientSelectionContext(
                client_id=ctx.client_id, round=ctx.round, counts=np.asarray(ctx.data.class_counts, dtype=np.int64),
                rng=_guessed_coins))
        else:
            vector = self.half.contribution(name, ctx)
        if isinstance(vector, torch.Tensor):
            vector = vector.detach().cpu().numpy()
        return np.asarray(vector, dtype=np.float64).reshape(-1)

    def contribution(self, name: str, counts: npt.ArrayLike, *, round: int = 0,
                     learned: Mapping[str, Learned] | None = None, state: dict[str, Any] | None = None,
                     update: LocalUpdate | None = None, cohort_size: int = 1,
                     selection: SelectionClient | None = None) -> FloatArray:
        """What a client with ``counts`` sends for ``name`` (raises where it needs more than that);
        ``selection``: the selection half to ask (default: a fresh one)."""
        data = self.data(counts)
        ctx = ContributionContext(client_id=0, round=round, data=data, state=state if state is not None else {},
                                  learned=dict(learned or {}), update=update, cohort_size=cohort_size)
        return self._contribute(name, ctx, selection)

    def count_map(self, name: str) -> CountMap | None:
        """``name``'s contribution as an affine function of the counts, if it is one (probed at 0,
        2·e_k and checked at a mixed point); ``None`` when it is not (or needs more than counts)."""
        if name not in self._count_maps:
            self._count_maps[name] = self._probe(name)
        return self._count_maps[name]

    def _probe(self, name: str) -> CountMap | None:
        if name in self.update_statistics or name not in self.declarations:
            return None
        c = self.info.num_classes
        try:
            base = self.contribution(name, np.zeros(c))
            columns = [(self.contribution(name, 2 * np.eye(c)[k]) - base) / 2 for k in range(c)]
            mixed = np.arange(1, c + 1, dtype=np.float64)
            check = self.contribution(name, mixed)
        except Exception:  # noqa: BLE001 -- the half needs more than counts (an update, a learned value)
            return None
        matrix = np.stack(columns, axis=1)
        if not np.allclose(matrix @ mixed + base, check, atol=1e-6) or not np.any(matrix):
            return None
        return CountMap(matrix, base)

    # --- replaying what a client learned -------------------------------------------------------

    def learned_values(self, reads: Sequence[Read]) -> list[Learned]:
        """Released sums a client received, as its half hears them."""
        return [Learned(r.statistic, r.round, r.values, r.contributors, None) for r in reads]

    def state_after(self, learned: Sequence[Learned], *, client: int, counts: npt.ArrayLike) -> dict[str, Any]:
        """A client's state after its halves heard ``learned`` (in order)."""
        state: dict[str, Any] = {}
        data = self.data(counts, client=client)
        by_round: dict[int, dict[str, Learned]] = {}
        for item in learned:
            heard = by_round.setdefault(item.round, {})
            heard[item.name] = item
            ctx = ClientState(client_id=client, round=item.round, data=data, state=state, learned=heard)
            with contextlib.suppress(Exception):  # a value this hypothesised client cannot use
                self.half.learned(item, ctx)
        return state

    # --- training ------------------------------------------------------------------------------

    def _context(self, data: ClientData, *, round: int, start: torch.Tensor, state: dict[str, Any],
                 broadcast: Mapping[str, npt.ArrayLike]) -> ClientContext:
        return ClientContext(
            round=round, data=data, state=state, global_vector=start.to(self.device, torch.float32),
            broadcast={k: torch.as_tensor(np.asarray(v), dtype=torch.float32, device=self.device)
                       for k, v in broadcast.items()},
            lr=self.info.training.lr_at(round), info=self.info, trainer=self.trainer,
            shuffle=torch.Generator(device=self.device).manual_seed(round),
        )

    def objective(self, counts: npt.ArrayLike, *, round: int, start: torch.Tensor, learned: Sequence[Learned],
                  broadcast: Mapping[str, npt.ArrayLike]) -> LocalObjective:
        """The objective a client holding ``counts`` trains with in ``round`` (plain training when
        the half cannot answer for this client)."""
        state = self.state_after(learned, client=0, counts=counts)
        try:
            result = self.half.local_objective(self._context(self.data(counts), round=round, start=start,
                                                             state=state, broadcast=broadcast))
        except Exception:  # noqa: BLE001 -- fall back to the plain objective
            return LocalObjective()
        return result

    def update_weight(self, size: float, *, round: int, learned: Mapping[str, Learned], cohort_size: int,
                      statistic: str) -> float | None:
        """The factor a client of ``size`` samples scales its update by (``None``: unknown)."""
        counts = np.zeros(self.info.num_classes)
        counts[0] = max(size, 0.0)
        unit = LocalUpdate(delta=torch.ones(1, dtype=torch.float64), num_samples=int(size), steps=1, loss=0.0)
        try:
            value = self.contribution(statistic, counts, round=round, learned=learned, update=unit,
                                      cohort_size=cohort_size)
        except Exception:  # noqa: BLE001 -- e.g. the round's total is not known
            return None
        return float(value[0])

    def class_profile(self, name: str, *, round: int, start: torch.Tensor, aux_x: torch.Tensor,
                      aux_y: torch.Tensor, learned: Sequence[Learned], broadcast: Mapping[str, npt.ArrayLike],
                      cohort_size: int) -> FloatArray | None:
        """(C, length): row k is ``name`` as a client holding only the attacker's class-k samples
        sends it in ``round`` (trained from ``start``); ``None`` when the half sends nothing then."""
        rows = []
        labels = aux_y.cpu().numpy()
        for k in range(self.info.num_classes):
            mask = torch.from_numpy(labels == k).to(aux_x.device)
            counts = np.bincount(labels[labels == k], minlength=self.info.num_classes)
            data = self.data(counts, x=aux_x[mask].to(self.device))
            state = self.state_after(learned, client=0, counts=counts)
            try:
                update = self.half.train(self._context(data, round=round, start=start, state=state,
                                                       broadcast=broadcast))
                ctx = ContributionContext(client_id=0, round=round, data=data, state=state,
                                          learned={x.name: x for x in learned if x.round == round},
                                          update=update, cohort_size=cohort_size)
                rows.append(self._contribute(name, ctx))
            except Exception:  # noqa: BLE001 -- the half sends nothing for this statistic now
                return None
        return np.stack(rows)
