"""Report core: finished runs from the run store → paper-shaped Markdown tables and plots.

This module is the stable API the per-paper formatters build on (``secure_fl/report/<paper>.py``).
Everything here reads the run store; nothing trains or re-runs anything.

Loading runs
    :func:`load_runs(sources, *, store=None, workspace=None, statuses=("done",))
    <load_runs>` → ``list[RunRecord]``. Each source string is, in this order of trial:

    * a TOML config file (``experiments/fedshift/table1.toml``): every run the file defines
      is matched to the most recent stored run with the *same resolved config* (so a table
      may be run in several invocations, or resumed); :class:`MissingRunsError` names what
      is missing unless ``allow_missing=True``;
    * a run id, or several joined by commas (``3fa2c1d0,77be01aa``);
    * a batch id (every run one ``secure-fl run`` invocation started);
    * a run name (the config's top-level ``name``, e.g. ``fedshift-table1``): every stored
      run of that name.

    Runs are de-duplicated by resolved config (the most recent wins) and returned in the
    order the sources list them.

:class:`RunRecord`
    A read-only view of one stored run: ``id``, ``batch_id``, ``name``, ``label``, ``method``
    (registry name), ``method_label`` (display name, :data:`METHOD_LABELS`), ``loss``,
    ``protocol``, ``update_protocol``, ``statistic_protocols`` / ``protocol_summary`` (per-statistic
    overrides), ``seed``, ``status``, ``config`` (the resolved config dict), ``history`` (``tuple[RoundRow]``, see :mod:`secure_fl.store`), ``tail_rounds``;
    ``final`` / ``tail`` (dicts of ``accuracy``, ``minority_accuracy``, ``auc``,
    ``per_class_accuracy`` — the same summary as ``secure-fl run --json``, fractions),
    ``best`` (each of those at its best round, see :data:`SUMMARIES`),
    ``curve(metric)`` (per-round values as a float array, NaN where missing),
    ``param("train.local_epochs")`` (any dotted config key), ``bytes_total``.

Paper tables
    :data:`TABLES` maps a table name to a :class:`TableSpec`; add one with::

        @register_table("fedshift-table1", title="...", description="...")
        def table1(runs: Sequence[RunRecord], ctx: TableContext) -> TableReport: ...

    The formatter gets the loaded runs and a :class:`TableContext` (``out_dir`` where
    figures go — None means "do not draw", ``metric`` one of :data:`SUMMARIES`,
    ``options`` from ``--option key=value``) and returns a :class:`TableReport`
    (``markdown``, ``figures`` written, ``data`` JSON-able). Formatter modules are any
    module of this package other than ``core``; :func:`load_plugins` imports them all
    (a module whose own import fails is reported, never hidden). :func:`get_table` does
    that lazily. The generic ``runs`` table lists every run.

Helpers (pure functions; accuracies are fractions in, percentages out where formatted)
    :func:`markdown_table` (headers + rows → GitHub Markdown), :func:`mean_std`,
    :func:`format_mean_std` (``"83.52 ± 0.40"``), :func:`group_runs` (by a key
    function or a dotted config key), :func:`summary_value` (a run's tail/final/best metric),
    :func:`pivot` (row key × column key → mean ± std over seeds, as Markdown),
    :func:`mean_curve`, :func:`plot_curves` (mean ± std band per series, matplotlib Agg
    → PNG), :func:`rounds_to_reach` (first round, 1-based, whose value reaches a target),
    :func:`speedup`, :func:`row_labeler` (method name + the config keys that split its runs).

One call
    :func:`build_report(sources, table, *, out_dir, metric, options, workspace, store,
    allow_missing) <build_report>` → ``(TableReport, runs)``; with ``out_dir`` it also writes
    ``<table>.md`` there. ``secure-fl report`` is a thin shell around it.
"""

from __future__ import annotations

import importlib
import json
import math
import pkgutil
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from secure_fl.store import DB_NAME, RoundRow, RunRow, RunStore, StoreError, workspace_path

