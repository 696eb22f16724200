"""Dubhe's selection figures and tables (paper 004, §6.3) from a TOML config: Fig. 9, Table 2, Fig. 10.

Run with ``secure-fl select --experiment experiments/dubhe/selection.toml --out results/dubhe``.
One population and one registration (key set-up, σ search at ``study.per_round``, registry)
serve every output of a config, so the Paillier cost is paid once::

    name = "dubhe-selection"      seed = 0
    outputs = ["fig9", "table2", "fig10"]
    [population]  clients, rho, emd_avg, classes, samples_per_class
    [study]       repeats, per_round (K of the search, Table 2 and Fig. 10),
                  participation = [10, 20, ...] (Fig. 9), tries = [1, 2, 5, 10, 20] (Table 2),
                  strategies = ["random", "greedy", "dubhe"] (Fig. 9)
    [dubhe]       DubheParams fields (protocol, key_bits, sigma, search_grid, search_tries, ...)

Outputs under ``--out``: ``<name>.json`` (every number), ``<name>.md`` (the tables) and
``fig9.png`` / ``fig10.png``. Random streams are keyed by (seed, output, strategy, K or H, repeat).
"""

from __future__ import annotations

import json
import logging
import time
import tomllib
from collections.abc import Callable
from dataclasses import fields
from pathlib import Path
from typing import Any

import numpy as np

from .base import Population, dubhe_population
from .baselines import GreedySelector, RandomSelector
from .dubhe import STATISTICS, DubheParams
from .dubhe_embedded import DubheSelector
from .study import server_view

__all__ = ["run_experiment"]

OUTPUTS = ("fig9", "table2", "fig10")
STRATEGIES = ("random", "greedy", "dubhe")
TOP_LEVEL = {"name", "seed", "outputs", "population", "study", "dubhe", "description"}
POPULATION_KEYS = {"clients", "rho", "emd_avg", "classes", "samples_per_class"}
STUDY_KEYS = {"repeats", "per_round", "participation", "tries", "strategies", "fig9_tries"}


def _load(path: Path) -> dict[str, Any]:
    try:
        raw = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as error:
        raise ValueError(f"{path}: not valid TOML: {error}") from None
    for key, allowed in (("", TOP_LEVEL), ("population", POPULATION_KEYS), ("study", STUDY_KEYS)):
        table = raw if not key else raw.get(key, {})
        unknown = set(table) - allowed
        if unknown:
            where = f"[{key}] " if key else ""
            raise ValueError(f"{path}: unknown {where}key(s) {sorted(unknown)}; known: {sorted(allowed)}")
    known_dubhe = {f.name for f in fields(DubheParams)}
    unknown = set(raw.get("dubhe", {})) - known_dubhe
    if unknown:
        raise ValueError(f"{path}: unknown [dubhe] key(s) {sorted(unknown)}; known: {sorted(known_dubhe)}")
    outputs = raw.get("outputs", list(OUTPUTS))
    if not outputs or set(outputs) - set(OUTPUTS):
        raise ValueError(f"{path}: outputs must be a non-empty subset of {list(OUTPUTS)}")
    strategies = raw.get("study", {}).get("strategies", list(STRATEGIES))
    if set(strategies) - set(STRATEGIES):
        raise ValueError(f"{path}: strategies must be among {list(STRATEGIES)}")
    return raw


