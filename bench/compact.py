"""Compact homomorphic sums, measured in one run: bytes per value and per-stage times of every
secure sum on the two statistics issue 23 sets targets for, as ratios against CKKS as it was
(one parameter set, N = 8192, primes 60/40/40/60, scale 2**40, one real per slot).

    git worktree add /tmp/ckks-before fce889f       # the code before (CKKS with fixed parameters)
    .venv/bin/python bench/compact.py --before /tmp/ckks-before [--lengths 1000 100000 1000000]

``--before`` runs the old code's CKKS in a subprocess (same machine, same run, same inputs);
without it the table's reference is CKKS under the legacy parameters through the current code.
The statistics (``summands`` = 100 in the spec, so the parameters are those of 100 clients; a few
clients take part, which changes neither bytes nor per-value client times):

* ``counts``: integers in [0, 2**16];
* ``updates``: floats in [-1, 1] at 2**-24 resolution (the runtime's ``update_clip`` and
  ``update_frac_bits`` defaults).

Per sum and length, one JSON line: ``bytes_per_value`` (median bytes one client sends in the sum,
every stage, per entry; for the HE sums a client without the key, i.e. a public-key upload —
``seeded_bytes_per_value`` is the agent's seeded upload alone), ``client_s_per_value`` (median ``upload`` stage
per entry), ``aggregate_s_per_client`` (the server's ``aggregate`` per contributor),
``finalize_s`` (the key holder's decryption, or unmasking), ``params``. Then a markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any

import numpy as np

SUMMANDS = 100
SUMS = ("ckks-before", "ckks-legacy", "ckks", "ckks-all", "bfv", "bfv-all", "paillier", "masking")
LEGACY = {"poly_modulus_degree": 8192, "coeff_mod_bit_sizes": (60, 40, 40, 60), "scale_bits": 40}
OPTIONS: dict[str, dict[str, Any]] = {
    "ckks-before": {}, "ckks-legacy": LEGACY, "ckks": {}, "ckks-all": {"keyholder": "all"}, "bfv": {},
    "bfv-all": {"keyholder": "all"}, "paillier": {"key_bits": 2048}, "masking": {},
}


def spec_of(statistic: str, length: int) -> Any:
    from protocols import VectorSpec

    if statistic == "counts":
        return VectorSpec(length=length, bound=2**16, summands=SUMMANDS, kind="int")
    return VectorSpec(length=length, bound=1.0, summands=SUMMANDS, kind="float", signed=True, frac_bits=24)


def inputs_of(statistic: str, length: int, clients: int) -> dict[int, np.ndarray]:
    rng = np.random.default_rng(23)
    if statistic == "counts":
        return {i: rng.integers(0, 2**16 + 1, length) for i in range(clients)}
    return {i: rng.uniform(-1.0, 1.0, length) for i in range(clients)}


def measure(name: str, statistic: str, length: int, clients: int) -> dict[str, Any]:
    """One sum of ``clients`` inputs under ``name``, after its key set-up (untimed)."""
    from protocols import Reveal, make_sum

    protocol = name.split("-")[0]
    spec = spec_of(statistic, length)
    values = inputs_of(statistic, length, clients)
    session = make_sum(protocol, clients=list(range(clients)), **OPTIONS[name])
    reveal = Reveal(server=True, clients=False)
    if name != "ckks-before":
        session.server.check(spec=spec, reveal=reveal)
    session.setup()
    if protocol == "paillier":
        for pid in session.clients:  # obfuscators offline, before the round (the upload then costs no r^n)
            client = session.client_session(pid)
            client.fill_pool(client.layout(spec).num_plaintexts)  # type: ignore[attr-defined]
    out = session.sum(values, spec=spec, reveal=reveal, statistic="bench")
    truth = np.sum([values[p] for p in out.contributors], axis=0)
    exact = bool(np.max(np.abs(out.total - truth)) <= session.tolerance(spec, len(out.contributors)) + 1e-12)
    agent = getattr(session.server, "agent", None)
    sent: dict[int, int] = {}
    for entry in session.transcript.select(run_id=out.run_id):
        if entry.sender != 0xFFFFFFFF:
            sent[entry.sender] = sent.get(entry.sender, 0) + entry.bytes
    keyless = [b for pid, b in sent.items() if pid != agent or OPTIONS[name].get("keyholder") == "all"]
    seeded = sum(e.bytes for e in session.transcript.select(run_id=out.run_id)  # the agent's own upload
                 if e.stage == "upload" and e.sender == agent and name in ("ckks", "bfv"))
    parties = session.parties()
    uploads = [p.timings["upload"] for pid, p in parties.items() if "upload" in p.timings and
               (pid != agent or OPTIONS[name].get("keyholder") == "all")]
    params: dict[str, Any] = {}
    describe = getattr(session.server, "public_parameters", None)
    if callable(describe):
        params = describe(spec)
    elif protocol == "ckks":
        options = session.server.options
        params = {"poly_modulus_degree": options.poly_modulus_degree,
                  "coeff_mod_bit_sizes": list(options.coeff_mod_bit_sizes), "scale_bits": options.scale_bits}
    return {
        "sum": name, "statistic": statistic, "length": length, "clients": clients, "exact": exact,
        "bytes_per_value": statistics.median(keyless) / length,
        "seeded_bytes_per_value": (seeded / length if seeded else None),
        "client_s_per_value": statistics.median(uploads) / length,
        "aggregate_s_per_client": out.timings.aggregate / len(out.contributors),
        "finalize_s": out.timings.finalize, "params": params,
    }


def forms() -> list[dict[str, Any]]:
    """Bytes per value of one ciphertext in each serialisation on offer, under the parameters
    derived for each statistic (agent mode): TenSEAL's ``CKKSVector.serialize()`` (one real per
    slot), SEAL's stream without compression (``compr_mode_type::none``; the Python bindings
    write only SEAL's default, zstd, so this is the size zstd's frame declares), SEAL's stream with
    zstd, for a public-key ciphertext and for a seeded secret-key one."""
    import tenseal as ts

    from protocols.bfv import BfvOptions
    from protocols.ckks import CkksOptions
    from protocols.primitives import seal

    out = []
    for statistic in ("counts", "updates"):
        spec = spec_of(statistic, 8192)
        for options in (CkksOptions(**LEGACY), CkksOptions(), BfvOptions()):
            params = options.parameters_for(spec)
            public_bytes, secret_bytes = seal.generate(params)
            scheme = __import__(f"protocols.primitives.{params.scheme}", fromlist=["PublicContext"])
            public = scheme.PublicContext(public_bytes, params)
            secret = scheme.SecretContext(secret_bytes, public)
            per = params.values_per_ciphertext
            values = np.random.default_rng(1).integers(0, 2**16, per).astype(np.uint64)
            full, seeded = public.encrypt(values)[0], secret.encrypt(values)[0]
            row = {"statistic": statistic, "parameters": str(params), "values_per_ciphertext": per,
                   "public_context_bytes": len(public_bytes),
                   "seal_none": public.layout.uncompressed_size / per, "seal_zstd": len(full) / per,
                   "seeded_none": public.seeded_layout.uncompressed_size / per, "seeded_zstd": len(seeded) / per}
            if params.scheme == "ckks":
                ctx = ts.context(ts.SCHEME_TYPE.CKKS, poly_modulus_degree=params.poly_modulus_degree,
                                 coeff_mod_bit_sizes=list(params.coeff_mod_bit_sizes))
                ctx.global_scale = params.scale
                slots = params.poly_modulus_degree // 2
                row["tenseal_vector"] = len(ts.ckks_vector(ctx, values[:slots].astype(float).tolist()).serialize()) / slots
            else:
                ctx = ts.context(ts.SCHEME_TYPE.BFV, poly_modulus_degree=params.poly_modulus_degree,
                                 plain_modulus=params.plain_modulus, coeff_mod_bit_sizes=list(params.coeff_mod_bit_sizes))
                row["tenseal_vector"] = len(ts.bfv_vector(ctx, values.astype(np.int64).tolist()).serialize()) / per
            out.append(row)
    return out


def skip(name: str, length: int) -> bool:
    return name == "paillier" and length > 100_000  # ~12,000 ciphertexts per client: minutes of r^n


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", help="a checkout of the code before (CKKS with fixed parameters)")
    parser.add_argument("--lengths", type=int, nargs="+", default=[1000, 100_000, 1_000_000])
    parser.add_argument("--clients", type=int, default=8, help="clients taking part (default 8)")
    parser.add_argument("--sums", nargs="+", default=list(SUMS), choices=SUMS)
    parser.add_argument("--statistics", nargs="+", default=["counts", "updates"], choices=["counts", "updates"])
    parser.add_argument("--forms", action="store_true", help="bytes per value of each serialisation on offer")
    parser.add_argument("--one", nargs=3, metavar=("SUM", "STATISTIC", "LENGTH"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.forms:
        for row in forms():
            print(json.dumps(row))
        return 0
    if args.one:
        print(json.dumps(measure(args.one[0], args.one[1], int(args.one[2]), args.clients)))
        return 0
    rows = []
    for statistic in args.statistics:
        for length in args.lengths:
            for name in args.sums:
                if skip(name, length) or (name == "ckks-before" and not args.before):
                    continue
                env = dict(os.environ)
                if name == "ckks-before":
                    env["PYTHONPATH"] = os.path.abspath(args.before)
                started = time.perf_counter()
                done = subprocess.run(
                    [sys.executable, os.path.abspath(__file__), "--clients", str(args.clients), "--one", name,
                     statistic, str(length)], env=env, capture_output=True, text=True, check=False,
                    cwd=os.path.abspath(args.before) if name == "ckks-before" else None)
                if done.returncode:
                    print(f"{name} {statistic} {length}: failed\n{done.stderr[-2000:]}", file=sys.stderr)
                    continue
                row = json.loads(done.stdout.strip().splitlines()[-1])
                row["wall_s"] = round(time.perf_counter() - started, 1)
                print(json.dumps(row), flush=True)
                rows.append(row)
    print_table(rows)
    return 0


def print_table(rows: list[dict[str, Any]]) -> None:
    reference = {(r["statistic"], r["length"]): r for r in rows if r["sum"] == "ckks-before"}
    if not reference:
        reference = {(r["statistic"], r["length"]): r for r in rows if r["sum"] == "ckks-legacy"}
    print("\n| statistic | d | sum | parameters | B/value | × ref | client µs/value | × ref | "
          "server ms/client | × ref | decrypt ms | exact |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        ref = reference.get((r["statistic"], r["length"]))
        p = r["params"]
        if "plain_modulus" in p:
            shown = f"N={p['poly_modulus_degree']} {p['coeff_mod_bit_sizes']} t≈2^{p['plain_modulus'].bit_length()}"
        elif "scale_bits" in p:
            shown = f"N={p['poly_modulus_degree']} {p['coeff_mod_bit_sizes']} Δ=2^{p['scale_bits']}"
        else:
            shown = ""

        def ratio(key: str, r: dict[str, Any] = r, ref: dict[str, Any] | None = ref) -> str:
            return f"{r[key] / ref[key]:.3f}" if ref and ref[key] else "–"

        print(f"| {r['statistic']} | {r['length']:,} | {r['sum']} | {shown} | {r['bytes_per_value']:.2f} | "
              f"{ratio('bytes_per_value')} | {r['client_s_per_value'] * 1e6:.3f} | {ratio('client_s_per_value')} | "
              f"{r['aggregate_s_per_client'] * 1e3:.2f} | {ratio('aggregate_s_per_client')} | "
              f"{r['finalize_s'] * 1e3:.1f} | {'yes' if r['exact'] else 'NO'} |")


if __name__ == "__main__":
    sys.exit(main())
