"""``secure-fl deploy local CONFIG --nodes N``: a config's runs on a Flower federation of separate
processes on this machine (one SuperLink, N SuperNodes, loopback), with ``--tls`` over TLS with
node authentication, with ``--kill NODE@ROUND[:STAGE]`` a node SIGKILLed at that point.

Prints the tables of ``secure-fl run`` plus a deployment table, or with ``--json`` the same
object with, per run, ``"engine": "flower"``, ``"dropouts"`` (``{"count", "parties", "by_round",
"killed"}``: as ``secure-fl run`` reports them — the clients the server counted as lost, in all
and per round index — and the nodes ``--kill`` hit)
and ``"flower"`` (Flower's run id and status, its own byte count beside the transcript's, per
round the wall time, round trips, time waiting on Flower's polling and its share, per stage).
The runs go to the run store (``--store DIR``, default ``$SECURE_FL_WORKSPACE`` or ``./runs``)
in one batch, as ``secure-fl run`` stores them. Every process started is stopped by PID when
the command ends, however it ends. Each node keeps its state between rounds in the store's
``node-state/client-<i>`` (mode 0700: it holds the client's secrets), so ``--resume RUN_ID``
continues a stopped batch: the server from its checkpoint, each node from its own stored state.
Errors: one line; exit 2 for a bad command line or config
(``--nodes`` other than the runs' clients, a malformed ``--kill``, Flower not installed), 1 when
the federation or a run fails (a port that cannot be bound, a node that does not start).
See docs/deployment.md.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import Any

from secure_fl.cli import positive_int

log = logging.getLogger("secure_fl.cli")

__all__ = ["register", "run"]

ENGINE = "flower"


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = subparsers.add_parser(
        "deploy",
        help="run a config on a Flower federation of separate processes (SuperLink + SuperNodes)",
        description="Run a config's runs on Flower's deployment engine: separate processes that "
                    "talk only through the SuperLink.",
    )
    where = parser.add_subparsers(dest="where", metavar="WHERE", required=True)
    local = where.add_parser(
        "local", help="one SuperLink and N SuperNodes as processes on this machine (loopback)",
        description="Start one SuperLink and N SuperNodes on loopback (free ports, a temporary Flower home), "
                    "run every run of CONFIG as a Flower run, store it, print the results, stop every process.")
    local.add_argument("config", metavar="CONFIG", help="experiment config (TOML), e.g. experiments/deploy/smoke.toml")
    local.add_argument("--nodes", type=positive_int, required=True, metavar="N",
                       help="SuperNodes to start, one per client (partition-id 0..N-1): the config's clients")
    local.add_argument("--tls", action="store_true",
                       help="TLS with a generated CA and SuperLink certificate, and node authentication "
                            "(each node's key registered with the SuperLink)")
    local.add_argument("--kill", action="append", type=_kill, default=[], metavar="NODE@ROUND[:STAGE]",
                       help="SIGKILL node NODE in ROUND (1-based) when STAGE is sent, or without a stage while "
                            "it trains; in every run (a killed node is started again before the next); repeatable")
    local.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    local.add_argument("--store", "--workspace", dest="store", metavar="DIR",
                       help="where the run store lives (default: $SECURE_FL_WORKSPACE or ./runs)")
    local.add_argument("--set", action="append", type=_assignment, default=[], metavar="SECTION.KEY=VALUE",
                       help="override a config value in every run (as for `secure-fl run`)")
    local.add_argument("--stage-timeout", type=_positive_float, default=None, metavar="SECONDS",
                       help="seconds a stage waits for replies before silent nodes count as dropped "
                            "(default: the config's [runtime] stage_timeout)")
    local.add_argument("--resume", metavar="RUN_ID",
                       help="continue the batch this run belongs to (after a failure, a kill or Ctrl-C): done runs "
                            "are reported, the stopped one continues after its last stored round, each node "
                            "from the state it stored under the store's node-state/client-<i>")
    local.add_argument("--keep", metavar="DIR",
                       help="work in DIR and keep it (Flower home, certificates, keys, logs) instead of a "
                            "temporary directory")
    parser.set_defaults(func=run)
    local.set_defaults(func=run)


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected positive seconds, got {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected positive seconds, got {text!r}")
    return value


def _kill(text: str) -> Any:
    from secure_fl.flower.deploy.kill import KillSpecError, parse_kill

    try:
        return parse_kill(text)
    except KillSpecError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _assignment(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"expected SECTION.KEY=VALUE, got {text!r}")
    return key.strip(), value.strip()


def run(args: argparse.Namespace) -> int:
    from secure_fl.cli import ensure_logging, program

    ensure_logging()
    from secure_fl.config import ConfigError, load_config
    from secure_fl.store import RunStore, StoreError

    overrides = [*args.set, ("runtime.engine", ENGINE)]
    try:
        experiment = load_config(args.config, overrides=overrides)
        for run_config in experiment.runs:
            clients = run_config.data.num_clients
            if args.nodes != clients:
                raise ConfigError(f"--nodes {args.nodes}: each node holds one client and "
                                  f"{run_config.name}{f' ({run_config.label})' if run_config.label else ''} "
                                  f"has {clients} clients; use --nodes {clients}")
            for spec in args.kill:
                spec.check(nodes=args.nodes, rounds=run_config.train.rounds)
        from secure_fl.flower.deploy.local import flower_executable

        for name in ("flower-superlink", "flower-supernode", "flwr"):
            flower_executable(name)
        store = RunStore.open_workspace(args.store)
    except (ConfigError, StoreError, ValueError) as error:
        log.error("%s", error)
        return 2
    except RuntimeError as error:  # FlowerMissing
        log.error("%s", error)
        return 2
    from secure_fl.runtime.runner import describe_run, resumed_batch, summarize

    done: set[str] = set()
    try:
        with store:
            if args.resume:
                rows = resumed_batch(store, experiment, args.resume)
                run_ids, done = [r.id for r in rows], {r.id for r in rows if r.status == "done"}
            else:
                _, run_ids = store.create_batch(name=experiment.name, source=str(args.config),
                                                runs=[describe_run(c) for c in experiment.runs])
    except StoreError as error:
        log.error("%s", error)
        return 2
    todo = [run_id for run_id in run_ids if run_id not in done]
    if not todo:
        log.info("every run of batch %s is done: nothing to continue, no federation started", args.resume)
    try:
        outcomes = _deploy(args, experiment, run_ids, store.path, overrides, done=done) if todo else {}
    except KeyboardInterrupt:
        log.error("interrupted; every process was stopped. Continue the stored runs with: %s",
                  resume_hint(args, run_ids[0]))
        raise
    except RuntimeError as error:  # DeployError: the federation did not start or a run broke
        log.error("%s", error)
        return 1
    from secure_fl.cli.run import engine_fields

    with RunStore(store.path) as reader:
        summaries = [summarize(reader, run_id) for run_id in run_ids]
        runs = [_run_json(summary, outcomes.get(summary.id), engine_fields(reader, summary)) for summary in summaries]
    failed = [s for s in summaries if s.status != "done"]
    if args.json:
        json.dump({"engine": ENGINE, "runs": runs}, sys.stdout, allow_nan=False)
        sys.stdout.write("\n")
    else:
        from secure_fl.cli.run import format_rounds, format_summary

        for summary in summaries:
            if summary.history:
                print(format_rounds(summary), end="\n\n")
        print(format_summary(summaries), end="\n\n")
        print(_deploy_table(runs))
        print(f"\nstored in {store.path}; list runs with: {program()} runs"
              f"{f' --workspace {args.store}' if args.store else ''}")
    if failed:
        log.error("%d of %d runs did not finish (%s); the reasons are above and in `%s runs%s`; fix the cause, then "
                  "continue with: %s", len(failed), len(summaries),
                  ", ".join(f"{s.id}: {s.error or s.status}" for s in failed), program(),
                  f" --workspace {args.store}" if args.store else "", resume_hint(args, failed[0].id))
        return 1
    return 0


def resume_hint(args: argparse.Namespace, run_id: str) -> str:
    """The command that continues this deployment's batch after ``run_id``'s stop (shell-quoted, with the
    same ``--set``s and ``--stage-timeout``)."""
    from shlex import quote

    from secure_fl.cli import program

    return (f"{program()} deploy local {quote(str(args.config))} --nodes {args.nodes}{' --tls' if args.tls else ''}"
            f" --resume {run_id}{f' --store {quote(str(args.store))}' if args.store else ''}"
            + "".join(f" --set {quote(f'{key}={value}')}" for key, value in args.set)
            + (f" --stage-timeout {timeout:g}" if (timeout := getattr(args, "stage_timeout", None)) else ""))


def _deploy(args: argparse.Namespace, experiment: Any, run_ids: list[str], store_path: Path,
            overrides: list[tuple[str, str]], *, done: set[str]) -> dict[str, Any]:
    """Start the federation, play every run not ``done`` on it, stop it; Flower's view of each run by store id.
    The nodes keep their state in the store's ``node-state/client-<i>`` (0700), which outlives the federation."""
    from secure_fl.flower.deploy.local import DeployOptions, LocalFederation
    from secure_fl.flower.deploy.processes import Terminated, terminate_on_signals
    from secure_fl.flower.nodestore import node_state_root

    options = DeployOptions(nodes=args.nodes, tls=args.tls, keep=Path(args.keep) if args.keep else None,
                            state_root=node_state_root(store_path.parent))
    outcomes: dict[str, Any] = {}
    try:
        with terminate_on_signals(), LocalFederation(options) as federation:
            for index, (run_id, config) in enumerate(zip(run_ids, experiment.runs)):
                if run_id in done:
                    continue
                restarted = federation.restart_dead_nodes()
                if restarted:
                    log.info("nodes %s started again for the next run", restarted)
                timeout = args.stage_timeout or config.runtime.stage_timeout
                events = federation.work / f"events-{index}.jsonl"
                log.info("run %s (%d/%d) on the federation: %s, %d rounds", run_id, index + 1, len(run_ids),
                         config.method.name, config.train.rounds)
                outcome = federation.run({
                    "config-path": str(Path(args.config).resolve()),
                    "run-index": index,
                    "run-id": run_id,
                    "store-path": str(store_path),
                    "stage-timeout": float(timeout),
                    "overrides": json.dumps([list(o) for o in overrides]),
                    "events-path": str(events),
                }, events=events, kills=args.kill, timeout=_run_timeout(config, timeout))
                outcomes[run_id] = outcome
                if not outcome.ok:
                    log.error("run %s: Flower reports %s; the ServerApp's last line: %s%s", run_id, outcome.status,
                              _server_reason(outcome.log),
                              f" (log: {outcome.log_path})" if outcome.log_path is not None else "")
    except Terminated as signal_name:
        log.error("stopped by %s; every process was stopped", signal_name)
        raise KeyboardInterrupt from None
    if federation.left_behind:
        raise RuntimeError(f"processes still alive after teardown (PIDs {federation.left_behind})")
    return outcomes


