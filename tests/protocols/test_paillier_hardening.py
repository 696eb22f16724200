"""Paillier and argmin against one misbehaving party: a key holder that fails to decrypt (or
lies about the sum) under ``keyholder="all"``; argmin aggregates re-randomised."""

import numpy as np
import pytest

from protocols import AbortedError, LocalNetwork, VectorSpec, make_sum
from protocols.messages import ReleasedSum
from protocols.paillier import Stage
from protocols.paillier_common import DIGEST_BYTES
from protocols.wire import SERVER, Envelope

WEAK = {"key_bits": 1024, "allow_weak_keys": True}


def inputs_for(n, length, bound, seed=0):
    rng = np.random.default_rng(seed)
    return {i: rng.integers(0, bound + 1, length) for i in range(n)}


def keyed(n, interceptor=None):
    network = LocalNetwork()
    session = make_sum("paillier", clients=range(n), network=network, keyholder="all", **WEAK)
    session.setup()
    network.interceptor = interceptor
    return session


def test_a_key_holder_that_fails_to_decrypt_costs_nothing():
    """The first key holder's aggregate is garbled on its way: it cannot decrypt and refuses;
    the second releaser's sum stands (it used to abort the run)."""
    n = 5

    def interceptor(data, message):
        env = message.envelope
        if env.stage == Stage.AGGREGATE and env.receiver == 0:
            return data[:-1] + bytes([data[-1] ^ 1])
        return data

    session = keyed(n, interceptor)
    inputs = inputs_for(n, 6, 9)
    out = session.sum(inputs, spec=VectorSpec(length=6, bound=9, summands=n))
    assert np.array_equal(out.total, np.sum(list(inputs.values()), axis=0))
    assert any(r.startswith("client 0 refused") for r in out.rejected)


def test_key_holders_that_release_different_sums_abort_the_run():
    n = 5

    def interceptor(data, message):
        env = message.envelope
        if env.stage == Stage.RESULT and env.sender == 1 and env.receiver == SERVER:
            spec = VectorSpec(length=6, bound=9, summands=n)
            released = ReleasedSum.from_bytes(env.payload[DIGEST_BYTES:], spec, parties=range(n))
            forged = released.encoded_sum.copy()
            forged[0] += 1
            payload = env.payload[:DIGEST_BYTES] + ReleasedSum(released.contributors, forged).to_bytes(
                parties=range(n))
            return Envelope(env.protocol, env.stage, env.run_id, env.sender, env.receiver, payload).to_bytes()
        return data

    session = keyed(n, interceptor)
    with pytest.raises(AbortedError, match="released different sums"):
        session.sum(inputs_for(n, 6, 9), spec=VectorSpec(length=6, bound=9, summands=n))


def test_argmin_aggregates_are_rerandomised():
    """The try aggregates the agent receives are fresh ciphertexts of the try sums: none equals
    the plain product of the stored uploads, and the same tries asked twice differ."""
    from protocols.argmin import ArgminSession
    from protocols.argmin import Stage as ArgminStage
    from protocols.paillier_common import read_ciphertexts
    from protocols.primitives import paillier as raw
    from protocols.wire import Reader

    n, c = 8, 3
    seen = []

    def interceptor(data, message):
        env = message.envelope
        if env.stage == ArgminStage.TRY_AGGREGATES:
            seen.append(env.payload)
        return data

    session = keyed(n, interceptor)
    argmin = ArgminSession(session, length=c, bound=50, max_try_size=n)
    counts = inputs_for(n, c, 50, seed=4)
    argmin.upload(counts, round=0)
    tries = [[(0, 1, 2)], [(3, 4, 5, 6)]]
    first = argmin.argmin(tries, round=1).index
    assert argmin.argmin(tries, round=2).index == first
    key = session.server.public_key
    store = {pid: cts for (pid, _), cts in argmin.server._store.items()}

    def aggregates(payload):
        reader = Reader(payload)
        reader.raw(DIGEST_BYTES)
        for _ in range(reader.u32()):
            for _ in range(reader.u32()):
                reader.u32()
        return read_ciphertexts(reader, key, 2 * argmin.layout().num_plaintexts)

    one, two = aggregates(seen[0]), aggregates(seen[1])
    plain = [raw.product(key, list(col)) for members in (tries[0][0], tries[1][0])
             for col in zip(*(store[pid] for pid in members))]
    assert not set(map(int, one)) & set(map(int, plain))
    assert not set(map(int, one)) & set(map(int, two))
    private = session.client_session(0).keys.private_key
    assert [private.decrypt(x) for x in one] == [private.decrypt(x) for x in plain] == [
        private.decrypt(x) for x in two]
