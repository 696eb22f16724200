"""The Flower apps: :data:`server_app` runs a config's run against the run store, :data:`client_app`
is a client node.

ServerApp run config (``context.run_config``):

``config-path`` (str)
    absolute path of the experiment TOML;
``run-index`` (int, default 0)
    which run of the file;
``store-path`` (str)
    the run store the run is written to, round by round, exactly as the embedded engine writes
    it (``secure-fl runs`` / ``report`` read it);
``run-id`` (str, optional)
    a run already registered in the store (its config must be the file's run): continue it
    rather than register a new batch of one run;
``stage-timeout`` (float s, optional)
    else the config's ``[runtime] stage_timeout``;
``overrides`` (str, optional)
    JSON list of ``[dotted key, value]`` pairs, as ``--set`` gives;
``events-path`` (str, optional)
    one JSON line per exchange event, ``{"round", "stage", "event": "sent" | "received", "time"}``
    (a launcher kills a node at a given round and stage with it).

ClientApp node config (``context.node_config``): ``partition-id`` (the client id),
``num-partitions``, ``data-path`` (optional: where the node's copy of the data set lives,
instead of the config's ``data.root``). The server sends each node the run's public config
(``hello``); everything else reaches the node as the bytes of the run's messages.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flwr.app import ConfigRecord, Context, Message
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp

from secure_fl.config import ConfigError, RunConfig

from .client import NodeHost, NodeState, handle
from .wire import KEY, read_hello, read_request, write_hello_reply, write_reply

__all__ = ["ServerSettings", "client_app", "serve", "server_app"]

log = logging.getLogger("secure_fl.flower")


# --- the server ---------------------------------------------------------------------------------------

HELLO_TIMEOUT = 300.0
"""Seconds the ServerApp waits at least for the nodes and their hellos: a node's first message starts its
ClientApp process or Ray actor, which imports PyTorch and loads the data set (slow on a busy machine)."""


@dataclass(frozen=True, kw_only=True)
class ServerSettings:
    """The ServerApp's run config, checked (see the module docstring)."""

    store_path: str
    config_path: str = ""
    run_index: int = 0
    run_id: str | None = None
    stage_timeout: float | None = None
    overrides: tuple[tuple[str, str], ...] = ()
    events_path: str | None = None

    @classmethod
    def from_run_config(cls, run_config: Mapping[str, Any]) -> ServerSettings:
        def get(name: str, kind: type | tuple[type, ...], default: Any = None) -> Any:
            value = run_config.get(name, default)
            if value is default:
                return value
            if not isinstance(value, kind) or isinstance(value, bool):
                raise ConfigError(f"ServerApp run config {name!r}: expected {kind}, got {value!r}")
            return value

        try:
            overrides: Any = json.loads(get("overrides", str, "[]"))
        except ValueError:
            overrides = None
        if not isinstance(overrides, list) or not all(
                isinstance(o, list) and len(o) == 2 and isinstance(o[0], str) for o in overrides):
            raise ConfigError("ServerApp run config 'overrides': a JSON list of [key, value] pairs")
        timeout = get("stage-timeout", (int, float))
        return cls(store_path=get("store-path", str, ""), config_path=get("config-path", str, ""),
                   run_index=get("run-index", int, 0), run_id=get("run-id", str),
                   stage_timeout=None if timeout is None else float(timeout),
                   overrides=tuple((k, v if isinstance(v, str) else json.dumps(v)) for k, v in overrides),
                   events_path=get("events-path", str))


def _events(path: str | None) -> Callable[[dict[str, Any]], None] | None:
    if not path:
        return None
    lock = threading.Lock()

    def write(event: dict[str, Any]) -> None:
        with lock, Path(path).open("a") as f:
            f.write(json.dumps(event, sort_keys=True) + "\n")
    return write


def _load(settings: ServerSettings) -> RunConfig:
    from secure_fl.config import load_config

    if not settings.config_path:
        raise ConfigError("ServerApp run config needs 'config-path'")
    experiment = load_config(settings.config_path, overrides=list(settings.overrides))
    if not 0 <= settings.run_index < len(experiment.runs):
        raise ConfigError(f"run-index {settings.run_index}: {settings.config_path} defines "
                          f"{len(experiment.runs)} run(s)")
    return experiment.runs[settings.run_index]


