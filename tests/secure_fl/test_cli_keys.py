"""One key-size rule (issue 22 item 7): every subcommand (sum, select, dp-check, audit) that makes Paillier keys refuses keys
below 2048 bits with exit 2 and one line, unless --insecure-test-keys says it is a test."""

from __future__ import annotations

import pytest

from secure_fl.cli import main

WEAK = ["--key-bits", "1024"]

COMMANDS = {
    "sum": ["sum", "--protocol", "paillier", "--clients", "3", "--length", "4"],
    "select": ["select", "--strategy", "dubhe", "--protocol", "paillier", "--clients", "10", "--per-round", "4",
               "--repeats", "1", "--tries", "1", "--sigma", "0.7,0.1", "--samples-per-class", "50"],
    "audit": ["audit", "--methods", "fedavg", "--protocols", "paillier", "--rounds", "1"],
    "dp-check": ["dp-check", "--protocol", "paillier", "--epsilon", "1", "--delta", "1e-5", "--classes", "2",
                 "--clients", "2", "--trials", "20", "--batch", "20"],
}


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_weak_keys_are_refused_without_the_flag(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*COMMANDS[name], *WEAK]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--key-bits 1024 is below 2048" in err[0] and "--insecure-test-keys" in err[0]
    assert "Traceback" not in err[0]


@pytest.mark.parametrize("name", ["sum", "select"])
def test_weak_keys_run_with_the_flag(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*COMMANDS[name], *WEAK, "--insecure-test-keys", "--json"]) == 0
    assert capsys.readouterr().out.strip().startswith("{")


def test_a_protocol_without_keys_ignores_the_key_size(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sum", "--protocol", "masking", "--clients", "3", "--length", "4", *WEAK, "--json"]) == 0
    assert capsys.readouterr().out.strip().startswith("{")