__all__ = [
    "METHOD_LABELS",
    "METRICS",
    "SUMMARIES",
    "TABLES",
    "MissingRunsError",
    "ReportError",
    "RunRecord",
    "TableContext",
    "TableReport",
    "TableSpec",
    "build_report",
    "format_mean_std",
    "format_percent",
    "get_table",
    "group_runs",
    "load_plugins",
    "load_runs",
    "markdown_table",
    "mean_curve",
    "mean_std",
    "method_label",
    "pivot",
    "plot_curves",
    "register_table",
    "rounds_to_reach",
    "row_labeler",
    "speedup",
    "summary_value",
]

METRICS = ("accuracy", "minority_accuracy", "auc", "train_loss", "test_loss")
"""Per-round metrics a :class:`RoundRow` holds (besides per-class accuracy)."""

SUMMARIES = ("tail", "final", "best")
"""How a run's rounds become one number (``--metric``): the mean of the last ``tail_rounds``
rounds, the last round, or the best round (optimistic: chosen on the test set)."""

METHOD_LABELS: dict[str, str] = {
    "fedavg": "FedAvg",
    "fedprox": "FedProx",
    "scaffold": "SCAFFOLD",
    "fedshift": "FedShift",
    "reweighting": "Reweighting",
    "climb": "CLIMB",
    "ratio_loss": "Ratio Loss",
}
"""Display names of registry method names; formatter modules may add theirs."""


class ReportError(ValueError):
    """Runs cannot be found or a table cannot be made from them; the message says why."""


class MissingRunsError(ReportError):
    """A config's runs are not all in the store (``missing`` lists their labels)."""

    def __init__(self, message: str, missing: Sequence[str]) -> None:
        super().__init__(message)
        self.missing = tuple(missing)


def method_label(name: str) -> str:
    return METHOD_LABELS.get(name, name)


# --- the run view -------------------------------------------------------------------------------

def _mean_or_none(values: Sequence[float | None]) -> float | None:
    present = [float(v) for v in values if v is not None and math.isfinite(v)]
    if not values or len(present) != len(values):
        return None
    return sum(present) / len(present)


def _max_or_none(values: Sequence[float | None]) -> float | None:
    present = [float(v) for v in values if v is not None and math.isfinite(v)]
    return max(present) if present else None


def _summary(rows: Sequence[RoundRow]) -> dict[str, Any]:
    if not rows:
        return {"accuracy": None, "minority_accuracy": None, "auc": None, "per_class_accuracy": []}
    width = max(len(r.per_class_accuracy) for r in rows)
    return {
        "accuracy": _mean_or_none([r.accuracy for r in rows]),
        "minority_accuracy": _mean_or_none([r.minority_accuracy for r in rows]),
        "auc": _mean_or_none([r.auc for r in rows]),
        "per_class_accuracy": [
            _mean_or_none([r.per_class_accuracy[k] if k < len(r.per_class_accuracy) else None for r in rows])
            for k in range(width)
        ],
    }


_MISSING = object()


