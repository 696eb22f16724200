"""The leakage audit: ledger from real transcripts, attacks on real runs, report and CLI."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from protocols import SERVER, LocalNetwork, Reveal, VectorSpec, make_sum
from secure_fl.audit import attacks as A
from secure_fl.audit.ledger import build_ledger, recoverable_clients
from secure_fl.audit.runner import AuditSettings, audit_cell, load_dataset_for, method_available
from secure_fl.audit.tap import NetworkTap

WEAK = {"key_bits": 1024, "allow_weak_keys": True}
SPEC = VectorSpec(length=10, bound=1000, summands=4)


def _histograms(n: int = 4, c: int = 10, seed: int = 0) -> dict[int, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {i: rng.integers(0, 50, size=c) for i in range(n)}


def _tapped(name: str, clients, **options):
    """A protocol session whose network carries the audit's tap."""
    network = LocalNetwork()
    tap = NetworkTap.on(network)
    return make_sum(name, clients=list(clients), network=network, **options), tap


def _two_sums(session, inputs, *, statistic: str = "hist", reveal: Reveal | None = None) -> None:
    reveal = reveal or Reveal()
    session.sum(inputs, spec=SPEC, statistic=statistic, round=0, reveal=reveal)
    session.sum({0: inputs[0], 1: inputs[1], 2: inputs[2]}, spec=SPEC, statistic=statistic, round=1, reveal=reveal)


# --- the tap and the readers --------------------------------------------------------------------

def test_the_tap_records_what_crossed_with_sender_and_receiver() -> None:
    inputs = _histograms()
    network = LocalNetwork(interceptor=lambda data, message: None if message.label.stage == "result" else data)
    tap = NetworkTap.on(network)  # in front of the existing interceptor, which still decides
    session = make_sum("plain", clients=list(inputs), network=network)
    session.sum(inputs, spec=SPEC, statistic="hist", round=0, reveal=Reveal(server=True, clients=True))
    messages = tap.messages
    assert [(m.sender, m.receiver, len(m.data)) for m in messages] == [
        (e.sender, e.receiver, e.bytes) for e in session.transcript]
    assert not [m for m in messages if m.label.stage == "result"]  # dropped: never crossed
    uploads = [m for m in messages if m.label.stage == "upload"]
    assert {m.sender for m in uploads} == set(inputs) and all(m.to_server for m in uploads)
    assert all(m.envelope is not None and m.envelope.sender == m.sender for m in messages)


def test_readers_read_what_the_receiver_can() -> None:
    inputs = _histograms()
    plain, plain_tap = _tapped("plain", inputs)
    masked, masked_tap = _tapped("masking", inputs)
    for session in (plain, masked):
        session.sum(inputs, spec=SPEC, statistic="hist", round=0)
    from secure_fl.audit.views import client_view, server_view

    def view(tap):
        return server_view(tap.messages, clients=list(inputs), lengths={}, session=lambda p, t: None, releases=[],
                           models=[], cohorts=[])

    read = {r.owner: r.values for r in view(plain_tap).inputs("hist")}
    assert set(read) == set(inputs) and all(np.array_equal(read[c], inputs[c]) for c in inputs)
    assert not view(masked_tap).inputs("hist")              # masked uploads read as nothing
    sums = client_view(1, masked_tap.messages, clients=list(inputs), lengths={}).sums("hist")
    assert len(sums) == 1 and np.array_equal(sums[0].values, sum(inputs.values()))  # the released sum
    # A party that holds the Paillier key (the server, in its weak mode) decrypts uploads.
    weak, weak_tap = _tapped("paillier", inputs, keyholder="server", **WEAK)
    weak.sum(inputs, spec=SPEC, statistic="hist", round=0)
    reads = server_view(weak_tap.messages, clients=list(inputs), lengths={}, session=lambda p, t: weak.server,
                        releases=[], models=[], cohorts=[]).inputs("hist")
    assert {r.owner: tuple(r.values) for r in reads} == {c: tuple(v) for c, v in inputs.items()}


# --- ledger -------------------------------------------------------------------------------------

