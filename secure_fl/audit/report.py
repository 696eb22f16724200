"""The method × protocol audit matrix and its report: Markdown, JSON and a PNG heat map.

:func:`run_audit` audits every cell (:func:`~secure_fl.audit.runner.audit_cell`) on one shared
data set; :class:`AuditReport` renders the result. A cell whose method is not registered
yet is reported as "not available" — the audit works as methods land.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from secure_fl.audit.runner import (
    DEFAULT_METHODS,
    DEFAULT_PROTOCOLS,
    AuditSettings,
    CellResult,
    audit_cell,
    load_dataset_for,
)

__all__ = ["AuditReport", "run_audit"]

HEATMAP_PANELS = (
    ("max_advantage", "worst-case advantage\n(server alone, max over attacks)"),
    ("update_label_counts", "label counts from one\nround's update"),
    ("disaggregation", "multi-round\ndisaggregation"),
    ("collusion_threshold", "collusion threshold\n(clients needed)"),
)


def _fmt(value: Any, digits: int = 2) -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        if not math.isfinite(value):
            return "—"
        return f"{value:.{digits}f}"
    return str(value)


def _bytes(n: float | None) -> str:
    if n is None:
        return "—"
    for unit, size in (("MB", 1e6), ("kB", 1e3)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n:.0f} B"


@dataclass
class AuditReport:
    settings: AuditSettings
    methods: tuple[str, ...]
    protocols: tuple[str, ...]
    cells: list[CellResult]
    seconds: float
    mitigations: tuple[str, ...] = ("none",)

    def cell(self, method: str, protocol: str, mitigation: str | None = None) -> CellResult:
        wanted = self.mitigations[0] if mitigation is None else mitigation
        for c in self.cells:
            if c.method == method and c.protocol == protocol and c.mitigation == wanted:
                return c
        raise KeyError((method, protocol, wanted))

    # -- JSON ------------------------------------------------------------------------------------

    def as_json(self) -> dict[str, Any]:
        return {
            "settings": self.settings.as_dict(),
            "methods": list(self.methods),
            "protocols": list(self.protocols),
            "mitigations": list(self.mitigations),
            "seconds": round(self.seconds, 2),
            "cells": [c.as_json() for c in self.cells],
        }

    # -- Markdown --------------------------------------------------------------------------------

    def to_markdown(self) -> str:
        s = self.settings
        lines = [
            "# secure-fl leakage audit",
            "",
            (f"Data: {s.dataset}, {s.num_clients} clients ({s.partition} "
            f"{', '.join(f'{k}={v}' for k, v in s.partition_params.items())}), {s.clients_per_round} per round, "
            f"{s.rounds} rounds, MLP {list(s.hidden)}, lr {s.lr}, batch {s.batch_size}, seed {s.seed}. "
            f"Attacker's auxiliary data: {s.aux_per_class} test samples per class. "
            f"Audit time: {self.seconds:.1f} s."),
            "",
            ("Each cell runs the method with every statistic *and* the model updates summed through "
            "the protocol. `adv` is the largest advantage of any attack by the server alone "
            "(1 − L1/L1 of guessing P(y): 1 = exact, ≤ 0 = no better than the global distribution), "
            "`+coll.` the same with coalitions of the server and clients; `k_min` the smallest number of "
            "clients in any value a party other than its owner reads; `t` the collusion threshold (clients "
            "who, with the server or alone, read one honest client's value)."),
            "",
            "## Matrix",
            "",
            "| method | " + " | ".join(self.protocols) + " |",
            "|---|" + "---|" * len(self.protocols),
        ]
        for m in self.methods:
            row = [f"**{m}**"]
            for p in self.protocols:
                c = self.cell(m, p)
                if c.status != "ok" or c.summary is None:
                    row.append(c.status)
                else:
                    coll = c.max_advantage_with_collusion
                    extra = f" (+coll. {_fmt(coll)})" if coll is not None and coll != c.max_advantage else ""
                    row.append(f"adv {_fmt(c.max_advantage)}{extra} · k_min {_fmt(c.summary.k_min)} · "
                               f"t {_fmt(c.summary.collusion_threshold)} · "
                               f"{_bytes(c.summary.server_plaintext_bytes_per_client)}")
            lines.append("| " + " | ".join(row) + " |")
        lines += ["", ("Last figure per cell: bytes of each client's own values the server can read "
                      "(mean over clients, whole run)."), ""]
        names = sorted({a.name for c in self.cells for a in c.attacks})
        if names:
            lines += ["## Advantage per attack", ""]
            for name in names:
                lines += [f"**{name}**", "", "| method | " + " | ".join(self.protocols) + " |",
                          "|---|" + "---|" * len(self.protocols)]
                for m in self.methods:
                    row = [m]
                    for p in self.protocols:
                        c = self.cell(m, p)
                        hit = [a for a in c.attacks if a.name == name]
                        if not hit:
                            row.append("—" if c.status == "ok" else c.status)
                        else:
                            row.append(" / ".join(
                                (_fmt(a.advantage) if a.advantage is not None
                                 else f"exact {_fmt(a.exact_count_accuracy)}")
                                + ("" if a.party == "server" else f" ({a.party})") for a in hit))
                    lines.append("| " + " | ".join(row) + " |")
                lines.append("")
        lines += self._tradeoff_markdown()
        lines += ["## Cells", ""]
        for c in self.cells:
            lines += self._cell_markdown(c)
        return "\n".join(lines) + "\n"

    def _tradeoff_markdown(self) -> list[str]:
        """Per method × protocol × mitigation: the two multi-round attacks, ε, utility and its cost."""
        if self.mitigations == ("none",):
            return []
        lines = ["## Mitigations", "",
                 ("Disaggregation and update label inference: advantage of the server alone; ε: one ε per client, "
                  "every release composed at δ = the sum of the noised statistics' δ (∞: no formal guarantee); "
                  "tail accuracy: mean test accuracy over the last "
                  f"{min(self.settings.tail_rounds, self.settings.rounds)} rounds, Δ against no mitigation (points)."),
                 "", ("| method | protocol | mitigation | disaggregation | update labels | ε | tail acc. | Δ | "
                      "refusals / fallbacks / sets |"), "|---|---|---|---|---|---|---|---|---|"]
        for c in self.cells:
            if c.status != "ok":
                lines.append(f"| {c.method} | {c.protocol} | {c.mitigation} | {c.status}: "
                             f"{c.reason.splitlines()[0][:120] if c.reason else ''} | | | | | |")
                continue
            cost = c.selection_cost
            lines.append(
                f"| {c.method} | {c.protocol} | {c.mitigation} | {_fmt(_advantage(c, 'disaggregation'))} | "
                f"{_fmt(_advantage(c, 'update_label_counts'))} | {'∞' if c.epsilon is None else _fmt(c.epsilon)} | "
                f"{_fmt(None if c.tail_accuracy is None else 100 * c.tail_accuracy, 1)} | "
                f"{_fmt(None if c.accuracy_delta is None else 100 * c.accuracy_delta, 1)} | "
                f"{cost.get('refusals', '—')} / {cost.get('fallbacks', '—')} / {cost.get('distinct_sets', '—')} |")
        return lines + [""]

    def _cell_markdown(self, c: CellResult) -> list[str]:
        lines = [f"### {c.method} × {c.protocol}", ""]
        if c.status != "ok" or c.summary is None:
            return lines + [f"{c.status}: {c.reason}", ""]
        s = c.summary
        lines += [
            f"- server reads per client (plaintext): {_bytes(s.server_plaintext_bytes_per_client)}",
            f"- k_min: {_fmt(s.k_min)} (not counting the reader's own contribution: {_fmt(s.k_min_effective)})",
            (f"- collusion threshold: {_fmt(s.collusion_threshold)} "
            f"(protocol alone: {_fmt(s.protocol_collusion_threshold)})"),
        ]
        for name, kh in sorted(s.key_holders.items()):
            lines.append(f"- {name} key holder: {kh.mode}"
                         + (f" (agent client-{kh.agent})" if kh.agent is not None else ""))
        lines.append(f"- audit time: {c.seconds:.1f} s")
        if s.flags:
            lines += ["", "Flags:", ""] + [f"- ⚠ {f}" for f in s.flags]
        if c.attacks:
            lines += ["", ("| attack | party | L1 | trivial L1 | advantage | exact counts | top-1 (trivial) | "
                          "recoverable | rounds | note |"),
                      "|---|---|---|---|---|---|---|---|---|---|"]
            for a in c.attacks:
                top1 = "—" if a.top1_accuracy is None else \
                    f"{_fmt(a.top1_accuracy)} ({_fmt(a.trivial_top1_accuracy)})"
                lines.append(
                    f"| {a.name} | {a.party} | {_fmt(a.l1_error, 3)} | {_fmt(a.trivial_l1_error, 3)} | "
                    f"{_fmt(a.advantage)} | {_fmt(a.exact_count_accuracy)} | {top1} | "
                    f"{_fmt(a.recoverable_fraction)} | {_fmt(a.rounds)} | {a.note} |")
        stats = [st for st in s.statistics.values() if st.participants]
        if stats:
            lines += ["", ("| statistic | protocol | rounds | dim | k_min | server reads each | server learns sum | "
                          "isolatable clients |"), "|---|---|---|---|---|---|---|---|"]
            for st in stats:
                lines.append(
                    f"| {st.statistic} | {', '.join(st.protocols)} | {st.rounds} | {st.dimension} | "
                    f"{_fmt(st.k_min)} | {'yes' if st.server_reads_individual else 'no'} | "
                    f"{'yes' if st.server_learns_sum else 'no'} | {len(st.recoverable)}/{st.participants} |")
        if c.party_bytes:
            kinds = ("clear", "aggregate", "ciphertext", "masked", "sealed", "public")
            lines += ["", "Bytes received, by what the receiver can read:", "",
                      "| party | " + " | ".join(kinds) + " |", "|---|" + "---|" * len(kinds)]
            for party in sorted(c.party_bytes, key=lambda p: (p != "server", p)):
                row = c.party_bytes[party]
                lines.append(f"| {party} | " + " | ".join(_bytes(row.get(k, 0)) if row.get(k) else "·"
                                                        for k in kinds) + " |")
        if c.dp:
            lines += ["", "Differential privacy spent (formal):", "", "| scope | ε | δ | releases |", "|---|---|---|---|"]
            lines += [f"| {d['scope']} | {_fmt(d['epsilon'])} | {d['delta']:g} | {d['releases']} |" for d in c.dp]
        for note in c.notes:
            lines += ["", f"> {note.strip().splitlines()[0]}"]
        return lines + [""]

    # -- heat map --------------------------------------------------------------------------------

    def _panel_values(self, key: str, mitigation: str | None = None) -> list[list[float | None]]:
        out: list[list[float | None]] = []
        for m in self.methods:
            row: list[float | None] = []
            for p in self.protocols:
                c = self.cell(m, p, mitigation)
                if c.status != "ok" or c.summary is None:
                    row.append(None)
                elif key == "max_advantage":
                    row.append(c.max_advantage)
                elif key == "collusion_threshold":
                    t = c.summary.collusion_threshold
                    row.append(None if t is None else float(t))
                else:
                    hit = [a.advantage for a in c.attacks if a.name == key and a.advantage is not None]
                    row.append(hit[0] if hit else None)
            out.append(row)
        return out

    def heatmap(self, path: str | Path, mitigation: str | None = None) -> Path:
        """The heat map of one mitigation's cells (the first of :attr:`mitigations` by default)."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        import numpy as np

        panels = HEATMAP_PANELS
        fig, axes = plt.subplots(1, len(panels), figsize=(4.0 * len(panels) + 1, 0.55 * len(self.methods) + 2.6),
                                 squeeze=False)
        for index, (ax, (key, title)) in enumerate(zip(axes[0], panels)):
            values = self._panel_values(key, mitigation)
            grid = np.array([[np.nan if v is None else v for v in row] for row in values], dtype=float)
            top = 1.0
            if key == "collusion_threshold":
                top = max(float(np.nanmax(grid)) if np.isfinite(grid).any() else 1.0, 1.0)
                shown = 1.0 - np.clip(grid / top, 0.0, 1.0)  # red = few colluders needed
            else:
                shown = np.clip(grid, 0.0, 1.0)
            cmap = matplotlib.colormaps["Reds"].with_extremes(bad="#dddddd")
            image = ax.imshow(np.ma.masked_invalid(shown), cmap=cmap, vmin=0.0, vmax=1.0, aspect="auto")
            ax.set_xticks(range(len(self.protocols)), self.protocols, rotation=30, ha="right")
            ax.set_yticks(range(len(self.methods)), self.methods if index == 0 else [""] * len(self.methods))
            ax.set_xlabel("protocol", fontsize=8)
            if index == 0:
                ax.set_ylabel("method", fontsize=8)
            ax.set_title(title, fontsize=9)
            bar = fig.colorbar(image, ax=ax, fraction=0.05, pad=0.03)
            bar.ax.tick_params(labelsize=7)
            if key == "collusion_threshold":
                step = max(1, math.ceil(top / 4))
                counts = sorted({*range(0, int(top) + 1, step), int(top)})
                bar.set_ticks([1.0 - c / top for c in counts], labels=[str(c) for c in counts])
                bar.set_label("colluding clients needed\n(red: few; grey: n/a)", fontsize=7)
            else:
                bar.set_label("advantage over guessing\n(0 none, 1 exact; grey: n/a)", fontsize=7)
            for i, row in enumerate(values):
                for j, v in enumerate(row):
                    text = "n/a" if v is None else (f"{int(v)}" if key == "collusion_threshold" else f"{v:.2f}")
                    dark = v is not None and np.isfinite(shown[i, j]) and shown[i, j] > 0.6
                    ax.text(j, i, text, ha="center", va="center", fontsize=8, color="white" if dark else "black")
        s = self.settings
        shown_mitigation = self.mitigations[0] if mitigation is None else mitigation
        fig.suptitle(f"secure-fl leakage audit — {s.dataset}, {s.num_clients} clients, "
                     f"{s.clients_per_round}/round, {s.rounds} rounds"
                     + ("" if shown_mitigation == "none" else f" — mitigation: {shown_mitigation}"), fontsize=10)
        fig.tight_layout()
        out = Path(path)
        fig.savefig(out, dpi=120)
        plt.close(fig)
        return out

    # -- files -----------------------------------------------------------------------------------

    def write(self, directory: str | Path) -> dict[str, Path]:
        out = Path(directory)
        out.mkdir(parents=True, exist_ok=True)
        paths = {"markdown": out / "audit.md", "json": out / "audit.json", "heatmap": out / "audit.png"}
        paths["markdown"].write_text(self.to_markdown())
        paths["json"].write_text(json.dumps(self.as_json(), indent=2, default=_json_default) + "\n")
        self.heatmap(paths["heatmap"])
        for mitigation in self.mitigations[1:]:
            paths[f"heatmap-{mitigation}"] = self.heatmap(out / f"audit-{mitigation}.png", mitigation)
        if len(self.mitigations) > 1:
            paths["tradeoff"] = self.tradeoff_plot(out / "audit-tradeoff.png")
        return paths

    def tradeoff_plot(self, path: str | Path, *, protocol: str | None = None) -> Path:
        """Disaggregation advantage against tail accuracy: one line per method through its
        mitigations, under ``protocol`` (``masking`` when audited, else the first)."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        shown = protocol or ("masking" if "masking" in self.protocols else self.protocols[0])
        markers = dict(zip(self.mitigations, "osD^vP*X"))
        fig, ax = plt.subplots(figsize=(7.0, 4.6))
        for method in self.methods:
            points = []
            for mitigation in self.mitigations:
                c = self.cell(method, shown, mitigation)
                adv = _advantage(c, "disaggregation") if c.status == "ok" else None
                if adv is not None and c.tail_accuracy is not None:
                    points.append((100 * c.tail_accuracy, adv, mitigation))
            if not points:
                continue
            line = ax.plot([p[0] for p in points], [p[1] for p in points], "-", alpha=0.6, label=method)[0]
            for x, y, mitigation in points:
                ax.plot(x, y, markers.get(mitigation, "o"), color=line.get_color(), markersize=7)
                ax.annotate(mitigation, (x, y), textcoords="offset points", xytext=(4, 4), fontsize=7)
        ax.axhline(0.05, color="grey", linestyle=":", linewidth=1)
        ax.text(ax.get_xlim()[0], 0.05, " target 0.05", fontsize=7, va="bottom", color="grey")
        ax.set_xlabel(f"tail accuracy (%, mean of the last {min(self.settings.tail_rounds, self.settings.rounds)} "
                      "rounds)")
        ax.set_ylabel("disaggregation advantage (server alone)")
        ax.set_title(f"Mitigations under {shown}: leakage vs utility (markers: mitigation)", fontsize=10)
        ax.legend(fontsize=8, title="method", title_fontsize=8)
        ax.grid(alpha=0.3)
        fig.tight_layout()
        out = Path(path)
        fig.savefig(out, dpi=120)
        plt.close(fig)
        return out


def _advantage(cell: CellResult, name: str) -> float | None:
    """The server-alone advantage of attack ``name`` in ``cell`` (``None`` when not run)."""
    hits = [a.advantage for a in cell.attacks if a.name == name and a.party == "server" and a.advantage is not None]
    return max(hits) if hits else None


def _json_default(value: Any) -> Any:
    import numpy as np

    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.floating):
        return float(value)
    if isinstance(value, np.ndarray):
        return value.tolist()
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def run_audit(
    methods: Sequence[str] = DEFAULT_METHODS,
    protocols: Sequence[str] = DEFAULT_PROTOCOLS,
    settings: AuditSettings | None = None,
    *,
    mitigations: Sequence[str] = ("none",),
    progress: Callable[[CellResult, int, int], None] | None = None,
) -> AuditReport:
    """Audit every method × protocol × mitigation cell on the same data, one after another; each
    mitigated cell's accuracy delta is against the same method × protocol without mitigation
    (``None`` when ``none`` is not audited)."""
    settings = settings or AuditSettings()
    start = time.perf_counter()
    dataset = load_dataset_for(settings)
    cells: list[CellResult] = []
    total = len(methods) * len(protocols) * len(mitigations)
    for m in methods:
        for p in protocols:
            baseline: CellResult | None = None
            for mitigation in mitigations:
                cell = audit_cell(m, p, settings, dataset=dataset, mitigation=mitigation)
                if mitigation == "none":
                    baseline = cell
                cells.append(cell)
                if progress is not None:
                    progress(cell, len(cells), total)
            if baseline is not None and baseline.tail_accuracy is not None:
                for cell in cells[-len(mitigations):]:
                    if cell.tail_accuracy is not None:
                        cell.accuracy_delta = cell.tail_accuracy - baseline.tail_accuracy
    return AuditReport(settings=settings, methods=tuple(methods), protocols=tuple(protocols), cells=cells,
                       seconds=time.perf_counter() - start, mitigations=tuple(mitigations))
