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
instead of the config's ``data.root``), ``state-path`` (optional: the node's own directory where
it stores its state after each round, keyed by run and round, so that a stopped run can resume;
:mod:`.nodestore`). The server sends each node the run's public config and, on a resume, the
round to restore (``hello``); everything else reaches the node as the bytes of the run's messages.
"""

from __future__ import annotations

import json
import logging
import secrets
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from flwr.app import ConfigRecord, Context, Message
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp

from protocols import SERVER, Directory, Identity, StageError, WireError
from secure_fl.config import ConfigError, RunConfig
from secure_fl.runtime.messages import run_digest

from .client import NodeHost, NodeState, handle
from .nodestore import MissingState, NodeStateError, NodeStore, StoredNode, TamperedState
from .wire import (
    KEY,
    decode_keys,
    encode_keys,
    read_hello,
    read_register,
    read_request,
    write_hello_reply,
    write_register_reply,
    write_reply,
)

if TYPE_CHECKING:
    from .network import FlowerNetwork

__all__ = ["NodeSettings", "ServerSettings", "client_app", "exchange", "hello", "node_app", "register", "serve",
           "server_app"]

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
    from secure_fl.runtime.runner import describe_error, describe_run
    from secure_fl.store import RunStore, StoreError

    from .network import FlowerNetwork
    from .server import FlowerServer

    config = config if config is not None else _load(settings)
    if not settings.store_path:
        raise ConfigError("ServerApp run config needs 'store-path'")
    timeout = settings.stage_timeout if settings.stage_timeout is not None else config.runtime.stage_timeout
    device = device if device is not None else torch.device("cpu")
    events = _events(settings.events_path)

    def harness(run: RunConfig, dev: torch.device, dataset: Any) -> FlowerServer:
        # a resume: the nodes restore their own stored state of the checkpoint's round (the run store
        # holds the server's state only)
        checkpoint = store.checkpoint(run_id)
        resume = -1 if checkpoint is None else checkpoint.round
        network = FlowerNetwork.connect(grid, config=json.dumps(run.to_dict(), sort_keys=True),
                                        parties=run.data.num_clients, stage_timeout=timeout, on_event=events,
                                        stop=stop, wait=max(timeout, HELLO_TIMEOUT), run_id=run_id, resume=resume)
        networks.append(network)
        if on_connected is not None:
            on_connected()
        return FlowerServer(run, network=network, device=dev, dataset=dataset, resumed=resume)

    networks: list[FlowerNetwork] = []

    run_id = ""
    with RunStore(settings.store_path) as store:
        run_id = settings.run_id or ""
        if not run_id:
            _, ids = store.create_batch(name=config.name, source=settings.config_path or "<flower>",
                                        runs=[describe_run(config)])
            run_id = ids[0]
        else:
            stored = RunConfig.from_dict(store.run(run_id).config).to_dict()
            if stored != config.to_dict():
                raise ConfigError(f"run {run_id} in {settings.store_path} is not run {settings.run_index} "
                                  f"of {settings.config_path}")
        try:
            execute_run(store, run_id, config, device=device, dataset=dataset, observer=observer, harness=harness)
        except SystemExit as exiting:
            # Flower's ServerApp process answers SIGTERM, SIGINT and SIGQUIT (a deployment's teardown,
            # `flwr stop`, Ctrl-C) with SystemExit (flwr_exit): the run was stopped, it did not fail
            try:
                store.set_status(run_id, "failed", error=_stopped_reason(exiting))
            except StoreError:  # the store itself failed: the stop says more
                pass
            raise
        except Exception as error:
            # nodes that could not join (on a resume: could not restore their stored state) are why a
            # round falls below a threshold: their reasons belong in the run's error, not only in a log
            refused = _refused(networks[-1]) if networks else ""
            if refused:
                try:
                    store.set_status(run_id, "failed", error=f"{describe_error(error)}; {refused}")
                except StoreError:
                    pass
            raise
    return run_id


def _refused(network: FlowerNetwork) -> str:
    """The clients counted out at the hello, with their reasons ("" when none was)."""
    lost = [d for d in network.dropouts if d.stage == "hello"]
    if not lost:
        return ""
    return (f"{len(lost)} of {len(network.nodes)} clients could not join: "
            + "; ".join(d.reason if d.reason.startswith(f"client {d.party}") else f"client {d.party}: {d.reason}"
                        for d in lost))


def _stopped_reason(stop: SystemExit) -> str:
    """The stored reason of a run whose ServerApp process was told to exit (not "SystemExit: 0")."""
    return (f"interrupted: the ServerApp process was stopped (exit code {stop.code}: Flower's exit on "
            "SIGTERM, SIGINT or SIGQUIT); its stored rounds stay, --resume continues it")


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


@dataclass(frozen=True)
class NodeSettings:
    """A node's own config (``context.node_config``), checked."""

    partition: int
    parties: int
    data_path: str | None = None
    state_path: str | None = None


