"""Masking against misbehaving parties: every revealed Shamir share verified, a bad share named
and left out, a bad sealed share or upload costing only its sender, and the active-server
setting (signed keys, Bonawitz's consistency round, t > (k + 1)/2)."""

import numpy as np
import pytest

from protocols import AbortedError, LocalNetwork, VectorSpec, make_sum
from protocols.masking import Stage
from protocols.primitives import shamir
from protocols.wire import Envelope


def inputs_for(n, length, bound, seed=0):
    rng = np.random.default_rng(seed)
    return {i: rng.integers(0, bound + 1, length) for i in range(n)}


def plain_sum(inputs, parties):
    return np.sum([inputs[p] for p in parties], axis=0)


def corrupt_response(holder, *, kind="seed", which=0, delta=1):
    """An interceptor that adds ``delta`` to one share ``holder`` reveals at unmasking."""

    def interceptor(data, message):
        env = message.envelope
        if env is None or env.stage != Stage.UNMASKING or env.sender != holder:
            return data
        count = int.from_bytes(env.payload[:4], "big")
        offset = 4 + which * shamir.SHARE_BYTES if kind == "seed" else 8 + count * shamir.SHARE_BYTES
        y = int.from_bytes(env.payload[offset:offset + shamir.SHARE_BYTES], "big")
        bad = ((y + delta) % shamir.PRIME).to_bytes(shamir.SHARE_BYTES, "big")
        payload = env.payload[:offset] + bad + env.payload[offset + shamir.SHARE_BYTES:]
        return Envelope(env.protocol, env.stage, env.run_id, env.sender, env.receiver, payload).to_bytes()

    return interceptor


@pytest.mark.parametrize("trial", range(16))
def test_one_corrupted_self_mask_share_never_gives_a_wrong_sum(trial):
    """Holder 0's share of client ``trial % n``'s seed is among the t smallest x: reconstruction
    from those alone used to return a wrong seed. With a sum that fills its slots (8 x 31 <
    2**8) the decoded sum then looked admissible: 96 of 100 such runs released a wrong sum."""
    n = 8
    inputs = inputs_for(n, 1, 31, seed=trial)
    network = LocalNetwork(interceptor=corrupt_response(0, which=trial % n, delta=1 + trial))
    out = make_sum("masking", clients=range(n), network=network).sum(
        inputs, spec=VectorSpec(length=1, bound=31, summands=n))
    assert np.array_equal(out.total, plain_sum(inputs, out.contributors))
    assert out.contributors == tuple(range(n))
    assert any("client 0" in r and "share" in r for r in out.rejected), out.rejected


def test_a_wrong_share_with_no_surplus_is_a_typed_error_never_a_wrong_sum():
    n = 6  # t = 4; only 4 clients answer the unmasking request: no surplus share to vote with
    inputs = inputs_for(n, 4, 9, seed=3)
    from protocols import DropoutPlan

    network = LocalNetwork(interceptor=corrupt_response(0, which=0))
    session = make_sum("masking", clients=range(n), network=network)
    with pytest.raises(AbortedError, match="seed"):
        session.sum(inputs, spec=VectorSpec(length=4, bound=9, summands=n),
                    dropouts=DropoutPlan({4: "unmasking", 5: "unmasking"}))


def test_corrupted_key_shares_of_a_lost_client_are_named_and_left_out():
    from protocols import DropoutPlan

    n = 9
    inputs = inputs_for(n, 5, 30, seed=4)
    network = LocalNetwork(interceptor=corrupt_response(1, kind="key", which=0, delta=7))
    out = make_sum("masking", clients=range(n), network=network).sum(
        inputs, spec=VectorSpec(length=5, bound=30, summands=n), dropouts=DropoutPlan({8: "upload"}))
    assert out.contributors == tuple(range(8))
    assert np.array_equal(out.total, plain_sum(inputs, range(8)))
    assert any("client 1" in r and "key" in r for r in out.rejected), out.rejected


def test_several_corrupted_shares_are_all_named_while_the_surplus_suffices():
    n = 12  # t = 8: 12 shares of each seed correct up to 2 bad ones
    inputs = inputs_for(n, 4, 9, seed=5)
    bad1, bad2 = corrupt_response(2, which=3), corrupt_response(5, which=3, delta=99)
    network = LocalNetwork(interceptor=lambda data, message: bad2(bad1(data, message), message))
    out = make_sum("masking", clients=range(n), network=network).sum(
        inputs, spec=VectorSpec(length=4, bound=9, summands=n))
    assert np.array_equal(out.total, plain_sum(inputs, range(n)))
    named = " ".join(out.rejected)
    assert "client 2" in named and "client 5" in named
