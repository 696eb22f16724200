"""The runtime with privacy: DP-SGD in local training, distributed DP for declared statistics,
per-round ε in the store, resume of the accounting, and the methods' per-round metrics channel."""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import re
import sqlite3
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from protocols import AbortedError
from secure_fl.algorithms import (
    ALGORITHMS,
    FedAvgParams,
    Method,
    RunInfo,
    ServerRound,
    register_algorithm,
)
from secure_fl.algorithms.base import DP_SGD_STATE, check_round_metrics
from secure_fl.algorithms.fedavg import FedAvgClient, FedAvgServer
from secure_fl.cli import runs as runs_command
from secure_fl.cli.run import format_rounds, format_summary
from secure_fl.config import ConfigError, parse_config
from secure_fl.data import load_dataset
from secure_fl.privacy import PrivacyBudgetError, PrivacyLedger, formal_guarantees
from secure_fl.privacy.dpsgd import DPSGDState
from secure_fl.runtime import run_experiment
from secure_fl.stats import (
    MODEL_UPDATE,
    StatisticDeclaration,
    StatisticPrivacy,
    StatisticsPrivacy,
    UpdateSettings,
)
from secure_fl.store import DB_NAME, SCHEMA_VERSION, RunStore

from .helpers import StatsNet, make_plan

pytestmark = pytest.mark.filterwarnings("ignore::secure_fl.privacy.InsecureRandomWarning")

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def digits():
    return load_dataset("digits", seed=0)


BASE = """
name = "dp"
seed = 5
[data]
dataset = "digits"
num_clients = 4
partition = "dirichlet"
partition_params = {{ alpha = 1.0 }}
[model]
name = "mlp"
hidden = [16]
[train]
rounds = {rounds}
clients_per_round = {per_round}
batch_size = 32
lr = 0.1
momentum = 0.5
{extra}
"""

DP = """
[secure]
protocol = "masking"
[privacy.dp_sgd]
noise_multiplier = 1.0
max_grad_norm = 1.0
delta = 1e-5
secure_mode = false
[privacy.statistics]
total_samples = { epsilon = 2.0, delta = 1e-6, secure_mode = false }
"""


def experiment(*, rounds: int = 3, per_round: int = 3, extra: str = DP):
    return parse_config(BASE.format(rounds=rounds, per_round=per_round, extra=extra))


class Interrupt(Exception):
    pass


