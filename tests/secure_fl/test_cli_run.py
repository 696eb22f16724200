"""`secure-fl run` and `secure-fl runs`: the JSON contract, tables, errors, and resume after SIGKILL."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from secure_fl.cli import run as run_command
from secure_fl.cli import runs as runs_command
from secure_fl.store import DB_NAME, RunStore
from tests.secure_fl.test_data import _write_cifar

ROOT = Path(__file__).resolve().parents[2]

CONFIG = """
name = "cli-test"
seed = 0
tail_rounds = 2
[data]
dataset = "digits"
num_clients = 4
partition = "dirichlet"
partition_params = {{ alpha = 1.0 }}
{minority}
[model]
name = "mlp"
hidden = [16]
[train]
rounds = {rounds}
clients_per_round = {per_round}
batch_size = 16
lr = 0.05
[secure]
protocol = "{protocol}"
[secure.paillier]
key_bits = 1024
allow_weak_keys = true
{sweep}
"""


def write_config(tmp_path: Path, *, rounds: int = 3, per_round: int = 4, protocol: str = "plain",
                 minority: str = "", sweep: str = "", name: str = "cfg.toml") -> Path:
    path = tmp_path / name
    path.write_text(CONFIG.format(rounds=rounds, per_round=per_round, protocol=protocol, minority=minority,
                                  sweep=sweep))
    return path


def cli(*argv: str) -> int:
    parser = argparse.ArgumentParser(prog="secure-fl")
    sub = parser.add_subparsers(dest="command", required=True)
    run_command.register(sub)
    runs_command.register(sub)
    args = parser.parse_args(list(argv))
    before = torch.get_num_threads()
    try:
        return int(args.func(args))
    finally:
        torch.set_num_threads(before)


def test_json_contract(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = write_config(tmp_path, sweep='[sweep]\nmethod = ["fedavg", "reweighting"]')
    assert cli("run", str(cfg), "--json", "--workspace", str(tmp_path / "ws"), "--threads", "1") == 0
    out = json.loads(capsys.readouterr().out)
    assert [r["method"] for r in out["runs"]] == ["fedavg", "reweighting"]
    for run in out["runs"]:
        assert {"id", "method", "loss", "protocol", "rounds", "final", "tail", "bytes"} <= set(run)
        assert run["loss"] == "ce" and run["protocol"] == "plain" and run["rounds"] == 3
        for key in ("final", "tail"):
            metrics = run[key]
            assert set(metrics) == {"accuracy", "minority_accuracy", "auc", "per_class_accuracy"}
            assert 0.0 <= metrics["accuracy"] <= 1.0 and 0.0 <= metrics["auc"] <= 1.0
            assert metrics["minority_accuracy"] is None  # no minority set defined
            assert len(metrics["per_class_accuracy"]) == 10
            assert all(0.0 <= v <= 1.0 for v in metrics["per_class_accuracy"])
        assert run["bytes"]["total"] == sum(run["bytes"]["by_statistic"].values()) > 0
    with RunStore(tmp_path / "ws" / DB_NAME) as store:
        rows = store.rounds(out["runs"][0]["id"])
        tail = sum(r.accuracy for r in rows[-2:]) / 2
    assert out["runs"][0]["tail"]["accuracy"] == pytest.approx(tail)
    assert out["runs"][0]["final"]["accuracy"] == rows[-1].accuracy


def test_tables_and_runs_listing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = write_config(tmp_path, rounds=2, minority="minority_classes = [3]")
    ws = str(tmp_path / "ws")
    assert cli("run", str(cfg), "--workspace", ws, "--threads", "1") == 0
    out = capsys.readouterr().out
    assert "round  accuracy  minority" in out and "tail2 acc" in out and "fedavg" in out
    assert cli("runs", "--workspace", ws) == 0
    listing = capsys.readouterr().out
    assert "done" in listing and "2/2" in listing
    assert cli("runs", "--workspace", ws, "--json") == 0
    (run,) = json.loads(capsys.readouterr().out)["runs"]
    assert run["status"] == "done" and run["final"]["minority_accuracy"] is not None
    assert cli("runs", "--workspace", str(tmp_path / "empty"), "--json") == 0
    assert json.loads(capsys.readouterr().out) == {"runs": []}


def test_errors_exit_2_and_name_the_problem(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text(write_config(tmp_path).read_text().replace("lr = 0.05", "lr = -1.0"))
    assert cli("run", str(bad), "--workspace", str(tmp_path / "ws")) == 2
    assert "train.lr: must be positive" in capsys.readouterr().err
    cfg = write_config(tmp_path, rounds=1)
    assert cli("run", str(cfg), "--workspace", str(tmp_path / "ws"), "--resume", "feedbeef") == 2
    assert "no run 'feedbeef'" in capsys.readouterr().err
    assert cli("run", str(cfg), "--workspace", str(tmp_path / "ws"), "--threads", "zero") == 2
    assert "--threads" in capsys.readouterr().err



def _outcomes(runs: list[dict[str, object]]) -> list[tuple[object, ...]]:
    return [(r["method"], r["seed"], r["status"], r["final"], r["tail"], r["bytes"]) for r in runs]


def test_jobs_play_the_same_runs_side_by_side(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--jobs 2: the batch's runs in two worker processes give the runs of --jobs 1, to the bit,
    in the batch's order, and no worker outlives the command."""
    import multiprocessing

    cfg = write_config(tmp_path, rounds=2, protocol="masking", sweep='[sweep]\nseed = [0, 1]\nmethod = ["fedavg", "climb"]')
    assert cli("run", str(cfg), "--json", "--workspace", str(tmp_path / "one"), "--threads", "1") == 0
    one = json.loads(capsys.readouterr().out)["runs"]
    assert cli("run", str(cfg), "--json", "--workspace", str(tmp_path / "two"), "--threads", "1", "--jobs", "2") == 0
    captured = capsys.readouterr()
    two = json.loads(captured.out)["runs"]
    assert len(two) == 4 and _outcomes(two) == _outcomes(one)
    assert all(r["status"] == "done" for r in two)
    assert multiprocessing.active_children() == []
    with RunStore(tmp_path / "two" / DB_NAME) as store:  # every round stored, as in turn
        assert all(len(store.rounds(r["id"])) == 2 for r in two)