class _Study:
    """The shared population and registered selectors of one config."""

    def __init__(self, raw: dict[str, Any], log: Callable[[str], None]) -> None:
        self.raw, self.log = raw, log
        self.seed = int(raw.get("seed", 0))
        pop = raw.get("population", {})
        study = raw.get("study", {})
        self.repeats = int(study.get("repeats", 100))
        self.per_round = int(study.get("per_round", 20))
        self.participation = [int(k) for k in study.get("participation", [10, 20, 50, 100, 200, 500, 1000])]
        self.tries = [int(h) for h in study.get("tries", [1, 2, 5, 10, 20])]
        self.strategies = list(study.get("strategies", list(STRATEGIES)))
        self.fig9_tries = int(study.get("fig9_tries", 1))
        start = time.perf_counter()
        self.population: Population = dubhe_population(
            num_clients=int(pop.get("clients", 1000)), rho=float(pop.get("rho", 10.0)),
            emd_avg=float(pop.get("emd_avg", 1.5)), rng=np.random.default_rng([self.seed, 0]),
            num_classes=int(pop.get("classes", 10)), samples_per_class=int(pop.get("samples_per_class", 6000)),
            profile=pop.get("profile", "dirichlet"),
        )
        n = self.population.num_clients
        if any(not 1 <= k <= n for k in [self.per_round, *self.participation]):
            raise ValueError(f"per_round and participation must lie in [1, {n}]")
        options = dict(raw.get("dubhe", {}))
        # The registration uploads encrypted counts only when some output selects with H > 1.
        options.setdefault("tries", max([*self.tries, self.fig9_tries]) if "table2" in raw.get("outputs", OUTPUTS)
                           else self.fig9_tries)
        self.params = DubheParams(**options)
        self.dubhe = DubheSelector(self.params)
        log(f"population: {n} clients, rho={pop.get('rho', 10.0)}, EMD_avg={pop.get('emd_avg', 1.5)}; "
            f"registering Dubhe ({self.params.protocol}"
            f"{', ' + str(self.params.key_bits) + '-bit keys' if self.params.protocol == 'paillier' else ''}) ...")
        self.dubhe.register(self.population, np.random.default_rng([self.seed, 1]), per_round=self.per_round)
        self.random = RandomSelector()
        self.random.register(self.population, np.random.default_rng(0), per_round=self.per_round)
        self.greedy = GreedySelector()
        self.greedy.register(self.population, np.random.default_rng(0), per_round=self.per_round)
        assert self.dubhe.sigma is not None
        log(f"registered in {time.perf_counter() - start:.1f} s; sigma = {self.dubhe.sigma}")

    def selections(self, strategy: str, k: int, *, output: int, key: int, tries: int | None = None) -> list[float]:
        out = []
        for r in range(self.repeats):
            rng = np.random.default_rng([self.seed, 10 + output, STRATEGIES.index(strategy), key, r])
            if strategy == "dubhe":
                chosen = self.dubhe.select(k, rng, round=r, tries=tries)
            elif strategy == "greedy":
                chosen = self.greedy.select(k, rng, round=r)
            else:
                chosen = self.random.select(k, rng, round=r)
            out.append(self.population.l1(chosen))
        return out

    def header(self) -> dict[str, Any]:
        pop = self.population
        dubhe = self.dubhe
        assert dubhe.sigma is not None and dubhe.codebook is not None and dubhe.overall is not None
        timings = {k: round(v, 4) for k, v in dubhe.timings.items() if k != "selection"}
        info: dict[str, Any] = {
            "clients": pop.num_clients, "classes": pop.num_classes, "repeats": self.repeats,
            "per_round": self.per_round, "seed": self.seed,
            "rho_achieved": float(pop.counts.sum(axis=0).max() / max(1, pop.counts.sum(axis=0).min())),
            "baseline_l1": pop.baseline_l1(),
            "global_distribution": pop.global_distribution.tolist(),
            "dubhe": {
                "protocol": self.params.protocol, "key_bits": self.params.key_bits,
                "reference_set": list(dubhe.codebook.reference_set), "registry_length": dubhe.codebook.length,
                "sigma": {str(i): v for i, v in dubhe.sigma.items()}, "searched": self.params.sigma is None,
                "search_tries": self.params.search_tries, "seconds": timings,
                "bytes": dubhe.transcript.bytes_by_statistic(),
            },
        }
        if self.params.protocol == "paillier":
            info["dubhe"]["server_received"] = server_view(dubhe.transcript)
        return info