@dataclass
class StopAt:
    """An observer that interrupts the run once ``clients`` clients of round ``round`` trained, before the
    round is stored (the simulation reports a round's trained clients once, when its updates are summed)."""

    round: int
    clients: int = 1

    def run_started(self, run: Any, *, position: int, total: int, start_round: int) -> None: ...

    def client_finished(self, run: Any, round: int, done: int, total: int) -> None:
        if round == self.round and done >= self.clients:
            raise Interrupt(f"interrupted in round {round}")

    def round_finished(self, run: Any, row: Any) -> None: ...

    def run_finished(self, run: Any, summary: Any) -> None: ...


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One uninterrupted 3-round DP run (DP-SGD + noisy total_samples), stored."""
    path = tmp_path_factory.mktemp("reference") / DB_NAME
    with RunStore(path) as store:
        (summary,) = run_experiment(experiment(), store, device=CPU)
        rows = store.rounds(summary.id)
        states = {c: s for c, s in _client_states(path, summary.id).items()}
    return {"summary": summary, "rows": rows, "states": states, "path": path}


def _client_states(path: Path, run_id: str) -> dict[int, dict[str, Any]]:
    from secure_fl.runtime import load_state

    con = sqlite3.connect(path)
    try:
        rows = con.execute("SELECT client, state FROM client_states WHERE run_id = ?", (run_id,)).fetchall()
    finally:
        con.close()
    # each blob is a node's snapshot; the method's persistent client state is its "state"
    return {int(c): load_state(bytes(blob))["state"] for c, blob in rows}


# --- DP-SGD ---------------------------------------------------------------------------------------

def test_dp_sgd_epsilon_is_stored_per_round_increasing_and_finite(reference: dict[str, Any]) -> None:
    rows = reference["rows"]
    assert [r.round for r in rows] == [0, 1, 2]
    eps = [r.privacy["model"].epsilon for r in rows]
    assert all(e is not None and math.isfinite(e) and e > 0 for e in eps)
    assert eps[0] < eps[1] < eps[2]
    assert [r.dp_epsilon for r in rows] == eps
    for r in rows:
        model = r.privacy["model"]
        assert model.delta == 1e-5 and 0 < model.epsilon_mean <= model.epsilon and model.releases > 0
    # the stored max is the worst client's own accountant, kept in its persistent state
    states = reference["states"]
    assert states and all(DP_SGD_STATE in s for s in states.values())
    per_client = {c: DPSGDState.from_dict(s[DP_SGD_STATE]).epsilon(1e-5) for c, s in states.items()}
    assert max(per_client.values()) == pytest.approx(eps[-1])
    json.dumps({c: s[DP_SGD_STATE] for c, s in states.items()})  # plain JSON, as the docs promise
    # output: the JSON object only with DP, the tables get ε columns
    summary = reference["summary"]
    out = summary.as_json()
    assert out["privacy"]["epsilon"] == pytest.approx(eps[-1]) and out["privacy"]["delta"] == 1e-5
    assert {"id", "method", "final", "tail", "bytes"} <= set(out)
    table = format_rounds(summary)
    assert "DP-SGD ε max (δ=1e-05)" in table and f"{eps[-1]:.3f}" in table
    assert "ε (δ)" in format_summary([summary])


def test_resume_keeps_the_accountant_state(tmp_path: Path, reference: dict[str, Any]) -> None:
    """Interrupted mid-round 2 in-process, then resumed: same ε per round, same metrics."""
    exp = experiment()
    with RunStore(tmp_path / DB_NAME) as store:
        with pytest.raises(Interrupt):
            run_experiment(exp, store, device=CPU, observer=StopAt(round=1, clients=2))
        (run,) = store.list_runs()
        assert run.status == "failed" and run.rounds_done == 1
        (resumed,) = run_experiment(exp, store, device=CPU, resume=run.id)
        rows = store.rounds(resumed.id)
    want = reference["rows"]
    assert [r.privacy["model"].epsilon for r in rows] == [r.privacy["model"].epsilon for r in want]
    assert [r.privacy["model"].epsilon_mean for r in rows] == [r.privacy["model"].epsilon_mean for r in want]
    assert [r.privacy["total_samples"].epsilon for r in rows] == [r.privacy["total_samples"].epsilon for r in want]
    assert [r.accuracy for r in rows] == [r.accuracy for r in want]
    assert resumed.final == reference["summary"].final


# --- distributed DP for statistics -------------------------------------------------------------------

HISTOGRAM = StatisticDeclaration(name="label_histogram", length=10, bound=500, kind="int",
                                 learners=frozenset({"server", "clients"}), record_sensitivity=1)


def test_noisy_statistic_within_tail_and_ledger_matches_calibration() -> None:
    clients = 10
    privacy = StatisticsPrivacy({"label_histogram": StatisticPrivacy(epsilon=1.0, delta=1e-5)}, rounds=4)
    other = StatisticDeclaration(name="other", length=1, bound=10)
    net = StatsNet(make_plan(clients, privacy=privacy), [HISTOGRAM, other])
    stats = net.coordinator
    rng = np.random.default_rng(0)
    inputs = {c: rng.integers(0, 400, size=10) for c in range(clients)}
    true = sum(inputs.values())
    diffs = []
    for r in range(4):
        release = net.request(HISTOGRAM, inputs, round=r)
        noisy = stats.noisy["label_histogram"]
        assert release.value is not None and release.contributors == tuple(range(clients))
        assert np.all(np.abs(release.value - true) <= clients * noisy.noise_bound)
        assert release.clipped is None and release.noise is not None  # a clip count would escape the noise
        assert release.epsilon is not None and release.epsilon <= 1.0 + 1e-9
        diffs.append(release.value - true)
    assert np.any(np.concatenate(diffs) != 0)  # the clients added noise (σ of the sum ≈ 5)
    assert noisy.mechanism.name == "skellam" and noisy.config.releases == 4
    ledger = stats.ledger
    assert ledger is not None and ledger.count("label_histogram") == 4
    assert all(r.sigma == noisy.sigma and r.contributors == clients for r in ledger.releases)
    eps = ledger.guarantee(1e-5, statistic="label_histogram").epsilon
    assert 0.98 < eps <= 1.0 + 1e-9  # the calibration's budget, used up by the planned releases
    assert formal_guarantees(ledger, delta=1e-5)["label_histogram"].epsilon == pytest.approx(eps)
    before = len(net.transcript)
    with pytest.raises(PrivacyBudgetError, match="releases = N"):
        net.request(HISTOGRAM, inputs, round=4)
    assert len(net.transcript) == before  # refused before any client was asked
    # un-noised statistics are untouched
    assert net.request(other, {0: [3], 1: [4]}).scalar() == 7
    # values outside the box need a declaration that clips: without it the client refuses
    updates = UpdateSettings(dimension=3, protocol="plain", clip=1.0, frac_bits=16)
    boxed_privacy = StatisticsPrivacy({"default": StatisticPrivacy(epsilon=1.0, releases=2)})
    clipping = dataclasses.replace(HISTOGRAM, name="clipped_histogram", clip=True)
    net2 = StatsNet(make_plan(3, privacy=boxed_privacy, updates=updates), [HISTOGRAM, clipping])
    with pytest.raises(AbortedError):
        net2.request(HISTOGRAM, {0: np.full(10, 600)})
    release = net2.request(HISTOGRAM, {0: np.full(10, 600), 1: np.zeros(10)}, round=1)
    assert release.contributors == (1,) and "BoundError" in release.refusals[0]
    release = net2.request(clipping, {0: np.full(10, 600), 1: np.zeros(10)})
    assert release.contributors == (0, 1) and release.clipped is None
    assert net2.participants[0].clipped >= 10  # the client knows what it clipped; the server does not
    # without a record sensitivity, the whole contribution (the box) is the sensitivity: more noise
    plain = StatisticDeclaration(name="label_histogram", length=10, bound=500, kind="int")
    boxed = StatisticsPrivacy({"default": StatisticPrivacy(epsilon=1.0)}).noisy_sum(
        plain, clients=10, contributors=10, ledger=PrivacyLedger())
    assert boxed is not None and boxed.sigma > 100 * noisy.sigma
    # model-sized update sums are never noised by [privacy.statistics] (DP-SGD protects updates)
    summed, release = net2.update_sum(MODEL_UPDATE, {0: torch.tensor([0.25, -0.5, 0.125]),
                                                     1: torch.tensor([0.25, 0.5, 0.0])})
    assert torch.equal(summed, torch.tensor([0.5, 0.0, 0.125]))
    assert release.epsilon is None and release.noise is None and MODEL_UPDATE not in net2.coordinator.noisy


def test_setup_releases_are_replayed_on_resume_not_recharged() -> None:
    privacy = StatisticsPrivacy({"default": StatisticPrivacy(epsilon=1.0, secure_mode=False)}, seed=1)
    once = StatisticDeclaration(name="prior", length=10, bound=500, per_round=False, record_sensitivity=1)
    inputs = {c: np.arange(10) * c for c in range(5)}
    first = StatsNet(make_plan(5, privacy=privacy), [once])
    total = first.request(once, inputs, round=0)
    assert total.value is not None and total.epsilon is not None
    state = json.loads(json.dumps(first.coordinator.state()))  # the server's checkpoint: plain JSON
    again = StatsNet(make_plan(5, privacy=privacy), [once])
    again.coordinator.load_state(state)
    replay = again.request(once, inputs, round=0)
    assert replay.value is not None and np.array_equal(replay.value, total.value)
    assert replay.contributors == total.contributors and len(again.transcript) == 0  # answered, not summed
    assert again.coordinator.ledger is not None and again.coordinator.ledger.count("prior") == 1
    with pytest.raises(PrivacyBudgetError):  # a genuinely new release of a once-per-run statistic
        again.request(once, {c: v + 1 for c, v in inputs.items()}, round=1)


def test_noisy_statistic_in_a_run_is_stored_per_round(reference: dict[str, Any]) -> None:
    rows = reference["rows"]
    eps = [r.privacy["total_samples"].epsilon for r in rows]
    assert eps[0] < eps[1] < eps[2] <= 2.0 + 1e-9 and eps[2] > 1.9  # 3 planned releases at ε = 2
    assert [r.privacy["total_samples"].releases for r in rows] == [1, 2, 3]
    assert all(r.privacy["total_samples"].delta == 1e-6 for r in rows)
    assert all(r.privacy["run"].epsilon > r.privacy["model"].epsilon for r in rows)
    with RunStore(reference["path"]) as store:
        declaration = store.declarations(reference["summary"].id)["total_samples"]
    assert declaration["record_sensitivity"] == 1 and declaration["privacy"]["mechanism"] == "skellam"
    assert reference["summary"].as_json()["privacy"]["statistics"]["total_samples"]["releases"] == 3


# --- the metrics channel --------------------------------------------------------------------------

class ProbeServer(FedAvgServer):
    """FedAvg's server half reporting numbers it knows: the step it took and a count of rounds."""

    def __init__(self, params: FedAvgParams, info: RunInfo) -> None:
        super().__init__(params, info)
        self.rounds = 0

    def aggregate(self, ctx: ServerRound) -> torch.Tensor:
        new = super().aggregate(ctx)
        ctx.metrics["update_norm"] = float(torch.linalg.vector_norm(new - ctx.global_vector))
        return new

    def after_round(self, ctx: ServerRound) -> None:
        self.rounds += 1

    def round_metrics(self) -> Mapping[str, float]:
        return {"cosine": 1.0 / self.rounds, "lambda_bar": float("nan")}


