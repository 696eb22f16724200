"""Configs: TOML validated on load, errors that name the key, sweeps and [[runs]] expanded in order."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from secure_fl.config import ConfigError, RunConfig, load_config, parse_config

ROOT = Path(__file__).resolve().parents[2]

BASE = """
name = "t"
seed = 2
[data]
dataset = "digits"
num_clients = 8
partition = "dirichlet"
partition_params = { alpha = 0.5 }
[model]
name = "mlp"
hidden = [16]
[train]
rounds = 3
clients_per_round = 4
"""


def error(text: str) -> str:
    with pytest.raises(ConfigError) as info:
        parse_config(text, source="cfg.toml")
    return str(info.value)


def test_a_minimal_config_takes_the_papers_defaults() -> None:
    (run,) = parse_config(BASE).runs
    assert run.name == "t" and run.seed == 2 and run.tail_rounds == 5 and run.label == ""
    assert run.method.name == "fedavg" and run.loss.name == "ce" and run.selection.name == "random"
    assert run.secure.protocol == "plain" and run.secure.update_protocol == "clear"
    t = run.train
    assert (t.local_epochs, t.batch_size, t.lr, t.momentum, t.weight_decay, t.lr_decay, t.lr_decay_every) == \
        (1, 32, 0.01, 0.9, 1e-4, 0.95, 10)
    assert run.model.options == {"hidden": [16]} and run.data.partition_params == {"alpha": 0.5}


def test_to_dict_round_trips() -> None:
    text = BASE + '[method]\nname = "fedprox"\nmu = 0.1\n[secure]\nprotocol = "paillier"\n' \
                  '[secure.paillier]\nkey_bits = 2048\n[secure.statistics]\ntotal_samples = "plain"\n'
    (run,) = parse_config(text).runs
    again = RunConfig.from_dict(run.to_dict())
    assert again.to_dict() == run.to_dict() and again.secure.options == {"paillier": {"key_bits": 2048}}
    assert again.secure.statistics == {"total_samples": "plain"} and again.method.params == {"mu": 0.1}


@pytest.mark.parametrize(("snippet", "expected"), [
    ("colour = 1\n", "unknown key 'colour'"),
    ("[train]\nlearning_rate = 0.1\n", "unknown key 'train.learning_rate'"),
    ("[secure]\nprotocol = \"rot13\"\n", "secure.protocol: unknown protocol 'rot13'"),
    ("[secure]\nupdate_protocol = \"magic\"\n", "secure.update_protocol: unknown protocol 'magic'"),
    ("[secure.paillier]\nbits = 2048\n", "secure.paillier.bits: unknown option"),
    ("[secure.paillier]\nkey_bits = 1024\n", "allow_weak_keys"),
    ("[secure.statistics]\ntotal_samples = \"rot13\"\n", "secure.statistics.total_samples"),
    ("[method]\nname = \"fedprox\"\nmuu = 1\n", "method: unknown parameter(s) muu for method 'fedprox'"),
    ("[method]\nname = \"fedsgd\"\n", "method: unknown method 'fedsgd'"),
    ("[loss]\nname = \"hinge\"\n", "loss: unknown loss 'hinge'"),
    ("[selection]\nname = \"best\"\n", "selection: unknown selection 'best'"),
    ("[sweep]\nfoo = [1]\n", "unknown key 'sweep.foo'"),
    ("[sweep]\nseed = 3\n", "'sweep.seed' must be a non-empty list"),
    ("tail_rounds = 0\n", "tail_rounds must be a positive integer"),
])
def test_errors_name_the_bad_key_or_value(snippet: str, expected: str) -> None:
    if snippet.startswith("[train]"):
        message = error(BASE.replace("[train]\n", snippet))
    elif snippet.startswith("["):
        message = error(BASE + snippet)
    else:  # a top-level key goes before the first table
        message = error(snippet + BASE)
    assert message.startswith("cfg.toml") and expected in message


@pytest.mark.parametrize(("old", "new", "expected"), [
    ("rounds = 3", "rounds = 0", "train.rounds: must be >= 1, got 0"),
    ("rounds = 3", "rounds = 3.5", "train.rounds must be an integer, got 3.5"),
    ("rounds = 3", "rounds = \"3\"", "train.rounds must be an integer"),
    ("clients_per_round = 4", "clients_per_round = 9", "clients_per_round = 9 exceeds data.num_clients = 8"),
    ("dataset = \"digits\"", "dataset = \"imagenet\"", "data.dataset: unknown dataset 'imagenet'"),
    ("partition = \"dirichlet\"", "partition = \"shards\"", "data.partition: unknown partition 'shards'"),
    ("alpha = 0.5", "beta = 0.5", "data.partition_params.beta: unknown parameter"),
    ("partition_params = { alpha = 0.5 }", "partition_params = {}", "partition 'dirichlet' needs 'alpha'"),
    ("name = \"mlp\"", "name = \"vgg\"", "model.name: unknown model 'vgg'"),
    ("hidden = [16]", "depth = 3", "model.depth: unknown option of model 'mlp'"),
    ("hidden = [16]", "hidden = [16]\n[data.x]\ny = 1", "unknown key 'data.x'"),
])
def test_bad_values_are_named(old: str, new: str, expected: str) -> None:
    assert old in BASE
    assert expected in error(BASE.replace(old, new, 1))


def test_missing_tables_and_bad_toml() -> None:
    assert "missing table [train]" in error(BASE.split("[train]")[0])
    assert "not valid TOML" in error("[data\n")
    assert "missing key 'data.num_clients'" in error(BASE.replace("num_clients = 8\n", ""))
    with pytest.raises(ConfigError, match="cannot read config"):
        load_config("/nonexistent/cfg.toml")


def test_sweep_is_a_cartesian_product_in_file_order() -> None:
    text = BASE + """