@dataclass(frozen=True, eq=False)
class RunRecord:
    """One stored run, read-only: identity, resolved config and per-round history."""

    id: str
    batch_id: str
    name: str
    label: str
    method: str
    loss: str
    protocol: str
    update_protocol: str
    seed: int
    status: str
    config: Mapping[str, Any]
    history: tuple[RoundRow, ...]
    planned_rounds: int
    created: float = 0.0

    @classmethod
    def from_store(cls, store: RunStore, run: RunRow | str) -> RunRecord:
        row = store.run(run) if isinstance(run, str) else run
        return cls(
            id=row.id, batch_id=row.batch_id, name=row.name, label=row.label, method=row.method, loss=row.loss,
            protocol=row.protocol, update_protocol=row.update_protocol, seed=row.seed, status=row.status,
            config=row.config, history=tuple(store.rounds(row.id)), planned_rounds=row.rounds,
            created=row.created,
        )

    @property
    def method_label(self) -> str:
        return method_label(self.method)

    @property
    def rounds(self) -> int:
        """Rounds stored (equals ``planned_rounds`` for a finished run)."""
        return len(self.history)

    @property
    def tail_rounds(self) -> int:
        return int(self.config.get("tail_rounds", 5))

    @property
    def final(self) -> dict[str, Any]:
        """Metrics of the last stored round (the JSON contract's ``final``)."""
        return _summary(self.history[-1:])

    @property
    def tail(self) -> dict[str, Any]:
        """Mean over the last ``tail_rounds`` stored rounds (the JSON contract's ``tail``)."""
        return _summary(self.history[-self.tail_rounds:])

    @property
    def best(self) -> dict[str, Any]:
        """Each metric's maximum over the stored rounds; per-class accuracy of the best-accuracy round.

        The FedShift paper's own summary ("we take the best performance of each method"). It is
        picked on the test set, so it flatters every method, noisy ones most.
        """
        summary: dict[str, Any] = {key: _max_or_none([getattr(r, key) for r in self.history])
                                   for key in ("accuracy", "minority_accuracy", "auc")}
        scored = [r for r in self.history if r.accuracy is not None and math.isfinite(r.accuracy)]
        top = max(scored, key=lambda r: r.accuracy or 0.0) if scored else None
        summary["per_class_accuracy"] = list(top.per_class_accuracy) if top is not None else []
        return summary

    @property
    def bytes_total(self) -> int:
        return sum(r.bytes_total for r in self.history)

    @property
    def statistic_protocols(self) -> dict[str, str]:
        """Per-statistic protocol overrides (``[secure.statistics]``); others use ``protocol``."""
        return dict(self.param("secure.statistics", {}) or {})

    @property
    def protocol_summary(self) -> str:
        """``protocol`` plus its overrides, e.g. ``plain (label_histogram: paillier)``."""
        overrides = self.statistic_protocols
        if not overrides:
            return self.protocol
        return f"{self.protocol} ({', '.join(f'{k}: {v}' for k, v in sorted(overrides.items()))})"

    def curve(self, metric: str = "accuracy") -> np.ndarray:
        """Per-round values of ``metric`` (float64, NaN where a round has none)."""
        if metric not in METRICS:
            raise ReportError(f"unknown metric {metric!r}; known: {', '.join(METRICS)}")
        values = [getattr(r, metric) for r in self.history]
        return np.array([np.nan if v is None else float(v) for v in values], dtype=np.float64)

    def param(self, path: str, default: Any = _MISSING) -> Any:
        """A value of the resolved config by dotted key (``data.partition_params.alpha``)."""
        node: Any = self.config
        for key in path.split("."):
            if isinstance(node, Mapping) and key in node:
                node = node[key]
            elif default is not _MISSING:
                return default
            else:
                raise ReportError(f"run {self.id} has no config key {path!r}")
        return node

    def config_key(self, *, ignore: Iterable[str] = ()) -> str:
        """The resolved config as canonical JSON, without the dotted keys in ``ignore``."""
        config = json.loads(json.dumps(self.config))
        for path in ignore:
            node = config
            keys = path.split(".")
            for key in keys[:-1]:
                node = node.get(key, {}) if isinstance(node, dict) else {}
            if isinstance(node, dict):
                node.pop(keys[-1], None)
        return json.dumps(config, sort_keys=True)

    def as_json(self, *, history: bool = False) -> dict[str, Any]:
        out: dict[str, Any] = {
            "id": self.id, "batch_id": self.batch_id, "name": self.name, "label": self.label,
            "method": self.method, "loss": self.loss, "protocol": self.protocol,
            "update_protocol": self.update_protocol, "statistic_protocols": self.statistic_protocols,
            "seed": self.seed, "status": self.status, "rounds": self.rounds, "final": self.final, "tail": self.tail, "tail_rounds": self.tail_rounds,
        }
        if history:
            out["accuracy_per_round"] = [r.accuracy for r in self.history]
        return out


# --- loading ------------------------------------------------------------------------------------

def _canonical(config: Mapping[str, Any]) -> str:
    return json.dumps(config, sort_keys=True)


