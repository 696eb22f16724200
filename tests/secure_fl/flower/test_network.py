"""The Flower network and apps over an in-process grid with fault injection (no Ray, no sockets).

The real ClientApp answers every message from the state it keeps (restored for each message, as
in a fresh process), and the server is the same ServerLoop as the embedded engine's: for the
same config the transcript is the embedded LocalNetwork's entry for entry, with and without
faults, and bad traffic costs only the party that sent it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from protocols import AbortedError, Message
from secure_fl.config import RunConfig, parse_config
from secure_fl.flower.network import FlowerError, FlowerNetwork
from secure_fl.flower.server import FlowerServer
from secure_fl.runtime import execute_run
from secure_fl.runtime.build import build_simulation, load_run_dataset
from secure_fl.runtime.runner import describe_run
from secure_fl.store import RunStore

from .fakegrid import FakeGrid, Fault

CPU = torch.device("cpu")
TIMEOUT = 10.0

CONFIG = """
name = "flower-fake"
seed = 3
[data]
dataset = "digits"
num_clients = 4
train_samples = 400
partition = "dirichlet"
partition_params = { alpha = 1.0 }
[model]
name = "mlp"
hidden = [8]
[train]
rounds = 2
clients_per_round = 4
batch_size = 32
lr = 0.05
[secure]
protocol = "plain"
update_protocol = "masking"
"""


@pytest.fixture(scope="module")
def config() -> RunConfig:
    return parse_config(CONFIG).runs[0]


def _key(transcript: Any) -> list[tuple[Any, ...]]:
    """Transcript entries without the run ids (drawn at random per run), in a canonical order: the
    embedded engine may deliver a whole cohort's training messages before it collects any reply
    (its client pool), so only the order within an exchange may differ."""
    entries = [(e.round, e.protocol, e.stage, e.sender, e.receiver, e.statistic, e.bytes, e.visibility, e.k,
                e.dimension, e.owner) for e in transcript]
    return sorted(entries, key=repr)


def embedded(config: RunConfig, interceptor: Callable[[bytes, Message], bytes | None] | None = None
             ) -> tuple[list[float], list[tuple[Any, ...]]]:
    sim = build_simulation(config, device=CPU)
    sim.network.interceptor = interceptor
    sim.setup()
    accuracy = []
    for _ in range(config.train.rounds):
        sim.run_round()
        accuracy.append(sim.evaluate()["accuracy"])
    return accuracy, _key(sim.transcript)


def flower(config: RunConfig, grid: FakeGrid) -> tuple[list[float], list[tuple[Any, ...]], FlowerServer]:
    network = FlowerNetwork.connect(grid, config=json.dumps(config.to_dict()), parties=config.data.num_clients,
                                    stage_timeout=TIMEOUT, clock=grid.clock, sleep=grid.clock.sleep)
    server = FlowerServer(config, network=network, device=CPU, dataset=load_run_dataset(config))
    server.setup()
    accuracy = []
    for _ in range(config.train.rounds):
        server.run_round()
        accuracy.append(server.evaluate()["accuracy"])
    return accuracy, _key(network.transcript), server


def test_same_transcript_and_metrics_as_embedded(config: RunConfig) -> None:
    grid = FakeGrid(4, faults=[Fault(1, "delay", round=0, stage="share_keys", delay=TIMEOUT / 2),
                               Fault(2, "stray", round=1, stage="train")])
    want_accuracy, want = embedded(config)
    accuracy, got, server = flower(config, grid)
    assert got == want
    assert accuracy == want_accuracy
    assert server.network.dropouts == []
    assert len(server.network.rejected) == 1  # the stray reply, ignored
    # one Flower message per party and exchange, after one hello each
    assert grid.handled == 4 + sum(s.parties for s in server.network.stages)
    stages = server.network.stages
    assert sum(s.transcript_bytes for s in stages) == sum(e[6] for e in got)
    assert all(s.wire_bytes > s.transcript_bytes for s in stages)  # Flower's framing costs something


def test_lost_reply_is_the_embedded_dropout(config: RunConfig) -> None:
    """Client 2's masked upload of the last round is lost: the same transcript as an embedded run
    that loses it, the same model (the sum over the other three, exact), and the run says who."""
    gone = False

    def intercept(data: bytes, message: Message) -> bytes | None:
        nonlocal gone
        env, label = message.envelope, message.label
        if env is not None and env.sender == 2 and (label.round, label.protocol, label.stage) == (1, "masking", "upload"):
            gone = True
        return None if gone and env is not None and 2 in (env.sender, env.receiver) else data

    want_accuracy, want = embedded(config, intercept)
    accuracy, got, server = flower(config, FakeGrid(4, faults=[Fault(2, "lost", round=1, stage="upload")]))
    assert got == want
    assert accuracy == want_accuracy
    [dropout] = server.network.dropouts
    assert (dropout.round, dropout.stage, dropout.party, dropout.gone) == (1, "upload", 2, True)
    update = [r for r in server.stats.records if r.name == "model_update"][-1]
    assert update.contributors == (0, 1, 3) and update.dropouts == (2,)


@pytest.mark.parametrize(("kind", "error", "gone"), [
    ("garbage", "WireError", False), ("replay", "ReplayError", False), ("foreign", "StageError", False),
    ("impostor", "StageError", False), ("error", "Flower error reply 5", True), ("drop", "no reply within", True),
])
def test_bad_reply_is_a_dropout_of_that_party(config: RunConfig, kind: str, error: str, gone: bool) -> None:
    grid = FakeGrid(4, faults=[Fault(1, kind, round=0, stage="share_keys")])
    _, _, server = flower(config, grid)
    [dropout] = server.network.dropouts
    assert dropout.party == 1 and dropout.round == 0 and dropout.stage == "share_keys" and dropout.gone == gone
    assert error in dropout.reason
    updates = [r for r in server.stats.records if r.name == "model_update"]
    assert 1 not in updates[0].contributors and len(updates[0].contributors) == 3
    # a node that misbehaved once answers again next round; a dead one is skipped without waiting
    assert (1 in updates[1].contributors) != gone
    assert grid.clock.now <= (TIMEOUT + 1) * (1 if kind == "drop" else 0) + 1


def test_late_reply_times_out_without_hanging(config: RunConfig) -> None:
    grid = FakeGrid(4, faults=[Fault(3, "delay", round=1, stage="train", delay=10 * TIMEOUT)])
    _, _, server = flower(config, grid)
    [dropout] = server.network.dropouts
    assert dropout.party == 3 and dropout.gone and "stage timeout" in dropout.reason
    assert TIMEOUT <= grid.clock.now < 2 * TIMEOUT  # one stage timeout, then the node is skipped


def test_missing_node_is_a_clear_error(config: RunConfig) -> None:
    grid = FakeGrid(3)
    with pytest.raises(FlowerError, match="3 of 4 nodes connected"):
        FlowerNetwork.connect(grid, config=json.dumps(config.to_dict()), parties=4, stage_timeout=TIMEOUT,
                              clock=grid.clock, sleep=grid.clock.sleep)
    assert grid.clock.now <= TIMEOUT + 1


def test_two_nodes_claiming_one_partition_is_a_clear_error(config: RunConfig) -> None:
    grid = FakeGrid(4)
    twin = list(grid.contexts.values())[-1]
    twin.node_config["partition-id"] = 0
    with pytest.raises(FlowerError, match="both claim partition 0"):
        FlowerNetwork.connect(grid, config=json.dumps(config.to_dict()), parties=4, stage_timeout=TIMEOUT,
                              clock=grid.clock, sleep=grid.clock.sleep)


def test_below_the_threshold_the_round_aborts_and_the_run_says_why(config: RunConfig, tmp_path: Path) -> None:
    """Three of four clients die in masking's first stage: one typed abort, within one stage timeout,
    the run marked failed with the protocol's reason and its stored rounds kept."""
    grid = FakeGrid(4, faults=[Fault(p, "drop", round=0, stage="open") for p in (1, 2, 3)])
    dataset = load_run_dataset(config)

    def harness(run: RunConfig, device: torch.device, data: Any) -> FlowerServer:
        network = FlowerNetwork.connect(grid, config=json.dumps(run.to_dict()), parties=4, stage_timeout=TIMEOUT,
                                        clock=grid.clock, sleep=grid.clock.sleep)
        return FlowerServer(run, network=network, device=device, dataset=data)

    with RunStore(tmp_path / "runs.sqlite") as store:
        _, [run_id] = store.create_batch(name="abort", source="test", runs=[describe_run(config)])
        with pytest.raises(AbortedError):
            execute_run(store, run_id, config, device=CPU, dataset=dataset, harness=harness)
        run = store.run(run_id)
        assert run.status == "failed" and run.error and "1 < threshold 3" in run.error
    assert grid.clock.now <= TIMEOUT + 1


