"""``secure-fl sum``: one secure sum in one process, its JSON contract (README) and its table."""

from __future__ import annotations

import argparse
import json
from unittest import mock

import pytest

from protocols.paillier import PaillierClientSession

KEYS = ["protocol", "clients", "length", "dropouts", "correct", "seconds", "bytes"]


def sum_main(argv: list[str]) -> int:
    from secure_fl.cli import sum as sum_cli

    parser = argparse.ArgumentParser(prog="secure-fl")
    sub = parser.add_subparsers(dest="command", required=True)
    sum_cli.register(sub)
    args = parser.parse_args(argv)
    return int(args.func(args))


@pytest.mark.parametrize("protocol", ["plain", "masking", "secagg+"])
def test_json_contract_with_dropouts(protocol: str, capsys: pytest.CaptureFixture[str]) -> None:
    code = sum_main(["sum", "--protocol", protocol, "--clients", "10", "--length", "30", "--bound", "7",
                     "--dropout", "0.2", "--seed", "3", "--json"])
    report = json.loads(capsys.readouterr().out)
    assert code == 0
    assert list(report)[: len(KEYS)] == KEYS
    assert report["protocol"] == protocol and report["clients"] == 10 and report["length"] == 30
    assert report["dropouts"] == 2 and report["correct"] is True
    assert set(report["seconds"]) == {"client", "aggregate", "finalize"}
    assert all(v >= 0 for v in report["seconds"].values())
    assert set(report["bytes"]) == {"upload_per_client", "total"}
    assert 0 < report["bytes"]["upload_per_client"] < report["bytes"]["total"]
    if protocol != "plain":
        assert report["params"]["threshold"] >= 2 and report["params"]["degree"] >= 1


def test_paillier_pool_is_filled_through_each_client_session(capsys: pytest.CaptureFixture[str]) -> None:
    filled: list[tuple[int, int]] = []
    original = PaillierClientSession.fill_pool

    def spy(self: PaillierClientSession, count: int) -> None:
        filled.append((self.party_id, count))
        original(self, count)

    with mock.patch.object(PaillierClientSession, "fill_pool", spy):
        code = sum_main(["sum", "--protocol", "paillier", "--key-bits", "1024", "--insecure-test-keys", "--clients",
                         "4", "--length", "300", "--pool", "--json"])
    report = json.loads(capsys.readouterr().out)
    assert code == 0 and report["correct"] is True
    assert sorted(pid for pid, _ in filled) == [0, 1, 2, 3] and all(count >= 1 for _, count in filled)
    assert report["params"]["key_bits"] == 1024 and report["params"]["keyholder"] == "agent"


def test_table_and_bad_arguments(capsys: pytest.CaptureFixture[str]) -> None:
    assert sum_main(["sum", "--protocol", "paillier", "--key-bits", "1024", "--insecure-test-keys", "--keyholder",
                     "all", "--clients", "3", "--length", "20"]) == 0
    out = capsys.readouterr().out
    assert "correct" in out and "yes" in out and "key set-up" in out
    assert sum_main(["sum", "--protocol", "plain", "--clients", "0"]) == 2
    assert sum_main(["sum", "--protocol", "plain", "--dropout", "1.0"]) == 2
    capsys.readouterr()


def test_one_rule_for_key_sizes_and_exit_codes(capsys: pytest.CaptureFixture[str]) -> None:
    """2 for usage and configuration (checked before any key is made), 1 for runtime failures."""
    assert sum_main(["sum", "--protocol", "paillier", "--key-bits", "1024", "--clients", "3"]) == 2
    assert "--insecure-test-keys" in capsys.readouterr().err
    assert sum_main(["sum", "--protocol", "plain", "--dropout-stage", "nope"]) == 2
    assert sum_main(["sum", "--protocol", "plain", "--bound", str(2**53 + 1)]) == 2  # not an exact bound
    assert sum_main(["sum", "--protocol", "plain", "--bound", str(2**62), "--clients", "4"]) == 2  # no headroom
    assert sum_main(["sum", "--protocol", "plain", "--active-server"]) == 2
    assert sum_main(["sum", "--protocol", "plain", "--tamper", "share:1"]) == 2  # masking only
    assert sum_main(["sum", "--protocol", "plain", "--tamper", "upload:99"]) == 2
    assert sum_main(["sum", "--protocol", "plain", "--tamper", "bogus"]) == 2
    capsys.readouterr()
    assert sum_main(["sum", "--protocol", "masking", "--clients", "6", "--dropout", "0.5"]) == 1  # below threshold
    assert "ThresholdError" in capsys.readouterr().err


TAMPERS = [("masking", kind) for kind in ("share", "upload", "replay", "forge", "equivocate")] + [
    ("secagg+", kind) for kind in ("share", "upload", "replay", "forge")] + [
    ("plain", kind) for kind in ("upload", "replay", "forge")] + [
    ("paillier", kind) for kind in ("upload", "replay", "forge")]


@pytest.mark.parametrize(("protocol", "kind"), TAMPERS)
def test_tamper_is_excluded_with_a_correct_sum_or_a_typed_error(protocol: str, kind: str,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    party = 2
    code = sum_main(["sum", "--protocol", protocol, "--clients", "8", "--length", "12", "--bound", "31", "--seed",
                     "5", "--key-bits", "1024", "--insecure-test-keys", "--tamper", f"{kind}:{party}", "--json"])
    report = json.loads(capsys.readouterr().out)
    assert report["tamper"] == f"{kind}:{party}"
    if "error" in report:
        assert code == 1 and report["error"]["class"].endswith("Error")
        return
    assert code == 0 and report["correct"] is True
    assert list(report["excluded"]) == [str(party)]  # the bad share's or message's sender is named
    reason = report["excluded"][str(party)]
    if kind in ("upload", "forge"):  # out of the sum
        assert reason.startswith("AuthenticationError") and "its input counts" not in reason
    else:  # a wrong share signed by its sender, or a replay in its name: left out, its input counted
        assert reason.startswith({"share": "ShareError: a wrong share", "replay": "ReplayError"}[kind])
        assert reason.endswith("(left out; its input counts)")


def test_equivocation_exposes_no_input_under_secagg_plus_defaults_nor_with_active_server(
        capsys: pytest.CaptureFixture[str]) -> None:
    """Defaults keep 2t > k + 1 (issue 22): the equivocating server collects too few shares of
    the target's seed and the round stops with a typed error; with --active-server too."""
    argv = ["sum", "--protocol", "secagg+", "--clients", "12", "--length", "8", "--bound", "7", "--seed", "1",
            "--tamper", "equivocate:0", "--json"]
    for extra in ([], ["--active-server"]):
        assert sum_main([*argv, *extra]) == 1
        report = json.loads(capsys.readouterr().out)
        assert report["input_exposed"] is False and report["error"]["class"] == "ThresholdError"
