"""``[mitigation]`` guard and cohorts on the Flower engines: the server's policy selection and the
clients' release checks run as on the embedded engine — the same transcript and the same model."""

from __future__ import annotations

import pytest

from secure_fl.config import parse_config

from .fakegrid import FakeGrid
from .test_network import CONFIG, embedded, flower

SIX = CONFIG.replace("num_clients = 4", "num_clients = 6").replace("clients_per_round = 4", "clients_per_round = 3")


@pytest.mark.parametrize("mitigation", ['name = "guard"\nk = 3', 'name = "cohorts"\nsize = 3'])
def test_a_mitigated_flower_run_is_the_embedded_run(mitigation: str) -> None:
    config = parse_config(SIX + "[mitigation]\n" + mitigation + "\n",
                          assignments=[("runtime.engine", "flower-simulation")]).runs[0]
    assert config.mitigation.enabled and config.runtime.engine == "flower-simulation"
    want_accuracy, want = embedded(config)
    accuracy, got, server = flower(config, FakeGrid(6))
    assert accuracy == want_accuracy and got == want and server.network.dropouts == []