def _run_timeout(config: Any, stage_timeout: float) -> float:
    """A bound on one run, for a hung federation only: start-up, then every round's exchanges (14
    measured in the smoke run's first round, with key set-up; 16 allowed) each waiting at most a
    stage timeout, plus training."""
    return 600.0 + float(config.train.rounds) * (16 * stage_timeout + 120.0)


def _last_line(text: str) -> str:
    import re

    lines = [re.sub(r"\x1b\[[0-9;]*m", "", line).strip() for line in text.splitlines()]
    lines = [line for line in lines if line]
    return lines[-1] if lines else "(no output)"


def _server_reason(text: str) -> str:
    """The ServerApp's last line before Flower's exit footer (``Exit Code: 201``, its help line,
    ``For more information, visit: <...>``): the exception that stopped it, not the footer's link."""
    import re

    lines = [re.sub(r"\x1b\[[0-9;]*m", "", line).strip() for line in text.splitlines()]
    footer = next((i for i in range(len(lines) - 1, -1, -1) if re.match(r"(?:\w+\s*:\s*)?Exit Code: \d+", lines[i])),
                  None)
    body = [line for line in (lines if footer is None else lines[:footer]) if line]
    return body[-1] if body else _last_line(text)


def _run_json(summary: Any, outcome: Any, fields: dict[str, Any]) -> dict[str, Any]:
    """``secure-fl run``'s JSON of the run, its ``engine`` and ``dropouts`` (from the store, as
    ``run`` reports them) plus ``killed`` and Flower's view of the run."""
    out: dict[str, Any] = {**summary.as_json(), **fields}
    out["dropouts"] = {**fields["dropouts"],
                       "killed": [k["node"] for k in outcome.kills if k["time"] is not None] if outcome else []}
    if outcome is not None:
        rounds = [_with_bytes(r, summary) for r in outcome.rounds]
        out["flower"] = {
            "run_id": outcome.run_id, "status": outcome.status, "seconds": outcome.seconds,
            "bytes": outcome.flower_bytes, "transcript_bytes": summary.bytes_total,
            "rounds": rounds, "kills": outcome.kills,
            "round_trips": max((r["round_trips"] for r in rounds), default=0),
            "waiting_share": (sum(r["waiting"] for r in rounds) / sum(r["wall"] for r in rounds)
                              if rounds and sum(r["wall"] for r in rounds) > 0 else None),
        }
    return out


