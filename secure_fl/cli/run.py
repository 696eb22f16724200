"""``secure-fl run CONFIG``: execute a config's runs, store them round by round, print results.

People get progress (bars on a terminal, per run over rounds and per round over clients; one log
line per round otherwise), a table of per-round metrics for every run and a summary table;
``--json`` prints one object instead::

    {"runs": [{"id", "method", "loss", "protocol", "update_protocol", "selection", "rounds",
               "status", "error", "final": {"accuracy", "minority_accuracy", "auc",
               "per_class_accuracy"}, "tail": {same keys}, "bytes": {"total", "by_statistic"},
               "statistics": {NAME: {"protocol", "bytes", "releases", "clipped", "values",
                                     "clipped_fraction"}}, ...}]}

``protocol`` is the run's default for statistics and ``update_protocol`` the model updates';
``statistics`` says which protocol each statistic actually went through, what its messages
cost and how many of its summed values its contributors clipped (``null`` when not counted:
noised). ``engine`` is where the parties ran (``--engine``, else ``[runtime] engine``) and
``dropouts`` (``{"count", "parties", "by_round"}``) the clients a distributed engine's server
counted as lost; the network's cost per round (round trips, Flower bytes against the
transcript's, seconds per stage) is in ``metrics`` under ``net.`` names (docs/flower-engine.md).

plus, only when the run used DP, ``"privacy": {"epsilon", "delta", ...}`` (the worst
client's DP-SGD ε so far) and, only when the method reports round metrics,
``"metrics": {"final": {...}, "tail": {...}}``; the tables then get ε and metric columns.

A run that fails is marked failed with its reason and the batch goes on (``--fail-fast``
stops it); the command then exits 1. ``--resume RUN_ID`` continues the batch that run belongs
to (after a failure, a crash or a kill): done runs are reported from the store, the
interrupted one continues after its last stored round. ``--set SECTION.KEY=VALUE`` overrides a
config value in every run.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Mapping, Sequence
from typing import Any, TextIO

from secure_fl.cli import positive_int
from secure_fl.device import DEVICE_CHOICES

log = logging.getLogger("secure_fl.cli")

__all__ = ["clipped_cell", "format_rounds", "format_summary", "format_value", "register", "run", "selection_cell", "statistics_cell", "text_table"]


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = subparsers.add_parser(
        "run",
        help="run the federated experiments a TOML config defines",
        description="Run every run CONFIG defines (methods × protocols × seeds ...), in turn or --jobs N "
                    "at once, storing each round in the workspace's SQLite store as it ends.",
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
    parser.add_argument("--no-progress", action="store_true",
                        help="no progress bars (a terminal gets bars, other output one line per round)")
    parser.add_argument("--set", action="append", type=_assignment, default=[], metavar="SECTION.KEY=VALUE",
                        help="override a config value in every run, e.g. --set train.rounds=3 --set "
                             "secure.protocol=paillier (VALUE is read as TOML, else as a string; repeatable)")
    parser.add_argument("--jobs", default=1, type=positive_int, metavar="N",
                        help="play up to N of the config's runs at once, each in its own process (default 1: "
                             "in turn); with --threads auto each gets max(1, cores / (2 N)) torch threads")
    parser.add_argument("--fail-fast", action="store_true",
                        help="stop the batch at the first failed run (default: go on with the next run)")
    parser.add_argument("--engine", choices=ENGINE_CHOICES,
                        help="where the parties run, overriding [runtime] engine: embedded (one process), "
                             "flower-simulation (Flower's Ray simulation engine); flower runs through "
                             "secure-fl deploy")
    parser.set_defaults(func=run)


ENGINE_CHOICES = ("embedded", "flower-simulation", "flower")


def executor(engine: str) -> Any:
    """How ``secure-fl run`` executes a run of ``engine`` (a registry: engine name → runner)."""
    from secure_fl.runtime import execute_run

    def simulation() -> Any:
        from secure_fl.flower.simulation import simulation_executor

        return simulation_executor()

    engines = {"embedded": lambda: execute_run, "flower-simulation": simulation}
    if engine not in engines:
        raise ValueError(f"engine {engine!r} runs through a SuperLink: use `secure-fl deploy local CONFIG --nodes N` "
                         "(to continue a stopped run: `... --resume RUN_ID`; docs/deployment.md)")
    return engines[engine]()


def _dispatch(store: Any, run_id: str, config: Any, **options: Any) -> Any:
    return executor(config.runtime.engine)(store, run_id, config, **options)


def engine_fields(store: Any, summary: Any) -> dict[str, Any]:
    """``--json``'s ``engine`` and ``dropouts``: ``{"count", "parties", "by_round"}``, the clients a
    distributed engine's server counted as lost (its ``net.dropout.<client>`` round metrics), in all
    and per round (``secure-fl deploy`` adds ``killed``)."""
    config = store.run(summary.id).config
    runtime = config.get("runtime") if isinstance(config, dict) else None
    engine = runtime.get("engine", "embedded") if isinstance(runtime, dict) else "embedded"
    prefix = "net.dropout."
    by_round: dict[str, list[int]] = {}
    for row in summary.history:
        lost = sorted(int(n[len(prefix):]) for n in row.metrics if n.startswith(prefix) and n[len(prefix):].isdigit())
        if lost:
            by_round[str(row.round)] = lost
    parties = sorted({p for lost in by_round.values() for p in lost})
    return {"engine": engine, "dropouts": {"count": len(parties), "parties": parties, "by_round": by_round}}


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
    names = {name for r in history for name in getattr(r, "metrics", {})}
    for name, header in (("net.round_trips", "round trips"), ("net.dropouts", "dropouts")):
        if name in names:  # a distributed engine's network: two columns, the rest in the store and JSON
            headers.append(header)
            cells.append(lambda r, n=name: format_value(r.metrics.get(n), ".0f"))
    for name in sorted(n for n in names if not n.startswith("net.")):
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
            f"updates: {summary.update_protocol}, selection: {selection_cell(summary)}, seed {summary.seed}"
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


def _protocols(summary: Any) -> dict[str, str]:
    statistics = getattr(summary, "statistics", None) or {}
    released = {name: entry["protocol"] for name, entry in statistics.items()}
    return {**(getattr(summary, "planned", None) or {}), **released}


def statistics_cell(summary: Any) -> str:
    """Which protocol each of the method's statistics went through, ``name:protocol``: from the run's
    releases, else (nothing released yet) from its plan, else the run's default protocol. The
    selection's statistics are in :func:`selection_cell`."""
    own = set(getattr(summary, "selection_statistics", ()) or ())
    return protocols_text({n: p for n, p in _protocols(summary).items() if n not in own}, summary.protocol)