def _node_config(context: Context, state_root: str | None = None) -> NodeSettings:
    node = context.node_config
    pid, parties = node.get("partition-id"), node.get("num-partitions")
    path, state = node.get("data-path"), node.get("state-path")
    if not isinstance(pid, int) or not isinstance(parties, int) or not 0 <= pid < parties:
        raise ConfigError(f"node config needs integer partition-id in [0, num-partitions); got {pid!r}, {parties!r}")
    if path is not None and not isinstance(path, str):
        raise ConfigError("node config data-path must be a string")
    if state is not None and (not isinstance(state, str) or not state):
        raise ConfigError("node config state-path must be a directory's path")
    if state is None and state_root is not None:
        state = str(Path(state_root) / f"client-{pid}")
    return NodeSettings(partition=pid, parties=parties, data_path=path, state_path=state)


def _store(settings: NodeSettings) -> NodeStore | None:
    return None if settings.state_path is None else NodeStore(settings.state_path, partition=settings.partition)


def _identity(raw: bytes, partition: int) -> Identity:
    return Identity(partition, Ed25519PrivateKey.from_private_bytes(raw))


def hello(message: Message, context: Context, *, state_root: str | None = None) -> Message:
    """The run's public config: checked (it must parse, and this node must find its data and partition —
    loaded here, under the hello's longer wait, not in the first stage) and kept; answered with this
    node's party (and, under ``authenticate``, its public signing key: the key is made here, from
    :mod:`secrets`, and kept in the node's own state). On a resume the node restores its own stored
    state (and key) of the round the server names, or answers why it cannot (it is then a dropout,
    never a fresh node in a resumed run)."""
    request = read_hello(message.content)
    settings = _node_config(context, state_root)
    config = _config(request.config)
    node = NodeHost.node(config, settings.partition, data_path=settings.data_path)
    store = _store(settings) if request.run_id else None
    authenticate = config.secure.authenticate
    fields: dict[str, Any] = {"config": request.config, "snapshot": b"", "live": b"", "run-id": request.run_id,
                              "stored": request.resume, "identity": b"", "keys": b""}
    error = ""
    if request.resume >= 0:
        try:
            if store is None:
                raise MissingState(f"client {settings.partition} keeps no state (no state-path in its node config, "
                                   "or no run id): it cannot resume")
            stored = store.load(request.run_id, request.resume, digest=run_digest(config.to_dict()))
            if authenticate and not stored.identity:
                raise TamperedState(f"client {settings.partition}: stored state of round {stored.round} holds no "
                                    "signing key")
            try:
                node.restore(stored.snapshot)
            except WireError as failure:
                raise TamperedState(f"client {settings.partition}: stored state of round {stored.round}: "
                                    f"{failure}") from None
            fields.update(snapshot=stored.snapshot, identity=stored.identity if authenticate else b"")
        except NodeStateError as failure:
            error = str(failure)
            fields = {"config": request.config, "error": error}
    else:
        if authenticate:
            fields["identity"] = secrets.token_bytes(32)
        if store is not None:  # a fresh start: the state a resume before this node's first change restores
            store.save(request.run_id, -1, digest=run_digest(config.to_dict()),
                       node=StoredNode(-1, node.snapshot(), fields["identity"]))
    context.state[KEY] = ConfigRecord(fields)
    key = _identity(fields["identity"], settings.partition).public_bytes if fields.get("identity") else b""
    return Message(write_hello_reply(nonce=request.nonce, party=settings.partition, parties=settings.parties,
                                     error=error, key=key), reply_to=message)


