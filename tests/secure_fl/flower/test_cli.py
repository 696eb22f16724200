"""`secure-fl run --engine`: the embedded engine's JSON names its engine; `flower` points to deploy;
a distributed engine's dropouts read back from the store."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from secure_fl.cli import main
from secure_fl.cli.run import engine_fields

CONFIG = """
name = "engine-cli"
seed = 0
[data]
dataset = "digits"
num_clients = 3
train_samples = 300
partition = "dirichlet"
partition_params = { alpha = 1.0 }
[model]
name = "mlp"
hidden = [8]
[train]
rounds = 1
clients_per_round = 3
"""


def test_embedded_json_names_its_engine(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "c.toml").write_text(CONFIG)
    assert main(["run", str(tmp_path / "c.toml"), "--engine", "embedded", "--json", "--workspace",
                 str(tmp_path / "ws")]) == 0
    [run] = json.loads(capsys.readouterr().out)["runs"]
    assert run["engine"] == "embedded" and run["dropouts"] == {"count": 0, "parties": [], "by_round": {}}


def test_flower_engine_points_to_deploy(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "c.toml").write_text(CONFIG)
    assert main(["run", str(tmp_path / "c.toml"), "--engine", "flower", "--workspace", str(tmp_path / "ws")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "secure-fl deploy local" in err[0]


def test_dropouts_come_from_the_network_metrics() -> None:
    store = SimpleNamespace(run=lambda _: SimpleNamespace(config={"runtime": {"engine": "flower-simulation"}}))
    history = [SimpleNamespace(round=0, metrics={"net.dropouts": 0.0}),
               SimpleNamespace(round=1, metrics={"net.dropouts": 2.0, "net.dropout.3": 1.0, "net.dropout.12": 1.0}),
               SimpleNamespace(round=2, metrics={"net.dropout.3": 1.0})]
    fields = engine_fields(store, SimpleNamespace(id="r", history=history))
    assert fields == {"engine": "flower-simulation",
                      "dropouts": {"count": 2, "parties": [3, 12], "by_round": {"1": [3, 12], "2": [3]}}}


def test_server_app_run_config_is_checked() -> None:
    from secure_fl.config import ConfigError
    from secure_fl.flower.apps import ServerSettings

    settings = ServerSettings.from_run_config({
        "config-path": "/x/c.toml", "run-index": 2, "store-path": "/x/s.sqlite", "run-id": "abc",
        "stage-timeout": 5, "overrides": '[["train.rounds", 3], ["secure.protocol", "paillier"]]',
        "events-path": "/x/e.jsonl"})
    assert settings == ServerSettings(store_path="/x/s.sqlite", config_path="/x/c.toml", run_index=2, run_id="abc",
                                      stage_timeout=5.0, overrides=(("train.rounds", "3"),
                                                                    ("secure.protocol", "paillier")),
                                      events_path="/x/e.jsonl")
    assert ServerSettings.from_run_config({"store-path": "s"}).run_index == 0
    for bad in ({"run-index": "0"}, {"run-index": True}, {"stage-timeout": "9"}, {"overrides": "[1]"},
                {"overrides": "{}"}, {"overrides": "not json"}):
        with pytest.raises(ConfigError, match="ServerApp run config"):
            ServerSettings.from_run_config({"store-path": "s", **bad})
