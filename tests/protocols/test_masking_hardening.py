"""Masking against misbehaving parties: every revealed Shamir share verified, a bad share named
and left out, a bad sealed share or upload costing only its sender, and the active-server
setting (signed keys, Bonawitz's consistency round, t > (k + 1)/2)."""

import numpy as np
import pytest

from protocols import AbortedError, LocalNetwork, VectorSpec, make_sum
from protocols.masking import SealedShares, Stage
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


# --- one misbehaving client costs only itself ----------------------------------------------------------

def garble_sealed_shares(owner, holders=None):
    """Flips a bit in every sealed share ``owner`` deals (or those for ``holders``)."""

    def interceptor(data, message):
        env = message.envelope
        if env is None or env.stage != Stage.SHARE_KEYS or env.sender != owner:
            return data
        parties = frozenset(range(64))
        bundle = SealedShares.from_bytes(env.payload, parties=parties)
        entries = tuple((pid, box[:-1] + bytes([box[-1] ^ 1]) if holders is None or pid in holders else box)
                        for pid, box in bundle.entries)
        return Envelope(env.protocol, env.stage, env.run_id, env.sender, env.receiver,
                        SealedShares(entries).to_bytes()).to_bytes()

    return interceptor


@pytest.mark.parametrize("name", ["masking", "secagg+"])
def test_a_client_whose_sealed_shares_all_fail_is_a_dropout_and_the_round_goes_on(name):
    """Used to abort the whole round: every holder refused its upload stage."""
    n, bad = 10, 4
    inputs = inputs_for(n, 5, 9, seed=7)
    network = LocalNetwork(interceptor=garble_sealed_shares(bad))
    out = make_sum(name, clients=range(n), network=network).sum(
        inputs, spec=VectorSpec(length=5, bound=9, summands=n))
    assert out.dropped == (bad,)
    assert "sealed shares failed to open" in out.excluded[bad]
    assert np.array_equal(out.total, plain_sum(inputs, [c for c in range(n) if c != bad]))


def test_a_client_whose_sealed_shares_fail_at_some_holders_is_a_dropout():
    n, bad = 12, 6
    inputs = inputs_for(n, 5, 9, seed=8)
    network = LocalNetwork(interceptor=garble_sealed_shares(bad, holders={0, 11}))
    out = make_sum("masking", clients=range(n), network=network).sum(
        inputs, spec=VectorSpec(length=5, bound=9, summands=n))
    assert out.dropped == (bad,)
    assert out.excluded[bad].endswith("failed to open at clients 0, 11")
    assert np.array_equal(out.total, plain_sum(inputs, [c for c in range(n) if c != bad]))


def test_malformed_uploads_and_silence_are_dropouts_with_their_reasons():
    from protocols import DropoutPlan

    def interceptor(data, message):
        env = message.envelope
        if env.stage == Stage.UPLOAD and env.sender == 2:
            return data[:-3]
        return data

    n = 8
    inputs = inputs_for(n, 4, 9, seed=9)
    out = make_sum("masking", clients=range(n), network=LocalNetwork(interceptor=interceptor)).sum(
        inputs, spec=VectorSpec(length=4, bound=9, summands=n), dropouts=DropoutPlan({5: "upload"}))
    assert out.dropped == (2, 5)
    assert out.excluded[2].startswith("WireError")
    assert out.excluded[5] == "no answer (dropped out)"
    assert np.array_equal(out.total, plain_sum(inputs, [0, 1, 3, 4, 6, 7]))
