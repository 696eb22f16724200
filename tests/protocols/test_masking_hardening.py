"""Masking against misbehaving parties: every revealed Shamir share verified, a bad share named
and left out, a bad sealed share or upload costing only its sender, and the active-server
setting (signed keys, Bonawitz's consistency round, t > (k + 1)/2)."""

import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from protocols import AbortedError, LocalNetwork, ProtocolError, VectorSpec, make_sum
from protocols.masking import (
    CompleteServerSession,
    MaskingOptions,
    MaskingServer,
    SealedShares,
    SparseServerSession,
    Stage,
    upload_from_bytes,
)
from protocols.masking import sessions as masking_sessions
from protocols.masking.keys import agree, load_public, pair_seed, self_seed
from protocols.primitives import shamir
from protocols.primitives.prg import MaskExpander
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
    assert list(out.flagged) == [0] and out.flagged[0].startswith("ShareError: a wrong share")  # named, input kept


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
    assert sorted(out.flagged) == [2, 5]


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


# --- an active server: equivocation about who dropped ------------------------------------------------

class Equivocating(MaskingServer):
    """A server that tells part of the target's holders that the target dropped (to get shares
    of its mask key) and the rest that it survived (to get shares of its seed), then tries to
    unmask the target's upload with both. The rest of the run goes on as usual."""

    target = 0

    def receive(self, env):
        if env.stage == Stage.UPLOAD and env.sender == self.target:
            self.captured = env.payload
        return super().receive(env)

    @property
    def liars(self):
        return set(self.graph[self.target][: self.threshold])

    def view(self, pid):
        if pid in self.liars:
            return tuple(v for v in self.contributors if v != self.target)
        return self.contributors

    def _after_unmasking(self):
        seeds, keys = self._revealed()
        type(self).stolen = None
        type(self).shares = (len(seeds.get(self.target, [])), len(keys.get(self.target, [])))
        try:
            seed = shamir.combine(seeds.get(self.target, []), self.threshold)
            key = X25519PrivateKey.from_private_bytes(shamir.combine(keys.get(self.target, []), self.threshold))
            _, words = upload_from_bytes(self.captured, spec=self.spec, dtype=self.dtype,
                                         owners=self.relayed[self.target])
            x, u = words.copy(), self.target
            add, subtract = [], [self_seed(seed, protocol=self.protocol, run_id=self.run_id, owner=u)]
            for v in self.graph[u]:
                pair = pair_seed(agree(key, load_public(self.keys[v].mask_key)), protocol=self.protocol,
                                 run_id=self.run_id, u=u, v=v)
                (subtract if u < v else add).append(pair)
            MaskExpander(self.spec.length, self.dtype).accumulate(x, add=add, subtract=subtract)
            x &= self.dtype.type((1 << self.spec.slot_bits) - 1)
            type(self).stolen = x
        except ProtocolError:
            pass
        return super()._after_unmasking()


def equivocate(monkeypatch, name, n, **options):
    monkeypatch.setattr(masking_sessions, "MaskingServer", Equivocating)
    Equivocating.stolen, Equivocating.shares = None, (0, 0)
    inputs = inputs_for(n, 6, 100, seed=n)
    session = make_sum(name, clients=range(n), **options)
    spec = VectorSpec(length=6, bound=100, summands=n)
    try:
        out = session.sum(inputs, spec=spec)
    except AbortedError:
        out = None
    return inputs, out, session


@pytest.mark.parametrize("n", [5, 8, 12, 20, 30, 50, 100, 300, 1000])
def test_secagg_plus_defaults_keep_a_strict_majority_of_holders(n):
    """Bell et al.'s semi-honest bounds alone gave 2t <= k + 1 for 12 <= n <= ~300 (n = 12:
    k = 4, t = 2); the degree search now also requires 2t > k + 1 (a larger k where needed)."""
    params = SparseServerSession(clients=range(n)).parameters(n)
    assert 2 * params.threshold > params.degree + 1


@pytest.mark.parametrize("n", [12, 20, 30])
def test_an_equivocating_server_reads_no_input_under_secagg_plus_defaults(monkeypatch, n):
    """The server tells the target's holders different stories about whether it dropped: with a
    strict majority threshold the two groups never both reach t honest holders, so it holds t
    shares of at most one of the target's secrets and reads nothing (the default needs no
    consistency round for this; ``active_server`` adds it against the other deviations)."""
    params = SparseServerSession(clients=range(n)).parameters(n)
    inputs, out, _ = equivocate(monkeypatch, "secagg+", n)
    assert Equivocating.stolen is None
    seeds, keys = Equivocating.shares
    assert seeds < params.threshold or keys < params.threshold
    assert out is None or np.array_equal(out.total, plain_sum(inputs, out.contributors))