def _newest_first(rows: Iterable[RunRow]) -> list[RunRow]:
    return sorted(rows, key=lambda r: (r.created, r.updated), reverse=True)


def _from_config_file(store: RunStore, path: Path, statuses: Sequence[str],
                      allow_missing: bool, assignments: Sequence[tuple[str, Any]] = ()) -> list[RunRow]:
    from secure_fl.config import ConfigError, RunConfig, load_config

    try:
        experiment = load_config(path, overrides=assignments)
    except ConfigError as error:
        raise ReportError(str(error)) from None
    wanted = [(c.label or c.name, _canonical(c.to_dict())) for c in experiment.runs]
    by_config: dict[str, RunRow] = {}
    for row in _newest_first(r for r in store.list_runs() if r.status in statuses):
        try:
            key = _canonical(RunConfig.from_dict(row.config).to_dict())
        except Exception:  # noqa: BLE001  (a run stored by an older schema or a method not installed here)
            key = _canonical(row.config)
        by_config.setdefault(key, row)
    found, missing = [], []
    for label, key in wanted:
        if key in by_config:
            found.append(by_config[key])
        else:
            missing.append(label)
    if missing and not allow_missing:
        shown = ", ".join(missing[:8]) + (f" and {len(missing) - 8} more" if len(missing) > 8 else "")
        raise MissingRunsError(
            f"{path}: {len(missing)} of {len(wanted)} runs not found finished in {store.path}: {shown} "
            f"(run them first: secure-fl run {path}{''.join(f' --set {k}={v}' for k, v in assignments)}; or "
            "report the ones that exist with --allow-missing)", missing)
    return found


def _from_token(store: RunStore, token: str, statuses: Sequence[str]) -> list[RunRow]:
    ids = [t.strip() for t in token.split(",") if t.strip()]
    if len(ids) > 1 or (ids and _is_run_id(store, ids[0])):
        rows = []
        for run_id in ids:
            try:
                rows.append(store.run(run_id))
            except StoreError:
                raise ReportError(f"no run {run_id!r} in {store.path}") from None
        return rows
    batch = store.batch_runs(token)
    if batch:
        return [r for r in batch if r.status in statuses]
    named = [r for r in store.list_runs() if r.name == token and r.status in statuses]
    if named:
        return list(reversed(_newest_first(named)))
    raise ReportError(f"{token!r} is not a config file, run id, batch id or run name in {store.path}")


def _is_run_id(store: RunStore, token: str) -> bool:
    try:
        store.run(token)
    except StoreError:
        return False
    return True


def load_runs(
    sources: str | Sequence[str],
    *,
    store: RunStore | None = None,
    workspace: str | Path | None = None,
    statuses: Sequence[str] = ("done",),
    allow_missing: bool = False,
    assignments: Sequence[tuple[str, Any]] = (),
) -> list[RunRecord]:
    """The runs ``sources`` name (see the module docstring), de-duplicated by config."""
    if isinstance(sources, str):
        sources = [sources]
    own = store is None
    if store is None:
        path = workspace_path(workspace) / DB_NAME
        if not path.is_file():
            raise ReportError(f"no run store at {path}: run a config first (secure-fl run CONFIG), "
                              "or name the workspace with --workspace")
        try:
            store = RunStore.open_readonly(path)  # a report only reads: works on a read-only store
        except StoreError as error:
            raise ReportError(str(error)) from None
    try:
        rows: list[RunRow] = []
        for source in sources:
            path = Path(source)
            if source.endswith(".toml") or path.is_file():
                if not path.is_file():
                    raise ReportError(f"config file {source} not found")
                rows.extend(_from_config_file(store, path, statuses, allow_missing, assignments))
            else:
                rows.extend(_from_token(store, source, statuses))
        kept: dict[str, RunRow] = {}
        order: list[str] = []
        for row in rows:
            key = _canonical(row.config)
            if key not in kept:
                order.append(key)
                kept[key] = row
            elif (row.created, row.updated) > (kept[key].created, kept[key].updated):
                kept[key] = row
        return [RunRecord.from_store(store, kept[k]) for k in order]
    finally:
        if own:
            store.close()


