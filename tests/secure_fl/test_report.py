"""The report core (loading runs, RunRecord, helpers, the table registry, `secure-fl report`)
and FedShift's paper tables, on stores filled with known curves and on one real run."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from secure_fl.cli import report as report_command
from secure_fl.config import RunConfig, parse_config
from secure_fl.report import (
    SUMMARIES,
    TABLES,
    MissingRunsError,
    ReportError,
    RunRecord,
    TableContext,
    build_report,
    format_mean_std,
    get_table,
    load_runs,
    markdown_table,
    mean_std,
    pivot,
    register_table,
    rounds_to_reach,
    row_labeler,
    speedup,
    summary_value,
)
from secure_fl.store import Checkpoint, RoundRow, RunStore

PNG = b"\x89PNG\r\n\x1a\n"

CONFIG = """
name = "report-test"
seed = 0
tail_rounds = 2
[data]
dataset = "digits"
num_clients = 4
partition = "dirichlet"
partition_params = {{ alpha = 0.1 }}
[model]
name = "mlp"
hidden = [8]
[train]
rounds = {rounds}
clients_per_round = 4
local_epochs = 1
[sweep]
method = ["fedavg", {{ name = "fedprox", mu = 0.01 }}, "scaffold", "fedshift", "reweighting"]
seed = [0, 1]
{extra}
"""

# Accuracy per round for each method (seed 1 adds +0.01): FedShift reaches FedAvg's final
# accuracy at round 3 of 6, FedProx at round 6, SCAFFOLD never.
CURVES = {
    "fedavg": [0.30, 0.50, 0.60, 0.65, 0.68, 0.70],
    "fedprox": [0.30, 0.50, 0.60, 0.65, 0.68, 0.71],
    "scaffold": [0.20, 0.40, 0.50, 0.55, 0.60, 0.62],
    "fedshift": [0.50, 0.65, 0.72, 0.75, 0.76, 0.78],
    "reweighting": [0.10, 0.20, 0.30, 0.35, 0.40, 0.40],
}


def _describe(config: RunConfig) -> dict[str, Any]:
    return {"name": config.name, "label": config.label, "config": config.to_dict(), "method": config.method.name,
            "loss": config.loss.name, "protocol": config.secure.protocol,
            "update_protocol": config.secure.update_protocol, "seed": config.seed, "rounds": config.train.rounds}


def fill(store: RunStore, text: str, *, rounds: int = 6, shift: float = 0.0) -> list[str]:
    """Store a config's runs as finished, with the accuracies of CURVES (no training)."""
    experiment = parse_config(text, source="<test>")
    _, ids = store.create_batch(name=experiment.name, source="<test>", runs=[_describe(c) for c in experiment.runs])
    for run_id, config in zip(ids, experiment.runs):
        curve = CURVES[config.method.name]
        extra = 0.01 * config.seed + shift
        for r in range(rounds):
            acc = curve[r] + extra
            row = RoundRow(round=r, accuracy=acc, minority_accuracy=None, auc=None, train_loss=1.0, test_loss=1.0,
                           per_class_accuracy=[acc] * 10, clients=[0, 1, 2, 3], clipped=0, seconds=0.1,
                           bytes={"model_update": 100})
            store.record_round(run_id, row, Checkpoint(round=r, model=b"m", algorithm=b"a", selection=b"s"))
        store.set_status(run_id, "done")
    return ids


@pytest.fixture()
def filled(tmp_path: Path) -> tuple[Path, Path, list[str]]:
    workspace = tmp_path / "ws"
    config = tmp_path / "table1.toml"
    config.write_text(CONFIG.format(rounds=6, extra=""))
    with RunStore.open_workspace(workspace) as store:
        ids = fill(store, config.read_text())
    return workspace, config, ids


# --- helpers --------------------------------------------------------------------------------------

def test_package_reexports_exactly_the_core_api() -> None:
    # secure_fl.report re-exports core through `import *`: the same names, the same objects
    import secure_fl.report
    import secure_fl.report.core

    assert set(secure_fl.report.__all__) == set(secure_fl.report.core.__all__)
    for name in secure_fl.report.__all__:
        assert getattr(secure_fl.report, name) is getattr(secure_fl.report.core, name)