def test_ledger_plain_server_reads_every_input() -> None:
    inputs = _histograms()
    session, tap = _tapped("plain", inputs)
    _two_sums(session, inputs)
    ledger = build_ledger(tap.messages, clients=list(inputs))
    s = ledger.summary()
    uploads = [e for e in session.transcript if e.stage == "upload"]
    assert s.server_plaintext_bytes_by_client[0] == sum(e.bytes for e in uploads if e.sender == 0)
    assert s.server_plaintext_bytes_per_client == pytest.approx(sum(e.bytes for e in uploads) / 4)
    assert s.k_min == 1 and s.collusion_threshold == 0 and s.protocol_collusion_threshold == 0
    assert any("reads each client's value in the clear" in f for f in s.flags)
    clear = [r for r in ledger.for_party("server") if r.kind == "clear"]
    assert {r.owner for r in clear} == {f"client-{i}" for i in range(4)}
    own = [r for r in ledger.for_party("client-2") if r.kind == "own"]
    assert len(own) == 2  # its input to both sums


@pytest.mark.parametrize("keyholder", ["agent", "all"])
def test_ledger_paillier_client_keyholder(keyholder: str) -> None:
    inputs = _histograms()
    session, tap = _tapped("paillier", inputs, keyholder=keyholder, **WEAK)
    _two_sums(session, inputs)
    ledger = build_ledger(tap.messages, clients=list(inputs))
    s = ledger.summary()
    kh = s.key_holders["paillier"]
    agent = session.server.agent  # type: ignore[attr-defined]
    assert kh.mode == keyholder and kh.agent == agent
    assert kh.holders == ({agent} if keyholder == "agent" else set(inputs))
    assert s.server_plaintext_bytes_per_client == 0
    assert s.protocol_collusion_threshold == 1          # the server plus one key-holding client
    assert s.k_min == 3                                  # the smaller of the two sums
    assert all(r.kind in ("ciphertext", "aggregate", "public", "sealed") for r in ledger.for_party("server"))
    # Sums over {0,1,2,3} and {0,1,2}: their difference is client 3's input.
    assert s.statistics["hist"].recoverable == (3,)
    assert [f for f in s.flags if "1/4 clients individually isolatable" in f]
    agent_rows = ledger.for_party(f"client-{agent}")
    assert any(r.role == "agent" and r.kind == "aggregate" for r in agent_rows)


def test_ledger_paillier_server_keyholder_is_flagged() -> None:
    inputs = _histograms()
    session, tap = _tapped("paillier", inputs, keyholder="server", **WEAK)
    _two_sums(session, inputs)
    s = build_ledger(tap.messages, clients=list(inputs)).summary()
    assert s.key_holders["paillier"].mode == "server"
    assert s.server_plaintext_bytes_per_client > 0      # ciphertexts under the server's own key
    assert s.k_min == 1 and s.collusion_threshold == 0 and s.protocol_collusion_threshold == 0
    assert any("server holds the secret key" in f for f in s.flags)


@pytest.mark.parametrize(("name", "options", "expected"), [
    ("masking", {"threshold": 4}, 4),
    ("masking", {}, 4),            # default: ceil(2m/3) of the m = 6 participants
    ("secagg+", {}, None),         # Bell et al.'s bounds: at least 2
])
def test_ledger_masking_threshold_from_the_runs_open(name: str, options: dict, expected: int | None) -> None:
    inputs = _histograms(n=6)
    spec = VectorSpec(length=10, bound=1000, summands=6)
    session, tap = _tapped(name, inputs, **options)
    session.sum(inputs, spec=spec, statistic="hist", round=0)
    ledger = build_ledger(tap.messages, clients=list(inputs))
    s = ledger.summary()
    t = session.server.parameters(6).threshold  # type: ignore[attr-defined]
    assert s.protocol_collusion_threshold == t and (expected is None or t == expected) and t >= 2
    assert s.k_min == 6 and s.server_plaintext_bytes_per_client == 0
    assert {r.kind for r in ledger.for_party("server")} >= {"masked", "aggregate"}
    # A transcript has no bytes to read the open from: the protocol's rules on its options agree.
    from_options = build_ledger(session.transcript, protocol_options={name: options}).summary()
    assert from_options.protocol_collusion_threshold == t


def test_ledger_reveal_to_clients_only_keeps_the_sum_from_the_server() -> None:
    inputs = _histograms()
    session, tap = _tapped("paillier", inputs, keyholder="all", **WEAK)
    session.sum(inputs, spec=SPEC, statistic="registry", round=0, reveal=Reveal(server=False, clients=True))
    ledger = build_ledger(tap.messages, clients=list(inputs))
    (run,) = ledger.runs_of("registry")
    assert SERVER not in run.learners and set(run.learners) == set(inputs)
    assert not ledger.summary().statistics["registry"].server_learns_sum


