"""Every secure sum on the two statistics whose sizes issue 23 set targets for, side by side
(docs/performance.md, "Compact homomorphic sums"):

* ``counts``: integers up to 2**16 (label histograms, registries, sample totals);
* ``updates``: model updates clipped to 1.0 at 2**-24 resolution, signed (the runtime's
  ``update_clip`` and ``update_frac_bits`` defaults).

100 clients (10 under ``SECURE_FL_BENCH_SMALL``), d = 10**3, 10**5, 10**6; every sum learned by
the server only. The sums:

* ``ckks-legacy``: CKKS under the one parameter set every sum used before parameters were
  derived (N = 8192, primes 60, 40, 40, 60, scale 2**40), agent key holder;
* ``ckks`` / ``bfv``: parameters derived from the sum, agent key holder (the agent uploads a
  seeded secret-key ciphertext, the others public-key ones);
* ``ckks-all`` / ``bfv-all``: the same with every client holding the key (every upload seeded);
* ``paillier``: packed, 2048-bit key, agent key holder; the timed client computes its r^n
  online, every other client draws from a pool (as in ``bench_paillier``);
* ``masking``: SecAgg on the complete graph.

``Round.track_bytes_per_value`` is the median bytes one client sends in one sum (every stage:
masking's keys and shares included) per entry of the vector.
"""

from __future__ import annotations

from typing import Any, ClassVar
from unittest import mock

from protocols import SecureSum, VectorSpec, make_sum
from protocols.encoding import PackingLayout
from protocols.primitives import paillier as paillier_raw

from . import _harness as h
from .bench_ckks import LEGACY_OPTIONS
from .bench_paillier import CHEAP, _Paillier

SUMS = h.pick(("ckks-legacy", "ckks", "ckks-all", "bfv", "bfv-all", "paillier", "masking"),
              ("ckks-legacy", "bfv-all", "paillier", "masking"))  # CI: bench_ckks/bench_bfv smoke the rest
LENGTHS = h.pick((1000, 100_000, 1_000_000), (1000,))
CLIENTS = h.pick((100,), (10,))
STATISTICS = h.pick(("counts", "updates"), ("counts",))
HELD_BYTES = 3 * 10**9
"""Largest total of uploads a run holds at once (every stage after the upload needs a whole run)."""
KEY_BITS = 2048
OPTIONS: dict[str, dict[str, Any]] = {
    "ckks-legacy": LEGACY_OPTIONS, "ckks-all": {"keyholder": "all"}, "bfv-all": {"keyholder": "all"},
}


def statistic_spec(clients: int, length: int, statistic: str) -> VectorSpec:
    if statistic == "counts":
        return VectorSpec(length=length, bound=2**16, summands=clients, kind="int")
    return VectorSpec(length=length, bound=1.0, summands=clients, kind="float", signed=True, frac_bits=24)


class _Compact(h._Protocol):
    params: ClassVar[list[Any]] = [CLIENTS, LENGTHS, SUMS, STATISTICS]
    param_names: ClassVar[list[str]] = ["clients", "length", "sum", "statistic"]

    def setup_cache(self) -> Any:
        return {KEY_BITS: paillier_raw.generate_keypair(KEY_BITS)[1].export_secret()}

    def setup(self, cache: Any, clients: int, length: int, *extra: Any) -> None:
        name = extra[0]
        self.protocol = name.split("-")[0]
        self.replay = "full" if name == "masking" else "party"
        super().setup(cache, clients, length, *extra)  # type: ignore[misc]

    def spec(self, clients: int, length: int, *extra: Any) -> VectorSpec:
        return statistic_spec(clients, length, extra[1])

    def session(self, cache: Any, clients: int, length: int, *extra: Any) -> SecureSum:
        name, ids = extra[0], list(range(clients))
        if name == "masking":
            return make_sum("masking", clients=ids)
        if name == "paillier":
            p, q = cache[KEY_BITS]
            public = paillier_raw.PublicKey(p * q)
            private = paillier_raw.PrivateKey(public, p, q)
            session = make_sum("paillier", clients=ids, key_bits=KEY_BITS)
            with mock.patch.object(paillier_raw, "generate_keypair", lambda *a, **k: (public, private)):
                session.setup()  # the key set-up run, untimed
            self._cheap = [paillier_raw.obfuscator(public) for _ in range(CHEAP)]
            return session
        session = make_sum(name.split("-")[0], clients=ids, **OPTIONS.get(name, {}))
        session.server.check(spec=self.spec(clients, length, *extra), reveal=h.REVEAL)
        session.setup()  # the key set-up run for the sum's parameter set, untimed
        return session

    def prepare(self, session: SecureSum, spec: VectorSpec, timed: int | None, *extra: Any) -> None:
        if extra[0] == "paillier":
            _Paillier.prepare(self, session, spec, timed, KEY_BITS, "online")  # type: ignore[arg-type]

    def unsupported(self, label: str, clients: int, length: int, *extra: Any) -> str | None:
        name, spec = extra[0], self.spec(clients, length, *extra)
        if name == "paillier":
            per_client = PackingLayout.for_spec(spec, capacity_bits=KEY_BITS - 1).num_plaintexts
            if label == "upload":
                return f"{per_client} ciphertexts per client" if per_client > 2000 else None
            if clients * per_client > 200_000:
                return f"{clients} x {per_client} ciphertexts"
            return None
        if name == "masking":
            return super().unsupported(label, clients, length)
        from protocols import descriptor

        options = descriptor(name.split("-")[0]).options(**OPTIONS.get(name, {}))
        params = options.parameters_for(spec)
        per_client = params.chunks(length)
        if label == "upload":
            return None if per_client <= 300 else f"{per_client} ciphertexts per client"
        held = clients * per_client * 2 * params.poly_modulus_degree * params.data_bits // 8
        return f"{clients} x {per_client} ciphertexts ({held / 1e9:.1f} GB) at once" if held > HELD_BYTES else None


class ClientUpload(_Compact, h._ClientUpload):
    pass


class ServerAggregate(_Compact, h._ServerAggregate):
    pass


class Finalize(_Compact, h._Finalize):
    pass


class Round(_Compact, h._Round):
    pass
