"""FedShift (paper 001) tables: Table 1–5 shaped like the paper's, and Figure 1's curves.

=====================  ======================================  =========================
table                  rows × columns                          configs
=====================  ======================================  =========================
``fedshift-table1``    method × dataset (accuracy, %)          experiments/fedshift/table1*.toml
``fedshift-table2``    method × dataset (rounds to reach        same runs as Table 1
                       FedAvg's accuracy, speedup)
``fedshift-table3``    method × local epochs E                 experiments/fedshift/table3*.toml
``fedshift-table4``    method × Dirichlet α                    experiments/fedshift/table4*.toml
``fedshift-table5``    method × N (C = 10/N)                   experiments/fedshift/table5*.toml
=====================  ======================================  =========================

Every cell is the mean ± sample std over the runs that differ only in their seed, of each
run's ``tail`` accuracy (mean of its last ``tail_rounds`` rounds; ``--metric final`` for the
last round only, ``--metric best`` for the best round, the paper's own summary). Where a
table's runs span several datasets, one table per dataset is printed. With ``--out``, one
accuracy-per-round PNG per dataset (Table 1/2) or per column value (Tables 3–5): mean over
seeds with a ± std band.

Table 2 (communication efficiency): the target is FedAvg's accuracy (its seeds' mean
``tail``, or ``final`` with ``--metric final``); a method's rounds are the first round at
which its seed-mean accuracy curve reaches the target, the speedup FedAvg's rounds divided by
the method's. ``—`` means never reached within the run (the paper's "\\", speedup < 1×).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from secure_fl.report.core import (
    RunRecord,
    TableContext,
    TableReport,
    group_runs,
    markdown_table,
    mean_curve,
    mean_std,
    pivot,
    plot_curves,
    register_table,
    rounds_to_reach,
    row_labeler,
    speedup,
    summary_value,
)

__all__ = ["METHOD_ORDER", "communication_table"]

METHOD_ORDER = ("FedAvg", "FedProx", "SCAFFOLD", "FedShift", "Reweighting")
"""The paper's row order (other rows follow in the order they were run)."""

DATASET_NAMES = {"fashion-mnist": "Fashion-MNIST", "cifar10": "CIFAR-10", "mnist5k": "MNIST (5k)",
                 "digits": "digits"}


def _dataset(run: RunRecord) -> str:
    name = str(run.param("data.dataset", "?"))
    return DATASET_NAMES.get(name, name)


def _order(labels: Sequence[str]) -> list[str]:
    def rank(label: str) -> tuple[int, int]:
        base = label.split(" (")[0]
        return (METHOD_ORDER.index(base) if base in METHOD_ORDER else len(METHOD_ORDER), labels.index(label))

    return sorted(dict.fromkeys(labels), key=rank)


def _slug(text: str) -> str:
    """An ASCII file-name part: ``"E=5"`` → ``e5``, ``"α=0.1"`` → ``alpha0.1``, ``"N=20,C=0.5"`` → ``n20_c0.5``."""
    text = text.replace("α", "alpha").replace("=", "")
    out = "".join(ch if (ch.isascii() and ch.isalnum()) or ch in "-." else "_" for ch in text)
    while "__" in out:
        out = out.replace("__", "_")
    return out.strip("_").lower()


def _sweep_table(
    runs: Sequence[RunRecord],
    ctx: TableContext,
    *,
    name: str,
    title: str,
    column: str | Callable[[RunRecord], Any],
    column_label: Callable[[Any], str],
    figure_prefix: str,
) -> TableReport:
    """Method × swept value, one table per dataset, one plot per (dataset, value)."""
    col_fn = (lambda r: r.param(column, None)) if isinstance(column, str) else column
    parts: list[str] = [f"### {title}\n", f"Test accuracy (%), {ctx.metric} metric, mean ± std over seeds.\n"]
    figures: list[Path] = []
    data: dict[str, Any] = {}
    for dataset, members in group_runs(runs, _dataset).items():
        label = row_labeler(members, column=column)
        rows = _order([label(r) for r in members])
        columns = sorted({col_fn(r) for r in members}, key=lambda v: (v is None, v))
        md, cells = pivot(members, row=label, column=col_fn, metric=ctx.metric, row_header="Methods",
                          row_order=rows, column_order=columns, column_label=column_label)
        parts.append(f"\n**{dataset}** ({_setting(members, exclude=column)})\n\n{md}")
        data[dataset] = cells
        for value in columns:
            path = ctx.figure_path(f"{figure_prefix}_{_slug(dataset)}_{_slug(column_label(value))}.png")
            if path is None:
                continue
            series = group_runs([r for r in members if col_fn(r) == value], label)
            figures.append(plot_curves({k: series[k] for k in _order(list(series))}, path,
                                       title=f"{dataset}, {column_label(value)}"))
    return TableReport(name=name, markdown="\n".join(parts), figures=tuple(figures), data=data)