# --- disaggregation -----------------------------------------------------------------------------

def test_disaggregation_recovers_histograms_when_participant_sets_vary() -> None:
    rng = np.random.default_rng(3)
    n, c, rounds = 6, 10, 9
    hist = rng.integers(0, 40, size=(n, c))
    sets = [tuple(sorted(rng.choice(n, size=3, replace=False))) for _ in range(rounds)]
    matrix = np.zeros((rounds, n))
    for r, s in enumerate(sets):
        matrix[r, list(s)] = 1
    assert np.linalg.matrix_rank(matrix) == n
    x, recoverable = A.disaggregate(matrix, matrix @ hist)
    assert recoverable.all()
    assert np.allclose(x, hist, atol=1e-6)
    # The same sums, run through a real secure-sum protocol, and the ledger flags it.
    session, tap = _tapped("masking", range(n))
    spec = VectorSpec(length=c, bound=1000, summands=3)
    for r, s in enumerate(sets):
        session.sum({i: hist[i] for i in s}, spec=spec, statistic="label_counts", round=r)
    ledger = build_ledger(tap.messages, clients=list(range(n)))
    _, participation = ledger.participation("label_counts")
    assert np.array_equal(participation, matrix)
    summary = ledger.summary(static={"label_counts"})
    assert summary.statistics["label_counts"].recoverable == tuple(range(n))
    assert any("6/6 clients individually isolatable" in f and "exactly" in f for f in summary.flags)


def test_fixed_participant_sets_are_not_recoverable() -> None:
    matrix = np.array([[1, 1, 0, 0], [1, 1, 0, 0], [0, 0, 1, 1.0]])
    assert not recoverable_clients(matrix).any()
    matrix = np.array([[1, 1, 0], [0, 1, 0], [0, 1, 1.0]])
    assert recoverable_clients(matrix).tolist() == [True, True, True]
    assert recoverable_clients(np.array([[1, 1, 1.0]])).tolist() == [False, False, False]


# --- scoring and the pure attacks ---------------------------------------------------------------

def test_score_exact_and_trivial() -> None:
    truth = {0: np.array([10, 0, 0]), 1: np.array([0, 5, 5])}
    prior = np.array([10, 5, 5])
    exact = A.score("x", "server", truth, truth, prior, counts=True)
    assert exact.l1_error == 0 and exact.advantage == 1 and exact.exact_count_accuracy == 1
    assert exact.top1_accuracy == 1.0
    trivial = A.trivial_result("x", "server", truth, prior, note="")
    assert trivial.advantage == pytest.approx(0.0)
    assert trivial.trivial_l1_error == pytest.approx((1.0 + 1.0) / 2)
    assert A.integer_counts([0.4, 0.4, 0.2], 10).tolist() == [4, 4, 2]
    assert A.integer_counts([1, 1, 1], 10).sum() == 10


def test_climb_loss_inference_sharpens_with_rounds() -> None:
    rng = np.random.default_rng(1)
    c = 5
    prior = np.full(c, 0.2)
    p_true = np.array([0.6, 0.3, 0.1, 0.0, 0.0])
    one = A.climb_loss_inference(np.array([1.0]), rng.random((1, c)), prior=prior)
    class_losses = rng.random((20, c)) * 3
    many = A.climb_loss_inference(class_losses @ p_true, class_losses, prior=prior)
    assert np.abs(many - p_true).sum() < 0.05
    assert np.abs(one - p_true).sum() > np.abs(many - p_true).sum()


