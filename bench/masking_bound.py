"""How close a masking client runs to the PRG bound, and the work behind it.

A SecAgg/SecAgg+ client with ``n`` neighbours expands ``n + 1`` masks (one per neighbour
and its self mask) of ``d`` words each. Whatever else it does, it cannot be faster than
generating those ``(n + 1) * d * word`` bytes of AES-128-CTR keystream; this module
measures that bound with pyca/cryptography alone (``update_into`` a reused buffer, the
fastest way it offers) and our client's ``upload`` stage (X25519 agreement, HKDF,
expansion, masking, serialisation), both in this process.

    PYTHONPATH=. python bench/masking_bound.py [--neighbours 100] [--length 1000000]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from typing import Any

from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from benchmarks import _harness as h

from protocols import SERVER, make_sum
from protocols.masking import word_dtype


def keystream_seconds(streams: int, nbytes: int, *, repeats: int = 3) -> list[float]:
    """Seconds to produce ``streams`` AES-128-CTR keystreams of ``nbytes`` into one reused buffer."""
    zeros = bytes(nbytes)
    out = bytearray(nbytes + 16)
    keys = [os.urandom(16) for _ in range(streams)]
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for key in keys:
            cipher = Cipher(algorithms.AES(key), modes.CTR(bytes(16))).encryptor()
            cipher.update_into(zeros, out)
        times.append(time.perf_counter() - t0)
    return times


def client_upload_seconds(neighbours: int, length: int, *, sample: int = 5,
                          protocol: str = "masking") -> dict[str, Any]:
    """Our masking clients' ``upload`` stage on the complete graph of ``neighbours + 1`` clients.

    Drives one run, its parties built through the client and server sessions, to the upload
    stage (key advertisement and sharing are not timed), then lets ``sample`` clients upload,
    each timed by the protocol itself (``Party.timings``).
    """
    clients = neighbours + 1
    session = make_sum(protocol, clients=list(range(clients)))
    spec = h.spec_for(clients, length)
    encoded = h.encoded_inputs(spec, clients)
    run = h.Run(session, spec, encoded, run_id=os.urandom(16))
    times: list[float] = []
    while run.next_event is not None and len(times) < sample:
        event, changed = run.step()
        if event.party != SERVER and "upload" in changed:
            times.append(changed["upload"])
    if not times:
        raise RuntimeError("no client uploaded")
    return {"times": times, "word_bytes": word_dtype(spec.slot_bits).itemsize, "clients": clients}


def measure(neighbours: int = 100, length: int = 1_000_000, *, sample: int = 5) -> dict[str, Any]:
    ours = client_upload_seconds(neighbours, length, sample=sample)
    nbytes = length * ours["word_bytes"]
    bound = keystream_seconds(neighbours + 1, nbytes, repeats=max(3, sample))
    ours_median = statistics.median(ours["times"])
    bound_median = statistics.median(bound)
    return {
        "case": "masking-bound",
        "ours": ours_median,
        "peer": bound_median,
        "ratio": ours_median / bound_median,
        "unit": "seconds",
        "detail": {
            "neighbours": neighbours, "length": length, "word_bytes": ours["word_bytes"],
            "keystream_bytes": (neighbours + 1) * nbytes,
            "ours_min": min(ours["times"]), "peer_min": min(bound),
            "fraction_of_bound": bound_median / ours_median,
            "peer_is": "AES-128-CTR keystream of the same bytes (cryptography, update_into a reused buffer)",
            "keystream_gb_per_s": (neighbours + 1) * nbytes / min(bound) / 1e9,
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--neighbours", type=int, default=100)
    parser.add_argument("--length", type=int, default=1_000_000)
    parser.add_argument("--sample", type=int, default=5)
    args = parser.parse_args()
    print(json.dumps(measure(args.neighbours, args.length, sample=args.sample)))


if __name__ == "__main__":
    main()