def selection_cell(summary: Any) -> str:
    """The selection strategy and the protocols its statistics went through: ``dubhe (paillier, plain)``."""
    name = getattr(summary, "selection", "random")
    own = set(getattr(summary, "selection_statistics", ()) or ())
    protocols = sorted({p for n, p in _protocols(summary).items() if n in own})
    return f"{name} ({', '.join(protocols)})" if protocols else name


def clipped_cell(summary: Any) -> str:
    """The statistics whose contributors clipped values, with the fraction clipped (``-``: none)."""
    statistics = getattr(summary, "statistics", None) or {}
    parts = [f"{name}:{_percent(entry['clipped_fraction'])}" for name, entry in statistics.items()
             if entry.get("clipped") and entry.get("clipped_fraction") is not None]
    return ", ".join(parts) if parts else "-"


def _percent(fraction: float) -> str:
    return f"{100 * fraction:.2g}%" if fraction < 0.01 else f"{100 * fraction:.1f}%"


def format_summary(summaries: Sequence[Any]) -> str:
    """One line per run: protocols, selection, final and tail metrics, clipping, bytes (and the
    status when a run did not finish)."""
    rows = [
        [s.id, s.method, s.loss, statistics_cell(s), s.update_protocol, selection_cell(s),
         str(s.seed), str(s.rounds), format_value(s.final["accuracy"]), format_value(s.tail["accuracy"]),
         format_value(s.tail["minority_accuracy"]), format_value(s.tail["auc"]), clipped_cell(s), _bytes(s.bytes_total)]
        for s in summaries
    ]
    tail = summaries[0].tail_rounds if summaries else 5
    headers = ["run", "method", "loss", "statistics", "updates", "selection", "seed", "rounds", "final acc",
               f"tail{tail} acc", f"tail{tail} minority", f"tail{tail} AUC", "clipped", "bytes"]
    if any(getattr(s, "privacy", None) for s in summaries):
        headers.append("ε (δ)")
        for row, s in zip(rows, summaries):
            p = getattr(s, "privacy", None) or {}
            row.append(f"{_epsilon(p['epsilon'])} ({p['delta']:g})" if "epsilon" in p else "-")
    if any(s.status != "done" for s in summaries):
        headers.insert(1, "status")
        for row, s in zip(rows, summaries):
            row.insert(1, s.status)
    return text_table(headers, rows)