def test_a_stopped_engine_ends_the_wait_at_the_next_poll(config: RunConfig) -> None:
    import threading

    from protocols import Exposure, Label

    grid = FakeGrid(4, faults=[Fault(0, "drop")])
    stop = threading.Event()
    network = FlowerNetwork.connect(grid, config=json.dumps(config.to_dict()), parties=4, stage_timeout=TIMEOUT,
                                    clock=grid.clock, sleep=grid.clock.sleep, stop=stop)
    stop.set()
    label = Label(protocol="plain", run_id="", stage="open", stage_index=0, statistic="x", round=0,
                  exposure=Exposure.public())
    with pytest.raises(FlowerError, match="stopped"):
        network.exchange({0: [Message(b"x", label)]})
    assert grid.clock.now < 1


def test_a_silent_extra_node_costs_no_wait(config: RunConfig) -> None:
    grid = FakeGrid(5, faults=[Fault(4, "drop", stage="hello")])
    for context in grid.contexts.values():
        context.node_config["num-partitions"] = 4
    network = FlowerNetwork.connect(grid, config=json.dumps(config.to_dict()), parties=4, stage_timeout=TIMEOUT,
                                    clock=grid.clock, sleep=grid.clock.sleep)
    assert sorted(network.nodes) == [0, 1, 2, 3] and grid.clock.now < 1
