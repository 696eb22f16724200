"""Failures are contained and clipping is reported: a failing run is marked failed with its reason,
the batch goes on (``--fail-fast`` stops it), finished runs are printed, the exit code is 1; the
fraction of clipped values per statistic is in the JSON, the table and the store, with one warning
per run above 1 %."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from secure_fl.cli import main
from secure_fl.config import parse_config
from secure_fl.store import DB_NAME, RunStore

from .test_cli_run import CONFIG

SWEEP = '[sweep]\nmethod = ["fedavg", "fedprox"]\ndata.minority_classes = [[1], [12]]'
"""Runs 2 and 4 fail when they start: digits has no class 12."""


def config(tmp_path: Path, *, sweep: str = SWEEP, rounds: int = 1, extra: str = "") -> Path:
    path = tmp_path / "cfg.toml"
    text = CONFIG.format(rounds=rounds, per_round=4, protocol="plain", minority="", sweep=sweep)
    path.write_text(text.replace("[secure.paillier]", extra + "\n[secure.paillier]"))
    return path


@pytest.fixture(autouse=True)
def _threads() -> Iterator[None]:
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


class Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def records() -> Iterator[Records]:
    handler = Records()
    logger = logging.getLogger("secure_fl")
    logger.addHandler(handler)
    yield handler
    logger.removeHandler(handler)


def test_a_failing_run_is_marked_and_the_batch_goes_on(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ws = tmp_path / "ws"
    code = main(["run", str(config(tmp_path)), "--workspace", str(ws), "--threads", "1", "--json"])
    assert code == 1
    captured = capsys.readouterr()
    runs = json.loads(captured.out)["runs"]
    assert [r["status"] for r in runs] == ["done", "failed", "done", "failed"]
    assert runs[1]["error"] == "ValueError: minority_classes [12] outside 0..9" and runs[0]["error"] is None
    assert "Traceback" not in captured.err
    errors = [line for line in captured.err.splitlines() if line.startswith("error:")]
    assert len(errors) == 3  # one per failed run, then the batch's
    assert errors[-1].startswith("error: 2 of 4 runs failed") and f"--resume {runs[1]['id']}" in errors[-1]
    with RunStore.open_readonly(ws / DB_NAME) as store:
        stored = {r.id: r for r in store.list_runs()}
    assert stored[runs[1]["id"]].status == "failed"
    assert stored[runs[1]["id"]].error == "ValueError: minority_classes [12] outside 0..9"
    # the table says which runs failed and why
    assert main(["runs", "--workspace", str(ws)]) == 0
    listing = capsys.readouterr().out
    assert f"run {runs[1]['id']} failed: ValueError: minority_classes [12] outside 0..9" in listing


def test_fail_fast_stops_the_batch_and_prints_what_finished(tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    ws = tmp_path / "ws"
    assert main(["run", str(config(tmp_path)), "--workspace", str(ws), "--threads", "1", "--fail-fast"]) == 1
    captured = capsys.readouterr()
    assert "status" in captured.out and "done" in captured.out and "failed" in captured.out
    assert "2 not started (--fail-fast)" in captured.err
    with RunStore.open_readonly(ws / DB_NAME) as store:
        assert sorted(r.status for r in store.list_runs()) == ["done", "failed", "pending", "pending"]


def test_a_traceback_only_with_debug(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                     records: Records) -> None:
    sweep = '[sweep]\ndata.minority_classes = [[12]]'
    assert main(["run", str(config(tmp_path, sweep=sweep)), "--workspace", str(tmp_path / "a"), "--threads", "1"]) == 1
    assert "Traceback" not in capsys.readouterr().err
    assert main(["run", str(config(tmp_path, sweep=sweep)), "--workspace", str(tmp_path / "b"), "--threads", "1",
                 "--debug", "-v"]) == 1
    assert "Traceback" in capsys.readouterr().err


def test_an_interrupted_run_is_marked_and_named(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    from secure_fl.cli import run as run_module

    def interrupt(self: object, run: object, row: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(run_module._Progress, "round_finished", interrupt)
    ws = tmp_path / "ws"
    assert main(["run", str(config(tmp_path, sweep="", rounds=2)), "--workspace", str(ws), "--threads", "1"]) == 130
    err = capsys.readouterr().err
    assert "Traceback" not in err
    with RunStore.open_readonly(ws / DB_NAME) as store:
        (run,) = store.list_runs()
    assert run.status == "failed" and run.error == "interrupted" and run.rounds_done == 1
    assert f"interrupted during run {run.id}; continue the batch with: secure-fl run" in err
    assert f"--resume {run.id}" in err


def test_clipping_is_counted_reported_and_warned_once(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                      records: Records) -> None:
    extra = 'update_protocol = "plain"\nupdate_clip = 1e-6'
    path = config(tmp_path, sweep="", rounds=2, extra=extra)
    assert main(["run", str(path), "--workspace", str(tmp_path / "ws"), "--threads", "1", "--json"]) == 0
    (run,) = json.loads(capsys.readouterr().out)["runs"]
    update = run["statistics"]["model_update"]
    assert update["values"] > 0 and update["clipped"] > 0.5 * update["values"]
    assert update["clipped_fraction"] == pytest.approx(update["clipped"] / update["values"])
    assert run["statistics"]["total_samples"]["clipped_fraction"] == 0.0
    warnings = [r.getMessage() for r in records.records if r.levelno == logging.WARNING and "clipped" in r.getMessage()]
    assert len(warnings) == 1  # once per run, not per round
    assert "model_update" in warnings[0] and "secure.update_clip" in warnings[0]
    # the table's clipped column
    assert main(["runs", "--workspace", str(tmp_path / "ws")]) == 0
    assert "model_update:" in capsys.readouterr().out


def test_no_warning_below_one_percent(tmp_path: Path, capsys: pytest.CaptureFixture[str], records: Records) -> None:
    path = config(tmp_path, sweep="", rounds=1, extra='update_protocol = "plain"\nupdate_clip = 1.0')
    assert main(["run", str(path), "--workspace", str(tmp_path / "ws"), "--threads", "1", "--json"]) == 0
    (run,) = json.loads(capsys.readouterr().out)["runs"]
    assert run["statistics"]["model_update"]["clipped_fraction"] < 0.01
    assert not [r for r in records.records if "clipped" in r.getMessage()]


def test_set_overrides_every_run_and_replaces_a_sweep(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = config(tmp_path, sweep='[sweep]\nmethod = ["fedavg", "fedprox"]').read_text()
    exp = parse_config(text, assignments=[("train.rounds", "2"), ("secure.protocol", "paillier")])
    assert [r.train.rounds for r in exp.runs] == [2, 2] and {r.secure.protocol for r in exp.runs} == {"paillier"}
    (run,) = parse_config(text, assignments=[("method", "climb")]).runs  # the sweep over method is gone
    assert run.method.name == "climb" and run.label == ""
    (run,) = parse_config(text, assignments=[("method", '{ name = "fedprox", mu = 0.5 }')]).runs
    assert run.method.params == {"mu": 0.5}
    assert main(["run", str(tmp_path / "cfg.toml"), "--set", "trian.rounds=2", "--workspace", str(tmp_path)]) == 2
    assert "--set trian.rounds: unknown key 'trian' (did you mean 'train'?)" in capsys.readouterr().err
    assert main(["run", str(tmp_path / "cfg.toml"), "--set", "train.rounds=0", "--workspace", str(tmp_path)]) == 2
    assert "train.rounds: must be >= 1, got 0" in capsys.readouterr().err