def _setting(runs: Sequence[RunRecord], *, exclude: str | Callable[[RunRecord], Any] | None = None) -> str:
    """The shared setting of a table's runs, in words (keys that vary are left out)."""
    keys = [("data.partition_params.alpha", "α"), ("data.num_clients", "N"), ("train.clients_per_round", "per round"),
            ("train.local_epochs", "E"), ("train.rounds", "rounds"), ("train.batch_size", "B"),
            ("train.lr", "lr"), ("data.train_samples", "train samples"), ("model.name", "model"),
            ("model.hidden", "hidden")]
    seeds = sorted({r.seed for r in runs})
    out = []
    for key, word in keys:
        if key == exclude:
            continue
        values = {str(r.param(key, None)).replace(" ", "") for r in runs}
        if len(values) == 1 and "None" not in values:
            out.append(f"{word} = {values.pop()}")
    out.append(f"seeds {', '.join(map(str, seeds))}")
    return ", ".join(out)


# --- Table 1 ------------------------------------------------------------------------------------

@register_table("fedshift-table1", title="FedShift Table 1: accuracy of all methods",
                description="method × dataset accuracy (Table 1) and accuracy-per-round curves (Figure 1)")
def table1(runs: Sequence[RunRecord], ctx: TableContext) -> TableReport:
    """Method × dataset, with the difference to FedAvg and one accuracy-per-round plot per dataset."""
    label = row_labeler(runs, column=_dataset)
    rows = _order([label(r) for r in runs])
    datasets = list(group_runs(runs, _dataset))
    md, cells = pivot(runs, row=label, column=_dataset, metric=ctx.metric, row_header="Methods",
                      row_order=rows, column_order=datasets)
    parts = ["### Table 1: test accuracy (%)\n",
             f"{ctx.metric} accuracy, mean ± std over seeds; "
             + "; ".join(f"{d}: {_setting([r for r in runs if _dataset(r) == d])}" for d in datasets) + ".\n",
             md]
    # The difference to FedAvg, seed by seed where the seeds match (paired), else of the means.
    delta_rows = []
    for row in rows:
        if row.split(" (")[0] == "FedAvg":
            continue
        line = [row]
        for d in datasets:
            base = cells.get(_fedavg_row(rows) or "", {}).get(d, {})
            this = cells.get(row, {}).get(d, {})
            if base.get("mean") is None or this.get("mean") is None:
                line.append("—")
            else:
                line.append(f"{100 * (this['mean'] - base['mean']):+.2f}")
        delta_rows.append(line)
    if delta_rows and _fedavg_row(rows):
        parts.append("\nDifference to FedAvg (points):\n\n" + markdown_table(["Methods", *datasets], delta_rows))
    figures = []
    for d in datasets:
        path = ctx.figure_path(f"fedshift_fig1_{_slug(d)}.png")
        if path is not None:
            series = group_runs([r for r in runs if _dataset(r) == d], label)
            figures.append(plot_curves({k: series[k] for k in _order(list(series))}, path,
                                       title=f"{d}: test accuracy per round"))
    return TableReport(name="fedshift-table1", markdown="\n".join(parts), figures=tuple(figures),
                       data={"accuracy": cells, "metric": ctx.metric})


def _fedavg_row(rows: Sequence[str]) -> str | None:
    return next((r for r in rows if r == "FedAvg"), next((r for r in rows if r.startswith("FedAvg")), None))


# --- Table 2 ------------------------------------------------------------------------------------

