"""``secure-fl audit``: what each method tells each party, per secure-sum protocol.

Runs every METHOD × PROTOCOL (× MITIGATION) cell on demo-sized data (scikit-learn digits by default), reads
each run's transcript into an exposure ledger and attacks what each party received. Prints
the matrix (or, with ``--json``, one JSON object with a ``cells`` list) and, with ``--out
DIR``, writes ``audit.md``, ``audit.json`` and the heat map ``audit.png`` there (with
``--mitigations``: one heat map per further mitigation and the trade-off plot too).
"""

from __future__ import annotations

import argparse
import json
import logging
from typing import Any

from secure_fl.cli.keys import add_key_options, key_bits_problem

log = logging.getLogger("secure_fl.cli")

__all__ = ["register", "run"]


def _names(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise argparse.ArgumentTypeError("expected a comma-separated list of names")
    return names


def register(subparsers: Any) -> None:
    from secure_fl.audit.settings import (
        DEFAULT_METHODS,
        DEFAULT_MITIGATIONS,
        DEFAULT_PROTOCOLS,
        AuditSettings,
    )

    d = AuditSettings()
    p = subparsers.add_parser(
        "audit", help="leakage audit of methods × secure-sum protocols", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--methods", type=_names, default=list(DEFAULT_METHODS), metavar="LIST",
                   help=f"comma-separated methods (default: {','.join(DEFAULT_METHODS)})")
    p.add_argument("--protocols", type=_names, default=list(DEFAULT_PROTOCOLS), metavar="LIST",
                   help=f"comma-separated protocols (default: {','.join(DEFAULT_PROTOCOLS)})")
    p.add_argument("--mitigations", type=_names, default=list(DEFAULT_MITIGATIONS), metavar="LIST",
                   help="comma-separated mitigations against multi-round disaggregation: none, guard, cohorts, dp "
                        f"(default: {','.join(DEFAULT_MITIGATIONS)}); each cell also reports ε and tail accuracy")
    p.add_argument("--rounds", type=int, default=d.rounds, metavar="T", help=f"rounds per run (default {d.rounds})")
    p.add_argument("--clients", type=int, default=d.num_clients, metavar="N",
                   help=f"number of clients (default {d.num_clients})")
    p.add_argument("--per-round", type=int, default=d.clients_per_round, metavar="K",
                   help=f"clients per round (default {d.clients_per_round})")
    p.add_argument("--dataset", default=d.dataset, help=f"dataset (default {d.dataset})")
    p.add_argument("--alpha", type=float, default=d.partition_params["alpha"],
                   help=f"Dirichlet concentration of the partition (default {d.partition_params['alpha']})")
    p.add_argument("--seed", type=int, default=d.seed, help=f"seed of data, partition and training (default {d.seed})")
    add_key_options(p, default=d.key_bits)
    p.add_argument("--keyholder", choices=["agent", "all", "server"], default=d.keyholder,
                   help="who holds the HE secret key (default: an agent client; 'server' is the weak mode "
                        "the audit flags; CKKS has no server mode and uses the agent then)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    p.add_argument("--out", metavar="DIR", help="write audit.md, audit.json and audit.png to DIR")
    p.set_defaults(func=run)


def _check(args: argparse.Namespace) -> str | None:
    from protocols import PROTOCOLS
    from secure_fl.algorithms import ALGORITHMS
    from secure_fl.audit.settings import DEFAULT_METHODS
    from secure_fl.suggest import did_you_mean

    for name in args.protocols:
        if name not in PROTOCOLS:
            return f"unknown protocol {name!r}{did_you_mean(name, PROTOCOLS)}; known: {', '.join(PROTOCOLS)}"
    from secure_fl.config import MITIGATIONS

    for name in args.mitigations:
        if name not in MITIGATIONS:
            return f"unknown mitigation {name!r}{did_you_mean(name, MITIGATIONS)}; known: {', '.join(MITIGATIONS)}"
    if len(set(args.mitigations)) != len(args.mitigations):
        return "--mitigations lists a mitigation twice"
    methods = sorted(set(DEFAULT_METHODS) | set(ALGORITHMS))
    for name in args.methods:
        if name not in methods:
            return f"unknown method {name!r}{did_you_mean(name, methods)}; known: {', '.join(methods)}"
    if args.rounds < 1 or args.clients < 1 or not 1 <= args.per_round <= args.clients:
        return "--rounds and --clients must be >= 1 and --per-round in [1, --clients]"
    if not args.alpha > 0:
        return "--alpha must be positive"
    return key_bits_problem(args, uses_paillier="paillier" in args.protocols or "dubhe" in args.methods)


def run(args: argparse.Namespace) -> int:
    from secure_fl.cli import ensure_logging

    ensure_logging()
    problem = _check(args)
    if problem is not None:
        log.error("%s", problem)
        return 2
    from secure_fl.audit.report import run_audit
    from secure_fl.audit.runner import CellResult
    from secure_fl.audit.settings import AuditSettings

    settings = AuditSettings(
        dataset=args.dataset, num_clients=args.clients, clients_per_round=args.per_round, rounds=args.rounds,
        partition_params={"alpha": args.alpha}, seed=args.seed, key_bits=args.key_bits, keyholder=args.keyholder,
    )

    def progress(cell: CellResult, done: int, total: int) -> None:
        detail = f"max advantage {cell.max_advantage:.2f}" if cell.max_advantage is not None else cell.reason
        log.info("audit [%d/%d] %s × %s × %s: %s (%.1f s) %s", done, total, cell.method, cell.protocol,
                 cell.mitigation, cell.status, cell.seconds, detail)

    cells = len(args.methods) * len(args.protocols) * len(args.mitigations)
    log.info("auditing %d cells (%s × %s × %s), %d rounds of %d of %d clients on %s each", cells,
             ",".join(args.methods), ",".join(args.protocols), ",".join(args.mitigations), args.rounds,
             args.per_round, args.clients, args.dataset)
    try:
        report = run_audit(args.methods, args.protocols, settings, mitigations=args.mitigations, progress=progress)
    except (ValueError, OSError) as error:
        log.error("%s: %s", type(error).__name__, error)
        return 1
    paths = report.write(args.out) if args.out else {}
    if args.json:
        print(json.dumps(report.as_json(), default=str))
    else:
        print(_table(report))
        for kind, path in paths.items():
            print(f"{kind}: {path}")
    failed = [c for c in report.cells if c.status == "failed"]
    return 1 if failed else 0


def _table(report: Any) -> str:
    rows = [("method", "protocol", "mitigation", "status", "max adv", "ε", "tail acc", "Δ", "k_min", "t",
             "server B/client", "attacks")]
    for c in report.cells:
        s = c.summary
        attacks = ", ".join(
            f"{a.name}{'' if a.party == 'server' else f'[{a.party}]'}={a.advantage:.2f}"
            for a in c.attacks if a.advantage is not None)
        rows.append((
            c.method, c.protocol, c.mitigation, c.status,
            "—" if c.max_advantage is None else f"{c.max_advantage:.2f}",
            "∞" if c.epsilon is None else f"{c.epsilon:.2f}",
            "—" if c.tail_accuracy is None else f"{100 * c.tail_accuracy:.1f}",
            "—" if c.accuracy_delta is None else f"{100 * c.accuracy_delta:+.1f}",
            "—" if s is None or s.k_min is None else str(s.k_min),
            "—" if s is None or s.collusion_threshold is None else str(s.collusion_threshold),
            "—" if s is None else f"{s.server_plaintext_bytes_per_client:.0f}",
            attacks or c.reason,
        ))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    lines = ["  ".join(v.ljust(w) for v, w in zip(r[:-1], widths)) + "  " + r[-1] for r in rows]
    lines.insert(1, "-" * len(lines[0]))
    lines.append(f"{len(report.cells)} cells in {report.seconds:.1f} s")
    return "\n".join(lines)