def test_helpers() -> None:
    assert markdown_table(["a", "b"], [["x", 1.5], ["y|z", None]]) == \
        "| a | b |\n| :--- | ---: |\n| x | 1.5 |\n| y\\|z | — |\n"
    with pytest.raises(ReportError):
        markdown_table(["a"], [[1, 2]])
    mean, std, n = mean_std([0.8, 0.82, None, float("nan")])
    assert n == 2 and mean == pytest.approx(0.81) and std == pytest.approx(math.sqrt(2e-4))
    assert format_mean_std([0.8, 0.82]) == "81.00 ± 1.41" and format_mean_std([0.5]) == "50.00"
    assert format_mean_std([]) == "—" and math.isnan(mean_std([])[0])
    assert rounds_to_reach([0.1, 0.5, 0.7], 0.5) == 2 and rounds_to_reach([0.1, np.nan], 0.5) is None
    assert rounds_to_reach([0.1, 0.6999999999999], 0.7) == 2  # float noise does not miss the target
    assert speedup(100, 23) == pytest.approx(4.3478, abs=1e-4) and speedup(100, None) is None


# --- loading --------------------------------------------------------------------------------------

def test_load_by_config_ids_batch_and_name(filled: tuple[Path, Path, list[str]]) -> None:
    workspace, config, ids = filled
    by_config = load_runs(str(config), workspace=workspace)
    assert [r.id for r in by_config] == ids
    assert [r.id for r in load_runs(",".join(ids[:3]), workspace=workspace)] == ids[:3]
    assert [r.id for r in load_runs(ids[:2], workspace=workspace)] == ids[:2]
    with RunStore.open_workspace(workspace) as store:
        batch = store.run(ids[0]).batch_id
        assert [r.id for r in load_runs(batch, store=store)] == ids
        assert [r.id for r in load_runs("report-test", store=store)] == ids
        with pytest.raises(ReportError, match="not a config file"):
            load_runs("nothing-by-that-name", store=store)


def test_run_record_view(filled: tuple[Path, Path, list[str]]) -> None:
    from secure_fl.runtime import summarize

    workspace, _, ids = filled
    [run] = load_runs(ids[1], workspace=workspace)  # fedavg, seed 1
    assert (run.method, run.method_label, run.seed, run.rounds, run.tail_rounds) == ("fedavg", "FedAvg", 1, 6, 2)
    assert run.final["accuracy"] == pytest.approx(0.71)
    assert run.tail["accuracy"] == pytest.approx((0.69 + 0.71) / 2)
    np.testing.assert_allclose(run.curve(), np.array(CURVES["fedavg"]) + 0.01)
    assert run.param("data.partition_params.alpha") == 0.1 and run.param("nope", None) is None
    with pytest.raises(ReportError):
        run.param("train.nope")
    assert run.bytes_total == 600
    with RunStore.open_workspace(workspace) as store:  # the same summary as `secure-fl run --json`
        summary = summarize(store, ids[1])
    assert run.final == summary.final and run.tail == summary.tail


def test_best_is_each_metric_at_its_best_round(tmp_path: Path) -> None:
    """The FedShift paper's summary: the peak, not the end; a NaN round is skipped, not propagated."""
    experiment = parse_config(CONFIG.format(rounds=4, extra=""), source="<test>")
    config = experiment.runs[0]
    with RunStore.open_workspace(tmp_path / "ws") as store:
        _, [run_id] = store.create_batch(name="best", source="<test>", runs=[_describe(config)])
        for r, (acc, auc) in enumerate([(0.5, 0.9), (0.8, 0.7), (float("nan"), 0.95), (0.6, 0.8)]):
            row = RoundRow(round=r, accuracy=acc, minority_accuracy=None, auc=auc, train_loss=1.0, test_loss=1.0,
                           per_class_accuracy=[float(r)] * 10, clients=[0], clipped=0, seconds=0.1)
            store.record_round(run_id, row, Checkpoint(round=r, model=b"m", algorithm=b"a", selection=b"s"))
        store.set_status(run_id, "done")
    [run] = load_runs(run_id, workspace=tmp_path / "ws")
    assert run.best["accuracy"] == 0.8 and run.best["auc"] == 0.95 and run.best["minority_accuracy"] is None
    assert run.best["per_class_accuracy"] == [1.0] * 10  # the best-accuracy round's
    assert summary_value(run, "best") == 0.8 and summary_value(run, "final") == 0.6
    with pytest.raises(ReportError, match="metric must be one of"):
        summary_value(run, "median")


def test_config_matching_reports_missing_runs_and_picks_the_newest(filled: tuple[Path, Path, list[str]],
                                                                   tmp_path: Path) -> None:
    workspace, config, _ = filled
    bigger = tmp_path / "bigger.toml"
    bigger.write_text(CONFIG.format(rounds=6, extra="").replace("seed = [0, 1]", "seed = [0, 1, 2]"))
    with pytest.raises(MissingRunsError) as error:
        load_runs(str(bigger), workspace=workspace)
    assert len(error.value.missing) == 5
    assert len(load_runs(str(bigger), workspace=workspace, allow_missing=True)) == 10
    # the same config run again: the newer runs replace the older ones
    with RunStore.open_workspace(workspace) as store:
        newer = fill(store, config.read_text(), shift=0.05)
    assert [r.id for r in load_runs(str(config), workspace=workspace)] == newer


