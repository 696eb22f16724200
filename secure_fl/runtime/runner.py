"""Runs of an experiment, executed in turn, each round written to the store as it ends.

:func:`run_experiment` registers the experiment's runs as one batch (or, with ``resume``,
finds the batch of that run and checks the config still describes it), then executes every
run that is not done: a run with a checkpoint continues after its last stored round. Each
round's metrics, bytes and checkpoint are committed together, so a run killed at any
instant — SIGKILL included — resumes to the same final metrics as an uninterrupted run.
:func:`summarize` turns a stored run into the JSON contract's ``final`` / ``tail`` summary
(plus ``privacy`` when the run used DP and ``metrics`` when its method reported any).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import torch

from secure_fl.config import ExperimentConfig, RunConfig
from secure_fl.data import Dataset
from secure_fl.runtime.build import build_simulation, load_run_dataset
from secure_fl.runtime.parallel import Workers, run_in_workers
from secure_fl.store import ReleaseRow, RoundPrivacy, RoundRow, RunRow, RunStore, StoreError

__all__ = ["CLIP_WARNING", "Executor", "Harness", "RunObserver", "RunSummary", "describe_error", "describe_run",
           "execute_run", "resumed_batch", "run_experiment", "summarize"]

log = logging.getLogger("secure_fl.run")

CLIP_WARNING = 0.01
"""A run warns (once) when more than this fraction of a statistic's summed values were clipped."""


class RunObserver(Protocol):
    """Progress callbacks (the CLI draws progress bars with them)."""

    def run_started(self, run: RunRow, *, position: int, total: int, start_round: int) -> None: ...

    def client_finished(self, run: RunRow, round: int, done: int, total: int) -> None: ...

    def round_finished(self, run: RunRow, row: RoundRow) -> None: ...

    def run_finished(self, run: RunRow, summary: RunSummary) -> None: ...


Harness = Callable[[RunConfig, torch.device, Dataset], Any]
"""Builds what plays a run's rounds for the runner (the embedded Simulation, or a distributed engine's server)."""

Executor = Callable[..., "RunSummary"]
"""Runs one stored run (:func:`execute_run`'s signature); an engine that runs elsewhere passes its own."""

METRIC_KEYS = ("accuracy", "minority_accuracy", "auc", "per_class_accuracy")


