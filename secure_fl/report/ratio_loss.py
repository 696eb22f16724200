"""Ratio Loss (paper 002) tables: Table 2, Table 4 and Figure 2, shaped like the paper's.

=====================  =====================================================  ======================================
table                  rows × columns                                         configs
=====================  =====================================================  ======================================
``ratio-table2``       loss (CE, Focal, GHMC, Ratio Loss) × Γ (B., 10:1 …),   experiments/ratio_loss/table2/*.toml,
                       Ac.M (%) then AUC, one block per dataset               experiments/ratio_loss/smoke.toml
``ratio-table4``       loss (MSE, MFE) × classes per client (2 … 5), with     experiments/ratio_loss/table4_*.toml
                       the mean local/global cosine similarity CS per column
``ratio-fig2``         per run: the monitor's cosine similarity of v_pt to    experiments/ratio_loss/fig2_*.toml
                       the round's true composition, per round (PNG) and
                       summarised (mean, min, rounds ≥ 0.98)
=====================  =====================================================  ======================================

Ac.M is the run's ``minority_accuracy`` (the worst class among ``data.minority_classes``),
AUC the macro one-vs-rest AUC; each cell is the mean ± sample std over the runs that differ
only in their seed, of each run's ``tail`` (``--metric final``: last round).

Monitor telemetry comes from two places. What the server knows (v_pt, the variants' estimates,
ℝ, the detector, the auxiliary counts) is the ``ratio_loss`` server half's state, which the
store saves with the run's latest checkpoint; the scores against the truth (the cosine of v_pt
and of each variant to the round's true composition, the partition's CS) are *simulator
telemetry* — the harness computes them from every client's data, which no party has — stored
as the round metrics ``sim.*``. :func:`monitor_telemetry` joins the two
(:func:`~secure_fl.algorithms.ratio_loss.monitor_history`); the checkpoint is read in the
report's workspace (``--workspace DIR``; ``--option workspace=DIR`` overrides it; default
``$SECURE_FL_WORKSPACE``, else ``./runs`` — as ``secure-fl run``).

    secure-fl report experiments/ratio_loss/smoke.toml --table ratio-table2
    secure-fl report experiments/ratio_loss/table2/fashion_*.toml --table ratio-table2 --out reports/rl \
        --workspace runs/ratio
    secure-fl report experiments/ratio_loss/fig2_fashion.toml --table ratio-fig2 --out reports/rl
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from secure_fl.report.core import (
    METHOD_LABELS,
    ReportError,
    RunRecord,
    TableContext,
    TableReport,
    format_mean_std,
    markdown_table,
    mean_std,
    register_table,
    summary_value,
)

__all__ = ["LOSS_LABELS", "gamma_label", "loss_label", "monitor_telemetry"]

METHOD_LABELS.setdefault("ratio_loss", "Ratio Loss")

LOSS_LABELS = {"ce": "L_CE", "focal": "L_FL", "ghmc": "L_GHMC", "ratio": "L_RL (ours)", "mse": "L_MSE",
               "mfe": "L_MFE"}
"""The paper's row names."""
VARIANT_COLUMNS = ("paper/start", "paper/midpoint", "pooled/start", "lstsq/start", "lstsq/midpoint")
"""The estimator/template variants whose cosine the simulator telemetry records (``ratio_loss.VARIANTS``)."""
LOSS_ORDER = ("L_CE", "L_FL", "L_GHMC", "L_RL (ours)", "L_MSE", "L_MFE")
DATASET_NAMES = {"fashion-mnist": "Fashion-MNIST", "mnist5k": "MNIST (5k)", "cifar10": "CIFAR-10",
                 "digits": "digits"}


def loss_label(run: RunRecord) -> str:
    """The paper's name of a run's loss (``L_CE`` …); the method is added when it is not ``ratio_loss``."""
    label = LOSS_LABELS.get(run.loss, run.loss)
    return label if run.method == "ratio_loss" else f"{label} [{METHOD_LABELS.get(run.method, run.method)}]"


def _gamma(run: RunRecord) -> float:
    params = run.param("data.partition_params", {}) or {}
    return float(params.get("global_ratio", math.nan)) if run.param("data.partition", "") == "ratio" else math.nan


def gamma_label(gamma: float) -> str:
    """``B.`` for a balanced set, else ``10:1``."""
    if not math.isfinite(gamma):
        return "?"
    return "B." if gamma == 1.0 else f"{gamma:g}:1"