# --- the registry ---------------------------------------------------------------------------------

def test_register_table_and_plugins() -> None:
    @register_table("test-only-table", title="a test table")
    def formatter(runs: Any, ctx: TableContext) -> Any:
        raise AssertionError("not called")

    assert get_table("test-only-table").title == "a test table"
    for name in ("runs", "fedshift-table1", "fedshift-table2", "fedshift-table3", "fedshift-table4",
                 "fedshift-table5"):
        assert get_table(name).name == name
    with pytest.raises(ReportError, match="unknown table"):
        get_table("no-such-table")
    del TABLES["test-only-table"]


def test_row_labeler_splits_rows_only_where_configs_differ(tmp_path: Path) -> None:
    text = CONFIG.format(rounds=3, extra="").replace(
        'method = ["fedavg", { name = "fedprox", mu = 0.01 }, "scaffold", "fedshift", "reweighting"]',
        'method = ["fedavg", { name = "fedprox", mu = 0.01 }, { name = "fedprox", mu = 0.1 }]')
    with RunStore.open_workspace(tmp_path) as store:
        fill(store, text, rounds=3)
        runs = load_runs("report-test", store=store)
    label = row_labeler(runs)
    assert sorted({label(r) for r in runs}) == ["FedAvg", "FedProx (mu=0.01)", "FedProx (mu=0.1)"]
    md, data = pivot(runs, row=label, column="data.dataset")
    assert "FedProx (mu=0.1)" in md and data["FedAvg"]["digits"]["n"] == 2


# --- FedShift's tables ----------------------------------------------------------------------------

def test_fedshift_table1_and_figure(filled: tuple[Path, Path, list[str]], tmp_path: Path) -> None:
    workspace, config, _ = filled
    out = tmp_path / "out"
    report, _ = build_report(str(config), "fedshift-table1", out_dir=out, workspace=workspace)
    lines = report.markdown.splitlines()
    header = next(line for line in lines if line.startswith("| Methods"))
    assert header == "| Methods | digits |"
    rows = [line.split(" | ")[0].lstrip("| ") for line in lines
            if line.startswith("| ") and "---" not in line and not line.startswith("| Methods")]
    assert rows[:5] == ["FedAvg", "FedProx", "SCAFFOLD", "FedShift", "Reweighting"]  # the paper's order
    # tail (2 rounds) of FedShift: seeds 0 and 1 → 77.00 and 78.00
    assert "| FedShift | 77.50 ± 0.71 |" in report.markdown
    assert "| FedShift | +8.00 |" in report.markdown  # difference to FedAvg: 77.50 − 69.50
    assert report.data["accuracy"]["FedShift"]["digits"]["n"] == 2
    assert (out / "fedshift-table1.md").read_text() == report.markdown
    assert [p.name for p in report.figures] == ["fedshift_fig1_digits.png"]
    assert report.figures[0].read_bytes().startswith(PNG)


def test_fedshift_table2_rounds_and_speedup(filled: tuple[Path, Path, list[str]]) -> None:
    workspace, config, _ = filled
    report, _ = build_report(str(config), "fedshift-table2", metric="final", workspace=workspace)
    methods = next(iter(report.data.values()))["methods"]
    # target: FedAvg's final accuracy, mean of seeds = 0.705; seed-mean curves:
    assert methods["FedAvg"]["rounds"] == 6 and methods["FedAvg"]["speedup"] == 1.0
    assert methods["FedShift"]["rounds"] == 3 and methods["FedShift"]["speedup"] == 2.0
    assert methods["FedProx"]["rounds"] == 6
    assert methods["SCAFFOLD"]["rounds"] is None and methods["SCAFFOLD"]["speedup"] is None
    # the best seed-mean round says how far a method that never gets there stays from the target
    assert methods["SCAFFOLD"]["best"] == pytest.approx(0.625) and methods["SCAFFOLD"]["best_round"] == 6
    assert "| FedShift | 3 | 2.00× | 78.50 (6) |" in report.markdown
    assert "| SCAFFOLD | — | < 1× | 62.50 (6) |" in report.markdown