@dataclass(frozen=True)
class RunSummary:
    """A run as the JSON contract reports it; accuracies are fractions."""

    id: str
    name: str
    label: str
    method: str
    loss: str
    protocol: str
    update_protocol: str
    seed: int
    rounds: int
    status: str
    final: dict[str, Any]
    tail: dict[str, Any]
    tail_rounds: int
    bytes_total: int
    bytes_by_statistic: dict[str, int] = field(default_factory=dict)
    bytes_by_stage: dict[str, dict[str, int]] = field(default_factory=dict)
    """Bytes by statistic, then protocol stage (empty for runs stored before schema 5)."""
    statistics: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Per statistic: the protocol it went through, its bytes, the entries clipped (``None``
    when not counted, e.g. noised) and the number of releases."""
    history: tuple[RoundRow, ...] = ()
    privacy: dict[str, Any] | None = None
    """Only when the run used DP: ``epsilon`` / ``delta`` (the worst client's DP-SGD ε; without
    DP-SGD the run's composed ε), ``epsilon_mean``, ``statistics`` and ``run`` when noised."""
    metrics: dict[str, Any] | None = None
    """Only when the method reported round metrics: ``final`` and ``tail`` (mean) per name."""
    planned: dict[str, str] = field(default_factory=dict)
    """The protocol the run's plan gives each statistic (model-sized sums excluded), from its config."""
    selection: str = "random"
    """The run's selection strategy (its registry name)."""
    selection_statistics: tuple[str, ...] = ()
    """The statistics the selection strategy (not the method) asks the clients for."""
    error: str | None = None
    """Why the run failed (``status == "failed"``), one line."""

    def as_json(self) -> dict[str, Any]:
        out = {
            "id": self.id, "name": self.name, "label": self.label, "method": self.method, "loss": self.loss,
            "protocol": self.protocol, "update_protocol": self.update_protocol, "seed": self.seed,
            "rounds": self.rounds, "status": self.status, "final": self.final, "tail": self.tail,
            "tail_rounds": self.tail_rounds,
            "bytes": {"total": self.bytes_total, "by_statistic": self.bytes_by_statistic,
                      "by_stage": self.bytes_by_stage},
            "statistics": self.statistics, "selection": self.selection, "error": self.error,
        }
        if self.privacy is not None:
            out["privacy"] = self.privacy
        if self.metrics is not None:
            out["metrics"] = self.metrics
        return out


def _mean(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None and math.isfinite(v)]
    if len(present) != len(values) or not present:
        return None
    return sum(present) / len(present)


def _metrics(rows: Sequence[RoundRow]) -> dict[str, Any]:
    if not rows:
        return {k: None for k in METRIC_KEYS}
    width = max(len(r.per_class_accuracy) for r in rows)
    per_class = [_mean([r.per_class_accuracy[k] if k < len(r.per_class_accuracy) else None for r in rows])
                 for k in range(width)]
    return {
        "accuracy": _mean([r.accuracy for r in rows]),
        "minority_accuracy": _mean([r.minority_accuracy for r in rows]),
        "auc": _mean([r.auc for r in rows]),
        "per_class_accuracy": per_class,
    }


def _guarantee(p: RoundPrivacy) -> dict[str, Any]:
    return {"epsilon": p.epsilon, "delta": p.delta, "releases": p.releases}


def _privacy(rows: Sequence[RoundRow]) -> dict[str, Any] | None:
    """The last round's privacy (spent so far) in the JSON contract's ``privacy`` object."""
    last = next((r.privacy for r in reversed(rows) if r.privacy), None)
    if not last:
        return None
    from secure_fl.privacy import MODEL, RUN

    out: dict[str, Any] = {}
    model, run = last.get(MODEL), last.get(RUN)
    headline = model if model is not None else run
    if headline is not None:
        out["epsilon"], out["delta"] = headline.epsilon, headline.delta
    if model is not None:
        out["epsilon_mean"] = model.epsilon_mean
        out["dp_sgd_steps"] = model.releases
    statistics = {name: _guarantee(p) for name, p in sorted(last.items()) if name not in (MODEL, RUN)}
    if statistics:
        out["statistics"] = statistics
    if run is not None:
        out["run"] = _guarantee(run)
    return out


def _method_metrics(rows: Sequence[RoundRow], tail_rounds: int) -> dict[str, Any] | None:
    names = sorted({name for r in rows for name in r.metrics})
    if not names:
        return None
    tail = rows[-tail_rounds:]
    return {
        "final": {name: rows[-1].metrics.get(name) for name in names},
        "tail": {name: _mean_present([r.metrics.get(name) for r in tail]) for name in names},
    }


def _mean_present(values: Sequence[float | None]) -> float | None:
    """Mean over the rounds that have the value (a method may report a metric every k rounds)."""
    present = [v for v in values if v is not None and math.isfinite(v)]
    return sum(present) / len(present) if present else None


def _statistics(rows: Sequence[RoundRow]) -> dict[str, dict[str, Any]]:
    """Per statistic: protocol, bytes (every message labelled with it, the ``reuse`` pointers of a
    repeated release included), releases, ``clipped`` (entries clipped in all its releases;
    ``None`` when not counted: noised), ``values`` (entries summed: entries × contributors, over
    its releases; ``None`` when unknown) and ``clipped_fraction`` = clipped / values."""
    out: dict[str, dict[str, Any]] = {}
    for row in rows:
        for release in row.releases:
            entry = out.setdefault(release.statistic, {"protocol": release.protocol, "bytes": 0, "clipped": 0,
                                                       "releases": 0, "values": 0})
            if entry["protocol"] != release.protocol:
                entry["protocol"] = "mixed"
            entry["bytes"] += release.bytes
            entry["releases"] += 1
            entry["clipped"] = None if entry["clipped"] is None or release.clipped is None \
                else entry["clipped"] + release.clipped
            entry["values"] = None if entry["values"] is None or release.values is None \
                else entry["values"] + release.values
    for name, entry in out.items():
        # the transcript's count holds the releases' bytes and the pointers; max: rows stored without it
        entry["bytes"] = max(entry["bytes"], sum(row.bytes.get(name, 0) for row in rows))
        clipped, values = entry["clipped"], entry["values"]
        entry["clipped_fraction"] = clipped / values if clipped is not None and values else (
            0.0 if clipped == 0 else None)
    return dict(sorted(out.items()))


def over_clipped(statistics: dict[str, dict[str, Any]], limit: float = CLIP_WARNING) -> dict[str, float]:
    """Statistics more than ``limit`` of whose summed values were clipped: name → fraction."""
    return {name: entry["clipped_fraction"] for name, entry in statistics.items()
            if entry.get("clipped_fraction") is not None and entry["clipped_fraction"] > limit}


def summarize(store: RunStore, run_id: str) -> RunSummary:
    """``final`` = the last stored round, ``tail`` = the mean over the last ``tail_rounds`` rounds."""
    run = store.run(run_id)
    rows = store.rounds(run_id)
    tail_rounds = int(run.config.get("tail_rounds", 5))
    planned, selection_statistics = _planned(run.config)
    by_statistic: dict[str, int] = {}
    by_stage: dict[str, dict[str, int]] = {}
    for row in rows:
        for name, n in row.bytes.items():
            by_statistic[name] = by_statistic.get(name, 0) + n
        for name, stages in row.stage_bytes.items():
            total = by_stage.setdefault(name, {})
            for stage, n in stages.items():
                total[stage] = total.get(stage, 0) + n
    return RunSummary(
        id=run.id, name=run.name, label=run.label, method=run.method, loss=run.loss, protocol=run.protocol,
        update_protocol=run.update_protocol, seed=run.seed, rounds=len(rows), status=run.status,
        final=_metrics(rows[-1:]), tail=_metrics(rows[-tail_rounds:]), tail_rounds=tail_rounds,
        bytes_total=sum(by_statistic.values()), bytes_by_statistic=dict(sorted(by_statistic.items())),
        bytes_by_stage={name: dict(sorted(stages.items())) for name, stages in sorted(by_stage.items())},
        statistics=_statistics(rows), history=tuple(rows), privacy=_privacy(rows), metrics=_method_metrics(rows, tail_rounds),
        planned=planned, selection=_selection_name(run.config), selection_statistics=selection_statistics,
        error=run.error,
    )


def _selection_name(config: dict[str, Any]) -> str:
    selection = config.get("selection", "random")
    return str(selection.get("name", "random") if isinstance(selection, dict) else selection)


def _planned(config: dict[str, Any]) -> tuple[dict[str, str], tuple[str, ...]]:
    """:func:`~secure_fl.config.planned_protocols` of a stored config and the names of its selection's
    statistics (({}, ()) if the config no longer resolves)."""
    from secure_fl.config import (
        SELECTION,
        SELECTION_SESSION,
        ConfigError,
        declared_statistics,
        planned_protocols,
    )

    try:
        run = RunConfig.from_dict(config)
        kinds = declared_statistics(run)
        return planned_protocols(run), tuple(sorted(n for n, k in kinds.items() if k in (SELECTION, SELECTION_SESSION)))
    except (ConfigError, TypeError, ValueError, KeyError):
        return {}, ()


def describe_error(error: BaseException) -> str:
    """One line for a run's failure: the message of the errors a user can act on (a config, the
    data, the store, a protocol's refusal), the exception's type and message otherwise."""
    from protocols import ProtocolError
    from secure_fl.config import ConfigError
    from secure_fl.data import DataError

    if isinstance(error, KeyboardInterrupt):
        return "interrupted"
    text = " ".join(str(error).split()) or "(no message)"
    if isinstance(error, (ConfigError, DataError, StoreError, ProtocolError)):
        return text
    return f"{type(error).__name__}: {text}"


def execute_run(
    store: RunStore,
    run_id: str,
    config: RunConfig,
    *,
    device: torch.device,
    dataset: Dataset | None = None,
    observer: RunObserver | None = None,
    position: int = 0,
    total: int = 1,
    harness: Harness | None = None,
) -> RunSummary:
    """Run (or continue) one stored run to its last round.

    ``harness`` builds what plays the rounds (default: the embedded engine's
    :func:`~secure_fl.runtime.build.build_simulation`); a distributed engine passes the server's
    side of its run (:class:`secure_fl.flower.server.FlowerServer`).

    A run that raises — while it is built or in any round, Ctrl-C included — is marked ``failed`` in
    the store with the reason (:func:`describe_error`) before the error propagates; its stored
    rounds stay, and ``--resume`` continues it after the last one.
    """
    run = store.run(run_id)
    try:
        _execute(store, run, config, device=device, dataset=dataset, observer=observer, position=position,
                 total=total, harness=harness or _embedded)
    except BaseException as error:
        try:
            store.set_status(run_id, "failed", error=describe_error(error))
        except StoreError:  # the store itself failed: the original error says more
            pass
        raise
    store.set_status(run_id, "done")
    summary = summarize(store, run_id)
    if observer is not None:
        observer.run_finished(run, summary)
    return summary


def _execute(store: RunStore, run: RunRow, config: RunConfig, *, device: torch.device, dataset: Dataset | None,
             observer: RunObserver | None, position: int, total: int, harness: Harness) -> None:
    run_id = run.id
    if dataset is None:
        dataset = load_run_dataset(config)
    sim = harness(config, device, dataset)
    checkpoint = store.checkpoint(run_id)
    if checkpoint is not None:
        if checkpoint.round + 1 != run.rounds_done:
            raise StoreError(f"run {run_id}: checkpoint of round {checkpoint.round} but {run.rounds_done} rounds stored")
        sim.prepare_resume(checkpoint)  # before setup: its noisy releases are replayed, not redrawn
    elif run.rounds_done:
        raise StoreError(f"run {run_id}: {run.rounds_done} rounds stored but no checkpoint to resume from")
    sim.setup()
    if checkpoint is not None:
        sim.restore(checkpoint)
    store.set_status(run_id, "running", device=str(device))
    if observer is not None:
        observer.run_started(run, position=position, total=total, start_round=sim.next_round)
        sim.on_client = lambda r, done, selected: observer.client_finished(run, r, done, selected)
    history = list(store.rounds(run_id)) if checkpoint is not None else []
    warned = bool(over_clipped(_statistics(history)))  # a resumed run warned before
    while sim.next_round < config.train.rounds:
        start = time.perf_counter()
        result = sim.run_round()
        metrics = sim.evaluate()
        declared = sim.stats.declarations
        row = RoundRow(
            round=result.round, accuracy=metrics["accuracy"], minority_accuracy=metrics["minority_accuracy"],
            auc=metrics["auc"], train_loss=result.train_loss, test_loss=metrics["test_loss"],
            per_class_accuracy=list(metrics["per_class_accuracy"]), clients=list(result.selected),
            clipped=result.clipped, seconds=time.perf_counter() - start,
            bytes=sim.stats.bytes_by_statistic(result.round), stage_bytes=_stage_bytes(sim, result.round),
            privacy=result.privacy,
            # the method's metrics and, named sim.*, the harness's simulator telemetry
            metrics={**result.metrics, **result.telemetry},
            releases=[ReleaseRow(statistic=r.name, protocol=r.protocol, contributors=len(r.contributors),
                                 dropouts=len(r.dropouts), clipped=r.clipped, bytes=r.bytes,
                                 entries=declared[r.name].length if r.name in declared else None)
                      for r in result.releases if r.reused_from is None],  # a repeat released nothing
        )
        store.record_round(run_id, row, sim.checkpoint(), _declarations(sim))
        history.append(row)
        if observer is not None:
            observer.round_finished(run, row)
        if not warned:
            warned = _warn_clipping(run, config, history, declared)


def _embedded(config: RunConfig, device: torch.device, dataset: Dataset) -> Any:
    return build_simulation(config, device=device, dataset=dataset)


def _stage_bytes(sim: Any, round: int) -> dict[str, dict[str, int]]:
    """The round's transcript bytes by statistic, then protocol stage."""
    out: dict[str, dict[str, int]] = {}
    for (statistic, stage), count in sorted(sim.transcript.round_bytes(round).items()):
        out.setdefault(statistic, {})[stage] = count
    return out


def _warn_clipping(run: RunRow, config: RunConfig, history: Sequence[RoundRow], declared: Any) -> bool:
    """Log one warning when more than :data:`CLIP_WARNING` of a statistic's values were clipped."""
    over = over_clipped(_statistics(history))
    if not over:
        return False
    parts = []
    for name, fraction in sorted(over.items()):
        declaration = declared.get(name)
        bound = f" to ±{declaration.bound:g}" if declaration is not None else ""
        parts.append(f"{name} {100 * fraction:.1f} %{bound}")
    updates = {"model_update", "control_update"} & set(over)
    hint = (f"raise secure.update_clip (now {config.secure.update_clip:g}) so that model updates fit"
            if updates else "the clients' values exceed the declared bounds; check the method's bound parameters")
    log.warning("run %s: more than %g %% of the values summed were clipped (%s): the aggregate is biased; %s",
                run.id, 100 * CLIP_WARNING, ", ".join(parts), hint)
    return True


def _declarations(sim: Any) -> dict[str, dict[str, Any]]:
    """Declarations as stored for the audit, with the protocol the run's plan gives each; a
    noised statistic also gets its ``privacy`` calibration (``NoisySum.describe()``: mechanism,
    σ, sensitivity, widened bound)."""
    out = {}
    for name, declaration in sim.stats.declarations.items():
        entry = declaration.as_dict()
        # the protocol its releases went through (a strategy's own session may differ from the plan's)
        entry["protocol"] = next((r.protocol for r in reversed(sim.stats.records) if r.name == name),
                                 sim.plan.protocol_for(declaration))
        noisy = sim.stats.noisy.get(name)
        if noisy is not None:
            entry["privacy"] = noisy.describe()
        out[name] = entry
    return out


def describe_run(config: RunConfig) -> dict[str, Any]:
    """A run as :meth:`RunStore.create_batch` registers it."""
    return _describe(config)


def _describe(config: RunConfig) -> dict[str, Any]:
    return {
        "name": config.name, "label": config.label, "config": config.to_dict(), "method": config.method.name,
        "loss": config.loss.name, "protocol": config.secure.protocol,
        "update_protocol": config.secure.update_protocol, "seed": config.seed, "rounds": config.train.rounds,
    }


def _first_difference(a: Any, b: Any, path: str = "") -> str:
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b)):
            if key not in a or key not in b or a[key] != b[key]:
                return _first_difference(a.get(key), b.get(key), f"{path}.{key}" if path else key)
    return f"{path or '<config>'}: stored {a!r}, file has {b!r}"


