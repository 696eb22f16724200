"""Client nodes and the runtime's messages: snapshots restore a node exactly, corrupt input gets one
typed error (:class:`protocols.WireError`), and a node answers anything malformed with a refusal."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from protocols import WireError
from secure_fl.config import RunConfig, parse_config
from secure_fl.runtime import Simulation, build_simulation
from secure_fl.runtime.messages import (
    DIGEST_BYTES,
    RUNTIME,
    Kind,
    RuntimeMessage,
    is_runtime,
    run_digest,
)
from secure_fl.runtime.node import ClientNode
from secure_fl.snapshots import dump_state, load_state

CPU = torch.device("cpu")

CONFIG = """
seed = 2
[data]
dataset = "digits"
num_clients = 4
partition = "dirichlet"
partition_params = { alpha = 1.0 }
[model]
name = "mlp"
hidden = [8]
[train]
rounds = 3
clients_per_round = 3
batch_size = 32
lr = 0.1
[method]
name = "scaffold"
[secure]
protocol = "paillier"
[secure.paillier]
key_bits = 1024
allow_weak_keys = true
"""


def config() -> RunConfig:
    return parse_config(CONFIG).runs[0]


def fresh(cfg: RunConfig | None = None) -> Simulation:
    sim = build_simulation(cfg or config(), device=CPU)
    sim.setup()
    return sim


@pytest.fixture(scope="module")
def trained() -> Simulation:
    """Two rounds of SCAFFOLD with statistics through Paillier: nodes hold c_i, keys and what they learned."""
    sim = fresh()
    for _ in range(2):
        sim.run_round()
    return sim


def same(a: Any, b: Any) -> bool:
    """Plain-data equality with tensors compared exactly."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.dtype == b.dtype \
            and torch.equal(a, b)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return bool(a == b)


def node_state(node: ClientNode) -> dict[str, Any]:
    return {"state": node.state, "participant": node.participant.state(), "trained_round": node.trained_round}


# --- snapshots ---------------------------------------------------------------------------------

def test_a_snapshot_restores_a_fresh_node_exactly(trained: Simulation) -> None:
    cids = [c for c, node in trained.nodes.items() if node.trained_round >= 0]
    assert cids
    other = fresh()
    for cid in cids:
        node = trained.nodes[cid]
        assert "control" in node.state and node.participant.state()["sessions"]["paillier/"]
        blob = node.snapshot()
        assert not node.dirty
        target = other.nodes[cid]
        assert not same(node_state(target), node_state(node))
        target.restore(blob)
        assert same(node_state(target), node_state(node))
        assert target.snapshot() == blob and not target.dirty
        assert target.update is None and target.learned == {}  # a live round is forgotten
    # the key holder's secret key travelled in its own snapshot only, and came back
    agent = trained.stats.session("paillier").agent
    if agent in cids:
        assert other.nodes[agent].participant.sessions["paillier"].holds_key  # type: ignore[attr-defined]


def test_a_restored_node_refuses_a_replayed_train(trained: Simulation) -> None:
    cid = next(c for c, node in trained.nodes.items() if node.trained_round >= 0)
    node = trained.nodes[cid]
    other = fresh()
    other.nodes[cid].restore(node.snapshot())
    replay = RuntimeMessage(kind=Kind.TRAIN, round=node.trained_round, digest=other.nodes[cid].digest,
                            vector=trained.global_vector.numpy())
    (reply,) = other.nodes[cid].handle([replay.to_bytes()])
    refusal = RuntimeMessage.from_bytes(reply.data)
    assert refusal.kind == Kind.REFUSE and "replay" in refusal.reason