def test_dubhe_frequency_names_rare_categories() -> None:
    # Two categories: class 0 dominant (1 client), none dominant (3 clients). Eq. 6 with K = 2:
    # the lone client volunteers with probability K / (1 · 2) = 1, the others 1/3.
    categories = [(0,), (1,), tuple(range(3))]
    registry_sum = np.array([1, 0, 3])
    rng = np.random.default_rng(0)
    rounds = 400
    participation = np.zeros((rounds, 4))
    participation[:, 0] = 1
    for r in range(rounds):
        participation[r, 1 + rng.integers(3)] = 1
    inferred, chosen = A.dubhe_frequency_inference(participation, clients_per_round=2,
                                                   registry_sum=registry_sum, categories=categories,
                                                   prior=np.array([1, 1, 1.0]))
    assert chosen[0] == 0 and inferred[0].argmax() == 0
    assert all(chosen[j] == 2 for j in (1, 2, 3))
    fallback, _ = A.dubhe_frequency_inference(participation, clients_per_round=2, registry_sum=None,
                                              categories=categories, prior=np.array([1, 1, 1.0]))
    assert np.allclose(fallback[0], 1 / 3)


# --- attacks on real runs (digits, a small MLP, one local epoch per round) ----------------------

@pytest.fixture(scope="module")
def digits():
    return load_dataset_for(AuditSettings())


def _attack(cell, name: str):
    hits = [a for a in cell.attacks if a.name == name]
    assert hits, f"{name} missing from {[a.name for a in cell.attacks]}: {cell.notes}"
    return hits[0]


def test_plaintext_updates_leak_label_counts_and_masking_does_not_in_one_round(digits) -> None:
    settings = AuditSettings(num_clients=6, clients_per_round=6, rounds=2)
    plain = audit_cell("fedavg", "plain", settings, dataset=digits)
    masked = audit_cell("fedavg", "masking", settings, dataset=digits)
    assert plain.status == masked.status == "ok", (plain.reason, masked.reason)
    leak = _attack(plain, "update_label_counts")
    assert leak.advantage is not None and leak.advantage > 0.6     # far better than guessing P(y)
    assert leak.top1_accuracy is not None and leak.top1_accuracy >= 0.8
    assert plain.summary is not None and plain.summary.k_min == 1 and plain.summary.collusion_threshold == 0
    assert plain.summary.server_plaintext_bytes_per_client > 0
    hidden = _attack(masked, "update_label_counts")
    assert hidden.advantage is not None and hidden.advantage < 0.1  # the sum of all clients ≈ P(y)
    assert masked.summary is not None and masked.summary.server_plaintext_bytes_per_client == 0
    assert masked.summary.k_min == 6 and masked.summary.collusion_threshold >= 2


def test_ratio_loss_monitor_leaks_under_masking_with_few_clients_per_round(digits) -> None:
    # The paper's workflow (mitigation after detection): the monitor runs every round at the server.
    method = "ratio_loss" if method_available("ratio_loss")[0] else "fedavg"
    params = {"ratio_loss": {"mitigation": "detect"}}
    few = audit_cell(method, "masking", AuditSettings(num_clients=6, clients_per_round=1, rounds=6,
                                                      method_params=params), dataset=digits)
    assert few.status == "ok", few.reason
    monitor = _attack(few, "ratio_loss_monitor")
    assert monitor.advantage is not None and monitor.advantage > 0.4
    assert few.summary is not None and few.summary.server_plaintext_bytes_per_client == 0
    assert few.summary.k_min == 1  # a round of one client: its sum is its own value
    everyone = audit_cell(method, "masking", AuditSettings(num_clients=6, clients_per_round=6, rounds=2,
                                                           method_params=params), dataset=digits)
    assert everyone.status == "ok", everyone.reason
    blurred = _attack(everyone, "ratio_loss_monitor")
    assert blurred.advantage is not None and blurred.advantage < 0.15


def test_disaggregation_across_rounds_defeats_masking_and_is_flagged(digits) -> None:
    settings = AuditSettings(num_clients=6, clients_per_round=3, rounds=10)
    cell = audit_cell("fedavg", "masking", settings, dataset=digits)
    assert cell.status == "ok", cell.reason
    single = _attack(cell, "update_label_counts")
    multi = _attack(cell, "disaggregation")
    assert multi.recoverable_fraction == 1.0
    assert multi.advantage is not None and multi.advantage > 0.3
    assert single.advantage is not None and multi.advantage > single.advantage + 0.1
    sizes = _attack(cell, "sample_counts")
    assert sizes.exact_count_accuracy == 1.0   # every |D_i| from total_samples round sums
    assert cell.summary is not None
    assert any(f.startswith("total_samples: 6/6 clients individually isolatable") and "exactly" in f
               for f in cell.summary.flags)
    assert any(f.startswith("model_update: 6/6") for f in cell.summary.flags)


