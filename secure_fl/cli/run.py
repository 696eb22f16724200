"""``secure-fl run CONFIG``: execute a config's runs, store them round by round, print results.

People get progress bars (per run over rounds, per round over clients, on stderr when it is
a terminal), a table of per-round metrics for every run and a summary table; ``--json``
prints one object instead::

    {"runs": [{"id", "method", "loss", "protocol", "update_protocol", "rounds",
               "final": {"accuracy", "minority_accuracy", "auc", "per_class_accuracy"},
               "tail": {same keys}, "bytes": {"total", "by_statistic"},
               "statistics": {NAME: {"protocol", "bytes", "clipped", "releases"}}, ...}]}

``protocol`` is the run's default for statistics and ``update_protocol`` the model updates';
``statistics`` says which protocol each statistic actually went through, what its messages
cost and how many entries its contributors clipped (``null`` when not counted: noised).

plus, only when the run used DP, ``"privacy": {"epsilon", "delta", ...}`` (the worst
client's DP-SGD ε so far) and, only when the method reports round metrics,
``"metrics": {"final": {...}, "tail": {...}}``; the tables then get ε and metric columns.

``--resume RUN_ID`` continues the batch that run belongs to (after a crash or a kill): done
runs are reported from the store, the interrupted one continues after its last stored round.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from typing import Any, TextIO

from secure_fl.device import DEVICE_CHOICES

__all__ = ["format_rounds", "format_summary", "format_value", "register", "run", "text_table"]


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = subparsers.add_parser(
        "run",
        help="run the federated experiments a TOML config defines",
        description="Run every run CONFIG defines (methods × protocols × seeds ...), in turn, "
                    "storing each round in the workspace's SQLite store as it ends.",
    )
    parser.add_argument("config", metavar="CONFIG", help="experiment config (TOML), e.g. experiments/demo.toml")
    parser.add_argument("--resume", metavar="RUN_ID", help="continue the interrupted batch this run belongs to")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    parser.add_argument("--workspace", metavar="DIR",
                        help="where the run store lives (default: $SECURE_FL_WORKSPACE or ./runs)")
    parser.add_argument("--device", default="auto", choices=DEVICE_CHOICES,
                        help="training device (default auto: CUDA when present)")
    parser.add_argument("--threads", default="auto", metavar="N",
                        help="torch intra-op CPU threads (default auto: half the cores)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    parser.set_defaults(func=run)


def format_value(value: Any, spec: str = ".4f") -> str:
    """A metric for a table: ``-`` for missing values."""
    if value is None:
        return "-"
    if isinstance(value, float):
        return format(value, spec)
    return str(value)


def text_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A plain-text table: first column left-aligned, the others right-aligned."""
    widths = [max([len(h), *(len(r[i]) for r in rows)]) for i, h in enumerate(headers)]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths)))

    return "\n".join([line(headers), line(["-" * w for w in widths]), *(line(r) for r in rows)])


def _bytes(n: int) -> str:
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def _epsilon(value: float | None) -> str:
    return "inf" if value is None else format(value, ".3f")


def _extra_columns(history: Sequence[Any]) -> tuple[list[str], list[Any]]:
    """Privacy and method-metric columns present in a run's rounds: (headers, cell functions)."""
    from secure_fl.privacy import MODEL, RUN

    headers: list[str] = []
    cells: list[Any] = []
    scopes = sorted({name for r in history for name in getattr(r, "privacy", {})})
    if MODEL in scopes:
        delta = next(r.privacy[MODEL].delta for r in history if MODEL in r.privacy)
        headers += [f"DP-SGD ε max (δ={delta:g})", "ε mean"]
        cells += [lambda r: _epsilon(r.privacy[MODEL].epsilon) if MODEL in r.privacy else "-",
                  lambda r: _epsilon(r.privacy[MODEL].epsilon_mean) if MODEL in r.privacy else "-"]
    for name in [s for s in scopes if s not in (MODEL, RUN)] + ([RUN] if RUN in scopes else []):
        headers.append(f"ε {name}" if name != RUN else "ε run")
        cells.append(lambda r, n=name: _epsilon(r.privacy[n].epsilon) if n in r.privacy else "-")
    for name in sorted({name for r in history for name in getattr(r, "metrics", {})}):
        headers.append(name)
        cells.append(lambda r, n=name: format_value(r.metrics.get(n), ".4g"))
    return headers, cells


def format_rounds(summary: Any) -> str:
    """Per-round metrics of one run (with ε columns under DP and the method's own metrics)."""
    extra_headers, extra_cells = _extra_columns(summary.history)
    rows = [
        [str(r.round + 1), format_value(r.accuracy), format_value(r.minority_accuracy), format_value(r.auc), format_value(r.train_loss),
         format_value(r.test_loss), str(len(r.clients)), _bytes(r.bytes_total), f"{r.seconds:.2f}",
         *(cell(r) for cell in extra_cells)]
        for r in summary.history
    ]
    title = f"run {summary.id} — {summary.method}/{summary.loss}, statistics: {statistics_cell(summary)}, " \
            f"updates: {summary.update_protocol}, seed {summary.seed}"
    if summary.label:
        title += f" ({summary.label})"
    headers = ["round", "accuracy", "minority", "AUC", "train loss", "test loss", "clients", "bytes", "s",
               *extra_headers]
    return f"{title}\n{text_table(headers, rows)}"


UPDATE_SUMS = frozenset({"model_update", "control_update"})
"""Model-sized sums: the *updates* column shows their protocol."""