@pytest.mark.parametrize("name", ["masking", "secagg+"])
@pytest.mark.parametrize("n", [6, 12, 20, 30])
def test_the_active_server_setting_stops_the_equivocation(monkeypatch, name, n):
    """With ``active_server``: t > (k + 1 + c)/2 and the consistency round — the target's holders
    refuse a request backed by fewer than t matching signatures, and the two groups never both
    reach t, so the server holds t shares of at most one of the target's secrets."""
    session = (SparseServerSession if name == "secagg+" else CompleteServerSession)(
        clients=range(n), options=MaskingOptions(active_server=True))
    params = session.parameters(n)
    assert 2 * params.threshold > params.degree + 1
    inputs, out, session = equivocate(monkeypatch, name, n, active_server=True)
    assert Equivocating.stolen is None
    seeds, keys = Equivocating.shares
    assert seeds < params.threshold or keys < params.threshold
    assert out is None or np.array_equal(out.total, plain_sum(inputs, out.contributors))


def test_signed_keys_stop_a_server_that_swaps_a_neighbours_keys():
    """The server replaces client 1's advertised keys (as relayed to client 0) with its own: a
    man in the middle of their channel. Client 0 checks the registered signature and refuses."""
    from protocols.masking import KeyAdvert, NeighbourKeys
    from protocols.masking.keys import raw_public as raw

    n = 6

    def interceptor(data, message):
        env = message.envelope
        if env.stage == Stage.SHARE_KEYS and env.receiver == 0:
            keys = NeighbourKeys.from_bytes(env.payload, parties=frozenset(range(n)), signed=True)
            swapped = tuple((pid, KeyAdvert(raw(X25519PrivateKey.generate()), a.mask_key, a.commitment, a.signature)
                             if pid == 1 else a) for pid, a in keys.entries)
            payload = NeighbourKeys(swapped, keys.advertised).to_bytes()
            return Envelope(env.protocol, env.stage, env.run_id, env.sender, env.receiver, payload).to_bytes()
        return data

    inputs = inputs_for(n, 3, 9, seed=1)
    out = make_sum("masking", clients=range(n), network=LocalNetwork(interceptor=interceptor),
                   active_server=True).sum(inputs, spec=VectorSpec(length=3, bound=9, summands=n))
    assert any(r.startswith("client 0 refused: AuthenticationError: client-1's advertised keys failed to verify")
               for r in out.rejected), out.rejected
    assert out.dropped == (0,)
    assert np.array_equal(out.total, plain_sum(inputs, range(1, n)))


def test_the_active_server_setting_needs_registered_keys():
    n = 4
    session = make_sum("masking", clients=range(n), active_server=True, identities=False)
    with pytest.raises(AbortedError):
        session.sum(inputs_for(n, 2, 9), spec=VectorSpec(length=2, bound=9, summands=n))
    refusals = [e for e in session.transcript if e.stage == "refuse"]
    assert len(refusals) == n  # every client refused to join without its signing key


def test_active_server_runs_are_exact_under_dropouts_at_every_stage():
    from protocols import DropoutPlan

    n = 30
    plan = {0: "advertise_keys", 7: "share_keys", 13: "upload", 17: "consistency", 21: "unmasking", 29: "result"}
    inputs = inputs_for(n, 8, 50, seed=6)
    for name, options in (("masking", {}), ("secagg+", {"degree": 20})):
        out = make_sum(name, clients=range(n), active_server=True, **options).sum(
            inputs, spec=VectorSpec(length=8, bound=50, summands=n), dropouts=DropoutPlan(plan))
        assert out.dropped == (0, 7, 13)
        assert np.array_equal(out.total, plain_sum(inputs, [c for c in range(n) if c not in (0, 7, 13)]))


@pytest.mark.parametrize("n", [4, 5, 8, 12, 20, 50, 100, 300, 1000])
def test_active_server_parameters_keep_a_strict_majority_of_holders(n):
    from protocols.masking import complete_parameters, sparse_parameters

    for params in (sparse_parameters(n, MaskingOptions(active_server=True)),
                   complete_parameters(n, MaskingOptions(active_server=True))):
        assert params.active and 2 * params.threshold > params.degree + 1
    with pytest.raises(ValueError, match="active server|strict majority"):
        complete_parameters(n, MaskingOptions(active_server=True, threshold=0.5))


def test_the_graph_of_an_active_run_is_everyones_to_check():
    from protocols.masking import graph_seed, harary_graph

    members = list(range(40))
    seed = graph_seed("secagg+", bytes(16), members)
    assert harary_graph(members, 8, seed=seed) == harary_graph(list(reversed(members)), 8, seed=seed)
    assert harary_graph(members, 8, seed=seed) != harary_graph(members, 8, seed=graph_seed("secagg+", b"x" * 16,
                                                                                               members))
