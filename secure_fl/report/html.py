"""One self-contained HTML page for a set of runs (and, optionally, the leakage audit).

``secure-fl report RUNS --html FILE [--audit DIR]`` writes it: a summary table (the protocol of
each statistic, the update protocol, the selection, tail accuracy and minority accuracy, bytes,
the fraction clipped), accuracy curves, per-class accuracy, bytes per statistic and protocol
stage, and the audit's heat map and table when ``--audit`` names the folder ``secure-fl audit
--out`` wrote. Figures are PNGs inlined as ``data:`` URIs and the style is inline: the page
needs no network and no other file.
"""

from __future__ import annotations

import base64
import datetime as dt
import html
import io
import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from secure_fl.report.core import RunRecord, _summary

__all__ = ["UPDATE_SUMS", "html_report", "write_html"]

log = logging.getLogger("secure_fl.report")

UPDATE_SUMS = ("model_update", "control_update")
"""Model-sized sums: the *updates* column gives their protocol."""

_STYLE = """
body { font-family: -apple-system, "Segoe UI", Helvetica, Arial, sans-serif; margin: 2em auto; max-width: 1200px;
       color: #222; padding: 0 1em; }
h1 { font-size: 1.6em; margin-bottom: 0.2em; } h2 { font-size: 1.2em; margin-top: 2em; border-bottom: 1px solid #ddd; }
p.meta { color: #666; margin-top: 0; }
table { border-collapse: collapse; font-size: 0.85em; margin: 0.5em 0; }
th, td { border: 1px solid #ddd; padding: 0.3em 0.6em; text-align: right; vertical-align: top; }
th { background: #f4f4f4; } td.l, th.l { text-align: left; }
figure { margin: 1em 0; } figure img { max-width: 100%; border: 1px solid #eee; }
figcaption { color: #555; font-size: 0.85em; margin-top: 0.3em; }
code { background: #f4f4f4; padding: 0 0.2em; }
"""


def _png(fig: Any) -> str:
    """The figure as an inline ``<img>`` (PNG, base64)."""
    import matplotlib.pyplot as plt

    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110)
    plt.close(fig)
    data = base64.b64encode(buffer.getvalue()).decode("ascii")
    return f'<img alt="figure" src="data:image/png;base64,{data}">'


def _figure(img: str, caption: str) -> str:
    return f"<figure>{img}<figcaption>{html.escape(caption)}</figcaption></figure>"


def _mb(n: float) -> str:
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{int(n)} B"


def _pct(value: float | None) -> str:
    return "–" if value is None else f"{100 * value:.1f} %"


def _label(run: RunRecord) -> str:
    selection = _selection(run)
    return run.method + (f" + {selection}" if selection != "random" else "") + (
        f" ({run.loss})" if run.loss != "ce" else "")


def _selection(run: RunRecord) -> str:
    selection = run.config.get("selection", "random")
    return str(selection.get("name", "random") if isinstance(selection, dict) else selection)


def _protocols(run: RunRecord) -> dict[str, str]:
    out: dict[str, str] = {}
    for row in run.history:
        for release in row.releases:
            known = out.setdefault(release.statistic, release.protocol)
            if known != release.protocol:
                out[release.statistic] = "mixed"
    return out


def _clipped(run: RunRecord) -> dict[str, float]:
    clipped: dict[str, int] = {}
    values: dict[str, int] = {}
    for row in run.history:
        for release in row.releases:
            if release.clipped is None or release.values is None:
                continue
            clipped[release.statistic] = clipped.get(release.statistic, 0) + release.clipped
            values[release.statistic] = values.get(release.statistic, 0) + release.values
    return {name: clipped[name] / values[name] for name in clipped if values.get(name) and clipped[name]}


def _stage_bytes(run: RunRecord) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for row in run.history:
        stages = row.stage_bytes or {name: {"(all)": n} for name, n in row.bytes.items()}
        for name, by_stage in stages.items():
            total = out.setdefault(name, {})
            for stage, n in by_stage.items():
                total[stage] = total.get(stage, 0) + n
    return out