class _Progress:
    """Progress on stderr: tqdm bars (per run over rounds, per round over clients) on a terminal,
    else one log line per round; the run's header line either way."""

    def __init__(self, *, bars: bool, stream: TextIO, config: str = "CONFIG") -> None:
        self.bars = bars
        self.stream = stream
        self.config = config
        self.current: Any = None
        """The run in progress (the CLI names it when interrupted)."""
        self._run_bar: Any = None
        self._client_bar: Any = None
        self._total = 1
        self._position = 0

    def _write(self, text: str) -> None:
        if self.bars:
            from tqdm import tqdm

            if log.isEnabledFor(logging.INFO):
                tqdm.write(text, file=self.stream)
            for handler in log.handlers:  # the log file gets the line too
                if isinstance(handler, logging.FileHandler):
                    handler.emit(logging.LogRecord(log.name, logging.INFO, __file__, 0, text, None, None))
        else:
            log.info(text)

    def run_started(self, run: Any, *, position: int, total: int, start_round: int) -> None:
        from secure_fl.config import RunConfig, planned_protocols

        self.current, self._position, self._total = run, position, total
        statistics = protocols_text(planned_protocols(RunConfig.from_dict(run.config)), run.protocol)
        resumed = f", resuming after round {start_round}" if start_round else ""
        label = f" ({run.label})" if run.label else ""
        self._write(f"run {run.id} ({position + 1}/{total}){label}: {run.method}/{run.loss}, statistics: "
                    f"{statistics}, updates: {run.update_protocol}, {run.rounds} rounds{resumed}")
        if self.bars:
            from tqdm import tqdm

            self._run_bar = tqdm(total=run.rounds, initial=start_round, desc=f"run {position + 1}/{total}",
                                 unit="round", file=self.stream, leave=False, dynamic_ncols=True)

    def client_finished(self, run: Any, round: int, done: int, total: int) -> None:
        if not self.bars:
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
        else:
            log.info("run %s (%d/%d) round %d/%d: accuracy %s, minority %s, %s, %.1f s", run.id,
                     self._position + 1, self._total, row.round + 1, run.rounds, format_value(row.accuracy),
                     format_value(row.minority_accuracy), _bytes(row.bytes_total), row.seconds)

    def run_finished(self, run: Any, summary: Any) -> None:
        self.close()
        self.current = None

    def close(self) -> None:
        for bar in (self._client_bar, self._run_bar):
            if bar is not None:
                bar.close()
        self._run_bar = self._client_bar = None