@pytest.mark.parametrize("corrupt", [
    lambda blob: blob[: len(blob) // 2],
    lambda blob: b"",
    lambda blob: b"not a snapshot",
    lambda blob: bytes(b ^ 0xFF for b in blob[:64]) + blob[64:],
    lambda blob: dump_state({"state": {}}),
    lambda blob: dump_state([1, 2, 3]),
], ids=["truncated", "empty", "garbage", "mangled-header", "missing-keys", "not-a-dict"])
def test_a_corrupt_snapshot_is_one_typed_error(trained: Simulation, corrupt: Any) -> None:
    cid = next(iter(trained.nodes))
    blob = trained.nodes[cid].snapshot()
    target = fresh().nodes[cid]
    with pytest.raises(WireError, match=f"client {cid}"):
        target.restore(corrupt(blob))


@pytest.mark.parametrize("field,value", [
    pytest.param("trained_round", "yesterday", id="round-not-a-number"),
    pytest.param("state", [1, 2], id="state-not-a-dict"),
    pytest.param("participant", {"sessions": {"rot13/": "00"}}, id="unplanned-session"),
    pytest.param("participant", {"sessions": {"paillier/": "zz"}}, id="session-not-hex"),
    pytest.param("participant", {"sessions": {"paillier/": "00ff"}}, id="session-garbage"),
])
def test_a_well_formed_but_wrong_snapshot_is_one_typed_error(trained: Simulation, field: str, value: Any) -> None:
    cid = next(iter(trained.nodes))
    saved = load_state(trained.nodes[cid].snapshot())
    saved[field] = value
    target = fresh().nodes[cid]
    with pytest.raises(WireError):
        target.restore(dump_state(saved))


def test_a_refused_snapshot_leaves_the_node_as_it_was(trained: Simulation) -> None:
    cid = next(c for c, node in trained.nodes.items() if node.state)
    saved = load_state(trained.nodes[cid].snapshot())
    saved["participant"] = {"sessions": {"paillier/": "00ff"}}
    target = fresh().nodes[cid]
    before = node_state(target)
    with pytest.raises(WireError):
        target.restore(dump_state(saved))
    assert same(node_state(target), before)


# --- runtime messages ---------------------------------------------------------------------------

DIGEST = run_digest({"name": "test"})


def examples() -> list[RuntimeMessage]:
    vector = np.linspace(-1, 1, 7, dtype=np.float32)
    return [
        RuntimeMessage(kind=Kind.BROADCAST, round=3, digest=DIGEST, name="control", vector=vector),
        RuntimeMessage(kind=Kind.TRAIN, round=0, digest=DIGEST, vector=vector),
        RuntimeMessage(kind=Kind.ABORT, round=2**40, digest=DIGEST),
        RuntimeMessage(kind=Kind.BULLETIN, round=5, digest=DIGEST, name="total_samples",
                       releases=((0, (0, 1, 2)), (3, (4,)), (4, (1, 2**32 - 2)))),
        RuntimeMessage(kind=Kind.REUSE, round=6, digest=DIGEST, name="total_samples", releases=((2, (0, 1, 3)),)),
        RuntimeMessage(kind=Kind.REFUSE, round=-1, digest=DIGEST, reason="StageError: nope ✗"),
    ]


def test_runtime_messages_round_trip() -> None:
    assert len(DIGEST) == DIGEST_BYTES and run_digest({"name": "test"}) == DIGEST != run_digest({"name": "x"})
    for message in examples():
        data = message.to_bytes()
        assert is_runtime(data)
        back = RuntimeMessage.from_bytes(data, dimension=7)
        assert (back.kind, back.round, back.digest, back.name, back.reason, back.releases) == \
            (message.kind, message.round, message.digest, message.name, message.reason, message.releases)
        if message.vector is None:
            assert back.vector is None
        else:
            assert back.vector is not None and np.array_equal(back.vector, message.vector)
        assert back.to_bytes() == data
        labelled = message.message(statistic="model_broadcast")
        assert labelled.data == data and labelled.label.protocol == RUNTIME
        assert labelled.label.stage == message.kind.name.lower() and labelled.label.round == message.round
    with pytest.raises(WireError, match="the model has 8 entries, the message 7"):
        RuntimeMessage.from_bytes(examples()[1].to_bytes(), dimension=8)
    with pytest.raises(WireError, match="16 bytes"):
        RuntimeMessage(kind=Kind.ABORT, round=0, digest=b"short").to_bytes()
    with pytest.raises(WireError, match="non-finite"):
        RuntimeMessage.from_bytes(dataclasses.replace(
            examples()[1], vector=np.array([1.0, np.nan], dtype=np.float32)).to_bytes())
    for releases, match in ((((0, (2, 1)),), "ascending"), (((0, ()),), "1 to"), ((), "1 to")):
        with pytest.raises(WireError, match=match):
            RuntimeMessage.from_bytes(RuntimeMessage(kind=Kind.BULLETIN, round=1, digest=DIGEST, name="s",
                                                     releases=releases).to_bytes())
    two = ((0, (1,)), (1, (1,)))
    with pytest.raises(WireError, match="one release, not 2"):
        RuntimeMessage(kind=Kind.REUSE, round=2, digest=DIGEST, name="s", releases=two).to_bytes()
    bulletin = RuntimeMessage(kind=Kind.BULLETIN, round=2, digest=DIGEST, name="s", releases=two).to_bytes()
    with pytest.raises(WireError, match="a reuse holds 1 to 1 releases, this one 2"):
        RuntimeMessage.from_bytes(bulletin[:4] + bytes([int(Kind.REUSE)]) + bulletin[5:])
    long = RuntimeMessage(kind=Kind.REFUSE, round=0, digest=DIGEST, reason="x" * 2000)
    assert len(RuntimeMessage.from_bytes(long.to_bytes()).reason) == 512


@st.composite
def mutated(draw: st.DrawFn) -> bytes:
    data = bytearray(draw(st.sampled_from([m.to_bytes() for m in examples()])))
    for _ in range(draw(st.integers(1, 4))):
        action = draw(st.sampled_from(["flip", "truncate", "insert", "delete", "append"]))
        at = draw(st.integers(0, max(len(data) - 1, 0)))
        if action == "flip" and data:
            data[at] ^= draw(st.integers(1, 255))
        elif action == "truncate":
            del data[at:]
        elif action == "insert":
            data[at:at] = draw(st.binary(min_size=1, max_size=8))
        elif action == "delete" and data:
            del data[at : at + draw(st.integers(1, 8))]
        else:
            data += draw(st.binary(min_size=1, max_size=8))
    return bytes(data)


@given(mutated(), st.sampled_from([None, 7]))
def test_mutated_runtime_messages_raise_only_wire_errors(data: bytes, dimension: int | None) -> None:
    try:
        message = RuntimeMessage.from_bytes(data, dimension=dimension)
    except WireError:
        return
    assert message.to_bytes() == data  # whatever parses is exactly what it says


@pytest.fixture(scope="module")
def idle_node() -> ClientNode:
    return fresh().nodes[0]


@given(mutated())
def test_a_node_answers_mutated_runtime_messages_with_a_refusal(idle_node: ClientNode, data: bytes) -> None:
    node = idle_node
    digest = node.digest
    data = data.replace(DIGEST, digest)  # the run's own digest, so that mutations reach further
    before = node_state(node)
    replies = node.handle([data]) if is_runtime(data) else []
    for reply in replies:
        refusal = RuntimeMessage.from_bytes(reply.data)
        assert refusal.kind == Kind.REFUSE and refusal.reason and reply.label.protocol == RUNTIME
    if node.trained_round == before["trained_round"]:
        assert same(node.state, before["state"])
