"""One client node of a run outside the embedded engine: built from its own node config, restored
from its snapshot for every message, snapshotted back.

A Flower ClientApp handles each message in a fresh process (deployment) or in whichever worker
the engine picks (simulation), so nothing may live in the process between messages.
:class:`NodeHost` builds the client's :class:`~secure_fl.runtime.node.ClientNode` from the run's
public config and the node's partition id — the node finds its own data: the partition is a
deterministic function of the public config and seed, as in the embedded engine's build — and
:func:`handle` restores it from the state the node keeps, answers one inbox and returns the new
state. Nothing of the client's data or secrets leaves the node except through its replies.

The state is two blobs that never leave the node's machine:

``snapshot``
    :meth:`ClientNode.snapshot` (method state, protocol keys, once-per-run record, last round
    trained): strict, versioned, what survives between rounds;
``live``
    the live round: the local update trained this round, the round's broadcasts, what it learned,
    and its protocol parties in flight (their ephemeral keys and shares). They are objects of
    this package and of :mod:`protocols` with no byte format of their own, so they are pickled
    here, with the node's static parts (its data, trainer, sessions) pickled by reference and
    X25519/Ed25519 keys by their raw bytes. A pickle is only ever read back by the node that
    wrote it, from the state its own SuperNode keeps for it (docs/flower-engine.md).
"""

from __future__ import annotations

import copyreg
import io
import pickle
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from protocols import Identity, Message, WireError
from secure_fl.algorithms import ClientData, LocalTrainer, Method, RunInfo, make_algorithm
from secure_fl.config import ConfigError, RunConfig
from secure_fl.data import Dataset
from secure_fl.losses import make_loss
from secure_fl.runtime.build import (
    client_data,
    dp_sgd_config,
    initial_model,
    load_run_dataset,
    local_training,
    prepare_partition,
    statistics_plan,
)
from secure_fl.runtime.messages import run_digest
from secure_fl.runtime.mitigation import run_privacy
from secure_fl.runtime.node import ClientNode
from secure_fl.runtime.rng import Seeds
from secure_fl.selection import make_selection
from secure_fl.stats import StatisticsPlan

__all__ = ["NodeHost", "NodeState", "handle"]

_LIVE_NODE = ("update", "_broadcast", "_broadcast_round", "learned", "telemetry")
"""The node's attributes that hold the live round (everything else is static or in the snapshot)."""


@dataclass(frozen=True)
class NodeState:
    """What a node keeps between messages (on its own machine): see the module docstring."""

    snapshot: bytes = b""
    live: bytes = b""


@dataclass
class _RunParts:
    """What every client of one run built in one process shares: the public config and the data
    the partition assigns (each node reads only its own slice)."""

    config: RunConfig
    digest: bytes
    clients: dict[int, ClientData]
    method: Method
    plan: StatisticsPlan
    info: RunInfo
    trainer: LocalTrainer
    seeds: Seeds
    num_classes: int
    dp_sgd: Any
    extra: Mapping[tuple[str, str], Any]
    noise_seed: Any


class NodeHost:
    """Builds client nodes of runs in this process (the data of a run is loaded once per process)."""

    _runs: ClassVar[dict[tuple[bytes, str], _RunParts]] = {}
    _lock = threading.Lock()

    @classmethod
    def parts(cls, config: RunConfig, *, data_path: str | None = None) -> _RunParts:
        digest = run_digest(config.to_dict())
        key = (digest, data_path or "")
        with cls._lock:
            parts = cls._runs.get(key)
            if parts is None:
                cls._runs.clear()  # one run's data in memory at a time
                parts = cls._runs[key] = _build_parts(config, data_path=data_path)
            return parts

    @classmethod
    def node(cls, config: RunConfig, partition_id: int, *, data_path: str | None = None,
             identity: Identity | None = None) -> ClientNode:
        """A fresh node of client ``partition_id`` (restore its state with :func:`restore`), with the
        signing key ``identity`` it keeps (``authenticate``; register the directory next)."""
        parts = cls.parts(config, data_path=data_path)
        if partition_id not in parts.clients:
            raise ConfigError(f"partition-id {partition_id} is not a client of this run "
                              f"(0 .. {len(parts.clients) - 1})")
        selection = make_selection(config.selection.name, config.selection.params)
        return ClientNode(
            data=parts.clients[partition_id], method=parts.method.client(parts.info), plan=parts.plan,
            info=parts.info, trainer=parts.trainer, seeds=parts.seeds, digest=parts.digest,
            selection=selection.client(num_classes=parts.num_classes), dp_sgd=parts.dp_sgd,
            extra_sessions=parts.extra, noise_seed=parts.noise_seed, identity=identity)