@register_algorithm("test_metrics_probe")
class MetricsProbe(Method):
    Params = FedAvgParams
    Server = ProbeServer
    Client = FedAvgClient


@pytest.fixture(autouse=True, scope="module")
def _unregister_probe():
    yield
    ALGORITHMS.pop("test_metrics_probe", None)


def test_method_metrics_are_stored_per_round_and_reported(tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    exp = experiment(rounds=2, per_round=2, extra='[method]\nname = "test_metrics_probe"')
    ws = tmp_path / "ws"
    with RunStore(ws / DB_NAME) as store:
        (summary,) = run_experiment(exp, store, device=CPU)
        rows = store.rounds(summary.id)
        assert store.round_metrics(summary.id)[1]["cosine"] == 0.5
    assert [r.metrics["cosine"] for r in rows] == [1.0, 0.5]
    assert all(r.metrics["lambda_bar"] is None and r.metrics["update_norm"] > 0 for r in rows)
    assert all(not r.privacy for r in rows)
    out = summary.as_json()
    assert "privacy" not in out
    assert out["metrics"]["final"]["cosine"] == 0.5 and out["metrics"]["tail"]["cosine"] == pytest.approx(0.75)
    table = format_rounds(summary)
    assert "cosine" in table and "update_norm" in table and "DP-SGD" not in table
    parser = argparse.ArgumentParser()
    runs_command.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["runs", "--workspace", str(ws), "--json"])
    assert args.func(args) == 0
    (listed,) = json.loads(capsys.readouterr().out)["runs"]
    assert listed["metrics"]["final"]["cosine"] == 0.5
    with pytest.raises(ValueError, match="metric name"):
        check_round_metrics({"bad name": 1.0}, source="m")
    with pytest.raises(TypeError, match="real number"):
        check_round_metrics({"flag": "yes"}, source="m")