def test_unregistered_method_is_reported_not_raised(digits) -> None:
    cell = audit_cell("no_such_method", "plain", AuditSettings(), dataset=digits)
    assert cell.status == "not available" and "registry" in cell.reason
    assert cell.as_json()["k_min"] is None


# --- method knowledge from the method's own client half -----------------------------------------

def _model(method: str, digits, **settings_kw):
    from secure_fl.audit import runner

    sim = runner._build(method, "plain", AuditSettings(num_clients=4, clients_per_round=4, rounds=1, **settings_kw),
                        dataset=digits, clients_only=False)
    return sim, runner._method_model(sim)


def test_what_a_statistic_reveals_comes_from_the_client_half(digits) -> None:
    _needs("fedshift")
    _, model = _model("fedshift", digits)
    counts = model.count_map("label_histogram")
    assert counts is not None and counts.reveals_counts and not counts.reveals_size
    size = model.count_map("total_samples")
    assert size is not None and size.reveals_size and size.size([42.0]) == 42.0
    assert model.count_map("model_update") is None           # needs a trained update
    assert np.allclose(counts.counts(np.arange(10.0)), np.arange(10.0))


def test_the_objective_comes_from_the_client_half(digits) -> None:
    _needs("fedshift")
    from secure_fl.algorithms.fedshift import classifier_shift
    from secure_fl.stats import Learned

    sim, model = _model("fedshift", digits)
    histogram = np.array([30.0, 10, 10, 10, 10, 10, 10, 10, 10, 10])
    learned = [Learned("label_histogram", 0, histogram, (0, 1, 2, 3), None)]
    mine = np.array([5.0, 0, 0, 0, 0, 0, 0, 0, 0, 1])
    objective = model.objective(mine, round=0, start=sim.global_vector, learned=learned, broadcast={})
    assert objective.logit_shift is not None
    assert np.allclose(objective.logit_shift.numpy(), classifier_shift(mine, histogram / histogram.sum()), atol=1e-6)
    # Without the prior learned, the hypothesised client trains plainly (the half cannot shift).
    assert model.objective(mine, round=0, start=sim.global_vector, learned=[], broadcast={}).logit_shift is None
    _needs("ratio_loss")
    sim, model = _model("ratio_loss", digits)
    ratios = np.linspace(0.5, 2.0, 10)
    weighted = model.objective(mine, round=0, start=sim.global_vector, learned=[],
                               broadcast={"ratio_weights": ratios})
    assert weighted.class_weight is not None
    expected = sim.server.model.loss.class_weights(torch.as_tensor(ratios, dtype=torch.float32))
    assert np.allclose(weighted.class_weight.numpy(), expected.numpy())


@pytest.fixture
def counting_method():
    """A method registered only for this test: it asks every client for its label counts under
    a name the audit has never heard of."""
    from secure_fl.algorithms import ALGORITHMS, register_algorithm
    from secure_fl.algorithms.fedavg import FedAvg, FedAvgClient, FedAvgServer
    from secure_fl.stats import StatisticDeclaration

    declaration = StatisticDeclaration(name="tally_of_classes", length=10, bound=10_000, learners=frozenset({"server"}),
                                       per_round=False)

    class CountingServer(FedAvgServer):
        def setup(self, ctx):  # type: ignore[no-untyped-def]
            ctx.stats.request(declaration, cohort=ctx.clients, round=0)

    class CountingClient(FedAvgClient):
        def __init__(self, params, info):  # type: ignore[no-untyped-def]
            super().__init__(params, info)
            self.sources[declaration.name] = lambda ctx: np.asarray(ctx.data.class_counts, dtype=np.int64) * 3 + 1

        def declarations(self):  # type: ignore[no-untyped-def]
            return {**super().declarations(), declaration.name: declaration}

    @register_algorithm("audit_counting")
    class Counting(FedAvg):
        Server = CountingServer
        Client = CountingClient

    yield "audit_counting"
    ALGORITHMS.pop("audit_counting", None)


