"""Our masking through Flower vs Flower's own SecAgg+ workflow: the same SuperLink and SuperNodes,
the same n and d, Flower's deployment engine on loopback (``secure-fl deploy local``'s launcher).

    PYTHONPATH=. .venv/bin/python bench/flower_secagg.py [--nodes 5] [--hidden 1000] [--rounds 2] [--tls]
    PYTHONPATH=. .venv/bin/python bench/peers.py flower-secagg [same options]

ours
    ``secure_fl.flower.apps``: FedAvg on scikit-learn's digits, an MLP 64-H-10 (d parameters),
    every model update through our pairwise masking (``protocols.masking``, complete graph,
    threshold ceil(2n/3)), the round's sample total through ``plain`` so that the update's
    masking is the round's one secure sum; one local epoch of training per round.
peer
    Flower's ``DefaultWorkflow(fit_workflow=SecAggPlusWorkflow(num_shares=n,
    reconstruction_threshold=t))`` with Flower's FedAvg; each ClientApp (with ``secaggplus_mod``)
    returns a fixed float32 vector of the same d and weight 1 (no training: the peer is charged
    nothing for it).

Measured in one process, one federation: per round the wall time from each ServerApp's events
(sent / received around every exchange), its round trips, and Flower's own byte count of each
run (``flwr ls``: the Fleet API traffic). Prints ``{"case", "ours", "peer", "ratio", "unit",
"detail"}``, ``ours``/``peer`` = mean seconds per round (ratio < 1: ours faster).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent

# --- the peer's Flower apps (imported by Flower's ServerApp / ClientApp processes) ---------------


def _peer_apps() -> tuple[Any, Any]:
    import numpy as np
    from flwr.client import NumPyClient
    from flwr.client.mod import secaggplus_mod
    from flwr.clientapp import ClientApp
    from flwr.common import Context, ndarrays_to_parameters
    from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS
    from flwr.server import LegacyContext, ServerConfig
    from flwr.server.strategy import FedAvg
    from flwr.server.workflow import DefaultWorkflow, SecAggPlusWorkflow
    from flwr.server.workflow.constant import MAIN_CONFIGS_RECORD, Key
    from flwr.serverapp import Grid, ServerApp

    server = ServerApp()

    @server.main()
    def _main(grid: Grid, context: Context) -> None:
        config = context.run_config
        n, d = int(config["nodes"]), int(config["dim"])
        events = Path(str(config["events-path"]))
        strategy = FedAvg(fraction_fit=1.0, fraction_evaluate=0.0, min_fit_clients=n, min_available_clients=n,
                          initial_parameters=ndarrays_to_parameters([np.zeros(d, dtype=np.float32)]))
        legacy = LegacyContext(context=context, config=ServerConfig(num_rounds=int(config["rounds"])),
                               strategy=strategy)
        send_and_receive = grid.send_and_receive

        def timed(messages: Any, *args: Any, **kwargs: Any) -> Any:
            messages = list(messages)
            cfg = legacy.state.config_records.get(MAIN_CONFIGS_RECORD)
            rnd = int(cfg[Key.CURRENT_ROUND]) - 1 if cfg and Key.CURRENT_ROUND in cfg else -1  # type: ignore[arg-type]
            stages = {str(m.content.config_records[RECORD_KEY_CONFIGS].get("stage"))
                      for m in messages if RECORD_KEY_CONFIGS in m.content.config_records}
            stage = stages.pop() if len(stages) == 1 else (messages[0].metadata.message_type if messages else "?")
            with events.open("a") as f:
                f.write(json.dumps({"round": rnd, "stage": stage, "event": "sent", "time": time.time()}) + "\n")
            replies = list(send_and_receive(messages, *args, **kwargs))
            with events.open("a") as f:
                f.write(json.dumps({"round": rnd, "stage": stage, "event": "received", "time": time.time(),
                                    "lost": [], "errors": sum(r.has_error() for r in replies)}) + "\n")
            return replies

        grid.send_and_receive = timed  # type: ignore[method-assign]
        workflow = DefaultWorkflow(fit_workflow=SecAggPlusWorkflow(
            num_shares=n, reconstruction_threshold=int(config["threshold"]),
            timeout=float(config["stage-timeout"])))
        workflow(grid, legacy)

    class _Client(NumPyClient):
        def __init__(self, d: int, seed: int) -> None:
            self.vector = np.random.default_rng(seed).uniform(-1.0, 1.0, d).astype(np.float32)

        def fit(self, parameters: Any, config: Any) -> Any:
            return [self.vector], 1, {}

    def client_fn(context: Context) -> Any:
        d = int(context.run_config["dim"])
        return _Client(d, int(context.node_config["partition-id"])).to_client()

    return server, ClientApp(client_fn=client_fn, mods=[secaggplus_mod])


peer_server_app = peer_client_app = None
"""The peer's apps, defined when a Flower process imports this module (``flwr run`` finds them by
name in the source: plain assignments at top level)."""
if __name__ != "__main__":
    try:
        _apps = _peer_apps()
        peer_server_app = _apps[0]
        peer_client_app = _apps[1]
    except ImportError:  # flwr not installed: the script reports a skip
        pass


# --- the benchmark --------------------------------------------------------------------------------

CONFIG = """name = "flower-secagg-bench"
seed = 0
tail_rounds = 1
[data]
dataset = "digits"
num_clients = {n}
partition = "dirichlet"
partition_params = {{ alpha = 100.0 }}
[model]
name = "mlp"
hidden = [{hidden}]
[train]
rounds = {rounds}
clients_per_round = {n}
local_epochs = 1
batch_size = 64
lr = 0.05
[secure]
protocol = "plain"
update_protocol = "masking"
update_clip = 1.0
[runtime]
stage_timeout = {timeout}
"""


def _summary(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    walls = [r["wall"] for r in rounds]
    return {"seconds_per_round": walls, "round_trips": [r["round_trips"] for r in rounds],
            "waiting_share": [round(r["waiting_share"], 3) for r in rounds],
            "stages": [[(s["stage"], round(s["wall"], 2), round(s["node"], 2)) for s in r["stages"]] for r in rounds]}


def measure(args: argparse.Namespace) -> dict[str, Any]:
    from secure_fl.config import load_config
    from secure_fl.flower.deploy.local import DeployOptions, LocalFederation
    from secure_fl.flower.deploy.project import AppComponents
    from secure_fl.runtime.runner import describe_run
    from secure_fl.store import RunStore

    n, hidden = args.nodes, args.hidden
    d = 64 * hidden + hidden + hidden * 10 + 10
    threshold = math.ceil(2 * n / 3)
    work = Path(tempfile.mkdtemp(prefix="flower-secagg-"))
    config_path = work / "bench.toml"
    config_path.write_text(CONFIG.format(n=n, hidden=hidden, rounds=args.rounds, timeout=args.stage_timeout))
    overrides = [["runtime.engine", "flower"]]
    experiment = load_config(config_path, overrides=[tuple(o) for o in overrides])  # type: ignore[misc]
    store_path = work / "store.sqlite"
    with RunStore(store_path) as store:
        _, (run_id,) = store.create_batch(name=experiment.name, source=str(config_path),
                                          runs=[describe_run(experiment.runs[0])])
    options = DeployOptions(nodes=n, tls=args.tls, extra_env={"PYTHONPATH": f"{HERE}:{HERE.parent}"})
    timeout = 600.0 + args.rounds * 10 * args.stage_timeout
    with LocalFederation(options) as federation:
        ours = federation.run({"config-path": str(config_path), "run-index": 0, "run-id": run_id,
                               "store-path": str(store_path), "stage-timeout": args.stage_timeout,
                               "overrides": json.dumps(overrides), "events-path": str(work / "ours.jsonl")},
                              events=work / "ours.jsonl", timeout=timeout)
        peer = federation.run({"nodes": n, "dim": d, "rounds": args.rounds, "threshold": threshold,
                               "stage-timeout": args.stage_timeout, "events-path": str(work / "peer.jsonl")},
                              events=work / "peer.jsonl", timeout=timeout,
                              components=AppComponents(serverapp="flower_secagg:peer_server_app",
                                                       clientapp="flower_secagg:peer_client_app"))
    for name, outcome in (("ours", ours), ("peer", peer)):
        if not outcome.ok:
            raise RuntimeError(f"{name}: Flower run {outcome.status}: {outcome.log[-800:]}")
    with RunStore(store_path) as store:
        rows = store.rounds(run_id)
    _cleanup(work)  # kept when anything above failed, for its logs
    accuracy = rows[-1].accuracy if rows else None
    ours_mean = statistics.mean(r["wall"] for r in ours.rounds)
    peer_mean = statistics.mean(r["wall"] for r in peer.rounds)
    return {"case": "flower-secagg", "ours": ours_mean, "peer": peer_mean, "ratio": ours_mean / peer_mean,
            "unit": "seconds per round", "detail": {
                "nodes": n, "dim": d, "threshold": threshold, "rounds": args.rounds, "tls": args.tls,
                "ours_is": "secure_fl.flower apps: FedAvg round (1 local epoch on digits) with the update through "
                           "our masking (complete graph), sample total plain",
                "peer_is": "Flower DefaultWorkflow + SecAggPlusWorkflow (num_shares=n), fixed vector, no training",
                "ours": {**_summary(ours.rounds), "flower_bytes": ours.flower_bytes, "final_accuracy": accuracy,
                         "wire_bytes": [r.metrics.get("net.wire_bytes") for r in rows],
                         "transcript_bytes": [r.metrics.get("net.transcript_bytes") for r in rows]},
                "peer": {**_summary(peer.rounds), "flower_bytes": peer.flower_bytes},
                "bytes_ratio": ours.flower_bytes.get("total", 0) / max(1, peer.flower_bytes.get("total", 1)),
            }}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else "")
    parser.add_argument("--nodes", type=int, default=5, help="SuperNodes = clients (5)")
    parser.add_argument("--hidden", type=int, default=1000, help="MLP hidden width: d = 75 H + 10 (1000 → 75,010)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--stage-timeout", type=float, default=300.0)
    parser.add_argument("--tls", action="store_true", help="TLS and node authentication")
    args = parser.parse_args(argv)
    if args.nodes < 3 or args.hidden < 1 or args.rounds < 1:
        parser.error("needs --nodes >= 3, --hidden >= 1, --rounds >= 1")
    try:
        import flwr  # noqa: F401
    except ImportError:
        print(json.dumps({"case": "flower-secagg", "skipped": "flwr not installed"}))
        return 0
    sys.path[:0] = [str(HERE.parent)]
    print(json.dumps(measure(args)))
    return 0


def _cleanup(work: Path) -> None:
    import shutil

    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