# --- config and store -----------------------------------------------------------------------------

def test_privacy_config_is_validated_and_round_trips() -> None:
    exp = experiment(extra=DP + 'default = { epsilon = 4.0, level = "client", releases = 6 }\n')
    run = exp.runs[0]
    assert run.privacy.dp_sgd is not None and run.privacy.dp_sgd.noise_multiplier == 1.0
    assert set(run.privacy.statistics) == {"total_samples", "default"}
    assert type(run).from_dict(run.to_dict()).to_dict() == run.to_dict()
    assert "privacy" not in experiment(extra="").runs[0].to_dict()  # stored configs without DP unchanged
    for extra, message in [
        ("[privacy.dp_sgd]\nnoise_multiplier = 1.0\nclip = 1.0", "unknown key 'privacy.dp_sgd.clip' (did you mean 'clipping'?); known keys"),
        ("[privacy.dp_sgd]\nmax_grad_norm = 1.0", "exactly one of noise_multiplier and target_epsilon"),
        ("[privacy.dp_sgd]\ntarget_epsilon = -2.0", "privacy.dp_sgd.target_epsilon: must be positive"),
        ("[privacy]\nepsilon = 1.0", "unknown key 'privacy.epsilon'"),
        ("[privacy.statistics]\ntotal_samples = { epsilon = 1.0, eps = 2 }",
         "unknown key 'privacy.statistics.total_samples.eps'"),
        ("[privacy.statistics]\ntotal_samples = { delta = 1e-5 }", "missing key 'privacy.statistics.total_samples.epsilon'"),
        ("[privacy.statistics]\ntotal_samples = { epsilon = 1.0, level = \"user\" }", "level must be one of"),
    ]:
        with pytest.raises(ConfigError, match=re.escape(message)):
            experiment(extra=extra)


