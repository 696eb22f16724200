"""A client node rebuilt for every message: it continues from the state it kept, live round included,
and refuses state that is not its own."""

from __future__ import annotations

import pytest
import torch

from protocols import WireError
from secure_fl.config import ConfigError, RunConfig, parse_config
from secure_fl.flower.client import NodeHost, NodeState, handle, restore
from secure_fl.runtime.build import build_simulation

CONFIG = """
name = "flower-client"
seed = 1
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
rounds = 2
clients_per_round = 3
[method]
name = "fedshift"
[secure]
protocol = "plain"
update_protocol = "masking"
[secure.statistics]
label_histogram = "paillier"
[secure.paillier]
key_bits = 1024
allow_weak_keys = true
"""


@pytest.fixture(scope="module")
def config() -> RunConfig:
    return parse_config(CONFIG).runs[0]


@pytest.mark.parametrize("prior", ["paillier", "ckks"])
def test_nodes_rebuilt_per_message_run_like_live_nodes(prior: str) -> None:
    """FedShift with its prior through Paillier (or CKKS) and updates through masking: every message
    to a fresh node restored from its state gives the embedded run's models."""
    config = parse_config(CONFIG.replace('label_histogram = "paillier"', f'label_histogram = "{prior}"')).runs[0]
    def run(hosted: bool) -> list[torch.Tensor]:
        sim = build_simulation(config, device=torch.device("cpu"))
        if hosted:
            states = {c: NodeState() for c in sim.nodes}

            def handler(c: int):  # type: ignore[no-untyped-def]
                def answer(inbox):  # type: ignore[no-untyped-def]
                    replies, states[c] = handle(NodeHost.node(config, c), states[c], inbox)
                    return replies
                return answer
            for c in sim.nodes:
                sim.network.attach(c, handler(c))
            sim.network.before_handlers = None  # the embedded client pool's hook feeds sim.nodes, not ours
        sim.setup()
        out = []
        for _ in range(config.train.rounds):
            sim.run_round()
            out.append(sim.global_vector.clone())
        return out

    for live, hosted in zip(run(False), run(True), strict=True):
        assert torch.equal(live, hosted)


def test_state_that_is_not_the_nodes_is_refused(config: RunConfig) -> None:
    node = NodeHost.node(config, 0)
    with pytest.raises(WireError, match="unreadable live state"):
        restore(node, NodeState(live=b"\x80\x05garbage"))
    with pytest.raises(WireError):
        restore(node, NodeState(snapshot=b"not a snapshot"))
    with pytest.raises(ConfigError, match="partition-id 3"):
        NodeHost.node(config, 3)
