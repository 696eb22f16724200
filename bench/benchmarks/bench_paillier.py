"""Packed Paillier (2048- and 3072-bit moduli), a client agent holding the key.

Key pairs come from ``setup_cache`` (made once, pickled by asv) and are handed to the
agent by replacing key generation while the session's key set-up run (``SecureSum.setup``:
messages between the server and client sessions) takes place. Obfuscators r^n, through each
client's own session (``PaillierClientSession.fill_pool`` and its pool):

* the timed client of ``ClientUpload`` computes its own, online (``obfuscators="online"``,
  the cost of an encryption from scratch with the public key), or spends ones it precomputed offline
  (``"pool"``, the protocol's ``pool_size`` option: online cost only);
* every other client, and every client of ``Round``, draws from a pool filled with a few
  reused values: the cost of a ciphertext multiplication does not depend on r, and
  1000 clients' r^n (10 ms each at 2048 bits) would otherwise dominate every setup.
  Reusing r is insecure; it is done here only to build inputs for the server side.
"""

from __future__ import annotations

import itertools
from typing import Any, ClassVar
from unittest import mock

from protocols import SecureSum, VectorSpec, make_sum
from protocols.paillier import PaillierClientSession
from protocols.primitives import paillier as raw

from . import _harness as h

KEY_BITS = h.pick((2048, 3072), (2048,))
OBFUSCATORS = ("online", "pool")
CHEAP = 8


def slots_needed(clients: int, length: int, key_bits: int) -> int:
    """Plaintexts (= ciphertexts) per client for the suite's input."""
    spec = h.spec_for(clients, length)
    slot_bytes = (spec.slot_bits + 7) // 8
    per_plaintext = (key_bits - 1) // (8 * slot_bytes)
    return -(-length // per_plaintext)


def key_factors() -> dict[int, tuple[int, int]]:
    """(p, q) of one fresh key pair per size."""
    return {bits: raw.generate_keypair(bits)[1].export_secret() for bits in KEY_BITS}


class _Paillier(h._Protocol):
    protocol = "paillier"
    replay = "party"
    params: ClassVar[list[Any]] = [h.CLIENTS, h.LENGTHS, KEY_BITS]
    param_names: ClassVar[list[str]] = ["clients", "length", "key_bits"]

    def setup_cache(self) -> Any:
        return key_factors()

    def session(self, cache: Any, clients: int, length: int, key_bits: int, *extra: Any) -> SecureSum:
        p, q = cache[key_bits]
        public = raw.PublicKey(p * q)
        private = raw.PrivateKey(public, p, q)
        session = make_sum("paillier", clients=list(range(clients)), key_bits=key_bits)
        with mock.patch.object(raw, "generate_keypair", lambda *a, **k: (public, private)):
            session.setup()  # the key set-up run, untimed
        self._cheap = [raw.obfuscator(public) for _ in range(CHEAP)]
        return session

    def unsupported(self, label: str, clients: int, length: int, key_bits: int = 2048,
                    *extra: Any) -> str | None:
        per_client = slots_needed(clients, length, key_bits)
        if label == "upload":
            if per_client > 2000:  # > 20 s (2048 bits) for one online upload
                return f"{per_client} ciphertexts per client"
            return None
        if clients * per_client > 200_000:  # ~2 s of multiplications, ~100 MB of uploads
            return f"{clients} x {per_client} ciphertexts"
        return super().unsupported(label, clients, length)

    def prepare(self, session: SecureSum, spec: VectorSpec, timed: int | None, key_bits: int = 2048,
                mode: str = "pool", *extra: Any) -> None:
        cycle = itertools.cycle(self._cheap)
        with mock.patch.object(raw, "obfuscator", lambda key, r=None, **_: next(cycle)):
            for pid in session.clients:
                client = session.client_session(pid)
                assert isinstance(client, PaillierClientSession) and client.keys is not None
                need = client.layout(spec).num_plaintexts
                pool = client.keys.pool
                if pid == timed and mode == "online":
                    pool.private_key = None  # r^n from the public key, even if this is the key holder
                    while len(pool):
                        pool.take()
                elif len(pool) < need:
                    client.fill_pool(need - len(pool))


class Obfuscator:
    """One r^n, from the public key (any client) and through the factors (a client that holds
    the key: ``keyholder="all"``, Dubhe); the whole cost of an encryption."""

    params: ClassVar[list[Any]] = [KEY_BITS, ("public", "factored")]
    param_names: ClassVar[list[str]] = ["key_bits", "holder"]

    def setup_cache(self) -> Any:
        return key_factors()

    def setup(self, cache: Any, key_bits: int, holder: str) -> None:
        p, q = cache[key_bits]
        self.public = raw.PublicKey(p * q)
        self.private = raw.PrivateKey(self.public, p, q) if holder == "factored" else None

    def time_obfuscator(self, *args: Any) -> None:
        raw.obfuscator(self.public, private_key=self.private)


class ClientUpload(_Paillier, h._ClientUpload):
    params: ClassVar[list[Any]] = [h.CLIENTS, h.LENGTHS, KEY_BITS, OBFUSCATORS]
    param_names: ClassVar[list[str]] = ["clients", "length", "key_bits", "obfuscators"]


class ServerAggregate(_Paillier, h._ServerAggregate):
    pass


class Finalize(_Paillier, h._Finalize):
    pass


class Round(_Paillier, h._Round):
    """Whole sums with every client's obfuscators precomputed (the online phase)."""

    def track_key_setup_bytes(self, cache: Any, *args: Any) -> int:
        """Bytes of distributing the public key (done once per run of many sums)."""
        session = self.session(cache, *args)
        return session.transcript.total_bytes()

    track_key_setup_bytes.unit = "bytes"  # type: ignore[attr-defined]
