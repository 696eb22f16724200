"""The helpers of the scripts under bench/ that decide what a measurement compares."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]


def _script(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"bench_{name}", ROOT / "bench" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


BASE = """name = "x"
seed = 0
[train]
rounds = 8
[secure]
protocol = "plain"
[secure.statistics]
{statistics}
"""


def test_smoke_compares_configs_up_to_statistic_names(tmp_path: Path) -> None:
    smoke = _script("smoke")
    before, after = tmp_path / "before.toml", tmp_path / "after.toml"
    before.write_text(BASE.format(statistics='climb_loss = "secagg+"\nclimb_lambda = "secagg+"'))
    after.write_text(BASE.format(statistics='climb_dual = "secagg+"\nclimb_lambda = "secagg+"'))
    assert smoke.same_experiment(before, after)
    after.write_text(BASE.format(statistics='climb_dual = "masking"\nclimb_lambda = "secagg+"'))
    assert not smoke.same_experiment(before, after)  # another protocol: another experiment
    after.write_text(BASE.replace("rounds = 8", "rounds = 9").format(
        statistics='climb_dual = "secagg+"\nclimb_lambda = "secagg+"'))
    assert not smoke.same_experiment(before, after)
