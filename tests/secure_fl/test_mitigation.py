"""Issue 25: mitigations against multi-round disaggregation (guard, fixed cohorts, DP) and their audit."""

from __future__ import annotations

import json
from typing import Any, cast

import numpy as np
import pytest
import torch

from protocols import ProtocolError
from secure_fl.audit.runner import audit_cell, load_dataset_for, run_config
from secure_fl.audit.settings import AuditSettings
from secure_fl.config import ConfigError, GuardMitigation, parse_config
from secure_fl.runtime import build_simulation
from secure_fl.stats import TOTAL_SAMPLES
from secure_fl.stats.guard import (
    FixedCohorts,
    ReleaseChecker,
    SpanGuard,
    make_cohorts,
    small_set_in_span,
)

BASE = """
[data]
dataset = "digits"
num_clients = 8
partition_params = { alpha = 0.5 }
[train]
rounds = 2
clients_per_round = 4
"""


def test_span_rule_finds_a_differenced_client_and_passes_disjoint_sets() -> None:
    assert small_set_in_span([(0, 1, 2, 3), (0, 1, 2)], 2) == (3,)
    assert small_set_in_span([(0, 1, 2, 3), (4, 5, 6, 7)], 4) is None
    # No two rows isolate client 0, all five together do (4·e0 = Σ rows with 0 − 3·row without it).
    rows = [(0, 1, 2, 3), (0, 1, 2, 4), (0, 1, 3, 4), (0, 2, 3, 4)]
    assert small_set_in_span(rows, 2) is None
    assert small_set_in_span([*rows, (1, 2, 3, 4)], 2) is not None


def test_guard_checker_refuses_with_the_exposed_set_and_allows_a_repeat() -> None:
    checker = ReleaseChecker(SpanGuard(k=3), num_clients=8)
    assert checker.check("s", 0, [0, 1, 2, 3]) is None
    checker.record("s", 0, [0, 1, 2, 3])
    reason = checker.check("s", 1, [0, 1, 2])
    assert reason is not None and "[3]" in reason
    assert checker.check("s", 1, [0, 1, 2, 3]) is None  # the same set adds nothing to the span
    assert checker.check("s", 1, [0, 1]) is not None  # fewer than k
    assert checker.check("other", 1, [0, 1, 2]) is None  # each statistic has its own history
    restored = ReleaseChecker(SpanGuard(k=3), num_clients=8)
    restored.load_state(json.loads(json.dumps(checker.state())))
    assert restored.history == checker.history


def test_cohorts_are_seeded_disjoint_and_large_enough() -> None:
    cohorts = make_cohorts(10, size=3, seed=7)
    assert cohorts == make_cohorts(10, size=3, seed=7)
    assert sorted(c for g in cohorts for c in g) == list(range(10))
    assert len(cohorts) == 3 and all(len(g) >= 3 for g in cohorts)
    policy = FixedCohorts(cohorts=cohorts)
    assert policy.violation([], cohorts[0], num_clients=10) is None
    assert policy.violation([], cohorts[0][:-1], num_clients=10) is not None


def test_mitigation_table_is_validated() -> None:
    run = parse_config(BASE + '[mitigation]\nname = "guard"\nk = 3\n').runs[0]
    assert run.mitigation.params == GuardMitigation(k=3)
    assert run.to_dict()["mitigation"] == {"name": "guard", "k": 3}
    assert "mitigation" not in parse_config(BASE).runs[0].to_dict()  # identities of earlier runs unchanged
    for bad, words in [('name = "gard"', "did you mean 'guard'"), ('name = "guard"\nk = 1', "mitigation.k"),
                       ('name = "cohorts"\nsize = 9', "exceeds data.num_clients"),
                       ('name = "cohorts"\nk = 3', "unknown key 'mitigation.k'"),
                       ('name = "dp"\nepsilon = -1.0', "mitigation.epsilon"),
                       ('name = "dp"\ncounts = "some"', "mitigation.counts"),
                       ('name = "dp"', "hands the server every client's input")]:  # BASE: plain, clear
        with pytest.raises(ConfigError, match=words.replace("(", r"\(").replace(")", r"\)")):
            parse_config(BASE + "[mitigation]\n" + bad + "\n")