def _dataset(run: RunRecord) -> str:
    name = str(run.param("data.dataset", "?"))
    return DATASET_NAMES.get(name, name)


def _ordered(keys: Sequence[str], order: Sequence[str]) -> list[str]:
    return [k for k in order if k in keys] + [k for k in keys if k not in order]


def monitor_telemetry(runs: Sequence[RunRecord], ctx: TableContext) -> dict[str, tuple[list[dict[str, Any]], dict[str, Any]]]:
    """``{run id: (history, telemetry)}`` of the ``ratio_loss`` runs: the server's history from their
    stored checkpoints, scored by the simulator telemetry of their stored rounds."""
    import sqlite3

    from secure_fl.algorithms.ratio_loss import monitor_history
    from secure_fl.store import RunStore, StoreError

    wanted = [r for r in runs if r.method == "ratio_loss"]
    if not wanted:
        return {}
    out: dict[str, tuple[list[dict[str, Any]], dict[str, Any]]] = {}
    try:
        store = RunStore.open_workspace(ctx.options.get("workspace") or None)
    except (StoreError, OSError, sqlite3.Error) as error:
        raise ReportError(f"cannot open the run store for the monitor telemetry: {error}; "
                          "pass --workspace DIR") from None
    try:
        for run in wanted:
            try:
                stored = store.run(run.id)
            except (StoreError, sqlite3.Error):
                stored = None
            if stored is None or stored.config != run.config:
                # `report --workspace DIR` reads the runs from DIR but does not tell formatters; without
                # this check the telemetry would silently come from (or be missing in) another store.
                raise ReportError(f"run {run.id} is not in {store.path}, where the monitor telemetry is read "
                                  "from; pass the runs' workspace with --workspace DIR")
            try:
                checkpoint = store.checkpoint(run.id)
            except (StoreError, sqlite3.Error):
                checkpoint = None
            metrics = {row.round: row.metrics for row in run.history}
            try:
                history, telemetry = monitor_history(None if checkpoint is None else checkpoint.algorithm, metrics)
            except ValueError:
                continue
            if history or telemetry:
                out[run.id] = (history, telemetry)
    finally:
        store.close()
    return out


def _cell(runs: Sequence[RunRecord], metric: str, key: str, *, percent: bool, digits: int) -> tuple[str, dict[str, Any]]:
    values = [summary_value(r, metric, key) for r in runs]
    mean, std, n = mean_std(values)
    return (format_mean_std(values, percent=percent, digits=digits),
            {"mean": None if n == 0 else mean, "std": None if n < 2 else std, "n": n, "runs": [r.id for r in runs]})


def _blocks(runs: Sequence[RunRecord], ctx: TableContext, *, column: Any, column_label: Any,
            header: str, descending: bool = False) -> tuple[str, dict[str, Any]]:
    """One Markdown table per dataset: (metric, loss) rows × column values; Ac.M then AUC."""
    digits = int(ctx.options.get("digits", 2))
    md: list[str] = []
    data: dict[str, Any] = {}
    datasets: dict[str, list[RunRecord]] = {}
    for run in runs:
        datasets.setdefault(_dataset(run), []).append(run)
    for dataset, members in datasets.items():
        columns = sorted({column(r) for r in members}, key=lambda v: (isinstance(v, str), v), reverse=descending)
        rows = _ordered(list(dict.fromkeys(loss_label(r) for r in members)), LOSS_ORDER)
        body: list[list[str]] = []
        data[dataset] = {}
        for key, name, percent, places in (("minority_accuracy", "Ac.M %", True, digits),
                                            ("auc", "AUC", False, digits + 2)):
            data[dataset][name] = {}
            for row in rows:
                cells, values = [], {}
                for col in columns:
                    chosen = [r for r in members if loss_label(r) == row and column(r) == col]
                    text, value = _cell(chosen, ctx.metric, key, percent=percent, digits=places)
                    cells.append(text if chosen else "—")
                    values[column_label(col)] = value
                body.append([name, row] + cells)
                data[dataset][name][row] = values
        md.append(f"**{dataset}**\n\n" + markdown_table(["", f"{header}"] + [column_label(c) for c in columns], body,
                                                        align=["l", "l"] + ["r"] * len(columns)))
    return "\n".join(md), data