def serve(grid: Grid, settings: ServerSettings, *, config: RunConfig | None = None, observer: Any = None,
          device: Any = None, dataset: Any = None, on_connected: Callable[[], None] | None = None,
          stop: threading.Event | None = None) -> str:
    """Play one run over ``grid`` and write it to the store; returns the run's id. ``config``,
    ``dataset`` and ``device`` default to the settings' file, its data set and the CPU;
    ``on_connected`` hears when every node answered the hello; setting ``stop`` ends the run at the
    network's next poll (:class:`~secure_fl.flower.network.FlowerError`)."""
    import torch

    from secure_fl.runtime import execute_run
    from secure_fl.runtime.runner import describe_run
    from secure_fl.store import RunStore

    from .network import FlowerNetwork
    from .server import FlowerServer

    config = config if config is not None else _load(settings)
    if not settings.store_path:
        raise ConfigError("ServerApp run config needs 'store-path'")
    timeout = settings.stage_timeout if settings.stage_timeout is not None else config.runtime.stage_timeout
    device = device if device is not None else torch.device("cpu")
    events = _events(settings.events_path)

    def harness(run: RunConfig, dev: torch.device, dataset: Any) -> FlowerServer:
        network = FlowerNetwork.connect(grid, config=json.dumps(run.to_dict(), sort_keys=True),
                                        parties=run.data.num_clients, stage_timeout=timeout, on_event=events,
                                        stop=stop, wait=max(timeout, HELLO_TIMEOUT))
        if on_connected is not None:
            on_connected()
        return FlowerServer(run, network=network, device=dev, dataset=dataset)

    with RunStore(settings.store_path) as store:
        run_id = settings.run_id
        if run_id is None:
            _, ids = store.create_batch(name=config.name, source=settings.config_path or "<flower>",
                                        runs=[describe_run(config)])
            run_id = ids[0]
        else:
            stored = RunConfig.from_dict(store.run(run_id).config).to_dict()
            if stored != config.to_dict():
                raise ConfigError(f"run {run_id} in {settings.store_path} is not run {settings.run_index} "
                                  f"of {settings.config_path}")
        execute_run(store, run_id, config, device=device, dataset=dataset, observer=observer, harness=harness)
    return run_id


server_app = ServerApp()


@server_app.main()
def _server_main(grid: Grid, context: Context) -> None:
    serve(grid, ServerSettings.from_run_config(context.run_config))


# --- the client ---------------------------------------------------------------------------------------


_CONFIGS: dict[str, RunConfig] = {}


def _config(text: str) -> RunConfig:
    """The run's public config (parsed once per process)."""
    config = _CONFIGS.get(text)
    if config is None:
        _CONFIGS.clear()
        config = _CONFIGS[text] = RunConfig.from_dict(json.loads(text))
    return config


def _node_config(context: Context) -> tuple[int, int, str | None]:
    node = context.node_config
    pid, parties, path = node.get("partition-id"), node.get("num-partitions"), node.get("data-path")
    if not isinstance(pid, int) or not isinstance(parties, int) or not 0 <= pid < parties:
        raise ConfigError(f"node config needs integer partition-id in [0, num-partitions); got {pid!r}, {parties!r}")
    if path is not None and not isinstance(path, str):
        raise ConfigError("node config data-path must be a string")
    return pid, parties, path


client_app = ClientApp()


@client_app.query("hello")
def _hello(message: Message, context: Context) -> Message:
    """The run's public config: checked (it must parse, and this node must find its data and partition —
    loaded here, under the hello's longer wait, not in the first stage) and kept; answered with this
    node's party."""
    hello = read_hello(message.content)
    pid, parties, data_path = _node_config(context)
    NodeHost.node(_config(hello.config), pid, data_path=data_path)
    context.state[KEY] = ConfigRecord({"config": hello.config, "snapshot": b"", "live": b""})
    return Message(write_hello_reply(nonce=hello.nonce, party=pid, parties=parties), reply_to=message)


@client_app.query("exchange")
def _exchange(message: Message, context: Context) -> Message:
    """One exchange: restore the node from its state, answer, keep the new state."""
    request = read_request(message.content)
    pid, _, data_path = _node_config(context)
    try:
        record = context.state[KEY]
    except KeyError:
        raise ConfigError("an exchange before the hello: this node does not know the run") from None
    assert isinstance(record, ConfigRecord)
    text = record["config"]
    assert isinstance(text, str)
    node = NodeHost.node(_config(text), pid, data_path=data_path)
    previous = NodeState(snapshot=bytes(record["snapshot"]), live=bytes(record["live"]))  # type: ignore[arg-type]
    replies, state = handle(node, previous, request.inbox)
    context.state[KEY] = ConfigRecord({"config": text, "snapshot": state.snapshot, "live": state.live})
    return Message(write_reply(nonce=request.nonce, seq=request.seq, outbox=replies), reply_to=message)