def _summary_table(runs: Sequence[RunRecord]) -> str:
    head = ("<tr><th class=l>run</th><th class=l>method</th><th class=l>statistics (protocol)</th>"
            "<th class=l>updates</th><th class=l>selection</th><th>rounds</th><th>tail accuracy</th>"
            "<th>tail minority</th><th>bytes</th><th class=l>clipped</th></tr>")
    rows = []
    for run in runs:
        protocols = _protocols(run)
        statistics = ", ".join(f"{n}: {p}" for n, p in sorted(protocols.items()) if n not in UPDATE_SUMS)
        updates = protocols.get("model_update", run.update_protocol)
        tail = _summary(run.history[-run.tail_rounds:])
        clipped = ", ".join(f"{n} {_pct(f)}" for n, f in sorted(_clipped(run).items())) or "–"
        total = sum(row.bytes_total for row in run.history)
        rows.append(
            f"<tr><td class=l><code>{run.id}</code></td><td class=l>{html.escape(_label(run))}</td>"
            f"<td class=l>{html.escape(statistics or run.protocol)}</td><td class=l>{html.escape(updates)}</td>"
            f"<td class=l>{html.escape(_selection(run))}</td><td>{len(run.history)}</td>"
            f"<td>{_pct(tail['accuracy'])}</td><td>{_pct(tail['minority_accuracy'])}</td><td>{_mb(total)}</td>"
            f"<td class=l>{html.escape(clipped)}</td></tr>")
    return f"<table>{head}{''.join(rows)}</table>"


def _accuracy_figure(runs: Sequence[RunRecord]) -> str:
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8), sharex=True)
    for run in runs:
        x = [row.round + 1 for row in run.history]
        (line,) = axes[0].plot(x, [100 * (row.accuracy or 0.0) for row in run.history], label=_label(run))
        axes[1].plot(x, [100 * (row.minority_accuracy or 0.0) for row in run.history], color=line.get_color())
    axes[0].set_title("test accuracy", fontsize=10)
    axes[1].set_title("minority accuracy (worst minority class)", fontsize=10)
    for ax in axes:
        ax.set_xlabel("round")
        ax.set_ylabel("%")
        ax.grid(True, alpha=0.3)
    axes[0].legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    return _png(fig)


def _per_class_figure(runs: Sequence[RunRecord]) -> str:
    import matplotlib.pyplot as plt
    import numpy as np

    tails = [_summary(run.history[-run.tail_rounds:])["per_class_accuracy"] for run in runs]
    classes = max((len(t) for t in tails), default=0)
    minority = set(runs[0].config.get("data", {}).get("minority_classes", [])) if runs else set()
    fig, ax = plt.subplots(figsize=(11, 3.8))
    width = 0.8 / max(len(runs), 1)
    for i, (run, tail) in enumerate(zip(runs, tails)):
        values = [100 * (v or 0.0) for v in tail] + [0.0] * (classes - len(tail))
        ax.bar(np.arange(classes) + (i - (len(runs) - 1) / 2) * width, values, width, label=_label(run))
    ax.set_xticks(range(classes), [f"{k}{' (minority)' if k in minority else ''}" for k in range(classes)],
                  fontsize=8)
    ax.set_xlabel("class")
    ax.set_ylabel("tail accuracy (%)")
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize=8, ncol=min(len(runs), 5), loc="upper center", bbox_to_anchor=(0.5, -0.15))
    fig.tight_layout()
    return _png(fig)


def _bytes_figure(runs: Sequence[RunRecord]) -> str:
    import matplotlib.pyplot as plt

    per_run = [_stage_bytes(run) for run in runs]
    stages = sorted({stage for data in per_run for by_stage in data.values() for stage in by_stage})
    colours = {stage: plt.get_cmap("tab20")(i % 20) for i, stage in enumerate(stages)}
    height = max(2.0, 0.28 * sum(len(d) for d in per_run) + 0.9 * len(runs))
    fig, axes = plt.subplots(len(runs), 1, figsize=(11, height), squeeze=False,
                             gridspec_kw={"height_ratios": [max(len(d), 1) for d in per_run]})
    for ax, run, data in zip(axes[:, 0], runs, per_run):
        names = sorted(data, key=lambda n: sum(data[n].values()))
        widest = max((sum(data[n].values()) for n in names), default=1) / 1e6
        for y, name in enumerate(names):
            left = 0.0
            for stage in stages:
                n = data[name].get(stage, 0) / 1e6
                if n:
                    ax.barh(y, n, left=left, color=colours[stage], label=stage)
                    left += n
            ax.text(left + 0.01 * widest, y, _mb(sum(data[name].values())), va="center", fontsize=7)
        ax.set_xlim(0, widest * 1.12)
        ax.set_yticks(range(len(names)), names, fontsize=8)
        ax.set_title(f"{_label(run)} — {run.id}", fontsize=9, loc="left")
        ax.set_xlabel("MB (whole run)", fontsize=8)
        ax.grid(True, axis="x", alpha=0.3)
    from matplotlib.patches import Patch

    handles = [Patch(color=colours[s]) for s in stages]
    fig.legend(handles, stages, fontsize=7, loc="upper right", title="protocol stage", title_fontsize=8)
    fig.tight_layout(rect=(0, 0, 0.84, 1))
    return _png(fig)


