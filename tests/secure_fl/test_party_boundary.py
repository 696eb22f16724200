"""The party rule as a test: under a secure protocol the server receives no client's plaintext.

Every registered method runs a short federated job with its statistics and its model updates
through a secure protocol. The test records, at each client, the exact vector it hands to the
protocol, and at the network every byte the server received; then it asserts that

1. no message the server received is labelled readable as one client's own value;
2. no such message contains any client's input as the insecure baseline would carry it
   (encoded integers big-endian, raw float32) — a check that does not trust the labels;
3. every release the server half got is an aggregate of at least two clients.

The same recorder run with ``plain`` finds the clients' inputs (the check can fail).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch

from protocols import SERVER, Message, Visibility
from secure_fl.algorithms import ALGORITHMS
from secure_fl.config import RunConfig
from secure_fl.runtime import build_simulation
from secure_fl.stats import Release

WEAK = {"key_bits": 1024, "allow_weak_keys": True}
LOSS = {"ratio_loss": "ratio"}


def _config(method: str, protocol: str) -> RunConfig:
    options: dict[str, Any] = {"paillier": WEAK} if protocol == "paillier" else {}
    return RunConfig.from_dict({
        "name": f"boundary-{method}-{protocol}", "seed": 3,
        "data": {"dataset": "digits", "num_clients": 6, "partition": "dirichlet",
                 "partition_params": {"alpha": 0.5}, "train_samples": 900},
        "model": {"name": "mlp", "hidden": [16]},
        "train": {"rounds": 2, "clients_per_round": 4, "local_epochs": 1, "batch_size": 32, "lr": 0.05},
        "method": {"name": method, **({"primal_steps": 1} if method == "climb" else {})},
        "loss": {"name": LOSS.get(method, "ce")},
        "secure": {"protocol": protocol, "update_protocol": protocol, "update_clip": 4.0,
                   "update_frac_bits": 16, **options},
    })


class Recorder:
    """What each client put into a protocol, what the server received, what the server half got."""

    def __init__(self, sim: Any) -> None:
        self.inputs: list[tuple[int, str, np.ndarray]] = []
        self.received: list[Message] = []
        self.releases: list[Release] = []
        for cid, node in sim.nodes.items():
            endpoint = node.participant.endpoint
            endpoint.contribute = self._contribute(cid, endpoint.contribute)
        sim.network.interceptor = self._intercept
        request = sim.server.stats.request

        def recorded(*args: Any, **kwargs: Any) -> Release:
            release: Release = request(*args, **kwargs)
            self.releases.append(release)
            return release

        sim.server.stats.request = recorded

    def _contribute(self, cid: int, contribute: Callable[..., Any]) -> Callable[..., Any]:
        def record(protocol: str, request: Any) -> Any:
            values = contribute(protocol, request)
            if values is not None:
                self.inputs.append((cid, request.statistic, np.asarray(values).copy()))
            return values
        return record

    def _intercept(self, data: bytes, message: Message) -> bytes:
        envelope = message.envelope
        to_server = envelope.receiver == SERVER if envelope is not None else message.label.stage == "refuse"
        if to_server:
            self.received.append(Message(data, message.label))
        return data

    def plaintext_found(self) -> list[str]:
        """Inputs whose plain encoding appears in what the server received."""
        found = []
        for cid, statistic, values in self.inputs:
            patterns = [values.astype(">u8").tobytes()] if values.dtype == np.uint64 else \
                [values.astype("<f4").tobytes()]
            if not np.any(values) or len(patterns[0]) < 8:
                continue
            if any(p in m.data for p in patterns for m in self.received):
                found.append(f"client {cid}'s {statistic}")
        return found


def _run(method: str, protocol: str) -> Recorder:
    sim = build_simulation(_config(method, protocol), device=torch.device("cpu"))
    recorder = Recorder(sim)
    sim.setup()
    for _ in range(2):
        sim.run_round()
    return recorder


@pytest.mark.parametrize("method", sorted(ALGORITHMS))
def test_server_receives_no_single_client_plaintext_under_masking(method: str) -> None:
    recorder = _run(method, "masking")
    assert recorder.inputs and recorder.received and recorder.releases
    readable = [m.label for m in recorder.received if m.label.exposure.visibility == Visibility.CLEAR
                or (m.label.exposure.visibility == Visibility.AGGREGATE and m.label.exposure.k < 2)]
    assert not readable
    assert not recorder.plaintext_found()
    assert all(len(r.contributors) >= 2 for r in recorder.releases if r.value is not None)


@pytest.mark.parametrize("method", ["fedshift", "climb"])
def test_server_receives_no_single_client_plaintext_under_paillier(method: str) -> None:
    recorder = _run(method, "paillier")
    assert not recorder.plaintext_found()
    assert all(len(r.contributors) >= 2 for r in recorder.releases if r.value is not None)
    assert not [m for m in recorder.received if m.label.exposure.visibility == Visibility.CLEAR]


def test_the_recorder_finds_plaintext_under_the_insecure_baseline() -> None:
    recorder = _run("fedshift", "plain")
    found = recorder.plaintext_found()
    assert any("label_histogram" in f for f in found) and any("model_update" in f for f in found)
    assert any(m.label.exposure.visibility == Visibility.CLEAR for m in recorder.received)