def test_fedshift_sweep_tables(tmp_path: Path) -> None:
    with RunStore.open_workspace(tmp_path / "ws") as store:
        base = CONFIG.format(rounds=6, extra="").replace("seed = [0, 1]", "seed = [0]")
        for epochs in (1, 5):
            fill(store, base.replace("local_epochs = 1", f"local_epochs = {epochs}"))
        for alpha in (0.1, 0.5):
            fill(store, base.replace("alpha = 0.1", f"alpha = {alpha}").replace("report-test", "t4"))
        for n in (4, 8):
            fill(store, base.replace("num_clients = 4", f"num_clients = {n}").replace("report-test", "t5"))
        out = tmp_path / "out"
        r3, _ = build_report("report-test", "fedshift-table3", store=store, out_dir=out)
        r4, _ = build_report("t4", "fedshift-table4", store=store)
        r5, _ = build_report("t5", "fedshift-table5", store=store)
    assert "| Methods | E=1 | E=5 |" in r3.markdown
    assert "| Methods | α=0.1 | α=0.5 |" in r4.markdown
    assert "| Methods | N=4,C=1 | N=8,C=0.5 |" in r5.markdown
    assert sorted(p.name for p in r3.figures) == ["table3_digits_e1.png", "table3_digits_e5.png"]


# --- the command ----------------------------------------------------------------------------------

def cli(*argv: str) -> int:
    parser = argparse.ArgumentParser(prog="secure-fl")
    sub = parser.add_subparsers(dest="command", required=True)
    report_command.register(sub)
    args = parser.parse_args(list(argv))
    return int(args.func(args))


def test_cli_json_markdown_and_errors(filled: tuple[Path, Path, list[str]], tmp_path: Path,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    workspace, config, ids = filled
    assert cli("report", str(config), "--table", "fedshift-table1", "--workspace", str(workspace),
               "--out", str(tmp_path / "o"), "--json") == 0
    out = capsys.readouterr().out
    assert out.count("\n") == 1
    data = json.loads(out)
    assert data["table"] == "fedshift-table1" and data["metric"] == "tail"
    assert [r["id"] for r in data["runs"]] == ids and data["figures"]
    assert cli("report", *ids[:2], "--workspace", str(workspace)) == 0
    text = capsys.readouterr().out
    assert text.startswith("| run | name |") and ids[0] in text
    assert cli("report", "--list", "--json") == 0
    assert "fedshift-table2" in {t["name"] for t in json.loads(capsys.readouterr().out)["tables"]}
    assert cli("report", "nope", "--workspace", str(workspace), "--json") == 1
    assert "error" in json.loads(capsys.readouterr().out)
    assert cli("report", str(config), "--table", "nope", "--workspace", str(workspace)) == 1
    assert "unknown table" in capsys.readouterr().err
    assert cli("report", str(config), "--table", "fedshift-table1", "--metric", "best", "--workspace",
               str(workspace), "--json") == 0
    assert json.loads(capsys.readouterr().out)["metric"] == "best"
    metric_flag = next(a for a in _parser_actions() if a.dest == "metric")
    assert tuple(metric_flag.choices or ()) == SUMMARIES  # the literal list in the CLI follows the core


def _parser_actions() -> list[argparse.Action]:
    parser = argparse.ArgumentParser(prog="secure-fl")
    sub = parser.add_subparsers(dest="command", required=True)
    report_command.register(sub)
    return list(sub.choices["report"]._actions)


@pytest.mark.slow
def test_report_of_a_real_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`secure-fl run` then `secure-fl report` on the same config file."""
    pytest.importorskip("sklearn")
    from secure_fl.cli import run as run_command

    config = tmp_path / "real.toml"
    config.write_text(CONFIG.format(rounds=2, extra="").replace(
        'method = ["fedavg", { name = "fedprox", mu = 0.01 }, "scaffold", "fedshift", "reweighting"]',
        'method = ["fedavg", "fedshift"]').replace("seed = [0, 1]", "seed = [0]"))
    parser = argparse.ArgumentParser(prog="secure-fl")
    sub = parser.add_subparsers(dest="command", required=True)
    run_command.register(sub)
    report_command.register(sub)
    import torch

    threads = torch.get_num_threads()
    try:
        args = parser.parse_args(["run", str(config), "--json", "--workspace", str(tmp_path / "ws"), "--threads", "1"])
        assert args.func(args) == 0
    finally:
        torch.set_num_threads(threads)
    ran = json.loads(capsys.readouterr().out)["runs"]
    args = parser.parse_args(["report", str(config), "--table", "fedshift-table1", "--workspace",
                              str(tmp_path / "ws"), "--json"])
    assert args.func(args) == 0
    data = json.loads(capsys.readouterr().out)
    assert [r["id"] for r in data["runs"]] == [r["id"] for r in ran]
    for mine, theirs in zip(data["runs"], ran):
        assert mine["tail"] == theirs["tail"] and mine["final"] == theirs["final"]
    runs = load_runs(str(config), workspace=tmp_path / "ws")
    assert isinstance(runs[0], RunRecord) and runs[1].method == "fedshift"