def test_clients_refuse_a_request_that_splits_a_cohort() -> None:
    settings = AuditSettings(rounds=1)
    config = run_config("fedavg", "plain", settings, mitigation="cohorts")
    sim = build_simulation(config, device=torch.device("cpu"), dataset=load_dataset_for(settings))
    sim.setup()
    policy = sim.plan.policy
    assert isinstance(policy, FixedCohorts)
    whole, split = policy.cohorts[0], policy.cohorts[0][:2] + policy.cohorts[1][:2]
    release = sim.stats.request(TOTAL_SAMPLES, cohort=whole, round=0)
    assert release.contributors == whole
    with pytest.raises(ProtocolError, match="no client uploaded"):  # every member refuses: nothing summed
        sim.stats.request(TOTAL_SAMPLES, cohort=sorted(split), round=1)
    guard = sim.nodes[split[0]].participant.guard
    assert guard is not None
    reason = guard.check(TOTAL_SAMPLES.name, 1, sorted(split))
    assert reason is not None and reason.startswith("cohorts:")
    assert guard.history[TOTAL_SAMPLES.name] == {0: whole}  # only what it joined


def test_audit_cells_carry_mitigation_epsilon_and_utility() -> None:
    settings = AuditSettings()
    dataset = load_dataset_for(settings)
    cells = {m: audit_cell("fedavg", "masking", settings, dataset=dataset, mitigation=m)
             for m in ("none", "guard", "cohorts")}
    assert all(c.status == "ok" for c in cells.values()), {m: c.reason for m, c in cells.items()}

    def disaggregation(mitigation: str) -> float:
        return max(a.advantage for a in cells[mitigation].attacks
                   if a.name == "disaggregation" and a.party == "server" and a.advantage is not None)

    assert disaggregation("cohorts") <= 0.05 < disaggregation("none")
    assert disaggregation("guard") < disaggregation("none")
    for mitigation, cell in cells.items():
        data = cell.as_json()
        assert data["mitigation"] == mitigation and data["epsilon"] is None
        assert 0.0 < data["utility"]["tail_accuracy"] <= 1.0
    assert cells["cohorts"].selection_cost["distinct_sets"] <= 2
    # the server's selection follows the clients' rule: an honest server is never refused
    assert all(c.selection_cost["refusals"] == 0 for c in cells.values())


def test_dp_cell_reports_the_composed_epsilon_per_client() -> None:
    settings = AuditSettings(rounds=3)
    cell = audit_cell("fedavg", "masking", settings, dataset=load_dataset_for(settings), mitigation="dp")
    assert cell.status == "ok", cell.reason
    scopes = {d["scope"]: d["epsilon"] for d in cell.dp}
    assert {"model_update", "total_samples", "run"} <= set(scopes)
    # each statistic spends at most its budget
    assert scopes["model_update"] <= 2.0 + 1e-6 and scopes["total_samples"] <= 2.0 + 1e-6
    # the run composes both into one ε per client, at δ = the sum of the statistics' δ
    assert cell.epsilon is not None and cell.epsilon_delta == pytest.approx(2e-5)
    assert max(scopes["model_update"], scopes["total_samples"]) < cell.epsilon
    # the run table's ε is the same number at the same δ (it composed at one statistic's δ: ∞)
    run = next(d for d in cell.dp if d["scope"] == "run")
    assert run["epsilon"] == pytest.approx(cell.epsilon) and run["delta"] == pytest.approx(cell.epsilon_delta)
    assert cell.as_json()["epsilon"] == cell.epsilon


def _context(round: int, *, num_clients: int = 8, per_round: int = 4) -> Any:
    from secure_fl.selection.strategy import SelectionContext

    return SelectionContext(round=round, num_clients=num_clients, clients_per_round=per_round,
                            rng=np.random.default_rng(round), stats=cast(Any, None))


