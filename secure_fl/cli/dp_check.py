"""``secure-fl dp-check``: run the distributed noisy-sum mechanism on neighbouring inputs and bound ε from below.

Every client of ``--clients`` noises a ``--classes``-entry count histogram with per-client
noise calibrated for (``--epsilon``, ``--delta``) at ``--level``; the secure sum (``--protocol``)
adds them up. This runs ``--trials`` times on a dataset D and on a neighbour D' (one record
more at client 0, or client 0's histogram from empty to full), and a threshold test on the
release gives an empirical ε lower bound with Clopper–Pearson confidence. A correct
mechanism keeps the bound below the claimed ε. ``--json`` prints one object whose first keys
are ``claimed_epsilon``, ``empirical_epsilon_lower_bound``, ``sigma_per_client`` (measured
std of one client's noise) and ``sigma_analytic`` (the calibrated per-client σ).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import warnings
from typing import Any

from protocols import PROTOCOLS, ProtocolError, descriptor
from secure_fl.cli.keys import add_key_options, key_bits_problem

__all__ = ["register", "run"]


log = logging.getLogger("secure_fl.cli")

def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add the ``dp-check`` sub-command to the ``secure-fl`` parser."""
    p = subparsers.add_parser(
        "dp-check",
        help="empirically check the distributed-DP noisy sum (ε lower bound)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--epsilon", type=float, required=True, help="claimed ε of one release")
    p.add_argument("--delta", type=float, required=True, help="claimed δ of one release")
    p.add_argument("--classes", type=int, required=True, help="histogram length C")
    p.add_argument("--clients", type=int, required=True, help="number of clients N (all survive)")
    p.add_argument("--level", choices=["record", "client"], default="record",
                   help="neighbouring relation: one record, or one client's whole histogram (default record)")
    p.add_argument("--trials", type=int, default=20_000, help="runs on each of D and D' (default 20000)")
    p.add_argument("--mechanism", choices=["auto", "skellam", "ddg"], default="auto",
                   help="per-client integer noise: Skellam, distributed discrete Gaussian, or auto "
                        "(Skellam unless its σ is beyond its sampler; default)")
    p.add_argument("--protocol", choices=list(PROTOCOLS), default="plain",
                   help="secure-sum protocol carrying the noisy vectors (default plain, the fastest; "
                        "with paillier lower --trials: every trial is C × N encrypted entries)")
    add_key_options(p)
    p.add_argument("--count-bound", type=int, default=64,
                   help="per-client count cap per class (the declaration's bound; default 64)")
    p.add_argument("--batch", type=int, default=1000,
                   help="trials carried by one protocol run (one vector of C × batch entries; default 1000)")
    p.add_argument("--alpha", type=float, default=0.05, help="1 − confidence of the lower bound (default 0.05)")
    p.add_argument("--seed", type=int, default=None,
                   help="reproducible run: turns secure mode off (seeded, non-cryptographic noise)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run)


def _protocol_options(args: argparse.Namespace) -> dict[str, Any]:
    return descriptor(args.protocol).applicable(key_bits=args.key_bits, allow_weak_keys=args.insecure_test_keys)


def _print_table(result: dict[str, Any]) -> None:
    ratio = result["sigma_per_client"] / result["sigma_analytic"]
    head = (f"distributed DP check: {result['mechanism']} noise, {result['level']} level, "
            f"{result['clients']} clients × {result['classes']} classes, protocol {result['protocol']}")
    bound = (f"  empirical ε ≥        {result['empirical_epsilon_lower_bound']:.4f}  "
             f"({result['confidence']:.0%} confidence, {result['trials']} trials per side; "
             f"test {result['test']})")
    per_client = (f"  σ per client         measured {result['sigma_per_client']:.4f}, "
                  f"analytic {result['sigma_analytic']:.4f}  ({100 * (ratio - 1):+.2f} %)")
    lines = [
        head,
        f"  claimed              ε = {result['claimed_epsilon']:g}, δ = {result['delta']:g}",
        bound,
        per_client,
        f"  σ of the sum         measured {result['sigma_total']:.4f}, analytic {result['sigma_total_analytic']:.4f}",
        f"  encoding             {result['slot_bits']} bits per slot; {result['clipped']} noisy entries clipped",
        f"  noise source         {'CSPRNG (AES-CTR)' if result['secure_mode'] else 'seeded, NOT cryptographic'}",
        f"  time                 {result['seconds']:.1f} s",
    ]
    verdict = ("OK: the lower bound stays below the claim"
               if result["empirical_epsilon_lower_bound"] <= result["claimed_epsilon"]
               else "VIOLATION: the empirical lower bound exceeds the claimed ε")
    print("\n".join(lines + [verdict]))


def run(args: argparse.Namespace) -> int:
    from secure_fl.cli import ensure_logging

    ensure_logging()
    from secure_fl.privacy import InsecureRandomWarning
    from secure_fl.privacy.empirical import empirical_check

    if not (math.isfinite(args.epsilon) and args.epsilon > 0) or not 0 < args.delta < 1:
        log.error("need --epsilon > 0 and 0 < --delta < 1")
        return 2
    if args.classes < 1 or args.clients < 1 or args.trials < 20 or args.batch < 1 or args.count_bound < 1:
        log.error("--classes, --clients, --batch, --count-bound must be >= 1 and --trials >= 20")
        return 2
    problem = key_bits_problem(args, uses_paillier=args.protocol == "paillier")
    if problem is not None:
        log.error("%s", problem)
        return 2
    secure = args.seed is None
    if not secure:
        log.warning("--seed turns secure mode off: the noise is reproducible and not cryptographic")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", InsecureRandomWarning)
            result = empirical_check(
                epsilon=args.epsilon, delta=args.delta, classes=args.classes, clients=args.clients,
                level=args.level, trials=args.trials, mechanism=args.mechanism, protocol=args.protocol,
                protocol_options=_protocol_options(args), count_bound=args.count_bound, batch=args.batch,
                alpha=args.alpha, secure_mode=secure, seed=args.seed,
            ).as_dict()
    except (ValueError, ProtocolError) as error:
        log.error("%s", error)
        return 2
    if args.json:
        print(json.dumps(result))
    else:
        _print_table(result)
    return 0 if result["empirical_epsilon_lower_bound"] <= result["claimed_epsilon"] else 1