def _bytes_table(runs: Sequence[RunRecord]) -> str:
    rows = []
    for run in runs:
        for name, by_stage in sorted(_stage_bytes(run).items()):
            stages = ", ".join(f"{stage} {_mb(n)}" for stage, n in sorted(by_stage.items(), key=lambda kv: -kv[1]))
            rows.append(f"<tr><td class=l><code>{run.id}</code></td><td class=l>{html.escape(name)}</td>"
                        f"<td>{_mb(sum(by_stage.values()))}</td><td class=l>{html.escape(stages)}</td></tr>")
    return ("<details><summary>bytes by statistic and stage, as a table</summary><table><tr><th class=l>run</th>"
            "<th class=l>statistic</th><th>bytes</th><th class=l>by stage</th></tr>" + "".join(rows) +
            "</table></details>")


def _number(value: Any) -> str:
    return "–" if not isinstance(value, (int, float)) else f"{value:.0f}"


def _audit_section(audit: Path) -> str:
    parts = ["<h2>Leakage audit</h2>"]
    png = audit / "audit.png"
    data = audit / "audit.json"
    if png.is_file():
        encoded = base64.b64encode(png.read_bytes()).decode("ascii")
        parts.append(_figure(f'<img alt="audit heat map" src="data:image/png;base64,{encoded}">',
                             "What the server learns per method × protocol: the advantage over guessing the global "
                             "distribution of each attack on exactly the messages it received (0: none, 1: exact), "
                             "and how many clients must collude with it."))
    if data.is_file():
        report = json.loads(data.read_text())
        rows = []
        for cell in report.get("cells", []):
            adv = cell.get("max_advantage")
            rows.append(f"<tr><td class=l>{html.escape(str(cell.get('method')))}</td>"
                        f"<td class=l>{html.escape(str(cell.get('protocol')))}</td>"
                        f"<td class=l>{html.escape(str(cell.get('status')))}</td>"
                        f"<td>{'–' if adv is None else f'{adv:.2f}'}</td><td>{cell.get('k_min', '–')}</td>"
                        f"<td>{cell.get('collusion_threshold', '–')}</td>"
                        f"<td>{_number(cell.get('server_plaintext_bytes_per_client'))}</td></tr>")
        parts.append("<table><tr><th class=l>method</th><th class=l>protocol</th><th class=l>status</th>"
                     "<th>max advantage</th><th>k<sub>min</sub></th><th>colluders needed</th>"
                     "<th>server plaintext B/client</th></tr>" + "".join(rows) + "</table>")
    if len(parts) == 1:
        parts.append(f"<p>No audit in {html.escape(str(audit))} (run <code>secure-fl audit --out DIR</code>).</p>")
    return "\n".join(parts)


def html_report(runs: Sequence[RunRecord], *, audit: Path | None = None, title: str = "secure-fl report",
                source: str = "") -> str:
    """The page (a string); see the module docstring."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    when = dt.datetime.now().strftime("%Y-%m-%d %H:%M")
    body = [f"<h1>{html.escape(title)}</h1>",
            f"<p class=meta>{len(runs)} runs{(' from ' + html.escape(source)) if source else ''}; written {when}</p>",
            "<h2>Runs</h2>", _summary_table(runs)]
    if runs:
        log.info("report: drawing accuracy curves, per-class accuracy and bytes for %d runs", len(runs))
        tail = runs[0].tail_rounds
        body += ["<h2>Accuracy</h2>", _figure(_accuracy_figure(runs), "Test accuracy and the worst minority class's "
                                                                      "accuracy after each round."),
                 "<h2>Per-class accuracy</h2>",
                 _figure(_per_class_figure(runs), f"Mean over the last {tail} rounds, per class."),
                 "<h2>Bytes per statistic and stage</h2>",
                 _figure(_bytes_figure(runs), "Every message of each run, by the statistic it carried and the "
                                              "protocol stage it belonged to (model_broadcast: the global model sent "
                                              "to the cohort; setup: key set-up)."),
                 _bytes_table(runs)]
    if audit is not None:
        body.append(_audit_section(audit))
    return ("<!DOCTYPE html>\n<html lang=en><head><meta charset=utf-8><title>" + html.escape(title) +
            "</title><style>" + _STYLE + "</style></head><body>\n" + "\n".join(body) + "\n</body></html>\n")


def write_html(path: str | Path, runs: Sequence[RunRecord], *, audit: str | Path | None = None,
               title: str = "secure-fl report", source: str = "") -> Path:
    """Write :func:`html_report` to ``path`` (folders created) and return the path."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(html_report(runs, audit=None if audit is None else Path(audit), title=title, source=source),
                   encoding="utf-8")
    return out