[sweep]
method = ["fedavg", { name = "fedprox", mu = 0.01 }]
seed = [0, 1, 2]
secure.protocol = ["plain", "paillier"]
"""
    runs = parse_config(text).runs
    assert len(runs) == 12
    assert [r.method.name for r in runs[:6]] == ["fedavg"] * 6
    assert [(r.seed, r.secure.protocol) for r in runs[:3]] == [(0, "plain"), (0, "paillier"), (1, "plain")]
    assert runs[6].method.params == {"mu": 0.01}
    assert runs[7].label == "method=fedprox seed=0 secure.protocol=paillier"


def test_runs_tables_override_the_base_and_combine_with_sweeps() -> None:
    text = BASE + """
[method]
name = "fedprox"
mu = 0.1
[[runs]]
method = { mu = 0.5 }
[[runs]]
method = "scaffold"
train = { rounds = 5 }
[sweep]
seed = [0, 1]
"""
    runs = parse_config(text).runs
    assert len(runs) == 4
    assert runs[0].method.params == {"mu": 0.5} and runs[0].method.name == "fedprox"
    assert runs[2].method.name == "scaffold" and runs[2].method.params == {} and runs[2].train.rounds == 5
    assert runs[2].train.clients_per_round == 4 and runs[3].seed == 1
    assert runs[3].label == "method=scaffold train.rounds=5 seed=1"  # what the [[runs]] entry sets
    assert "unknown key 'runs[0].sweep'" in error(BASE + "[[runs]]\nsweep = {}\n")


def test_minority_and_data_options() -> None:
    text = BASE.replace("partition_params", "minority_classes = [0, 3]\nminority_rho = 10\ntrain_samples = 500\n"
                        "partition_params")
    (run,) = parse_config(text).runs
    assert run.data.minority_classes == (0, 3) and run.data.minority_rho == 10.0 and run.data.train_samples == 500
    assert "minority_rho: needs minority_classes" in error(BASE.replace("partition_params", "minority_rho = 2\n"
                                                                        "partition_params"))
    assert run.data_seed == 2
    seeded = parse_config(BASE.replace("num_clients = 8", "num_clients = 8\nseed = 9")).runs[0]
    assert seeded.data_seed == 9


def test_demo_config_is_small() -> None:
    """The demo: FedAvg, FedShift (prior through Paillier), CLIMB (averages through masking), Ratio Loss
    (totals through CKKS) and Dubhe selection, model updates through masking, in seconds per run."""
    from secure_fl.config import planned_protocols

    experiment = load_config(ROOT / "experiments" / "demo.toml")
    assert experiment.name == "demo" and len(experiment.runs) == 5
    for run in experiment.runs:
        assert run.data.dataset == "fashion-mnist" and run.secure.update_protocol == "masking"
        assert run.secure.options["paillier"]["key_bits"] == 2048
        work = run.train.rounds * (run.data.train_samples or 60000) * run.train.local_epochs
        assert work <= 200_000  # samples trained per run: seconds on 2 cores with the MLP
    plans = {(r.method.name, r.selection.name): planned_protocols(r) for r in experiment.runs}
    assert plans[("fedshift", "random")]["label_histogram"] == "paillier"
    assert plans[("climb", "random")]["climb_dual"] == plans[("climb", "random")]["climb_lambda"] == "masking"
    assert plans[("ratio_loss", "random")]["ratio_monitor_total"] == "ckks"
    assert plans[("fedavg", "dubhe")]["dubhe_registry"] == "paillier"
    assert ("fedavg", "random") in plans


TRAINING_CONFIGS = sorted(p for p in (ROOT / "experiments").rglob("*.toml")
                          if "[population]" not in p.read_text())  # Dubhe's selection studies have their own schema


@pytest.mark.parametrize("path", TRAINING_CONFIGS, ids=lambda p: str(p.relative_to(ROOT / "experiments")))
def test_every_experiment_config_validates(path: Path) -> None:
    """A table's config must not rot while nobody has the hours (or the GPU) to run it."""
    experiment = load_config(path)
    assert experiment.runs
    for run in experiment.runs:
        assert run.train.rounds >= 1 and run.data.num_clients >= 1


