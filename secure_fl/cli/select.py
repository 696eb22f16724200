"""``secure-fl select``: a client-selection study without training (Dubhe, paper 004).

Builds Dubhe's synthetic population (half-normal skew ρ, target EMD_avg) for N clients, registers
it with the strategy, selects K clients ``--repeats`` times and reports ‖p_o − p_u‖₁ (mean and
standard deviation), the full-participation baseline ‖p_g − p_u‖₁, random selection on the same
population, and for Dubhe the seconds and bytes of the key set-up, parameter search, registration
and selection. ``--experiment CONFIG`` instead runs one of the Dubhe figures or tables
(experiments/dubhe/*.toml) and writes its outputs under ``--out``.
"""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path
from typing import Any

from secure_fl.cli.keys import add_key_options, key_bits_problem

log = logging.getLogger("secure_fl.cli")

def _floats(text: str) -> tuple[float, ...]:
    try:
        return tuple(float(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from None


def _grid(text: str) -> tuple[tuple[float, ...], ...]:
    return tuple(_floats(part) for part in text.split(";"))


def register(sub: Any) -> None:
    p = sub.add_parser("select", help="client-selection study (random, greedy, Dubhe) without training",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--strategy", choices=["random", "greedy", "dubhe"], default="dubhe")
    p.add_argument("--clients", type=int, default=1000, help="N (default 1000)")
    p.add_argument("--per-round", type=int, default=20, help="K, clients per round (default 20)")
    p.add_argument("--rho", type=float, default=10.0, help="global imbalance ratio (default 10)")
    p.add_argument("--emd", type=float, default=1.5, help="target EMD_avg (default 1.5)")
    p.add_argument("--profile", choices=["dirichlet", "mixture"], default="dirichlet",
                   help="how clients mix classes: Dir(beta*C*p_g) mixes (default) or one dominant class each")
    p.add_argument("--classes", type=int, default=10, help="C (default 10)")
    p.add_argument("--samples-per-class", type=int, default=6000,
                   help="size of the balanced label pool before the skew (default 6000, as (Fashion-)MNIST)")
    p.add_argument("--tries", type=int, default=1, metavar="H", help="Dubhe multi-time selection tries (default 1)")
    p.add_argument("--repeats", type=int, default=100, help="selections to average over (default 100)")
    p.add_argument("--seed", type=int, default=0, help="seed of the population and the draws (never of keys)")
    p.add_argument("--sigma", type=_floats, default=None, metavar="S1,S2",
                   help="Dubhe thresholds for i in G below C, ascending (default: parameter search)")
    p.add_argument("--reference-set", type=lambda s: tuple(int(v) for v in s.split(",")), default=None,
                   metavar="1,2,C", help="Dubhe's G (default 1,2,C)")
    p.add_argument("--search-grid", type=_grid, default=None, metavar="A,B;C,D",
                   help="candidate values of each sigma, ';' between sigmas (default 0.5..0.9;0.1..0.4)")
    p.add_argument("--search-tries", type=int, default=20, help="tries per candidate in the search (default 20)")
    p.add_argument("--search", choices=["coordinate", "grid"], default="coordinate",
                   help="search one sigma at a time (default) or the whole grid at once")
    p.add_argument("--protocol", choices=["paillier", "plain"], default="paillier",
                   help="Dubhe's sums: packed Paillier (default) or an insecure in-the-clear simulation")
    add_key_options(p)
    p.add_argument("--uploads", choices=["registration", "round"], default="registration",
                   help="encrypted label counts: once per registration (default) or fresh every round")
    p.add_argument("--per-entry-sample", type=int, default=0, metavar="M",
                   help="also time the per-entry (one phe ciphertext per entry) registry on M clients")
    p.add_argument("--experiment", type=Path, default=None, metavar="CONFIG",
                   help="run a Dubhe figure/table config (experiments/dubhe/*.toml) instead")
    p.add_argument("--out", type=Path, default=Path("results/dubhe"), help="output folder for --experiment")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from secure_fl.cli import ensure_logging

    ensure_logging()
    from protocols import ProtocolError
    from secure_fl.selection.dubhe import DubheParams
    from secure_fl.selection.study import StudyConfig, run_study

    if args.experiment is not None:
        from secure_fl.selection.experiments import run_experiment

        try:
            summary = run_experiment(args.experiment, out=args.out, progress=not args.json)
        except (ValueError, OSError, ProtocolError) as error:
            log.error("%s", error)
            return 1
        print(json.dumps(summary, indent=1) if args.json else summary.get("report", ""))
        return 0
    problem = key_bits_problem(args, uses_paillier=args.protocol == "paillier" and args.strategy == "dubhe")
    if problem is not None:
        log.error("%s", problem)
        return 2
    try:
        params = DubheParams(
            reference_set=args.reference_set, sigma=args.sigma, tries=args.tries, search_grid=args.search_grid,
            search_tries=args.search_tries, search=args.search, protocol=args.protocol, key_bits=args.key_bits,
            allow_weak_keys=args.insecure_test_keys, uploads=args.uploads,
        )
        config = StudyConfig(
            strategy=args.strategy, clients=args.clients, per_round=args.per_round, rho=args.rho, emd=args.emd,
            profile=args.profile, classes=args.classes, samples_per_class=args.samples_per_class,
            repeats=args.repeats, seed=args.seed, dubhe=params, per_entry_sample=args.per_entry_sample,
        )
    except ValueError as error:  # the options themselves: a usage error
        log.error("%s", error)
        return 2
    try:
        result = run_study(config)
    except (ValueError, ProtocolError) as error:
        log.error("%s", error)
        return 1
    if args.json:
        keys = ["strategy", "l1_mean", "l1_std", "baseline_l1", "seconds", "bytes"]
        ordered = {k: result[k] for k in keys}
        ordered.update({k: v for k, v in result.items() if k not in keys})
        print(json.dumps(ordered, indent=1))
        return 0
    print(_table(result))
    return 0


def _table(result: dict[str, Any]) -> str:
    lines = [
        (f"strategy {result['strategy']}: N={result['clients']} K={result['per_round']} "
         f"rho={result['rho']} EMD_avg={result['emd_avg']} ({result['repeats']} selections)"),
        f"  ||p_o - p_u||_1     {result['l1_mean']:.4f} +- {result['l1_std']:.4f}",
        f"  random, same pop.   {result['random_l1_mean']:.4f}   (reduction {100 * result['reduction_vs_random']:.1f} %)",
        f"  baseline ||p_g - p_u||_1  {result['baseline_l1']:.4f}",
    ]
    dubhe = result.get("dubhe")
    if dubhe:
        sigma = ", ".join(f"sigma_{i}={v}" for i, v in dubhe["sigma"].items())
        lines.append(f"  Dubhe: H={dubhe['tries']} G={dubhe['reference_set']} {sigma}"
                     f" ({'searched' if dubhe['searched'] else 'given'}), protocol {dubhe['protocol']}")
    seconds = result["seconds"]
    lines.append("  seconds: " + ", ".join(f"{k} {v:.2f}" for k, v in seconds.items()))
    if result.get("cpu_seconds"):
        lines.append("  CPU s:   " + ", ".join(f"{k} {v:.2f}" for k, v in result["cpu_seconds"].items()))
    lines.append("  bytes:   " + ", ".join(f"{k} {v}" for k, v in result["bytes"].items()))
    per_entry = result.get("per_entry")
    if per_entry:
        lines.append("  per-entry registry (one phe ciphertext per entry): "
                     f"{per_entry['registration_cpu_seconds']:.1f} CPU s vs packed "
                     f"{per_entry['packed_registration_cpu_seconds']:.2f} CPU s = {per_entry['speedup']:.1f}x")
    return "\n".join(lines)