def test_policy_selection_takes_whole_cohorts_and_follows_the_guard() -> None:
    from secure_fl.selection import RandomSelection
    from secure_fl.selection.mitigation import PolicySelection

    cohorts = make_cohorts(8, size=4, seed=0)
    selection = PolicySelection(RandomSelection(), FixedCohorts(cohorts=cohorts))
    assert all(selection.select(_context(r)) in cohorts for r in range(6))
    everyone = PolicySelection(RandomSelection(), FixedCohorts(cohorts=cohorts))
    assert everyone.select(_context(0, per_round=8)) == tuple(range(8))  # full participation is unchanged

    guard = SpanGuard(k=4)
    guarded = PolicySelection(RandomSelection(), guard)
    for r in range(12):
        chosen = guarded.select(_context(r))
        assert guard.violation(guarded.history[:-1], chosen, num_clients=8) is None
    assert guarded.fallbacks > 0  # twelve random sets of 4 of 8 would expose a small set
    restored = PolicySelection(RandomSelection(), guard)
    restored.load_state_dict(json.loads(json.dumps(guarded.state_dict())))
    assert restored.history == guarded.history and restored.fallbacks == guarded.fallbacks


@pytest.mark.slow
def test_dubhe_selects_whole_cohorts_without_refusals() -> None:
    settings = AuditSettings(rounds=3, key_bits=1024,
                             selection_params={"dubhe": {"key_bits": 1024, "allow_weak_keys": True}})
    cell = audit_cell("dubhe", "masking", settings, dataset=load_dataset_for(settings), mitigation="cohorts")
    assert cell.status == "ok", cell.reason
    # Dubhe's own per-client statistics are exempt; the method's sums all take whole cohorts
    assert cell.selection_cost["refusals"] == 0 and cell.selection_cost["distinct_sets"] <= 2


def test_a_clients_guard_history_survives_its_snapshot() -> None:
    settings = AuditSettings(rounds=2)
    config = run_config("fedavg", "plain", settings, mitigation="guard")
    dataset = load_dataset_for(settings)
    sim = build_simulation(config, device=torch.device("cpu"), dataset=dataset)
    sim.setup()
    for _ in range(2):
        sim.run_round()
    joined = next(n for n in sim.nodes.values() if n.participant.guard and n.participant.guard.history)
    fresh = build_simulation(config, device=torch.device("cpu"), dataset=dataset).nodes[joined.client_id]
    fresh.restore(joined.snapshot())
    assert fresh.participant.guard is not None and joined.participant.guard is not None
    assert fresh.participant.guard.history == joined.participant.guard.history


def test_dp_on_a_model_sized_update_is_accounted_with_the_clients_calibration() -> None:
    """The server's ledger must account the update with the calibration the clients noise with
    (L2-clipped, with the tail budget of a model-sized vector): it used the statistic's box
    sensitivity and default tail, so a 26k-parameter MLP failed its first round."""
    from secure_fl.data import load_dataset
    from secure_fl.stats import MODEL_UPDATE

    config = parse_config(BASE + """
[secure]
protocol = "masking"
update_protocol = "masking"
[mitigation]
name = "dp"
counts = "record"
secure_mode = false
""").runs[0]
    sim = build_simulation(config, device=torch.device("cpu"), dataset=load_dataset("digits", seed=0))
    sim.setup()
    sim.run_round()
    server = sim.stats._accounting[MODEL_UPDATE]
    assert server.dim > 20_000
    layout = sim.plan.layout(server.declaration, 4, "masking")
    assert layout.noisy is not None and layout.noisy.sigma == server.sigma
    assert layout.noisy.sensitivity == server.sensitivity
    assert 0.0 < sim.privacy_report()[MODEL_UPDATE].epsilon <= 2.0 + 1e-6


