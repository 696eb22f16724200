"""``dubhe-accuracy``: the accuracy of stored runs grouped by client-selection strategy.

A table formatter for experiments/dubhe/accuracy.toml: one row per selection strategy (Dubhe
with its H), the final and tail accuracy, minority accuracy and AUC (mean ± std over seeds),
and the accuracy curves as ``dubhe-accuracy.png``. ``secure-fl report`` finds it as a plug-in of
this package; :func:`main` runs it alone::

    python -c "import secure_fl.report.dubhe as r; r.main()" experiments/dubhe/accuracy.toml OUT
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from secure_fl.report.core import (
    RunRecord,
    TableContext,
    TableReport,
    build_report,
    format_mean_std,
    group_runs,
    markdown_table,
    plot_curves,
    register_table,
    summary_value,
)

__all__ = ["dubhe_accuracy", "selection_label"]


def selection_label(run: RunRecord) -> str:
    selection = run.config.get("selection", {})
    name = str(selection.get("name", "random"))
    if name == "dubhe":
        return f"Dubhe (H = {selection.get('tries', 1)})"
    return {"greedy": "greedy (full knowledge)", "random": "random"}.get(name, name)


@register_table("dubhe-accuracy", title="Accuracy by client selection (Dubhe, paper 004)",
                description="one row per selection strategy: final and tail accuracy, minority, AUC")
def dubhe_accuracy(runs: Sequence[RunRecord], ctx: TableContext) -> TableReport:
    """Rows: random, Dubhe (each H), greedy; columns: accuracy (final, tail), minority accuracy, AUC."""
    order = {"random": 0, "greedy (full knowledge)": 9}
    groups = group_runs(runs, selection_label)
    keys = sorted(groups, key=lambda k: (order.get(k, 1), k))
    body = []
    data: dict[str, dict[str, object]] = {}
    for key in keys:
        members = groups[key]
        final = [summary_value(r, "final") for r in members]
        tail = [summary_value(r, ctx.metric) for r in members]
        minority = [summary_value(r, ctx.metric, "minority_accuracy") for r in members]
        auc = [summary_value(r, ctx.metric, "auc") for r in members]
        body.append([key, str(len(members)), format_mean_std(final), format_mean_std(tail),
                     format_mean_std(minority), format_mean_std(auc, percent=False, digits=3)])
        data[key] = {"runs": [r.id for r in members], "final": final, "tail": tail}
    tail_rounds = runs[0].tail_rounds if runs else 0
    markdown = markdown_table(
        ["selection", "seeds", "final acc. (%)", f"last-{tail_rounds} acc. (%)", "minority acc. (%)", "AUC"], body)
    figures = []
    if ctx.out_dir is not None:
        figures.append(plot_curves({k: groups[k] for k in keys}, ctx.out_dir / "dubhe-accuracy.png",
                                   title="Fashion-MNIST, rho = 10, EMD_avg = 1.5: accuracy by selection"))
    return TableReport(name="dubhe-accuracy", markdown=markdown, figures=tuple(figures), data=data)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not 1 <= len(args) <= 3:
        print("usage: CONFIG [OUT_DIR] [WORKSPACE]", file=sys.stderr)
        return 2
    report, _ = build_report(args[0], "dubhe-accuracy", out_dir=args[1] if len(args) > 1 else None,
                             workspace=args[2] if len(args) > 2 else None)
    print(report.markdown)
    return 0