def test_a_new_method_is_audited_without_changing_the_audit(digits, counting_method: str) -> None:
    settings = AuditSettings(num_clients=6, clients_per_round=3, rounds=2)
    plain = audit_cell(counting_method, "plain", settings, dataset=digits)
    assert plain.status == "ok", plain.reason
    read = _attack(plain, "direct_read")   # 3·n + 1 inverted from the client half's own answer
    assert read.advantage == pytest.approx(1.0) and read.exact_count_accuracy == 1.0
    assert "tally_of_classes" in read.note
    masked = audit_cell(counting_method, "masking", settings, dataset=digits)
    assert masked.status == "ok", masked.reason
    assert not [a for a in masked.attacks if a.name == "direct_read"]
    assert _attack(masked, "collusion_read").party.startswith("server+")


def test_the_tap_changes_nothing_in_the_run(digits) -> None:
    from secure_fl.audit import runner

    settings = AuditSettings(num_clients=4, clients_per_round=2, rounds=2)
    tapped = runner._run(runner._build("fedavg", "masking", settings, dataset=digits, clients_only=False), 2)
    plain = runner._build("fedavg", "masking", settings, dataset=digits, clients_only=False)
    plain.setup()
    for _ in range(2):
        plain.run_round()
    assert np.array_equal(tapped.models[-1].numpy(), plain.global_vector.numpy())
    assert len(tapped.messages) == len(plain.transcript)


def test_a_sum_only_clients_learn_gets_client_key_holders(digits) -> None:
    _needs("climb")
    settings = AuditSettings(num_clients=4, clients_per_round=4, rounds=1, key_bits=1024, hidden=(8,),
                             method_params={"climb": {"server_learns": False}})
    cell = audit_cell("climb", "paillier", settings, dataset=digits)
    assert cell.status == "ok", cell.reason
    assert any("only clients may learn" in n and "'all'" in n for n in cell.notes)
    assert cell.summary is not None and cell.summary.key_holders["paillier"].mode == "all"
    assert not cell.summary.statistics["climb_dual"].server_learns_sum


# --- report and CLI -----------------------------------------------------------------------------

def _parser() -> argparse.ArgumentParser:
    from secure_fl.cli import audit

    parser = argparse.ArgumentParser(prog="secure-fl")
    audit.register(parser.add_subparsers(dest="command", required=True))
    return parser