def test_target_epsilon_derives_the_noise_for_the_planned_rounds(digits) -> None:
    from secure_fl.runtime import build_simulation

    exp = experiment(rounds=5, extra="[privacy.dp_sgd]\ntarget_epsilon = 3.0\nsecure_mode = false")
    sim = build_simulation(exp.runs[0], device=CPU, dataset=digits)
    cfg = sim.dp_sgd_config
    assert cfg is not None and cfg.noise_multiplier > 0.5
    from secure_fl.privacy.dpsgd import sample_rate

    worst = 0.0
    for node in sim.nodes.values():  # every client trained in all 5 rounds stays within the target
        q = sample_rate(node.data.num_samples, 32)
        state = DPSGDState(history=[(cfg.noise_multiplier, q, 5 * round(1 / q))])
        worst = max(worst, state.epsilon(1e-5))
    assert 2.9 < worst <= 3.0 + 1e-6
    assert sim.stats.ledger is None and sim.privacy_guarantees() == {}  # nothing trained or released yet


def test_schema_1_store_is_migrated_in_place(tmp_path: Path) -> None:
    path = tmp_path / DB_NAME
    con = sqlite3.connect(path)
    con.executescript("""
        CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
        INSERT INTO meta VALUES ('schema', '1');
        CREATE TABLE batches (id TEXT PRIMARY KEY, name TEXT NOT NULL, source TEXT NOT NULL, created REAL NOT NULL);
        CREATE TABLE runs (id TEXT PRIMARY KEY, batch_id TEXT NOT NULL REFERENCES batches(id),
            position INTEGER NOT NULL, name TEXT NOT NULL, label TEXT NOT NULL, config TEXT NOT NULL,
            method TEXT NOT NULL, loss TEXT NOT NULL, protocol TEXT NOT NULL, update_protocol TEXT NOT NULL,
            seed INTEGER NOT NULL, rounds INTEGER NOT NULL, rounds_done INTEGER NOT NULL DEFAULT 0,
            status TEXT NOT NULL, device TEXT, created REAL NOT NULL, updated REAL NOT NULL);
        CREATE TABLE rounds (run_id TEXT NOT NULL REFERENCES runs(id), round INTEGER NOT NULL, accuracy REAL,
            minority_accuracy REAL, auc REAL, train_loss REAL, test_loss REAL, per_class TEXT NOT NULL,
            clients TEXT NOT NULL, clipped INTEGER NOT NULL DEFAULT 0, seconds REAL NOT NULL,
            PRIMARY KEY (run_id, round));
        CREATE TABLE checkpoints (run_id TEXT PRIMARY KEY, round INTEGER NOT NULL, model BLOB NOT NULL,
            algorithm BLOB NOT NULL, selection BLOB NOT NULL);
        INSERT INTO batches VALUES ('b1', 'old', 'old.toml', 0);
        INSERT INTO runs VALUES ('r1', 'b1', 0, 'old', '', '{}', 'fedavg', 'ce', 'plain', 'clear', 0, 2, 1,
                                 'running', 'cpu', 0, 0);
        INSERT INTO rounds VALUES ('r1', 0, 0.5, NULL, 0.7, 1.0, 1.1, '[0.5]', '[0, 1]', 0, 0.1);
        INSERT INTO checkpoints VALUES ('r1', 0, X'01', X'02', X'03');
    """)
    con.commit()
    con.close()
    with RunStore(path) as store:
        (row,) = store.rounds("r1")
        assert row.accuracy == 0.5 and row.metrics == {} and row.privacy == {}
        checkpoint = store.checkpoint("r1")
        assert checkpoint is not None and checkpoint.model == b"\x01" and checkpoint.privacy == b""
    con = sqlite3.connect(path)
    try:
        assert con.execute("SELECT value FROM meta WHERE key = 'schema'").fetchone()[0] == str(SCHEMA_VERSION)
        assert "privacy" in {r[1] for r in con.execute("PRAGMA table_info(checkpoints)")}
    finally:
        con.close()
    with RunStore(path) as store:  # opening again is a no-op
        assert store.rounds("r1")[0].accuracy == 0.5