def test_bfv_is_a_protocol_configs_can_pick_per_statistic() -> None:
    """Protocol names come from the descriptors: ``bfv`` needs no entry of its own in the config code."""
    text = BASE + ('[secure]\nprotocol = "plain"\nupdate_protocol = "ckks"\n[secure.statistics]\ntotal_samples = "bfv"\n'
                   '[secure.bfv]\nkeyholder = "all"\n[secure.ckks]\npoly_modulus_degree = 8192\n')
    (run,) = parse_config(text).runs
    assert run.secure.statistics == {"total_samples": "bfv"} and run.secure.update_protocol == "ckks"
    assert run.secure.options == {"bfv": {"keyholder": "all"}, "ckks": {"poly_modulus_degree": 8192}}
    assert "secure.bfv" in error(BASE + '[secure.bfv]\nplain_modulus = 65537\n')  # a half-fixed parameter set
    assert "secure.bfv.ring" in error(BASE + '[secure.bfv]\nring = 4096\n')


# --- [runtime] ------------------------------------------------------------------------------

_RUNTIME_BASE = """
[data]
dataset = "digits"
num_clients = 4
partition = "dirichlet"
partition_params = { alpha = 0.5 }
[train]
rounds = 1
clients_per_round = 2
"""


def test_runtime_defaults_stay_out_of_the_run_identity() -> None:
    from secure_fl.config import RuntimeConfig, parse_config

    run = parse_config(_RUNTIME_BASE).runs[0]
    assert run.runtime == RuntimeConfig()
    assert "runtime" not in run.to_dict()
    looped = parse_config(_RUNTIME_BASE + '[runtime]\nclients = "loop"\nstage_timeout = 5\n').runs[0]
    assert looped.to_dict() == run.to_dict()  # the client path and timeout never change what is computed


def test_runtime_engine_enters_the_identity_and_round_trips() -> None:
    from secure_fl.config import RunConfig, parse_config

    run = parse_config(_RUNTIME_BASE + '[runtime]\nengine = "flower-simulation"\n').runs[0]
    assert run.to_dict()["runtime"] == {"engine": "flower-simulation"}
    assert RunConfig.from_dict(run.to_dict()).runtime.engine == "flower-simulation"


@pytest.mark.parametrize(("line", "message"), [
    ('engine = "flowr"', "runtime.engine: unknown engine 'flowr' (did you mean 'flower'?)"),
    ('clients = "vec"', "runtime.clients: unknown client path 'vec'"),
    ("stage_timeout = 0", "runtime.stage_timeout: must be positive seconds"),
    ("workers = 2", "unknown key 'runtime.workers'"),
])
def test_runtime_bad_values_are_config_errors(line: str, message: str) -> None:
    from secure_fl.config import ConfigError, parse_config

    with pytest.raises(ConfigError, match=re.escape(message)):
        parse_config(_RUNTIME_BASE + "[runtime]\n" + line + "\n")