def _build_parts(config: RunConfig, *, data_path: str | None) -> _RunParts:
    """The node-side half of :func:`~secure_fl.runtime.build.build_simulation`, on the CPU."""
    if data_path:
        from dataclasses import replace

        config_for_data = replace(config, data=replace(config.data, root=data_path))
    else:
        config_for_data = config
    device = torch.device("cpu")
    dataset: Dataset = load_run_dataset(config_for_data)
    _, indices = prepare_partition(config, dataset)
    clients = client_data(dataset, indices, device=device)
    model = initial_model(config, dataset, device=device)
    selection = make_selection(config.selection.name, config.selection.params)
    noised = run_privacy(config)
    training = local_training(config)
    trainer = LocalTrainer(model, training=training, loss=make_loss(config.loss.name, config.loss.params))
    plan = statistics_plan(config, selection, dimension=trainer.layout.dimension, privacy=noised)
    assert plan.updates is not None
    info = RunInfo(num_clients=len(clients), num_classes=dataset.num_classes, dimension=trainer.layout.dimension,
                   rounds=config.train.rounds, training=training, updates=plan.updates)
    return _RunParts(
        config=config, digest=run_digest(config.to_dict()), clients=clients,
        method=make_algorithm(config.method.name, config.method.params), plan=plan, info=info, trainer=trainer,
        seeds=Seeds(config.seed), num_classes=dataset.num_classes, dp_sgd=dp_sgd_config(config, clients),
        extra=selection.sessions(), noise_seed=plan.privacy.client_noise_seed if plan.privacy is not None else None)


# --- the live round: pickled with the node's static parts by reference -----------------------------


def _key_reducers() -> dict[type, Callable[[Any], tuple[Any, ...]]]:
    from cryptography.hazmat.primitives.asymmetric import ed25519, x25519

    def raw_private(cls: Any) -> Callable[[Any], tuple[Any, ...]]:
        return lambda key: (cls.from_private_bytes, (key.private_bytes_raw(),))

    def raw_public(cls: Any) -> Callable[[Any], tuple[Any, ...]]:
        return lambda key: (cls.from_public_bytes, (key.public_bytes_raw(),))

    from protocols.primitives.channel import ChannelKey

    x_private = x25519.X25519PrivateKey.generate()
    e_private = ed25519.Ed25519PrivateKey.generate()
    reducers: dict[type, Callable[[Any], tuple[Any, ...]]] = {}
    try:
        import tenseal as ts

        reducers[ts.Context] = lambda ctx: (_seal_context, (bytes(ctx.serialize(
            save_public_key=True, save_secret_key=ctx.is_private(), save_galois_keys=ctx.has_galois_keys(),
            save_relin_keys=ctx.has_relin_keys())),))
        from protocols.primitives import bfv, ckks, seal

        # SEAL key sets by their serialisations (the loaded SEAL objects are rebuilt from them)
        for public in (seal.PublicKeys, ckks.PublicContext, bfv.PublicContext):
            reducers[public] = lambda keys: (type(keys), (keys.data, keys.params))
        for secret in (seal.SecretKeys, ckks.SecretContext, bfv.SecretContext):
            reducers[secret] = lambda keys: (type(keys), (bytes(keys._ctx.serialize(
                save_public_key=False, save_secret_key=True, save_galois_keys=False, save_relin_keys=False)),
                keys.public))
    except ImportError:  # pragma: no cover -- TenSEAL is a dependency; without it no SEAL party exists
        pass
    return {
        **reducers,
        # a channel key without its cache of derived AEAD keys (rebuilt on use): the key pair only
        ChannelKey: lambda key: (_channel_key, ({n: v for n, v in vars(key).items() if n != "_aeads"},)),
        type(x_private): raw_private(x25519.X25519PrivateKey),
        type(x_private.public_key()): raw_public(x25519.X25519PublicKey),
        type(e_private): raw_private(ed25519.Ed25519PrivateKey),
        type(e_private.public_key()): raw_public(ed25519.Ed25519PublicKey),
    }