def test_cli_json_and_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = _parser().parse_args([
        "audit", "--methods", "fedavg,fedshift", "--protocols", "plain,masking", "--rounds", "2",
        "--clients", "4", "--per-round", "2", "--json", "--out", str(tmp_path),
    ])
    assert args.func(args) == 0
    data = json.loads(capsys.readouterr().out)
    cells = {(c["method"], c["protocol"]): c for c in data["cells"]}
    assert set(cells) == {(m, p) for m in ("fedavg", "fedshift") for p in ("plain", "masking")}
    plain = cells[("fedavg", "plain")]
    for key in ("server_plaintext_bytes_per_client", "k_min", "collusion_threshold", "attacks"):
        assert key in plain
    assert plain["k_min"] == 1 and plain["collusion_threshold"] == 0
    for attack in plain["attacks"]:
        assert {"name", "party", "l1_error", "trivial_l1_error", "advantage"} <= set(attack)
    assert cells[("fedavg", "masking")]["server_plaintext_bytes_per_client"] == 0
    if not method_available("fedshift")[0]:
        assert cells[("fedshift", "plain")]["status"] == "not available"
    for name in ("audit.md", "audit.json", "audit.png"):
        assert (tmp_path / name).stat().st_size > 0
    assert (tmp_path / "audit.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    markdown = (tmp_path / "audit.md").read_text()
    assert "| **fedavg** |" in markdown and "update_label_counts" in markdown


def test_cli_rejects_unknown_names(capsys: pytest.CaptureFixture[str]) -> None:
    args = _parser().parse_args(["audit", "--protocols", "rot13"])
    assert args.func(args) == 2
    assert "unknown protocol" in capsys.readouterr().err
    args = _parser().parse_args(["audit", "--methods", "fedavgg"])
    assert args.func(args) == 2


# --- the methods as they land -------------------------------------------------------------------

def _needs(method: str) -> None:
    ok, why = method_available(method)
    if not ok:
        pytest.skip(why)


def test_fedshift_histogram_is_read_in_plain_and_needs_a_coalition_otherwise(digits) -> None:
    _needs("fedshift")
    settings = AuditSettings(num_clients=6, clients_per_round=3, rounds=2)
    plain = audit_cell("fedshift", "plain", settings, dataset=digits)
    assert plain.status == "ok", plain.reason
    read = _attack(plain, "direct_read")
    assert read.advantage == pytest.approx(1.0) and read.exact_count_accuracy == 1.0
    masked = audit_cell("fedshift", "masking", settings, dataset=digits)
    assert masked.status == "ok", masked.reason
    assert not [a for a in masked.attacks if a.name == "direct_read"]
    coalition = _attack(masked, "collusion_read")
    assert coalition.party.startswith("server+") and coalition.party != "server+1 client"
    assert masked.summary is not None and masked.summary.collusion_threshold >= 2


def test_server_keyholder_reads_every_update(digits) -> None:
    settings = AuditSettings(num_clients=4, clients_per_round=4, rounds=1, keyholder="server",
                             key_bits=1024, hidden=(8,))
    cell = audit_cell("fedavg", "paillier", settings, dataset=digits)
    assert cell.status == "ok", cell.reason
    assert cell.summary is not None and cell.summary.collusion_threshold == 0
    assert cell.summary.server_plaintext_bytes_per_client > 0
    assert any("server holds the secret key" in f for f in cell.summary.flags)
    assert "own updates read in the clear" in _attack(cell, "update_label_counts").note


def test_climb_losses_are_attacked_where_visible(digits) -> None:
    _needs("climb")
    settings = AuditSettings(num_clients=4, clients_per_round=4, rounds=2)
    cell = audit_cell("climb", "plain", settings, dataset=digits)
    assert cell.status == "ok", cell.reason
    # CLIMB's loss values, against the same statistic its own client half computes on the
    # attacker's samples of each class (no CLIMB-specific code in the audit).
    losses = _attack(cell, "sample_means")
    assert losses.targets == 4 and losses.advantage is not None and "read in the clear" in losses.note
    assert "climb_dual" in losses.note



def test_climb_losses_from_round_sums_only(digits) -> None:
    """Under masking the server reads no f_i, only each dual round's sum: every participant gets
    the estimate from its first round's mean."""
    _needs("climb")
    settings = AuditSettings(num_clients=4, clients_per_round=4, rounds=2)
    cell = audit_cell("climb", "masking", settings, dataset=digits)
    assert cell.status == "ok", cell.reason
    losses = _attack(cell, "sample_means")
    assert losses.targets == 4 and losses.advantage is not None
    assert "only round sums of climb_dual readable" in losses.note

def test_dubhe_key_is_shared_by_every_client(digits) -> None:
    _needs("dubhe")
    settings = AuditSettings(num_clients=6, clients_per_round=3, rounds=3, key_bits=1024,
                             selection_params={"dubhe": {"key_bits": 1024, "allow_weak_keys": True}})
    cell = audit_cell("dubhe", "masking", settings, dataset=digits)
    assert cell.status == "ok", cell.reason
    assert cell.summary is not None
    # Dubhe's own Paillier key is held by every client: one of them with the server opens the
    # label counts each client uploaded encrypted.
    assert cell.summary.statistics["dubhe_label_counts"].collusion_threshold == 1
    assert cell.summary.key_holders["paillier (dubhe_setup)"].mode == "all"
    coalition = _attack(cell, "collusion_read")
    assert coalition.party == "server+1 client" and coalition.advantage == pytest.approx(1.0)
    assert "dubhe_label_counts" in coalition.note
    parties = {a.party for a in cell.attacks if a.name == "participation"}
    assert parties == {"server", "server+1 client"}   # R_A: read by the coalition's client only


def test_distributed_dp_on_sample_counts_stops_their_exact_recovery(digits) -> None:
    privacy = {"statistics": {"total_samples": {"epsilon": 1.0, "secure_mode": False}}}
    cell = audit_cell("fedavg", "masking", AuditSettings(num_clients=6, clients_per_round=3, rounds=8,
                                                         privacy=privacy), dataset=digits)
    assert cell.status == "ok", cell.reason
    sizes = _attack(cell, "sample_counts")
    assert sizes.exact_count_accuracy is not None and sizes.exact_count_accuracy < 0.5
    assert "distributed-DP noise" in sizes.note
    scopes = {d["scope"]: d for d in cell.dp}
    assert scopes["total_samples"]["epsilon"] == pytest.approx(1.0, rel=1e-3)
    assert scopes["total_samples"]["releases"] == 8
