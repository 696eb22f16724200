"""What verified aggregates cost (issue 22, item 7): the same CKKS/BFV sum with and without
``verify_aggregate``, in one process, both with sender authentication.

Reports per case the wall time of the sum, the bytes every party moved, the bytes the decryptor
received, the extra stages' bytes (``challenge``, ``tag``), the median contributor's time to
tag its upload, and the decryptor's and server's verification time. Timings on a shared machine
are noisy: compare the two rows of a case, measured back to back.

    .venv/bin/python bench/verified_sum.py            # d = 10 (n = 100) and d = 10**6 (n = 10)
    .venv/bin/python bench/verified_sum.py --quick    # d = 10 and d = 10**5 (n = 10)
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

import numpy as np

from protocols import Reveal, VectorSpec, make_sum


def case(name: str, *, n: int, d: int, verify: bool, kind: str, seed: int = 0) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    if kind == "count":
        spec = VectorSpec(length=d, bound=65535, summands=n)
        inputs = {i: rng.integers(0, 65536, d) for i in range(n)}
    else:
        spec = VectorSpec(length=d, bound=1.0, summands=n, kind="float", signed=True, frac_bits=24)
        inputs = {i: rng.uniform(-1.0, 1.0, d) for i in range(n)}
    session = make_sum(name, clients=range(n), authenticate=True, verify_aggregate=verify)
    session.server.check(spec=spec, reveal=Reveal())
    session.setup()
    servers: list[Any] = []
    original = session.server.open

    def open_(**kwargs: Any) -> Any:
        servers.append(original(**kwargs))
        return servers[-1]

    session.server.open = open_
    start = time.perf_counter()
    out = session.sum(inputs, spec=spec)
    wall = time.perf_counter() - start
    run = [e for e in session.transcript if e.run_id == out.run_id]
    agent = session.server.agent
    parties = session.parties()
    attest = [p.timings["attest"] for p in parties.values() if "attest" in p.timings]
    return {
        "protocol": name, "n": n, "d": d, "verify": verify, "wall_s": round(wall, 3),
        "bytes_total": sum(e.bytes for e in run),
        "bytes_to_decryptor": sum(e.bytes for e in run if e.receiver == agent),
        "bytes_challenge": sum(e.bytes for e in run if e.stage == "challenge"),
        "bytes_tag": sum(e.bytes for e in run if e.stage == "tag"),
        "attest_median_s": round(statistics.median(attest), 4) if attest else 0.0,
        "decryptor_verify_s": round(parties[agent].timings.get("verify", 0.0), 4) if agent in parties else 0.0,
        "server_verify_s": round(servers[0].timings.get("verify", 0.0), 4),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="d = 10**5 instead of 10**6 for the update")
    args = parser.parse_args()
    cases = [(name, 100, 10, "count") for name in ("ckks", "bfv")]
    cases += [("ckks", 10, 10**5 if args.quick else 10**6, "update")]
    for name, n, d, kind in cases:
        for verify in (False, True):
            print(json.dumps(case(name, n=n, d=d, verify=verify, kind=kind)), flush=True)


if __name__ == "__main__":
    main()
