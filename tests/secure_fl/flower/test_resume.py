"""Resuming a run on a Flower engine: the server from the run store, each node from its own disk.

A run aborts below the protocol's threshold; started again on fresh nodes (new processes, empty
Flower state) that find their stored state in their ``state-path``, it gives the uninterrupted
run's metrics round for round. A node whose stored state is missing, foreign or tampered says so
and is a dropout of the resumed run, never a fresh node in a run whose protocols expect its keys.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

import pytest

from protocols import AbortedError
from secure_fl.config import RunConfig, parse_config
from secure_fl.data import Dataset
from secure_fl.flower.apps import ServerSettings, serve
from secure_fl.flower.network import FlowerNetwork
from secure_fl.flower.nodestore import (
    KEEP,
    ForeignState,
    MissingState,
    NodeStore,
    StoredNode,
    TamperedState,
)
from secure_fl.runtime.build import load_run_dataset
from secure_fl.runtime.messages import run_digest
from secure_fl.runtime.runner import describe_run, summarize
from secure_fl.store import RunStore

from .fakegrid import FakeGrid, Fault

CONFIG = """
name = "flower-resume"
seed = 5
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
rounds = 3
clients_per_round = 4
batch_size = 32
lr = 0.05
[method]
name = "scaffold"
[secure]
protocol = "plain"
update_protocol = "masking"
"""
"""SCAFFOLD: every client keeps a control variate between rounds, so a resume that lost a node's
state could not give the same model."""


@pytest.fixture(scope="module")
def config() -> RunConfig:
    return parse_config(CONFIG).runs[0]


@pytest.fixture(scope="module")
def dataset(config: RunConfig) -> Dataset:
    return load_run_dataset(config)


def _play(grid: FakeGrid, store: RunStore, run_id: str, config: RunConfig, dataset: Dataset) -> str:
    settings = ServerSettings(store_path=str(store.path), run_id=run_id, stage_timeout=0.5)
    return serve(grid, settings, config=config, dataset=dataset)


def _history(store: RunStore, run_id: str) -> list[tuple[Any, ...]]:
    return [(r.round, r.accuracy, r.auc, r.test_loss, r.per_class_accuracy) for r in summarize(store, run_id).history]


@pytest.fixture(scope="module")
def interrupted(tmp_path_factory: pytest.TempPathFactory, config: RunConfig, dataset: Dataset
                ) -> tuple[Path, str, list[tuple[Any, ...]]]:
    """A run aborted in round 1 (three of four nodes die in masking's first stage), and the
    uninterrupted run's history."""
    root = tmp_path_factory.mktemp("resume")
    with RunStore(root / "runs.sqlite") as store:
        _, [whole, run_id] = store.create_batch(name="resume", source="test",
                                                runs=[describe_run(config), describe_run(config)])
        _play(FakeGrid(4, state_root=root / "whole"), store, whole, config, dataset)
        faults = [Fault(p, "drop", round=1, stage="open") for p in (1, 2, 3)]
        with pytest.raises(AbortedError):
            _play(FakeGrid(4, faults=faults, state_root=root / "nodes"), store, run_id, config, dataset)
        run = store.run(run_id)
        assert run.status == "failed" and run.rounds_done == 1 and run.error and "threshold" in run.error
        return root, run_id, _history(store, whole)


def test_a_resumed_run_gives_the_uninterrupted_metrics(
        interrupted: tuple[Path, str, list[tuple[Any, ...]]], config: RunConfig, dataset: Dataset,
        tmp_path: Path) -> None:
    root, run_id, want = interrupted
    nodes = tmp_path / "nodes"
    import shutil

    shutil.copytree(root / "nodes", nodes)
    shutil.copy(root / "runs.sqlite", tmp_path / "runs.sqlite")
    for client in range(4):  # each node stored its own state, privately, bounded
        directory = nodes / f"client-{client}" / run_id
        assert stat.S_IMODE(directory.stat().st_mode) == 0o700
        assert all(stat.S_IMODE(f.stat().st_mode) == 0o600 for f in directory.iterdir())
        assert 1 <= len(list(directory.iterdir())) <= KEEP
    with RunStore(tmp_path / "runs.sqlite") as store:
        grid = FakeGrid(4, state_root=nodes)  # fresh nodes: new processes, nothing in Flower's state
        _play(grid, store, run_id, config, dataset)
        run = store.run(run_id)
        assert run.status == "done"
        got = _history(store, run_id)
        assert got == want  # bit for bit, round for round
        assert all(not r.metrics.get("net.dropouts") for r in summarize(store, run_id).history[1:])
    for client in range(4):
        assert len(list((nodes / f"client-{client}" / run_id).iterdir())) == KEEP


class _StopAfterFirstRound:
    """What Flower's ServerApp process does on SIGTERM/SIGINT (a deployment's teardown, Ctrl-C):
    ``flwr_exit`` raises SystemExit(0) in the main thread — here once round 0 is stored."""

    def run_started(self, run: Any, **_: Any) -> None: ...

    def client_finished(self, run: Any, round: int, done: int, total: int) -> None: ...

    def round_finished(self, run: Any, row: Any) -> None:
        raise SystemExit(0)

    def run_finished(self, run: Any, summary: Any) -> None: ...


def test_a_serverapp_stopped_by_flower_is_interrupted_and_resumes(
        interrupted: tuple[Path, str, list[tuple[Any, ...]]], config: RunConfig, dataset: Dataset,
        tmp_path: Path) -> None:
    """deploy local's Ctrl-C tears the federation down: the ServerApp gets SIGTERM, which Flower turns
    into SystemExit. The run is marked "interrupted" (not "SystemExit: 0") and resumes on fresh nodes."""
    _, _, want = interrupted
    with RunStore(tmp_path / "runs.sqlite") as store:
        _, [run_id] = store.create_batch(name="stopped", source="test", runs=[describe_run(config)])
        settings = ServerSettings(store_path=str(store.path), run_id=run_id, stage_timeout=0.5)
        with pytest.raises(SystemExit):
            serve(FakeGrid(4, state_root=tmp_path / "nodes"), settings, config=config, dataset=dataset,
                  observer=_StopAfterFirstRound())
        run = store.run(run_id)
        assert run.status == "failed" and run.rounds_done == 1
        assert run.error and run.error.startswith("interrupted") and "SystemExit" not in run.error
        _play(FakeGrid(4, state_root=tmp_path / "nodes"), store, run_id, config, dataset)
        assert store.run(run_id).status == "done"
        assert _history(store, run_id) == want


def test_a_node_that_cannot_restore_is_a_dropout_with_its_reason(
        interrupted: tuple[Path, str, list[tuple[Any, ...]]], config: RunConfig, tmp_path: Path) -> None:
    root, run_id, _ = interrupted
    import shutil

    nodes = tmp_path / "nodes"
    shutil.copytree(root / "nodes", nodes)
    store = NodeStore(nodes / "client-1", partition=1)
    newest = store.rounds(run_id)
    path = nodes / "client-1" / run_id / f"round-{[r for r in newest if r <= 0][-1] + 1:06d}.node"
    data = bytearray(path.read_bytes())
    data[40] ^= 1
    path.write_bytes(bytes(data))  # tampered
    shutil.rmtree(nodes / "client-2" / run_id)  # missing
    shutil.rmtree(nodes / "client-3" / run_id)  # foreign: client 0's state in client 3's place
    shutil.copytree(nodes / "client-0" / run_id, nodes / "client-3" / run_id)
    grid = FakeGrid(4, state_root=nodes)
    network = FlowerNetwork.connect(grid, config=json.dumps(config.to_dict()), parties=4, stage_timeout=1.0,
                                    clock=grid.clock, sleep=grid.clock.sleep, run_id=run_id, resume=0)
    reasons = {d.party: d.reason for d in network.dropouts}
    assert sorted(reasons) == [1, 2, 3] and network.gone == {1, 2, 3}
    assert all(d.round == 1 and d.stage == "hello" for d in network.dropouts)
    assert "checksum" in reasons[1]
    assert "no stored state" in reasons[2]
    assert "client 0" in reasons[3]
    # a node without a state-path cannot resume either (it never starts afresh in a resumed run)
    bare = FakeGrid(4)
    network = FlowerNetwork.connect(bare, config=json.dumps(config.to_dict()), parties=4, stage_timeout=1.0,
                                    clock=bare.clock, sleep=bare.clock.sleep, run_id=run_id, resume=0)
    assert network.gone == {0, 1, 2, 3} and "keeps no state" in network.dropouts[0].reason


def test_a_resume_without_the_nodes_state_fails_with_their_reasons(
        interrupted: tuple[Path, str, list[tuple[Any, ...]]], config: RunConfig, dataset: Dataset,
        tmp_path: Path) -> None:
    """Resumed against another store's node directories (deploy local --store elsewhere): no node
    starts afresh; the round aborts (no client left) and the run's error says why, per client."""
    root, run_id, _ = interrupted
    import shutil

    shutil.copy(root / "runs.sqlite", tmp_path / "runs.sqlite")
    with RunStore(tmp_path / "runs.sqlite") as store:
        with pytest.raises(AbortedError):
            _play(FakeGrid(4, state_root=tmp_path / "elsewhere"), store, run_id, config, dataset)
        run = store.run(run_id)
        assert run.status == "failed" and run.rounds_done == 1 and run.error
        # the round's first run (the masked update: the total repeats round 0's) finds nobody
        assert run.error.startswith("clients that advertised keys: 0 < threshold 3; 4 of 4 clients could not join: ")
        assert all(f"client {c}: no stored state of run {run_id}" in run.error for c in range(4))


def test_the_node_store_is_atomic_bounded_and_strict(tmp_path: Path) -> None:
    store = NodeStore(tmp_path / "node", partition=2)
    digest = run_digest({"x": 1})
    for r in (-1, 0, 1, 3):
        store.save("run1", r, digest=digest, node=StoredNode(r, f"state {r}".encode(), b"k" * 32))
    assert store.rounds("run1") == [1, 3]
    assert [p.name for p in (tmp_path / "node" / "run1").iterdir() if p.name.startswith(".")] == []
    assert store.load("run1", 2, digest=digest) == StoredNode(1, b"state 1", b"k" * 32)
    assert store.load("run1", 7, digest=digest).round == 3
    with pytest.raises(MissingState):
        store.load("run1", 0, digest=digest)
    with pytest.raises(MissingState):
        store.load("run2", 3, digest=digest)
    with pytest.raises(ForeignState, match="another config"):
        store.load("run1", 3, digest=run_digest({"x": 2}))
    with pytest.raises(ForeignState, match="client 2"):
        NodeStore(tmp_path / "node", partition=1).load("run1", 3, digest=digest)
    with pytest.raises(ForeignState):
        store.save("../escape", 0, digest=digest, node=StoredNode(0, b""))
    path = tmp_path / "node" / "run1" / "round-000004.node"
    path.write_bytes(path.read_bytes()[:-1])
    with pytest.raises(TamperedState):
        store.load("run1", 3, digest=digest)
    assert stat.S_IMODE((tmp_path / "node").stat().st_mode) == 0o700
    assert os.listdir(tmp_path / "node") == ["run1"]
