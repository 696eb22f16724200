"""``[secure] authenticate = true`` in a federated run (issue 22 item 5, in the runtime).

Each node makes its own Ed25519 key; the embedded engine plays the registration step (one
registry of public keys handed to every party before the run); then every protocol envelope is
signed by its sender and checked by its receiver, and CKKS/BFV sums are verified aggregates.
An honest run computes exactly what the unauthenticated one does; a tampered client message
makes that client a dropout named with the reason, and the run goes on over the rest.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from protocols import SERVER, Message
from protocols.wire import Envelope
from secure_fl.config import ConfigError, RunConfig, parse_config
from secure_fl.runtime import build_simulation


def _config(*, authenticate: bool) -> RunConfig:
    return RunConfig.from_dict({
        "name": "authenticated", "seed": 3,
        "data": {"dataset": "digits", "num_clients": 6, "partition": "dirichlet",
                 "partition_params": {"alpha": 0.5}, "train_samples": 900},
        "model": {"name": "mlp", "hidden": [16]},
        "train": {"rounds": 2, "clients_per_round": 5, "local_epochs": 1, "batch_size": 32, "lr": 0.05},
        "method": {"name": "fedshift"},
        "secure": {"protocol": "ckks", "update_protocol": "masking", "update_clip": 4.0, "update_frac_bits": 16,
                   "authenticate": authenticate},
    })


def _run(config: RunConfig, interceptor: Any = None) -> tuple[Any, list[Any]]:
    sim = build_simulation(config, device=torch.device("cpu"))
    if interceptor is not None:
        sim.network.interceptor = interceptor
    sim.setup()
    results = [sim.run_round() for _ in range(config.train.rounds)]
    return sim, results


@pytest.mark.slow
def test_an_authenticated_run_signs_everything_and_computes_the_same() -> None:
    unsigned: list[str] = []

    def watch(data: bytes, message: Message) -> bytes:
        env = message.envelope
        if env is not None and not Envelope.from_bytes(data).signature:
            unsigned.append(f"{env.protocol} stage {env.stage} from {env.sender}")
        return data

    plain_sim, _ = _run(_config(authenticate=False))
    signed_sim, results = _run(_config(authenticate=True), watch)
    assert unsigned == []  # every protocol envelope, set-up included, carried its sender's signature
    assert signed_sim.evaluate()["accuracy"] == plain_sim.evaluate()["accuracy"]
    assert torch.equal(signed_sim.global_vector, plain_sim.global_vector)
    assert all(not r.refusals for result in results for r in result.releases)
    assert {e.protocol for e in signed_sim.transcript} >= {"ckks", "masking"}
    assert any(e.stage == "tag" for e in signed_sim.transcript)  # CKKS sums were verified aggregates


@pytest.mark.slow
def test_a_tampered_client_message_makes_that_client_a_dropout() -> None:
    def tamper(data: bytes, message: Message) -> bytes:
        env = message.envelope
        if env is not None and env.sender == 2 and env.receiver == SERVER and env.protocol == "masking" \
                and len(data) > 1000:  # client 2's masked model update, one bit flipped in transit
            flipped = bytearray(data)
            flipped[len(flipped) // 2] ^= 1
            return bytes(flipped)
        return data

    _, results = _run(_config(authenticate=True), tamper)
    update = next(r for r in results[0].releases if r.name == "model_update")
    assert 2 in results[0].selected and update.dropouts == (2,) and 2 not in update.contributors
    assert update.refusals == ("AuthenticationError: client-2's stage 3 message failed to verify",)
    later = next(r for r in results[1].releases if r.name == "model_update")
    assert later.refusals == () and len(later.contributors) == 5


BASE = """
[data]
dataset = "digits"
num_clients = 4
partition = "dirichlet"
partition_params = { alpha = 0.5 }
[train]
rounds = 1
clients_per_round = 2
"""


def test_an_active_server_setting_needs_registered_keys() -> None:
    with pytest.raises(ConfigError, match="masking.active_server: .* set secure.authenticate = true"):
        parse_config(BASE + '[secure]\nupdate_protocol = "masking"\n[secure.masking]\nactive_server = true\n')
    run = parse_config(BASE + '[secure]\nauthenticate = true\nupdate_protocol = "masking"\n'
                       '[secure.masking]\nactive_server = true\n').runs[0]
    assert run.secure.authenticate and run.to_dict()["secure"]["authenticate"] is True
    assert "authenticate" not in parse_config(BASE).runs[0].to_dict()["secure"]  # old runs keep their identity


@pytest.mark.slow
def test_masking_against_an_active_server_runs_in_a_federated_run() -> None:
    config = RunConfig.from_dict({
        **_config(authenticate=True).to_dict(), "method": {"name": "fedavg"},
        "secure": {"protocol": "masking", "update_protocol": "masking", "update_clip": 4.0, "update_frac_bits": 16,
                   "authenticate": True, "masking": {"active_server": True}},
    })
    sim, results = _run(config)
    assert all(len(r.contributors) == 5 and not r.refusals for result in results for r in result.releases)
    assert "consistency" in {e.stage for e in sim.transcript}  # Bonawitz et al.'s consistency round ran
