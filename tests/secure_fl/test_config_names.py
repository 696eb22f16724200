"""Configs never lie: unknown keys anywhere are errors suggesting the closest valid key, and the
statistics named in ``[secure.statistics]`` / ``[privacy.statistics]`` must be ones the run sums."""

from __future__ import annotations

import re

import pytest

from secure_fl.config import ConfigError, declared_statistics, parse_config, planned_protocols
from secure_fl.suggest import closest, did_you_mean

BASE = """
[data]
dataset = "digits"
num_clients = 4
partition_params = { alpha = 0.5 }
[train]
rounds = 2
clients_per_round = 2
"""

DUBHE = '[selection]\nname = "dubhe"\nkey_bits = 512\nallow_weak_keys = true\n'


def load(extra: str = "", *, base: str = BASE) -> object:
    return parse_config(base + extra, source="cfg.toml")


def test_closest_and_did_you_mean() -> None:
    assert closest("rouds", ["rounds", "seed"]) == "rounds"
    assert closest("Paillier", ["paillier", "plain"]) == "paillier"
    assert closest("zzz", ["rounds"]) is None
    assert did_you_mean("rouds", ["rounds"]) == " (did you mean 'rounds'?)"
    assert did_you_mean("rounds", ["rounds"]) == ""


@pytest.mark.parametrize("extra, message", [
    ("[secure]\nprotocl = 'paillier'\n", "unknown key 'secure.protocl' (did you mean 'protocol'?)"),
    ("[secure.paillierr]\nkey_bits = 2048\n", "unknown key 'secure.paillierr' (did you mean 'paillier'?)"),
    ("[secure.paillier]\nkey_bit = 2048\n",
     "secure.paillier.key_bit: unknown option of protocol 'paillier' (did you mean 'key_bits'?)"),
    ("[secure.masking]\ntreshold = 2\n", "secure.masking.treshold: unknown option of protocol 'masking'"),
    ("[secure]\nprotocol = 'pailier'\n", "secure.protocol: unknown protocol 'pailier' (did you mean 'paillier'?)"),
    ("[secure]\nupdate_protocol = 'maskin'\n", "unknown protocol 'maskin' (did you mean 'masking'?)"),
    ("[secure.statistics]\ntotal_samples = 'paillierr'\n",
     "secure.statistics.total_samples: unknown protocol 'paillierr' (did you mean 'paillier'?)"),
    ("[method]\nname = 'fedshfit'\n", "unknown method 'fedshfit' (did you mean 'fedshift'?)"),
    ("[method]\nname = 'fedprox'\nmuu = 0.1\n", "unknown parameter(s) muu for method 'fedprox' (did you mean 'mu'?)"),
    ("[loss]\nname = 'focall'\n", "unknown loss 'focall' (did you mean 'focal'?)"),
    ("[selection]\nname = 'dubhee'\n", "unknown selection 'dubhee' (did you mean 'dubhe'?)"),
    ("[model]\nname = 'lenet'\n", "unknown model 'lenet' (did you mean 'lenet5'?)"),
    ("[model]\nhiden = [8]\n", "unknown option of model 'mlp' (did you mean 'hidden'?)"),
    ("[privacy]\ndp_sdg = {}\n", "unknown key 'privacy.dp_sdg' (did you mean 'dp_sgd'?)"),
    ("[privacy.dp_sgd]\nnoise_multiplier = 1.0\nmax_grad_nrom = 1.0\n",
     "unknown key 'privacy.dp_sgd.max_grad_nrom' (did you mean 'max_grad_norm'?)"),
    ("[privacy.statistics]\ntotal_samples = { epsilon = 1.0, epsilonn = 2 }\n",
     "unknown key 'privacy.statistics.total_samples.epsilonn' (did you mean 'epsilon'?)"),
    ("[sweep]\nmehtod = ['fedavg']\n", "unknown key 'sweep.mehtod' (did you mean 'method'?)"),
    ("[[runs]]\nseeed = 1\n", "unknown key 'runs[0].seeed' (did you mean 'seed'?)"),
])
def test_unknown_keys_and_names_suggest_the_closest(extra: str, message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        load(extra)


def test_unknown_keys_in_the_base_tables_suggest_the_closest() -> None:
    with pytest.raises(ConfigError, match=re.escape("unknown key 'seeed' (did you mean 'seed'?)")):
        load(base="seeed = 1\n" + BASE)
    with pytest.raises(ConfigError, match=re.escape("unknown key 'train.rouds' (did you mean 'rounds'?)")):
        load(base=BASE.replace("rounds = 2", "rounds = 2\nrouds = 3"))
    with pytest.raises(ConfigError, match=re.escape("unknown key 'data.num_client' (did you mean 'num_clients'?)")):
        load(base=BASE.replace("num_clients = 4", "num_clients = 4\nnum_client = 3"))
    with pytest.raises(ConfigError, match=re.escape("(did you mean 'alpha'?)")):
        load(base=BASE.replace("alpha = 0.5", "alpha = 0.5, alfa = 1"))
    with pytest.raises(ConfigError, match=re.escape("unknown dataset 'fashion_mnst' (did you mean 'fashion-mnist'?)")):
        load(base=BASE.replace('"digits"', '"fashion_mnst"'))


def test_the_declared_statistics_come_from_the_client_halves() -> None:
    fedavg = load().runs[0]  # type: ignore[attr-defined]
    assert declared_statistics(fedavg) == {"total_samples": "method", "model_update": "update"}
    scaffold = load("[method]\nname = 'scaffold'\n").runs[0]  # type: ignore[attr-defined]
    assert declared_statistics(scaffold)["control_update"] == "update"
    fedshift = load("[method]\nname = 'fedshift'\n").runs[0]  # type: ignore[attr-defined]
    assert declared_statistics(fedshift)["label_histogram"] == "method"
    climb = load("[method]\nname = 'climb'\n").runs[0]  # type: ignore[attr-defined]
    assert {"loss_sum", "lambda_sum"} <= set(declared_statistics(climb)) or len(declared_statistics(climb)) > 2
    dubhe = load(DUBHE).runs[0]  # type: ignore[attr-defined]
    names = declared_statistics(dubhe)
    assert names["dubhe_registry"] == "selection session" and names["dubhe_volunteers"] == "selection"
    greedy = load("[selection]\nname = 'greedy'\n").runs[0]  # type: ignore[attr-defined]
    assert "selection" in declared_statistics(greedy).values()


def test_planned_protocols_name_each_statistic() -> None:
    run = load("[method]\nname = 'fedshift'\n[secure.statistics]\nlabel_histogram = 'paillier'\n").runs[0]  # type: ignore[attr-defined]
    assert planned_protocols(run) == {"label_histogram": "paillier", "total_samples": "plain"}
    dubhe = load(DUBHE).runs[0]  # type: ignore[attr-defined]
    planned = planned_protocols(dubhe)
    assert planned["dubhe_registry"] == "paillier" and planned["dubhe_volunteers"] == "plain"


@pytest.mark.parametrize("extra, message", [
    ("[method]\nname = 'fedshift'\n[secure.statistics]\nlabel_histgram = 'paillier'\n",
     ("secure.statistics.label_histgram: no statistic 'label_histgram' in this run (did you mean 'label_histogram'?); "
     "method 'fedshift' sums: label_histogram, total_samples")),
    ("[secure.statistics]\nlabel_histogram = 'paillier'\n",
     "secure.statistics.label_histogram: no statistic 'label_histogram' in this run; method 'fedavg' sums: total_samples"),
    ("[secure.statistics]\nmodel_update = 'masking'\n",
     ("secure.statistics.model_update: 'model_update' is a model-sized update sum; set its protocol with "
     "secure.update_protocol (now 'clear') instead")),
    ("[method]\nname = 'scaffold'\n[secure.statistics]\ncontrol_update = 'masking'\n", "model-sized update sum"),
    (DUBHE + "[secure.statistics]\ndubhe_registry = 'plain'\n",
     "selection 'dubhe' sums 'dubhe_registry' on its own session (paillier 'dubhe')"),
    ("[privacy.statistics]\ntotal_sample = { epsilon = 1.0 }\n",
     "privacy.statistics.total_sample: no statistic 'total_sample' in this run (did you mean 'total_samples'?)"),
    ("[privacy.statistics]\nmodel_update = { epsilon = 1.0 }\n",
     ("privacy.statistics.model_update: 'model_update' is a model-sized update sum, which gets no distributed-DP "
     "noise; protect model updates with [privacy.dp_sgd] instead")),
])
def test_statistics_tables_name_only_what_the_run_sums(extra: str, message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        load(extra)


def test_statistics_tables_accept_what_the_run_sums() -> None:
    load("[method]\nname = 'fedshift'\n[secure]\nprotocol = 'masking'\n[secure.statistics]\n"
         "label_histogram = 'paillier'\n[privacy.statistics]\nlabel_histogram = { epsilon = 1.0 }\n"
         "default = { epsilon = 2.0 }\n")
    load(DUBHE + "[secure.statistics]\ndubhe_volunteers = 'plain'\n[privacy.statistics]\ndubhe_registry = "
         "{ epsilon = 1.0, level = 'client' }\n")
    # a sweep's table applies to the runs that sum the statistic (a typo is still caught: no run sums it)
    exp = load("[secure.statistics]\nlabel_histogram = 'paillier'\n[sweep]\nmethod = ['fedavg', 'fedshift']\n")
    assert len(exp.runs) == 2  # type: ignore[attr-defined]
    with pytest.raises(ConfigError, match="did you mean 'label_histogram'"):
        load("[secure.statistics]\nlabel_histo = 'paillier'\n[sweep]\nmethod = ['fedavg', 'fedshift']\n")


@pytest.mark.parametrize("tables", [
    "[privacy.statistics]\ntotal_samples = { epsilon = 1.0 }\n",  # the default protocol is plain
    ("[secure]\nprotocol = 'masking'\n[secure.statistics]\ntotal_samples = 'plain'\n"
     "[privacy.statistics]\ndefault = { epsilon = 1.0 }\n"),
    "[secure]\nprotocol = 'masking'\n[mitigation]\nname = 'dp'\n",  # updates in the clear
    "[secure]\nupdate_protocol = 'masking'\n[mitigation]\nname = 'dp'\n",  # statistics through plain
])
def test_distributed_dp_is_refused_where_the_server_sees_each_input(tables: str) -> None:
    """Each client adds only its share of the noise: what the server receives one by one would
    carry a fraction of what the reported ε assumes."""
    with pytest.raises(ConfigError, match="hands the server every client's input"):
        load(tables)
    if "mitigation" in tables:
        load("[secure]\nprotocol = 'masking'\nupdate_protocol = 'secagg+'\n[mitigation]\nname = 'dp'\n")