def communication_table(runs: Sequence[RunRecord], *, metric: str = "tail") -> tuple[list[list[str]], dict[str, Any]]:
    """Rows (method, rounds, speedup, best seed-mean accuracy and its round) and the numbers
    behind them for runs of one setting. The best round says how far a method that never
    reaches the target stays from it."""
    label = row_labeler(runs)
    groups = group_runs(runs, label)
    rows = _order(list(groups))
    base = _fedavg_row(rows)
    if base is None:
        raise ValueError("Table 2 needs FedAvg runs: its accuracy is the target")
    target, _, _ = mean_std([summary_value(r, metric) for r in groups[base]])
    curves = {row: mean_curve(groups[row])[0] for row in rows}
    reached = {row: rounds_to_reach(curves[row], target) for row in rows}
    out_rows: list[list[str]] = []
    data: dict[str, Any] = {"target": target, "methods": {}}
    for row in rows:
        gain = speedup(reached[base], reached[row])
        scored = np.isfinite(curves[row])
        best_round = int(np.nanargmax(curves[row])) + 1 if scored.any() else None
        best = float(curves[row][best_round - 1]) if best_round is not None else None
        out_rows.append([row, "—" if reached[row] is None else str(reached[row]),
                         "< 1×" if gain is None else f"{gain:.2f}×",
                         "—" if best is None else f"{100 * best:.2f} ({best_round})"])
        data["methods"][row] = {"rounds": reached[row], "speedup": gain, "of_rounds": int(curves[row].size),
                                "best": best, "best_round": best_round, "runs": [r.id for r in groups[row]]}
    return out_rows, data


@register_table("fedshift-table2", title="FedShift Table 2: rounds to reach FedAvg's accuracy",
                description="rounds each method needs to reach FedAvg's accuracy, and the speedup (Table 2)")
def table2(runs: Sequence[RunRecord], ctx: TableContext) -> TableReport:
    """One block per dataset (and per E where several): rounds and speedup, as the paper."""
    parts = ["### Table 2: communication rounds to reach FedAvg's accuracy\n",
             (f"Target: FedAvg's {ctx.metric} accuracy (mean over seeds); rounds: first round at which the "
              "method's seed-mean accuracy reaches it; speedup: FedAvg's rounds / the method's. "
              "'—': not reached within the run; best: the highest seed-mean accuracy and its round.\n")]
    data: dict[str, Any] = {}
    for key, members in group_runs(runs, lambda r: (_dataset(r), r.param("train.local_epochs", None),
                                                     r.param("data.partition_params.alpha", None),
                                                     r.param("data.num_clients", None))).items():
        dataset, epochs, alpha, clients = key
        heading = f"{dataset}, E = {epochs}, α = {alpha}, N = {clients}"
        try:
            rows, numbers = communication_table(members, metric=ctx.metric)
        except ValueError as error:
            parts.append(f"\n**{heading}**: {error}\n")
            continue
        parts.append(f"\n**{heading}** (target {100 * numbers['target']:.2f} %, "
                     f"{max(m['of_rounds'] for m in numbers['methods'].values())} rounds)\n\n"
                     + markdown_table(["Method", "rounds", "speedup", "best mean accuracy (round)"], rows))
        data[heading] = numbers
    return TableReport(name="fedshift-table2", markdown="\n".join(parts), data=data)


# --- Tables 3–5 ---------------------------------------------------------------------------------

@register_table("fedshift-table3", title="FedShift Table 3: local epochs E",
                description="method × local epochs E ∈ {1, 5, 10, 20} (Table 3)")
def table3(runs: Sequence[RunRecord], ctx: TableContext) -> TableReport:
    return _sweep_table(runs, ctx, name="fedshift-table3", title="Table 3: top-1 accuracy (%) by local epochs",
                        column="train.local_epochs", column_label=lambda v: f"E={v}", figure_prefix="table3")


@register_table("fedshift-table4", title="FedShift Table 4: Dirichlet α",
                description="method × Dirichlet α ∈ {0.1, 0.15, 0.2, 0.5} (Table 4)")
def table4(runs: Sequence[RunRecord], ctx: TableContext) -> TableReport:
    return _sweep_table(runs, ctx, name="fedshift-table4", title="Table 4: top-1 accuracy (%) by Dirichlet α",
                        column="data.partition_params.alpha", column_label=lambda v: f"α={v}",
                        figure_prefix="table4")


def _clients_column(run: RunRecord) -> tuple[int, float]:
    n = int(run.param("data.num_clients"))
    per_round = int(run.param("train.clients_per_round"))
    return n, round(per_round / n, 3)


@register_table("fedshift-table5", title="FedShift Table 5: number of clients",
                description="method × N clients with 10 per round (Table 5)")
def table5(runs: Sequence[RunRecord], ctx: TableContext) -> TableReport:
    return _sweep_table(runs, ctx, name="fedshift-table5", title="Table 5: top-1 accuracy (%) by number of clients",
                        column=_clients_column, column_label=lambda v: f"N={v[0]},C={v[1]:g}",
                        figure_prefix="table5")
