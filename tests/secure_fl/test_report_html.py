"""The demo's HTML report: one self-contained page (inline PNGs and style, no network) with the
runs' table, accuracy curves, per-class accuracy, bytes per statistic and stage, and the audit."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from secure_fl.cli import main

from .test_cli_run import write_config


@pytest.fixture
def workspace(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[Path, Path]:
    before = torch.get_num_threads()
    cfg = write_config(tmp_path, rounds=2, minority="minority_classes = [3]",
                       sweep='[[runs]]\nmethod = "fedavg"\n[[runs]]\nmethod = "fedshift"\n'
                             'secure.statistics.label_histogram = "paillier"\n')
    ws = tmp_path / "ws"
    assert main(["run", str(cfg), "--workspace", str(ws), "--threads", "1", "--json"]) == 0
    torch.set_num_threads(before)
    capsys.readouterr()
    return cfg, ws


def test_the_page_has_every_part_and_needs_nothing_else(workspace: tuple[Path, Path], tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    cfg, ws = workspace
    audit = tmp_path / "audit"
    audit.mkdir()
    (audit / "audit.json").write_text(json.dumps({"cells": [
        {"method": "fedavg", "protocol": "plain", "status": "ok", "max_advantage": 0.85, "k_min": 1,
         "collusion_threshold": 0, "server_plaintext_bytes_per_client": 96860.0}]}))
    (audit / "audit.png").write_bytes(b"\x89PNG\r\n\x1a\n" + b"\0" * 16)
    out = tmp_path / "report" / "page.html"
    assert main(["report", str(cfg), "--workspace", str(ws), "--html", str(out), "--audit", str(audit)]) == 0
    assert capsys.readouterr().out.strip() == f"report: {out.resolve()}"
    page = out.read_text()
    for heading in ("Runs", "Accuracy", "Per-class accuracy", "Bytes per statistic and stage", "Leakage audit"):
        assert f"<h2>{heading}</h2>" in page
    assert page.count("data:image/png;base64,") == 4  # accuracy, per class, bytes, the audit's heat map
    assert "label_histogram: paillier" in page and "fedshift" in page
    assert "<td>0.85</td>" in page and "96860" in page
    # self-contained: no reference to anything outside the page
    assert not re.search(r'(src|href)="(?!data:)', page)
    assert "http://" not in page and "https://" not in page


def test_a_page_without_an_audit_says_how_to_get_one(workspace: tuple[Path, Path], tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    cfg, ws = workspace
    out = tmp_path / "page.html"
    assert main(["report", str(cfg), "--workspace", str(ws), "--html", str(out), "--audit", str(tmp_path / "none"),
                 "--json"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["html"] == str(out)
    assert "warning: no audit in" in captured.err
    assert "secure-fl audit --out DIR" in out.read_text()