def resumed_batch(store: RunStore, experiment: ExperimentConfig, run_id: str) -> list[RunRow]:
    """The stored runs of the batch ``run_id`` belongs to, checked against ``experiment`` (the same
    runs, the same configs): what ``--resume`` continues."""
    rows = store.batch_runs(store.run(run_id).batch_id)
    if len(rows) != len(experiment.runs):
        raise StoreError(f"run {run_id} belongs to a batch of {len(rows)} runs; "
                         f"{experiment.source} defines {len(experiment.runs)}")
    for row, config in zip(rows, experiment.runs):
        expected = RunConfig.from_dict(row.config).to_dict()
        if expected != config.to_dict():
            raise StoreError(f"{experiment.source} no longer matches stored run {row.id}: "
                             f"{_first_difference(expected, config.to_dict())}")
    return rows


def run_experiment(
    experiment: ExperimentConfig,
    store: RunStore,
    *,
    device: torch.device,
    resume: str | None = None,
    observer: RunObserver | None = None,
    on_failure: Literal["raise", "continue", "stop"] = "raise",
    executor: Executor | None = None,
    workers: Workers | None = None,
) -> list[RunSummary]:
    """Execute the experiment's runs in turn; with ``resume``, continue that run's batch.

    A run that fails is marked ``failed`` in the store with its reason. ``on_failure``: ``raise``
    the error (the remaining runs stay pending); ``continue`` with the next run (the failure is
    logged as one line, its traceback at debug level); ``stop`` the batch there. Either way the
    summaries of the runs executed or found done come back, the failed ones with ``status ==
    "failed"`` and ``error``. Ctrl-C always propagates.

    ``workers`` with a count above one plays the unfinished runs that many at a time, each in its
    own process (:mod:`secure_fl.runtime.parallel`; ``observer`` is then unused: each worker makes
    its own); the results are the same runs' to the bit. Runs already running when one fails end
    first, whatever ``on_failure`` says.
    """
    if resume is None:
        _, run_ids = store.create_batch(name=experiment.name, source=experiment.source,
                                        runs=[_describe(c) for c in experiment.runs])
        rows = [store.run(i) for i in run_ids]
    else:
        rows = resumed_batch(store, experiment, resume)
    unfinished = [(k, row, config) for k, (row, config) in enumerate(zip(rows, experiment.runs))
                  if row.status != "done"]
    if workers is not None and workers.count > 1 and len(unfinished) > 1:
        run_in_workers(unfinished, total=len(rows), store_path=str(store.path), device=str(device), workers=workers,
                       executor=executor, on_failure=on_failure)
        return [summarize(store, row.id) for row in rows if store.run(row.id).status != "pending"]
    summaries = []
    datasets: dict[tuple[Any, ...], Dataset] = {}
    for position, (row, config) in enumerate(zip(rows, experiment.runs)):
        if row.status == "done":
            summaries.append(summarize(store, row.id))
            continue
        key = (config.data.dataset, config.data.root, config.data_seed, config.data.test_fraction,
               config.data.test_samples)
        try:
            if key not in datasets:
                datasets.clear()  # one dataset in memory at a time
                try:
                    datasets[key] = load_run_dataset(config)
                except BaseException as error:
                    store.set_status(row.id, "failed", error=describe_error(error))
                    raise
            summaries.append((executor or execute_run)(store, row.id, config, device=device, dataset=datasets[key],
                                                       observer=observer, position=position, total=len(rows)))
        except Exception as error:
            if on_failure == "raise":
                raise
            label = f" ({row.label})" if row.label else ""
            log.error("run %s (%d/%d)%s failed: %s", row.id, position + 1, len(rows), label, describe_error(error))
            log.debug("traceback of run %s", row.id, exc_info=True)
            summaries.append(summarize(store, row.id))
            if on_failure == "stop":
                break
    return summaries
