"""A tour of bad inputs: each gives one line saying what went wrong (and what to do), the right
exit code (2: a bad command line, config or store, nothing ran; 1: a run or study failed) and
never a traceback. Ctrl-C (130) and a closed pipe (141) are in test_run_failures / test_cli_output."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from secure_fl.cli import main
from secure_fl.store import DB_NAME, RunStore

ROOT = Path(__file__).resolve().parents[2]

BASE = """name = "tour"
[data]
dataset = "digits"
num_clients = 4
partition_params = { alpha = 1.0 }
[model]
name = "mlp"
hidden = [8]
[train]
rounds = 1
clients_per_round = 2
"""

FILES = {
    "syntax.toml": 'name = "x"\n[data\n',
    "top.toml": "seeed = 1\n" + BASE,
    "rouds.toml": BASE.replace("rounds = 1", "rouds = 1"),
    "stat.toml": BASE + '[method]\nname = "fedshift"\n[secure.statistics]\nlabel_histgram = "paillier"\n',
    "update.toml": BASE + '[secure.statistics]\nmodel_update = "masking"\n',
    "privacy.toml": BASE + "[privacy.statistics]\ntotal_sample = { epsilon = 1.0 }\n",
    "ptable.toml": BASE + "[secure.paillierr]\nkey_bits = 2048\n",
    "poption.toml": BASE + "[secure.paillier]\nkey_bit = 2048\n",
    "method.toml": BASE + '[method]\nname = "fedshfit"\n',
    "param.toml": BASE + '[method]\nname = "fedprox"\nmuu = 0.1\n',
    "lr.toml": BASE.replace("rounds = 1", "rounds = 1\nlr = -1.0"),
    "cohort.toml": BASE.replace("clients_per_round = 2", "clients_per_round = 9"),
    "notrain.toml": BASE.split("[train]")[0],
    "nodata.toml": BASE.replace('dataset = "digits"', 'dataset = "cifar10"\nroot = "/nonexistent/cifar"'),
    "ok.toml": BASE,
}

# (argv, exit code, a phrase of the one line); {d} is the tour's folder
TOUR: list[tuple[list[str], int, str]] = [
    ([], 2, "the following arguments are required: COMMAND"),
    (["rnu", "x.toml"], 2, "unknown command 'rnu' (did you mean 'run'?)"),
    (["run"], 2, "the following arguments are required: CONFIG"),
    (["run", "{d}/missing.toml"], 2, "missing.toml: cannot read config: no such file"),
    (["run", "{d}"], 2, "is a folder; name a config file"),
    (["run", "{d}/syntax.toml"], 2, "not valid TOML"),
    (["run", "{d}/top.toml"], 2, "unknown key 'seeed' (did you mean 'seed'?)"),
    (["run", "{d}/rouds.toml"], 2, "unknown key 'train.rouds' (did you mean 'rounds'?)"),
    (["run", "{d}/stat.toml"], 2, "no statistic 'label_histgram' in this run (did you mean 'label_histogram'?)"),
    (["run", "{d}/update.toml"], 2, "is a model-sized update sum; set its protocol with secure.update_protocol"),
    (["run", "{d}/privacy.toml"], 2, "no statistic 'total_sample' in this run (did you mean 'total_samples'?)"),
    (["run", "{d}/ptable.toml"], 2, "unknown key 'secure.paillierr' (did you mean 'paillier'?)"),
    (["run", "{d}/poption.toml"], 2, "unknown option of protocol 'paillier' (did you mean 'key_bits'?)"),
    (["run", "{d}/method.toml"], 2, "unknown method 'fedshfit' (did you mean 'fedshift'?)"),
    (["run", "{d}/param.toml"], 2, "unknown parameter(s) muu for method 'fedprox' (did you mean 'mu'?)"),
    (["run", "{d}/lr.toml"], 2, "train.lr: must be positive, got -1.0"),
    (["run", "{d}/cohort.toml"], 2, "train.clients_per_round = 9 exceeds data.num_clients = 4"),
    (["run", "{d}/notrain.toml"], 2, "missing table [train]"),
    (["run", "{d}/ok.toml", "--set", "trian.rounds=2"], 2, "--set trian.rounds: unknown key 'trian'"),
    (["run", "{d}/ok.toml", "--set", "train.rounds"], 2, "expected SECTION.KEY=VALUE"),
    (["run", "{d}/ok.toml", "--threads", "zero"], 2, "--threads must be 'auto' or a positive integer"),
    (["run", "{d}/ok.toml", "--workspace", "{d}/ws", "--resume", "feedbeef"], 2, "no run 'feedbeef' in"),
    (["run", "{d}/nodata.toml", "--workspace", "{d}/ws", "--threads", "1"], 1, "CIFAR-10 not found"),
    (["run", "{d}/ok.toml", "--workspace", "{d}/corrupt"], 2, "is not a readable secure-fl run store"),
    (["run", "{d}/ok.toml", "--workspace", "{d}/newer"], 2, "has schema 99, newer than this secure-fl's"),
    (["run", "{d}/ok.toml", "--workspace", "{d}/foreign"], 2, "an SQLite file but not a secure-fl run store"),
    (["run", "{d}/ok.toml", "--workspace", "{d}/locked"], 2, "is locked by another process"),
    (["run", "{d}/ok.toml", "--log-file", "{d}/no/such/dir/log.txt"], 2, "cannot write the log file"),
    (["runs", "--workspace", "{d}/corrupt"], 2, "is not a readable secure-fl run store"),
    (["runs", "--workspace", "{d}/newer"], 2, "has schema 99"),
    (["runs", "--limit", "0"], 2, "--limit must be >= 1"),
    (["report"], 2, "name the runs to report"),
    (["report", "nosuchrun", "--workspace", "{d}/ws"], 1, "'nosuchrun' is not a config file, run id, batch id or run name"),
    (["report", "{d}/ok.toml", "--workspace", "{d}/empty"], 1, "no run store at"),
    (["audit", "--protocols", "rot13"], 2, "unknown protocol 'rot13'"),
    (["audit", "--methods", "fedavgg"], 2, "unknown method 'fedavgg' (did you mean 'fedavg'?)"),
    (["partition", "digits", "--scheme", "dirichlet", "--clients", "0"], 2, "--clients must be >= 1"),
    (["select", "--clients", "0", "--repeats", "1"], 2, "need at least 2 clients"),
    (["dp-check", "--epsilon", "0", "--delta", "1e-5", "--classes", "10", "--clients", "10"], 2,
     "need --epsilon > 0"),
]


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("tour")
    for name, text in FILES.items():
        (d / name).write_text(text)
    (d / "corrupt").mkdir()
    (d / "corrupt" / DB_NAME).write_bytes(b"not a database " * 100)
    (d / "foreign").mkdir()
    con = sqlite3.connect(d / "foreign" / DB_NAME)
    con.execute("CREATE TABLE notes (text TEXT)")
    con.commit()
    con.close()
    RunStore(d / "newer" / DB_NAME).close()
    con = sqlite3.connect(d / "newer" / DB_NAME)
    con.execute("UPDATE meta SET value = '99' WHERE key = 'schema'")
    con.commit()
    con.close()
    RunStore(d / "locked" / DB_NAME).close()
    return d


def tour(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    before = torch.get_num_threads()
    try:
        code = main(argv)
    except SystemExit as exit:  # argparse's usage errors
        code = int(exit.code or 0)
    finally:
        torch.set_num_threads(before)
    return code, capsys.readouterr().err


@pytest.mark.parametrize("argv, code, phrase", TOUR, ids=[" ".join(a)[:50] or "(none)" for a, _, _ in TOUR])
def test_bad_input(argv: list[str], code: int, phrase: str, folder: Path, capsys: pytest.CaptureFixture[str],
                   monkeypatch: pytest.MonkeyPatch) -> None:
    argv = [a.replace("{d}", str(folder)) for a in argv]
    holder = None
    if "locked" in " ".join(argv):
        monkeypatch.setenv("SECURE_FL_STORE_TIMEOUT", "0.1")
        holder = sqlite3.connect(folder / "locked" / DB_NAME, isolation_level=None)
        holder.execute("BEGIN EXCLUSIVE")
    try:
        got, err = tour(argv, capsys)
    finally:
        if holder is not None:
            holder.execute("ROLLBACK")
            holder.close()
    assert got == code, err
    assert "Traceback" not in err
    errors = [line for line in err.splitlines() if "error:" in line]
    assert errors and phrase in errors[0], err
    if code == 2 and not errors[0].startswith("secure-fl"):  # ours, not argparse's usage block: one line
        assert len(err.strip().splitlines()) == 1, err


def test_a_whole_process_prints_no_traceback(folder: Path) -> None:
    for argv in (["run", str(folder / "stat.toml")], ["runs", "--workspace", str(folder / "corrupt")]):
        result = subprocess.run([sys.executable, "-m", "secure_fl", *argv], cwd=ROOT, capture_output=True, text=True,
                                timeout=120, check=False)
        assert result.returncode == 2 and "Traceback" not in result.stderr
        assert len(result.stderr.strip().splitlines()) == 1, result.stderr