def run(args: argparse.Namespace) -> int:
    from secure_fl.cli import ensure_logging, program

    ensure_logging()
    from secure_fl.config import ConfigError, load_config
    from secure_fl.store import RunStore, StoreError

    try:
        if args.engine == "flower":
            executor("flower")  # says where that engine runs
        overrides = [*args.set, ("runtime.engine", args.engine)] if args.engine else args.set
        experiment = load_config(args.config, overrides=overrides)
        from secure_fl.device import configure_threads, resolve_device

        device = resolve_device(args.device)
        threads = configure_threads(args.threads if args.threads == "auto" else _positive_int(args.threads))
        workers = _workers(args, experiment, threads)
        store = RunStore.open_workspace(args.workspace)
    except (ConfigError, StoreError, ValueError) as error:
        log.error("%s", error)
        return 2
    from secure_fl.runtime import run_experiment

    bars = not (args.json or args.no_progress) and sys.stderr.isatty() and log.isEnabledFor(logging.INFO) \
        and workers is None
    progress = _Progress(bars=bars, stream=sys.stderr, config=args.config)
    try:
        with store:
            summaries = run_experiment(experiment, store, device=device, resume=args.resume, observer=progress,
                                       on_failure="stop" if args.fail_fast else "continue", executor=_dispatch,
                                       workers=workers)
            extras = {s.id: engine_fields(store, s) for s in summaries}
    except StoreError as error:
        progress.close()
        log.error("%s", error)
        return 2
    except KeyboardInterrupt:
        progress.close()
        if progress.current is not None:
            log.error("interrupted during run %s; continue the batch with: %s", progress.current.id,
                      _resume_command(args, progress.current.id))
        elif workers is not None:
            log.error("interrupted; continue the batch with: %s (RUN_ID: any of its runs above, or from "
                      "`secure-fl runs`)", _resume_command(args, "RUN_ID"))
        raise
    failed = [s for s in summaries if s.status == "failed"]
    if args.json:
        json.dump({"runs": [{**s.as_json(), **extras[s.id]} for s in summaries]}, sys.stdout, allow_nan=False)
        sys.stdout.write("\n")
    else:
        for summary in summaries:
            if summary.history:
                print(format_rounds(summary), end="\n\n")
        print(format_summary(summaries))
        where = f" --workspace {args.workspace}" if args.workspace else ""
        print(f"\nstored in {store.path}; list runs with: {program()} runs{where}")
    if failed:
        skipped = len(experiment.runs) - len(summaries)
        first = failed[0]
        log.error("%d of %d runs failed (%s: the reasons are above and in `%s runs`)%s; fix the cause, then "
                  "continue with: %s", len(failed), len(experiment.runs),
                  ", ".join(s.id for s in failed), program(),
                  f", {skipped} not started (--fail-fast)" if skipped else "", _resume_command(args, first.id))
        return 1
    return 0


def _resume_command(args: argparse.Namespace, run_id: str) -> str:
    """The command that continues the batch (shell-quoted): the same engine and overrides (a run's identity)."""
    from shlex import quote

    from secure_fl.cli import program

    return (f"{program()} run {quote(str(args.config))} --resume {run_id}"
            + (f" --engine {args.engine}" if args.engine else "")
            + "".join(f" --set {quote(f'{key}={value}')}" for key, value in args.set)
            + (f" --workspace {quote(str(args.workspace))}" if args.workspace else ""))


def _workers(args: argparse.Namespace, experiment: Any, threads: int) -> Any:
    """``--jobs N`` above 1: the worker processes' settings (their logging and progress lines as
    this process's, and their torch threads); ``None`` for runs in turn."""
    if args.jobs == 1:
        return None
    import functools
    import os

    from secure_fl.cli import configure_logging
    from secure_fl.runtime import Workers

    engines = sorted({run.runtime.engine for run in experiment.runs} - {"embedded"})
    if engines:
        raise ValueError(f"--jobs runs the embedded engine's runs side by side; this config runs on {engines[0]} "
                         "(run it without --jobs)")
    if args.threads == "auto":
        threads = max(1, (os.cpu_count() or 2) // (2 * args.jobs))
    setup = functools.partial(configure_logging, verbose=getattr(args, "verbose", 0), quiet=getattr(args, "quiet", 0),
                              log_file=getattr(args, "log_file", None))
    return Workers(count=args.jobs, threads=threads, setup=setup, observer=_line_progress)


def _line_progress() -> _Progress:
    """A worker's progress: the run's header and one log line per round."""
    return _Progress(bars=False, stream=sys.stderr)


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"--threads must be 'auto' or a positive integer, got {text!r}") from None
    if value < 1:
        raise ValueError(f"--threads must be 'auto' or a positive integer, got {text!r}")
    return value


def _assignment(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"expected SECTION.KEY=VALUE, got {text!r}")
    return key.strip(), value.strip()


if __name__ == "__main__":  # python -m secure_fl.cli.run CONFIG ... (same as `secure-fl run`)
    from secure_fl.cli import main

    raise SystemExit(main(["run", *sys.argv[1:]]))
