"""``secure-fl partition``, driven through its own parser until the lead wires it in."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pytest

from secure_fl.cli import partition as cli
from secure_fl.data import emd_avg, global_imbalance


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="secure-fl")
    sub = parser.add_subparsers(dest="command", required=True)
    cli.register(sub)
    args = parser.parse_args(argv)
    return int(args.func(args))


def run_json(capsys: pytest.CaptureFixture[str], argv: list[str]) -> dict:
    assert main(argv + ["--json"]) == 0
    out = capsys.readouterr().out
    assert out.count("\n") == 1  # exactly one JSON object
    return json.loads(out)


def test_json_report_for_each_scheme(capsys: pytest.CaptureFixture[str]) -> None:
    cases = {
        "dirichlet": ["--alpha", "0.5"],
        "climb": ["--alpha", "0", "--rho", "10", "--minority", "3"],
        "ratio": ["--global-ratio", "10"],
        "dubhe": ["--rho", "5", "--emd", "1.0"],
    }
    for scheme, extra in cases.items():
        report = run_json(
            capsys, ["partition", "mnist5k", "--scheme", scheme, "--clients", "40", *extra]
        )
        assert {"clients", "global_counts", "rho", "emd_avg", "mean_cosine_similarity"} <= set(
            report
        )
        counts = np.array(report["clients"])
        assert counts.shape == (40, 10)
        np.testing.assert_array_equal(counts.sum(axis=0), report["global_counts"])
        assert report["rho"] == pytest.approx(global_imbalance(counts))
        assert report["emd_avg"] == pytest.approx(emd_avg(counts))
        assert 0.0 < report["mean_cosine_similarity"] <= 1.0
    # climb with 3 minority classes at 1/10 and α = 0: single-class clients, ρ = 10
    report = run_json(capsys, ["partition", "mnist5k", "--scheme", "climb", "--clients", "40",
                               "--alpha", "0", "--rho", "10", "--minority", "3"])  # fmt: skip
    assert report["rho"] == pytest.approx(10.0)
    assert all(sum(1 for v in row if v) == 1 for row in report["clients"])


def test_dubhe_profiles(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["partition", "mnist5k", "--scheme", "dubhe", "--clients", "40", "--rho", "5", "--emd", "1.5"]
    mixed = np.array(run_json(capsys, argv)["clients"])
    single = np.array(run_json(capsys, argv + ["--profile", "mixture"])["clients"])
    np.testing.assert_array_equal(mixed.sum(axis=0), single.sum(axis=0))  # same global skew
    assert emd_avg(mixed) == pytest.approx(1.5, abs=0.02) and emd_avg(single) == pytest.approx(1.5, abs=0.02)
    # mixture: one dominant class per client, with its fixed share; dirichlet: lead shares vary
    def lead(counts: np.ndarray) -> np.ndarray:
        return np.sort(counts / counts.sum(axis=1, keepdims=True), axis=1)[:, -1]

    assert np.std(lead(mixed)) > 2 * np.std(lead(single))


def test_seed_determinism(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["partition", "digits", "--scheme", "dirichlet", "--clients", "5", "--seed", "3"]
    first, second = run_json(capsys, argv), run_json(capsys, argv)
    assert first["clients"] == second["clients"]
    other = run_json(capsys, argv[:-1] + ["4"])
    assert other["clients"] != first["clients"]


def test_balance_flag_keeps_client_sizes_near_n_over_clients(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["partition", "digits", "--scheme", "dirichlet", "--clients", "10", "--alpha", "0.1", "--seed", "2"]
    plain, balanced = run_json(capsys, argv), run_json(capsys, argv + ["--balance"])
    assert plain["params"]["balance"] is False and balanced["params"]["balance"] is True
    sizes = [np.array(r["clients"]).sum(axis=1) for r in (plain, balanced)]
    assert sizes[1].std() < sizes[0].std()


def test_table_and_plot(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    png = tmp_path / "heat.png"
    argv = ["partition", "digits", "--scheme", "dubhe", "--clients", "30", "--plot", str(png)]
    assert main(argv + ["--max-rows", "6"]) == 0
    out = capsys.readouterr().out
    assert "EMD_avg" in out and "rho (Γ)" in out and "global" in out
    assert "24 more clients" in out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--scheme", "dirichlet", "--clients", "4", "--emd", "1"], "--emd does not apply"),
        (["--scheme", "ratio", "--clients", "4", "--alpha", "1"], "--alpha does not apply"),
        (["--scheme", "dirichlet", "--clients", "4", "--profile", "mixture"], "--profile does not apply"),
        (["--scheme", "climb", "--clients", "4", "--minority", "2"], "needs --rho"),
        (["--scheme", "dubhe", "--clients", "4", "--balance"], "--balance does not apply"),
        (["--scheme", "dirichlet", "--clients", "4", "--alpha", "-1"], "alpha"),
        (["--scheme", "dirichlet", "--clients", "100000"], "num_clients"),
    ],
)
def test_errors_exit_2_with_a_message(
    capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    assert main(["partition", "digits", *argv]) == 2
    assert message in capsys.readouterr().err


def test_missing_cifar_names_the_path(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    argv = [
        "partition",
        "cifar10",
        "--scheme",
        "dirichlet",
        "--clients",
        "4",
        "--root",
        str(tmp_path),
    ]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert str(tmp_path) in err and "cifar-10-python.tar.gz" in err


def test_unknown_dataset_and_scheme_are_rejected_by_argparse() -> None:
    with pytest.raises(SystemExit):
        main(["partition", "imagenet", "--scheme", "dirichlet", "--clients", "4"])
    with pytest.raises(SystemExit):
        main(["partition", "digits", "--scheme", "shards", "--clients", "4"])