# --- numbers ------------------------------------------------------------------------------------

def mean_std(values: Iterable[float | None]) -> tuple[float, float, int]:
    """Mean, sample standard deviation (0 for one value) and count of the finite values.

    No finite value gives ``(nan, nan, 0)``.
    """
    xs = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    if not xs:
        return math.nan, math.nan, 0
    mean = sum(xs) / len(xs)
    std = math.sqrt(sum((x - mean) ** 2 for x in xs) / (len(xs) - 1)) if len(xs) > 1 else 0.0
    return mean, std, len(xs)


def format_percent(value: float | None, digits: int = 2) -> str:
    """A fraction as a percentage without the sign (``0.8352`` → ``"83.52"``); ``"—"`` if missing."""
    if value is None or not math.isfinite(value):
        return "—"
    return f"{100 * value:.{digits}f}"


def format_mean_std(values: Iterable[float | None], *, percent: bool = True, digits: int = 2,
                    show_n: bool = False) -> str:
    """``"83.52 ± 0.40"`` (std only with ≥ 2 values; ``"—"`` when there is none)."""
    mean, std, n = mean_std(values)
    if n == 0:
        return "—"
    scale = 100.0 if percent else 1.0
    text = f"{scale * mean:.{digits}f}"
    if n > 1:
        text += f" ± {scale * std:.{digits}f}"
    if show_n:
        text += f" (n={n})"
    return text


def summary_value(run: RunRecord, metric: str = "tail", key: str = "accuracy") -> float | None:
    """``run.tail[key]``, ``run.final[key]`` or ``run.best[key]``, as ``metric`` names."""
    _check_summary(metric)
    value = getattr(run, metric).get(key)
    return None if value is None else float(value)


def _check_summary(metric: str) -> None:
    if metric not in SUMMARIES:
        raise ReportError(f"metric must be one of {', '.join(map(repr, SUMMARIES))}, got {metric!r}")


def group_runs(runs: Iterable[RunRecord], key: str | Callable[[RunRecord], Any]) -> dict[Any, list[RunRecord]]:
    """Runs grouped by ``key(run)`` or by a dotted config key, in first-seen order."""
    fn = (lambda r: _hashable(r.param(key, None))) if isinstance(key, str) else key
    groups: dict[Any, list[RunRecord]] = {}
    for run in runs:
        groups.setdefault(fn(run), []).append(run)
    return groups


def _hashable(value: Any) -> Any:
    if isinstance(value, list):
        return tuple(_hashable(v) for v in value)
    if isinstance(value, dict):
        return json.dumps(value, sort_keys=True)
    return value


def rounds_to_reach(curve: Sequence[float] | np.ndarray, target: float) -> int | None:
    """The first round (1-based) whose value is ≥ ``target``; None if it never is."""
    values = np.asarray(curve, dtype=np.float64)
    hits = np.flatnonzero(np.nan_to_num(values, nan=-np.inf) >= target - 1e-12)
    return int(hits[0]) + 1 if hits.size else None


def speedup(baseline_rounds: int | None, rounds: int | None) -> float | None:
    """``baseline_rounds / rounds``; None when either is unknown."""
    if baseline_rounds is None or rounds is None or rounds <= 0:
        return None
    return baseline_rounds / rounds


def mean_curve(runs: Sequence[RunRecord], metric: str = "accuracy") -> tuple[np.ndarray, np.ndarray]:
    """Per-round mean and std over ``runs`` (truncated to the shortest history)."""
    if not runs:
        return np.empty(0), np.empty(0)
    curves = [r.curve(metric) for r in runs]
    length = min(c.size for c in curves)
    stacked = np.stack([c[:length] for c in curves])
    with np.errstate(invalid="ignore"):
        mean = np.nanmean(stacked, axis=0) if length else np.empty(0)
        std = np.nanstd(stacked, axis=0, ddof=1) if len(runs) > 1 and length else np.zeros(length)
    return mean, std