def _channel_key(fields: dict[str, Any]) -> Any:
    from protocols.primitives.channel import ChannelKey

    key = ChannelKey.__new__(ChannelKey)
    key.__dict__.update(fields, _aeads={})
    return key


def _seal_context(data: bytes) -> Any:
    import tenseal as ts

    return ts.context_from(data, n_threads=1)


_REDUCERS: dict[type, Callable[[Any], tuple[Any, ...]]] | None = None


def _references(node: ClientNode) -> dict[str, object]:
    """The node's static parts a live party may point to, by name."""
    refs: dict[str, object] = {"node": node, "participant": node.participant, "data": node.data,
                               "trainer": node.trainer, "method": node.method, "info": node.info,
                               "plan": node.participant.plan, "seeds": node.seeds}
    if node.selection is not None:
        refs["selection"] = node.selection
    for key, session in node.participant.sessions.items():
        refs["session:" + (key if isinstance(key, str) else "/".join(key))] = session
    return refs


class _Pickler(pickle.Pickler):
    def __init__(self, file: io.BytesIO, refs: Mapping[str, object]) -> None:
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        global _REDUCERS
        if _REDUCERS is None:
            _REDUCERS = _key_reducers()
        self.dispatch_table = {**copyreg.dispatch_table, **_REDUCERS}
        self._refs = {id(obj): name for name, obj in refs.items()}

    def persistent_id(self, obj: object) -> str | None:
        return self._refs.get(id(obj))


class _Unpickler(pickle.Unpickler):
    def __init__(self, file: io.BytesIO, refs: Mapping[str, object]) -> None:
        super().__init__(file)
        self._refs = refs

    def persistent_load(self, pid: Any) -> object:
        try:
            return self._refs[str(pid)]
        except KeyError:
            raise WireError(f"the live state refers to {pid!r}, which this node does not have") from None


def live_state(node: ClientNode) -> bytes:
    """The node's live round (see the module docstring); empty when nothing is live."""
    endpoint = node.participant.endpoint
    state = {"node": {name: getattr(node, name) for name in _LIVE_NODE},
             "live": endpoint._live, "seen": endpoint._seen}
    buffer = io.BytesIO()
    _Pickler(buffer, _references(node)).dump(state)
    return buffer.getvalue()


def restore(node: ClientNode, state: NodeState) -> None:
    """Continue ``node`` from what it kept: the snapshot, then the live round."""
    if state.snapshot:
        node.restore(state.snapshot)
    if not state.live:
        return
    try:
        saved = _Unpickler(io.BytesIO(state.live), _references(node)).load()
        fields, live, seen = saved["node"], saved["live"], saved["seen"]
        if not isinstance(fields, dict) or set(fields) != set(_LIVE_NODE) or not isinstance(live, OrderedDict) \
                or not isinstance(seen, set):
            raise WireError("not a live node state")
    except WireError:
        raise
    except Exception as error:  # noqa: BLE001 -- any unreadable state is one typed error
        raise WireError(f"client {node.client_id}: unreadable live state ({type(error).__name__})") from None
    for name, value in fields.items():
        setattr(node, name, value)
    node.participant.endpoint._live = live
    node.participant.endpoint._seen = seen


def handle(node: ClientNode, state: NodeState, inbox: Sequence[bytes]) -> tuple[list[Message], NodeState]:
    """Restore ``node`` from ``state``, answer ``inbox``, return the replies and the new state."""
    restore(node, state)
    replies = node.handle(inbox)
    return replies, NodeState(snapshot=node.snapshot(), live=live_state(node))
