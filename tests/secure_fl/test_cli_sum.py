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
        code = sum_main(["sum", "--protocol", "paillier", "--key-bits", "1024", "--clients", "4", "--length", "300",
                         "--pool", "--json"])
    report = json.loads(capsys.readouterr().out)
    assert code == 0 and report["correct"] is True
    assert sorted(pid for pid, _ in filled) == [0, 1, 2, 3] and all(count >= 1 for _, count in filled)
    assert report["params"]["key_bits"] == 1024 and report["params"]["keyholder"] == "agent"


def test_table_and_bad_arguments(capsys: pytest.CaptureFixture[str]) -> None:
    assert sum_main(["sum", "--protocol", "paillier", "--key-bits", "1024", "--keyholder", "all",
                     "--clients", "3", "--length", "20"]) == 0
    out = capsys.readouterr().out
    assert "correct" in out and "yes" in out and "key set-up" in out
    assert sum_main(["sum", "--protocol", "plain", "--clients", "0"]) == 2
    assert sum_main(["sum", "--protocol", "plain", "--dropout", "1.0"]) == 2
    capsys.readouterr()