# --- Markdown -----------------------------------------------------------------------------------

def _cell(value: Any) -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        return "—" if not math.isfinite(value) else f"{value:g}"
    return str(value).replace("|", "\\|").replace("\n", " ")


def markdown_table(headers: Sequence[str], rows: Iterable[Sequence[Any]], *,
                   align: Sequence[str] | None = None) -> str:
    """A GitHub Markdown table; ``align`` holds ``"l"``, ``"r"`` or ``"c"`` per column."""
    headers = [str(h) for h in headers]
    body = [[_cell(v) for v in row] for row in rows]
    for i, row in enumerate(body):
        if len(row) != len(headers):
            raise ReportError(f"row {i} has {len(row)} cells, the table {len(headers)} columns")
    align = list(align) if align is not None else ["l"] + ["r"] * (len(headers) - 1)
    marks = {"l": ":---", "r": "---:", "c": ":---:"}
    lines = ["| " + " | ".join(headers) + " |", "| " + " | ".join(marks[a] for a in align) + " |"]
    lines += ["| " + " | ".join(row) + " |" for row in body]
    return "\n".join(lines) + "\n"


def pivot(
    runs: Sequence[RunRecord],
    *,
    row: str | Callable[[RunRecord], Any],
    column: str | Callable[[RunRecord], Any],
    metric: str = "tail",
    key: str = "accuracy",
    row_header: str = "Method",
    row_order: Sequence[Any] | None = None,
    column_order: Sequence[Any] | None = None,
    column_label: Callable[[Any], str] = str,
    row_label: Callable[[Any], str] = str,
    digits: int = 2,
) -> tuple[str, dict[str, dict[str, dict[str, Any]]]]:
    """Rows × columns of mean ± std over the runs in each cell (usually the seeds).

    Returns the Markdown and ``{row_label: {column_label: {"mean", "std", "n", "runs"}}}``.
    """
    rows = group_runs(runs, row)
    columns = list(group_runs(runs, column))
    row_keys = [k for k in (row_order or []) if k in rows] + [k for k in rows if k not in (row_order or [])]
    col_keys = [k for k in (column_order or []) if k in columns] + \
        [k for k in columns if k not in (column_order or [])]
    col_fn = (lambda r: _hashable(r.param(column, None))) if isinstance(column, str) else column
    data: dict[str, dict[str, dict[str, Any]]] = {}
    body = []
    for rk in row_keys:
        cells = [row_label(rk)]
        data[row_label(rk)] = {}
        for ck in col_keys:
            members = [r for r in rows[rk] if col_fn(r) == ck]
            values = [summary_value(r, metric, key) for r in members]
            mean, std, n = mean_std(values)
            data[row_label(rk)][column_label(ck)] = {
                "mean": None if n == 0 else mean, "std": None if n == 0 else std, "n": n,
                "runs": [r.id for r in members],
            }
            cells.append(format_mean_std(values, digits=digits))
        body.append(cells)
    return markdown_table([row_header] + [column_label(c) for c in col_keys], body), data


# --- plots --------------------------------------------------------------------------------------

