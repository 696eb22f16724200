"""The ``flower-simulation`` engine: the same apps in Flower's simulation engine (Ray).

:func:`run_flower_simulation` starts Flower's simulation runtime with one virtual SuperNode per
client (``partition-id`` = the client id) and a ServerApp that plays the run and writes it to
the run store (:func:`secure_fl.flower.apps.serve`, in a thread of this process). Client
messages run in Ray actors, one CPU each; Ray starts here unless ``RAY_ADDRESS`` names a
running cluster (``ray start --head`` on one machine, ``ray start --address HEAD:6379`` on the
others), in which case the actors spread over its machines (docs/flower-engine.md).

:func:`simulation_executor` is what ``secure-fl run --engine flower-simulation`` hands
:func:`~secure_fl.runtime.run_experiment`: it runs each stored run in a simulation, and continues
one with a checkpoint (``--resume``): the server from the run store, each node from the state it
stored in its own directory (``node-state/client-<i>`` beside the store).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path
from typing import Any

import torch

from secure_fl.config import RunConfig
from secure_fl.data import Dataset
from secure_fl.runtime.runner import Executor, RunObserver, RunSummary, describe_error, summarize
from secure_fl.store import RunStore, StoreError

from .nodestore import node_state_root

__all__ = ["backend_config", "run_flower_simulation", "simulation_executor"]

log = logging.getLogger("secure_fl.flower")


def backend_config(*, cpus_per_client: float = 1.0) -> dict[str, Any]:
    """Ray's settings: local Ray on every core of this machine, or the cluster ``RAY_ADDRESS`` names."""
    init: dict[str, Any] = {"include_dashboard": False, "logging_level": logging.ERROR, "log_to_driver": False}
    if not os.environ.get("RAY_ADDRESS"):
        init["num_cpus"] = os.cpu_count() or 1
    return {"init_args": init, "client_resources": {"num_cpus": cpus_per_client, "num_gpus": 0.0}}


def run_flower_simulation(config: RunConfig, *, store: str | os.PathLike[str], run_id: str,
                          device: torch.device | None = None, dataset: Dataset | None = None,
                          observer: RunObserver | None = None, stage_timeout: float | None = None,
                          events_path: str | None = None, cpus_per_client: float = 1.0,
                          state_root: str | os.PathLike[str] | None = None) -> dict[str, float]:
    """Play stored run ``run_id`` (registered with ``config``) on Flower's simulation engine; the
    ServerApp writes its rounds to ``store``. Returns the wall time split: ``start`` (Ray and the
    nodes until every node answered the hello) and ``run`` (the rest).

    Node *i* keeps its state between rounds in ``state_root/client-<i>`` (default: ``node-state``
    beside the store, mode 0700): a stored run with a checkpoint resumes from it, each node from
    its own stored state (on a Ray cluster the directory must be on a file system every machine
    shares: any actor may play any node)."""
    from flwr.serverapp import Grid, ServerApp
    from flwr.simulation import run_simulation

    from .apps import ServerSettings, node_app, serve

    errors: list[BaseException] = []
    stop = threading.Event()
    marks: dict[str, float] = {"begin": time.perf_counter()}
    settings = ServerSettings(store_path=os.fspath(store), run_id=run_id, stage_timeout=stage_timeout,
                              events_path=events_path)
    root = Path(state_root) if state_root is not None else node_state_root(Path(store).parent)
    app = ServerApp()

    @app.main()
    def _main(grid: Grid, context: Any) -> None:
        marks["server"] = time.perf_counter()
        try:
            serve(grid, settings, config=config, observer=observer, device=device, dataset=dataset,
                  on_connected=lambda: marks.__setitem__("connected", time.perf_counter()), stop=stop)
        except BaseException as error:  # noqa: BLE001 -- re-raised in the caller's thread below
            errors.append(error)

    # run_simulation is deprecated in favour of `flwr run` on a packaged app; with flwr pinned it is
    # the in-process path that lets the ServerApp share this process's store, data and observer
    flwr_logger = logging.getLogger("flwr")
    level = flwr_logger.level
    flwr_logger.setLevel(logging.ERROR)
    os.environ.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")  # no GPUs asked for: no warning about it
    try:
        run_simulation(server_app=app, client_app=node_app(state_root=str(root)), num_supernodes=config.data.num_clients,
                       backend_config=backend_config(cpus_per_client=cpus_per_client))
    finally:
        stop.set()  # Ctrl-C or a crash of the runtime: the ServerApp's thread stops at its next poll
        flwr_logger.setLevel(level)
    if errors:
        raise errors[0]
    end = time.perf_counter()
    connected = marks.get("connected", end)
    return {"start": connected - marks["begin"], "run": end - connected}


def simulation_executor(*, stage_timeout: float | None = None, events_path: str | None = None) -> Executor:
    """:func:`~secure_fl.runtime.execute_run`'s stand-in for ``run_experiment``: each run on Flower's
    simulation engine, its rounds written by the ServerApp."""
    def execute(store: RunStore, run_id: str, config: RunConfig, *, device: torch.device,
                dataset: Dataset | None = None, observer: RunObserver | None = None, position: int = 0,
                total: int = 1) -> RunSummary:
        try:
            times = run_flower_simulation(config, store=store.path, run_id=run_id, device=device, dataset=dataset,
                                          observer=observer, stage_timeout=stage_timeout, events_path=events_path)
        except BaseException as error:
            if store.run(run_id).status not in ("failed", "done"):  # failed before the ServerApp ran it
                try:
                    store.set_status(run_id, "failed", error=describe_error(error))
                except StoreError:
                    pass
            raise
        log.info("run %s on flower-simulation: %.1f s to start Ray and the %d nodes, %.1f s of rounds",
                 run_id, times["start"], config.data.num_clients, times["run"])
        return summarize(store, run_id)
    return execute