def protocols_text(protocols: Mapping[str, str], default: str) -> str:
    """``name:protocol, ...`` (model-sized sums left out), or ``default`` when there are none."""
    named = [f"{name}:{protocol}" for name, protocol in sorted(protocols.items()) if name not in UPDATE_SUMS]
    return ", ".join(named) if named else default


def statistics_cell(summary: Any) -> str:
    """Which protocol each statistic went through, ``name:protocol``: from the run's releases, else
    (nothing released yet) from its plan, else the run's default protocol."""
    statistics = getattr(summary, "statistics", None) or {}
    released = {name: entry["protocol"] for name, entry in statistics.items()}
    planned = getattr(summary, "planned", None) or {}
    return protocols_text({**planned, **released}, summary.protocol)


def format_summary(summaries: Sequence[Any]) -> str:
    """One line per run: final and tail metrics, bytes."""
    rows = [
        [s.id, s.method, s.loss, statistics_cell(s), s.update_protocol, str(s.seed), str(s.rounds),
         format_value(s.final["accuracy"]), format_value(s.tail["accuracy"]), format_value(s.tail["minority_accuracy"]),
         format_value(s.tail["auc"]), _bytes(s.bytes_total)]
        for s in summaries
    ]
    tail = summaries[0].tail_rounds if summaries else 5
    headers = ["run", "method", "loss", "statistics", "updates", "seed", "rounds", "final acc",
               f"tail{tail} acc", f"tail{tail} minority", f"tail{tail} AUC", "bytes"]
    if any(getattr(s, "privacy", None) for s in summaries):
        headers.append("ε (δ)")
        for row, s in zip(rows, summaries):
            p = getattr(s, "privacy", None) or {}
            row.append(f"{_epsilon(p['epsilon'])} ({p['delta']:g})" if "epsilon" in p else "-")
    return text_table(headers, rows)


class _Progress:
    """tqdm bars on stderr: one per run (rounds) and one per round (clients)."""

    def __init__(self, *, enabled: bool, stream: TextIO) -> None:
        self.enabled = enabled
        self.stream = stream
        self._run_bar: Any = None
        self._client_bar: Any = None

    def _write(self, text: str) -> None:
        if self.enabled:
            from tqdm import tqdm

            tqdm.write(text, file=self.stream)
        else:
            print(text, file=self.stream)

    def run_started(self, run: Any, *, position: int, total: int, start_round: int) -> None:
        resumed = f", resuming after round {start_round}" if start_round else ""
        from secure_fl.config import RunConfig, planned_protocols

        statistics = protocols_text(planned_protocols(RunConfig.from_dict(run.config)), run.protocol)
        self._write(f"run {run.id} ({position + 1}/{total}): {run.method}/{run.loss}, statistics: {statistics}, "
                    f"updates: {run.update_protocol}{resumed} — if interrupted: --resume {run.id}")
        if self.enabled:
            from tqdm import tqdm

            self._run_bar = tqdm(total=run.rounds, initial=start_round, desc=f"run {position + 1}/{total}",
                                 unit="round", file=self.stream, leave=False, dynamic_ncols=True)

    def client_finished(self, run: Any, round: int, done: int, total: int) -> None:
        if not self.enabled:
            return
        from tqdm import tqdm

        if self._client_bar is None:
            self._client_bar = tqdm(total=total, desc=f"round {round + 1}", unit="client", file=self.stream,
                                    leave=False, dynamic_ncols=True)
        self._client_bar.update(1)
        if done == total:
            self._client_bar.close()
            self._client_bar = None

    def round_finished(self, run: Any, row: Any) -> None:
        if self._run_bar is not None:
            self._run_bar.set_postfix(acc=format_value(row.accuracy, ".3f"))
            self._run_bar.update(1)

    def run_finished(self, run: Any, summary: Any) -> None:
        if self._run_bar is not None:
            self._run_bar.close()
            self._run_bar = None


def run(args: argparse.Namespace) -> int:
    from secure_fl.config import ConfigError, load_config
    from secure_fl.data import DataError
    from secure_fl.device import configure_threads, resolve_device
    from secure_fl.runtime import run_experiment
    from secure_fl.store import RunStore, StoreError

    try:
        experiment = load_config(args.config)
        device = resolve_device(args.device)
        configure_threads(args.threads if args.threads == "auto" else _positive_int(args.threads))
        store = RunStore.open_workspace(args.workspace)
    except (ConfigError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    progress = _Progress(enabled=not (args.json or args.no_progress) and sys.stderr.isatty(), stream=sys.stderr)
    try:
        with store:
            summaries = run_experiment(experiment, store, device=device, resume=args.resume, observer=progress)
    except (StoreError, DataError, ConfigError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if args.json:
        json.dump({"runs": [s.as_json() for s in summaries]}, sys.stdout, allow_nan=False)
        sys.stdout.write("\n")
        return 0
    for summary in summaries:
        print(format_rounds(summary), end="\n\n")
    print(format_summary(summaries))
    print(f"\nstored in {store.path}; list runs with: secure-fl runs"
          + (f" --workspace {args.workspace}" if args.workspace else ""))
    return 0


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"--threads must be 'auto' or a positive integer, got {text!r}") from None
    if value < 1:
        raise ValueError(f"--threads must be 'auto' or a positive integer, got {text!r}")
    return value


if __name__ == "__main__":  # python -m secure_fl.cli.run CONFIG ... (same as `secure-fl run`)
    _parser = argparse.ArgumentParser(prog="secure-fl")
    register(_parser.add_subparsers(dest="command", required=True))
    _args = _parser.parse_args(["run", *sys.argv[1:]])
    raise SystemExit(_args.func(_args))
