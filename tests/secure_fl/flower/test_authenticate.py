"""``[secure] authenticate = true`` on the Flower engines: a registration step over Flower messages.

Each node makes its Ed25519 key (from :mod:`secrets`, kept in its own state and stored with its
snapshot) and sends the public half in its hello reply; the server registers the directory with
its coordinator and sends it to every node, which checks that it holds its own key. Then every
envelope is signed and checked, and the run computes the embedded authenticated run's model.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from flwr.app import Context, Message, RecordDict

from protocols import AbortedError
from secure_fl.config import RunConfig, parse_config
from secure_fl.flower.apps import client_app
from secure_fl.flower.network import FlowerNetwork
from secure_fl.flower.wire import REGISTER, write_register
from secure_fl.runtime.build import build_simulation, load_run_dataset
from secure_fl.runtime.runner import describe_run, summarize
from secure_fl.store import RunStore

from .fakegrid import FakeGrid, Fault
from .test_network import CONFIG, TIMEOUT, _key, flower
from .test_resume import _history, _play

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def config() -> RunConfig:
    return parse_config(CONFIG + "authenticate = true\n").runs[0]


def test_an_authenticated_flower_run_computes_the_embedded_model(config: RunConfig) -> None:
    assert config.secure.authenticate
    sim = build_simulation(config, device=CPU)
    sim.setup()
    want = []
    for _ in range(config.train.rounds):
        sim.run_round()
        want.append(sim.evaluate()["accuracy"])
    grid = FakeGrid(4)
    accuracy, got, server = flower(config, grid)
    assert accuracy == want
    # the embedded clients train together (its client pool): the same model up to float rounding;
    # bit for bit the model of the same run on Flower without authenticate
    assert torch.allclose(server.server.global_vector, sim.global_vector, rtol=0, atol=1e-6)
    plain = parse_config(CONFIG).runs[0]
    assert torch.equal(server.server.global_vector, flower(plain, FakeGrid(4))[2].server.global_vector)
    assert got == _key(sim.transcript)  # the same signed envelopes crossed, byte for byte in size
    assert server.network.dropouts == [] and server.stats.authenticator is not None
    [register] = [s for s in server.network.stages if s.stage == "register"]
    assert register.parties == 4 and register.lost == ()
    keys = server.network.keys
    assert len(keys) == 4 and len(set(keys.values())) == 4
    assert all(ctx.state["secure-fl"]["keys"] for ctx in grid.contexts.values())  # type: ignore[index]


def test_a_node_refuses_a_directory_without_its_own_key(config: RunConfig) -> None:
    grid = FakeGrid(4)
    network = FlowerNetwork.connect(grid, config=json.dumps(config.to_dict()), parties=4, stage_timeout=TIMEOUT,
                                    clock=grid.clock, sleep=grid.clock.sleep)
    keys = dict(network.keys)
    keys[1], keys[0xFFFFFFFF] = keys[2], bytes(range(32))  # a substituted key for client 1
    network.register(keys, round=0)
    [dropout] = network.dropouts
    assert dropout.party == 1 and dropout.stage == "register" and "own key" in dropout.reason
    assert network.gone == {1}


def test_a_register_before_the_hello_is_refused() -> None:
    context = Context(run_id=1, node_id=1, state=RecordDict(), run_config={},
                      node_config={"partition-id": 0, "num-partitions": 2})
    message = Message(write_register(nonce=bytes(16), keys={0: bytes(32)}), dst_node_id=1, message_type=REGISTER)
    with pytest.raises(Exception, match="before the hello"):
        client_app(message, context)


def test_an_authenticated_run_resumes_with_the_nodes_own_keys(config: RunConfig, tmp_path: Path) -> None:
    """Aborted below the threshold and resumed on fresh nodes: each restores its signing key with its
    state, the server registers the directory again, and the run gives the uninterrupted one's metrics."""
    dataset = load_run_dataset(config)
    with RunStore(tmp_path / "runs.sqlite") as store:
        _, [whole, run_id] = store.create_batch(name="auth", source="test",
                                                runs=[describe_run(config), describe_run(config)])
        _play(FakeGrid(4, state_root=tmp_path / "whole"), store, whole, config, dataset)
        faults = [Fault(p, "drop", round=1, stage="train") for p in (1, 2, 3)]  # the masked update's open rides along
        with pytest.raises(AbortedError):
            _play(FakeGrid(4, faults=faults, state_root=tmp_path / "nodes"), store, run_id, config, dataset)
        _play(FakeGrid(4, state_root=tmp_path / "nodes"), store, run_id, config, dataset)
        assert store.run(run_id).status == "done"
        assert _history(store, run_id) == _history(store, whole)
        assert all(not r.metrics.get("net.dropouts") for r in summarize(store, run_id).history)
