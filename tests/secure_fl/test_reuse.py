"""A constant statistic (Σ|D_i|) over exactly the contributors of its last release is not summed
again: the server points those clients at that release (a ``reuse`` message) and both sides take
it as the round's value. The same model as summing every round, fewer bytes, nothing new released;
a wrong pointer is refused; a client lost after the pointer does not bias the weighted mean
(resumed runs: test_runtime.py's resume test, ``METHOD/all``)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from protocols import WireError
from secure_fl.config import parse_config
from secure_fl.runtime import Simulation, build_simulation
from secure_fl.runtime.messages import RUNTIME, Kind, RuntimeMessage
from secure_fl.snapshots import dump_state, load_state
from secure_fl.stats import TOTAL_SAMPLES

CPU = torch.device("cpu")
CLIENTS = (0, 1, 2, 3, 4)

CONFIG = """
seed = 5
[data]
dataset = "digits"
num_clients = 5
train_samples = 500
partition = "dirichlet"
partition_params = { alpha = 0.5 }
[model]
name = "mlp"
hidden = [8]
[train]
rounds = 3
clients_per_round = 5
batch_size = 32
lr = 0.1
momentum = 0.9
[secure]
protocol = "masking"
update_protocol = "plain"
update_frac_bits = 24
"""


def build(*, reuse: bool = True) -> Simulation:
    sim = build_simulation(parse_config(CONFIG).runs[0], device=CPU)
    if not reuse:
        sim.stats.reuse = None  # the coordinator then sums every request
    sim.setup()
    return sim


def totals(sim: Simulation) -> list[int | None]:
    return [r.reused_from for r in sim.stats.records if r.name == TOTAL_SAMPLES.name]


def test_a_full_cohort_sums_its_total_once_and_trains_the_same_model() -> None:
    sim, control = build(), build(reuse=False)
    for _ in range(3):
        sim.run_round()
        control.run_round()
    assert totals(sim) == [None, 0, 0] and totals(control) == [None, None, None]
    first, *repeats = [r for r in sim.stats.records if r.name == TOTAL_SAMPLES.name]
    assert all(np.array_equal(r.value, first.value) and r.contributors == CLIENTS for r in repeats)
    assert first.value is not None and first.scalar() == sum(sim.nodes[c].data.num_samples for c in CLIENTS)
    assert torch.equal(sim.global_vector, control.global_vector)
    for r in (1, 2):  # no masking run of the total: one pointer to round 0's release per client
        entries = sim.transcript.select(statistic=TOTAL_SAMPLES.name, round=r)
        assert {(e.protocol, e.stage) for e in entries} == {(RUNTIME, "reuse")}
        assert sorted(e.receiver for e in entries) == list(CLIENTS)
        assert sum(e.bytes for e in entries) == repeats[r - 1].bytes
    spent = sim.stats.bytes_by_statistic()[TOTAL_SAMPLES.name]
    assert spent < control.stats.bytes_by_statistic()[TOTAL_SAMPLES.name] / 2
    for node in sim.nodes.values():  # each client took round 0's total as round 2's
        learned = node.learned[2][TOTAL_SAMPLES.name]
        assert learned.value.tolist() == first.value.tolist() and learned.contributors == CLIENTS
    # the pool still trained each round's cohort in one call: the pointers waited for it
    assert sim.pool is not None and sim.pool.cohorts == 3


def test_only_the_last_release_is_repeated_and_only_for_its_contributors() -> None:
    sim = build()
    sim.run_round()
    request = sim.stats.request
    mailbox = sim.server.mailbox
    assert request(TOTAL_SAMPLES, cohort=(0, 1, 2), round=1).reused_from is None  # other contributors: a sum
    repeat = request(TOTAL_SAMPLES, cohort=(2, 0, 1), round=2)
    mailbox.flush()
    assert repeat.reused_from == 1 and repeat.contributors == (0, 1, 2) and not mailbox.refusals
    assert [sim.nodes[c].learned[2][TOTAL_SAMPLES.name].value[0] for c in (0, 1, 2)] == [repeat.scalar()] * 3
    assert request(TOTAL_SAMPLES, cohort=CLIENTS, round=3).reused_from is None  # round 0's set is not the last


def _pointer(sim: Simulation, *, name: str = "total_samples", round: int, earlier: int,
             contributors: tuple[int, ...] = CLIENTS, digest: bytes | None = None) -> bytes:
    return RuntimeMessage(kind=Kind.REUSE, round=round, digest=sim.nodes[0].digest if digest is None else digest,
                          name=name, releases=((earlier, contributors),)).to_bytes()


@pytest.mark.parametrize("change,reason", [
    ({"name": "model_update", "round": 3, "earlier": 0}, "not a constant statistic"),
    ({"name": "label_histogram", "round": 3, "earlier": 0}, "not a constant statistic"),
    ({"round": 3, "earlier": 1}, "pointed at the release of round 1"),
    ({"round": 3, "earlier": 0, "contributors": (0, 1, 2, 3)}, "over 4 clients"),
    ({"round": 2, "earlier": 0}, "a replay"),
    ({"round": 1, "earlier": 0}, "after round 2"),
    ({"round": 0, "earlier": 0}, "after round 2"),
    ({"round": 3, "earlier": 0, "digest": bytes(16)}, "another run"),
], ids=["update", "undeclared", "wrong-round", "wrong-set", "replay", "stale", "same-round", "foreign"])
def test_a_wrong_pointer_is_refused_and_changes_nothing(change: dict, reason: str) -> None:
    sim = build()
    for _ in range(3):
        sim.run_round()
    node = sim.nodes[0]
    before = ({r: dict(v) for r, v in node.learned.items()}, node.participant.state())
    (reply,) = node.handle([_pointer(sim, **change)])
    refusal = RuntimeMessage.from_bytes(reply.data)
    assert refusal.kind == Kind.REFUSE and reason in refusal.reason
    assert ({r: dict(v) for r, v in node.learned.items()}, node.participant.state()) == before


def test_a_pointer_before_any_release_is_refused() -> None:
    sim = build()
    (reply,) = sim.nodes[0].handle([_pointer(sim, round=0, earlier=-1)])
    assert "the last this client learned is none" in RuntimeMessage.from_bytes(reply.data).reason


def test_a_client_lost_after_the_pointer_leaves_the_mean_of_those_who_sent() -> None:
    runs = []
    for reuse in (True, False):
        sim = build(reuse=reuse)
        sim.run_round()
        sim.network.attach(4, lambda inbox: [])  # client 4 vanishes: it answers nothing from now on
        sim.run_round()
        runs.append(sim)
    reused, summed = runs
    # with the pointer: round 0's total (5 clients), the update of 4, their total; without: their total
    names = [(r.name, r.reused_from, len(r.contributors)) for r in reused.stats.records if r.round == 1]
    assert names == [("total_samples", 0, 5), ("model_update", None, 4), ("total_samples", None, 4)]
    assert [(r.name, len(r.contributors)) for r in summed.stats.records if r.round == 1] == \
        [("total_samples", 4), ("model_update", 4)]
    assert torch.allclose(reused.global_vector, summed.global_vector, rtol=0, atol=1e-6)


@pytest.mark.parametrize("value", [[float("nan")], [], [[1.0]], "many"], ids=["nan", "empty", "matrix", "text"])
def test_a_snapshot_with_a_malformed_release_is_refused_whole(value: object) -> None:
    sim = build()
    sim.run_round()
    saved = load_state(sim.nodes[0].snapshot())
    assert saved["participant"]["constants"]["total_samples"]["round"] == 0  # the node keeps it
    saved["participant"]["constants"]["total_samples"]["value"] = value
    target = build().nodes[0]
    before = target.participant.state()
    with pytest.raises(WireError, match="not a participant snapshot"):
        target.restore(dump_state(saved))
    assert target.participant.state() == before
