"""The 100-client smoke configs end to end, this tree against the tree before the client pool.

Issue 24's third target: "the 100-client smoke configs run at least 2x faster end to end than
before". ``before`` is commit 44648f2, the parent of the client pool's first commit (a26c80c),
extracted with ``git archive`` into a temporary directory; ``after`` is this working tree. Each
side runs ``python -m secure_fl run CONFIG --set train.rounds=R --json`` in its own process (the
whole command: start-up, data, every run of the config, evaluation, the run table) with the same
interpreter, the same thread count and a fresh workspace; the two sides alternate, the first side
swapping each repeat, and the medians of the wall times are reported.

The configs are truncated to ``R`` rounds to fit a session; each side reads its own tree's copy
of the config, and the script checks that they describe the same experiment: equal in every
setting except the names under ``[secure.statistics]``, which must map to the same protocols
(CLIMB's f̄ and λ̄ became one statistic, ``climb_dual``, on 2026-11-26). Each side's final
accuracy is reported too, so a reader sees that both ran the same experiment (the client pool
agrees with the loop per round to float tolerance, not bit for bit).

    PYTHONPATH=. python bench/smoke.py [--baseline 44648f2 | --baseline-tree DIR] [--repeats 2]
        [--threads 1] [--device auto] [--config experiments/climb/smoke.toml:8 ...]

``--baseline-tree`` takes a tree extracted beforehand (``git archive 44648f2 | tar -x -C DIR``),
for a machine that has the working tree but not the repository (a lent GPU: bench/gpu.sh).

Prints one JSON object: {"case": "smoke", "baseline": ..., "configs": [{"config", "rounds",
"before_s", "after_s", "speedup", "before_all", "after_all", "accuracy": {...}}], ...}.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
BASELINE = "44648f2"
"""The parent of a26c80c, the client pool's first commit: clients trained one after another."""
DEFAULT_CONFIGS = ("experiments/climb/smoke.toml:8", "experiments/ratio_loss/smoke.toml:6")


def extract(commit: str, into: Path) -> Path:
    """The tree of ``commit`` as files under ``into`` (``git archive``: no checkout of this tree)."""
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", "--format=tar", commit],
                             check=True, capture_output=True).stdout
    into.mkdir(parents=True)
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


def run_once(tree: Path, config: Path, rounds: int, threads: str, workspace: Path, device: str,
             ) -> tuple[float, dict[str, Any]]:
    """Wall seconds of one ``secure-fl run`` of ``config`` on ``tree``, and its JSON output."""
    path = os.environ.get("PYTHONPATH")
    env = {**os.environ, "PYTHONPATH": str(tree) + (os.pathsep + path if path else "")}
    command = [sys.executable, "-m", "secure_fl", "run", str(config), "--set", f"train.rounds={rounds}",
               "--workspace", str(workspace), "--threads", threads, "--device", device, "--no-progress", "--json"]
    start = time.perf_counter()
    done = subprocess.run(command, check=False, cwd=tree, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{tree}: {' '.join(command)} exited {done.returncode}:\n{done.stderr[-2000:]}")
    return seconds, json.loads(done.stdout)


def same_experiment(before: Path, after: Path) -> bool:
    """Whether two copies of a config describe the same experiment (see the module docstring)."""
    def split(path: Path) -> tuple[dict[str, Any], set[str]]:
        config = tomllib.loads(path.read_text())
        statistics_ = config.get("secure", {}).pop("statistics", {})
        return config, set(statistics_.values())

    return split(before) == split(after)


def final_accuracies(output: dict[str, Any]) -> dict[str, float]:
    """Each run's final accuracy from ``secure-fl run --json`` ("method/loss" -> accuracy)."""
    return {f"{run['method']}/{run['loss']}": round(float(run["final"]["accuracy"]), 4)
            for run in output["runs"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", default=BASELINE, help="the 'before' commit")
    parser.add_argument("--baseline-tree", type=Path, default=None,
                        help="the 'before' tree, extracted beforehand (instead of git archive)")
    parser.add_argument("--device", default="auto", help="--device for both sides (auto: CUDA when present)")
    parser.add_argument("--repeats", type=int, default=2, help="runs of each side per config")
    parser.add_argument("--threads", default="1", help="--threads for both sides")
    parser.add_argument("--config", action="append", metavar="PATH:ROUNDS",
                        help="a config and the rounds to truncate it to (repeatable)")
    args = parser.parse_args()
    configs = []
    for item in args.config or DEFAULT_CONFIGS:
        path, _, rounds = item.rpartition(":")
        configs.append((path, int(rounds)))
    with tempfile.TemporaryDirectory(prefix="smoke-bench-") as scratch:
        before = args.baseline_tree.resolve() if args.baseline_tree else extract(args.baseline,
                                                                                  Path(scratch) / "before")
        trees = {"before": before, "after": ROOT}
        results = []
        for path, rounds in configs:
            if not same_experiment(before / path, ROOT / path):
                raise SystemExit(f"{path} differs between {args.baseline} and this tree: not the same experiment")
            times: dict[str, list[float]] = {"before": [], "after": []}
            accuracy: dict[str, dict[str, float]] = {}
            for repeat in range(args.repeats):
                order = ["before", "after"] if repeat % 2 == 0 else ["after", "before"]
                for side in order:
                    workspace = Path(scratch) / f"ws-{side}-{repeat}-{Path(path).parent.name}"
                    seconds, output = run_once(trees[side], trees[side] / path, rounds, args.threads, workspace,
                                               args.device)
                    times[side].append(round(seconds, 2))
                    accuracy[side] = final_accuracies(output)
            med = {side: statistics.median(values) for side, values in times.items()}
            results.append({"config": path, "rounds": rounds, "before_s": med["before"], "after_s": med["after"],
                            "speedup": round(med["before"] / med["after"], 3), "before_all": times["before"],
                            "after_all": times["after"], "accuracy": accuracy})
    print(json.dumps({"case": "smoke", "baseline": str(args.baseline_tree or args.baseline), "threads": args.threads,
                      "device": args.device,
                      "load_average": [round(v, 2) for v in os.getloadavg()], "configs": results}))


if __name__ == "__main__":
    main()
