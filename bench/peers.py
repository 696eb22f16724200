"""Side-by-side comparisons with peers, each measured in this one process.

    PYTHONPATH=. python bench/peers.py CASE [options]

Prints one JSON object ``{"case", "ours", "peer", "ratio", "unit", "detail"}`` with
``ratio = ours / peer``: below 1, we are faster (or smaller). Cases:

``paillier-registry``
    Client upload seconds for Dubhe's registry (1000 clients x 56 entries of 0/1, 2048-bit
    key): our packed Paillier client (r^n computed online) vs one phe ciphertext per entry.
``masking-bound``
    One masking client's upload stage (n = 100 neighbours, d = 1e6) vs generating the same
    AES-128-CTR keystream bytes (see bench/masking_bound.py).
``masking-active``
    One masking client's whole per-run work (every stage) with ``active_server=True`` (signed
    keys, consistency round) vs the default client of the code before issue 22's speed work
    (git commit ``masking_bound.BASELINE``), n = 100 neighbours, d = 1e6, alternating run by run
    (``--sample`` runs each; see bench/masking_bound.py).
``masking-flower``
    The same client work with Flower's SecAgg+ primitives (P-384 ECDH from serialised keys,
    masks from ``pseudo_rand_gen``, int64 arithmetic); skipped when ``flwr`` is not installed.
``ckks-bytes``
    Bytes of one client's public-key CKKS upload (d = 1e6, parameters derived from the sum, or
    ``--ring N``) vs ceil(d / slots) x one TenSEAL ciphertext under the same parameters,
    serialised the usual way (``CKKSVector.serialize()``, one real per slot).
``simulation``
    One FedAvg round vs one centralised epoch (runs bench/simulation.py): ``ours``/``ratio`` are the
    default client path (vectorised, the client pool); ``loop``/``loop_ratio`` the per-client loop.
``flower-secagg``
    Our masking through Flower vs Flower's own ``SecAggPlusWorkflow`` on the same SuperLink and
    SuperNodes, same n and d: seconds and bytes per round (runs bench/flower_secagg.py; its
    options after the case name, see ``bench/flower_secagg.py --help``).

Exit status: 0 on success (or a skip, reported as ``{"case", "skipped"}``), 2 when a case
cannot run here (unknown case, missing script).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

CASES = ("paillier-registry", "masking-bound", "masking-active", "masking-flower", "ckks-bytes", "simulation", "flower-secagg")
SCRIPTS = {"simulation": "simulation.py", "flower-secagg": "flower_secagg.py"}
"""Cases run as their own script (its options follow the case name)."""


def result(case: str, ours: float, peer: float, unit: str, **detail: Any) -> dict[str, Any]:
    return {"case": case, "ours": ours, "peer": peer, "ratio": ours / peer, "unit": unit, "detail": detail}


# --- paillier-registry ------------------------------------------------------------------------

def paillier_registry(args: argparse.Namespace) -> dict[str, Any]:
    import paillier_registry as registry
    from benchmarks import _harness as h
    from phe import paillier as phe_paillier

    from protocols import SERVER, VectorSpec, encode, make_sum
    from protocols.paillier import PaillierServerSession

    clients, length = args.clients or 1000, args.length or 56
    registries = registry.make_registries(clients, length)
    session = make_sum("paillier", clients=list(range(clients)), key_bits=args.key_bits)
    session.setup()  # the key set-up run (messages between the parties), untimed
    server = session.server
    assert isinstance(server, PaillierServerSession) and server.public_key is not None
    public = server.public_key
    phe_pk = phe_paillier.PaillierPublicKey(int(public.n))
    spec = VectorSpec(length=length, bound=1, summands=clients)
    encoded = {pid: encode(spec, registries[pid]).values for pid in range(clients)}
    run = h.Run(session, spec, encoded, run_id=os.urandom(16))
    ours: list[float] = []
    peer: list[float] = []
    upload_bytes = 0
    while run.next_event is not None and len(ours) < args.sample:
        event, changed = run.step()
        if event.party == SERVER or "upload" not in changed:
            continue
        ours.append(changed["upload"])  # packed, r^n online (the client's pool is empty)
        upload_bytes = len(run.sent[0].envelope.to_bytes())  # what the network carries
        t0 = time.perf_counter()
        entry = registry.per_entry_upload(phe_pk, registries[event.party], public.ciphertext_bytes)
        peer.append(time.perf_counter() - t0)
    return result("paillier-registry", statistics.median(ours), statistics.median(peer), "seconds",
                  clients=clients, length=length, key_bits=args.key_bits, sample=len(ours),
                  ours_is="packed Paillier client upload (protocols.paillier, r^n online)",
                  peer_is="one phe ciphertext per entry (phe 1.5, gmpy2)",
                  ours_bytes=upload_bytes, peer_bytes=len(entry))


# --- masking-bound ----------------------------------------------------------------------------

def masking_bound(args: argparse.Namespace) -> dict[str, Any]:
    import masking_bound

    return masking_bound.measure(args.neighbours, args.length or 1_000_000, sample=max(args.sample, 9))


def masking_active(args: argparse.Namespace) -> dict[str, Any]:
    import masking_bound

    return masking_bound.active_work(args.neighbours + 1, args.length or 1_000_000, repeats=min(args.sample, 3))


# --- masking-flower ---------------------------------------------------------------------------

FLOWER_CLIPPING = 8.0
FLOWER_QUANTIZATION = 1 << 22
FLOWER_MODULUS = 1 << 32
"""SecAggPlusWorkflow's defaults (clipping_range, quantization_range, modulus_range)."""