def test_the_span_guard_checks_every_public_release_not_only_those_a_client_joined() -> None:
    """{0,1}, {2,3}, then {0..4}: client 4 joined none of the first two, and each of 0-3 sees only
    its own pair, so no client alone could tell that the third release isolates client 4 — until
    the server's public record (a bulletin before the run) tells client 4 about all of them."""
    policy = SpanGuard(k=2)
    joined_only = ReleaseChecker(policy, num_clients=5)
    assert joined_only.check("s", 2, [0, 1, 2, 3, 4]) is None  # what the client used to see
    told = ReleaseChecker(policy, num_clients=5)
    told.learn("s", [(0, (0, 1)), (1, (2, 3))])
    reason = told.check("s", 2, [0, 1, 2, 3, 4])
    assert reason is not None and "reveal the sum of clients [4]" in reason


def test_a_client_holds_the_server_to_its_public_record() -> None:
    checker = ReleaseChecker(SpanGuard(k=2), num_clients=6)
    checker.record("s", 0, [0, 1, 2], summed=True)
    # the record omits a release this client saw summed: it refuses
    reason = checker.check("s", 1, [0, 1, 2, 3])
    assert reason is not None and "omits the release of round 0" in reason
    checker.learn("s", [(0, (0, 1, 2))])
    checker.learn("s", [(0, (0, 1, 2))])  # a repeat (after a resume) is harmless
    assert checker.check("s", 1, [0, 1, 2, 3, 4, 5]) is None
    with pytest.raises(ProtocolError, match="two different releases"):
        checker.learn("s", [(0, (0, 1, 2, 5))])  # a different story about that release
    assert "two different releases" in (checker.check("s", 1, [0, 1, 2, 3, 4, 5]) or "")  # and from now on
    fresh = ReleaseChecker(SpanGuard(k=2), num_clients=6)
    fresh.learn("s", [(0, (0, 1, 2, 5))])
    with pytest.raises(ProtocolError, match=r"saw it summed over \[0, 1, 2\]"):
        fresh.record("s", 0, [0, 1, 2], summed=True)  # told first, then saw it summed otherwise
    restored = ReleaseChecker(SpanGuard(k=2), num_clients=6)
    restored.load_state(json.loads(json.dumps(checker.state())))
    assert (restored.public, restored.summed, restored.distrust) == (checker.public, checker.summed, checker.distrust)


def test_clients_refuse_a_release_that_the_public_record_shows_isolates_a_client() -> None:
    """A server that requests {0,1}, {2,3}, then {0,...,4} directly (bypassing its own selection).
    Joined releases alone, clients 0-3 each saw one pair and client 4 nothing, so every one of them
    accepted and the third sum minus the first two gave client 4's input. Told the public record
    before the run, every participant sees that the release isolates client 4 and refuses."""
    settings = AuditSettings(rounds=1, mitigation_params={"guard": {"k": 2}})
    config = run_config("fedavg", "masking", settings, mitigation="guard")
    sim = build_simulation(config, device=torch.device("cpu"), dataset=load_dataset_for(settings))
    sim.setup()
    sim.stats.request(TOTAL_SAMPLES, cohort=[0, 1], round=0)
    sim.stats.request(TOTAL_SAMPLES, cohort=[2, 3], round=1)
    with pytest.raises(ProtocolError):  # every participant refuses: nothing is summed
        sim.stats.request(TOTAL_SAMPLES, cohort=[0, 1, 2, 3, 4], round=2)
    for cid in range(5):
        guard = sim.nodes[cid].participant.guard
        assert guard is not None and guard.public[TOTAL_SAMPLES.name] == {0: (0, 1), 1: (2, 3)}
        reason = guard.check(TOTAL_SAMPLES.name, 2, [0, 1, 2, 3, 4])
        assert reason is not None and "reveal the sum of clients [4]" in reason
        joined_only = ReleaseChecker(guard.policy, num_clients=guard.num_clients)
        joined_only.history = guard.history
        assert joined_only.check(TOTAL_SAMPLES.name, 2, [0, 1, 2, 3, 4]) is None  # what it used to check
    bulletins = [e for e in sim.transcript.entries if e.stage == "bulletin"]
    # round 1: the first release to clients 2 and 3; round 2: to each participant what it had not been told
    assert sorted(e.receiver for e in bulletins) == [0, 1, 2, 2, 3, 3, 4]