@register_table("ratio-table2", title="Ratio Loss Table 2: Ac.M (%) and AUC per loss and global imbalance Γ",
                description="loss × Γ, Ac.M and AUC, one block per dataset")
def table2(runs: Sequence[RunRecord], ctx: TableContext) -> TableReport:
    """Ratio Loss's Table 2: Ac.M (%) and AUC of CE, Focal, GHMC and Ratio Loss per Γ."""
    md, data = _blocks(runs, ctx, column=_gamma, column_label=gamma_label, header="Γ")
    telemetry = monitor_telemetry(runs, ctx) if ctx.options.get("telemetry", "1") != "0" else {}
    monitor = {}
    for run in runs:
        if run.id in telemetry:
            history, _ = telemetry[run.id]
            cos = [h["cosine"] for h in history if isinstance(h.get("cosine"), float) and math.isfinite(h["cosine"])]
            monitor[run.id] = {"label": f"{_dataset(run)} {loss_label(run)} Γ={gamma_label(_gamma(run))}",
                               "mean_cosine": float(np.mean(cos)) if cos else None}
    legend = (f"Ac.M: accuracy of the worst minority class (%); AUC: macro one-vs-rest "
              f"({'mean of the last tail_rounds rounds' if ctx.metric == 'tail' else 'last round'}; "
              "mean ± std over seeds).\n\n")
    return TableReport(name="ratio-table2", markdown=legend + md,
                       data={"metric": ctx.metric, "datasets": data, "monitor": monitor})


def _classes_per_client(run: RunRecord) -> Any:
    params = run.param("data.partition_params", {}) or {}
    value = params.get("classes_per_client")
    return "1..C" if value is None else (value if isinstance(value, int) else "..".join(str(v) for v in value))


@register_table("ratio-table4", title="Ratio Loss Table 4: MSE vs MFE under local/global mismatch",
                description="loss × classes per client (CS per column), Ac.M and AUC")
def table4(runs: Sequence[RunRecord], ctx: TableContext) -> TableReport:
    """Ratio Loss's Table 4: MSE and MFE per number of classes per client, with the mean CS."""
    telemetry = monitor_telemetry(runs, ctx) if ctx.options.get("telemetry", "1") != "0" else {}
    cs: dict[tuple[str, Any], list[float]] = {}
    for run in runs:
        value = telemetry.get(run.id, ([], {}))[1].get("partition_cosine")
        if isinstance(value, float) and math.isfinite(value):
            cs.setdefault((_dataset(run), _classes_per_client(run)), []).append(value)

    def label(col: Any) -> str:
        values = [v for (d, c), vs in cs.items() if c == col for v in vs]
        return f"{col} classes (CS {np.mean(values):.4f})" if values else f"{col} classes"

    # the paper's order: most classes per client (least mismatch) first
    md, data = _blocks(runs, ctx, column=_classes_per_client, column_label=label, header="classes per client",
                       descending=True)
    legend = ("Ac.M (%) and AUC per number of classes each client holds (fewer: larger local/global "
              "mismatch); CS is the mean over clients of cos(v_j, V), read from the runs' monitor telemetry.\n\n")
    return TableReport(name="ratio-table4", markdown=legend + md,
                       data={"metric": ctx.metric, "datasets": data,
                             "cs": {f"{d} {c}": float(np.mean(v)) for (d, c), v in cs.items()}})


@register_table("ratio-fig2", title="Ratio Loss Fig. 2: the monitor's cosine similarity to the true composition",
                description="per run: cosine of v_pt to the round's composition, per round")