def _record(context: Context) -> ConfigRecord:
    try:
        record = context.state[KEY]
    except KeyError:
        raise ConfigError("a message before the hello: this node does not know the run") from None
    assert isinstance(record, ConfigRecord)
    if "error" in record:
        raise NodeStateError(str(record["error"]))
    return record


def register(message: Message, context: Context, *, state_root: str | None = None) -> Message:
    """``authenticate``: the directory of every party's public key, kept for the run. It must hold
    this node's own key as the node made it, and the server's; the node checks every message
    against it from now on (:meth:`~secure_fl.runtime.node.ClientNode.register`)."""
    nonce, keys = read_register(message.content)
    settings = _node_config(context, state_root)
    record = _record(context)
    identity = bytes(record["identity"])  # type: ignore[arg-type]
    if not identity:
        raise StageError("a registration in a run without authenticate")
    mine = _identity(identity, settings.partition).public_bytes
    if keys.get(settings.partition) != mine:
        raise StageError(f"the directory does not hold client {settings.partition}'s own key")
    if SERVER not in keys:
        raise StageError("the directory holds no key of the server")
    Directory(keys)  # every key parses
    record["keys"] = encode_keys(keys)
    context.state[KEY] = record
    return Message(write_register_reply(nonce=nonce, count=len(keys)), reply_to=message)


def exchange(message: Message, context: Context, *, state_root: str | None = None) -> Message:
    """One exchange: restore the node from its state, answer, keep the new state (and store it on the
    node's disk, keyed by run and round, when it changed)."""
    request = read_request(message.content)
    settings = _node_config(context, state_root)
    record = _record(context)
    text, run_id, stored = record["config"], record["run-id"], record["stored"]
    identity, keys = bytes(record["identity"]), bytes(record["keys"])  # type: ignore[arg-type]
    assert isinstance(text, str) and isinstance(run_id, str) and isinstance(stored, int)
    config = _config(text)
    node = NodeHost.node(config, settings.partition, data_path=settings.data_path,
                         identity=_identity(identity, settings.partition) if identity else None)
    if identity:
        if not keys:
            raise StageError("an exchange before the registration of the signing keys")
        node.register(Directory(decode_keys(keys)))
    previous = NodeState(snapshot=bytes(record["snapshot"]), live=bytes(record["live"]))  # type: ignore[arg-type]
    replies, state = handle(node, previous, request.inbox)
    store = _store(settings) if run_id else None
    if store is not None and state.snapshot != previous.snapshot:
        stored = max(stored, request.round)  # never file a later state under an earlier round
        store.save(run_id, stored, digest=run_digest(config.to_dict()),
                   node=StoredNode(stored, state.snapshot, identity))
    context.state[KEY] = ConfigRecord({"config": text, "snapshot": state.snapshot, "live": state.live,
                                       "run-id": run_id, "stored": stored, "identity": identity, "keys": keys})
    return Message(write_reply(nonce=request.nonce, seq=request.seq, outbox=replies), reply_to=message)


def node_app(*, state_root: str | None = None) -> ClientApp:
    """A ClientApp whose nodes keep their state under ``state_root/client-<partition-id>`` unless
    their node config names a ``state-path`` (the simulation engine's nodes, whose node config
    Flower fixes)."""
    app = ClientApp()

    @app.query("hello")
    def _hello(message: Message, context: Context) -> Message:
        return hello(message, context, state_root=state_root)

    @app.query("exchange")
    def _exchange(message: Message, context: Context) -> Message:
        return exchange(message, context, state_root=state_root)

    @app.query("register")
    def _register(message: Message, context: Context) -> Message:
        return register(message, context, state_root=state_root)

    return app


client_app = node_app()
