"""``secure-fl sum``: one whole secure-sum round in one process, checked against the plain sum.

Exit codes (as every ``secure-fl`` command): 0 the sum is correct; 1 a runtime failure (a typed
protocol error, or a wrong sum); 2 a usage or configuration error (a flag out of range, a spec or
option the protocol refuses, a Paillier key below 2048 bits without ``--insecure-test-keys``).

``--tamper KIND:PARTY`` injects one fault (:mod:`protocols.faults`: ``share``, ``upload``,
``replay``, ``forge``, ``equivocate``) and turns on sender authentication (every message signed
with keys registered at set-up). The report then echoes ``tamper`` and holds either ``correct``
(the result equals the plain sum of the inputs of the clients it counts) with ``excluded`` (each
client left out, with why), or ``error`` (the typed error's class and message; exit 1).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import secrets
import sys
from typing import Any

import numpy as np

from protocols import (
    PROTOCOLS,
    DropoutPlan,
    ProtocolError,
    Reveal,
    SecureSum,
    VectorSpec,
    descriptor,
)
from protocols.faults import Tamper, TamperingNetwork, applies, equivocate
from secure_fl.cli.keys import add_key_options, key_bits_problem


def register(sub: Any) -> None:
    p = sub.add_parser("sum", help="run one secure-sum round on random inputs and check it",
                       description=__doc__)
    p.add_argument("--protocol", choices=list(PROTOCOLS), default="paillier")
    p.add_argument("--clients", type=int, default=10, help="number of clients (default 10)")
    p.add_argument("--length", type=int, default=56, help="vector length (default 56)")
    p.add_argument("--bound", type=int, default=1, help="inputs are integers in [0, BOUND] (default 1)")
    add_key_options(p)
    p.add_argument("--keyholder", choices=["agent", "all", "server"], default="agent",
                   help="who holds the HE secret key (default: an agent client)")
    p.add_argument("--dropout", type=float, default=0.0, metavar="FRACTION",
                   help="fraction of clients that vanish (default 0)")
    p.add_argument("--dropout-stage", default="upload",
                   help="stage at which they vanish (default: upload)")
    p.add_argument("--pool", action="store_true",
                   help="Paillier: precompute each client's obfuscators offline before the round")
    p.add_argument("--seed", type=int, default=None, help="seed for the random inputs (not for keys)")
    p.add_argument("--authenticate", action="store_true",
                   help="sign every message with keys registered at set-up and check every signature")
    p.add_argument("--active-server", action="store_true",
                   help="masking/secagg+: defend against a server that deviates (signed keys, consistency "
                        "round, majority threshold)")
    p.add_argument("--tamper", default=None, metavar="KIND:PARTY",
                   help="inject one fault: share, upload, replay, forge (by client PARTY) or equivocate (the "
                        "server, about client PARTY); implies --authenticate")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run)


def _options(args: argparse.Namespace) -> dict[str, Any]:
    """The generic flags the chosen protocol takes (an HE key holder it has no mode for is refused)."""
    return descriptor(args.protocol).applicable(
        key_bits=args.key_bits, keyholder=args.keyholder, allow_weak_keys=args.insecure_test_keys,
        active_server=args.active_server)


def _fill_pools(session: SecureSum, spec: VectorSpec) -> None:
    """Paillier ``--pool``: each client precomputes, through its own session, one obfuscator per
    ciphertext it will upload (offline, before the round)."""
    from protocols.paillier import PaillierClientSession

    for pid in session.clients:
        client = session.client_session(pid)
        if isinstance(client, PaillierClientSession) and client.keys is not None:
            client.fill_pool(client.layout(spec).num_plaintexts)


def _params(session: SecureSum, participants: int, spec: VectorSpec) -> dict[str, Any]:
    """The protocol's public options (and a masking run's degree and threshold; the parameters
    an HE protocol chose for this spec, when it sizes them per sum)."""
    options = session.options
    out: dict[str, Any] = {}
    if options is not None and dataclasses.is_dataclass(options):
        out = {f.name: getattr(options, f.name) for f in dataclasses.fields(options) if f.init}
    chosen = getattr(session.server, "public_parameters", None)
    if callable(chosen):
        out.update(chosen(spec))
    from protocols.masking import MaskingServerSession

    if isinstance(session.server, MaskingServerSession):
        group = session.server.parameters(participants)
        out.update(degree=group.degree, threshold=group.threshold)
    return out


class UsageError(Exception):
    """A flag, spec or option that cannot be run as given (exit 2)."""


def _check(args: argparse.Namespace) -> Tamper | None:
    """Every usage and configuration check that needs no key material; the tamper, if any."""
    if args.clients < 1 or args.length < 1 or args.bound < 1:
        raise UsageError("--clients, --length and --bound must be positive")
    if not 0.0 <= args.dropout < 1.0:
        raise UsageError("--dropout must be in [0, 1)")
    d = descriptor(args.protocol)
    problem = key_bits_problem(args, uses_paillier=d.name == "paillier")
    if problem is not None:
        raise UsageError(problem)
    if args.dropout_stage not in d.stages.values():
        raise UsageError(f"--dropout-stage {args.dropout_stage!r} is not a stage of {d.name} "
                         f"({', '.join(sorted(set(d.stages.values())))})")
    if args.active_server and d.family != "masking":
        raise UsageError("--active-server applies to masking and secagg+ only")
    if args.tamper is None:
        return None
    try:
        tamper = Tamper.parse(args.tamper)
    except ValueError as error:
        raise UsageError(str(error)) from None
    if not applies(tamper, d.family):
        raise UsageError(f"--tamper {tamper.kind} applies to masking and secagg+ only")
    if not 0 <= tamper.party < args.clients:
        raise UsageError(f"--tamper names client {tamper.party}; clients are 0..{args.clients - 1}")
    return tamper


def _excluded(outcome: Any) -> dict[str, str]:
    """Who was left out and why: parties out of the sum, and contributors whose input counts but
    one of whose messages (a wrong share, a replay in their name) was left out."""
    out = {pid: reason for pid, reason in outcome.excluded.items()}
    out.update({pid: f"{reason} (left out; its input counts)" for pid, reason in outcome.flagged.items()})
    return {str(pid): out[pid] for pid in sorted(out)}


def run(args: argparse.Namespace) -> int:
    try:
        tamper = _check(args)
        spec = VectorSpec(length=args.length, bound=args.bound, summands=args.clients)
        options = descriptor(args.protocol).options(**_options(args))
    except (UsageError, ValueError) as error:  # flags, spec or options this protocol cannot take as given
        if args.json and args.tamper is not None:
            print(json.dumps({"protocol": args.protocol, "tamper": args.tamper,
                              "error": {"class": "UsageError", "message": str(error)}}))
        print(f"error: {error}", file=sys.stderr)
        return 2
    # Inputs and the choice of who drops are experiment randomness, never key material.
    rng = np.random.default_rng(args.seed if args.seed is not None else secrets.randbits(64))
    clients = list(range(args.clients))
    inputs = {pid: rng.integers(0, args.bound + 1, size=args.length) for pid in clients}
    n_drop = round(args.dropout * args.clients)
    dropped = sorted(int(c) for c in rng.choice(clients, size=n_drop, replace=False))
    d = descriptor(args.protocol)
    network = None if tamper is None else TamperingNetwork(tamper, input_stages=d.input_stages)
    try:
        session = SecureSum(args.protocol, clients=clients, options=options, network=network,
                            authenticate=args.authenticate or tamper is not None)
        session.server.check(spec=spec, reveal=Reveal())  # the sum's parameters (HE key sets are per parameter set)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if network is not None and tamper is not None and tamper.kind == "share":
        network.sign_as(session.identities[tamper.party])  # the party itself sends the wrong share
    servers = equivocate(session, tamper.party) if tamper is not None and tamper.kind == "equivocate" else []
    try:
        session.setup(round=-1)  # the key set-up, as messages between the parties (none for unkeyed protocols)
        if args.pool:
            _fill_pools(session, spec)
        setup_bytes = session.transcript.total_bytes()
        outcome = session.sum(inputs, spec=spec, statistic="sum", round=0,
                              dropouts=DropoutPlan({pid: args.dropout_stage for pid in dropped}))
    except ProtocolError as error:
        if tamper is not None and args.json:
            report: dict[str, Any] = {"protocol": args.protocol, "tamper": str(tamper),
                                      "error": {"class": type(error).__name__, "message": str(error)}}
            if servers:
                report["input_exposed"] = any(server.stolen for server in servers)
            print(json.dumps(report))
        print(f"error: {type(error).__name__}: {error}", file=sys.stderr)
        return 1
    truth = np.sum([inputs[pid] for pid in outcome.contributors], axis=0)
    tolerance = session.tolerance(spec, len(outcome.contributors))
    correct = bool(np.all(np.abs(outcome.total - truth) <= tolerance + 1e-12))
    run_entries = session.transcript.select(run_id=outcome.run_id)
    uploads = [e.bytes for e in run_entries if e.stage == "upload" and e.sender in clients]
    report = {
        "protocol": args.protocol,
        "clients": args.clients,
        "length": args.length,
        "dropouts": len(outcome.dropped),
        "correct": correct,
        "seconds": {
            "client": outcome.timings.client_upload_median,
            "aggregate": outcome.timings.aggregate,
            "finalize": outcome.timings.finalize,
        },
        "bytes": {
            "upload_per_client": int(np.median(uploads)) if uploads else 0,
            "total": session.transcript.total_bytes(run_entries),
        },
        "params": _params(session, len(inputs), spec),
    }
    if tamper is not None:
        report["tamper"] = str(tamper)
        report["excluded"] = _excluded(outcome)
        if servers:
            report["input_exposed"] = any(server.stolen for server in servers)
    if args.json:
        print(json.dumps(report))
    else:
        _print_table(report, rejected=len(outcome.rejected), setup_bytes=setup_bytes)
    return 0 if correct else 1


def _print_table(report: dict[str, Any], *, rejected: int, setup_bytes: int) -> None:
    rows = [
        ("protocol", report["protocol"]),
        ("clients / dropped", f"{report['clients']} / {report['dropouts']}"),
        ("vector length", report["length"]),
        ("correct", "yes" if report["correct"] else "NO"),
        ("client upload (median)", f"{report['seconds']['client'] * 1e3:.2f} ms"),
        ("server aggregation", f"{report['seconds']['aggregate'] * 1e3:.2f} ms"),
        ("finalisation", f"{report['seconds']['finalize'] * 1e3:.2f} ms"),
        ("upload per client", f"{report['bytes']['upload_per_client']:,} B"),
        ("round total", f"{report['bytes']['total']:,} B"),
        ("key set-up", f"{setup_bytes:,} B"),
        ("rejected messages", rejected),
    ]
    if "tamper" in report:
        rows.append(("tamper", report["tamper"]))
        rows.extend((f"excluded client {pid}", reason) for pid, reason in report["excluded"].items())
        if "input_exposed" in report:
            rows.append(("input exposed to the server", "YES" if report["input_exposed"] else "no"))
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        print(f"{key:<{width}}  {value}")