def fig2(runs: Sequence[RunRecord], ctx: TableContext) -> TableReport:
    """Ratio Loss's Fig. 2: per round, cos(v_pt, V_t) of the monitor's estimate and the truth."""
    telemetry = monitor_telemetry(runs, ctx)
    if not telemetry:
        raise ReportError("no ratio_loss run with monitor telemetry among these runs (is --workspace right?)")
    threshold = float(ctx.options.get("target", 0.98))
    body, data, curves = [], {}, {}
    settings: dict[str, list[dict[str, Any]]] = {}
    for run in runs:
        if run.id not in telemetry:
            continue
        history, extra = telemetry[run.id]
        cos = np.array([h["cosine"] if isinstance(h.get("cosine"), float) else np.nan for h in history])
        finite = cos[np.isfinite(cos)]
        setting = f"{_dataset(run)} Γ={gamma_label(_gamma(run))} {loss_label(run)}"
        name = f"{setting} seed {run.seed}"
        curves[name] = cos
        detected = next((h["round"] for h in history if h.get("detected")), None)
        names = list(dict.fromkeys(k for h in history for k in (h.get("variants") or {})))
        variants = {}
        for key in names:
            values = np.array([float((h.get("variants") or {}).get(key, np.nan)) for h in history])
            values = values[np.isfinite(values)]
            variants[key] = float(values.mean()) if values.size else None
        row: dict[str, Any] = {
            "run": run.id, "rounds": int(cos.size), "mean": float(finite.mean()) if finite.size else None,
            "min": float(finite.min()) if finite.size else None,
            "share_at_target": float((finite >= threshold).mean()) if finite.size else None,
            "detected_round": detected, "aux_counts": extra.get("aux_counts"), "variants": variants,
            "per_round": [None if not np.isfinite(c) else float(c) for c in cos]}
        data[name] = row
        settings.setdefault(setting, []).append(row)
        variant_columns = VARIANT_COLUMNS
        body.append([name, row["rounds"], "—" if row["mean"] is None else f"{row['mean']:.4f}",
                     "—" if row["min"] is None else f"{row['min']:.4f}",
                     "—" if row["share_at_target"] is None else f"{100 * row['share_at_target']:.0f}",
                     *["—" if variants.get(k) is None else f"{variants[k]:.4f}" for k in variant_columns],
                     "—" if detected is None else str(detected)])
    # One seed is one population and one draw of clients: the paper's "average similarity" is
    # judged on the mean over seeds, so each setting run with several seeds gets a summary row.
    summaries = {}
    for setting, rows in settings.items():
        means = [r["mean"] for r in rows if r["mean"] is not None]
        if len(means) < 2:
            continue
        per_variant = {k: [r["variants"][k] for r in rows if r["variants"].get(k) is not None]
                       for k in VARIANT_COLUMNS}
        summary: dict[str, Any] = {
            "seeds": len(means), "mean": float(np.mean(means)), "std": float(np.std(means)),
            "seeds_at_target": int(sum(m >= threshold for m in means)),
            "variants": {k: float(np.mean(v)) if v else None for k, v in per_variant.items()}}
        summaries[setting] = summary
        variant_cells = ["—" if summary["variants"][k] is None else f"{summary['variants'][k]:.4f}"
                         for k in VARIANT_COLUMNS]
        body.append([f"**{setting}, mean of {len(means)} seeds**", "",
                     f"**{summary['mean']:.4f} ± {summary['std']:.4f}**", "",
                     f"{summary['seeds_at_target']} of {len(means)} seeds", *variant_cells, ""])
    md = (f"Cosine similarity of the monitor's estimate v_pt to the round's true class composition "
          f"(mean and min over rounds; % of rounds ≥ {threshold:g}; the detector's first round; "
          f"for a setting run with several seeds, the mean ± std over seeds and how many seeds average ≥ {threshold:g}).\n\n"
          + "The variant columns are the mean cosine of other estimators on the same rounds "
            "(`paper`: Eq. 7; `pooled`, `lstsq`: extensions; `start`: updates at G_t as in the paper, "
            "`midpoint`: mean of the updates at G_t and G_{t+1}).\n\n"
          + markdown_table(["run", "rounds", "mean cos", "min cos", f"% rounds ≥ {threshold:g}",
                            *VARIANT_COLUMNS, "imbalance detected"],
                           body, align=["l"] + ["r"] * (5 + len(VARIANT_COLUMNS))))
    figures: list[Path] = []
    path = ctx.figure_path("ratio_fig2_cosine.png")
    if path is not None:
        figures.append(_plot(curves, path))
    return TableReport(name="ratio-fig2", markdown=md, figures=tuple(figures),
                       data={"runs": data, "seed_means": summaries})


def _plot(curves: dict[str, np.ndarray], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    path.parent.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(6.4, 4.2), dpi=120)
    try:
        for name, cos in curves.items():
            ax.plot(np.arange(1, cos.size + 1), cos, label=name, linewidth=1.4)
        ax.set_xlabel("communication round")
        ax.set_ylabel("cosine similarity of v_pt to the truth")
        ax.set_ylim(top=1.0)
        ax.grid(True, alpha=0.3)
        ax.legend(loc="lower right", fontsize=7)
        fig.tight_layout()
        fig.savefig(path, format="png")
    finally:
        plt.close(fig)
    return path