def flower_client_seconds(neighbours: int, length: int, *, sample: int) -> list[float]:
    """Flower 1.x's SecAgg+ client, stage "collect masked vectors" (secaggplus_mod), for one
    client with ``neighbours`` neighbours: quantise, self mask, per neighbour an ECDH key
    from serialised P-384 keys and a ``pseudo_rand_gen`` mask, modulo, serialise. Opening
    the neighbours' shares is left out on both sides."""
    import numpy as np
    from flwr.common import ndarray_to_bytes
    from flwr.common.secure_aggregation.crypto.symmetric_encryption import generate_shared_key
    from flwr.common.secure_aggregation.ndarrays_arithmetic import (
        factor_combine,
        parameters_addition,
        parameters_mod,
        parameters_multiply,
        parameters_subtraction,
    )
    from flwr.common.secure_aggregation.quantization import quantize
    from flwr.common.secure_aggregation.secaggplus_utils import pseudo_rand_gen

    try:
        from flwr.common.secure_aggregation.crypto.symmetric_encryption import (  # older layouts
            bytes_to_private_key,
            bytes_to_public_key,
            generate_key_pairs,
            private_key_to_bytes,
            public_key_to_bytes,
        )
    except ImportError:
        from flwr.supercore.primitives.asymmetric import (
            bytes_to_private_key,
            bytes_to_public_key,
            generate_key_pairs,
            private_key_to_bytes,
            public_key_to_bytes,
        )

    own_sk, _ = generate_key_pairs()
    sk1 = private_key_to_bytes(own_sk)
    peers = {nid: public_key_to_bytes(generate_key_pairs()[1]) for nid in range(1, neighbours + 1)}
    rd_seed = os.urandom(32)
    update = [np.random.default_rng(0).uniform(-1.0, 1.0, length)]
    times = []
    for _ in range(sample):
        t0 = time.perf_counter()
        q_ratio = FLOWER_QUANTIZATION  # weight 1 = max_weight
        params = parameters_multiply(update, q_ratio / FLOWER_QUANTIZATION)
        quantized = quantize(params, FLOWER_CLIPPING, FLOWER_QUANTIZATION)
        quantized = factor_combine(q_ratio, quantized)
        dims = [a.shape for a in quantized]
        quantized = parameters_addition(quantized, pseudo_rand_gen(rd_seed, FLOWER_MODULUS, dims))
        for nid, pk in peers.items():
            shared = generate_shared_key(bytes_to_private_key(sk1), bytes_to_public_key(pk))
            mask = pseudo_rand_gen(shared, FLOWER_MODULUS, dims)
            op = parameters_addition if nid % 2 else parameters_subtraction
            quantized = op(quantized, mask)
        quantized = parameters_mod(quantized, FLOWER_MODULUS)
        [ndarray_to_bytes(a) for a in quantized]
        times.append(time.perf_counter() - t0)
    return times


def masking_flower(args: argparse.Namespace) -> dict[str, Any]:
    try:
        import flwr
    except ImportError:
        return {"case": "masking-flower", "skipped": "flwr not installed"}
    import masking_bound
    from benchmarks import _harness as h

    from protocols import encode

    length = args.length or 1_000_000
    ours = masking_bound.client_upload_seconds(args.neighbours, length, sample=args.sample)
    spec = h.spec_for(args.neighbours + 1, length)
    vector = h.raw_inputs(1, length)[0]
    t0 = time.perf_counter()
    encode(spec, vector)
    encode_seconds = time.perf_counter() - t0
    ours_times = [t + encode_seconds for t in ours["times"]]
    peer_times = flower_client_seconds(args.neighbours, length, sample=args.sample)
    return result("masking-flower", statistics.median(ours_times), statistics.median(peer_times), "seconds",
                  neighbours=args.neighbours, length=length, flwr=getattr(flwr, "__version__", "?"),
                  ours_is="masking client upload stage + encoding the float vector",
                  peer_is="Flower SecAgg+ collect-masked-vectors work (quantise, P-384 ECDH, "
                          "RandomState masks, int64)",
                  ours_min=min(ours_times), peer_min=min(peer_times))