def _stats(values: list[float]) -> dict[str, float]:
    return {"mean": float(np.mean(values)), "std": float(np.std(values))}


def _fig9(study: _Study, out: Path) -> tuple[dict[str, Any], str]:
    n = study.population.num_clients
    rows: dict[str, dict[str, dict[str, float]]] = {}
    for k in study.participation:
        rows[str(k)] = {}
        for strategy in study.strategies:
            rows[str(k)][strategy] = _stats(study.selections(strategy, k, output=0, key=k,
                                                             tries=study.fig9_tries))
        study.log(f"fig9 K={k}: " + ", ".join(f"{s} {v['mean']:.3f}" for s, v in rows[str(k)].items()))
    lines = [(f"### Fig. 9 — ‖p_o − p_u‖₁ over participation (Dubhe H = {study.fig9_tries}; mean ± std over "
              f"{study.repeats} selections); baseline ‖p_g − p_u‖₁ = {study.population.baseline_l1():.4f}"), "",
             "| K / N | " + " | ".join(study.strategies) + " | Dubhe vs random |",
             "|---|" + "---|" * (len(study.strategies) + 1)]
    for label, row in rows.items():
        cells = [f"{row[s]['mean']:.4f} ± {row[s]['std']:.4f}" for s in study.strategies]
        gain = ""
        if "dubhe" in row and "random" in row and row["random"]["mean"] > 0:
            gain = f"{100 * (1 - row['dubhe']['mean'] / row['random']['mean']):.1f} % lower"
        lines.append(f"| {label}/{n} | " + " | ".join(cells) + f" | {gain} |")
    _plot_fig9(study, rows, out / "fig9.png")
    return {"rows": rows, "png": "fig9.png"}, "\n".join(lines)