def _with_bytes(timing: dict[str, Any], summary: Any) -> dict[str, Any]:
    """A round's timing with the bytes the ServerApp measured (its ``net.*`` round metrics): of the
    Flower messages (``wire_bytes``) and of the transcript they carried, in all and per stage."""
    row = next((r for r in summary.history if r.round + 1 == timing["round"]), None)
    metrics = getattr(row, "metrics", None) or {}
    out = dict(timing)
    out["wire_bytes"] = metrics.get("net.wire_bytes")
    out["transcript_bytes"] = metrics.get("net.transcript_bytes")
    out["stage_wire_bytes"] = {key[len("net.stage."):-len(".wire_bytes")]: value for key, value in metrics.items()
                               if key.startswith("net.stage.") and key.endswith(".wire_bytes")}
    return out


def _deploy_table(runs: list[dict[str, Any]]) -> str:
    from secure_fl.cli.run import text_table

    rows = []
    for r in runs:
        flower = r.get("flower") or {}
        rounds = flower.get("rounds") or []
        walls = [x["wall"] for x in rounds]
        share = flower.get("waiting_share")
        fb = (flower.get("bytes") or {}).get("total")
        wire = sum(x.get("wire_bytes") or 0 for x in rounds)
        carried = sum(x.get("transcript_bytes") or 0 for x in rounds)
        rows.append([r["id"], r["status"], str(r["dropouts"]["count"]),
                     ",".join(map(str, r["dropouts"]["killed"])) or "-",
                     "/".join(str(x["round_trips"]) for x in rounds) or "-",
                     f"{sum(walls) / len(walls):.1f}" if walls else "-",
                     f"{100 * share:.0f}%" if share is not None else "-",
                     f"{fb:,}" if fb is not None else "-", f"{int(wire):,}" if wire else "-",
                     f"{int(carried):,}" if carried else "-"])
    return text_table(["run", "status", "dropouts", "killed", "round trips", "s/round", "polling",
                       "Flower bytes (run)", "message bytes", "transcript bytes"], rows)