def test_jobs_go_on_after_a_failed_run_and_resume(tmp_path: Path, capfd: pytest.CaptureFixture[str],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """A run that fails in its worker is marked failed, the others finish, the command exits 1
    with the resume command; after the cause is fixed --resume --jobs plays only the failed run."""
    monkeypatch.setenv("SECURE_FL_CIFAR10", str(tmp_path / "missing"))
    cfg = write_config(tmp_path, rounds=1, sweep='[sweep]\ndata.dataset = ["digits", "cifar10"]\nseed = [0, 1]')
    ws = str(tmp_path / "ws")
    assert cli("run", str(cfg), "--json", "--workspace", ws, "--threads", "1", "--jobs", "2") == 1
    captured = capfd.readouterr()
    runs = json.loads(captured.out)["runs"]
    assert [r["status"] for r in runs] == ["done", "done", "failed", "failed"]
    assert "CIFAR-10 not found" in captured.err and "--resume" in captured.err  # the workers' lines, the command's
    assert captured.err.count("Traceback") == 0
    _write_cifar(tmp_path / "missing", per_batch=20)  # the cause fixed: the files are there now
    assert cli("run", str(cfg), "--json", "--workspace", ws, "--threads", "1", "--jobs", "2",
               "--resume", runs[2]["id"]) == 0
    resumed = json.loads(capfd.readouterr().out)["runs"]
    assert [r["id"] for r in resumed] == [r["id"] for r in runs] and all(r["status"] == "done" for r in resumed)
    assert _outcomes(resumed[:2]) == _outcomes(runs[:2])  # the finished runs were not played again



def _session_ends(group: int, *, within: float) -> bool:
    """Whether every process of ``group`` is gone within ``within`` seconds (multiprocessing's
    resource tracker leaves once it reads the command's end)."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            os.killpg(group, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    os.killpg(group, signal.SIGKILL)
    return False


@contextlib.contextmanager
def _sigint_as_in_a_terminal() -> Iterator[None]:
    """Start the command with a foreground job's SIGINT: a test session started in the background
    (``cmd &`` without job control) has SIGINT ignored, a child would inherit that and never see
    Ctrl-C. A handled signal is reset to the default in the child, where Python installs its own."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


@pytest.mark.parametrize("target", ["group", "command"])
def test_jobs_interrupted_mark_their_runs_and_resume(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                     target: str) -> None:
    """Ctrl-C (SIGINT to the process group, as a terminal sends it, or to the command alone): the
    runs under way are marked interrupted, the rest stay pending, no worker is left, exit 130;
    --resume --jobs then finishes the batch with the runs of an uninterrupted batch."""
    cfg = write_config(tmp_path, rounds=40, protocol="masking", sweep="[sweep]\nseed = [0, 1, 2]")
    ws = tmp_path / "ws"
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    command = [sys.executable, "-m", "secure_fl.cli.run", str(cfg), "--json", "--workspace", str(ws), "--threads",
               "1", "--jobs", "2", "--no-progress"]
    with _sigint_as_in_a_terminal():
        process = subprocess.Popen(command, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL,
                                   stderr=subprocess.PIPE, start_new_session=True)
    deadline = time.monotonic() + 120
    try:
        while sum(n >= 2 for n in _rounds_per_run(ws / DB_NAME)) < 2:
            assert process.poll() is None, process.communicate()[1].decode()[-2000:]
            assert time.monotonic() < deadline, "the two workers did not reach round 2 in time"
            time.sleep(0.01)
        if target == "group":
            os.killpg(process.pid, signal.SIGINT)
        else:
            process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=30)
    assert process.returncode == 130, err.decode()[-2000:]
    assert _session_ends(process.pid, within=10.0), "a process of the command's session is still running"
    assert b"--resume RUN_ID" in err
    with RunStore(ws / DB_NAME) as store:
        rows = sorted(store.list_runs(), key=lambda r: r.position)
    assert [(r.status, r.error) for r in rows] == [("failed", "interrupted")] * 2 + [("pending", None)]
    assert all(2 <= r.rounds_done < 40 for r in rows[:2])
    if target == "group":
        assert cli("run", str(cfg), "--json", "--workspace", str(ws), "--threads", "1", "--jobs", "2",
                   "--resume", rows[0].id) == 0
        resumed = json.loads(capsys.readouterr().out)["runs"]
        assert cli("run", str(cfg), "--json", "--workspace", str(tmp_path / "reference"), "--threads", "1") == 0
        reference = json.loads(capsys.readouterr().out)["runs"]
        assert _outcomes(resumed) == _outcomes(reference)