def plot_curves(
    series: Mapping[str, Sequence[RunRecord]],
    path: str | Path,
    *,
    metric: str = "accuracy",
    title: str = "",
    ylabel: str | None = None,
    percent: bool = True,
) -> Path:
    """One line per series (mean over its runs, ± std band when ≥ 2), saved as PNG at ``path``."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    scale = 100.0 if percent else 1.0
    fig, ax = plt.subplots(figsize=(6.4, 4.2), dpi=120)
    try:
        for name, runs in series.items():
            mean, std = mean_curve(runs, metric)
            if mean.size == 0:
                continue
            x = np.arange(1, mean.size + 1)
            (line,) = ax.plot(x, scale * mean, label=f"{name}" + (f" (n={len(runs)})" if len(runs) > 1 else ""),
                              linewidth=1.6)
            if len(runs) > 1:
                ax.fill_between(x, scale * (mean - std), scale * (mean + std), color=line.get_color(),
                                alpha=0.15, linewidth=0)
        from matplotlib.ticker import MaxNLocator

        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel("communication round")
        ax.set_ylabel(ylabel or (f"test {metric.replace('_', ' ')}" + (" (%)" if percent else "")))
        if title:
            ax.set_title(title)
        ax.grid(True, alpha=0.3)
        if series:
            ax.legend(loc="lower right", fontsize=8)
        fig.tight_layout()
        fig.savefig(path, format="png")
    finally:
        plt.close(fig)
    return path


# --- the table registry -------------------------------------------------------------------------

@dataclass(frozen=True)
class TableContext:
    """What a formatter is told: where figures go (None: draw none), the metric, options."""

    out_dir: Path | None = None
    metric: str = "tail"
    options: Mapping[str, str] = field(default_factory=dict)

    def figure_path(self, name: str) -> Path | None:
        return None if self.out_dir is None else self.out_dir / name


@dataclass(frozen=True)
class TableReport:
    """A formatted table: Markdown, the figures written, and the numbers behind them."""

    name: str
    markdown: str
    figures: tuple[Path, ...] = ()
    data: Mapping[str, Any] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        return {"table": self.name, "markdown": self.markdown, "figures": [str(p) for p in self.figures],
                "data": dict(self.data)}


Formatter = Callable[[Sequence[RunRecord], TableContext], TableReport]


@dataclass(frozen=True)
class TableSpec:
    name: str
    formatter: Formatter
    title: str = ""
    description: str = ""


TABLES: dict[str, TableSpec] = {}


def register_table(name: str, *, title: str = "", description: str = "") -> Callable[[Formatter], Formatter]:
    """Decorator: make ``formatter`` available as ``secure-fl report ... --table NAME``."""

    def deco(formatter: Formatter) -> Formatter:
        known = TABLES.get(name)
        same = known is not None and (known.formatter.__module__, known.formatter.__qualname__) == \
            (formatter.__module__, formatter.__qualname__)  # the same function, its module imported again
        if known is not None and known.formatter is not formatter and not same:
            raise ValueError(f"table {name!r} is already registered by {known.formatter.__module__}")
        TABLES[name] = TableSpec(name=name, formatter=formatter, title=title,
                                 description=description or (formatter.__doc__ or "").strip().split("\n")[0])
        return formatter

    return deco


_PLUGINS_LOADED = False


def load_plugins() -> dict[str, str]:
    """Import every formatter module of this package; returns ``{module: error}`` for failures."""
    global _PLUGINS_LOADED
    errors: dict[str, str] = {}
    package = importlib.import_module("secure_fl.report")
    for info in pkgutil.iter_modules(package.__path__):
        if info.name.startswith("_") or info.name == "core":
            continue
        try:
            importlib.import_module(f"secure_fl.report.{info.name}")
        except Exception as error:  # noqa: BLE001  (one broken plug-in must not hide the others' tables)
            errors[info.name] = f"{type(error).__name__}: {error}"
    _PLUGINS_LOADED = True
    return errors


def get_table(name: str) -> TableSpec:
    """The registered table ``name`` (plug-ins are imported on first use)."""
    errors: dict[str, str] = {}
    if name not in TABLES or not _PLUGINS_LOADED:
        errors = load_plugins()
    try:
        return TABLES[name]
    except KeyError:
        hint = "".join(f"; module {m} failed to import ({e})" for m, e in errors.items())
        raise ReportError(f"unknown table {name!r}; known: {', '.join(sorted(TABLES))}{hint}") from None


# --- the generic table --------------------------------------------------------------------------

@register_table("runs", title="All runs", description="one line per run: method, protocol, seed, final and tail")
def runs_table(runs: Sequence[RunRecord], ctx: TableContext) -> TableReport:
    """One line per run, and (with ``out_dir``) every run's accuracy per round in one plot."""
    rows = [
        [r.id, r.name, r.label or "—", r.method_label, r.loss, r.protocol_summary, r.seed, r.rounds,
         format_percent(summary_value(r, "final")), format_percent(summary_value(r, "tail"))]
        for r in runs
    ]
    md = markdown_table(["run", "name", "label", "method", "loss", "protocol", "seed", "rounds",
                         "final acc. (%)", "tail acc. (%)"], rows, align=["l"] * 6 + ["r"] * 4)
    figures: list[Path] = []
    path = ctx.figure_path("runs_accuracy.png")
    if path is not None and runs:
        figures.append(plot_curves({f"{r.method_label} {r.label or r.id}": [r] for r in runs}, path,
                                   title="accuracy per round"))
    return TableReport(name="runs", markdown=md, figures=tuple(figures),
                       data={"runs": [r.as_json() for r in runs]})


