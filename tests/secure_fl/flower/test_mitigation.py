"""``[mitigation]`` guard and cohorts on the Flower engines: the server's policy selection and the
clients' release checks run as on the embedded engine — the same transcript and the same model."""

from __future__ import annotations

import pytest

from secure_fl.config import parse_config

from .fakegrid import FakeGrid
from .test_network import CONFIG, embedded, flower

SIX = CONFIG.replace("num_clients = 4", "num_clients = 6").replace("clients_per_round = 4", "clients_per_round = 3")


DP = 'name = "dp"\ncounts = "record"\nsecure_mode = false'


@pytest.mark.parametrize("mitigation", ['name = "guard"\nk = 3', 'name = "cohorts"\nsize = 3', DP])
def test_a_mitigated_flower_run_is_the_embedded_run(mitigation: str) -> None:
    secure = SIX.replace('protocol = "plain"', 'protocol = "masking"') if mitigation == DP else SIX
    config = parse_config(secure + "[mitigation]\n" + mitigation + "\n",
                          assignments=[("runtime.engine", "flower-simulation")]).runs[0]
    assert config.mitigation.enabled and config.runtime.engine == "flower-simulation"
    want_accuracy, want = embedded(config)
    accuracy, got, server = flower(config, FakeGrid(6))
    assert accuracy == want_accuracy and got == want and server.network.dropouts == []
    if mitigation == DP:  # one ε per client over both noised statistics, at the sum of their δ
        run = server.privacy_report()["run"]
        assert 0.0 < run.epsilon < float("inf") and run.delta == pytest.approx(2e-5)