def test_jobs_refused_where_they_cannot_apply(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = write_config(tmp_path, rounds=1)
    with pytest.raises(SystemExit):
        cli("run", str(cfg), "--workspace", str(tmp_path / "ws"), "--jobs", "0")
    assert "argument --jobs: expected a positive integer" in capsys.readouterr().err
    assert cli("run", str(cfg), "--workspace", str(tmp_path / "ws"), "--jobs", "2", "--engine", "flower-simulation") == 2
    assert "--jobs runs the embedded engine's runs" in capsys.readouterr().err

def test_resume_refuses_a_changed_config(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ws = str(tmp_path / "ws")
    cfg = write_config(tmp_path, rounds=1)
    assert cli("run", str(cfg), "--json", "--workspace", ws, "--threads", "1") == 0
    run_id = json.loads(capsys.readouterr().out)["runs"][0]["id"]
    changed = write_config(tmp_path, rounds=2, name="changed.toml")
    assert cli("run", str(changed), "--workspace", ws, "--resume", run_id) == 2
    assert "train.rounds: stored 1, file has 2" in capsys.readouterr().err
    # resuming a finished batch just reports it
    assert cli("run", str(cfg), "--json", "--workspace", ws, "--resume", run_id) == 0
    assert json.loads(capsys.readouterr().out)["runs"][0]["id"] == run_id


def _rounds_per_run(db: Path) -> list[int]:
    """Each stored run's rounds so far, read while another process writes (none yet: empty)."""
    if not db.exists():
        return []
    try:
        con = sqlite3.connect(db, timeout=1)
        try:
            return [int(n) for (n,) in con.execute("SELECT rounds_done FROM runs")]
        finally:
            con.close()
    except sqlite3.OperationalError:
        return []


@pytest.mark.slow
def test_a_run_killed_mid_round_resumes_to_the_uninterrupted_result(tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    cfg = write_config(tmp_path, rounds=10, per_round=3, protocol="paillier", sweep="[sweep]\nseed = [0, 1]")
    # the uninterrupted reference, in this process
    assert cli("run", str(cfg), "--json", "--workspace", str(tmp_path / "reference"), "--threads", "1") == 0
    reference = json.loads(capsys.readouterr().out)["runs"]

    ws = tmp_path / "killed"
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    command = [sys.executable, "-m", "secure_fl.cli.run", str(cfg), "--json", "--workspace", str(ws), "--threads", "1"]
    process = subprocess.Popen(command, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    try:
        while max(_rounds_per_run(ws / DB_NAME), default=0) < 3:  # round 4 of the first run is under way when we kill
            assert process.poll() is None, process.communicate()[1].decode()[-2000:]
            assert time.monotonic() < deadline, "the run did not reach round 3 in time"
            time.sleep(0.005)
        process.send_signal(signal.SIGKILL)
    finally:
        process.wait(timeout=30)
        process.stdout.close()  # type: ignore[union-attr]
        process.stderr.close()  # type: ignore[union-attr]
    assert process.returncode == -signal.SIGKILL
    with RunStore(ws / DB_NAME) as store:
        first, second = sorted(store.list_runs(), key=lambda r: r.position)
        assert first.position == 0 and 3 <= first.rounds_done < 10 and first.status == "running"
        assert second.rounds_done == 0 and second.status == "pending"

    assert cli("run", str(cfg), "--json", "--workspace", str(ws), "--resume", first.id, "--threads", "1") == 0
    resumed = json.loads(capsys.readouterr().out)["runs"]
    assert [r["id"] for r in resumed] == [first.id, second.id]
    for got, want in zip(resumed, reference):
        assert got["rounds"] == want["rounds"] == 10
        assert got["final"] == want["final"] and got["tail"] == want["tail"]
    with RunStore(ws / DB_NAME) as store, RunStore(tmp_path / "reference" / DB_NAME) as ref:
        got_curve = [r.accuracy for r in store.rounds(first.id)]
        want_curve = [r.accuracy for r in ref.rounds(reference[0]["id"])]
    assert got_curve == want_curve