# --- ckks-bytes -------------------------------------------------------------------------------

def ckks_bytes(args: argparse.Namespace) -> dict[str, Any]:
    import numpy as np
    import tenseal as ts
    from benchmarks import _harness as h

    from protocols import SERVER, make_sum

    length = args.length or 1_000_000
    clients = 2
    spec = h.spec_for(clients, length)
    session = make_sum("ckks", clients=[0, 1], **({"poly_modulus_degree": args.ring} if args.ring else {}))
    session.server.check(spec=spec, reveal=h.REVEAL)
    session.setup()  # the key set-up run (context and keys) for the sum's parameter set, untimed
    params = session.server.parameters(spec)
    agent = session.server.agent
    run = h.Run(session, spec, h.encoded_inputs(spec, clients), run_id=os.urandom(16))
    while run.next_event is not None and not (
            run.next_event.party == SERVER and run.next_event.kind == "receive"
            and run.next_event.message is not None and run.next_event.message.envelope.sender != agent):
        run.step()  # the server's open, the clients' joins and uploads, up to a public-key upload
    event = run.next_event
    assert event is not None and event.message is not None and event.stage == "upload"
    ours = len(event.message.envelope.to_bytes())  # as the network carries and counts it

    context = ts.context(ts.SCHEME_TYPE.CKKS, poly_modulus_degree=params.poly_modulus_degree,
                         coeff_mod_bit_sizes=list(params.coeff_mod_bit_sizes))
    context.global_scale = 2.0**params.scale_bits
    slots = params.poly_modulus_degree // 2
    values = h.encoded_inputs(spec, 1)[0][:slots].astype(np.float64)  # the same encoded inputs
    one = len(ts.ckks_vector(context, values).serialize())
    chunks = math.ceil(length / slots)
    return result("ckks-bytes", float(ours), float(chunks * one), "bytes",
                  length=length, ring=params.poly_modulus_degree, coeff_mod_bit_sizes=list(params.coeff_mod_bit_sizes),
                  scale_bits=params.scale_bits, slots=slots, ciphertexts=math.ceil(length / params.values_per_ciphertext),
                  one_ciphertext_bytes=one,
                  ours_is="one client's public-key CKKS upload envelope (protocols.ckks: two entries per complex "
                          "slot, SEAL's own serialisation), as the network counts it",
                  peer_is="ceil(d / slots) x TenSEAL CKKSVector.serialize() of one full ciphertext (one real per "
                          "slot) under the same parameters")


# --- simulation -------------------------------------------------------------------------------

def simulation(args: argparse.Namespace, rest: list[str]) -> dict[str, Any] | int:
    script = HERE / SCRIPTS[args.case]
    if not script.exists():
        print(f"error: {script} does not exist yet", file=sys.stderr)
        return 2
    env = dict(os.environ)
    root = str(HERE.parent)
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    done = subprocess.run([sys.executable, str(script), *rest], check=False, stdout=subprocess.PIPE, env=env, text=True)
    if done.returncode != 0:
        print(f"error: {script.name} exited with {done.returncode}", file=sys.stderr)
        return done.returncode
    lines = [line for line in done.stdout.splitlines() if line.strip()]
    try:
        data = json.loads(lines[-1]) if lines else None
    except json.JSONDecodeError:
        data = None
    if not isinstance(data, dict) or not {"ours", "peer"} <= set(data):
        print(f"error: {script.name} printed no result object", file=sys.stderr)
        return 1
    data.setdefault("ratio", data["ours"] / data["peer"])
    data["case"] = args.case
    return data


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("case", choices=CASES)
    parser.add_argument("--clients", type=int, default=None, help="paillier-registry: clients (1000)")
    parser.add_argument("--length", type=int, default=None,
                        help="vector length (56 for paillier-registry, 1e6 otherwise)")
    parser.add_argument("--key-bits", type=int, default=2048, help="paillier-registry: modulus bits")
    parser.add_argument("--neighbours", type=int, default=100, help="masking-*: neighbours per client")
    parser.add_argument("--ring", type=int, default=None,
                        help="ckks-bytes: fix the polynomial modulus degree (default: derived from the sum)")
    parser.add_argument("--sample", type=int, default=5, help="timed repetitions / clients")
    args, rest = parser.parse_known_args(argv)
    if rest and args.case not in SCRIPTS:
        parser.error(f"unrecognised arguments: {' '.join(rest)}")
    if args.case in SCRIPTS:
        out: dict[str, Any] | int = simulation(args, rest)
    else:
        out = {"paillier-registry": paillier_registry, "masking-bound": masking_bound, "masking-active": masking_active,
               "masking-flower": masking_flower, "ckks-bytes": ckks_bytes}[args.case](args)
    if isinstance(out, int):
        return out
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