def _plot_fig9(study: _Study, rows: dict[str, dict[str, dict[str, float]]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = study.population.num_clients
    labels = [f"{k}/{n}" for k in rows]
    x = np.arange(len(labels))
    width = 0.8 / len(study.strategies)
    fig, ax = plt.subplots(figsize=(8, 4))
    for i, strategy in enumerate(study.strategies):
        means = [rows[k][strategy]["mean"] for k in rows]
        stds = [rows[k][strategy]["std"] for k in rows]
        ax.bar(x + (i - (len(study.strategies) - 1) / 2) * width, means, width, yerr=stds, capsize=2,
               label=strategy)
    ax.axhline(study.population.baseline_l1(), color="k", linestyle="--", linewidth=1,
               label="baseline ‖p_g − p_u‖₁")
    ax.set_xticks(x, labels)
    ax.set_xlabel("participation K / N")
    ax.set_ylabel("‖p_o − p_u‖₁")
    ax.set_title(f"Data unbiasedness, ρ = {study.raw.get('population', {}).get('rho', 10.0)}, "
                 f"EMD_avg = {study.raw.get('population', {}).get('emd_avg', 1.5)}, {study.repeats} selections")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _table2(study: _Study, out: Path) -> tuple[dict[str, Any], str]:
    k = study.per_round
    random_row = _stats(study.selections("random", k, output=1, key=0))
    greedy_row = _stats(study.selections("greedy", k, output=1, key=0))
    rows: dict[str, dict[str, float]] = {}
    transcript = study.dubhe.transcript
    for h in study.tries:
        before_bytes = transcript.bytes_by_statistic().get(STATISTICS["selection"], 0)
        before_seconds = study.dubhe.timings.get("selection", 0.0)
        row = _stats(study.selections("dubhe", k, output=1, key=h, tries=h))
        row["reduction_vs_random"] = 1 - row["mean"] / random_row["mean"]
        row["seconds_per_round"] = (study.dubhe.timings.get("selection", 0.0) - before_seconds) / study.repeats
        row["bytes_per_round"] = (transcript.bytes_by_statistic().get(STATISTICS["selection"], 0)
                                  - before_bytes) / study.repeats
        rows[str(h)] = row
        study.log(f"table2 H={h}: EMD* {row['mean']:.4f} ({100 * row['reduction_vs_random']:.1f} % below random)")
    lines = [f"### Table 2 — multi-time selection, K = {k}, {study.repeats} selections per H", "",
             "| H | " + " | ".join(rows) + " | opt (greedy) | random |",
             "|---|" + "---|" * (len(rows) + 2),
             "| EMD* = ‖p_o,h* − p_u‖₁ | " + " | ".join(f"{r['mean']:.4f}" for r in rows.values())
             + f" | {greedy_row['mean']:.4f} | {random_row['mean']:.4f} |",
             "| std | " + " | ".join(f"{r['std']:.4f}" for r in rows.values())
             + f" | {greedy_row['std']:.4f} | {random_row['std']:.4f} |",
             "| lower than random | " + " | ".join(f"{100 * r['reduction_vs_random']:.1f} %" for r in rows.values())
             + f" | {100 * (1 - greedy_row['mean'] / random_row['mean']):.1f} % | — |",
             "| selection s / round | " + " | ".join(f"{r['seconds_per_round']:.3f}" for r in rows.values())
             + " | | |",
             "| selection bytes / round | " + " | ".join(f"{r['bytes_per_round']:.0f}" for r in rows.values())
             + " | | |"]
    return {"rows": rows, "greedy": greedy_row, "random": random_row}, "\n".join(lines)


def _fig10(study: _Study, out: Path) -> tuple[dict[str, Any], str]:
    pop = study.population
    k = study.per_round
    dists = []
    for r in range(study.repeats):
        rng = np.random.default_rng([study.seed, 12, 0, r])
        dists.append(pop.distribution(study.dubhe.select(k, rng, round=r, tries=1)))
    participation = np.mean(dists, axis=0)
    dubhe = study.dubhe
    assert dubhe.codebook is not None and dubhe.overall is not None and dubhe.sigma is not None
    registry = {",".join(map(str, dubhe.codebook.category(i))): int(v)
                for i, v in enumerate(dubhe.overall) if v}
    _plot_fig10(study, participation, out / "fig10.png")
    lines = [(f"### Fig. 10 — overall registry (σ = {dubhe.sigma}) and the mean participation over "
              f"{study.repeats} selections, K = {k}"), "",
             "non-empty categories: " + ", ".join(f"({c}): {v}" for c, v in registry.items()), "",
             "| class | " + " | ".join(str(j) for j in range(pop.num_classes)) + " |",
             "|---|" + "---|" * pop.num_classes,
             "| global p_g | " + " | ".join(f"{v:.4f}" for v in pop.global_distribution) + " |",
             "| Dubhe participation | " + " | ".join(f"{v:.4f}" for v in participation) + " |"]
    return {"registry": registry, "participation": participation.tolist(), "png": "fig10.png",
            "nonzero_categories": len(registry)}, "\n".join(lines)


def _plot_fig10(study: _Study, participation: np.ndarray, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    dubhe = study.dubhe
    assert dubhe.codebook is not None and dubhe.overall is not None
    book, overall = dubhe.codebook, dubhe.overall
    c = book.num_classes
    blocks = [i for i in book.reference_set]
    fig = plt.figure(figsize=(11, 4.5))
    grid = fig.add_gridspec(2, 2, width_ratios=[1.2, 1], height_ratios=[1, 4])
    ax_top = fig.add_subplot(grid[0, 0])
    ax_pair = fig.add_subplot(grid[1, 0])
    ax_bar = fig.add_subplot(grid[:, 1])
    # R_A,1 and R_A,C as one strip; R_A,2 as an upper-triangular matrix (when 2 ∈ G).
    singles = [int(overall[book.index((j,))]) if 1 in blocks else 0 for j in range(c)]
    strip = np.array([singles + [int(overall[book.index(tuple(range(c)))])]], dtype=float)
    ax_top.imshow(strip, cmap="Blues", aspect="auto")
    for j, v in enumerate(strip[0]):
        ax_top.text(j, 0, f"{int(v)}", ha="center", va="center", fontsize=8)
    ax_top.set_xticks(range(c + 1), [f"({j})" for j in range(c)] + ["none"], fontsize=7)
    ax_top.set_yticks([])
    ax_top.set_title("R_A,1 (one dominating class) and R_A,C (none)", fontsize=9)
    pair = np.full((c, c), np.nan)
    if 2 in blocks:
        for a in range(c):
            for b in range(a + 1, c):
                pair[a, b] = overall[book.index((a, b))]
    image = ax_pair.imshow(pair, cmap="Blues")
    fig.colorbar(image, ax=ax_pair, fraction=0.04, pad=0.02, label="clients")
    ax_pair.set_xlabel("class b", fontsize=8)
    ax_pair.set_ylabel("class a", fontsize=8)
    for a in range(c):
        for b in range(a + 1, c):
            if not np.isnan(pair[a, b]):
                ax_pair.text(b, a, f"{int(pair[a, b])}", ha="center", va="center", fontsize=7)
    ax_pair.set_xticks(range(c))
    ax_pair.set_yticks(range(c))
    ax_pair.set_title("R_A,2 (two dominating classes a < b)" if 2 in blocks else "(2 ∉ G)", fontsize=9)
    x = np.arange(c)
    ax_bar.bar(x - 0.2, study.population.global_distribution, 0.4, label="global p_g")
    ax_bar.bar(x + 0.2, participation, 0.4, label="Dubhe participation (mean p_o)")
    ax_bar.axhline(1.0 / c, color="k", linestyle="--", linewidth=1, label="uniform")
    ax_bar.set_xticks(x)
    ax_bar.set_xlabel("class")
    ax_bar.set_ylabel("proportion")
    ax_bar.legend(fontsize=8)
    sigma = ", ".join(f"σ_{i}={v}" for i, v in (dubhe.sigma or {}).items())
    fig.suptitle(f"Overall registry, N = {study.population.num_clients}, {sigma}; participation over "
                 f"{study.repeats} selections (K = {study.per_round})", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def run_experiment(path: Path, *, out: Path, progress: bool = True) -> dict[str, Any]:
    """Run the outputs a config asks for; write JSON, markdown and PNGs under ``out``."""
    raw = _load(Path(path))

    def log(message: str) -> None:
        if progress:
            logging.getLogger("secure_fl.select").info("%s", message)

    out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    study = _Study(raw, log)
    results: dict[str, Any] = {}
    sections = []
    builders = {"fig9": _fig9, "table2": _table2, "fig10": _fig10}
    for output in raw.get("outputs", list(OUTPUTS)):
        data, text = builders[output](study, out)
        results[output] = data
        sections.append(text)
    summary: dict[str, Any] = {"name": raw.get("name", Path(path).stem), "config": str(path), **study.header(),
                               **results}
    summary["seconds_total"] = time.perf_counter() - start
    dubhe = summary["dubhe"]
    intro = (f"## {summary['name']}\n\nN = {summary['clients']}, K = {summary['per_round']}, "
             f"rho = {raw.get('population', {}).get('rho', 10.0)}, EMD_avg = "
             f"{raw.get('population', {}).get('emd_avg', 1.5)}, seed {summary['seed']}; Dubhe on "
             f"{dubhe['protocol']}, G = {dubhe['reference_set']}, σ = {dubhe['sigma']} "
             f"({'searched' if dubhe['searched'] else 'given'}); registration seconds {dubhe['seconds']}.\n")
    report = intro + "\n" + "\n\n".join(sections) + "\n"
    summary["report"] = report
    name = summary["name"]
    (out / f"{name}.md").write_text(report)
    (out / f"{name}.json").write_text(json.dumps({k: v for k, v in summary.items() if k != "report"}, indent=1))
    log(f"wrote {out / (name + '.md')}, {out / (name + '.json')} in {summary['seconds_total']:.1f} s")
    return summary