# --- one call -----------------------------------------------------------------------------------

def build_report(
    sources: str | Sequence[str],
    table: str = "runs",
    *,
    out_dir: str | Path | None = None,
    metric: str = "tail",
    options: Mapping[str, str] | None = None,
    workspace: str | Path | None = None,
    store: RunStore | None = None,
    allow_missing: bool = False,
    assignments: Sequence[tuple[str, Any]] = (),
) -> tuple[TableReport, list[RunRecord]]:
    """Load the runs, format ``table``, and (with ``out_dir``) write ``<table>.md`` and figures there."""
    _check_summary(metric)
    spec = get_table(table)
    runs = load_runs(sources, store=store, workspace=workspace, allow_missing=allow_missing, assignments=assignments)
    if not runs:
        raise ReportError(f"no finished runs found for {', '.join([sources] if isinstance(sources, str) else sources)}")
    out = None if out_dir is None else Path(out_dir)
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
    context_options = dict(options or {})
    if workspace is not None:  # formatters that read more than the runs (checkpoints) read the same store
        context_options.setdefault("workspace", str(workspace))
    report = spec.formatter(runs, TableContext(out_dir=out, metric=metric, options=context_options))
    if out is not None:
        (out / f"{table}.md").write_text(report.markdown)
    return report, runs


# --- labels for runs that differ in more than the method -----------------------------------------

def _flatten(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in config.items():
        path = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(_flatten(value, f"{path}."))
        else:
            out[path] = _hashable(value)
    return out


DEFAULT_IGNORED = ("seed", "data.seed", "name")
"""Config keys that never tell two rows of a table apart (seeds are averaged over)."""


def row_labeler(
    runs: Sequence[RunRecord],
    *,
    column: str | Callable[[RunRecord], Any] | None = None,
    ignore: Iterable[str] = DEFAULT_IGNORED,
) -> Callable[[RunRecord], str]:
    """A function run → row label: the method's display name, plus the config keys in which
    runs of the same method (and the same ``column`` value) differ, e.g. ``FedProx (mu=0.1)``
    or ``FedShift (protocol=paillier)``. Seeds (``ignore``) never split rows."""
    ignored = set(ignore)
    col_fn: Callable[[RunRecord], Any]
    if column is None:
        col_fn = lambda r: None
    elif isinstance(column, str):
        ignored.add(column)
        col_fn = lambda r: _hashable(r.param(column, None))
    else:
        col_fn = column
    flat = {r.id: _flatten(r.config) for r in runs}
    varying: dict[str, set[str]] = {}
    for (method, _), members in group_runs(runs, lambda r: (r.method, col_fn(r))).items():
        keys = set().union(*(flat[r.id].keys() for r in members))
        for key in keys:
            if key in ignored or any(key.startswith(f"{i}.") for i in ignored):
                continue
            if len({json.dumps(flat[r.id].get(key), sort_keys=True, default=str) for r in members}) > 1:
                varying.setdefault(method, set()).add(key)

    def label(run: RunRecord) -> str:
        keys = sorted(varying.get(run.method, ()))
        if not keys:
            return run.method_label
        parts = [f"{k.split('.')[-1]}={_cell(flat[run.id].get(k))}" for k in keys]
        return f"{run.method_label} ({', '.join(parts)})"

    return label
